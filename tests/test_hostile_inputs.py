"""Each check issue 25 added, called directly (test_fuzz_cli.py drives the same classes through the real
`lumen` command): the one JSON/TOML reader, output paths, the dtype allow-list, one unembedding, a sharded
index against its shards, GGUF layouts, chat templates, tokenizers against the vocabulary, the non-finite
diagnosis, mistyped model paths, training settings, and the bounds of `lumen generate` and `lumen count`."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from helpers.damaged import templates, tiny_gpt2, tiny_llama
from lumen.cli import main
from lumen.config import ModelConfig
from lumen.errors import ConfigError, MissingFileError, ModelFileError, UserError
from lumen.files import check_writable, read_json, read_toml
from lumen.formats import load, unknown_spec
from lumen.formats.checkpoint import save_checkpoint
from lumen.formats.gguf import GGUFError, read_gguf
from lumen.formats.hf import check_shard_index, save_hf_dir
from lumen.formats.weights import check_dtypes, check_one_unembedding
from lumen.inspect.finite import diagnose, non_finite_error
from lumen.model import GPT
from lumen.tokenizers import ByteTokenizer, CharTokenizer, ChatTemplate, train_bpe


def lumen(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code
    return rc, out.getvalue(), err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else ""


# --- one reader of JSON and TOML -------------------------------------------------------------------
@pytest.mark.parametrize("text, where, says", [
    ('{"d_model": }', "line 1, column 13", "a value was expected here"),
    ('{"a": 1,\n "b" 2}', "line 2, column 6", "a ':' was expected after the key"),
    ("{a: 1}", "line 1, column 2", "a key in double quotes was expected here"),
    ('{"a": "b', "line 1, column 7", "a string starts here and never ends"),
    ('{"a": 1}\n{', "line 2, column 1", "more text after the JSON value ended"),
    ("", "", "the file is empty"),
])
def test_json_errors_name_the_file_and_the_place_in_plain_words(tmp_path, text, where, says):
    (tmp_path / "c.json").write_text(text)
    with pytest.raises(ModelFileError) as e:
        read_json(tmp_path / "c.json", "model config")
    msg = str(e.value)
    assert msg.startswith(f"{tmp_path / 'c.json'}{', ' + where if where else ''}: not valid JSON ({says})"), msg
    assert "Expecting" not in msg and "char" not in msg


def test_json_reader_other_failures(tmp_path):
    p = tmp_path / "c.json"
    p.write_bytes(b'{"a": "caf\xe9"}')
    with pytest.raises(ConfigError, match=r"c.json, line 1, column 11: byte 0xe9 is not UTF-8 text"):
        read_json(p, "model config", ConfigError)
    p.write_text("[1, 2]")
    with pytest.raises(ModelFileError, match="holds a list, not the JSON object of a tokenizer file"):
        read_json(p, "tokenizer")
    p.write_text("[" * 100_000)
    with pytest.raises(ModelFileError, match="nested too deeply"):
        read_json(p, "tokenizer")
    with pytest.raises(MissingFileError, match="no tokenizer file at"):
        read_json(tmp_path / "none.json", "tokenizer")
    with pytest.raises(ModelFileError, match="is a folder, not a tokenizer file"):
        read_json(tmp_path, "tokenizer")
    p.write_bytes(b'\xef\xbb\xbf{"a": 1}')  # a byte-order mark, as some editors write
    assert read_json(p, "x") == {"a": 1}


@pytest.mark.parametrize("text, where, says", [
    ("steps = \n", "line 1, column 9", "a value was expected here"),
    ("steps = 2\nsteps = 3\n", "line 2, column 10", "a key given a value twice"),
    ("a = [1,\n", "at its end", "a value was expected here"),
])
def test_toml_errors_name_the_file_and_the_place(tmp_path, text, where, says):
    (tmp_path / "c.toml").write_text(text)
    with pytest.raises(ConfigError) as e:
        read_toml(tmp_path / "c.toml", "training config")
    assert str(e.value).startswith(f"{tmp_path / 'c.toml'}, {where}: not valid TOML ({says})"), str(e.value)


def test_count_names_the_place_in_a_bad_config_json(tmp_path):
    (tmp_path / "bad.json").write_text('{"d_model": }')
    rc, _, err = lumen("count", tmp_path / "bad.json")
    assert rc == 2 and "bad.json, line 1, column 13: not valid JSON (a value was expected here)" in err, err


# --- output paths ------------------------------------------------------------------------------------
def test_output_paths_are_checked_before_anything_is_written(tmp_path):
    (tmp_path / "afile").write_text("x")
    for path, says in ((tmp_path / "afile" / "sub", "afile is a file, not a folder"),
                       ("/proc/lumen-test/x", "cannot write into /proc"), ("", "is empty")):
        with pytest.raises(UserError, match=says):
            check_writable(path, "--out")
    with pytest.raises(UserError, match="is a folder: give the path of a file"):
        check_writable(tmp_path, "--out", folder=False)
    assert check_writable(tmp_path / "new" / "deeper", "--out") == tmp_path / "new" / "deeper"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing created, no probe left behind


def test_convert_refuses_an_output_under_a_file_or_in_proc_before_loading(tmp_path):
    model, tok = tiny_gpt2()
    save_checkpoint(tmp_path / "ck", model, tok)
    (tmp_path / "afile").write_text("x")
    for out in (tmp_path / "afile" / "sub", "/proc/lumen-test"):
        rc, _, err = lumen("convert", tmp_path / "ck", out, "--to", "hf")
        assert rc == 2 and "OUTDIR" in err and str(out) in err, err
    assert (tmp_path / "afile").read_text() == "x"


# --- dtypes and one unembedding ----------------------------------------------------------------------
def test_float8_weights_are_widened_exactly_and_other_dtypes_refused():
    w = torch.randn(4, 4).to(torch.float8_e4m3fn)
    out = check_dtypes({"w": w, "h": torch.ones(2, dtype=torch.float16)}, "x")
    assert out["w"].dtype == torch.float32 and torch.equal(out["w"].to(torch.float8_e4m3fn).view(torch.uint8),
                                                           w.view(torch.uint8))  # every float8 value survives
    assert out["h"].dtype == torch.float16
    for bad in (torch.ones(2, dtype=torch.int32), torch.ones(2, dtype=torch.complex64), torch.ones(2) > 0):
        with pytest.raises(ModelFileError, match="x: tensor w has dtype"):
            check_dtypes({"w": bad}, "x")
    assert check_dtypes({"w": torch.ones(2, dtype=torch.int32)}, "x", strict=False)["w"].dtype == torch.int32


def test_a_float8_checkpoint_loads_as_its_float32_values(tmp_path):
    model, tok = tiny_gpt2()
    path = save_checkpoint(tmp_path / "ck", model, tok) / "model.safetensors"
    state = {k: v.to(torch.float8_e5m2) for k, v in load_file(path).items()}
    save_file(state, path)
    loaded = load(tmp_path / "ck").model
    torch.testing.assert_close(loaded.tok_emb.weight, state["tok_emb.weight"].float(), rtol=0, atol=0)


def test_a_tied_model_holds_one_unembedding(tmp_path):
    model, tok = tiny_gpt2()
    path = save_checkpoint(tmp_path / "ck", model, tok) / "model.safetensors"
    state = load_file(path)
    save_file(state | {"lm_head.weight": state["tok_emb.weight"].clone()}, path)  # an equal copy: harmless
    load(tmp_path / "ck")
    save_file(state | {"lm_head.weight": state["tok_emb.weight"].flip(0).contiguous()}, path)
    with pytest.raises(ModelFileError, match="model.safetensors: the config ties the unembedding .* differs"):
        load(tmp_path / "ck")
    untied = model.cfg.replace(tie_embeddings=False)
    check_one_unembedding(untied, {"tok_emb.weight": torch.ones(2), "lm_head.weight": torch.zeros(2)}, "x")


def test_a_tied_hf_directory_with_a_different_lm_head(tmp_path):
    model = tiny_llama(tie=True)
    path = save_hf_dir(model, tmp_path / "hf")
    state = load_file(path / "model.safetensors")
    save_file(state | {"lm_head.weight": torch.zeros_like(state["model.embed_tokens.weight"])},
              path / "model.safetensors")
    with pytest.raises(ModelFileError, match="hf: the weights .*separate lm_head.weight"):
        load(path)


# --- a sharded index against its shards --------------------------------------------------------------
def sharded(tmp_path):
    model = tiny_llama(tie=False)
    path = save_hf_dir(model, tmp_path / "hf")
    state = load_file(path / "model.safetensors")
    (path / "model.safetensors").unlink()
    names = sorted(state)
    a, b = names[: len(names) // 2], names[len(names) // 2:]
    save_file({k: state[k] for k in a}, path / "a.safetensors")
    save_file({k: state[k] for k in b}, path / "b.safetensors")
    weight_map = {k: "a.safetensors" for k in a} | {k: "b.safetensors" for k in b}
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return model, path, state, a, b, weight_map


def test_each_tensor_is_in_the_one_shard_the_index_names(tmp_path):
    model, path, state, a, b, weight_map = sharded(tmp_path)
    index = path / "model.safetensors.index.json"
    check_shard_index(index, weight_map)
    torch.testing.assert_close(load(path).model.lm_head.weight, model.lm_head.weight)
    # the second shard redefines a tensor of the first (the shard read last would have won)
    save_file({k: state[k] for k in b} | {a[0]: torch.zeros_like(state[a[0]])}, path / "b.safetensors")
    with pytest.raises(ModelFileError, match=f"tensor {a[0]} is in both a.safetensors and b.safetensors"):
        load(path)
    save_file({k: state[k] for k in b}, path / "b.safetensors")
    with pytest.raises(ModelFileError, match=f"puts tensor {a[0]} in b.safetensors, but it is in a.safetensors"):
        check_shard_index(index, weight_map | {a[0]: "b.safetensors"})
    with pytest.raises(ModelFileError, match="does not name"):
        check_shard_index(index, {k: v for k, v in weight_map.items() if k != b[0]})
    (path / "b.safetensors").write_bytes(b"\x08" + bytes(7) + b"garbage!")
    with pytest.raises(ModelFileError, match="b.safetensors is not a readable safetensors file"):
        load(path)


# --- GGUF: a changed type id ---------------------------------------------------------------------------
@pytest.mark.parametrize("name, kind", [("blk.0.attn_q.weight", 1), ("blk.0.attn_q.weight", 8),
                                        ("output_norm.weight", 1), ("blk.0.attn_norm.weight", 30)])
def test_gguf_tensor_whose_type_changed_while_the_offsets_stayed(tmp_path, name, kind):
    T = templates()
    data = bytearray(T.gguf)
    at, width = next((at, w) for what, at, w in T.gguf_layout if what == f"{name}.type")
    data[at:at + width] = kind.to_bytes(width, "little")
    (tmp_path / "m.gguf").write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="m.gguf (is not a readable GGUF file: tensor .* but the tensors before it "
                                        "end|has [0-9,]+ bytes after its last tensor|.* do not fit its type)"):
        read_gguf(tmp_path / "m.gguf")


# --- chat templates ------------------------------------------------------------------------------------
@pytest.mark.parametrize("source, error, says", [
    ("{% for m in messages %}{{ m['content'] }", ModelFileError, "not valid Jinja \\(line 1: unexpected '}'\\)"),
    ("{{ raise_exception('roles must alternate') }}", UserError, "refuses this prompt: roles must alternate"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", ModelFileError,
     "more than 1,000,000 steps"),
    ("{{ 'x' * 10**10 }}", ModelFileError, "longer than 1,000,000"),
    ("{{ 2 ** 100000 }}", ModelFileError, "a power above"),
    ("{{ 'x'|center(999999999) }}", ModelFileError, "a width or count above"),
    ("{{ '{:999999999}'.format(1) }}", ModelFileError, "a format wider"),
    ("{{ messages.__class__.__mro__ }}", ModelFileError, "SecurityError"),
    ("{{ nothing() }}", ModelFileError, "'nothing' is undefined"),
])
def test_hostile_chat_templates_end_in_one_line(source, error, says):
    with pytest.raises(error, match=says):
        ChatTemplate(source).render("hi")


def test_a_chat_template_renders_what_jinja_renders():
    from jinja2 import Environment

    source = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
              "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    reference = Environment(trim_blocks=True, lstrip_blocks=True).from_string(source).render(
        messages=[{"role": "user", "content": "2+2?"}], add_generation_prompt=True)
    assert ChatTemplate(source).render("2+2?") == reference


def test_generate_chat_with_a_template_that_is_not_jinja(tmp_path):
    from gguf import GGUFValueType as V

    from helpers.damaged import write_gguf

    write_gguf(tmp_path / "m.gguf", templates().llama, meta={"tokenizer.chat_template": ("{% if %}", V.STRING)})
    rc, _, err = lumen("generate", tmp_path / "m.gguf", "--prompt", "the", "--chat")
    assert rc == 2 and "m.gguf" in err and "not valid Jinja" in err, err


# --- tokenizers against the vocabulary ----------------------------------------------------------------
def test_every_tokenizer_kind_against_the_vocabulary():
    chars = CharTokenizer.from_text("abc")
    chars.check_fits(3, "t")
    for tok, size in ((chars, 4), (chars, 2), (ByteTokenizer(), 300), (ByteTokenizer(), 100)):
        with pytest.raises(ModelFileError, match="t: "):
            tok.check_fits(size, "t")
    bpe = train_bpe(["to be or not to be"] * 10, vocab_size=300)
    bpe.check_fits(bpe.vocab_size + 64, "t")  # a padded embedding table: the extra ids decode to nothing
    assert bpe.decode([bpe.vocab_size + 10]) == ""
    with pytest.raises(UserError, match="must lie in \\[0, 3\\)"):
        chars.decode([0, 7])
    with pytest.raises(UserError, match="must not be negative"):
        chars.decode([-1])
    with pytest.raises(UserError, match="byte token ids must lie in"):
        ByteTokenizer().decode([300])


def test_a_checkpoint_whose_char_tokenizer_is_short_of_the_vocabulary(tmp_path):
    model, tok = tiny_gpt2()
    save_checkpoint(tmp_path / "ck", model, CharTokenizer(tok.chars[:-6]))
    with pytest.raises(ModelFileError, match="tokenizer.json: the model's vocabulary holds 30 ids but this char "
                                             "tokenizer has text for 24"):
        load(tmp_path / "ck")


# --- numerically poisoned weights ----------------------------------------------------------------------
def first_non_finite_by_hand(model: GPT, idx: torch.Tensor) -> str | None:
    """The reference: the pre-LN forward pass written out, block by block (the chapter's equations), each named
    value checked as it is computed."""
    import torch.nn as nn

    def bad(t: torch.Tensor) -> bool:
        return not bool(torch.isfinite(t).all())

    x = model.embed(idx)
    if bad(x):
        return "embed"
    for i, block in enumerate(model.blocks):
        w_o, block.attn.out = block.attn.out, nn.Identity()  # the heads' outputs, before W_O mixes them
        try:
            heads = block.attn(block.ln1(x))
        finally:
            block.attn.out = w_o
        if bad(heads):
            return f"blocks.{i}.attn_heads"
        if bad(a := w_o(heads)):
            return f"blocks.{i}.attn_out"
        x = x + a
        if bad(x):
            return f"blocks.{i}.resid_mid"
        h = block.mlp.act(block.mlp.fc(block.ln2(x)))
        if bad(h):
            return f"blocks.{i}.mlp_hidden"
        if bad(m := block.mlp.proj(h)):
            return f"blocks.{i}.mlp_out"
        x = x + m
        if bad(x):
            return f"blocks.{i}.resid_post"
    if bad(f := model.ln_f(x)):
        return "final"
    return "logits" if bad(model.lm_head(f)) else None


@pytest.mark.parametrize("poison", ["blocks.1.mlp.fc.weight", "blocks.0.attn.v.weight", "tok_emb.weight",
                                    "lm_head.weight"])
def test_the_diagnosis_names_the_first_site_that_went_non_finite(poison):
    model, _ = tiny_gpt2()
    cfg = model.cfg.replace(tie_embeddings=False)
    model = GPT.from_state(cfg, model.state_dict() | {"lm_head.weight": model.lm_head.weight.clone()})
    with torch.no_grad():
        model.get_parameter(poison).fill_(3e38)
    idx = torch.tensor([[1, 5, 9, 2]])
    with torch.no_grad():
        expected = first_non_finite_by_hand(model, idx)
    found = diagnose(model, idx)
    assert expected is not None and found is not None and found.site == expected, (found, expected)
    assert found.largest_weight == pytest.approx(3e38, rel=1e-6)
    assert diagnose(tiny_gpt2()[0], idx) is None
    msg = str(non_finite_error(model, idx, "m.safetensors"))
    assert msg.startswith("m.safetensors: the logits are not finite") and expected in msg and "\n" not in msg


def test_generate_and_eval_say_where_the_weights_went_non_finite(tmp_path):
    model, tok = tiny_gpt2()
    path = save_checkpoint(tmp_path / "ck", model, tok) / "model.safetensors"
    state = load_file(path)
    save_file(state | {"blocks.0.mlp.fc.weight": torch.full_like(state["blocks.0.mlp.fc.weight"], 1e38)}, path)
    (tmp_path / "t.txt").write_text("the cat sat on the mat.\n" * 20)
    for argv in (["generate", tmp_path / "ck", "--prompt", "the"], ["generate", tmp_path / "ck", "--prompt", "the",
                                                                     "--greedy"],
                 ["eval", tmp_path / "ck", "--text", tmp_path / "t.txt"]):
        rc, _, err = lumen(*argv)
        assert rc == 2 and "blocks.0.mlp_hidden" in err and "blocks.0.mlp.fc.weight holds values up to 1e+38" in err, \
            err


# --- mistyped model paths ------------------------------------------------------------------------------
def test_a_mistyped_run_directory_names_the_closest_one(tmp_path, monkeypatch):
    (tmp_path / "runs" / "shakespeare").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    e = unknown_spec("runs/shakespear")
    assert isinstance(e, MissingFileError)
    assert str(e) == "no model at runs/shakespear: runs has no 'shakespear' (did you mean runs/shakespeare?)"
    assert "did you mean runs/shakespeare/checkpoints?" in str(unknown_spec("runs/shakespare/checkpoints"))
    assert "did you mean smollm2?" in str(unknown_spec("smollm3"))
    rc, _, err = lumen("generate", "runs/shakespear", "--prompt", "x")
    assert rc == 2 and "did you mean runs/shakespeare?" in err, err
    rc, _, err = lumen("count", "gpt3")
    assert rc == 2 and "did you mean gpt2?" in err, err


# --- training settings -----------------------------------------------------------------------------------
@pytest.mark.parametrize("setting, says", [
    ("device='mps'", "no Apple GPU"), ("threads=1048576", "threads must be between 0"),
    ("sample_tokens=1099511627776", "more than a sample holds"),
])
def test_training_settings_checked_when_read(setting, says):
    from lumen.train import load_config

    if "mps" in setting and torch.backends.mps.is_available():
        pytest.skip("this machine has an Apple GPU")
    with pytest.raises(ConfigError, match=says):
        load_config(preset="tiny", sets=[setting])


def test_a_run_that_cannot_fit_in_memory_is_refused_before_it_is_built():
    from lumen.train.config import TrainConfig, check_memory, device_memory

    cfg = TrainConfig(batch_size=2**40)
    model_cfg = ModelConfig.from_name("baby-gpt")
    have = device_memory(torch.device("cpu"))
    logits = 4 * 2**40 * model_cfg.context * 2 * model_cfg.vocab_size  # the logits alone, and their gradient
    assert logits > have > 0
    with pytest.raises(ConfigError, match=f"needs at least .* GiB .* has {have / 2**30:,.1f} GiB"):
        check_memory(cfg, model_cfg, torch.device("cpu"))
    check_memory(TrainConfig(batch_size=4), model_cfg, torch.device("cpu"))  # the preset's own run fits


def test_a_run_directory_whose_log_is_a_folder_is_refused_before_it_starts(tmp_path):
    from lumen.train.rundir import RunDir

    (tmp_path / "run" / "metrics.jsonl").mkdir(parents=True)
    with pytest.raises(ConfigError, match="metrics.jsonl is a folder where the run writes"):
        RunDir(tmp_path / "run").check(resume=False)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="afile is a file, not a folder"):
        RunDir(tmp_path / "afile" / "run").check(resume=False)


# --- bounds of generate and count ------------------------------------------------------------------------
def test_generate_and_count_bound_what_they_are_asked(tmp_path):
    from lumen.cli.generate import MAX_NEW_TOKENS

    model, tok = tiny_gpt2()
    save_checkpoint(tmp_path / "ck", model, tok)
    rc, _, err = lumen("generate", tmp_path / "ck", "--prompt", "the", "--max-new-tokens", "99999999999")
    assert rc == 2 and f"between 1 and {MAX_NEW_TOKENS:,}" in err, err
    rc, _, err = lumen("count", "gpt2", "--context", "10000000000")
    assert rc == 2 and "exceeds gpt2's context of 1,024" in err, err
    rc, out, _ = lumen("count", "gpt2", "--context", "512", "--json")
    assert rc == 0 and json.loads(out)["flops_per_token"]["context"] == 512


def test_streamed_text_is_the_decoded_tokens_however_they_split():
    """print_tokens keeps a short tail of tokens, not all of them: what it prints must still equal decoding
    every token at once (bytes of one character split across tokens; a BPE's spaces)."""
    from lumen.cli.generate import print_tokens

    text = "naïve café — 東京 🙂 and so on. " * 40
    for tok in (ByteTokenizer(), train_bpe([text] * 5, vocab_size=300)):
        ids = tok.encode(text)
        out = io.StringIO()
        assert print_tokens((torch.tensor([i]) for i in ids), tok, out).tokens == len(ids)
        assert out.getvalue() == tok.decode(ids) + "\n"


def test_learning_rates_and_thresholds_are_finite():
    model, tok = tiny_gpt2()
    from lumen.inspect.tuned_lens import train_tuned_lens

    for lr in (-1.0, math.nan, math.inf, 0.0):
        with pytest.raises(UserError, match="lr must be a finite number above 0"):
            train_tuned_lens(model, iter([torch.zeros(1, 4, dtype=torch.long)]), 1, lr)
    for argv in (["tuned-lens", "train", "x", "--lr", "nan"], ["tuned-lens", "train", "x", "--lr", "-1"],
                 ["heads", "x", "--threshold", "inf"], ["lens", "x", "--prompt", "a", "--out", ""]):
        rc, _, err = lumen(*argv)
        assert rc == 2 and err.startswith("lumen ") and ": error: argument" in err, err

