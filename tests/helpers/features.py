"""Dictionaries whose answer is known, for the feature tools' tests."""

from __future__ import annotations

import torch

from lumen import GPT, ModelConfig
from lumen.features import SAE, ReLU


def tiny(d: int = 8) -> GPT:
    """A random two-block model of width d, seeded."""
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=40, context=16, d_model=d, n_layers=2, n_heads=2)).eval()


def basis_dictionary(site: str, d: int = 8) -> SAE:
    """Features that are the stream's own basis, both signs: feature j is relu(x_j), feature d + j is relu(-x_j),
    so each feature's activation is a coordinate of the stream and x = relu(x) - relu(-x) exactly."""
    sae = SAE(d, 2 * d, ReLU(), site, apply_b_dec_to_input=False)
    with torch.no_grad():
        eye = torch.eye(d)
        sae.W_enc.copy_(torch.cat([eye, -eye], dim=1))
        sae.W_dec.copy_(torch.cat([eye, -eye], dim=0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    return sae
