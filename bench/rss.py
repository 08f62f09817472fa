"""This process's resident memory on Linux, for the benchmarks: now, its high-water mark, and a reset."""

from __future__ import annotations

import os


def status_kib(field: str) -> int:
    """A memory field of /proc/self/status in KiB: VmRSS (now) or VmHWM (the high-water mark)."""
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    """Reset VmHWM to the current resident size."""
    with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
        f.write("5")
