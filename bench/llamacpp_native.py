"""llama.cpp built for this CPU, for the benches: the source the llama-cpp-python sdist on PyPI carries (its
vendor/llama.cpp), built with cmake and -DGGML_NATIVE=ON (every instruction this CPU has): `llama-bench`, and
`llama-quantize` beside it for the other formats of the same model (`requantized`). Two more builds (BUILDS):
"no-amx", every instruction but AMX's (on a VM that reports AMX, llama.cpp's AMX kernels crashed on prompts, so
its repacked layouts had no prompt or depth figures), and "avx2", AVX2 and FMA only: what llama.cpp runs on a
CPU without AVX-512, for a side-by-side stand-in of such a machine on this one.

    .venv/bin/python bench/llamacpp_native.py [BUILD]  # build it (once; a few minutes on 2 cores) and say where

Cached outside the repository, in lumen's cache folder (lumen.runtime.cache) under bench/ (~/.cache/lumen/bench),
keyed by the sdist's version and this CPU's flags: a contender only, never a dependency of lumen. `llama_bench()`
returns None where it cannot be had (no compiler, no cmake, no network for pip): bench_llamacpp.py then falls back to
npm's node-llama-cpp (prebuilt binaries).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

VERSION = "0.3.36"  # llama-cpp-python's sdist, and so the llama.cpp source it vendors


def cache() -> Path:
    from lumen.runtime.cache import cache_dir

    return cache_dir("bench")


def cpu_flags() -> str:
    """The CPU's own flags (what -march=native builds for)."""
    from lumen.runtime import cpu

    return " ".join(sorted(cpu.machine_flags()))


# build: cmake's flags for the CPU part (the Makefile's llama-cpp wheel is built as "no-amx" is)
_X86 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON",
        "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
_AVX512 = ["-DGGML_AVX512=ON", "-DGGML_AVX512_VBMI=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX512_BF16=ON"]
BUILDS = {"native": ["-DGGML_NATIVE=ON"], "no-amx": _X86 + _AVX512, "avx2": _X86 + ["-DGGML_AVX512=OFF"]}


def llama_bench(quiet: bool = False, tool: str = "llama-bench", build: str = "native") -> Path | None:
    """The path of a native `llama-bench` (or another of its tools: `llama-quantize`), built the first time for
    `build` (BUILDS); None (and why, on stderr) if it cannot be."""
    key = hashlib.sha256((VERSION + cpu_flags()).encode()).hexdigest()[:12]
    root = cache() / f"llama.cpp-{VERSION}-{key}{'' if build == 'native' else '-' + build}"
    exe = root / "build" / "bin" / tool
    if exe.exists():
        return exe
    missing = [tool for tool in ("cmake", "c++") if not shutil.which(tool)]
    if missing:
        print(f"bench: no {' or '.join(missing)} to build llama.cpp natively", file=sys.stderr)
        return None
    say = subprocess.DEVNULL if quiet else None
    try:
        sdist = cache() / f"llama_cpp_python-{VERSION}.tar.gz"
        if not sdist.exists():
            cache().mkdir(parents=True, exist_ok=True)
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"llama-cpp-python=={VERSION}", "-d", str(cache())], check=True, stdout=say)
        source = root / "src"
        if not (source / "CMakeLists.txt").exists():
            prefix = f"llama_cpp_python-{VERSION}/vendor/llama.cpp/"
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
                for m in members:
                    m.name = m.name[len(prefix):]
                tar.extractall(source, members=[m for m in members if m.name], filter="data")
        print(f"bench: building llama.cpp {VERSION} (llama-cpp-python's source) for this CPU ({build}) into {root}",
              file=sys.stderr)
        subprocess.run(["cmake", "-S", str(source), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release",
                        *BUILDS[build], "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_SERVER=OFF", "-DBUILD_SHARED_LIBS=OFF"], check=True, stdout=say)
        subprocess.run(["cmake", "--build", str(root / "build"), "--target", tool, "-j",
                        str(os.cpu_count() or 1)], check=True, stdout=say)
    except (subprocess.CalledProcessError, OSError, tarfile.TarError) as e:
        print(f"bench: llama.cpp did not build natively ({e})", file=sys.stderr)
        return None
    return exe if exe.exists() else None


def requantized(gguf: Path, fmt: str) -> Path | None:
    """The model of `gguf` in another of llama.cpp's formats (Q4_0, Q4_K_M, ...), made once by its own
    llama-quantize from that file (`--allow-requantize`: from its own quantized numbers, the most precise this
    machine has) and cached beside the build; the file itself if it is in that format already (its name says
    so); None if llama-quantize cannot be had."""
    if gguf.stem.endswith(f".{fmt}"):
        return gguf
    out = cache() / "requantized" / f"{gguf.stem.rsplit('.', 1)[0]}.{fmt}-from-{gguf.stem.rsplit('.', 1)[-1]}.gguf"
    if out.exists():
        return out
    exe = llama_bench(quiet=True, tool="llama-quantize")
    if exe is None:
        return None
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_suffix(".part")
    subprocess.run([str(exe), "--allow-requantize", str(gguf), str(part), fmt], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    part.rename(out)
    return out


if __name__ == "__main__":
    print(llama_bench(build=sys.argv[1] if len(sys.argv) > 1 else "native"))
