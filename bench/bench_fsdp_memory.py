"""Per-process memory of a training step under DDP and FSDP at 1, 2 and 4 processes, on CPU with gloo; writes
its table into docs/scale-out.md.

    .venv/bin/python bench/bench_fsdp_memory.py [--layers 8 --d-model 512] [--steps 3] [--processes 1 2 4]

Each setting is one `torchrun --standalone --nproc_per_node=N` of this script, whose workers build lumen's own
trainer (lumen.train.loop.Trainer: the model, the optimizer, DDP or fully_shard, exactly as `lumen train` does),
take a warm-up step, then --steps steps, and report per process:
  - the tensors that stay between steps, counted exactly: the weights, the gradients (as the optimizer sees them,
    just before it steps) and AdamW's two moments, each as this process holds them (a sharded tensor's local
    rows only). FSDP's goal: their sum falls as 1/N.
  - the peak of the tensors alive during one step above those (activations, a unit's gathered weights, DDP's
    gradient buckets, temporaries), from the profiler's record of every allocation.
  - the process's peak resident memory during the steps (VmHWM, reset before them), and that peak minus the
    resident memory the process had before the trainer was built (Python, torch and lumen imported).
The resident figures include the allocator's cached pages and the libraries, so they are noisy; the tensor
figures are exact. One process wraps nothing under either setting (a single row). Not a test.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOC = REPO / "docs" / "scale-out.md"
MiB = 2**20


def worker(args: argparse.Namespace) -> None:
    """One rank of a torchrun of this script: measure, write this rank's JSON record, leave."""
    import torch

    from lumen.train import load_config
    from lumen.train.distributed import barrier, leave
    from lumen.train.loop import Trainer
    from lumen.train.machine import run_settings
    from rss import reset_peak, status_kib  # bench/rss.py (the script's own folder is on sys.path)

    baseline = status_kib("VmRSS") * 1024  # Python, torch and lumen imported; no data, no model yet

    cfg, model_cfg = load_config(sets=[
        "corpus='shakespeare'", "tokenizer='char'", "save=false", "progress=false", "sample_tokens=0", "threads=1",
        "dtype='float32'", f"parallel='{args.parallel}'", "batch_size=1", "grad_accum=4",
        f"model.n_layers={args.layers}", f"model.d_model={args.d_model}", f"model.n_heads={args.d_model // 64}",
        "model.context=128"])
    with run_settings(cfg):
        trainer = Trainer(cfg, model_cfg, None)
        seen = {}

        def local(t: torch.Tensor) -> int:
            t = t.to_local() if hasattr(t, "to_local") else t  # a DTensor: the rows this process holds
            return t.numel() * t.element_size()

        def grads(opt, *_):  # just before the optimizer steps: the gradients it is given
            seen["gradients"] = sum(local(p.grad) for g in opt.param_groups for p in g["params"] if p.grad is not None)

        trainer.opt.register_step_pre_hook(grads)
        trainer.train_step()  # warm-up: AdamW's moments, gloo's buffers, DDP's buckets
        barrier(trainer.dist)
        reset_peak()
        peak_above = step_peak(trainer.train_step)
        for _ in range(args.steps - 1):
            trainer.train_step()
        record = {
            "parallel": args.parallel, "rank": trainer.dist.rank, "world": trainer.dist.world,
            "weights": sum(local(p) for p in trainer.raw.parameters()), "gradients": seen["gradients"],
            "moments": sum(local(v) for s in trainer.opt.state.values() for k, v in s.items()
                           if k in ("exp_avg", "exp_avg_sq")),
            "step_peak_above": peak_above, "peak_rss": status_kib("VmHWM") * 1024, "baseline_rss": baseline,
            "parameters": sum(p.numel() for p in trainer.raw.parameters()),
        }
        Path(args.out, f"rank{trainer.dist.rank}.json").write_text(json.dumps(record))
        barrier(trainer.dist)
    leave(0)  # a torchrun worker skips interpreter shutdown (lumen.train.distributed.leave)


