"""What this CPU can do: its name and instruction-set flags, read once, and the questions lumen asks of them.

Every path that needs more than a plain x86-64 or ARM64 CPU (oneDNN's bf16 kernels, AVX-512, VNNI, AMX, ARM's
dot-product instructions) asks here first and takes a working path otherwise: a library kernel that a CPU
lacks raises, mid-run, an error that names an instruction set the user never heard of.

    >>> from lumen.runtime import cpu
    >>> cpu.has("avx2")                          # doctest: +SKIP
    True
    >>> cpu.onednn_bf16()                        # oneDNN's bf16 kernels run here   # doctest: +SKIP
    True

LUMEN_CPU_FLAGS="avx2 fma" makes lumen's decisions as on a CPU with only those flags, its block kernels built
for such a CPU too (lumen.fast.kernels.march): how a test exercises an AVX2-only machine's choices on any machine
(`make test-avx2` holds torch's own kernels to AVX2 as well).
"""

from __future__ import annotations

import functools
import os
import platform
from pathlib import Path

import torch

OVERRIDE = "LUMEN_CPU_FLAGS"  # the flags to decide by, space-separated, instead of the CPU's own

# the flags that choose kernels, as Linux names them: what a benchmark names beside its figures
KERNEL_FLAGS = ("amx_tile", "amx_bf16", "amx_int8", "avx512_vnni", "avx512_bf16", "avx512bw", "avx512f",
                "avx_ne_convert", "avx_vnni", "avx2", "fma", "asimd", "asimddp", "bf16")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """/proc/cpuinfo's first processor, field by field (empty where there is none: not Linux)."""
    path = Path("/proc/cpuinfo")
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return {}
    field: dict[str, str] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        field.setdefault(key.strip(), value.strip())
    return field


def machine_flags() -> frozenset[str]:
    """The CPU's own flags ("flags" on x86 Linux, "Features" on ARM Linux; none elsewhere)."""
    info = _cpuinfo()
    return frozenset((info.get("flags") or info.get("Features") or "").split())


def flags() -> frozenset[str]:
    """The flags lumen decides by: the CPU's own, or $LUMEN_CPU_FLAGS where set."""
    pretend = os.environ.get(OVERRIDE)
    return frozenset(pretend.split()) if pretend is not None else machine_flags()


def has(*names: str) -> bool:
    """Whether the CPU has every one of these flags (Linux's names: "avx2", "avx512_vnni", "amx_int8", "asimddp")."""
    return set(names) <= flags()


def name() -> str:
    """The CPU's model name ("Intel(R) Xeon(R) Processor"), or the platform's word for it."""
    info = _cpuinfo()
    return info.get("model name") or info.get("Model") or platform.processor() or platform.machine()


def vendor() -> str:
    """The CPU's maker as the CPU names itself ("GenuineIntel", "AuthenticAMD"; on ARM Linux the implementer's
    code, "0x41" for Arm's own designs), or "" where /proc/cpuinfo does not say."""
    info = _cpuinfo()
    return info.get("vendor_id") or info.get("CPU implementer") or ""


def arch() -> str:
    """"x86_64" or "aarch64" (what the block kernels are built for), else the platform's own word."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def kernel_flags() -> list[str]:
    """The kernel-choosing flags this CPU has (KERNEL_FLAGS' order): what a measured figure names."""
    have = flags()
    return [f for f in KERNEL_FLAGS if f in have]


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask: fewer than the machine's in a container)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # (not Linux)
        return os.cpu_count() or 1


def machine(threads: bool = True, memory: bool = False, load: bool = False, versions: bool = False) -> str:
    """One line naming where a figure was measured: the CPU, the flags that chose its kernels, the CPUs this
    process may use and (`threads`) torch's threads in it; with `memory` the RAM, with `load` the load average
    now, with `versions` Python's and torch's versions. "Intel(R) Xeon(R) Processor (amx_tile, avx512f, avx2,
    fma), 2 CPUs, 2 torch threads"."""
    line = f"{name()} ({', '.join(kernel_flags()) or 'none of the flags lumen names'}), {cpu_count()} CPUs"
    if threads:
        line += f", {torch.get_num_threads()} torch threads"
    if memory:
        line += f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB"
    if load:
        line += ", load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())
    if versions:
        line += f", Python {platform.python_version()}, torch {torch.__version__}"
    return line


def onednn_bf16() -> bool:
    """Whether oneDNN's bf16 kernels (packed weights, bf16 products) run here: on x86 they need AVX-512's
    byte, vector-length and doubleword parts, or AVX-NE-CONVERT, and raise otherwise; on ARM, the bf16 flag.
    oneDNN itself is asked too (it reads CPUID, not Linux's flags): under an emulator or a hypervisor the two
    can differ, and oneDNN's answer is the one that raises."""
    flagged = has("bf16") if arch() == "aarch64" else has("avx512bw", "avx512vl", "avx512dq") or has("avx_ne_convert")
    return flagged and (not torch.backends.mkldnn.is_available() or bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def native_bf16() -> bool:
    """Whether the CPU computes bf16 products natively (AVX512-BF16 or AMX; ARM's bf16): where bf16 pays."""
    return has("avx512_bf16") or has("amx_bf16") or (arch() == "aarch64" and has("bf16"))


def emulated_bf16() -> str | None:
    """What a command that computes in bf16 says on a CPU without bf16 arithmetic (its many-row products
    converted in software, several times slower than float32: docs/speed.md); None where the CPU has it."""
    if native_bf16():
        return None
    return ("this CPU has no bf16 arithmetic (AVX512-BF16 or AMX): bf16 products of many rows (a training batch, "
            "a prompt, a batch of text) are emulated here, several times slower than float32")
