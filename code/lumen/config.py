"""ModelConfig and named presets: a model family is data, not a class.

    >>> cfg = ModelConfig.from_name("gpt2")
    >>> cfg.d_model, cfg.n_layers
    (768, 12)
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch.nn.functional as F

from .errors import ConfigError, MissingFileError
from .files import read_json

# the largest sizes a config may hold: each well above any released model's, and low enough that a damaged
# file claiming 2^32 layers or 2^40 positions is refused before anything is built for it
SIZE_LIMITS = {"vocab_size": 2**22, "context": 2**20, "d_model": 2**16, "n_layers": 2**10, "n_heads": 2**12,
               "n_kv_heads": 2**12, "d_ff": 2**18, "d_head": 2**12, "sliding_window": 2**20, "n_experts": 2**12,
               "experts_per_token": 2**12}
# the element-wise squashing functions the MLP can use, by name (the chapter's "GELU, and why not ReLU");
# gelu_tanh is GELU through the tanh approximation, as GPT-2 was trained with it
ACTIVATIONS: dict[str, Callable] = {
    "gelu": F.gelu, "gelu_tanh": partial(F.gelu, approximate="tanh"), "relu": F.relu, "silu": F.silu,
}
MLP_KINDS = ("mlp", "swiglu", "geglu")
NORMS = ("layernorm", "rmsnorm", "rmsnorm_offset")  # rmsnorm_offset scales by (1 + g) (Gemma)
PLACEMENTS: tuple[str, ...] = ("pre", "post", "parallel")  # parallel: x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX)
POSITIONS = ("learned", "rope")
# families-a: where the q/k norms act, the RoPE frequency rescalings, and more norm placements
QK_NORMS = ("head", "projection")  # over each head's d_head features (Qwen3, Gemma 3), or over all heads (OLMo-2)
ROPE_SCALINGS = ("linear", "llama3")
PLACEMENTS += ("parallel_shared", "branch_output")  # x + attn(ln1(x)) + mlp(ln1(x)) (GPT-J, Phi-2);
#                                                     x + norm(attn(x)), x + norm(mlp(x)) (OLMo-2)


@dataclass(frozen=True)
class RopeScaling:
    """A rescaling of RoPE's frequencies, to stretch a model to a longer context than it was trained at.

    linear (position interpolation): every frequency divided by `factor`. llama3 (Llama 3.1+): the slow
    frequencies (wavelengths above original_context / low_freq_factor) divided by `factor`, the fast ones
    (wavelengths below original_context / high_freq_factor) kept, and a smooth blend between the two.
    """

    kind: str  # one of ROPE_SCALINGS
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192  # the context the model was trained at before the stretch

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALINGS:
            raise ConfigError(f"RopeScaling.kind must be one of {', '.join(ROPE_SCALINGS)}; got {self.kind!r}")
        for f in ("factor", "low_freq_factor", "high_freq_factor"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not (math.isfinite(v) and float(v) > 0):
                raise ConfigError(f"RopeScaling.{f} must be a positive number, got {v!r}")
            object.__setattr__(self, f, float(v))
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor:
            raise ConfigError(f"RopeScaling: high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                              f"({self.low_freq_factor})")
        v = self.original_context
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or not 1 <= int(v) <= SIZE_LIMITS["context"]:
            raise ConfigError(f"RopeScaling.original_context must be a whole number in 1..{SIZE_LIMITS['context']}, "
                              f"got {v!r}")
# families-b: sandwich: x + norm(attn(ln1(x))), a norm before and after each branch (Gemma 2/3)
PLACEMENTS += ("sandwich",)
LAYER_TYPES = ("full", "sliding")  # a block's attention: all the past, or the last sliding_window keys


@dataclass(frozen=True)
class ModelConfig:
    """Every number and choice that fixes a decoder-only transformer's shape.

    The defaults are GPT-2 small. `d_ff` defaults to 4 * d_model, `n_kv_heads` to n_heads
    (plain multi-head attention); fewer KV heads than query heads is grouped-query attention.
    """

    vocab_size: int = 50257
    context: int = 1024  # the longest sequence the positions support
    d_model: int = 768
    n_layers: int = 12
    n_heads: int = 12
    n_kv_heads: int | None = None
    d_ff: int | None = None
    mlp: str = "mlp"  # "mlp" (W2 act(W1 x)), "swiglu" or "geglu" (gated: W2 (act(W_gate x) * W_up x))
    activation: str = "gelu_tanh"  # the MLP's nonlinearity, GeGLU's gate; SwiGLU always gates with SiLU
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_placement: str = "pre"
    positions: str = "learned"
    rope_theta: float = 10000.0
    bias: bool = True  # biases on the attention and MLP linears
    tie_embeddings: bool = True
    rotary_fraction: float = 1.0  # the share of each head's dimensions that RoPE rotates (Pythia: 0.25)
    qkv_bias: bool = False  # biases on W_Q, W_K, W_V even without `bias` (Qwen2)
    d_head: int | None = None  # each head's width, if not d_model / n_heads (Gemma)
    scale_embeddings: bool = False  # token embeddings times sqrt(d_model) (Gemma)
    sliding_window: int | None = None  # each query sees only the last this-many keys, itself included (Mistral)
    # families-a
    qk_norm: str | None = None  # a norm on queries and keys before RoPE: per "head" (Qwen3) or over the "projection"
    rope_scaling: RopeScaling | None = None  # RoPE's frequencies rescaled (Llama 3.1+: "llama3")
    rope_interleaved: bool = False  # RoPE rotates pairs (0, 1), (2, 3), ... (GPT-J), not (i, i + dims/2)
    head_bias: bool = False  # a bias on the unembedding (Phi-2, GPT-J)
    attn_bias: bool | None = None  # biases on W_Q, W_K, W_V, W_O, if not as `bias` says (GPT-J: MLP biases only)
    dropout: float = 0.0
    # families-b: per-layer attention, soft-capping and experts (Gemma 2/3, SmolLM3, mixtures of experts)
    # two patterns repeated over the blocks (block i follows entry i % len), so a model keeps its rhythm at any depth:
    layer_types: tuple[str, ...] | None = None  # "full" or "sliding" (the window) attention; None: all blocks alike
    rope_layers: tuple[bool, ...] = (True,)  # whether a block's attention has RoPE (SmolLM3: every 4th has none)
    rope_local_theta: float | None = None  # the RoPE base of "sliding" blocks, if not rope_theta (Gemma 3)
    query_pre_attn_scalar: float | None = None  # scores are q.k / sqrt(this), not / sqrt(head_dim) (Gemma 2/3)
    attn_softcap: float | None = None  # scores squashed to cap * tanh(scores / cap) before the softmax (Gemma 2)
    final_softcap: float | None = None  # logits squashed to cap * tanh(logits / cap) (Gemma 2)
    n_experts: int | None = None  # the MLP is a mixture of this many SwiGLU experts of width d_ff (Qwen3-MoE)
    experts_per_token: int = 2  # how many experts the router picks for each token
    norm_topk_prob: bool = True  # the picked experts' weights renormalised to sum to 1
    name: str = field(default="custom", compare=False)

    def __post_init__(self) -> None:
        if isinstance(self.rope_scaling, dict):  # as config.json holds it (from_dict, load)
            try:
                object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
            except TypeError as e:
                raise ConfigError(f"ModelConfig.rope_scaling: {e}") from None
        if not isinstance(self.rope_scaling, (RopeScaling, type(None))):
            raise ConfigError(f"ModelConfig.rope_scaling must be a RopeScaling or null, got {self.rope_scaling!r}")
        self._check_types()
        if self.qk_norm is not None and self.qk_norm not in QK_NORMS:
            raise ConfigError(f"ModelConfig.qk_norm must be null or one of {', '.join(QK_NORMS)}; got {self.qk_norm!r}")
        if self.qk_norm == "projection" and self.norm != "rmsnorm":
            raise ConfigError("ModelConfig: qk_norm 'projection' (OLMo-2) is an RMSNorm; it needs norm 'rmsnorm'")
        if not 0.0 < self.rotary_fraction <= 1.0:
            raise ConfigError(f"ModelConfig.rotary_fraction must be in (0, 1], got {self.rotary_fraction}")
        if self.d_head is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"ModelConfig.n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.kv_heads})"
            )
        if self.positions == "rope" and (self.rotary_dims < 2 or self.rotary_dims % 2):
            raise ConfigError(
                f"ModelConfig: RoPE rotates pairs, so head_dim x rotary_fraction ({self.rotary_dims}) must be even "
                "and at least 2"
            )
        for f, allowed in (
            ("mlp", MLP_KINDS),
            ("activation", ACTIVATIONS),
            ("norm", NORMS),
            ("norm_placement", PLACEMENTS),
            ("positions", POSITIONS),
        ):
            if getattr(self, f) not in allowed:
                raise ConfigError(
                    f"ModelConfig.{f} must be one of {', '.join(allowed)}; got {getattr(self, f)!r}"
                )
        self._check_layers()
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"ModelConfig.dropout must be in [0, 1), got {self.dropout}")
        for f in ("norm_eps", "rope_theta"):
            if not getattr(self, f) > 0:
                raise ConfigError(f"ModelConfig.{f} must be positive, got {getattr(self, f)}")

    def _check_layers(self) -> None:
        """The per-layer choices (families-b) name real blocks and make sense together."""
        if self.layer_types is not None:
            if not self.layer_types or not set(self.layer_types) <= set(LAYER_TYPES):
                raise ConfigError(f"ModelConfig.layer_types must be a pattern of {' and '.join(LAYER_TYPES)}, "
                                  f"got {list(self.layer_types)}")
            if "sliding" in self.layer_types and self.sliding_window is None:
                raise ConfigError("ModelConfig.layer_types has sliding blocks but sliding_window is not set")
        if not self.rope_layers:
            raise ConfigError("ModelConfig.rope_layers must be a pattern of true and false, got []")
        if self.n_experts is not None and not 1 <= self.experts_per_token <= self.n_experts:
            raise ConfigError(f"ModelConfig.experts_per_token must be between 1 and n_experts ({self.n_experts}), "
                              f"got {self.experts_per_token}")

    def _check_types(self) -> None:
        """Every field of the type it promises and its sizes within SIZE_LIMITS, so that a config read from a
        file fails here, with the field's name, rather than deep inside torch; numpy scalars become plain ones."""
        for f, limit in SIZE_LIMITS.items():
            v = getattr(self, f)
            if v is None and f in ("n_kv_heads", "d_ff", "d_head", "sliding_window", "n_experts"):
                continue
            if isinstance(v, bool) or not isinstance(v, numbers.Integral):
                raise ConfigError(f"ModelConfig.{f} must be a whole number, got {v!r}")
            if not 1 <= int(v) <= limit:
                raise ConfigError(f"ModelConfig.{f} must be between 1 and {limit:,}, got {v:,}")
            object.__setattr__(self, f, int(v))
        for f in ("norm_eps", "rope_theta", "dropout", "rotary_fraction"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ConfigError(f"ModelConfig.{f} must be a finite number, got {v!r}")
            object.__setattr__(self, f, float(v))
        for f in ("rope_local_theta", "query_pre_attn_scalar", "attn_softcap", "final_softcap"):  # None: unused
            v = getattr(self, f)
            bad = isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < float(v) < math.inf
            if v is not None and bad:
                raise ConfigError(f"ModelConfig.{f} must be a positive number or null, got {v!r}")
            object.__setattr__(self, f, None if v is None else float(v))
        for f, kind in (("layer_types", str), ("rope_layers", bool)):  # lists, as JSON gives them back, are tuples
            v = getattr(self, f)
            if v is None and f == "layer_types":
                continue
            if not isinstance(v, (list, tuple)) or not all(isinstance(x, kind) for x in v):
                raise ConfigError(f"ModelConfig.{f} must be a list of {kind.__name__}s, got {v!r}")
            object.__setattr__(self, f, tuple(v))
        if self.attn_bias is not None and not isinstance(self.attn_bias, bool):
            raise ConfigError(f"ModelConfig.attn_bias must be true, false or null, got {self.attn_bias!r}")
        for f in ("bias", "tie_embeddings", "qkv_bias", "scale_embeddings", "rope_interleaved", "head_bias",
                  "norm_topk_prob"):
            if not isinstance(getattr(self, f), bool):
                raise ConfigError(f"ModelConfig.{f} must be true or false, got {getattr(self, f)!r}")
        for f in ("mlp", "activation", "norm", "norm_placement", "positions", "name"):
            if not isinstance(getattr(self, f), str):
                raise ConfigError(f"ModelConfig.{f} must be a string, got {getattr(self, f)!r}")

    # derived sizes -------------------------------------------------------------------------
    @property
    def head_dim(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    @property
    def rotary_dims(self) -> int:
        """How many of each head's dimensions RoPE rotates (the first ones)."""
        return int(self.head_dim * self.rotary_fraction)

    def layer_type(self, layer: int) -> str:
        """Block `layer`'s attention: "sliding" (the last sliding_window keys) or "full"; without layer_types
        every block slides if sliding_window is set (Mistral)."""
        if self.layer_types is not None:
            return self.layer_types[layer % len(self.layer_types)]
        return "full" if self.sliding_window is None else "sliding"

    def window(self, layer: int) -> int | None:
        """How many keys block `layer`'s queries see (themselves included), or None for all the past."""
        return self.sliding_window if self.layer_type(layer) == "sliding" else None

    def rope_base(self, layer: int) -> float | None:
        """Block `layer`'s RoPE base (theta), or None where it uses no RoPE (learned positions, rope_layers)."""
        if self.positions != "rope" or not self.rope_layers[layer % len(self.rope_layers)]:
            return None
        return self.rope_base_of(self.layer_type(layer))

    def rope_base_of(self, layer_type: str) -> float:
        """The RoPE base of a kind of layer: rope_local_theta for sliding ones if set (Gemma 3), else rope_theta."""
        local = layer_type == "sliding" and self.rope_local_theta is not None
        return self.rope_local_theta if local and self.rope_local_theta is not None else self.rope_theta

    def per_layer(self, pattern: tuple) -> list:
        """A pattern (layer_types, rope_layers) spelled out for each of the n_layers blocks."""
        return [pattern[i % len(pattern)] for i in range(self.n_layers)]

    @property
    def attention_bias(self) -> bool:
        """Whether W_O (and so W_Q, W_K, W_V) have biases: attn_bias, else bias."""
        return self.bias if self.attn_bias is None else self.attn_bias

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def hidden(self) -> int:
        """The MLP's hidden width: d_ff, or 4 * d_model."""
        return self.d_ff or 4 * self.d_model

    # construction ----------------------------------------------------------------------------
    @classmethod
    def from_name(cls, name: str) -> ModelConfig:
        """A preset by name, e.g. ``ModelConfig.from_name("smollm2-135m")``."""
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}")
        return PRESETS[name]

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - fields)
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s) {unknown}; valid: {', '.join(sorted(fields))}")
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - fields)
        if unknown:
            raise ConfigError(f"unknown ModelConfig field(s) {unknown}; valid: {', '.join(sorted(fields))}")
        return cls(**d)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> ModelConfig:
        """A config.json written by `save`; a damaged or invalid one is a ConfigError naming the file."""
        path = Path(path)
        if not path.is_file():
            raise MissingFileError(f"no model config at {path}")
        d = read_json(path, "model config", ConfigError, "fix it or save the model again")
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e} (fix the file or save the model again)") from None


