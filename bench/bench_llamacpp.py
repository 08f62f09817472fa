"""lumen against llama.cpp built for this CPU, on the same model, at every thread count the machine has:
decoding (tokens/s of 128 greedy new tokens, after a short prompt and after DEPTH tokens already in the
cache: llama-bench's `-d`), prefill (a 512-token prompt in one pass) and peak resident memory while decoding.

    .venv/bin/python bench/bench_llamacpp.py [--tokens 128] [--prompt 512] [--rounds 2] [--threads 1,2]
        [--depths 0,512] [--formats Q4_1,Q4_0,Q4_K_M] [--modes compiled,aot,eager,float] [--base COMMIT]
        [--builds native,no-amx]

llama.cpp is built natively from the source the llama-cpp-python sdist on PyPI carries (bench/llamacpp_native.py:
cmake, -DGGML_NATIVE=ON, cached under ~/.cache/lumen/bench) and measured with its own `llama-bench` (tg, pp),
on the GGUF lumen reads (Q4_1) and on the same model in llama.cpp's other formats (`--formats`: made from that
file by llama.cpp's own llama-quantize), each with its weights repacked for this CPU (llama-bench's default; on
an AMX machine its AMX kernels) and as the file lays them out (`--repack 0`), by each build (`--builds`: on an
AMX machine also one without AMX, whose repacked layouts are AVX-512's): the goal is against the best of them,
cell by cell (a run that fails, as the AMX kernels' prompts do on some VMs, leaves its cells empty).
Where it cannot be built (no compiler or cmake), npm's node-llama-cpp (prebuilt binaries) stands in, decoding
only. Every contender runs in its own process and they take turns in every round: llama.cpp, lumen decoding
from the file's own Q4_1/Q8_0 blocks (`--weights gguf`: torch.compile's step; the step compiled ahead of time
by AOTInductor, its package built before the rounds so that they only load it, as a user's later runs do; and
eager), lumen float32 (dequantized, compiled); `--base COMMIT`: lumen's AOT step as that commit has it too
(its code exported beside; a before-and-after in one run). Each contender's max RSS is its process's peak while
decoding (the kernel's count, rss.run_peak; lumen's own VmHWM before its long prompt; llama.cpp's in a decode
run). Goals: lumen's block decoding >= 1.5x llama.cpp's best at every thread count and depth, max RSS <= 2x.
The results go to docs/speed/llamacpp@KIND.json (bench/speed_doc.py renders them). Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import AVX2_STAND_IN
from llamacpp_native import llama_bench, requantized
from results import Record
from rss import run_peak

HERE = Path(__file__).resolve().parent

NODE_SCRIPT = r"""
import {getLlama} from "node-llama-cpp";
const [modelPath, threads, n, prompt] = [process.argv[2], +process.argv[3], +process.argv[4], process.argv[5]];
const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: "error"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 512, threads, batchSize: 512});
const seq = context.getSequence();
const out = [];
let first = 0;
for await (const t of seq.evaluate(model.tokenize(prompt), {temperature: 0})) {
  if (out.length === 0) first = performance.now();
  out.push(t);
  if (out.length >= n) break;
}
console.log(JSON.stringify({tok_s: (out.length - 1) / ((performance.now() - first) / 1000)}));
"""

LUMEN = {  # contender: (weights, mode); --modes picks them by mode ("float": the float32 one)
    "lumen --weights gguf, compiled": ("gguf", "compiled"),
    "lumen --weights gguf, AOTInductor": ("gguf", "aot"),
    "lumen --weights gguf, eager": ("gguf", "eager"),
    "lumen float32, compiled": ("float", "compiled"),
}
BEST = "llama.cpp, best of its formats and layouts"  # the anchor row: the best llama.cpp cell by cell
BUILT = {"native": "native", "no-amx": "native without AMX", "avx2": "built for AVX2 only"}  # (llamacpp_native.BUILDS)
# --stand-in avx2: an AVX2-only CPU's code on this one, both engines built for it (llama.cpp's "avx2" build;
# lumen in common.AVX2_STAND_IN's process)


def node_llama(where: Path) -> Path | None:
    """node-llama-cpp installed from npm into `where` (the fallback), or None without npm."""
    if not shutil.which("npm"):
        return None
    if not (where / "node_modules" / "node-llama-cpp").is_dir():
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "node-llama-cpp@3"],
                       cwd=where, check=True, stdout=subprocess.DEVNULL)
    script = where / "decode.mjs"
    script.write_text(NODE_SCRIPT)
    return script


def llama_cpp_native(exe: Path, gguf: Path, threads: list[int], args: argparse.Namespace, repack: int) -> dict:
    """{threads: {decode_tok_s, decode_by_depth, prefill_tok_s}} and the decode run's max RSS, from llama-bench
    runs, each in its own process (one that fails leaves its cells out: the others still count)."""
    common = [str(exe), "-m", str(gguf), "-t", ",".join(map(str, threads)), "-r", "1", "-o", "json",
              "--repack", str(repack)]
    result: dict = {t: {"decode_by_depth": {}} for t in threads}
    peak = 0
    runs = [["-p", "0", "-n", str(args.tokens), "-d", str(d)] for d in args.depths]
    runs.append(["-p", str(args.prompt), "-n", "0"])
    for extra in runs:
        try:
            out, kib = run_peak(common + extra)
        except RuntimeError as e:
            print(f"bench: llama-bench {' '.join(extra)} --repack {repack} on {gguf.name} failed: "
                  f"{str(e).splitlines()[0]}", file=sys.stderr)
            continue
        for row in json.loads(out):
            if row["n_gen"]:
                result[row["n_threads"]]["decode_by_depth"][str(row.get("n_depth", 0))] = row["avg_ts"]
            else:
                result[row["n_threads"]]["prefill_tok_s"] = row["avg_ts"]
        if extra[-1] == str(args.depths[0]):
            peak = kib
    for t in threads:
        if str(args.depths[0]) in result[t]["decode_by_depth"]:
            result[t]["decode_tok_s"] = result[t]["decode_by_depth"][str(args.depths[0])]
    return {"max_rss_mib": peak / 1024, "threads": result}


def llama_cpp_node(script: Path, gguf: Path, threads: list[int], args: argparse.Namespace) -> dict:
    result, peaks = {}, []
    for t in threads:
        out, peak = run_peak(["node", str(script), str(gguf), str(t), str(args.tokens), "The capital of France is"])
        result[t] = {"decode_tok_s": json.loads(out.splitlines()[-1])["tok_s"]}
        peaks.append(peak)
    return {"max_rss_mib": max(peaks) / 1024, "threads": result}


def lumen(weights: str, mode: str, threads: list[int], args: argparse.Namespace, code: Path = HERE.parent / "code",
          depths: list[int] | None = None) -> dict:
    """One lumen contender's run, in its own process, with lumen's code from `code` (this tree's, or --base's)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]),
               **(AVX2_STAND_IN if args.stand_in else {}))
    out, _ = run_peak([sys.executable, str(HERE / "lumen_decode.py"), weights, mode, ",".join(map(str, threads)),
                       str(args.tokens), str(args.prompt), ",".join(map(str, depths or args.depths))], env)
    result = json.loads(out.splitlines()[-1])
    result["threads"] = {int(t): r for t, r in result["threads"].items()}
    return result


