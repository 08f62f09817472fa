"""lumen against llama.cpp built for this CPU, on the same GGUF file, at every thread count the machine has:
decoding (tokens/s of 128 greedy new tokens), prefill (a 512-token prompt in one pass) and peak resident
memory while decoding (max RSS).

    .venv/bin/python bench/bench_llamacpp.py [--tokens 128] [--prompt 512] [--rounds 2] [--threads 1,2]

llama.cpp is built natively from the source the llama-cpp-python sdist on PyPI carries (bench/llamacpp_native.py:
cmake, -DGGML_NATIVE=ON, cached under ~/.cache/lumen/bench) and measured with its own `llama-bench` (tg, pp);
where it cannot be built (no compiler or cmake), npm's node-llama-cpp (prebuilt binaries) stands in, decoding
only. Every contender runs in its own process and they take turns in every round: llama.cpp, lumen decoding
from the file's own Q4_1/Q8_0 blocks (`--weights gguf`: torch.compile's step; the step compiled ahead of time
by AOTInductor, its package built before the rounds so that they only load it, as a user's later runs do; and
eager), lumen float32 (dequantized, compiled). Each contender's max RSS is its process's peak while decoding
(the kernel's count, rss.run_peak; lumen's own VmHWM before its long prompt; llama.cpp's in a decode-only
run). Goals: lumen's block decoding
>= 1.5x llama.cpp's tokens/s at every thread count, max RSS <= 2x. The results go to docs/speed/llamacpp@KIND.json
(bench/speed_doc.py renders them). Not a test.
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

from llamacpp_native import VERSION, llama_bench
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

LUMEN = {  # contender: (weights, mode)
    "lumen --weights gguf, compiled": ("gguf", "compiled"),
    "lumen --weights gguf, AOTInductor": ("gguf", "aot"),
    "lumen --weights gguf, eager": ("gguf", "eager"),
    "lumen float32, compiled": ("float", "compiled"),
}


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


def llama_cpp_native(exe: Path, gguf: Path, threads: list[int], args: argparse.Namespace) -> dict:
    """{threads: {decode_tok_s, prefill_tok_s}} and the decode run's max RSS, from two llama-bench runs."""
    common = [str(exe), "-m", str(gguf), "-t", ",".join(map(str, threads)), "-r", "1", "-o", "json"]
    out, peak = run_peak(common + ["-p", "0", "-n", str(args.tokens)])
    pre, _ = run_peak(common + ["-p", str(args.prompt), "-n", "0"])
    result: dict = {t: {} for t in threads}
    for row in json.loads(out) + json.loads(pre):
        key = "decode_tok_s" if row["n_gen"] else "prefill_tok_s"
        result[row["n_threads"]][key] = row["avg_ts"]
    return {"max_rss_mib": peak / 1024, "threads": result}


def llama_cpp_node(script: Path, gguf: Path, threads: list[int], args: argparse.Namespace) -> dict:
    result, peaks = {}, []
    for t in threads:
        out, peak = run_peak(["node", str(script), str(gguf), str(t), str(args.tokens), "The capital of France is"])
        result[t] = {"decode_tok_s": json.loads(out.splitlines()[-1])["tok_s"]}
        peaks.append(peak)
    return {"max_rss_mib": max(peaks) / 1024, "threads": result}


def lumen(weights: str, mode: str, threads: list[int], args: argparse.Namespace) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent / "code"), os.environ.get("PYTHONPATH", "")]))
    out, _ = run_peak([sys.executable, str(HERE / "lumen_decode.py"), weights, mode, ",".join(map(str, threads)),
                       str(args.tokens), str(args.prompt)], env)
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default=None, help="thread counts, e.g. 1,2 (default: 1 up to every core)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None, help="install node-llama-cpp here and keep it (fallback)")
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(range(1, (os.cpu_count() or 1) + 1))

    from lumen.fetch import fetch

    gguf = fetch("smollm2", quiet=True)
    with Record("llamacpp") as rec, tempfile.TemporaryDirectory() as tmp:
        exe = llama_bench()
        if exe is not None:
            anchor = f"llama.cpp native ({VERSION}'s source, GGML_NATIVE)"
            measure = lambda: llama_cpp_native(exe, gguf, threads, args)  # noqa: E731
        else:
            script = node_llama(args.keep or Path(tmp))
            if script is None:
                raise SystemExit("bench: neither a native llama.cpp nor npm's node-llama-cpp can be had here")
            anchor = "llama.cpp (node-llama-cpp, prebuilt)"
            measure = lambda: llama_cpp_node(script, gguf, threads, args)  # noqa: E731
        contenders = {anchor: measure}
        for name, (weights, mode) in LUMEN.items():
            contenders[name] = lambda w=weights, m=mode: lumen(w, m, threads, args)
            if mode == "aot":  # its package built once, unmeasured: the measured processes only load it
                lumen(weights, mode, threads[:1], argparse.Namespace(tokens=4, prompt=16))
        runs: dict[str, list[dict]] = {name: [] for name in contenders}
        streams: list[float] = []
        for r in range(args.rounds):
            streams.append(streamed(threads[-1]))
            for name, fn in contenders.items():
                runs[name].append(fn())
                speeds = ", ".join(f"{t}: {x['decode_tok_s']:.1f}" for t, x in runs[name][-1]["threads"].items())
                print(f"round {r + 1} {name}: decode tok/s by threads {speeds}; load average "
                      f"{os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
        rows = []
        for name, rs in runs.items():
            row = {"contender": name, "anchor": name == anchor,
                   "max_rss_mib": statistics.median(x["max_rss_mib"] for x in rs), "threads": {}}
            for t in threads:
                row["threads"][str(t)] = {
                    key: statistics.median(x["threads"][t][key] for x in rs)
                    for key in ("decode_tok_s", "prefill_tok_s") if key in rs[0]["threads"][t]}
                row["threads"][str(t)]["decode_rounds"] = [x["threads"][t]["decode_tok_s"] for x in rs]
            if "text" in rs[-1]["threads"][threads[0]]:
                row["text"] = rs[-1]["threads"][threads[0]]["text"][:80]
            rows.append(row)
        rec.update(model="SmolLM2-135M-Instruct Q4_1 GGUF", tokens=args.tokens, prompt=args.prompt, rounds=args.rounds,
                   thread_counts=threads, rows=rows, bandwidth=bandwidth(gguf, threads[-1], streams))
    base = rows[0]
    for row in rows:
        cells = [f"{t}t {row['threads'][str(t)]['decode_tok_s']:.1f} tok/s "
                 f"({row['threads'][str(t)]['decode_tok_s'] / base['threads'][str(t)]['decode_tok_s']:.2f}x)"
                 for t in threads]
        print(f"{row['contender']}: {'; '.join(cells)}; max RSS {row['max_rss_mib']:.0f} MiB "
              f"({row['max_rss_mib'] / base['max_rss_mib']:.2f}x)")


if __name__ == "__main__":
    main()