def _gpt2(name: str, d: int, n_layers: int, n_heads: int) -> ModelConfig:
    return ModelConfig(name=name, d_model=d, n_layers=n_layers, n_heads=n_heads)


def _llama(name: str, **kw: Any) -> ModelConfig:
    base: dict[str, Any] = dict(
        mlp="swiglu", activation="silu", norm="rmsnorm", positions="rope", bias=False, name=name
    )
    base.update(kw)
    return ModelConfig(**base)


PRESETS: dict[str, ModelConfig] = {
    "gpt2": _gpt2("gpt2", 768, 12, 12),
    "gpt2-medium": _gpt2("gpt2-medium", 1024, 24, 16),
    "gpt2-large": _gpt2("gpt2-large", 1280, 36, 20),
    "gpt2-xl": _gpt2("gpt2-xl", 1600, 48, 25),
    # nanoGPT's character-level Shakespeare shape, small enough to train on a laptop CPU
    "baby-gpt": ModelConfig(
        name="baby-gpt", vocab_size=65, context=256, d_model=384, n_layers=6, n_heads=6
    ),
    # a small Llama-style model: RMSNorm, SwiGLU, RoPE, grouped-query attention, no biases
    "baby-llama": _llama(
        "baby-llama", vocab_size=65, context=256, d_model=384, n_layers=6, n_heads=6,
        n_kv_heads=2, d_ff=1024,
    ),
    "smollm2-135m": _llama(
        "smollm2-135m", vocab_size=49152, context=8192, d_model=576, n_layers=30, n_heads=9,
        n_kv_heads=3, d_ff=1536, rope_theta=100000.0,
    ),
    # the families interpretability studies, each a preset (the published shapes)
    # GPT-NeoX / Pythia: parallel attention and MLP, rotary on a quarter of each head, untied embeddings
    "pythia-70m": ModelConfig(
        name="pythia-70m", vocab_size=50304, context=2048, d_model=512, n_layers=6, n_heads=8,
        activation="gelu", norm_placement="parallel", positions="rope", rotary_fraction=0.25, tie_embeddings=False,
    ),
    "pythia-160m": ModelConfig(
        name="pythia-160m", vocab_size=50304, context=2048, d_model=768, n_layers=12, n_heads=12,
        activation="gelu", norm_placement="parallel", positions="rope", rotary_fraction=0.25, tie_embeddings=False,
    ),
    # Qwen2: Llama with biases on W_Q, W_K, W_V (not on W_O)
    "qwen2-0.5b": _llama(
        "qwen2-0.5b", vocab_size=151936, context=32768, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
        d_ff=4864, rope_theta=1000000.0, qkv_bias=True, norm_eps=1e-6,
    ),
    # Gemma: GELU-gated MLP, RMSNorm scaling by (1 + g), embeddings times sqrt(d_model), 256-wide heads
    "gemma-2b": _llama(
        "gemma-2b", vocab_size=256000, context=8192, d_model=2048, n_layers=18, n_heads=8, n_kv_heads=1,
        d_head=256, d_ff=16384, mlp="geglu", activation="gelu_tanh", norm="rmsnorm_offset",
        scale_embeddings=True, norm_eps=1e-6,
    ),
    # Mistral: Llama with a sliding attention window (accounting only: 7B parameters)
    "mistral-7b": _llama(
        "mistral-7b", vocab_size=32000, context=32768, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        d_ff=14336, sliding_window=4096, tie_embeddings=False,
    ),
    # families-a ----------------------------------------------------------------------------------------
    # Llama 3.1/3.2: RoPE's slow frequencies stretched 8x for a 128k context (trained at 8k); the 3.2s tie embeddings
    "llama3.2-1b": _llama(
        "llama3.2-1b", vocab_size=128256, context=131072, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
        d_head=64, d_ff=8192, rope_theta=500000.0, norm_eps=1e-5, rope_scaling=RopeScaling("llama3", 32.0),
    ),
    "llama3.2-3b": _llama(
        "llama3.2-3b", vocab_size=128256, context=131072, d_model=3072, n_layers=28, n_heads=24, n_kv_heads=8,
        d_ff=8192, rope_theta=500000.0, norm_eps=1e-5, rope_scaling=RopeScaling("llama3", 32.0),
    ),
    "llama3.1-8b": _llama(
        "llama3.1-8b", vocab_size=128256, context=131072, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
        d_ff=14336, rope_theta=500000.0, norm_eps=1e-5, rope_scaling=RopeScaling("llama3", 8.0),
        tie_embeddings=False,
    ),
    # Qwen2.5: Qwen2's architecture (biases on W_Q, W_K, W_V); the small ones tie their embeddings
    "qwen2.5-0.5b": _llama(
        "qwen2.5-0.5b", vocab_size=151936, context=32768, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
        d_ff=4864, rope_theta=1000000.0, qkv_bias=True, norm_eps=1e-6,
    ),
    "qwen2.5-1.5b": _llama(
        "qwen2.5-1.5b", vocab_size=151936, context=32768, d_model=1536, n_layers=28, n_heads=12, n_kv_heads=2,
        d_ff=8960, rope_theta=1000000.0, qkv_bias=True, norm_eps=1e-6,
    ),
    "qwen2.5-7b": _llama(
        "qwen2.5-7b", vocab_size=152064, context=32768, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
        d_ff=18944, rope_theta=1000000.0, qkv_bias=True, norm_eps=1e-6, tie_embeddings=False,
    ),
    # Qwen3: no biases, an RMSNorm on each head's query and key before RoPE, 128-wide heads
    "qwen3-0.6b": _llama(
        "qwen3-0.6b", vocab_size=151936, context=40960, d_model=1024, n_layers=28, n_heads=16, n_kv_heads=8,
        d_head=128, d_ff=3072, rope_theta=1000000.0, norm_eps=1e-6, qk_norm="head",
    ),
    "qwen3-1.7b": _llama(
        "qwen3-1.7b", vocab_size=151936, context=40960, d_model=2048, n_layers=28, n_heads=16, n_kv_heads=8,
        d_head=128, d_ff=6144, rope_theta=1000000.0, norm_eps=1e-6, qk_norm="head",
    ),
    # OLMo-2: each branch's output normalised before it is added (no input norms), q/k RMSNorm over all heads
    "olmo2-7b": _llama(
        "olmo2-7b", vocab_size=100352, context=4096, d_model=4096, n_layers=32, n_heads=32, d_ff=11008,
        rope_theta=500000.0, norm_placement="branch_output", qk_norm="projection", tie_embeddings=False,
    ),
    # Phi-3: Llama's math (its files fuse W_Q, W_K, W_V and W_gate, W_up)
    "phi3-mini": _llama(
        "phi3-mini", vocab_size=32064, context=4096, d_model=3072, n_layers=32, n_heads=32, d_ff=8192,
        sliding_window=2047, tie_embeddings=False,
    ),
    # Phi-2 and GPT-J: attention and MLP side by side from one LayerNorm, partial RoPE, a biased unembedding
    "phi-2": ModelConfig(
        name="phi-2", vocab_size=51200, context=2048, d_model=2560, n_layers=32, n_heads=32, d_ff=10240,
        activation="gelu_tanh", norm_placement="parallel_shared", positions="rope", rotary_fraction=0.4,
        head_bias=True, tie_embeddings=False,
    ),
    "gpt-j-6b": ModelConfig(
        name="gpt-j-6b", vocab_size=50400, context=2048, d_model=4096, n_layers=28, n_heads=16,
        activation="gelu_tanh", norm_placement="parallel_shared", positions="rope", rotary_fraction=0.25,
        rope_interleaved=True, attn_bias=False, head_bias=True, tie_embeddings=False,
    ),
    # for parameter and FLOP accounting only: never instantiate it (70B parameters)
    "llama3-70b": _llama(
        "llama3-70b", vocab_size=128256, context=8192, d_model=8192, n_layers=80, n_heads=64,
        n_kv_heads=8, d_ff=28672, rope_theta=500000.0, tie_embeddings=False,
    ),
}


