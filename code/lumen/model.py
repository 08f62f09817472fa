"""The decoder-only language model: embed -> N blocks -> final norm -> unembed.

    >>> model = GPT(ModelConfig.from_name("baby-gpt"))
    >>> logits, loss = model(torch.zeros(1, 8, dtype=torch.long))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import KVCache
from .block import TransformerBlock, make_norm
from .config import ModelConfig
from .errors import UserError

# torch.compile's options for lumen's models. Inductor writes tanh on CPU as a long vector polynomial;
# as 2 / (1 + e^(-2u)) - 1, the same function, GELU's forward and backward run ~2x faster (a training
# step ~4%), accurate to fp32 rounding. Other devices ignore it.
COMPILE_OPTIONS = {"cpp.use_decompose_tanh": True}


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_layers = cfg.n_layers
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(TransformerBlock.from_config(cfg) for _ in range(cfg.n_layers))
        # pre-LN never normalises the stream itself, so one last norm before reading it out;
        # post-LN blocks already leave it normalised
        self.ln_f = make_norm(cfg) if cfg.norm_placement == "pre" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # the unembedding
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight

        self.apply(self._init_weights)
        # after self.apply(self._init_weights): shrink the two residual-writing matrices per block,
        # so that the 2N writes into the stream add up to variance ~0.02^2 rather than 2N times it
        for name, p in self.named_parameters():
            if name.endswith(("attn.out.weight", "mlp.proj.weight", "mlp.w_down.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layers))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_preset(cls, name: str, **changes: object) -> GPT:
        """A freshly initialised model of a named preset, e.g. ``GPT.from_preset("baby-gpt")``."""
        return cls(ModelConfig.from_name(name).replace(**changes))

    # the forward pass --------------------------------------------------------------------------
    def embed(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Token (and learned position) embeddings: the residual stream before block 0.
        pos: the positions of idx's T tokens (T,), by default 0..T-1."""
        x = self.tok_emb(idx)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos if pos is not None else torch.arange(idx.size(1), device=idx.device))
        return self.drop(x)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) for token ids idx (B, T), and the mean next-token loss if targets
        are given (positions whose target is -1 are ignored). With a cache, idx continues the
        tokens it holds, and their keys and values are added to it."""
        if not torch.compiler.is_compiling():  # (reading ids would split a compiled graph: callers check)
            check_tokens(idx, self.cfg, cache.n if cache is not None else 0)
            if cache is not None:
                cache.check_room(idx.size(1))
        T = idx.size(1)
        x = self.embed(idx, cache.layers[0].positions(T) if cache is not None else None)
        for i, block in enumerate(self.blocks):
            x = block(x, mask, cache.layers[i] if cache is not None else None)
        logits = self.lm_head(self.ln_f(x))
        if cache is not None:
            cache.advance(T)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    # decoding ----------------------------------------------------------------------------------
    @torch.inference_mode()
    def stream(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
        use_cache: bool = True,
        compile: bool = False,
    ) -> Iterator[torch.Tensor]:
        """Yield the next token ids (B,) one step at a time, conditioned on idx (B, T).

        With the KV cache each step feeds one token; without it, each step re-reads the whole
        (cropped) sequence. Temperature 0 is greedy decoding. compile=True runs each step through
        `compiled()` (the same numbers to rounding, less per-token overhead; the first call compiles)."""
        check_tokens(idx, self.cfg, 0)
        if use_cache:
            total = idx.size(1) + max_new_tokens
            if total > self.cfg.context:
                raise UserError(
                    f"prompt ({idx.size(1)} tokens) plus {max_new_tokens} new tokens exceed the model's "
                    f"context of {self.cfg.context} (shorten the prompt or lower --max-new-tokens)"
                )
            # slots rounded up, so that decoding runs of different lengths share one compiled step
            slots = min(self.cfg.context, -(-total // 256) * 256)
            cache = KVCache(self.cfg, idx.size(0), slots, idx.device, next(self.parameters()).dtype)
            logits, _ = self(idx, cache=cache)
            step_fn = self.compiled() if compile else self
            for step in range(max_new_tokens):
                nxt = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
                yield nxt
                if step + 1 < max_new_tokens:
                    logits, _ = step_fn(nxt[:, None], cache=cache)
        else:
            seq = idx
            for _ in range(max_new_tokens):
                logits, _ = self(seq[:, -self.cfg.context :])
                nxt = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
                yield nxt
                seq = torch.cat((seq, nxt[:, None]), dim=1)

    def compiled(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
        """This model's forward pass compiled by torch.compile, once per model; called like the model.
        Shapes are static (one graph per input shape, so a KV cache keeps every slot and takes the
        position as a tensor): decoding one token at a time compiles once. Eager decoding spends
        several milliseconds per token launching ~500 small operations; compiled, the norms,
        rotations and attention become a few fused kernels around the matrix products (and, with the
        FastLinear layers `formats.load` makes, a one-token step's products are fused loops too:
        `lumen.packing`). The
        weights stay inputs of the graph, so changing them needs no recompile."""
        if "_compiled" not in self.__dict__:  # a plain attribute, not a registered submodule
            self.__dict__["_compiled"] = torch.compile(self, dynamic=False, options=COMPILE_OPTIONS)
        return self.__dict__["_compiled"]

    def __getstate__(self) -> dict:
        """Copies and pickles leave the compiled step out (a copy compiles its own)."""
        state = dict(self.__dict__)
        state.pop("_compiled", None)
        return state

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kw: object) -> torch.Tensor:
        """idx (B, T) followed by max_new_tokens sampled tokens: (B, T + max_new_tokens)."""
        new = list(self.stream(idx, max_new_tokens, **kw))
        return torch.cat([idx] + [t[:, None] for t in new], dim=1)


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token id per row of logits (B, vocab): greedy at temperature 0, else sampled from the
    softmax at that temperature, restricted to the top_k tokens and the top_p probability mass."""
    if temperature < 0:
        raise UserError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        if not 0 < top_p <= 1:
            raise UserError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        drop = mass_before >= top_p  # a token stays if the mass ahead of it is below top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def check_tokens(idx: torch.Tensor, cfg: ModelConfig, start: int) -> None:
    """Clear errors for inputs the model cannot read."""
    if idx.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"token ids must be an integer tensor, got {idx.dtype} (use .long())")
    if idx.dim() != 2:
        raise UserError(f"token ids must have shape (batch, time), got {tuple(idx.shape)}")
    if start + idx.size(1) > cfg.context:
        raise UserError(
            f"sequence of {start + idx.size(1)} tokens exceeds the model's context of {cfg.context} "
            "(crop the input or use a model with a longer context)"
        )
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= cfg.vocab_size):
        raise UserError(
            f"token ids must lie in [0, {cfg.vocab_size}), got range [{int(idx.min())}, {int(idx.max())}]"
            " (was the text encoded with this model's tokenizer?)"
        )


@contextmanager
def plain_attention(model: GPT, layers: Iterable[int] | None = None) -> Iterator[None]:
    """Route attention (all layers, or the given ones) through the plain softmax path, which exposes
    the pattern; restore the model's own choice afterwards."""
    attns = [model.blocks[i].attn for i in (range(len(model.blocks)) if layers is None else set(layers))]
    before = [a.__dict__.get("use_sdpa") for a in attns]
    for a in attns:
        a.use_sdpa = False          # an instance attribute shadows the class default for this model only
    try:
        yield
    finally:
        for a, old in zip(attns, before):
            if old is None:
                del a.use_sdpa
            else:
                a.use_sdpa = old
