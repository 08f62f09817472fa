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


def run_peak(cmd: list[str], env: dict | None = None) -> tuple[str, int]:
    """Run cmd to its end: (its standard output, its peak resident memory in KiB, the VmHWM the kernel kept
    for it). Raises RuntimeError with the end of its standard error if it failed."""
    import subprocess
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if proc.returncode:
            raise RuntimeError(f"{cmd[0]} failed ({proc.returncode}):\n{err.read()[-2000:]}")
        return out.read(), usage.ru_maxrss  # KiB on Linux
