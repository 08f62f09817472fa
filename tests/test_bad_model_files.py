"""One test per kind of damaged model file the fuzz suite (test_fuzz_files.py) found escaping as a raw
exception, hanging, or loading while wrong: each now ends in one LumenError naming the file."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
import torch
from gguf import GGUFValueType as V
from gguf import GGUFWriter
from safetensors.torch import load_file, save_file

from helpers.damaged import gguf_layout, gguf_meta, templates, tiny_gpt2, tiny_llama, write_gguf
from helpers.gguf import MERGES, TOKENS, gguf_tensors
from lumen.cli import main
from lumen.config import ModelConfig
from lumen.errors import ConfigError, LumenError, ModelFileError
from lumen.formats import load
from lumen.formats.checkpoint import save_checkpoint
from lumen.formats.gguf import GGUFError, check_layout, read_gguf
from lumen.formats.hf import save_hf_dir
from lumen.inspect.tuned_lens import TunedLens
from lumen.model import GPT
from lumen.tokenizers import Tokenizer

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


def test_gguf_string_that_is_not_utf8_is_named_in_lumens_words(tmp_path):
    """A byte of a token's text damaged into one that cannot start UTF-8: the field and the file are named,
    in lumen's words (not the codec's)."""
    data = bytearray(templates().gguf)
    at = data.index(b"<|im_start|>")
    data[at] = 0xC2  # a lead byte, then "|", which cannot continue it
    path = tmp_path / "m.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match=r"m.gguf.*'tokenizer.ggml.tokens' holds bytes that are not UTF-8 text") as e:
        read_gguf(path)
    assert "codec" not in str(e.value) and "\n" not in str(e.value)


# --- GGUF files that loaded silently wrong or escaped as a traceback, through the command (issue 38) ----------
def generate(path, capsys) -> tuple[int, list[str]]:
    """`lumen generate PATH` for one token, in this process as the `lumen` script runs it: (exit code, stderr lines)."""
    rc = main(["generate", str(path), "--prompt", "the", "--max-new-tokens", "1", "--greedy"])
    return rc, capsys.readouterr().err.strip().splitlines()


def test_gguf_bpe_without_merges_is_refused_by_the_command(tmp_path, capsys):
    """A byte-level BPE ('gpt2') tokenizer with no tokenizer.ggml.merges cannot tokenize as its model was trained
    (every word falls apart into bytes): llama.cpp refuses such a file ("cannot find tokenizer merges"), and so
    must lumen, in one line naming the key and the file; with its merges the same file loads."""
    assert generate(gguf_with(tmp_path), capsys)[0] == 0
    rc, err = generate(gguf_with(tmp_path, **{"tokenizer.ggml.merges": None}), capsys)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("lumen generate: error: m.gguf: ") and "tokenizer.ggml.merges" in err[0], err


def sparse_gguf(path, n_layers: int, d_ff: int) -> None:
    """A valid Llama GGUF of n_layers blocks whose MLPs are d_ff wide, its tensors all zeros and left as a hole
    in the file (a sparse file: its size on disk is its header's)."""
    cfg = tiny_llama().cfg.replace(n_layers=n_layers, d_ff=d_ff)
    w = GGUFWriter(str(path), "llama")
    for key, (value, kind) in gguf_meta(cfg).items():
        w.add_key_value(key, value, kind)
    shapes = {name: tuple(t.shape) for name, t in gguf_tensors(GPT(cfg.replace(d_ff=1))).items()}
    for name, shape in shapes.items():
        if name.startswith("blk.") and ".ffn_" in name and "norm" not in name:
            shape = (d_ff, shape[1]) if shape[0] == 1 else (shape[0], d_ff)
        w.add_tensor_info(name, shape, np.dtype(np.float32), 4 * math.prod(shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    pad = GGUFWriter.ggml_pad
    data = sum(pad(ti.nbytes, w.data_alignment) for ti in w.tensors[0].values())
    size = pad(path.stat().st_size, w.data_alignment) + data
    with open(path, "r+b") as f:
        f.truncate(size)


def test_gguf_larger_than_the_memory_cap_is_refused_by_the_command(tmp_path, capsys):
    """A valid GGUF of 768 MiB loaded by `lumen generate` in a forked child whose address space may grow by
    256 MiB (ulimit -v): one line naming the file and the memory, exit 2 (it was an mmap traceback)."""
    import resource

    path = tmp_path / "big.gguf"
    sparse_gguf(path, n_layers=8, d_ff=2**18)
    check_layout(path)  # (the file is a valid GGUF: only its size is at fault)
    assert path.stat().st_size > 3 * 2**28  # (three times the cap)
    assert generate(templates().root / "base.gguf", capsys)[0] == 0  # (the command's imports, before the cap)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: capped, runs the command, reports
        try:
            with open("/proc/self/statm") as f:
                now = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (now + 2**28, resource.RLIM_INFINITY))
            result = json.dumps(generate(path, capsys))
        except BaseException as e:  # noqa: BLE001 - reported, not raised: the child must answer
            result = json.dumps([-1, [f"{type(e).__name__}: {e}"]])
        os.write(write, result.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        raw = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and raw, f"the child died ({status})"
    rc, err = json.loads(raw)
    assert rc == 2 and len(err) == 1, "\n".join(err)
    assert err[0].startswith("lumen generate: error: big.gguf") and "memory" in err[0], err
