"""Every model family preset of lumen.config, shrunk to a few thousand parameters with its family's shape kept:
grouped-query attention (2 KV heads, or 1 for a multi-query preset), wider heads (Gemma), a sliding window
(Mistral, small enough to slide), partial rotary (GPT-NeoX), learned positions (GPT-2)."""

from __future__ import annotations

import torch

from lumen import GPT, ModelConfig
from lumen.config import PRESETS

V = 97


def tiny_config(name: str, **changes) -> ModelConfig:
    """Preset `name` at d_model 32, 2 blocks, 4 heads, a vocabulary of V and a context of 64 (or `changes`)."""
    cfg = ModelConfig.from_name(name)
    kw: dict = dict(vocab_size=V, context=64, d_model=32, n_layers=2, n_heads=4, d_ff=64)
    if cfg.n_kv_heads is not None and cfg.n_kv_heads != cfg.n_heads:
        kw["n_kv_heads"] = 1 if cfg.n_kv_heads == 1 else 2
    if cfg.d_head is not None:
        kw["d_head"] = 16
    if cfg.sliding_window is not None:
        kw["sliding_window"] = 5
    if cfg.n_experts:  # a mixture of experts: a few experts, still more than a token picks
        kw |= {"n_experts": 4, "experts_per_token": 2}
    if cfg.positions == "rope" and cfg.rotary_fraction < 1.0:  # partial rotary: half of the 8 features of a head
        kw["rotary_fraction"] = 0.5
    return cfg.replace(**(kw | changes))


# one preset per distinct shape once shrunk (GPT-2's four sizes and baby-gpt are one shape, so are Pythia's two)
# (and one Llama 3.x, one Qwen2.5 beside Qwen2: their other sizes differ from it only in RoPE's factor or tying)
OTHER_SIZES = {"llama3.2-3b", "llama3.1-8b", "qwen2.5-7b"}
NAMES = list({tiny_config(n).replace(name="tiny"): n
              for n in reversed(list(PRESETS)) if n not in OTHER_SIZES}.values())[::-1]


def tiny_preset(name: str, seed: int = 0, scale: float = 1.0, **changes) -> GPT:
    """`tiny_config(name)` with random weights (norm gains and biases away from 1 and 0, all matrices times
    `scale`), in eval mode."""
    torch.manual_seed(seed)
    model = GPT(tiny_config(name, **changes))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
            else:
                p.mul_(scale)
    return model.eval()


def prompts(lengths=(9, 4, 7), seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]
