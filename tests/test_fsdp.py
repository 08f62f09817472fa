"""parallel = "fsdp" under torchrun, with real processes on CPU (gloo): two sharded processes take the steps of one
unsharded process; every rank writes its shards of each checkpoint; a sharded checkpoint resumes bit for bit at
the same number of processes and to rounding at another (2 -> 1, 1 -> 2); a run killed with SIGKILL resumes to
the same bits as the run left alone; a rank that dies takes the others down in one line; a sharded run loads
wherever a run loads (`lumen generate`, `lumen convert`)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lumen import GPT, ModelConfig
from lumen.data import prepare
from lumen.formats import checkpoint as ckpt
from lumen.formats import load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

SETS = ["progress=false", "sample_tokens=0", "threads=1", "dtype=float32"]
SHORT = ["steps=8", "eval_interval=4", "grad_accum=2", "keep_last=4"]


def lumen_train(out: Path, *sets: str, nproc: int = 1, resume: bool = False) -> list[str]:
    args = ["train", "--preset", "tiny", *(f"--set={s}" for s in [*SETS, f"out_dir={out}", *sets])]
    args += ["--resume"] if resume else []
    if nproc == 1:
        return [sys.executable, "-m", "lumen", *args]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "lumen", *args]


def env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1"}


def check(cmd: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def step_dir(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


def weights(out: Path, step: int) -> dict[str, torch.Tensor]:
    """A checkpoint's whole weights: model.safetensors as stored, or the sharded checkpoint's consolidated view."""
    path = step_dir(out, step)
    return ckpt.read_sharded_state(path) if ckpt.is_sharded(path) else load_file(str(path / ckpt.WEIGHTS))


def losses(out: Path) -> list[tuple[int, float]]:
    recs = map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
    return [(r["step"], r["loss"]) for r in recs if "loss" in r]


def assert_close(a: dict, b: dict, atol: float = 1e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=atol, msg=k)


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def resumed_from(run: Path, step: int, into: Path) -> Path:
    """A copy of a run directory as it was at `step`: later checkpoints and the best pointer removed."""
    shutil.copytree(run, into)
    for later in ckpt.checkpoints(into):
        if ckpt.step_key(later) > step:
            shutil.rmtree(later)
    (into / "best.json").unlink(missing_ok=True)
    return into


def workers(agent: int) -> dict[int, int]:
    """{rank: pid} of the processes a torchrun agent started (read from /proc: their parent and RANK)."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid != agent:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        rank = next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)
        if rank is not None:
            found[rank] = int(stat.parent.name)
    return found


