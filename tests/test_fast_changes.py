"""The speed wing's one way of changing things for a while (fast/changes.py), and its door: whatever
`lumen.fast.decoding` changed (the model's modules and their classes, the heap's settings) is as it was after
it, an exception inside the door or while it opens included."""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn as nn

from lumen import GPT, ModelConfig, fast
from lumen.fast.changes import Changes
from lumen.runtime import heap

TINY = ModelConfig.from_name("baby-llama").replace(vocab_size=97, context=40, d_model=64, n_layers=2, n_heads=4,
                                                   n_kv_heads=2, d_ff=128)


def test_changes_are_undone_last_first_and_an_attribute_added_is_deleted():
    holder = nn.Sequential(nn.Linear(2, 2))
    first, layer = holder[0], nn.Linear(2, 2)
    with pytest.raises(ValueError), Changes() as changes:
        changes.set(holder, "0", layer)
        changes.set_class(layer, nn.Identity)
        changes.set(layer, "note", 1)
        changes.set(layer, "in_features", 5)
        assert holder[0] is layer and isinstance(layer, nn.Identity) and layer.note == 1
        raise ValueError
    assert holder[0] is first and type(layer) is nn.Linear and layer.in_features == 2
    assert not hasattr(layer, "note")


def _quantized(tmp_path) -> GPT:
    from gguf import GGMLQuantizationType as Q

    from helpers.gguf import tiny_model, write_gguf

    path = tmp_path / "tiny.gguf"
    matrices = [f"blk.{i}.{m}.weight" for i in range(2) for m in ("attn_q", "attn_k", "attn_v", "attn_output",
                                                                  "ffn_gate", "ffn_up", "ffn_down")]
    write_gguf(path, tiny_model(), {m: Q.Q8_0 for m in matrices})
    return fast.load_quantized(str(path)).model


def _picture(model: nn.Module) -> list:
    """Every module by name: the object, its class and its own attributes' names; every tensor's bits."""
    modules = [(n, id(m), type(m), sorted(vars(m)), sorted(m._modules)) for n, m in model.named_modules()]
    return [modules, {k: v.clone() for k, v in model.state_dict().items()}]


def _same(a: list, b: list) -> bool:
    return a[0] == b[0] and a[1].keys() == b[1].keys() and all(torch.equal(a[1][k], b[1][k]) for k in a[1])


@pytest.mark.parametrize("kind", ["float", "quantized"])
@pytest.mark.parametrize("where", ["inside", "opening"])
def test_an_exception_in_the_door_leaves_the_model_and_the_heap_as_they_were(kind, where, tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = GPT(TINY).eval() if kind == "float" else _quantized(tmp_path)
    idx = torch.tensor([[5, 17, 3, 42]])
    before = _picture(model)
    door = sys.modules["lumen.fast.decoding"]
    if where == "opening":  # (the last change of the door fails: the ones before it were made)
        monkeypatch.setattr(door, "one_query_attention", lambda *a: (_ for _ in ()).throw(RuntimeError("boom")))
    with heap.reuse_freed_buffers():  # (a threshold this process set: the door's is another)
        threshold = heap._mmap_threshold
        with torch.inference_mode(), pytest.raises(RuntimeError, match="boom"):
            with fast.decoding(model) as decoder:
                assert not _same(_picture(model), before)  # (the door did change the model)
                assert heap._mmap_threshold in (None, 1 << 20)  # (None: not glibc)
                decoder.generate(idx, 3, temperature=0)
                raise RuntimeError("boom")
        assert heap._mmap_threshold == threshold
    assert _same(_picture(model), before)
    monkeypatch.undo()
    with torch.inference_mode(), fast.decoding(model) as decoder:  # and the door opens again
        assert torch.equal(decoder.generate(idx, 3, temperature=0), model.generate(idx, 3, temperature=0))
