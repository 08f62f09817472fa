"""Fuzzing the model-file loaders: small valid files that lumen writes itself (a GGUF file, a checkpoint and
a run directory, a Hugging Face directory, tokenizer.json, config.json, a tuned lens), damaged in every way
a disk, a download or a hand edit damages them, and loaded through lumen's public loaders.

The property, for every case: loading raises a LumenError whose one-line message names the file (or its
directory), or it returns something that works: a model whose forward pass gives finite logits (and the
reference logits where the damage must not change the weights), a tokenizer whose ids fit the model.
Cases that are wrong by construction (NaN eps, shapes that disagree with the config, a value of the wrong
type) must be refused. Any other exception type fails the case, and so does a case that runs past
CASE_SECONDS (a hang, or memory allocated for an absurd size).

The cases are a seeded loop (reproducible, no shrinking needed: each case says what it changed), built when
a family's test runs (one test per family lists all of its failures): ~940 by default; `LUMEN_FUZZ_EXAMPLES=N`
draws N random mutations per family on top of the enumerated ones, for the nightly kind of run:
`LUMEN_FUZZ_EXAMPLES=2000 pytest -m fuzz tests/test_fuzz_files.py`; `LUMEN_FUZZ_TALLY=out.jsonl` records every
outcome instead of failing.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from helpers.damaged import EXTRA, FAMILIES, Case, Templates, run_case, templates

pytestmark = pytest.mark.fuzz

TALLY = os.environ.get("LUMEN_FUZZ_TALLY")  # a file: record every outcome there instead of failing
CASE_SECONDS = 20


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and does not fight the other tests' threads for the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class Hung(BaseException):
    """A case ran past CASE_SECONDS (a BaseException: no `except Exception` in lumen swallows it)."""


def _alarm(signum, frame):
    raise Hung(f"a case ran past {CASE_SECONDS} s")


def outcome(case: Case, folder: Path, T: Templates) -> str:
    """'refused' or 'works', else what went wrong: 'wrong: ...', 'escaped: TYPE: ...' or 'hung'."""
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(CASE_SECONDS)
    try:
        return run_case(case, folder, T)
    except Hung:
        return "hung"
    except AssertionError as e:  # Wrong, or an error that does not name the file in one line
        return f"wrong: {e}"
    except Exception as e:  # noqa: BLE001 - what the property forbids
        return f"escaped: {type(e).__name__}: {_first_line(e)}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


@pytest.mark.parametrize("family", FAMILIES)
def test_damaged_files_are_refused_or_work(family, tmp_path):
    """Every case of one family (built now, from the templates); the failures are listed together."""
    T = templates()
    failures = []
    for i, case in enumerate(FAMILIES[family](T, EXTRA)):
        result = outcome(case, tmp_path / str(i), T)
        if TALLY:
            with open(TALLY, "a") as f:
                f.write(json.dumps({"family": family, "case": repr(case), "outcome": result}) + "\n")
        elif result not in ("refused", "works"):
            failures.append(f"{i}-{case!r}: {result}")
    assert not failures, f"{len(failures)} case(s) failed:\n" + "\n".join(failures[:30])
