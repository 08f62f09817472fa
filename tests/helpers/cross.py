"""lumen's kernels' torch-free headers (lumen/fast/quads.h, attend.h) built into a small check program for
each instruction set: this machine's own (x86-64 with AVX2, or with all it has) and ARM64's NEON, with and
without its dot-product instructions, run under emulation (qemu-user). Each test skips naming what is missing.

    >>> command = check_program("quads_check.cpp", "arm64", tmp_path)   # doctest: +SKIP
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from lumen.runtime import cpu

# name: (compiler, flags, emulator)
BUILDS = {
    "x86-64-v3": ("g++", "-march=x86-64-v3", None),
    "native": ("g++", "-march=native", None),
    "arm64": ("aarch64-linux-gnu-g++", "-march=armv8-a -static", "qemu-aarch64"),
    "arm64+dotprod": ("aarch64-linux-gnu-g++", "-march=armv8.2-a+dotprod -static", "qemu-aarch64"),
}
FAST = Path(__file__).resolve().parents[2] / "code" / "lumen" / "fast"


def check_program(source: str, build: str, tmp_path: Path) -> list[str]:
    """tests/helpers/SOURCE built for `build` (BUILDS): the command that runs it (skips where it cannot)."""
    compiler, flags, emulator = BUILDS[build]
    if emulator is None and not (cpu.arch() == "x86_64" and cpu.has("avx2", "fma")):
        pytest.skip("the x86 builds run on an x86-64 CPU with avx2 and fma")
    if build == "native" and cpu.arch() != "x86_64":
        pytest.skip("-march=native here is not x86-64")
    missing = [tool for tool in (compiler, emulator) if tool and shutil.which(tool) is None]
    if missing:
        pytest.skip(f"needs {' and '.join(missing)} (apt-get install -y g++-aarch64-linux-gnu qemu-user)")
    exe, src = tmp_path / Path(source).stem, Path(__file__).with_name(source)
    subprocess.run([compiler, "-std=c++17", "-O2", *flags.split(), "-I", str(FAST), str(src), "-o", str(exe)],
                   check=True, capture_output=True, timeout=300)
    return [emulator, "-cpu", "max", str(exe)] if emulator else [str(exe)]
