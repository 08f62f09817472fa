"""quant.cpp's one-row block products, builds side by side: this tree's and earlier commits' (default: the one
before the AVX2 kernel read four rows at a time, and the one before it read a row's two blocks as one register),
each built for a chosen instruction set (default -march=x86-64-v3: AVX2 and FMA, no AVX-512, no VNNI: an AMD
Zen 1's), on SmolLM2-sized matrices of random blocks. Each build runs in a process of its own (all register the
same ops), the builds taking turns, round after round; the best round of each is kept, and the ratios are of
those: of the wall time, and of the CPU time the process used (on a machine that other programs keep busy, the
wall time of one thread measures the scheduler's share as much as the kernel; the CPU time of one thread
measures the kernel).

    .venv/bin/python bench/kernel_builds.py [--base COMMIT,COMMIT] [--march x86-64-v3] [--threads 1,2] [--rounds 5]

Results go to docs/speed/kernel_builds@KIND.json (named with the machine and its flags). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAST = "code/lumen/fast"

# the matrices of one SmolLM2-135M token, in its file's kinds (Q8_0 unembedding, Q4_1 blocks), one of each
# shape, repeated as often as a token reads it: (kind, out, in, times)
SHAPES = (("Q4_1", 576, 576, 30 * 2), ("Q4_1", 192, 576, 30 * 2), ("Q4_1", 1536, 576, 30 * 2),
          ("Q4_1", 576, 1536, 30), ("Q8_0", 49152, 576, 1))

WORKER = r"""
import json, sys, time, torch
from lumen.fast import kernels
from lumen.fast.quant import QuantMatrix
kernels.CFLAGS = ["-O3", f"-march={sys.argv[2]}", "-fopenmp"]
src = sys.argv[1]
from pathlib import Path
assert kernels._load((Path(src) / "quant.cpp", Path(src) / "attend.cpp"))
kernels._library = True
shapes, threads, repeats = json.loads(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(threads)
g = torch.Generator().manual_seed(0)
mats = []
for kind, out, n, times in shapes:
    nb = n // 32
    scale = (torch.rand(out, nb, generator=g) * 0.01).half()
    if kind == "Q4_1":
        codes = torch.randint(0, 256, (out, n // 2), dtype=torch.uint8, generator=g)
        blocks = QuantMatrix(codes, scale, (torch.rand(out, nb, generator=g) * -0.1).half())
    else:
        blocks = QuantMatrix(torch.randint(-127, 128, (out, n), dtype=torch.int8, generator=g), scale, None)
    mats += [(blocks, torch.randn(n, generator=g))] * times
for b, x in mats[:20]:
    b.row_product(x)
best, cpu = float("inf"), float("inf")
for _ in range(repeats):
    t, c = time.perf_counter(), time.process_time()
    for b, x in mats:
        b.row_product(x)
    best, cpu = min(best, time.perf_counter() - t), min(cpu, time.process_time() - c)
print(json.dumps({"token_ms": best * 1e3, "cpu_ms": cpu * 1e3}))
"""


def run(src: Path, march: str, threads: int, cache: Path, repeats: int) -> dict[str, float]:
    env = {**os.environ, "LUMEN_CACHE": str(cache), "PYTHONPATH": str(ROOT / "code")}
    done = subprocess.run([sys.executable, "-c", WORKER, str(src), march, json.dumps(SHAPES), str(threads),
                           str(repeats)], env=env, capture_output=True, text=True, timeout=900)
    if done.returncode:
        sys.exit(f"kernel_builds: the build of {src} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# what the default commits' AVX2 path does (the page says it beside their times)
KNOWN = {"e8b5504": "one row and one block at a time",
         "989c2a0": "four rows, two blocks at a time, a row's blocks one at a time, sums by horizontal adds"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default=",".join(KNOWN), help="the commits whose quant.cpp to compare with (a, b, ...)")
    p.add_argument("--march", default="x86-64-v3")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5, help="tokens timed in each process (its best is kept)")
    args = p.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from results import Record

    with tempfile.TemporaryDirectory() as tmp:
        builds = {}
        for commit in args.base.split(","):
            builds[commit] = base = Path(tmp) / commit
            base.mkdir()
            for name in ("quant.cpp", "attend.cpp", "quads.h", "attend.h"):  # (the headers: where it has them)
                shown = subprocess.run(["git", "show", f"{commit}:{FAST}/{name}"], cwd=ROOT, capture_output=True,
                                       text=True)
                if shown.returncode == 0:
                    (base / name).write_text(shown.stdout)
                elif name.endswith(".cpp"):
                    sys.exit(f"kernel_builds: {commit} has no {FAST}/{name} ({shown.stderr.strip()})")
        builds["this tree"] = ROOT / FAST
        rows = []
        with Record("kernel_builds") as rec:
            rec["builds"] = {name: KNOWN.get(name, "") for name in builds}
            for threads in map(int, args.threads.split(",")):
                best = {name: {"token_ms": float("inf"), "cpu_ms": float("inf")} for name in builds}
                for _ in range(args.rounds):
                    for name, src in builds.items():
                        got = run(src, args.march, threads, Path(tmp) / "cache", args.repeats)
                        best[name] = {kind: min(best[name][kind], got[kind]) for kind in best[name]}
                row = {"threads": threads, "march": args.march, "load": os.getloadavg()[0],
                       "ms": {name: {kind: round(t, 2) for kind, t in b.items()} for name, b in best.items()}}
                rows.append(row)
                print(row, flush=True)
            rec["products"] = rows


if __name__ == "__main__":
    main()