def step_peak(step) -> int:
    """Peak bytes of the tensors a step allocates, above those alive before it: the profiler's record of every
    allocation and free, summed in time order. (Its memory timeline, which bench_train.py reads, sorts
    tensors into kinds by following data flow, and fails on the collectives' in-place buffers.)"""
    import torch
    from torch._C._profiler import _EventType

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()

    def walk(nodes):
        for n in nodes:
            yield n
            yield from walk(n.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()
    live = peak = 0
    for _, size in sorted((e.start_time_ns, e.extra_fields.alloc_size) for e in walk(tree)
                          if e.tag == _EventType.Allocation):
        live += size
        peak = max(peak, live)
    return peak


# glibc's malloc keeps the pages of freed blocks for reuse (its threshold for giving a large block a mapping of
# its own, returned when freed, grows as large blocks are freed), so a process's resident size stays near the
# high-water mark of what it once held. With a fixed threshold every tensor above 64 KiB is its own mapping,
# returned when freed, and the resident size follows the live tensors.
RETURN_FREED = {"MALLOC_MMAP_THRESHOLD_": "65536"}


def run_setting(parallel: str, n: int, args: argparse.Namespace, extra_env: dict | None = None) -> list[dict]:
    """torchrun N workers of this script; their records."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", __file__,
               "--worker", "--parallel", parallel, "--out", out, "--layers", str(args.layers),
               "--d-model", str(args.d_model), "--steps", str(args.steps)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "LUMEN_OFFLINE": "1", **(extra_env or {})}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
        if done.returncode:
            sys.exit(f"bench_fsdp_memory: {parallel} x {n} failed:\n{done.stderr[-3000:]}")
        return [json.loads(p.read_text()) for p in sorted(Path(out).glob("rank*.json"))]


def table(rows: list[tuple[str, int, list[dict], list[dict]]]) -> str:
    head = ("| parallel | processes | weights | gradients | AdamW moments | kept between steps | vs 1 process "
            "| step's peak above that | peak RSS | peak RSS above start | same, freed memory returned |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    one = None
    lines = []
    for parallel, n, recs, returned in rows:
        most = {k: max(r[k] for r in recs) for k in ("weights", "gradients", "moments", "step_peak_above",
                                                      "peak_rss")}
        kept = max(r["weights"] + r["gradients"] + r["moments"] for r in recs)
        above = max(r["peak_rss"] - r["baseline_rss"] for r in recs)
        above_returned = max(r["peak_rss"] - r["baseline_rss"] for r in returned)
        one = one or kept
        lines.append(f"| {parallel} | {n} | {most['weights'] / MiB:.1f} | {most['gradients'] / MiB:.1f} | "
                     f"{most['moments'] / MiB:.1f} | {kept / MiB:.1f} | {kept / one:.2f} | "
                     f"{most['step_peak_above'] / MiB:.1f} | {most['peak_rss'] / MiB:.0f} | {above / MiB:.0f} | "
                     f"{above_returned / MiB:.0f} |")
    return head + "\n".join(lines) + "\n"


def page(rows: list[tuple[str, int, list[dict], list[dict]]], args: argparse.Namespace,
         load: tuple[float, float]) -> str:
    params = rows[0][2][0]["parameters"]
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    import torch

    from lumen.runtime import cpu

    machine = cpu.machine(threads=False, memory=True)
    return f"""# Training past one process: DDP and FSDP

*Generated by `bench/bench_fsdp_memory.py` (`make bench`); do not edit by hand.*

`lumen train` under torchrun runs DistributedDataParallel by default: every process holds the whole model, its
gradients and AdamW's two moments (16 bytes per parameter in float32), and the processes average their
gradients. `parallel = "fsdp"` shards them instead (PyTorch's FSDP2, `fully_shard` of each block, the embedding
and the unembedding): each process keeps 1/N of every weight, gradient and moment, gathers a block's whole
weights just while the block computes, and writes its own shards of each checkpoint
(`torch.distributed.checkpoint`). Same config, same steps:

```bash
torchrun --nproc_per_node=2 -m lumen train --preset shakespeare --set parallel=fsdp --set grad_accum=2 \\
         --set out_dir=runs/shakespeare-fsdp
```

Per-process memory of a training step of a GPT of {args.layers} layers, {args.d_model} wide ({params / 1e6:.1f}M
parameters, float32, context 128, 4 windows per step over all processes), on CPU with gloo, in MiB. The first
five columns are counted exactly from the tensors each process holds (a shard's local rows only): the weights,
the gradients the optimizer is given, AdamW's moments, their sum and its ratio to one process's. "Step's peak
above that" is the profiler's peak of the other tensors alive during one step (activations, a unit's gathered
weights, DDP's gradient buckets, temporaries). The last three are the process's resident memory: its peak during
the steps, and that peak minus what the process held before the trainer was built (Python, torch and lumen
imported; not yet the data, the model or gloo), with glibc's default allocator and then with freed memory
returned to the system (`MALLOC_MMAP_THRESHOLD_=65536`). By default glibc keeps the pages of freed tensors
for reuse, and an FSDP process frees much: the whole model it built before sharding it, each unit's gathered
weights after every use; its resident size then stays near their high-water mark. Resident sizes are noisy;
the tensor columns are exact. The largest of the processes is shown.

{table(rows)}
Measured {when} on {machine}, torch {torch.__version__}, load average {load[0]:.2f} before and {load[1]:.2f}
after (the machine may be shared; the tensor columns do not depend on it). With one process neither setting
wraps the model, so one row serves both.
"""


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--parallel", default="ddp", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--doc", type=Path, default=DOC, help="where the page is written (default docs/scale-out.md)")
    args = p.parse_args()
    if args.worker:
        return worker(args)
    before = os.getloadavg()[0]
    rows = []
    for n in args.processes:
        for parallel in ("ddp", "fsdp") if n > 1 else ("ddp",):
            rows.append(("either" if n == 1 else parallel, n, run_setting(parallel, n, args),
                         run_setting(parallel, n, args, RETURN_FREED)))
            print(f"{rows[-1][0]} x {n}: done", file=sys.stderr)
    text = page(rows, args, (before, os.getloadavg()[0]))
    args.doc.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
