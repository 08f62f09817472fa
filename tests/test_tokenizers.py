"""Tokenizers: exact round trips, and the trained BPE against Hugging Face's own readers of its file."""

from __future__ import annotations

import pytest

from lumen.tokenizers import EOS, ByteTokenizer, CharTokenizer, HFTokenizer, Tokenizer, train_bpe

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 20


def test_char_round_trip_and_vocabulary():
    tok = CharTokenizer.from_text(TEXT)
    assert tok.vocab_size == len(set(TEXT))
    assert tok.decode(tok.encode(TEXT)) == TEXT
    assert tok.encode("be") == [sorted(set(TEXT)).index("b"), sorted(set(TEXT)).index("e")]
    with pytest.raises(ValueError, match="not in this character vocabulary"):
        tok.encode("Z")


def test_byte_tokenizer_is_utf8():
    tok = ByteTokenizer()
    s = "naïve café, 東京"
    assert tok.encode(s) == list(s.encode("utf-8"))
    assert tok.decode(tok.encode(s)) == s


@pytest.mark.parametrize("make", [lambda: CharTokenizer.from_text(TEXT), ByteTokenizer,
                                  lambda: train_bpe([TEXT], vocab_size=300)])
def test_save_load_round_trip(tmp_path, make):
    tok = make()
    tok.save(tmp_path)
    back = Tokenizer.load(tmp_path)
    assert type(back) is type(tok) and back.vocab_size == tok.vocab_size
    assert back.encode(TEXT) == tok.encode(TEXT)
    assert back.eos_id == tok.eos_id


def test_bpe_vocabulary_merges_and_round_trip():
    from lumen.data import read_corpus

    hamlet = next(d.text for d in read_corpus("shakespeare") if d.name == "hamlet")
    tok = train_bpe([hamlet], vocab_size=1000)
    assert tok.vocab_size == 1000  # 256 bytes + end-of-text + 743 merges
    assert tok.eos_id is not None and tok.decode([tok.eos_id]) == EOS
    # the most frequent words become single tokens, so the text shrinks well below its byte count
    assert len(tok.encode(hamlet)) < len(hamlet.encode()) / 2.2
    assert len(tok.encode(" the")) == 1 and len(tok.encode(" lord")) == 1
    # byte-level: any text survives, even characters never seen in training
    odd = "Ωμέγα 🙂 naïve\ttabs"
    assert tok.decode(tok.encode(odd)) == odd


def test_bpe_file_is_read_identically_by_transformers(tmp_path):
    """transformers' fast tokenizer, given only the saved file, encodes exactly as lumen does."""
    from transformers import PreTrainedTokenizerFast

    tok = train_bpe([TEXT], vocab_size=300)
    path = tok.save(tmp_path)
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path))
    sample = "Whether 'tis nobler, to be or not to be?"
    assert hf.encode(sample, add_special_tokens=False) == tok.encode(sample)
    assert hf.decode(tok.encode(sample)) == sample


def test_bpe_rejects_too_small_vocabulary():
    with pytest.raises(ValueError, match="vocab_size >= 257"):
        train_bpe([TEXT], vocab_size=100)


def test_hf_tokenizer_wraps_any_tokenizers_object():
    from tokenizers import Tokenizer as HF
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    hf = HF(WordLevel({"to": 0, "be": 1, "[UNK]": 2}, unk_token="[UNK]"))
    hf.pre_tokenizer = Whitespace()
    tok = HFTokenizer(hf)
    assert tok.encode("to be to") == [0, 1, 0] and tok.vocab_size == 3 and tok.eos_id is None


def test_load_errors_name_the_problem(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        Tokenizer.load(tmp_path)
    (tmp_path / "tokenizer.json").write_text('{"lumen_tokenizer": "klingon"}')
    with pytest.raises(ValueError, match="unknown tokenizer kind 'klingon'"):
        Tokenizer.load(tmp_path)


def test_single_token_has_one_home_and_its_old_one_warns():
    """lumen.tokenizers.single_token (and tok.single_token); lumen.inspect.attribution's name still works for one
    release, with a DeprecationWarning that names the new home."""
    import lumen.inspect.attribution as attribution
    from lumen.tokenizers import single_token

    tok = CharTokenizer.from_text("hello world")
    assert single_token(tok, "h", "x") == tok.single_token("h") == tok.encode("h")[0]
    with pytest.warns(DeprecationWarning, match="import it from lumen.tokenizers"):
        old = attribution.single_token
    assert old is single_token
    with pytest.raises(AttributeError):
        attribution.no_such_name  # noqa: B018