# families-b: Gemma 2, SmolLM3 ---------------------------------------------------------------------------------
def pattern(seq: list | tuple) -> tuple:
    """The shortest pattern that, repeated, spells out seq: [a, b, a, b, a] -> (a, b)."""
    return next(tuple(seq[:p]) for p in range(1, len(seq) + 1) if all(x == seq[i % p] for i, x in enumerate(seq)))


def _gemma2(name: str, **kw: Any) -> ModelConfig:
    """Gemma 2: Gemma's parts in a sandwich (a norm before and after each branch), attention scores and final
    logits soft-capped, and blocks alternating between a 4096-token window and full attention."""
    base: dict[str, Any] = dict(
        vocab_size=256000, context=8192, d_head=256, mlp="geglu", activation="gelu_tanh", norm="rmsnorm_offset",
        norm_placement="sandwich", scale_embeddings=True, norm_eps=1e-6, sliding_window=4096,
        layer_types=("sliding", "full"), query_pre_attn_scalar=256.0,
        attn_softcap=50.0, final_softcap=30.0,
    )
    return _llama(name, **base | kw)


PRESETS |= {
    "gemma2-2b": _gemma2("gemma2-2b", d_model=2304, n_layers=26, n_heads=8, n_kv_heads=4, d_ff=9216),
    "gemma2-9b": _gemma2("gemma2-9b", d_model=3584, n_layers=42, n_heads=16, n_kv_heads=8, d_ff=14336),
    # SmolLM3: Llama whose every 4th block has no RoPE at all (those layers attend by content alone)
    "smollm3-3b": _llama(
        "smollm3-3b", vocab_size=128256, context=65536, d_model=2048, n_layers=36, n_heads=16, n_kv_heads=4,
        d_ff=11008, rope_theta=5000000.0, rope_layers=(True, True, True, False),
    ),
}


