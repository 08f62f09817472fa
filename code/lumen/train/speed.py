"""Model FLOPs utilisation: the FLOPs a training step must do, over what the machine's matmuls can do.

MFU = tokens/s x training FLOPs per token / measured matmul peak. The FLOPs come from the chapter's
accounting (2 per weight per token forward, x3 with the backward pass, plus the attention core); the
peak is measured here, with the dtype the run computes in, rather than read off a data sheet.
"""

from __future__ import annotations

import functools
import time

import torch

from ..accounting import forward_flops_per_token
from ..config import ModelConfig


def training_flops_per_token(cfg: ModelConfig, context: int | None = None) -> float:
    """Forward + backward FLOPs per token: 3x the forward pass's (Kaplan's 6N, with the attention core)."""
    return 3 * forward_flops_per_token(cfg, context)["total"]


def matmul_peak(device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32, n: int = 1024,
                seconds: float = 0.3) -> float:
    """FLOP/s of square n x n matrix products on this device in this dtype: the best of a few timings
    (measured once per process for each device, dtype and thread count)."""
    return _peak(torch.device(device), dtype, n, seconds, torch.get_num_threads())


@functools.cache
def _peak(device: torch.device, dtype: torch.dtype, n: int, seconds: float, threads: int) -> float:
    gen = torch.Generator().manual_seed(0)  # its own: measuring must not move the training RNG
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    reps = 4 if device.type == "cpu" else 50
    best, deadline = 0.0, time.perf_counter() + seconds
    a @ b  # warm-up: first call pays for allocation and kernel selection
    while True:
        _sync(device)
        t = time.perf_counter()
        for _ in range(reps):
            a @ b
        _sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t))
        if time.perf_counter() > deadline:
            return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Throughput:
    """Tokens per second and MFU of the training steps: over the whole session, and over the window since the
    last log line. Time spent outside steps (evaluation, saving) counts in neither."""

    def __init__(self, tokens_per_step: int, flops_per_token: float, peak: float):
        self.tokens_per_step, self.flops, self.peak = tokens_per_step, flops_per_token, peak
        self.seconds = self.tokens = 0.0
        self.window_seconds = self.window_tokens = 0.0

    def add(self, seconds: float) -> None:
        """One step took this long."""
        self.seconds += seconds
        self.tokens += self.tokens_per_step
        self.window_seconds += seconds
        self.window_tokens += self.tokens_per_step

    def window(self) -> dict:
        """{"tokens_per_s", "mfu"} since the last call."""
        tps = self.window_tokens / max(self.window_seconds, 1e-9)
        self.window_seconds = self.window_tokens = 0.0
        return {"tokens_per_s": round(tps, 1), "mfu": round(tps * self.flops / self.peak, 4)}

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / max(self.seconds, 1e-9)

    @property
    def mfu(self) -> float:
        return self.tokens_per_s * self.flops / self.peak
