"""A sparse dictionary of a named site: the stream (or any activation) read as a few active features.

The chapter's stream "is shared: hundreds of heads and MLPs are all writing into the same d_model
dimensions", so one direction rarely means one thing. A sparse autoencoder (SAE) learns many more
directions than there are dimensions (d_sae >> d_in) and explains each activation x with a few of them:

    encode(x) = act(W_enc^T (x - b_dec) + b_enc)       the features: (..., d_sae), mostly zero
    decode(f) = W_dec^T f + b_dec                      the reconstruction: (..., d_in)

W_enc is (d_in, d_sae) and W_dec is (d_sae, d_in), SAELens's layout: row j of W_dec is feature j's
direction in the stream. A transcoder reads one site and writes another (an MLP's input to its output:
d_out may differ from d_in, and b_dec is not taken off the input), with an optional affine skip W_skip x.

    >>> sae = SAE(8, 32, TopK(4), site="blocks.0.resid_post")
    >>> x = torch.randn(3, 8)
    >>> f = sae.encode(x)
    >>> f.shape, int((f > 0).sum(-1).max()) <= 4
    (torch.Size([3, 32]), True)
    >>> sae.decode(f).shape
    torch.Size([3, 8])
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..errors import UserError

NORMALIZATIONS = ("none", "constant_norm_rescale", "layer_norm")


class ReLU(nn.Module):
    """The standard SAE: a feature is on when its pre-activation is positive (sparsity comes from training)."""

    def forward(self, pre: torch.Tensor) -> torch.Tensor:
        return F.relu(pre)


class TopK(nn.Module):
    """Exactly the k largest pre-activations of each token stay (those that are positive): L0 <= k."""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, pre: torch.Tensor) -> torch.Tensor:
        top = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, top.indices, F.relu(top.values))


class BatchTopK(nn.Module):
    """The k x N largest pre-activations of a batch of N tokens stay: k per token on average, more for a token
    that needs them. (A token's features depend on its batch: after training, save it as a JumpReLU.)"""

    def __init__(self, k: int):
        super().__init__()
        self.k = k

    def forward(self, pre: torch.Tensor) -> torch.Tensor:
        flat = F.relu(pre).reshape(-1)
        top = flat.topk(min(self.k * (flat.numel() // pre.shape[-1]), flat.numel()))
        return torch.zeros_like(flat).scatter(0, top.indices, top.values).reshape(pre.shape)


class JumpReLU(nn.Module):
    """A feature is on only above its own threshold, and then with its whole pre-activation (no ramp from 0)."""

    def __init__(self, d_sae: int):
        super().__init__()
        self.threshold = nn.Parameter(torch.zeros(d_sae))

    def forward(self, pre: torch.Tensor) -> torch.Tensor:
        return F.relu(pre) * (pre > self.threshold)


class SAE(nn.Module):
    """A sparse autoencoder on `site`: encode(x) = act(W_enc^T (x - b_dec) + b_enc), decode(f) = W_dec^T f + b_dec.

    apply_b_dec_to_input: whether b_dec is taken off x before encoding (SAELens's default, True).
    normalize: "none", or a scaling applied to x before encoding and undone after decoding:
    "constant_norm_rescale" (x scaled to norm sqrt(d_in)) or "layer_norm" (x standardised per token).
    """

    def __init__(self, d_in: int, d_sae: int, activation: nn.Module, site: str = "",
                 apply_b_dec_to_input: bool = True, normalize: str = "none", d_out: int | None = None):
        super().__init__()
        if normalize not in NORMALIZATIONS:
            raise UserError(f"normalize must be one of {', '.join(NORMALIZATIONS)}, got {normalize!r}")
        d_out = d_out or d_in
        self.site, self.act = site, activation
        self.apply_b_dec_to_input, self.normalize = apply_b_dec_to_input, normalize
        self.W_enc = nn.Parameter(torch.empty(d_in, d_sae))
        self.b_enc = nn.Parameter(torch.zeros(d_sae))
        self.W_dec = nn.Parameter(torch.empty(d_sae, d_out))
        self.b_dec = nn.Parameter(torch.zeros(d_out))
        nn.init.kaiming_uniform_(self.W_dec)
        with torch.no_grad():  # unit directions; an autoencoder's features start reading the direction they write
            self.W_dec.div_(self.W_dec.norm(dim=-1, keepdim=True))
            self.W_enc.copy_(self.W_dec.T if d_out == d_in else torch.randn(d_in, d_sae) / d_in ** 0.5)

    @property
    def d_in(self) -> int:
        return self.W_enc.shape[0]

    @property
    def d_sae(self) -> int:
        return self.W_enc.shape[1]

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        """The features' pre-activations: how strongly x points along each encoder direction."""
        if self.apply_b_dec_to_input:
            x = x - self.b_dec
        return x @ self.W_enc + self.b_enc

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """The features of x (..., d_in): (..., d_sae), mostly zero."""
        return self.act(self.pre(self._scaled(x)[0]))

    def decode(self, f: torch.Tensor) -> torch.Tensor:
        """Each active feature's direction, weighted by its activation, plus b_dec: (..., d_out), in the scaled
        space the dictionary reads (see `write`)."""
        return f @ self.W_dec + self.b_dec

    def write(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        """What the dictionary puts at its site for input x and features f (x's features, or edited ones): the
        decoding with the normalisation `encode` took off x put back."""
        _, (shift, factor) = self._scaled(x)
        return self.decode(f) * factor + shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The reconstruction of x (for a transcoder: its estimate of the site it writes)."""
        return self.write(x, self.encode(x))

    def _scaled(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """x as the dictionary reads it, and the (shift, factor) that gives x back: x = scaled * factor + shift."""
        zero = x.new_zeros(())
        if self.normalize == "constant_norm_rescale":  # every token's vector at norm sqrt(d_in)
            factor = x.norm(dim=-1, keepdim=True) / self.d_in ** 0.5
            return x / factor, (zero, factor)
        if self.normalize == "layer_norm":  # every token's vector standardised (SAELens: std + 1e-5)
            mu = x.mean(-1, keepdim=True)
            std = (x - mu).std(-1, keepdim=True)
            return (x - mu) / (std + 1e-5), (mu, std)
        return x, (zero, zero + 1)


class Transcoder(SAE):
    """A sparse dictionary that reads `site` and writes `site_out` (e.g. an MLP's input to its output):
    out = W_dec^T act(W_enc^T x + b_enc) + b_dec (+ W_skip x with an affine skip). It replaces a computation
    instead of reconstructing an activation, so b_dec (of the output's width) is never taken off the input."""

    def __init__(self, d_in: int, d_sae: int, activation: nn.Module, site: str, site_out: str,
                 d_out: int | None = None, skip: bool = False, normalize: str = "none"):
        super().__init__(d_in, d_sae, activation, site, apply_b_dec_to_input=False, normalize=normalize,
                         d_out=d_out)
        self.site_out = site_out
        self.W_skip = nn.Parameter(torch.zeros(self.W_dec.shape[1], d_in)) if skip else None

    def write(self, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        out = super().write(x, f)
        return out if self.W_skip is None else out + x @ self.W_skip.T  # the skip reads x as the site holds it
