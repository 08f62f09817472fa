"""The decoder-only language model: embed -> N blocks -> final norm -> unembed.

    >>> model = GPT(ModelConfig.from_name("baby-gpt"))
    >>> logits, loss = model(torch.zeros(1, 8, dtype=torch.long))

Read top to bottom: the parts and the init rule (`__init__`), the forward pass (`embed`, `forward`), then
how pretrained weights are put in (`from_state`). Decoding lives in decode.py, looking inside in lumen.inspect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import KVCache, MultiHeadAttention, Padding, RoPE, SoftCap
from .block import MixtureOfExperts, TransformerBlock, make_norm
from .config import ModelConfig
from .errors import ModelFileError, UserError

if TYPE_CHECKING:
    from collections.abc import Callable

    from .decode import Sampling
    from .inspect.cache import ActivationCache


class GPT(nn.Module):
    """A decoder-only transformer language model: token ids -> embeddings -> blocks -> final norm ->
    unembedding -> next-token logits. A model family is a `ModelConfig` preset; pretrained weights come
    through `lumen.formats.load` (``load("smollm2").model`` is a GPT too).

        >>> model = GPT.from_preset("baby-gpt", n_layers=2, d_model=64, n_heads=4, context=16)
        >>> idx = torch.tensor([[1, 2, 3]])
        >>> logits, loss = model(idx)                       # next-token logits at every position
        >>> logits.shape
        torch.Size([1, 3, 65])
        >>> model.generate(idx, 20, temperature=0).shape    # greedy (lumen.decode); past the context the window slides
        torch.Size([1, 23])
        >>> logits, cache = model.run_with_cache(idx)       # every named activation (lumen.inspect)
        >>> cache["blocks.1.resid_post"].shape
        torch.Size([1, 3, 64])

    Its parts carry the chapter's names: tok_emb (and pos_emb for learned positions), blocks (one
    TransformerBlock, or PostLNBlock, per layer), ln_f (the final norm) and lm_head (the unembedding,
    tied to tok_emb when cfg.tie_embeddings); logit_cap squashes the logits (Gemma 2's soft-cap) or passes
    them through.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_layers = cfg.n_layers
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        blocks = [TransformerBlock.from_config(cfg, i) for i in range(cfg.n_layers)]
        self.blocks = nn.ModuleList(blocks)
        shared: dict[float, RoPE] = {}  # RoPE's tables follow from the shape and base alone: one copy per base
        for block in blocks:
            if isinstance(block.attn.rope, RoPE):
                block.attn.rope = shared.setdefault(block.attn.rope.theta, block.attn.rope)
        # pre-LN (and parallel) blocks never normalise the stream itself, so one last norm before reading
        # it out; post-LN blocks already leave it normalised
        self.ln_f = make_norm(cfg) if cfg.norm_placement != "post" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.head_bias)  # the unembedding (+ b: Phi-2, GPT-J)
        # Gemma 2 squashes the logits into (-cap, cap) after the unembedding; every other family reads them as they are
        self.logit_cap = SoftCap(cfg.final_softcap) if cfg.final_softcap is not None else nn.Identity()
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.sampling: Sampling | None = None  # the sampling defaults its files carry, if any (lumen.decode)
        if self.lm_head.weight.is_meta:  # a shape-only template (from_state, accounting): no values to draw
            return

        self.apply(self._init_weights)
        # after self.apply(self._init_weights): shrink the two residual-writing matrices per block,
        # so that the 2N writes into the stream add up to variance ~0.02^2 rather than 2N times it
        for block in blocks:
            mlps = list(block.mlp.experts) if isinstance(block.mlp, MixtureOfExperts) else [block.mlp]  # (MoE: each)
            writers: list[nn.Linear] = [block.attn.out, *(m.down for m in mlps)]  # type: ignore[list-item]  # (.down: Linear)
            for lin in writers:
                nn.init.normal_(lin.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layers))

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
        pos: the positions of idx's T tokens (T,) or of each row's (B, T), by default 0..T-1."""
        x = self.tok_emb(idx)
        if self.cfg.scale_embeddings:  # Gemma: sqrt(d_model), rounded to the stream's dtype as Gemma does
            x = x * torch.tensor(self.cfg.d_model**0.5, dtype=x.dtype)
        if self.pos_emb is not None:
            x = x + self.pos_emb(pos if pos is not None else torch.arange(idx.size(1), device=idx.device))
        return self.drop(x)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits (B, T, vocab) for token ids idx (B, T), and the mean next-token loss if targets
        are given (positions whose target is -1 are ignored). With a cache, idx continues the
        tokens it holds, and their keys and values are added to it. mask (B, T): for a padded batch
        (prompts of different lengths, `Tokenizer.pad`), True at the real tokens; each prompt's logits
        are then what it gets alone (attention.Padding). last_only: the last position's logits alone
        (B, 1, vocab), all that decoding reads from a prompt (the others would be unembedded for nothing:
        a fifth of a long prompt's products in a small model, and T x vocab floats)."""
        if last_only and targets is not None:
            raise ValueError("a loss needs every position's logits: pass targets or last_only, not both")
        if not torch.compiler.is_compiling():  # (reading ids would split a compiled graph: callers check)
            check_tokens(idx, self.cfg, cache.n if cache is not None else 0, mask)
            if cache is not None:
                cache.check_room(idx.size(1))
        T = idx.size(1)
        slots = cache.layers[0].positions(T) if cache is not None else torch.arange(T, device=idx.device)
        padding = Padding.of(mask, cache)                      # which tokens are real (None: all)
        x = self.embed(idx, padding.at(slots) if padding is not None else slots)
        for i, block in enumerate(self.blocks):
            x = block(x, padding, cache.layers[i] if cache is not None else None)
        if last_only:  # (each position is normed and unembedded on its own: the last one's numbers are the same)
            x = x[:, -1:]
        logits = self.logit_cap(self.lm_head(self.ln_f(x)))
        if cache is not None:
            cache.advance(T)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-1)
        return logits, loss

    # what the pieces around the forward pass ask of a model --------------------------------------
    @property
    def device(self) -> torch.device:
        """Where the model's weights live (token ids go there)."""
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point type of its weights (and so of its residual stream)."""
        return next(self.parameters()).dtype

    def attention(self, layer: int) -> MultiHeadAttention:
        """Block `layer`'s attention. (To a type checker, nn.ModuleList holds bare Modules; every block
        lumen builds holds a MultiHeadAttention as .attn.)"""
        attn = self.blocks[layer].attn
        assert isinstance(attn, MultiHeadAttention)
        return attn

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kw: Any) -> torch.Tensor:
        """idx (B, T) followed by max_new_tokens sampled tokens: `lumen.decode.generate` as a method (the
        name nanoGPT users type first). Keywords: temperature (0 is greedy), top_k, top_p, generator; unset
        ones come from the model's own sampling defaults (its files') or lumen's."""
        from .decode import generate

        return generate(self, idx, max_new_tokens, **kw)

    def run_with_cache(
        self,
        idx: torch.Tensor,
        names: Iterable[str] | Callable[[str], bool] | None = None,
        device: torch.device | str | None = None,
    ) -> tuple[torch.Tensor, ActivationCache]:
        """(logits, cache of named activations) for token ids idx (B, T): `lumen.inspect.run_with_cache`
        as a method (the name TransformerLens users type first). names: a list of names such as
        "blocks.3.resid_post", a predicate on the name, or None for all (`lumen.inspect.activation_names`).
        The model core does not depend on lumen.inspect: it is imported here, when asked for."""
        from .inspect.cache import run_with_cache

        return run_with_cache(self, idx, names, device)

    # pretrained weights --------------------------------------------------------------------------
    @classmethod
    def from_state(
        cls,
        cfg: ModelConfig,
        state: dict[str, torch.Tensor],
        source: str = "the weights",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = torch.float32,
        parts: dict[str, nn.Module] | None = None,
    ) -> GPT:
        """A model of `cfg` holding `state` (lumen's parameter names), in eval mode: the one way every
        format (checkpoints, Hugging Face, GGUF, a GGUF's quantized blocks) puts weights into a GPT.

        Nothing is initialised and then overwritten: the model is built as a `template`, the tensors
        are assigned (moved to `device` and cast to `dtype`, unless None), a tied unembedding is tied
        again, and derived buffers (RoPE's tables) are computed. `parts` are modules that take the place of
        the plain ones at those names (e.g. ``{"blocks.0.attn.q": <a layer of quantized blocks>}``); their
        tensors are theirs, not in `state`. Weights that do not fit the config, are not floating point, or
        hold NaN/inf raise a ModelFileError naming `source` (a file, for the message).

            >>> m = GPT.from_preset("baby-gpt")
            >>> GPT.from_state(m.cfg, m.state_dict()).cfg == m.cfg
            True
        """
        parts = parts or {}
        # a cheap count first, so that a config claiming absurdly many blocks builds nothing
        blocks = {k.split(".")[1] for k in [*state, *parts] if k.startswith("blocks.")}
        if len(blocks) != cfg.n_layers:
            raise ModelFileError(
                f"{source}: the weights hold {len(blocks)} blocks but the config says n_layers = {cfg.n_layers}; "
                "the config and the weights belong to different models"
            )
        model = cls.template(cfg)
        for name, part in parts.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, part.to(device) if device else part)
        tied = {"lm_head.weight"} if cfg.tie_embeddings and "lm_head" not in parts else set()
        expected = {k: v for k, v in model.state_dict().items() if k not in tied and v.is_meta}
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected) - tied)
        if missing or unexpected:
            raise ModelFileError(
                f"{source}: the weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                "were they saved from another model?"
            )
        for name, want in expected.items():
            check_weight(state[name], name, want.shape, source)
        model.load_state_dict(
            {k: state[k].to(device=device, dtype=dtype) for k in expected}, strict=False, assign=True
        )
        if tied:
            model.lm_head.weight = model.tok_emb.weight
        model.reset_buffers(model.device)
        return model.eval()

    @classmethod
    def template(cls, cfg: ModelConfig) -> GPT:
        """A model of `cfg` as shapes only, on the meta device: no memory, nothing drawn or computed."""
        with torch.device("meta"), _NoDraws():
            return cls(cfg)

    def reset_buffers(self, device: torch.device | str) -> None:
        """Compute the buffers that follow from the shape (RoPE's tables) on `device`: a model built on the
        meta device has none until then."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_buffers"):
                m.reset_buffers(device)  # type: ignore[operator]  # torch's stub: Tensor | Module


def check_weight(t: torch.Tensor, name: str, shape: torch.Size, source: str) -> None:
    """A tensor that can be weight `name` of `shape`: floating point, that shape, finite; else a
    ModelFileError naming `source`."""
    if not t.is_floating_point():
        raise ModelFileError(f"{source}: tensor {name} has dtype {t.dtype}; weights must be floating point")
    if t.shape != shape:
        raise ModelFileError(f"{source}: tensor {name} has shape {tuple(t.shape)} but the config needs {tuple(shape)}")
    if not torch.isfinite(t).all():
        raise ModelFileError(f"{source}: tensor {name} holds NaN or infinite values; the file is damaged")


def check_tokens(idx: torch.Tensor, cfg: ModelConfig, start: int, mask: torch.Tensor | None = None) -> None:
    """Clear errors for inputs the model cannot read."""
    if idx.dtype not in (torch.long, torch.int32, torch.int16, torch.uint8):
        raise TypeError(f"token ids must be an integer tensor, got {idx.dtype} (use .long())")
    if idx.dim() != 2:
        raise UserError(f"token ids must have shape (batch, time), got {tuple(idx.shape)}")
    if mask is not None and (mask.shape != idx.shape or mask.dtype not in (torch.bool, torch.long, torch.int32)):
        raise UserError(f"a padding mask must be a bool tensor of the token ids' shape {tuple(idx.shape)} (True at "
                        f"real tokens), got {mask.dtype} {tuple(mask.shape)}")
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
    attns = [model.attention(i) for i in (range(len(model.blocks)) if layers is None else set(layers))]
    before = [a.use_sdpa for a in attns]
    for a in attns:
        a.use_sdpa = False
    try:
        yield
    finally:
        for a, old in zip(attns, before):
            a.use_sdpa = old


class _NoDraws(torch.overrides.TorchFunctionMode):
    """torch.nn.init's draws left undone (nn.Embedding draws its own N(0, 1) as it is built): a template has no
    values to draw, and torch draws on the meta device through Python reference kernels whose first call
    imports its compiler (torch._dynamo, sympy) into a process that may never compile."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init":
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))
