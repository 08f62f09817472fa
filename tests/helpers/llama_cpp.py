"""llama.cpp's own converter (`convert_hf_to_gguf.py`), for the slow tier: fetched once from PyPI (the
llama-cpp-python sdist carries it), checked against a pinned sha256, unpacked under the user cache, and run in a
subprocess on a tiny Hugging Face directory. Nothing of it is copied into this repository.

The converter names a BPE pre-tokenizer by hashing how the tokenizer splits a test string, and refuses a
tokenizer it does not know; a tiny test model has no published tokenizer, so the runner below replaces every
model class's `set_vocab` with one that writes the byte-level BPE of helpers.gguf (TOKENS, MERGES). The tensors,
the metadata and every per-architecture quirk (Q/K permutation, Gemma's +1 folded into norms, rope_freqs) are
the converter's own.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
INNER = f"llama_cpp_python-{VERSION}/vendor/llama.cpp"


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "lumen-tools"


def converter_dir() -> Path:
    """The unpacked llama.cpp directory holding convert_hf_to_gguf.py; skips the test when it cannot be had."""
    root = cache_dir()
    unpacked = root / INNER
    if (unpacked / "convert_hf_to_gguf.py").is_file():
        return unpacked
    sdist = root / "dl" / SDIST
    if not sdist.is_file():
        root.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
             f"llama-cpp-python=={VERSION}", "-d", str(root / "dl")], capture_output=True, text=True, timeout=600)
        if done.returncode or not sdist.is_file():
            pytest.skip(f"llama-cpp-python {VERSION}'s sdist could not be downloaded from PyPI")
    digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
    if digest != SHA256:
        pytest.fail(f"{sdist} has sha256 {digest}, not the pinned {SHA256}: delete it and run again")
    with tarfile.open(sdist) as tar:
        wanted = [m for m in tar.getmembers()
                  if m.name == f"{INNER}/convert_hf_to_gguf.py"
                  or m.name.startswith((f"{INNER}/conversion/", f"{INNER}/gguf-py/"))]
        tar.extractall(root, members=wanted, filter="data")
    return unpacked


RUNNER = r"""
import sys
sys.path.insert(0, {tests!r})
sys.path.insert(0, {llama_cpp!r})
sys.argv = ["convert_hf_to_gguf.py", *{args!r}]
import convert_hf_to_gguf as convert
from conversion import base
from helpers.gguf import MERGES, SPECIALS, TOKENS


def set_vocab(self):  # the tiny byte-level BPE instead of a published tokenizer
    w = self.gguf_writer
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(TOKENS + [f"<pad{{i}}>" for i in range(self.hparams["vocab_size"] - len(TOKENS))])
    w.add_token_types([3] * len(SPECIALS) + [1] * (self.hparams["vocab_size"] - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_eos_token_id(2)


found = convert.get_model_class  # (the model modules are imported when their class is asked for)


def get_model_class(*args, **kwargs):
    cls = found(*args, **kwargs)
    cls.set_vocab = set_vocab
    return cls


convert.get_model_class = get_model_class
convert.main()
"""


def save_tokenizer(directory: Path, vocab_size: int) -> None:
    """The tests' byte-level BPE (helpers.gguf), padded to vocab_size tokens, as directory/tokenizer.json: the
    Gemma 3 converter counts its tokens to trim the embedding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from helpers.gguf import MERGES, TOKENS

    vocab = TOKENS + [f"<pad{i}>" for i in range(vocab_size - len(TOKENS))]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(vocab)}, merges=[tuple(m.split(" ")) for m in MERGES]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(str(directory / "tokenizer.json"))


def convert(hf_dir: Path, out: Path, outtype: str = "f32") -> Path:
    """hf_dir (a tiny model saved by transformers, vocab_size >= len(TOKENS)) through llama.cpp's converter."""
    tests = str(Path(__file__).resolve().parent.parent)
    args = [str(hf_dir), "--outfile", str(out), "--outtype", outtype]
    script = RUNNER.format(tests=tests, llama_cpp=str(converter_dir()), args=args)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{done.stderr[-3000:]}")
    return out
