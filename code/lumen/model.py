"""The decoder-only language model: embed -> N blocks -> final norm -> unembed.

    >>> model = GPT(ModelConfig.from_name("baby-gpt"))
    >>> logits, loss = model(torch.zeros(1, 8, dtype=torch.long))
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention import KVCache, MultiHeadAttention
from .block import TransformerBlock, make_norm
from .config import ModelConfig
from .errors import ModelFileError, UserError

if TYPE_CHECKING:
    from .inspect.cache import ActivationCache

# torch.compile's options for lumen's models. Inductor writes tanh on CPU as a long vector polynomial;
# as 2 / (1 + e^(-2u)) - 1, the same function, GELU's forward and backward are much cheaper, accurate to
# fp32 rounding (the gain is in the README's Speed section). Other devices ignore it.
COMPILE_OPTIONS: dict[str, str | int | bool | Callable[..., Any]] = {"cpp.use_decompose_tanh": True}


class GPT(nn.Module):
    """A decoder-only transformer language model: token ids -> embeddings -> blocks -> final norm ->
    unembedding -> next-token logits. A model family is a `ModelConfig` preset; pretrained weights come
    through `lumen.formats.load` (``load("smollm2").model`` is a GPT too).

        >>> model = GPT.from_preset("baby-gpt", n_layers=2, d_model=64, n_heads=4, context=16)
        >>> idx = torch.tensor([[1, 2, 3]])
        >>> logits, loss = model(idx)                       # next-token logits at every position
        >>> logits.shape
        torch.Size([1, 3, 65])
        >>> model.generate(idx, 20, temperature=0).shape    # greedy; past the 16-token context the window slides
        torch.Size([1, 23])
        >>> logits, cache = model.run_with_cache(idx)       # every named activation (lumen.inspect)
        >>> cache["blocks.1.resid_post"].shape
        torch.Size([1, 3, 64])

    Its parts carry the chapter's names: tok_emb (and pos_emb for learned positions), blocks (one
    TransformerBlock, or PostLNBlock, per layer), ln_f (the final norm) and lm_head (the unembedding,
    tied to tok_emb when cfg.tie_embeddings).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.n_layers = cfg.n_layers
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.context, cfg.d_model) if cfg.positions == "learned" else None
        self.drop = nn.Dropout(cfg.dropout)
        blocks = [TransformerBlock.from_config(cfg) for _ in range(cfg.n_layers)]
        self.blocks = nn.ModuleList(blocks)
        for block in blocks[1:]:  # RoPE's tables follow from the shape alone: one copy serves every layer
            block.attn.rope = blocks[0].attn.rope
        # pre-LN (and parallel) blocks never normalise the stream itself, so one last norm before reading
        # it out; post-LN blocks already leave it normalised
        self.ln_f = make_norm(cfg) if cfg.norm_placement != "post" else nn.Identity()
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # the unembedding
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        if self.lm_head.weight.is_meta:  # a shape-only template (from_state, accounting): no values to draw
            return

        self.apply(self._init_weights)
        # after self.apply(self._init_weights): shrink the two residual-writing matrices per block,
        # so that the 2N writes into the stream add up to variance ~0.02^2 rather than 2N times it
        for block in blocks:
            for lin in (block.attn.out, block.mlp.down):
                nn.init.normal_(lin.weight, mean=0.0, std=0.02 / math.sqrt(2 * self.n_layers))

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @classmethod
    def from_state(
        cls,
        cfg: ModelConfig,
        state: dict[str, torch.Tensor],
        source: str = "the weights",
        dtype: torch.dtype | None = torch.float32,
    ) -> GPT:
        """A model of `cfg` holding `state` (lumen's parameter names), in eval mode: the one way every
        format (checkpoints, Hugging Face, GGUF) puts weights into a GPT.

        Nothing is initialised and then overwritten: the model is built on the meta device, the tensors
        are assigned (cast to `dtype` unless None), a tied unembedding is tied again, and derived buffers
        (RoPE's tables) are computed. Weights that do not fit the config, are not floating point, or hold
        NaN/inf raise a ModelFileError naming `source` (a file, for the message).

            >>> m = GPT.from_preset("baby-gpt")
            >>> GPT.from_state(m.cfg, m.state_dict()).cfg == m.cfg
            True
        """
        tied = {"lm_head.weight"} if cfg.tie_embeddings else set()
        # a cheap count first, so that a config claiming absurdly many blocks builds nothing
        blocks = {k.split(".")[1] for k in state if k.startswith("blocks.")}
        if len(blocks) != cfg.n_layers:
            raise ModelFileError(
                f"{source}: the weights hold {len(blocks)} blocks but the config says n_layers = {cfg.n_layers}; "
                "the config and the weights belong to different models"
            )
        with torch.device("meta"):
            model = cls(cfg)
        expected = {k: v for k, v in model.state_dict().items() if k not in tied}
        missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected) - tied)
        if missing or unexpected:
            raise ModelFileError(
                f"{source}: the weights do not match the config (missing {missing[:3]}, unexpected {unexpected[:3]}); "
                "were they saved from another model?"
            )
        for name, want in expected.items():
            t = state[name]
            if not t.is_floating_point():
                raise ModelFileError(f"{source}: tensor {name} has dtype {t.dtype}; weights must be floating point")
            if t.shape != want.shape:
                raise ModelFileError(
                    f"{source}: tensor {name} has shape {tuple(t.shape)} but the config needs {tuple(want.shape)}"
                )
            if not torch.isfinite(t).all():
                raise ModelFileError(f"{source}: tensor {name} holds NaN or infinite values; the file is damaged")
        model.load_state_dict(
            {k: state[k].to(dtype) if dtype is not None else state[k] for k in expected}, strict=False, assign=True
        )
        if cfg.tie_embeddings:
            model.lm_head.weight = model.tok_emb.weight
        model.reset_buffers(model.tok_emb.weight.device)
        return model.eval()

    def reset_buffers(self, device: torch.device | str) -> None:
        """Compute the buffers that follow from the shape (RoPE's tables) on `device`: a model built on the
        meta device has none until then."""
        for m in self.modules():
            if m is not self and hasattr(m, "reset_buffers"):
                m.reset_buffers(device)  # type: ignore[operator]  # torch's stub: Tensor | Module

    @classmethod
    def from_preset(cls, name: str, **changes: object) -> GPT:
        """A freshly initialised model of a named preset, e.g. ``GPT.from_preset("baby-gpt")``."""
        return cls(ModelConfig.from_name(name).replace(**changes))

    def attention(self, layer: int) -> MultiHeadAttention:
        """Block `layer`'s attention. (To a type checker, nn.ModuleList holds bare Modules; every block
        lumen builds holds a MultiHeadAttention as .attn.)"""
        attn = self.blocks[layer].attn
        assert isinstance(attn, MultiHeadAttention)
        return attn

    # the forward pass --------------------------------------------------------------------------
    def embed(self, idx: torch.Tensor, pos: torch.Tensor | None = None) -> torch.Tensor:
        """Token (and learned position) embeddings: the residual stream before block 0.
        pos: the positions of idx's T tokens (T,), by default 0..T-1."""
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

        With the KV cache each step feeds one token. Past the model's context the window slides: once
        the cache is full, each step re-reads the last `context` tokens from scratch. Every one of them
        has moved one position down and the oldest has left the view, so no cached key still holds
        (with learned positions the embeddings change; with RoPE the deeper layers' keys do, since
        they were computed from tokens now out of view). Without the cache each step re-reads the
        whole (cropped) sequence. Temperature 0 is greedy decoding. compile=True runs each step
        through `compiled()` (the same numbers to rounding, less per-token overhead; the first call
        compiles)."""
        check_sampling(temperature, top_k, top_p)
        check_tokens(idx, self.cfg, 0)
        context = self.cfg.context
        cache, held = None, idx.size(1)
        if use_cache:
            # slots rounded up, so that decoding runs of different lengths share one compiled step
            slots = min(context, -(-(idx.size(1) + max_new_tokens) // 256) * 256)
            cache = KVCache(self.cfg, idx.size(0), slots, idx.device, next(self.parameters()).dtype)
        logits, _ = self(idx, cache=cache)
        step_fn = self.compiled() if compile else self
        seq = idx
        for step in range(max_new_tokens):
            nxt = sample_next(logits[:, -1], temperature, top_k, top_p, generator)
            yield nxt
            if step + 1 == max_new_tokens:
                break
            seq = torch.cat((seq, nxt[:, None]), dim=1)[:, -context:]
            if cache is not None and held < cache.slots:
                logits, _ = step_fn(nxt[:, None], cache=cache)    # one more token: its keys join the cache
                held += 1
            else:  # re-read the window (compiled only at its full, fixed length)
                logits, _ = (step_fn if seq.size(1) == context else self)(seq)

    def compiled(self) -> Callable[..., tuple[torch.Tensor, torch.Tensor | None]]:
        """This model's forward pass compiled by torch.compile, once per model; called like the model.
        Shapes are static (one graph per input shape, so a KV cache keeps every slot and takes the
        position as a tensor): decoding one token at a time compiles once. Eager decoding spends
        much of each token launching hundreds of small operations; compiled, the norms,
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

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kw: Any) -> torch.Tensor:
        """idx (B, T) followed by max_new_tokens sampled tokens: (B, T + max_new_tokens), any number of
        them (past the context the window slides). Keywords as for `stream`: temperature (1.0; 0 is
        greedy), top_k, top_p, generator (a seeded torch.Generator repeats a sample), compile."""
        new = list(self.stream(idx, max_new_tokens, **kw))
        return torch.cat([idx] + [t[:, None] for t in new], dim=1)

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


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token id per row of logits (B, vocab): greedy at temperature 0, else sampled from the
    softmax at that temperature, restricted to the top_k tokens and the top_p probability mass."""
    check_sampling(temperature, top_k, top_p)
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    # distances below the best token, then scaled: never above 0, so no temperature overflows the softmax
    logits = (logits - logits.max(dim=-1, keepdim=True).values) / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        mass_before = sorted_logits.softmax(-1).cumsum(-1) - sorted_logits.softmax(-1)
        drop = mass_before >= top_p  # a token stays if the mass ahead of it is below top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# the smallest positive temperature accepted: sampling closer to 0 is greedy decoding but for exact ties, so a
# smaller one (1e-45) is taken for a slip; 0 says greedy plainly
MIN_TEMPERATURE = 1e-4


def check_sampling(temperature: float, top_k: int | None = None, top_p: float | None = None) -> None:
    """Clear errors for sampling settings that cannot work, before any token is computed."""
    if not (isinstance(temperature, numbers.Real) and math.isfinite(temperature) and temperature >= 0):
        raise UserError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature}")
    if 0 < temperature < MIN_TEMPERATURE:
        raise UserError(f"temperature {temperature} is too small to sample with: give 0 for greedy decoding, "
                        f"or at least {MIN_TEMPERATURE}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, numbers.Integral) or top_k < 1):
        raise UserError(f"top_k must be a whole number >= 1, got {top_k}")
    if top_p is not None and not (isinstance(top_p, numbers.Real) and 0 < top_p <= 1):
        raise UserError(f"top_p must be in (0, 1] (1 keeps every token), got {top_p}")


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
    attns = [model.attention(i) for i in (range(len(model.blocks)) if layers is None else set(layers))]
    before = [a.use_sdpa for a in attns]
    for a in attns:
        a.use_sdpa = False
    try:
        yield
    finally:
        for a, old in zip(attns, before):
            a.use_sdpa = old
