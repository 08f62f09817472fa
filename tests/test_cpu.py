"""lumen.runtime.cpu: the CPU's flags read once, an override that makes another CPU's decisions, and lumen's answer to
"do oneDNN's bf16 kernels run here" against PyTorch's own."""

from __future__ import annotations

import platform
import subprocess

import pytest
import torch

from lumen.runtime import cpu


def test_flags_are_the_cpus_own(monkeypatch):
    """The flags against lscpu's (another reader of the same kernel's answer), where it is installed."""
    monkeypatch.delenv(cpu.OVERRIDE, raising=False)
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("needs lscpu (util-linux) to compare with")
    line = next((ln for ln in out.splitlines() if ln.startswith("Flags:")), None)
    if line is None:
        pytest.skip("lscpu names no flags here")
    assert cpu.flags() == cpu.machine_flags() == frozenset(line.split(":", 1)[1].split())
    assert cpu.has(*sorted(cpu.flags())[:3]) and not cpu.has("no_such_flag")
    assert cpu.kernel_flags() == [f for f in cpu.KERNEL_FLAGS if f in cpu.flags()]


def test_vendor_is_the_cpus_own():
    """The maker against lscpu's Vendor ID (the prefetch distance the kernels are built with follows it)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        pytest.skip("needs lscpu (util-linux) to compare with")
    line = next((ln for ln in out.splitlines() if ln.startswith("Vendor ID:")), None)
    if line is None or cpu.arch() != "x86_64":  # (on ARM lscpu names the implementer by name, not its code)
        pytest.skip("lscpu names no x86 vendor here")
    assert cpu.vendor() == line.split(":", 1)[1].strip()


def test_override_decides_as_another_cpu(monkeypatch):
    monkeypatch.setenv(cpu.OVERRIDE, "sse2 avx avx2 fma")
    assert cpu.has("avx2", "fma") and not cpu.has("avx512f")
    assert cpu.kernel_flags() == ["avx2", "fma"]
    assert not cpu.onednn_bf16() and not cpu.native_bf16()
    assert cpu.machine_flags() != cpu.flags() or not cpu.machine_flags()  # the CPU's own flags are still read
    monkeypatch.setenv(cpu.OVERRIDE, "avx2 avx512f avx512bw avx512vl avx512dq")  # a Skylake-X: kernels, no bf16 unit
    assert cpu.onednn_bf16() == (cpu.arch() == "x86_64") and not cpu.native_bf16()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
                    reason="PyTorch's bf16 check is for x86-64 and ARM64")
def test_onednn_bf16_is_pytorchs_answer(monkeypatch):
    """PyTorch asks oneDNN (x86) or cpuinfo (ARM) whether its bf16 kernels run: the same answer as lumen's."""
    monkeypatch.delenv(cpu.OVERRIDE, raising=False)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch has no oneDNN")
    assert cpu.onednn_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
