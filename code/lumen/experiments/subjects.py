"""The models the looking-inside experiments study: SmolLM2-135M (the real one) and a small lumen model
trained on Shakespeare here. Each is made once per process and shared by the experiments that use it."""

from __future__ import annotations

from functools import lru_cache
from typing import TypedDict

import torch

from ..config import ModelConfig
from ..formats import load
from ..model import GPT
from ..tokenizers import Tokenizer
from .fit import History, expect, shakespeare, train_lm


class TrainedSize(TypedDict):
    layers: int
    d: int
    heads: int
    context: int
    steps: int
    batch: int
    lr: float


# the trained lumen model: characters, as `lumen train --preset shakespeare` but smaller and shorter
TRAINED = {False: TrainedSize(layers=4, d=96, heads=4, context=128, steps=400, batch=16, lr=2e-3),
           True: TrainedSize(layers=2, d=64, heads=4, context=64, steps=60, batch=8, lr=3e-3)}


@lru_cache(maxsize=1)
def smollm2() -> tuple[GPT, Tokenizer]:
    """SmolLM2-135M in lumen (fp32, eval mode) and its tokenizer, loaded once."""
    loaded = load("smollm2")
    assert loaded.tokenizer is not None  # SmolLM2's GGUF file carries its tokenizer
    return loaded.model.eval(), loaded.tokenizer


@lru_cache(maxsize=2)
def trained_char_model(quick: bool, seed: int) -> tuple[GPT, Tokenizer, History]:
    """A small GPT trained on Shakespeare's characters with lumen's training loop (cached per size and seed)."""
    s = TRAINED[quick]
    expect(s["steps"])
    data = shakespeare()
    cfg = ModelConfig(vocab_size=data.tokenizer.vocab_size, context=s["context"], d_model=s["d"],
                      n_layers=s["layers"], n_heads=s["heads"], activation="gelu", name="shakespeare-char")
    torch.manual_seed(seed)
    model = GPT(cfg)
    hist = train_lm(model, data, s["steps"], lr=s["lr"], warmup=s["steps"] // 10, batch_size=s["batch"],
                    seed=seed, eval_windows=32)
    return model.eval(), data.tokenizer, hist


def describe_trained(quick: bool, seed: int) -> str:
    s = TRAINED[quick]
    _, _, hist = trained_char_model(quick, seed)
    return (f"a lumen model trained here on Shakespeare's characters ({s['layers']} layers, d={s['d']}, "
            f"{s['steps']} steps; val loss {hist.final_val:.2f})")
