"""Causal multi-head attention with grouped-query heads, RoPE or learned positions, and a KV cache.

Grouped-query attention (GQA) lets several query heads share one key/value head:

    query heads   q0 q1 q2 | q3 q4 q5 | q6 q7 q8        n_heads    = 9
                  \\  |  /    \\  |  /    \\  |  /
    kv heads         kv0        kv1        kv2           n_kv_heads = 3

With n_kv_heads == n_heads it is ordinary multi-head attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig, RopeScaling
from .errors import UserError


def rope_frequencies(dims: int, theta: float, scaling: RopeScaling | None = None,
                     device: torch.device | str | None = None) -> torch.Tensor:
    """RoPE's angular frequencies, one per rotated pair: theta^(-2i/dims), i = 0 .. dims/2 - 1, then
    rescaled to stretch the context (config.RopeScaling: "linear" slows them all, "llama3" only the slow ones)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, dims, 2, dtype=torch.float32, device=device) / dims)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    # llama3: a wavelength (2 pi / frequency) longer than the original context's low-frequency bound is stretched
    # by `factor`; one shorter than the high-frequency bound is kept; in between, a blend linear in context/wavelength
    wavelength = 2 * math.pi / inv_freq
    low, high = scaling.low_freq_factor, scaling.high_freq_factor
    blend = (scaling.original_context / wavelength - low) / (high - low)   # 0 at the slow bound, 1 at the fast one
    blended = (1 - blend) * inv_freq / scaling.factor + blend * inv_freq
    slow = wavelength > scaling.original_context / low
    fast = wavelength < scaling.original_context / high
    return torch.where(slow, inv_freq / scaling.factor, torch.where(fast, inv_freq, blended))


