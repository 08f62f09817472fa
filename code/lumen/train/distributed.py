"""More than one process: torchrun starts them, DistributedDataParallel averages their gradients.

    torchrun --nproc_per_node=2 -m lumen train --preset shakespeare --set grad_accum=2 --set out_dir=runs/ddp

Each process (rank) runs the same loop on its own share of every step's batch; after each backward
pass DDP all-reduces the gradients, so every rank takes the same optimizer step and holds the same
weights. Only rank 0 writes checkpoints, metrics and samples. Gloo carries the all-reduce on CPU,
NCCL on CUDA.

Several machines: run torchrun on each with the same rendezvous, e.g. on 2 nodes of 8 GPUs,

    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --rdzv_backend=c10d \\
             --rdzv_endpoint=HOST0:29500 -m lumen train CONFIG.toml     # node_rank=1 on the other

(torchrun's own launcher: lumen only reads RANK, LOCAL_RANK and WORLD_SIZE from the environment.)
grad_accum counts micro-batches over all processes, so it must be a multiple of their number.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0 writes; the others only compute."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: str) -> Dist:
    """Join the process group torchrun set up (a no-op for a single process)."""
    if not launched_by_torchrun():
        return Dist()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", 0))
    if not dist.is_initialized():
        backend = "nccl" if device.startswith("cuda") else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(local)
        dist.init_process_group(backend)
    return Dist(rank, world, local)


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def leave(code: int = 0) -> NoReturn:
    """End a torchrun worker at once, without Python's interpreter shutdown (everything is written).

    DDP's C++ side keeps the gloo process group alive after destroy_process_group, so gloo's worker
    threads outlive it; one may still be releasing a finished collective's tensors while Python shuts
    down, and taking the GIL then aborts the process ("terminate called without an active exception":
    seen in short 2-process runs under load; a core dump shows the gloo thread in
    THPVariable_dealloc during Py_FinalizeEx)."""
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(code)


def mean(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """x averaged over all ranks (x itself for one process)."""
    if d.active:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
        x /= d.world
    return x


def total(x: torch.Tensor, d: Dist) -> torch.Tensor:
    """x summed over all ranks."""
    if d.active:
        x = x.clone()
        dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def any_rank(d: Dist, *flags: bool) -> tuple[bool, ...]:
    """Each flag, true if it is true on any rank (one all-reduce for all of them)."""
    if not d.active:
        return flags
    return tuple(bool(v) for v in total(torch.tensor([float(f) for f in flags]), d))


def gather_objects(obj: object, d: Dist) -> list:
    """Every rank's obj, in rank order (on every rank)."""
    if not d.active:
        return [obj]
    out: list = [None] * d.world
    dist.all_gather_object(out, obj)
    return out


def barrier(d: Dist) -> None:
    if d.active:
        dist.barrier()