@pytest.fixture(scope="module", autouse=True)
def cached_corpus():
    prepare("shakespeare", "char")  # tokenized once here, so the subprocesses only read the cache


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same 8 steps four ways: one plain process; two sharded ones; one process with parallel = fsdp (sharded
    checkpoints, unsharded model); two DDP processes."""
    root = tmp_path_factory.mktemp("runs")
    out = {"one": root / "one", "fsdp2": root / "fsdp2", "fsdp1": root / "fsdp1"}
    check(lumen_train(out["one"], *SHORT))
    check(lumen_train(out["fsdp2"], *SHORT, "parallel=fsdp", nproc=2))
    check(lumen_train(out["fsdp1"], *SHORT, "parallel=fsdp"))
    return out


def test_two_sharded_processes_take_the_steps_of_one(runs):
    one, two = losses(runs["one"]), losses(runs["fsdp2"])
    assert [s for s, _ in one] == [s for s, _ in two] == list(range(1, 9))
    assert max(abs(a - b) for (_, a), (_, b) in zip(one, two)) < 1e-5
    assert_close(weights(runs["fsdp2"], 8), weights(runs["one"], 8))
    assert json.loads((runs["fsdp2"] / "summary.json").read_text())["parallel"] == "fsdp"


def test_every_rank_writes_its_shards_and_the_manifest_lists_them(runs, tmp_path):
    path = step_dir(runs["fsdp2"], 8)
    assert not (path / ckpt.WEIGHTS).exists() and ckpt.is_sharded(path)
    shards = sorted(p.name for p in (path / ckpt.SHARDS).iterdir())
    assert shards == [".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file from each of the two ranks
    listed = json.loads((path / ckpt.MANIFEST).read_text())["files"]
    assert {f"{ckpt.SHARDS}/{s}" for s in shards} <= set(listed)
    ckpt.verify(path)
    copy = shutil.copytree(path, tmp_path / path.name)
    shard = copy / ckpt.SHARDS / "__1_0.distcp"
    shard.write_bytes(b"\0" * shard.stat().st_size)
    with pytest.raises(ckpt.CheckpointError, match="__1_0.distcp is damaged"):
        ckpt.verify(copy)  # rank 1's shard, hashed by rank 1, checked like any file


def test_a_sharded_checkpoint_resumes_bit_for_bit_at_the_same_number_of_processes(runs, tmp_path):
    again = resumed_from(runs["fsdp2"], 4, tmp_path / "again")
    check(lumen_train(again, *SHORT, "parallel=fsdp", nproc=2, resume=True))
    assert_same_bits(weights(again, 8), weights(runs["fsdp2"], 8))
    assert losses(again) == losses(runs["fsdp2"])


def test_a_sharded_checkpoint_resumes_at_another_number_of_processes(runs, tmp_path):
    # 2 -> 1: the shards of two ranks read by one process; 1 -> 2: one process's checkpoint split over two
    down = resumed_from(runs["fsdp2"], 4, tmp_path / "down")
    check(lumen_train(down, *SHORT, "parallel=fsdp", resume=True))
    up = resumed_from(runs["fsdp1"], 4, tmp_path / "up")
    check(lumen_train(up, *SHORT, "parallel=fsdp", nproc=2, resume=True))
    # (AdamW's moments travel with the weights: a fresh optimizer's first step moves every weight by ~lr)
    for resumed in (down, up):
        assert_close(weights(resumed, 8), weights(runs["one"], 8))
        assert max(abs(a - b) for (_, a), (_, b) in zip(losses(resumed), losses(runs["one"]))) < 1e-5


def test_sigkill_at_a_random_moment_then_resume_is_bit_exact(tmp_path):
    """Every process of a 2-process sharded run killed at once (a machine losing power), anywhere in the run: a
    step, an evaluation, a save of the shards; resumed, it ends with the bits of the run left alone."""
    sets = ["steps=40", "eval_interval=5", "batch_size=8", "grad_accum=2", "model.dropout=0.1", "keep_last=1",
            "parallel=fsdp"]
    alone = tmp_path / "alone"
    check(lumen_train(alone, *sets, nproc=2))
    alone_time = json.loads((alone / "summary.json").read_text())["wall_time"]

    killed = tmp_path / "killed"
    share = random.Random().uniform(0.0, 0.8)
    for _ in range(4):  # should the run outpace the kill (a quieter machine), aim earlier
        shutil.rmtree(killed, ignore_errors=True)
        agent = subprocess.Popen(lumen_train(killed, *sets, nproc=2), env=env(), stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        while not (killed / "metrics.jsonl").exists() and agent.poll() is None:  # training has begun
            time.sleep(0.01)
        time.sleep(share * alone_time)
        pids = [*workers(agent.pid).values(), agent.pid]
        if agent.poll() is None and len(pids) == 3:
            for pid in pids:  # the workers are in sessions of their own: each is killed by its pid
                os.kill(pid, signal.SIGKILL)
            agent.wait()
            break
        agent.wait()
        share /= 3
    assert agent.returncode == -signal.SIGKILL, "the run always finished before the kill"
    assert not (killed / "summary.json").exists()
    time.sleep(0.2)  # the killed workers' sockets closed

    check(lumen_train(killed, *sets, nproc=2, resume=True))
    assert_same_bits(weights(killed, 40), weights(alone, 40))
    assert losses(killed) == losses(alone)


@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_a_rank_that_dies_takes_the_others_down_in_one_line(tmp_path, parallel):
    out = tmp_path / "run"
    agent = subprocess.Popen(lumen_train(out, "steps=100000", "eval_interval=20", "grad_accum=2",
                                         f"parallel={parallel}", nproc=2),
                             env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while not ckpt.checkpoints(out) and agent.poll() is None:  # a checkpoint to resume from exists
            time.sleep(0.05)
        ranks = workers(agent.pid)
        assert agent.poll() is None and sorted(ranks) == [0, 1], ranks
        os.kill(ranks[1], signal.SIGKILL)
        _, stderr = agent.communicate(timeout=60)  # not a hang: gloo's peer is gone, torchrun stops the rest
    finally:
        agent.kill()
    assert agent.returncode != 0
    said = [line for line in stderr.splitlines() if line.startswith("lumen train: error:")]
    assert len(said) == 1, stderr[-3000:]
    # rank 0 heard it first from gloo (its peer's socket closed) or from torchrun (SIGTERM to the survivors)
    assert "another process of this run ended" in said[0] and re.search(r"\brank 0\b", said[0]), said
    assert str(ckpt.latest_checkpoint(out)) in said[0] and "--resume" in said[0]
    assert "lumen/train" not in stderr  # no traceback through lumen's code
    assert ranks[0] not in workers(agent.pid) and not Path(f"/proc/{ranks[0]}/cmdline").exists()


def test_bf16_sharded_steps_are_ddp_steps_to_rounding(tmp_path):
    """bf16: FSDP gathers the blocks' weights in bf16 and reduces gradients in float32 (its mixed-precision
    policy, which gloo runs on a CPU), DDP keeps float32 weights under autocast; the same run, to bf16 rounding
    of the norm gains."""
    sets = [*SHORT, "steps=12", "dtype=bfloat16"]
    check(lumen_train(tmp_path / "ddp", *sets, nproc=2))
    check(lumen_train(tmp_path / "fsdp", *sets, "parallel=fsdp", nproc=2))
    ddp, fsdp = losses(tmp_path / "ddp"), losses(tmp_path / "fsdp")
    gap = max(abs(a - b) for (_, a), (_, b) in zip(ddp, fsdp))
    assert 0 < gap < 2e-3  # measured: 1e-4 over 12 steps; bf16 everywhere (inputs cast too) differs by more


def test_a_sharded_run_loads_wherever_a_run_loads(runs, tmp_path):
    run = runs["fsdp2"]
    path = ckpt.resolve(run)
    read = ckpt.read_sharded_state(path)
    model = GPT.from_state(ModelConfig.load(path / ckpt.CONFIG), read)
    # one copy: the model holds the very tensors the shards were read into
    assert all(p.data_ptr() == read[name].data_ptr() for name, p in model.named_parameters())
    loaded = load(str(run))
    tok = loaded.tokenizer
    assert_same_bits({k: v for k, v in loaded.model.state_dict().items() if k != "lm_head.weight"}, read)
    greedy = tok.decode(model.generate(torch.tensor([tok.encode("ROMEO:")]), 12, temperature=0)[0].tolist())
    done = check([sys.executable, "-m", "lumen", "generate", str(run), "--prompt", "ROMEO:", "--max-new-tokens", "12",
                  "--greedy"])
    assert done.stdout.strip("\n") == greedy.removeprefix("ROMEO:")
    check([sys.executable, "-m", "lumen", "convert", str(run), "--to", "hf", str(tmp_path / "hf")])
    again = load(str(tmp_path / "hf")).model
    x = torch.tensor([tok.encode("ROMEO:\nBut soft")])
    assert torch.equal(again(x)[0], loaded.model(x)[0])


def test_a_whole_weights_checkpoint_does_not_resume_sharded(runs, tmp_path):
    run = resumed_from(runs["one"], 4, tmp_path / "run")
    done = subprocess.run(lumen_train(run, *SHORT, "parallel=fsdp", nproc=2, resume=True), env=env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    said = [line for line in done.stderr.splitlines() if line.startswith("lumen train: error:")]
    assert len(said) == 1 and 'resume it with parallel = "ddp"' in said[0], done.stderr[-3000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here: the check would run")
def test_the_gpu_check_skips_in_one_line_without_cuda():
    done = subprocess.run(["bash", "bench/gpu_check.sh"], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.count("\n") == 1, done.stdout + done.stderr
    assert done.stdout.startswith("gpu_check: skipped: no CUDA device here") and not done.stderr


def test_the_gpu_check_rehearses_on_the_cpu():
    """Its code, run on the CPU with small shapes (all but the compiled GPT-2 step, the slowest): what it will
    run on a GPU is not left to rot between the times one is lent."""
    from helpers.families import SHAPES

    done = subprocess.run(["bash", "bench/gpu_check.sh", "--device", "cpu", "--only",
                           "parity,fsdp,decode,inspect,quantized"], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=900)
    lines = [x for x in done.stdout.splitlines() if x.startswith(("PASS", "FAIL"))]
    parity = 1 + len({name.split("-")[0] for name in SHAPES})   # GPT-2 and one shape of every other family
    assert done.returncode == 0 and len(lines) == parity + 2 + 3 and all(x.startswith("PASS") for x in lines), \
        done.stdout + done.stderr[-3000:]
