"""Small random models with known properties, for the report and explorer tests."""

from __future__ import annotations

import torch

from lumen import GPT, ModelConfig
from lumen.tokenizers import CharTokenizer


def peaked_tiny_model(text: str) -> tuple[GPT, CharTokenizer]:
    """A random 3-block character model with weights scaled up: peaked predictions and attention patterns,
    so a grid or a page has both light and dark cells."""
    tok = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=tok.vocab_size, context=64, d_model=32, n_layers=3, n_heads=4, name="tiny")
    model = GPT(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(8.0)
    return model, tok
