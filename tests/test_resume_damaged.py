"""Nothing lost, with real subprocesses: a run killed with SIGKILL whose newest checkpoint is then damaged resumes
from the newest intact one and ends bit for bit where the undisturbed run ends; Ctrl-C saves the current step and
prints the command that continues it (which then ends where the undisturbed run ends); resuming a finished run
re-reports its summary instead of rewriting it; torchrun into an existing run says so once."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.signals import ctrl_c_restored
from lumen.data import prepare
from lumen.formats import checkpoint as ckpt

pytestmark = pytest.mark.slow

SETS = ["progress=false", "sample_tokens=0", "threads=1", "dtype=float32", "steps=30", "eval_interval=5",
        "batch_size=8", "model.dropout=0.1", "keep_last=10"]


def command(out: Path, *extra: str) -> list[str]:
    sets = [f"--set={s}" for s in [*SETS, f"out_dir={out}"]]
    return [sys.executable, "-m", "lumen", "train", "--preset", "tiny", *sets, *extra]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1"}


def lumen(cmd: list[str], expect: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == expect, done.stderr[-3000:]
    return done


def weights(out: Path, step: int = 30) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))


def same_bits(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def losses(out: Path) -> list[tuple[int, float]]:
    recs = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["loss"]) for r in recs if "loss" in r]


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> Path:
    prepare("shakespeare", "char")  # tokenized once here: the subprocesses only read the cache
    out = tmp_path_factory.mktemp("alone") / "run"
    lumen(command(out))
    return out


@pytest.fixture(scope="module")
def killed(tmp_path_factory, alone) -> Path:
    """The same run killed with SIGKILL once it holds at least three checkpoints and before it ends."""
    out = tmp_path_factory.mktemp("killed") / "run"
    for _ in range(5):
        shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.Popen(command(out), env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while proc.poll() is None and len(ckpt.checkpoints(out)) < 3:
            time.sleep(0.005)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            if ckpt.step_of(ckpt.checkpoints(out)[-1]) < 30:
                return out
    pytest.fail("the run always finished before the kill")


def damage(path: Path, how: str) -> None:
    if how == "truncated-weights":
        f = path / ckpt.WEIGHTS
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    elif how == "damaged-trainer-state":
        f = path / ckpt.TRAINER
        b = bytearray(f.read_bytes())
        b[len(b) // 2: len(b) // 2 + 64] = bytes(64)
        f.write_bytes(bytes(b))
    elif how == "missing-config":
        (path / ckpt.CONFIG).unlink()
    elif how == "cut-manifest":
        f = path / ckpt.MANIFEST
        f.write_text(f.read_text()[:30])


@pytest.mark.parametrize("how", ["truncated-weights", "damaged-trainer-state", "missing-config", "cut-manifest"])
def test_resume_passes_over_a_damaged_newest_checkpoint(tmp_path, alone, killed, how):
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    found = sorted((run / "checkpoints").glob("step-*"))
    newest, older = found[-1], found[-2]
    damage(newest, how)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "lo')  # a line cut short by the kill
    (run / "checkpoints" / "step-abc").mkdir()  # a stray folder

    done = lumen(command(run, "--resume"))
    said = [line for line in done.stderr.splitlines() if "damaged" in line]
    assert len(said) == 1 and newest.name in said[0] and f"resuming from {older.name}" in said[0], done.stderr
    assert same_bits(weights(run), weights(alone))
    assert losses(run) == losses(alone)  # no gap, no duplicate, no cut line
    ckpt.verify(run / "checkpoints" / newest.name)  # the damaged one was written again, whole


def test_no_intact_checkpoint_is_one_line(tmp_path, killed):
    run = tmp_path / "run"
    shutil.copytree(killed, run)
    for p in ckpt.checkpoints(run):
        damage(p, "cut-manifest")
    done = lumen(command(run, "--resume"), expect=2)
    assert "no intact checkpoint" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_ctrl_c_saves_the_step_and_prints_the_resume_command(tmp_path, alone):
    run = tmp_path / "run"

    def training() -> bool:  # the first step is recorded
        f = run / "metrics.jsonl"
        return f.is_file() and bool(f.read_text().strip())

    for _ in range(5):
        shutil.rmtree(run, ignore_errors=True)
        proc = subprocess.Popen(command(run), env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=ctrl_c_restored)
        while proc.poll() is None and not training():
            time.sleep(0.002)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode == 130:
            break
    assert proc.returncode == 130, err
    step = int(err.split("interrupted at step ")[1].split(";")[0])
    assert 0 < step < 30 and (run / "checkpoints" / f"step-{step:06d}").is_dir(), err
    ckpt.verify(run / "checkpoints" / f"step-{step:06d}")
    resume = err.strip().splitlines()[-1].strip()
    assert resume.startswith("lumen train ") and resume.endswith("--resume")
    lumen([sys.executable, "-m", "lumen", *shlex.split(resume)[1:]])  # the printed command, as printed
    assert same_bits(weights(run), weights(alone))
    assert losses(run) == losses(alone)


def test_resuming_a_finished_run_rereports_its_summary(tmp_path, alone):
    run = tmp_path / "run"
    shutil.copytree(alone, run)
    recorded = (run / "summary.json").read_bytes()
    done = lumen(command(run, "--resume", "--set=progress=true"))
    assert (run / "summary.json").read_bytes() == recorded
    summary = json.loads(recorded)
    assert summary["tokens_per_s"] > 0 and summary["final_train_loss"] is not None
    assert "already trained to step 30" in done.stderr and f"{summary['final_val_loss']:.4f}" in done.stderr
    # killed after the last checkpoint, before the summary: the summary is made from the run's records
    (run / "summary.json").unlink()
    lumen(command(run, "--resume"))
    remade = json.loads((run / "summary.json").read_text())
    last = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert remade["final_train_loss"] == [r["loss"] for r in last if "loss" in r][-1]
    assert remade["final_val_loss"] == summary["final_val_loss"] and remade["tokens_per_s"] > 0


def test_torchrun_into_an_existing_run_says_so_once(alone):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *command(alone)[1:],
           "--set=grad_accum=2"]
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("lumen train: error:")]
    assert len(said) == 1 and "already holds checkpoints" in said[0] and "--resume" in said[0], done.stderr
    assert "lumen/train" not in done.stderr  # no traceback through lumen's code
