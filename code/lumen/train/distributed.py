"""More than one process: torchrun starts them; DistributedDataParallel averages their gradients, or FSDP
shards the model across them.

    torchrun --nproc_per_node=2 -m lumen train --preset shakespeare --set grad_accum=2 --set out_dir=runs/ddp
    torchrun --nproc_per_node=2 -m lumen train --preset shakespeare --set grad_accum=2 --set parallel=fsdp \
             --set out_dir=runs/fsdp

Each process (rank) runs the same loop on its own share of every step's batch. With parallel = "ddp" every
rank holds the whole model and its optimizer state; after each backward pass DDP all-reduces the gradients,
so every rank takes the same optimizer step and holds the same weights. Only rank 0 writes checkpoints,
metrics and samples. With parallel = "fsdp" (`shard`) each rank holds 1/N of every weight, gradient and
AdamW moment; a block's whole weights exist only while it computes, and every rank writes its own shards
of each checkpoint (lumen.formats.checkpoint). Gloo carries the collectives on CPU, NCCL on CUDA.

Several machines: run torchrun on each with the same rendezvous, e.g. on 2 nodes of 8 GPUs,

    torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0 --rdzv_backend=c10d \\
             --rdzv_endpoint=HOST0:29500 -m lumen train CONFIG.toml     # node_rank=1 on the other

(torchrun's own launcher: lumen only reads RANK, LOCAL_RANK and WORLD_SIZE from the environment.)
grad_accum counts micro-batches over all processes, so it must be a multiple of their number.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from ..errors import TrainingError
from ..formats.checkpoint import failures
from ..model import GPT


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


def shard(model: GPT, d: Dist, device: torch.device, bf16: bool) -> None:
    """FSDP2 (`fully_shard`), in place: each block, the embedding and the unembedding become a unit whose
    parameters are split row-wise over the ranks. Just before a unit computes (forward or backward) its
    whole weights are all-gathered, and freed after; its gradients are reduce-scattered (averaged over the
    ranks, as DDP's all-reduce averages them), so each rank keeps and updates only its rows. A tied
    unembedding is the embedding itself: the pair, the final norm and learned positions form the root unit.

    bf16: the blocks' (and an untied unembedding's) weights are gathered and used in bf16 (half the traffic
    and the gathered memory), their gradients reduced in float32 into float32 shards, the optimizer's
    copy. Inputs are not cast: the residual stream stays as the run's autocast makes it (float32, the
    matrix products in bf16), so the numbers are DDP's but for the norm gains and biases rounded to bf16.
    gloo does this on a CPU as NCCL does on a GPU."""
    mesh = init_device_mesh(device.type, (d.world,))
    bf16_units = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                      cast_forward_inputs=False) if bf16 else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=bf16_units)
    if not model.cfg.tie_embeddings:
        fully_shard(model.tok_emb, mesh=mesh)  # float32: the residual stream starts at the run's precision
        fully_shard(model.lm_head, mesh=mesh, mp_policy=bf16_units)
    fully_shard(model, mesh=mesh)


class PeerLost(TrainingError):
    """Another process of this run stopped (killed, crashed, or stopped by torchrun), so this one stops too.
    `first`: this is the first surviving process to say so (the others stop without a word)."""

    def __init__(self, message: str, first: bool):
        super().__init__(message)
        self.first = first


def lost_peer(e: BaseException) -> bool:
    """Whether an exception from a collective means a peer is gone: a torch.distributed error (NCCL's),
    or gloo's transport failing ("Connection reset by peer", "Connection closed by peer", ...)."""
    while e is not None:
        if isinstance(e, dist.DistError) or (isinstance(e, RuntimeError) and "gloo" in str(e)):
            return True
        if isinstance(e, CheckpointException) and any(lost_peer(f) for f in failures(e)):
            return True  # torch.distributed.checkpoint gathers every rank's failure into one
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return False


def first_to_say(d: Dist) -> bool:
    """Whether this process is the first of the run to report that the run stopped: counted in torchrun's
    rendezvous store, which outlives the workers (True where the store cannot be reached)."""
    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=2))
        return store.add(f"lumen/stopped/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", 1) == 1
    except (KeyError, ValueError, RuntimeError):
        return True


@contextlib.contextmanager
def stop_together(d: Dist, kept: Callable[[], str]) -> Iterator[None]:
    """While a distributed run trains: a peer that is gone (a collective fails) or torchrun stopping this
    process (SIGTERM, sent when another worker ended) ends this process with PeerLost, said in one line by
    the first process to see it; `kept()` tells the user what is kept (the last checkpoint)."""
    if not d.active:
        yield
        return

    def lost(what: str) -> PeerLost:
        return PeerLost(f"{what}; {kept()}", first_to_say(d))

    def terminated(signum, frame):
        raise lost(f"torchrun stopped rank {d.rank} (another process of this run ended, or torchrun itself was "
                   f"stopped: its report below says which)")

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminated) if main_thread else None
    try:
        yield
    except PeerLost:
        raise
    except (Exception, CheckpointException) as e:  # (torch's CheckpointException is a BaseException)
        if lost_peer(e):
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
            reason = reason.split("] ", 1)[-1].split(". ")[0][:120]  # gloo's: after its source file and line
            raise lost(f"another process of this run ended ({reason}), so rank {d.rank} stopped too") from None
        raise
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous or signal.SIG_DFL)


def shutdown() -> None:
    """This process is done with the run's process group. A torchrun worker keeps it until its process ends
    (`leave`): gloo's destructor joins its worker thread while holding the GIL, and that thread may still be
    releasing the last collective's tensors, for which it needs the GIL. Destroyed as `train` returned (the
    DDP model, its last holder, freed), the group deadlocked 2-process runs now and then (1 in 2 runs of a
    test looped on a 2-core VM; gdb: the main thread in ~ProcessGroupGloo's join, gloo's runloop in
    ~AsyncBarrierWork waiting for the GIL). A later `train` in the same worker uses the group kept. A single
    process has no group; any other group is destroyed."""
    if dist.is_initialized() and not launched_by_torchrun():
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
