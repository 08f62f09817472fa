"""Resuming and more than one process, with real subprocesses: a run killed with SIGKILL at a random moment
and resumed ends with the same weights, bit for bit, as the run left alone; two torchrun processes take the
same steps as one process accumulating the same global batch; a distributed run resumes exactly."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lumen.data import prepare

pytestmark = pytest.mark.slow

SETS = ["progress=false", "sample_tokens=0", "threads=1", "dtype=float32"]


def lumen_train(out: Path, *sets: str, resume: bool = False, nproc: int = 1) -> list[str]:
    args = ["train", "--preset", "tiny", *(f"--set={s}" for s in [*SETS, f"out_dir={out}", *sets])]
    if resume:
        args.append("--resume")
    if nproc == 1:
        return [sys.executable, "-m", "lumen", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "lumen", *args]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1"}


def check(cmd: list[str]) -> None:
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def final_weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))


def losses(out: Path) -> list[tuple[int, float]]:
    recs = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["loss"]) for r in recs if "loss" in r]


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.fixture(scope="module", autouse=True)
def cached_corpus():
    prepare("shakespeare", "char")  # tokenized once here, so the subprocesses only read the cache


def test_sigkill_at_a_random_moment_then_resume_is_bit_exact(tmp_path):
    sets = ["steps=60", "eval_interval=6", "batch_size=8", "model.dropout=0.1", "keep_last=1"]
    check(lumen_train(tmp_path / "alone", *sets))
    alone_time = json.loads((tmp_path / "alone" / "summary.json").read_text())["wall_time"]  # the loop itself

    killed = tmp_path / "killed"
    share = random.Random().uniform(0.0, 0.8)  # anywhere in the run: a step, an evaluation, a save
    for _ in range(4):  # should the run outpace the kill (a quieter machine), aim earlier
        shutil.rmtree(killed, ignore_errors=True)
        proc = subprocess.Popen(lumen_train(killed, *sets), env=env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        while not (killed / "metrics.jsonl").exists() and proc.poll() is None:  # training has begun
            time.sleep(0.01)
        time.sleep(share * alone_time)
        if proc.poll() is None:  # still running: kill it where it stands
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            break
        share /= 3
    assert proc.returncode == -signal.SIGKILL, "the run always finished before the kill"
    assert not (killed / "summary.json").exists()

    check(lumen_train(killed, *sets, resume=True))
    assert_same_bits(final_weights(killed, 60), final_weights(tmp_path / "alone", 60))
    assert losses(killed) == losses(tmp_path / "alone")  # the metrics log has no gap and no duplicate


def test_two_processes_match_one_with_accumulation_and_resume(tmp_path):
    sets = ["steps=8", "eval_interval=4", "grad_accum=2", "keep_last=4"]
    check(lumen_train(tmp_path / "one", *sets))
    check(lumen_train(tmp_path / "two", *sets, nproc=2))
    one, two = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert [s for s, _ in one] == [s for s, _ in two] == list(range(1, 9))
    assert max(abs(a - b) for (_, a), (_, b) in zip(one, two)) < 1e-5
    for k, v in final_weights(tmp_path / "one", 8).items():
        torch.testing.assert_close(final_weights(tmp_path / "two", 8)[k], v, rtol=0, atol=1e-5)

    # resume the distributed run from its step-4 checkpoint: the same end, bit for bit
    again = tmp_path / "again"
    shutil.copytree(tmp_path / "two", again)
    shutil.rmtree(again / "checkpoints" / "step-000008")
    (again / "best.json").unlink()
    check(lumen_train(again, *sets, resume=True, nproc=2))
    assert_same_bits(final_weights(again, 8), final_weights(tmp_path / "two", 8))
    assert losses(again) == two
