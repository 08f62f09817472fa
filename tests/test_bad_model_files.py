"""One test per kind of damaged model file the fuzz suite (test_fuzz_files.py) found escaping as a raw
exception, hanging, or loading while wrong: each now ends in one LumenError naming the file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from gguf import GGUFValueType as V
from safetensors.torch import load_file, save_file

from lumen.config import ModelConfig
from lumen.errors import ConfigError, LumenError, ModelFileError
from lumen.formats import load
from lumen.formats.checkpoint import save_checkpoint
from lumen.formats.gguf import GGUFError, read_gguf
from lumen.formats.hf import save_hf_dir
from lumen.inspect.tuned_lens import TunedLens
from lumen.tokenizers import Tokenizer
from test_fuzz_files import MERGES, TOKENS, gguf_layout, templates, tiny_gpt2, tiny_llama, write_gguf

A = "llama."


def gguf_with(tmp_path, **meta) -> str:
    return str(write_gguf(tmp_path / "m.gguf", templates().llama, meta=meta))


def patched(tmp_path, what: str, value: int) -> str:
    """The template GGUF with one header number (named as gguf_layout names it) overwritten."""
    data = bytearray(templates().gguf)
    at, width = next((at, w) for name, at, w in templates().gguf_layout if name == what)
    data[at : at + width] = value.to_bytes(width, "little")
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    return str(tmp_path / "m.gguf")


# --- GGUF: sizes that would hang or allocate -----------------------------------------------------
def test_gguf_absurd_block_count_fails_before_building(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf.*n_layers"):
        read_gguf(gguf_with(tmp_path, **{A + "block_count": (2**32 - 1, V.UINT32)}))


def test_gguf_block_count_disagreeing_with_the_tensors(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf: the metadata says 3 blocks"):
        read_gguf(gguf_with(tmp_path, **{A + "block_count": (3, V.UINT32)}))


def test_gguf_array_of_arrays_is_refused_without_reading_it(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf.*array of arrays"):
        read_gguf(gguf_with(tmp_path, **{"general.tags": ([[1, 2], [3]], V.ARRAY)}))


@pytest.mark.parametrize("what", ["GGUF.kv_count[0]", "GGUF.tensor_count[0]", "tokenizer.ggml.tokens[4]"])
def test_gguf_count_larger_than_the_file(tmp_path, what):
    with pytest.raises(GGUFError, match="m.gguf is not a readable GGUF file: .* more than the rest of the file"):
        read_gguf(patched(tmp_path, what, 2**40))


# --- GGUF: tensors read from the wrong bytes -----------------------------------------------------
@pytest.mark.parametrize("offset", [2**64 - 32, 0])
def test_gguf_tensor_offset_outside_or_overlapping(tmp_path, offset):
    """2^64-32 wrapped around to an early byte; 0 is the first tensor's place (every other tensor's is later)."""
    with pytest.raises(GGUFError, match="m.gguf is not a readable GGUF file: tensor blk.1.ffn_up.weight's data is at "
                                        f"offset {offset:,}, but the tensors before it end at"):
        read_gguf(patched(tmp_path, "blk.1.ffn_up.weight.offset", offset))


def test_gguf_unknown_tensor_type_id(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf .*unknown type id 4000"):
        read_gguf(patched(tmp_path, "blk.0.attn_q.weight.type", 4000))


def test_gguf_tensor_claiming_more_bytes_overlaps_the_next_tensor(tmp_path):
    """32 -> 64 rows doubles the tensor's bytes: they would run into the next tensor's."""
    with pytest.raises(GGUFError, match="m.gguf is not a readable GGUF file: tensor .* but the tensors before it end"):
        read_gguf(patched(tmp_path, "blk.0.attn_q.weight.dim1", 64))


# --- GGUF: metadata that disagrees or has the wrong type --------------------------------------------
def test_gguf_heads_that_do_not_divide_the_width(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf.*divisible by n_heads"):
        read_gguf(gguf_with(tmp_path, **{A + "attention.head_count": (5, V.UINT32)}))


@pytest.mark.parametrize("key", ["attention.layer_norm_rms_epsilon", "rope.freq_base"])
def test_gguf_nan_eps_or_rope_base_is_refused(tmp_path, key):
    with pytest.raises(GGUFError, match="m.gguf.*finite"):
        read_gguf(gguf_with(tmp_path, **{A + key: (math.nan, V.FLOAT32)}))


def test_gguf_size_given_as_a_string(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf: GGUF metadata llama.embedding_length must be a whole number"):
        read_gguf(gguf_with(tmp_path, **{A + "embedding_length": ("32", V.STRING)}))


def test_gguf_malformed_merges(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf: tokenizer.ggml.merges"):
        read_gguf(gguf_with(tmp_path, **{"tokenizer.ggml.merges": (["Ġt", *MERGES], V.ARRAY)}))


def test_gguf_merge_of_unknown_tokens(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf: the tokenizer metadata is damaged"):
        read_gguf(gguf_with(tmp_path, **{"tokenizer.ggml.merges": (["qq zz"], V.ARRAY)}))


def test_gguf_token_list_of_numbers(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf: GGUF metadata tokenizer.ggml.tokens must be .* of strs"):
        read_gguf(gguf_with(tmp_path, **{"tokenizer.ggml.tokens": (list(range(len(TOKENS))), V.ARRAY)}))


def test_gguf_eos_id_out_of_range(tmp_path):
    with pytest.raises(GGUFError, match="m.gguf: tokenizer.ggml.eos_token_id"):
        read_gguf(gguf_with(tmp_path, **{"tokenizer.ggml.eos_token_id": (len(TOKENS), V.UINT32)}))


def test_gguf_tokenizer_larger_than_the_vocabulary(tmp_path):
    with pytest.raises(GGUFError, match=f"m.gguf: .*{len(TOKENS)} token ids but the model's vocabulary holds 100"):
        read_gguf(gguf_with(tmp_path, **{A + "vocab_size": (100, V.UINT32)}))


def test_gguf_layout_names_every_header_number():
    """(The helper the tests above patch with: its offsets point at the numbers the reader reads.)"""
    names = {name for name, _, _ in gguf_layout(templates().root / "base.gguf")}
    assert {"GGUF.tensor_count[0]", "blk.1.ffn_up.weight.offset", "blk.0.attn_q.weight.type"} <= names


# --- config.json ---------------------------------------------------------------------------------
@pytest.mark.parametrize("field, value, says", [
    ("d_model", "16", "must be a whole number"), ("n_layers", 2.0, "must be a whole number"),
    ("n_heads", True, "must be a whole number"), ("vocab_size", None, "must be a whole number"),
    ("context", -1, "must be between 1 and"), ("n_layers", 2**32 - 1, "must be between 1 and"),
    ("norm_eps", math.nan, "must be a finite"), ("rope_theta", math.inf, "must be a finite"),
    ("norm_eps", 0, "must be positive"),
    ("bias", "yes", "must be true or false"), ("mlp", 3, "must be a string"),
])
def test_config_json_with_a_bad_value(tmp_path, field, value, says):
    cfg = templates().gpt2.cfg.to_dict() | {field: value}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match=f"config.json: ModelConfig.{field} {says}"):
        ModelConfig.load(tmp_path / "config.json")


def test_config_in_python_gets_the_same_errors():
    with pytest.raises(ConfigError, match="ModelConfig.d_model must be a whole number, got '16'"):
        ModelConfig(d_model="16")


@pytest.mark.parametrize("content", [b"\xff\xfe{", b'{"d_model": 1', b"[1, 2]"])
def test_config_json_not_utf8_or_not_json(tmp_path, content):
    (tmp_path / "config.json").write_bytes(content)
    with pytest.raises(ConfigError, match="config.json"):
        ModelConfig.load(tmp_path / "config.json")


# --- tokenizer.json --------------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b'{"lumen_tokenizer": "char", "chars": 7}', b'{"model": {"type": "BPE"',
                                     b'{"model": {"type": "BPE", "vocab": 3}}', b'{"lumen_tokenizer": [1]}',
                                     b'{"lumen_tokenizer": "char", "chars": "aab"}'])
def test_damaged_tokenizer_json(tmp_path, content):
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(ModelFileError, match="tokenizer.json"):
        Tokenizer.load(tmp_path)


# --- checkpoints and run directories ---------------------------------------------------------------
def test_checkpoint_tokenizer_larger_than_the_model(tmp_path):
    model, _ = tiny_gpt2()
    save_checkpoint(tmp_path / "ck", model, templates().bpe)
    with pytest.raises(ModelFileError, match="tokenizer.json: the tokenizer has .* token ids"):
        load(tmp_path / "ck")


def test_run_with_damaged_best_json_and_a_stray_folder(tmp_path):
    model, tok = tiny_gpt2()
    save_checkpoint(tmp_path / "run/checkpoints/step-5", model, tok)
    (tmp_path / "run/checkpoints/step-abc").mkdir()
    loaded = load(tmp_path / "run").model  # the stray folder is not a checkpoint
    torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight)
    # a best.json that is damaged or points outside the run is not followed: the run's latest checkpoint loads
    save_checkpoint(tmp_path / "elsewhere", tiny_gpt2(seed=1)[0], tok)
    for damaged in ('{"checkpoint": "../../elsewhere"}', '{"checkpoint": ', "[]", '{"checkpoint": 3}'):
        (tmp_path / "run/best.json").write_text(damaged)
        loaded = load(tmp_path / "run").model
        torch.testing.assert_close(loaded.lm_head.weight, model.lm_head.weight, rtol=0, atol=0)


# --- Hugging Face directories ----------------------------------------------------------------------
def hf_dir(tmp_path):
    model = tiny_llama(tie=False)
    return model, save_hf_dir(model, tmp_path / "hf")


def test_hf_stray_safetensors_does_not_override_the_weights(tmp_path):
    model, path = hf_dir(tmp_path)
    state = load_file(path / "model.safetensors")
    save_file({k: torch.zeros_like(v) for k, v in state.items()}, path / "zz-old-copy.safetensors")
    torch.testing.assert_close(load(path).model.lm_head.weight, model.lm_head.weight)


def test_hf_sharded_weights_come_from_the_index(tmp_path):
    model, path = hf_dir(tmp_path)
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(state)
    shards = {"a.safetensors": names[:5], "b.safetensors": names[5:]}
    for f, keys in shards.items():
        save_file({k: state[k] for k in keys}, path / f)
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    torch.testing.assert_close(load(path).model.lm_head.weight, model.lm_head.weight)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {names[0]: "../a.safetensors"}}))
    with pytest.raises(ModelFileError, match="weight_map must name .safetensors files in"):
        load(path)


def test_hf_config_with_fewer_layers_than_the_weights(tmp_path):
    _, path = hf_dir(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {"num_hidden_layers": 1}))
    with pytest.raises(ModelFileError, match="config.json says 1 layers but the weights hold layers"):
        load(path)


@pytest.mark.parametrize("key, value", [("hidden_size", "32"), ("rms_norm_eps", None), ("num_attention_heads", 0),
                                        ("rope_parameters", "default"), ("model_type", {})])
def test_hf_config_value_of_the_wrong_type(tmp_path, key, value):
    _, path = hf_dir(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps(cfg | {key: value}))
    with pytest.raises(ModelFileError, match=f"config.json: .*{key}"):
        load(path)


# --- tuned lenses ----------------------------------------------------------------------------------
def test_tuned_lens_with_a_misshapen_or_nan_translator(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save

    path = tmp_path / "lens.safetensors"
    with safe_open(str(templates().root / "lens.safetensors"), "pt") as f:
        meta = f.metadata()
    state = load_file(templates().root / "lens.safetensors")
    for bad in (state["0.lin.weight"][:1].clone(), state["0.lin.weight"].clone().fill_(math.nan)):
        path.write_bytes(save(state | {"0.lin.weight": bad}, metadata=meta))
        with pytest.raises(ModelFileError, match="lens.safetensors: tensor 0.lin.weight"):
            TunedLens.load(path, templates().gpt2)


# --- the same errors through the one loader -----------------------------------------------------------
def test_every_spec_form_names_the_damaged_file(tmp_path):
    _, path = hf_dir(tmp_path)
    (path / "model.safetensors").write_bytes(b"\x10\x00")
    (tmp_path / "x.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    for spec, name in ((path, "model.safetensors"), (tmp_path / "x.gguf", "x.gguf")):
        with pytest.raises(LumenError, match=name):
            load(str(spec))


def test_gguf_template_itself_loads(tmp_path):
    """(The files the tests above damage are valid to start with.)"""
    w = read_gguf(templates().root / "base.gguf")
    cfg, state, tok = w.cfg, w.state, w.tokenizer
    assert tok is not None and cfg.n_layers == 2 and tok.vocab_size == len(TOKENS)
    assert np.isfinite(state["tok_emb.weight"].numpy()).all()
