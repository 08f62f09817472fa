"""lumen.runtime.cpu: the CPU's flags read once, an override that makes another CPU's decisions, and lumen's answer to
"do oneDNN's bf16 kernels run here" against PyTorch's own."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys

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
    # (and where oneDNN itself has no bf16 kernels, an AVX2-only CPU or ONEDNN_MAX_CPU_ISA=AVX2, its answer stands)
    onednn = not torch.backends.mkldnn.is_available() or torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert cpu.onednn_bf16() == (cpu.arch() == "x86_64" and onednn) and not cpu.native_bf16()


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64", "aarch64", "arm64"),
                    reason="PyTorch's bf16 check is for x86-64 and ARM64")
def test_onednn_bf16_is_pytorchs_answer(monkeypatch):
    """PyTorch asks oneDNN (x86) or cpuinfo (ARM) whether its bf16 kernels run: the same answer as lumen's."""
    monkeypatch.delenv(cpu.OVERRIDE, raising=False)
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this PyTorch has no oneDNN")
    assert cpu.onednn_bf16() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


# /proc/cpuinfo's flags on a Haswell (AVX2 and FMA, no AVX-512): what lumen reads on such a machine
HASWELL = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht "
           "syscall nx pdpe1gb rdtscp lm constant_tsc pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe "
           "popcnt aes xsave avx f16c rdrand lahf_lm abm fsgsbase bmi1 avx2 smep bmi2 erms invpcid")


@pytest.mark.slow
def test_bf16_generation_on_an_emulated_avx2_cpu(smollm2_gguf):
    """The command that crashed on a Zen 1 (issue 36: oneDNN's bf16 reorder raised) runs on an AVX2-only CPU as its
    libraries see it: qemu's x86-64 emulator shows PyTorch and oneDNN a Haswell (CPUID), and lumen reads that
    machine's Linux flags; then this machine's flags, which the emulated CPU contradicts (lumen asks oneDNN too).
    Its greedy tokens are the float32 model's, run natively. x86-64 machines with qemu-user only (`make cross`
    installs it); about 3 minutes."""
    if cpu.arch() != "x86_64" or shutil.which("qemu-x86_64") is None:
        pytest.skip("needs an x86-64 machine and qemu-user's qemu-x86_64 (apt-get install -y qemu-user)")
    script = ("import sys, torch; from lumen.cli import main; "
              "print('capability', torch.backends.cpu.get_cpu_capability(), flush=True); "
              "sys.exit(main(['generate', 'smollm2', '--dtype', 'bfloat16', '--prompt', 'Hello', "
              "'--max-new-tokens', '3', '--temperature', '0']))")
    env = {**os.environ, cpu.OVERRIDE: HASWELL, "LUMEN_OFFLINE": "1"}
    # the tokens the float32 model chooses here, natively (bf16's rounding leaves these three unchanged)
    native = subprocess.run([sys.executable, "-m", "lumen", "generate", "smollm2", "--prompt", "Hello",
                             "--max-new-tokens", "3", "--temperature", "0"], env=env, capture_output=True, text=True,
                            timeout=300)
    assert native.returncode == 0, native.stderr
    # as on a Haswell; then with this machine's own flags, which the emulated CPU contradicts (oneDNN is asked too)
    for flags in (HASWELL, None):
        run_env = env if flags else {k: v for k, v in env.items() if k != cpu.OVERRIDE}
        done = subprocess.run(["qemu-x86_64", "-cpu", "Haswell-v4", sys.executable, "-c", script], env=run_env,
                              capture_output=True, text=True, timeout=900)
        assert "capability AVX2" in done.stdout, done.stdout + done.stderr[-3000:]  # PyTorch sees no AVX-512
        assert done.returncode == 0 and "internal error" not in done.stderr, done.stderr[-3000:]
        assert done.stdout.splitlines()[1:] == native.stdout.splitlines()


@pytest.mark.parametrize("flags", ["avx avx2 fma", "avx2 avx512f avx512bw avx512vl avx512dq avx512_bf16"])
def test_a_model_loaded_in_bf16_without_bf16_arithmetic_says_so(flags, tmp_path, monkeypatch, capsys):
    """The CLI's tools load a model in bfloat16 when asked; on a CPU without bf16 instructions its products of many
    rows are emulated, several times slower than float32, and the tool says so in one line (and loads it)."""
    from helpers.runs import tiny_run
    from lumen.cli.models import load_model

    run = tiny_run(tmp_path) / "run"
    monkeypatch.setenv(cpu.OVERRIDE, flags)
    model = load_model(str(run), "bfloat16").model
    said = capsys.readouterr().err
    assert next(model.parameters()).dtype == torch.bfloat16
    assert said.count("this CPU has no bf16 arithmetic") == ("avx512_bf16" not in flags), said
    load_model(str(run), "float32")
    assert "bf16" not in capsys.readouterr().err