STREAM = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
big = torch.ones(2**28)  # 1 GiB of float32, every page touched
best = float("inf")
for _ in range(5):
    t = time.perf_counter()
    big.sum()
    best = min(best, time.perf_counter() - t)
print(big.numel() * 4 / best)
"""


def streamed(threads: int) -> float:
    """The memory's speed here now, bytes/s: the best of five sums over 1 GiB of float32 at `threads` threads, in
    a process of its own (the contenders' peak memory is counted from the moment they are forked)."""
    out = subprocess.run([sys.executable, "-c", STREAM, str(threads)], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def bandwidth(gguf: Path, threads: int, speeds: list[float]) -> dict:
    """What bounds batch-1 decoding: the bytes of weights a token reads (every tensor of the file once: the
    tied embedding is the output head too) and the memory's speed, measured in every round (`streamed`: the
    VM's own speed moves from round to round), their median."""
    from gguf import GGUFReader

    per_token = sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors)
    return {"bytes_per_token": per_token, "bytes_per_s": statistics.median(speeds), "rounds_bytes_per_s": speeds,
            "how": f"torch's sum over 1 GiB of float32 at {threads} threads, best of 5 in each round, the median"}


def base_code(commit: str, where: Path) -> Path:
    """lumen's code (code/) as `commit` has it, exported under `where`: its path."""
    archive = subprocess.run(["git", "archive", commit, "code"], cwd=HERE.parent, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive.stdout, check=True)
    return where / "code"


def best_of(rows: list[dict], threads: list[int]) -> dict:
    """The anchor: llama.cpp's best cell by cell over its rows (which row gave each, in `from`)."""
    best: dict = {"contender": BEST, "anchor": True, "max_rss_mib": min(r["max_rss_mib"] for r in rows),
                  "threads": {}, "from": {}}
    for t in map(str, threads):
        cells: dict = {"decode_by_depth": {}}
        for key in ("decode_tok_s", "prefill_tok_s"):
            got = [(r["threads"][t][key], r["contender"]) for r in rows if key in r["threads"][t]]
            if got:
                cells[key], best["from"][f"{key} {t}t"] = max(got)
        for d in {d for r in rows for d in r["threads"][t].get("decode_by_depth", {})}:
            got = [(r["threads"][t]["decode_by_depth"][d], r["contender"]) for r in rows
                   if d in r["threads"][t].get("decode_by_depth", {})]
            cells["decode_by_depth"][d], best["from"][f"decode d{d} {t}t"] = max(got)
        best["threads"][t] = cells
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default: 1 up to every core)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--depths", default="0,512", help="tokens in the cache before the timed ones (llama-bench's -d)")
    ap.add_argument("--formats", default="Q4_1,Q4_0,Q4_K_M", help="llama.cpp's formats (the first: the file's own)")
    ap.add_argument("--modes", default="compiled,aot,eager,float", help="lumen's contenders (LUMEN) by mode")
    ap.add_argument("--stand-in", choices=["avx2"], default=None, help="both engines built for an AVX2-only CPU "
                    "(recorded as llamacpp_avx2: a stand-in measured on this machine, not such a machine)")
    ap.add_argument("--builds", default=None, help="llama.cpp's builds (llamacpp_native.BUILDS; default: native, "
                    "and no-amx on a CPU with AMX)")
    ap.add_argument("--base", default=None, help="a commit whose lumen AOT step runs too (before and after)")
    ap.add_argument("--keep", type=Path, default=None, help="install node-llama-cpp here and keep it (fallback)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(range(1, (os.cpu_count() or 1) + 1))
    args.depths = [int(d) for d in args.depths.split(",")]
    modes = args.modes.split(",")
    from lumen.runtime import cpu

    args.builds = args.stand_in or args.builds or ("native,no-amx" if cpu.has("amx_int8") else "native")

    from lumen.fetch import fetch

    gguf = fetch("smollm2", quiet=True)
    with Record("llamacpp_avx2" if args.stand_in else "llamacpp") as rec, tempfile.TemporaryDirectory() as tmp:
        exes = {build: llama_bench(build=build) for build in args.builds.split(",")}
        exe = exes.get("native") or next(iter(exes.values()))
        contenders: dict = {}
        if exe is not None:
            for fmt in args.formats.split(","):
                model = requantized(gguf, fmt)
                if model is None:
                    print(f"bench: no llama-quantize here for {fmt}; left out", file=sys.stderr)
                    continue
                for build, built in exes.items():
                    if built is None:
                        continue
                    for repack, layout in ((1, "repacked for this CPU"), (0, "the file's layout (--repack 0)")):
                        name = (f"llama.cpp {BUILT[build]}, {fmt}{' (the file lumen reads)' if model == gguf else ''}, "
                                f"{layout}")
                        contenders[name] = lambda e=built, m=model, r=repack: llama_cpp_native(e, m, threads, args, r)
            llamas = list(contenders)
        else:
            script = node_llama(args.keep or Path(tmp))
            if script is None:
                raise SystemExit("bench: neither a native llama.cpp nor npm's node-llama-cpp can be had here")
            llamas = ["llama.cpp (node-llama-cpp, prebuilt)"]
            contenders[llamas[0]] = lambda: llama_cpp_node(script, gguf, threads, args)
        before = {}
        if args.base:
            (Path(tmp) / "base").mkdir()
            code = base_code(args.base, Path(tmp) / "base")
            if args.stand_in and "def march(" not in (code / "lumen/fast/kernels.py").read_text():
                raise SystemExit(f"bench: --base {args.base} builds its kernels for this CPU whatever LUMEN_CPU_FLAGS "
                                 "says (kernels.march came later): drop --base with --stand-in, or name a later commit")
            before[f"lumen --weights gguf, AOTInductor, before ({args.base})"] = code
        for name, (weights, mode) in LUMEN.items():
            if (mode if weights == "gguf" else "float") not in modes:
                continue
            codes = {**(before if mode == "aot" else {}), name: HERE.parent / "code"}
            for label, code in codes.items():
                contenders[label] = lambda w=weights, m=mode, c=code: lumen(w, m, threads, args, c)
                if mode == "aot":  # its packages built once, unmeasured: the measured processes only load them
                    lumen(weights, mode, threads[:1], argparse.Namespace(tokens=args.tokens, prompt=16,
                                                                         depths=args.depths,
                                                                         stand_in=args.stand_in), code)
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        streams: list[float] = []
        for r in range(args.rounds):
            streams.append(streamed(threads[-1]))
            for name, fn in contenders.items():
                runs[name].append(fn())
                speeds = ", ".join(f"{t}t d{d}: {x:.1f}" for t, c in runs[name][-1]["threads"].items()
                                   for d, x in c.get("decode_by_depth", {"0": c.get("decode_tok_s", 0)}).items())
                print(f"round {r + 1} {name}: decode tok/s {speeds}; load average {os.getloadavg()[0]:.1f}",
                      file=sys.stderr, flush=True)
        rows = []
        for name, rs in runs.items():
            row = {"contender": name, "anchor": False,
                   "max_rss_mib": statistics.median(x["max_rss_mib"] for x in rs), "threads": {}}
            for t in threads:
                cells: dict = {key: statistics.median(x["threads"][t][key] for x in rs if key in x["threads"][t])
                               for key in ("decode_tok_s", "prefill_tok_s") if any(key in x["threads"][t] for x in rs)}
                depths = {d for x in rs for d in x["threads"][t].get("decode_by_depth", {})}
                cells["decode_by_depth"] = {d: statistics.median(x["threads"][t]["decode_by_depth"][d] for x in rs
                                                                 if d in x["threads"][t]["decode_by_depth"])
                                            for d in sorted(depths, key=int)}
                cells["decode_rounds"] = [x["threads"][t].get("decode_tok_s") for x in rs]
                row["threads"][str(t)] = cells
            if "text" in rs[-1]["threads"][threads[0]]:
                row["text"] = rs[-1]["threads"][threads[0]]["text"][:80]
            rows.append(row)
        rows.insert(0, best_of([row for row in rows if row["contender"] in llamas], threads))
        rec.update(model="SmolLM2-135M-Instruct GGUF (Q4_1; llama.cpp's other formats made from it)",
                   tokens=args.tokens, prompt=args.prompt, rounds=args.rounds, thread_counts=threads,
                   depths=args.depths, rows=rows, bandwidth=bandwidth(gguf, threads[-1], streams))
    base = rows[0]
    for row in rows:
        cells = [f"{t}t d{d} {x:.1f} tok/s ({x / base['threads'][str(t)]['decode_by_depth'][d]:.2f}x)"
                 for t in threads for d, x in row["threads"][str(t)]["decode_by_depth"].items()
                 if base["threads"][str(t)]["decode_by_depth"].get(d)]
        print(f"{row['contender']}: {'; '.join(cells)}; max RSS {row['max_rss_mib']:.0f} MiB "
              f"({row['max_rss_mib'] / max(base['max_rss_mib'], 1):.2f}x)")


if __name__ == "__main__":
    main()
