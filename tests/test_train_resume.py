"""Resuming and more than one process, with real subprocesses: a run killed with SIGKILL at a random moment
and resumed ends with the same weights, bit for bit, as the run left alone; two torchrun processes take the
same steps as one process accumulating the same global batch; a distributed run resumes exactly; a run is never
overwritten, nor resumed with other settings (issue 39)."""

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
    return {**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1", "PYTHONFAULTHANDLER": "1"}


def check(cmd: list[str]) -> None:
    """Run a training command to its end. One that outlives 300 s (about ten times its time) is stuck: every
    process of its group (torchrun's workers too) shows where it stands (faulthandler, on SIGABRT) and is ended."""
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGABRT)
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        pytest.fail(f"{' '.join(cmd[-6:])} was still running after 300 s; its processes:\n{err[-8000:]}")
    assert proc.returncode == 0, err[-3000:]


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


def test_a_run_is_never_overwritten_or_resumed_with_other_settings(tmp_path):
    """Issue 39: training into a folder that holds a run stopped before its first checkpoint is refused without
    --resume, and --resume with other settings is refused naming them; the run's files are left as they were.
    Settings of the session (threads, progress, eval_interval) may change: a finished run is re-reported."""
    sets = ["steps=4", "eval_interval=2", "batch_size=4"]
    finished, stopped = tmp_path / "finished", tmp_path / "stopped"
    check(lumen_train(finished, *sets))
    shutil.copytree(finished, stopped)  # as a run killed before its first checkpoint leaves its folder
    for name in ("checkpoints", "best.json", "summary.json", "loss.png"):
        shutil.rmtree(stopped / name) if (stopped / name).is_dir() else (stopped / name).unlink()

    def files(run: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}

    def refused(cmd: list[str], run: Path, *named: str) -> None:
        before = files(run)
        done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
        line = done.stderr.strip()
        assert done.returncode == 2 and len(line.splitlines()) == 1 and all(n in line for n in named), done.stderr
        assert files(run) == before  # nothing overwritten

    refused(lumen_train(stopped, "steps=6", "eval_interval=2", "batch_size=4"), stopped, "already holds a run",
            "--resume")
    refused(lumen_train(stopped, "steps=6", "eval_interval=2", "batch_size=4", resume=True), stopped,
            "other settings", "steps = 4 (now: 6)")
    refused(lumen_train(finished, *sets, "lr=0.01", resume=True), finished, "other settings", "lr = 0.003 (now: 0.01)")
    refused(lumen_train(finished, *sets, "model.n_layers=2", resume=True), finished, "another model config",
            "n_layers = 1 (now: 2)")
    # the same run, another session: re-reported, not refused; the stopped one starts again
    done = subprocess.run(lumen_train(finished, "steps=4", "eval_interval=3", "batch_size=4", "threads=2",
                                      "progress=true", resume=True), env=env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "already trained to step 4" in done.stderr, done.stderr
    check(lumen_train(stopped, *sets, resume=True))
    assert (stopped / "checkpoints" / "step-000004").is_dir()


def test_which_settings_define_a_run():
    from lumen.train.rundir import differences

    saved = {"steps": 300, "lr": 0.003, "threads": 1, "eval_interval": 550, "corpus": ["a.txt"]}
    assert differences(saved, {**saved, "threads": 2, "eval_interval": 10}) == []  # a session's
    assert differences(saved, {**saved, "steps": 2200, "corpus": ("b.txt",)}) == [
        "steps = 300 (now: 2200)", "corpus = ['a.txt'] (now: ['b.txt'])"]
    # a run sized by time chose its steps as it started (written with the budget spent): asked for again with the
    # budget, that count is its own; asked for with steps given, they must agree
    chosen = {**saved, "time_budget": 0}
    assert differences(chosen, {**saved, "steps": 2200, "time_budget": 300}) == []
    assert differences(chosen, {**saved, "steps": 2200, "time_budget": 0}) == ["steps = 300 (now: 2200)"]