# families-b: Gemma 3 (text), Qwen3-MoE --------------------------------------------------------------------------
def _gemma3(name: str, **kw: Any) -> ModelConfig:
    """Gemma 3: Gemma 2's sandwich without its soft-caps, q/k norms per head, five 512-token local blocks to each
    global one, and a RoPE base for each (10,000 local, 1,000,000 global)."""
    base: dict[str, Any] = dict(
        vocab_size=262144, context=32768, d_head=256, n_heads=4, n_kv_heads=1, sliding_window=512,
        layer_types=("sliding",) * 5 + ("full",), rope_theta=1000000.0, rope_local_theta=10000.0,
        qk_norm="head", attn_softcap=None, final_softcap=None,
    )
    return _gemma2(name, **base | kw)


PRESETS |= {
    "gemma3-270m": _gemma3("gemma3-270m", d_model=640, n_layers=18, d_ff=2048),
    "gemma3-1b": _gemma3("gemma3-1b", d_model=1152, n_layers=26, d_ff=6912),
    # Qwen3-MoE: Qwen3's attention; each block's MLP 128 SwiGLU experts of width 768, of which 8 run per token
    "qwen3-30b-a3b": _llama(
        "qwen3-30b-a3b", vocab_size=151936, context=40960, d_model=2048, n_layers=48, n_heads=32, n_kv_heads=4,
        d_head=128, d_ff=768, rope_theta=1000000.0, norm_eps=1e-6, tie_embeddings=False, qk_norm="head",
        n_experts=128, experts_per_token=8, norm_topk_prob=True,
    ),
    # OLMoE: OLMo's q/k norms over the whole projection in a pre-LN block; each MLP 64 SwiGLU experts of width
    # 1024, of which 8 run per token, their router weights as the softmax gave them (not renormalised)
    "olmoe-1b-7b": _llama(
        "olmoe-1b-7b", vocab_size=50304, context=4096, d_model=2048, n_layers=16, n_heads=16, d_ff=1024,
        norm_eps=1e-5, tie_embeddings=False, qk_norm="projection", n_experts=64, experts_per_token=8,
        norm_topk_prob=False,
    ),
}

