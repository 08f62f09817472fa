"""The machine a run trains on: device, bf16, threads, deterministic mode, the C++ compiler torch.compile
needs on a CPU, which attention path a training step takes, and what Ctrl-C does during a run.

    >>> with run_settings(cfg):                  # doctest: +SKIP
    ...     device = resolve_device(cfg.device)
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import torch

from ..errors import ConfigError
from ..model import GPT, plain_attention
from ..runtime import cpu
from ..runtime.compiling import check_cpp_compiler
from ..runtime.heap import reuse_freed_buffers


class RunSettings(Protocol):
    """What `run_settings` reads of a run's settings (a TrainConfig has them: config.py imports this module,
    not the other way round)."""

    device: str
    compile: bool
    threads: int


def resolve_device(name: str) -> torch.device:
    """The torch device a `device` setting names: auto, cpu, cuda, cuda:N, mps."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device {name!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r} asked for, but torch sees no CUDA GPU (use device = \"cpu\")")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"device {name!r}: torch sees {torch.cuda.device_count()} CUDA GPU(s)")
    if device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"device {name!r}: lumen trains on cpu, cuda or mps")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"device {name!r} asked for, but torch sees no Apple GPU (mps) here (use device = \"cpu\")")
    return device


def use_bf16(dtype: str, device: torch.device) -> bool:
    """bf16 autocast: asked for, or "auto" on hardware that computes bf16 natively (AVX512-BF16/AMX, recent GPUs)."""
    if dtype != "auto":
        return dtype == "bfloat16"
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return cpu.native_bf16() and cpu.onednn_bf16() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


@contextlib.contextmanager
def run_settings(cfg: RunSettings) -> Iterator[None]:
    """The process-wide settings a run changes (torch's threads; deterministic mode when compiled on a CPU; on a
    CPU, freed buffers kept for the next step: lumen.runtime.heap), restored however the run ends, a failed start
    included."""
    on_cpu = resolve_device(cfg.device).type == "cpu"
    compiled_on_cpu = cfg.compile and on_cpu
    if compiled_on_cpu:
        check_cpp_compiler("set compile=false")
    threads = torch.get_num_threads()
    try:
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        with deterministic_algorithms(compiled_on_cpu), reuse_freed_buffers() if on_cpu else contextlib.nullcontext():
            yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def deterministic_algorithms(on: bool = True) -> Iterator[None]:
    """PyTorch's deterministic mode (warn-only) for a while. Compiled, the gradient of the embedding is summed
    with atomic adds in whatever order the threads run; in this mode inductor takes ATen's ordered kernel
    there, so a compiled CPU run repeats bit for bit."""
    before = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    if on:
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def training_attention(model: GPT, compiled: bool, bf16: bool) -> contextlib.AbstractContextManager:
    """The attention path of a training step's forward pass: the plain one when compiled, on a CPU, in bf16,
    for contexts where the attention weights are no bigger than the MLP's hidden activations (h T <= d_ff).
    There PyTorch's flash kernel runs bf16 attention far below the matmul peak (without AMX); the plain
    path's two batched products around a fused softmax make the whole step faster, but keep the (B, h, T, T)
    weights for the backward pass, which grow with the square of the context. In fp32 the flash kernel is
    the faster one."""
    cfg = model.cfg
    plain = (compiled and bf16 and model.device.type == "cpu"
             and cfg.n_heads * cfg.context <= cfg.hidden)
    return plain_attention(model) if plain else contextlib.nullcontext()


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a run after its current step, which was saved (`checkpoint`, None with save=false)."""

    def __init__(self, step: int, checkpoint: Path | None):
        super().__init__(f"interrupted at step {step}" + (f"; saved {checkpoint}" if checkpoint else ""))
        self.step, self.checkpoint = step, checkpoint


@contextlib.contextmanager
def ctrl_c() -> Iterator[threading.Event]:
    """While training: the first Ctrl-C (SIGINT) sets the event (the loop saves and stops after its step);
    a second one interrupts at once."""
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event
        return

    def first(signum, frame):
        event.set()
        signal.signal(signal.SIGINT, previous or signal.default_int_handler)
        print("\nlumen train: Ctrl-C: saving this step, then stopping (Ctrl-C again to stop at once)",
              file=sys.stderr)

    previous = signal.signal(signal.SIGINT, first)
    try:
        yield event
    finally:
        signal.signal(signal.SIGINT, previous or signal.default_int_handler)
