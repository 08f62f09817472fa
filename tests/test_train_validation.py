"""A run checks everything it needs before its first step: each bad setting, corpus or cache entry is one
LumenError that names the key or file; a damaged token cache is rebuilt, never used."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from lumen import data as D
from lumen.errors import ConfigError, CorpusError, LumenError
from lumen.train import load_config, train


def tiny(*sets: str):
    return load_config(preset="tiny", sets=["progress=false", "save=false", *sets])


@pytest.mark.parametrize("setting, key", [
    ("min_lr=nan", "min_lr"), ("max_time=nan", "max_time"), ("max_time=inf", "max_time"),
    ("weight_decay=nan", "weight_decay"), ("lr=inf", "lr"), ("lr=-1.0", "lr"), ("lr=0", "lr"),
    ("temperature=-1", "temperature"), ("temperature=nan", "temperature"), ("beta2=1.0", "beta2"),
    ("val_fraction=1.5", "val_fraction"), ("corpus=''", "corpus"), ("corpus=[]", "corpus"),
    ("out_dir=''", "out_dir"), ("seed=-1", "seed"), ("steps=0", "steps"), ("steps=2.5", "steps"),
    ("model.norm_eps=nan", "norm_eps"), ("model=5", "model"), ("model.preset=3", "preset"),
    ("weight_decay=9223372036854775807", "weight_decay"), ("temperature=1e-45", "temperature"),
    ("tokenizer='bpe'", "vocab_size"),  # tiny's default vocab_size is the char run's 2048: fine; below 257 not
])
def test_bad_settings_are_refused_when_read(setting, key):
    sets = [setting, "vocab_size=100"] if key == "vocab_size" else [setting]
    with pytest.raises(ConfigError, match=key):
        tiny(*sets)


def test_a_config_file_that_is_not_utf8_or_toml(tmp_path):
    (tmp_path / "latin1.toml").write_bytes("corpus = \"caf\xe9\"\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml, line 1, column 14: byte 0xe9 is not UTF-8"):
        load_config(tmp_path / "latin1.toml")
    (tmp_path / "bad.toml").write_text("steps = = 3\n")
    with pytest.raises(ConfigError, match=r"bad.toml, line 1, column 9: not valid TOML \(a value was expected here\)"):
        load_config(tmp_path / "bad.toml")


def test_a_bad_device_is_a_config_error():
    with pytest.raises(ConfigError, match="device 'gpu0'"):
        train(*tiny("device='gpu0'"))


def test_a_char_corpus_without_the_prompts_characters_fails_before_training(tmp_path):
    """The default sample prompt is "\\n": a corpus without one cannot encode it; said at start, not after steps."""
    (tmp_path / "one-line.txt").write_text("abcdefghij" * 400)
    cfg, m = tiny(f"corpus='{tmp_path / 'one-line.txt'}'", "steps=1000000")
    with pytest.raises(ConfigError, match=r"sample_prompt '\\n' cannot be encoded .* sample_tokens = 0"):
        train(cfg, m)  # a million steps: only an error at startup ends this test
    cfg, m = tiny("sample_prompt='ROMEO:\u2603'", "steps=1000000")
    with pytest.raises(ConfigError, match="sample_prompt"):
        train(cfg, m)


@pytest.mark.parametrize("content, problem", [
    (b"", "is empty"), (b"\x00\x01\x02 some text", "looks binary"), (b"caf\xe9 au lait", "not UTF-8"),
])
def test_bad_corpus_files_are_named(tmp_path, content, problem):
    f = tmp_path / "corpus.txt"
    f.write_bytes(content)
    with pytest.raises(CorpusError, match=problem) as e:
        D.read_corpus(str(f))
    assert str(f) in str(e.value)


def test_an_empty_corpus_name_never_reads_the_current_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret.txt").write_text("not a corpus\n" * 100)
    with pytest.raises(CorpusError, match="names nothing"):
        D.read_corpus("")


@pytest.mark.parametrize("damage", ["truncate-bin", "flip-bin", "meta-json", "meta-count", "tokenizer"])
def test_a_damaged_token_cache_is_rebuilt_not_used(tmp_path, damage, capsys):
    (tmp_path / "c.txt").write_text("".join(f"line {i} of the corpus\n" for i in range(400)))
    cache = tmp_path / "cache"
    good = D.prepare(str(tmp_path / "c.txt"), "char", cache=cache)
    expected = np.array(good.tokens("train")), np.array(good.tokens("val"))
    folder = good.folder
    del good
    if damage == "truncate-bin":
        (folder / "train.bin").write_bytes((folder / "train.bin").read_bytes()[:100])
    elif damage == "flip-bin":
        b = bytearray((folder / "train.bin").read_bytes())
        b[10] ^= 0x40
        (folder / "train.bin").write_bytes(bytes(b))
    elif damage == "meta-json":
        (folder / "meta.json").write_text((folder / "meta.json").read_text()[:40])
    elif damage == "meta-count":
        meta = json.loads((folder / "meta.json").read_text())
        meta["train"]["tokens"] += 1000
        (folder / "meta.json").write_text(json.dumps(meta))
    else:
        (folder / "tokenizer.json").write_text("{")
    with pytest.raises(CorpusError, match=str(folder)):
        D.TokenData(folder)
    again = D.prepare(str(tmp_path / "c.txt"), "char", cache=cache)
    assert "rebuilding" in capsys.readouterr().err
    assert again.folder == folder
    assert np.array_equal(again.tokens("train"), expected[0]) and np.array_equal(again.tokens("val"), expected[1])


def test_token_windows_ends_on_a_corpus_whose_only_newline_is_near_its_end(tmp_path):
    """It used to jump to the next line start, here near the end, find the rest too short, and draw again
    forever. Run in a subprocess so that a hang fails the test instead of stopping the suite."""
    text = "abcdefghij" * 2000
    (tmp_path / "c.txt").write_text(text[:-10] + "\n" + text[-9:])
    code = textwrap.dedent(f"""
        from lumen.inspect.corpus import token_windows
        from lumen.tokenizers import CharTokenizer
        tok = CharTokenizer.from_text("abcdefghij\\n")
        w = token_windows(tok, {str(tmp_path / 'c.txt')!r}, "val", n=4, seq_len=64)
        print(tuple(w.shape))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "(4, 64)"


def test_token_windows_on_a_too_short_corpus_is_an_error(tmp_path):
    from lumen.inspect.corpus import token_windows
    from lumen.tokenizers import CharTokenizer

    (tmp_path / "c.txt").write_text("short\n" * 30)
    with pytest.raises(LumenError, match="too short"):
        token_windows(CharTokenizer.from_text("short\n"), str(tmp_path / "c.txt"), "val", n=2, seq_len=64)