class RoPE(nn.Module):
    """Rotary position embedding (Su et al. 2021): rotate pairs of query/key features by an angle
    proportional to the position, so that q.k depends only on the distance between two tokens.

    Pairs are (i, i + dims/2), the layout Hugging Face's Llama uses. With `dims` below the head's
    width (GPT-NeoX rotates a quarter), only the first `dims` features rotate; the rest carry no
    position.
    """

    cos: torch.Tensor  # buffers, (context, dims/2): the cos and sin of every position's angles
    sin: torch.Tensor

    def __init__(self, dims: int, context: int, theta: float = 10000.0, scaling: RopeScaling | None = None):
        super().__init__()
        self.dims, self.context, self.theta, self.scaling = dims, context, theta, scaling
        self.register_buffer("cos", torch.empty(0), persistent=False)
        self.register_buffer("sin", torch.empty(0), persistent=False)
        self.reset_buffers()

    def reset_buffers(self, device: torch.device | str | None = None) -> None:
        """(Re)compute the cos/sin tables: they follow from the shape, so they are never stored
        (a model built on the meta device gets real ones here)."""
        device = device or self.cos.device
        if torch.device(device).type == "meta":  # a template's: shapes only (torch's meta arange imports its compiler)
            self.cos, self.sin = torch.empty(2, self.context, self.dims // 2, device=device).unbind()
            return
        inv_freq = rope_frequencies(self.dims, self.theta, self.scaling, device)
        angles = torch.outer(torch.arange(self.context, dtype=torch.float32, device=device), inv_freq)  # (L, hd/2)
        self.cos, self.sin = angles.cos(), angles.sin()

    def forward(self, x: torch.Tensor, pos: int | torch.Tensor = 0) -> torch.Tensor:  # x: (B, h, T, hd)
        """pos: the position of x's first token, the positions of all T tokens as a (T,) tensor, or each
        row's own positions (B, T) (a padded batch)."""
        if isinstance(pos, int):
            cos, sin = self.cos[pos : pos + x.size(-2)], self.sin[pos : pos + x.size(-2)]
        else:
            cos, sin = self.cos[pos], self.sin[pos]
            if pos.dim() == 2:                                  # (B, T, dims/2) -> one table per row, every head
                cos, sin = cos[:, None], sin[:, None]
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        x, rest = x[..., : self.dims], x[..., self.dims :]   # partial rotary: the rest carries no position
        rotated = self.rotate(x, cos, sin)
        return torch.cat((rotated, rest), dim=-1) if rest.size(-1) else rotated

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Turn each pair (x_i, x_{i + dims/2}) by its angle."""
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class InterleavedRoPE(RoPE):
    """RoPE on adjacent pairs (x_0, x_1), (x_2, x_3), ...: the same rotations with the features paired
    differently (GPT-J, and the original RoFormer)."""

    def rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x1, x2 = x[..., 0::2], x[..., 1::2]                              # the pairs' first and second features
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


class SoftCap(nn.Module):
    """Soft-capping (Gemma 2): x -> cap * tanh(x / cap). Near 0 it is the identity; large values are squashed
    smoothly into (-cap, cap), so no attention score or logit runs away (and none is clipped flat)."""

    def __init__(self, cap: float):
        super().__init__()
        self.cap = cap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cap * torch.tanh(x / self.cap)

    def extra_repr(self) -> str:
        return f"cap={self.cap}"


class Padding:
    """Which tokens of a padded batch are real. Prompts of different lengths run side by side once the
    shorter ones are filled up with padding tokens (on the left or on the right); `real` (B, S) is True at
    a real token's slot.

    A real token's position is the number of real tokens before it, so a prompt's positions are 0, 1, 2,
    ... wherever its padding sits (learned positions and RoPE see what they see when it runs alone), and
    no query reads a padding token. A padding token reads itself alone, so that no softmax row is empty;
    what it computes is never read."""

    def __init__(self, real: torch.Tensor):
        self.real = real.bool()                                        # (B, S)
        self.positions = (self.real.cumsum(-1) - 1).clamp_min(0)       # (B, S)

    @classmethod
    def of(cls, mask: torch.Tensor | None, cache: KVCache | None = None) -> Padding | None:
        """The padding of a forward pass: a mask (B, T) of the new tokens (True = real) or None (all real),
        joined to what a KV cache already holds."""
        if cache is not None:
            return cache.pad(mask)
        return cls(mask) if mask is not None else None

    def at(self, slots: torch.Tensor) -> torch.Tensor:
        """The positions (B, T) of the tokens in slots (T,)."""
        return self.positions[:, slots]

    def visible(self, slots: torch.Tensor) -> torch.Tensor:
        """(B, 1, T, S): which keys the queries in slots (T,) may read, as far as padding goes."""
        own = torch.arange(self.real.size(1), device=slots.device) == slots[:, None]      # (T, S)
        return (self.real[:, None, :] | own)[:, None]


class LayerCache:
    """One layer's keys and values in buffers allocated once: slot j holds position j.

    Every step has the same shapes (all slots, the empty ones masked out), so a compiled decoding
    step runs for every position without recompiling."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, length: torch.Tensor):
        self.k, self.v = k, v  # (B, h_kv, slots, hd)
        self.length = length   # positions held so far: a 0-dim tensor shared by all layers

    def positions(self, T: int) -> torch.Tensor:
        """The positions of T new tokens: right after those held."""
        return self.length + torch.arange(T, device=self.length.device)

    def write(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the keys and values of positions pos; return all slots (B, h_kv, slots, hd).
        Under autocast the new keys arrive in bf16 and are kept in the cache's dtype (exactly)."""
        self.k.index_copy_(2, pos, k.to(self.k.dtype))
        self.v.index_copy_(2, pos, v.to(self.v.dtype))
        return self.k, self.v


class KVCache:
    """Keys and values of every layer, so that decoding one more token costs one token's work."""

    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        max_len: int | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype = torch.float32,
    ):
        shape = (batch, cfg.kv_heads, max_len or cfg.context, cfg.head_dim)
        self.length = torch.zeros((), dtype=torch.long, device=device)
        self.padding: Padding | None = None   # which slots hold real tokens, once a padded batch came in
        self.layers = [
            LayerCache(torch.zeros(shape, device=device, dtype=dtype),
                       torch.zeros(shape, device=device, dtype=dtype), self.length)
            for _ in range(cfg.n_layers)
        ]

    @property
    def n(self) -> int:
        """How many positions are cached."""
        return int(self.length)

    @property
    def slots(self) -> int:
        return self.layers[0].k.size(2)

    def check_room(self, T: int) -> None:
        if self.n + T > self.slots:
            raise UserError(
                f"KV cache full: {self.n + T} tokens exceed its {self.slots} slots (make a larger cache)"
            )

    def advance(self, T: int) -> None:
        """Count T more positions as held (after the model has written them)."""
        self.length += T

    def pad(self, mask: torch.Tensor | None) -> Padding | None:
        """The padding of every slot, with the mask (B, T) of T new tokens written at their slots (None:
        they are all real). Slots not yet written count as real: the tokens decoded into them are."""
        if mask is not None:
            real = self.padding.real.clone() if self.padding is not None else torch.ones(
                mask.size(0), self.slots, dtype=torch.bool, device=mask.device)
            self.padding = Padding(real.index_copy_(1, self.layers[0].positions(mask.size(1)), mask.bool()))
        return self.padding


class MultiHeadAttention(nn.Module):
    """softmax(Q K^T / sqrt(d_head)) V per head, causal, with separate q, k, v and out projections."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        n_kv_heads: int | None = None,
        bias: bool = True,
        rope: RoPE | None = None,
        dropout: float = 0.0,
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        window: int | None = None,
        q_norm: nn.Module | None = None,
        k_norm: nn.Module | None = None,
        scale: float | None = None,
        softcap: float | None = None,
    ):
        """head_dim defaults to d_model / n_heads; qkv_bias (default: bias) puts biases on W_Q, W_K, W_V
        alone; window: each query sees only the last `window` keys, itself included; q_norm, k_norm: norms
        of the queries and keys (B, T, heads, d_head) before RoPE (Qwen3, OLMo-2; block.qk_norms); scale: what
        q.k is multiplied by (default 1 / sqrt(head_dim)); softcap: scores squashed to softcap * tanh(scores /
        softcap)."""
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads or n_heads
        self.head_dim = head_dim or d_model // n_heads
        qkv_bias = bias if qkv_bias is None else qkv_bias
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q = nn.Linear(d_model, q_dim, bias=qkv_bias)
        self.k = nn.Linear(d_model, kv_dim, bias=qkv_bias)
        self.v = nn.Linear(d_model, kv_dim, bias=qkv_bias)
        self.out = nn.Linear(q_dim, d_model, bias=bias)     # W_O: writes the heads back into the stream
        self.q_norm = q_norm or nn.Identity()
        self.k_norm = k_norm or nn.Identity()
        self.rope = rope
        self.window = window
        self.scale = scale if scale is not None else 1 / math.sqrt(self.head_dim)
        self.softcap = SoftCap(softcap) if softcap is not None else None
        self.dropout = dropout
        self.scores = nn.Identity()   # named places for the scores before the softmax and for the attention
        self.pattern = nn.Identity()  # weights (plain path only: lumen.inspect's hooks)
        # False: the plain softmax path below (one query always takes it), which exposes the pattern
        self.use_sdpa = True

    @classmethod
    def from_config(cls, cfg: ModelConfig, q_norm: nn.Module | None = None,
                    k_norm: nn.Module | None = None, layer: int = 0) -> MultiHeadAttention:
        """Block `layer`'s attention: its window and its RoPE base (or none) may differ from block to block."""
        rope = None
        theta = cfg.rope_base(layer)
        if theta is not None:  # (a base of its own for local layers is never stretched: Gemma 3 stretches global ones)
            local = cfg.layer_type(layer) == "sliding" and cfg.rope_local_theta is not None
            rope = (InterleavedRoPE if cfg.rope_interleaved else RoPE)(cfg.rotary_dims, cfg.context, theta,
                                                                        None if local else cfg.rope_scaling)
        scale = cfg.query_pre_attn_scalar**-0.5 if cfg.query_pre_attn_scalar is not None else None
        return cls(cfg.d_model, cfg.n_heads, cfg.kv_heads, cfg.attention_bias, rope, cfg.dropout,
                   cfg.head_dim, cfg.attention_bias or cfg.qkv_bias, cfg.window(layer), q_norm, k_norm,
                   scale=scale, softcap=cfg.attn_softcap)

    def forward(
        self, x: torch.Tensor, mask: Padding | None = None, cache: LayerCache | None = None
    ) -> torch.Tensor:
        """mask: which tokens of a padded batch are real (None: all of them)."""
        B, T, _ = x.shape
        q = self.q_norm(self.q(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)      # (B, h, T, hd)
        k = self.k_norm(self.k(x).view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)   # (B, h_kv, T, hd)
        v = self.v(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)   # (B, h_kv, T, hd)
        slots = cache.positions(T) if cache is not None else torch.arange(T, device=x.device)
        if self.rope is not None:  # a token's position: its slot, or in a padded batch the real tokens before it
            pos = mask.at(slots) if mask is not None else slots
            q, k = self.rope(q, pos), self.rope(k, pos)
        if cache is not None:
            k, v = cache.write(k, v, slots)                                        # (B, h_kv, slots, hd)
        plain_causal = cache is None and mask is None and self.window is None
        allowed = None if plain_causal else visible(slots, k.size(2), mask, self.window)
        # one query (a decoding step) is a pair of small products: plain is faster than the fused
        # kernel there, and compiles into a few fused loops
        # (soft-capping is not in the fused kernel: a capped model always takes the plain path)
        attend = self.attend_sdpa if self.use_sdpa and T > 1 and self.softcap is None else self.attend_plain
        y = attend(q, k, v, allowed)
        return self.out(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def attend_plain(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None):
        """The readable path: scores, mask, softmax, weighted average of the values."""
        group = self.n_heads // self.n_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, h, S, hd)
        scores = q @ k.transpose(-2, -1) * self.scale                                # (B, h, T, S)
        if self.softcap is not None:  # squashed smoothly into (-cap, cap): no score runs away (Gemma 2)
            scores = self.softcap(scores)
        scores = self.scores(scores)
        T, S = scores.shape[-2:]
        if allowed is None:  # plain causal: query t sees keys up to its own position
            allowed = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)
        scores = scores.masked_fill(~allowed, float("-inf"))
        # each row: convex weights over the past (for bf16 scores the kernel sums in fp32 and rounds once; the
        # weights stay bf16, half of what a training step keeps for its backward pass in fp32)
        a = self.pattern(F.softmax(scores, dim=-1).to(v.dtype))
        a = F.dropout(a, self.dropout, self.training)
        return a @ v                                       # (B, h, T, hd)

    def attend_sdpa(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None):
        """The same numbers through PyTorch's fused kernel."""
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=allowed, is_causal=allowed is None, scale=self.scale,
            dropout_p=self.dropout if self.training else 0.0, enable_gqa=self.n_kv_heads != self.n_heads,
        )


def visible(
    pos: torch.Tensor, S: int, padding: Padding | None = None, window: int | None = None
) -> torch.Tensor:
    """Which of S key slots each query may see, as a bool tensor (True = attend): queries at
    slots pos (T,) see the keys at their own slot and before; with a sliding `window`, only the last
    `window` of those (a padded batch's real tokens are contiguous, so slots count positions); with
    `padding`, only real keys: (B, 1, T, S) instead of (T, S)."""
    key_pos = torch.arange(S, device=pos.device)
    allowed = key_pos <= pos[:, None]                              # (T, S)
    if window is not None:
        allowed = allowed & (key_pos > pos[:, None] - window)      # the window ends at the query itself
    return allowed if padding is None else allowed & padding.visible(pos)
