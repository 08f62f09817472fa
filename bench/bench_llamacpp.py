"""lumen against llama.cpp on the same GGUF file: greedy decoding of 128 new tokens at the same thread count,
tokens per second and the process's peak resident memory (max RSS).

    .venv/bin/python bench/bench_llamacpp.py [--threads 2] [--tokens 128] [--rounds 2] [--keep DIR]

llama.cpp comes from the npm package node-llama-cpp (prebuilt binaries, @node-llama-cpp/linux-x64), installed
with npm into a temporary directory (or --keep DIR, reused when it is there): a contender only, never a
dependency of lumen. Contenders, each in its own process, take turns in every round: llama.cpp, lumen decoding
from the file's own Q4_1/Q8_0 blocks (`--weights gguf`, compiled and eager), lumen float32 (dequantized, compiled).
Decoding speed counts the tokens after the first (the prompt's prefill is not counted); compile time is not
counted either. Goals: lumen's quantized decoding >= 1.0x llama.cpp's tokens/s, max RSS <= 2x. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROMPT = "The capital of France is"

NODE_SCRIPT = r"""
import {getLlama} from "node-llama-cpp";
import fs from "node:fs";
const [modelPath, threads, n, prompt] = [process.argv[2], +process.argv[3], +process.argv[4], process.argv[5]];
const llama = await getLlama({gpu: false, build: "never", maxThreads: threads, logLevel: "error"});
const model = await llama.loadModel({modelPath});
const context = await model.createContext({contextSize: 512, threads, batchSize: 512});
const seq = context.getSequence();
const tokens = model.tokenize(prompt);
const out = [];
let first = 0;
for await (const t of seq.evaluate(tokens, {temperature: 0})) {
  if (out.length === 0) first = performance.now();
  out.push(t);
  if (out.length >= n) break;
}
const seconds = (performance.now() - first) / 1000;
const hwm = fs.readFileSync("/proc/self/status", "utf8").match(/VmHWM:\s+(\d+)/)[1];
console.log(JSON.stringify({tok_s: (out.length - 1) / seconds, max_rss_mib: +hwm / 1024,
                            text: model.detokenize(out)}));
"""

LUMEN_SCRIPT = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore")
import torch
sys.path.insert(0, sys.argv[5])
from rss import status_kib
from lumen import fast
from lumen.decode import GREEDY, stream
from lumen.formats import load
torch.set_num_threads(int(sys.argv[2]))
loaded = fast.load_blocks("smollm2") if sys.argv[1] == "gguf" else load("smollm2")
model, tok = loaded.model, loaded.tokenizer
ids = torch.tensor([tok.encode(sys.argv[4])])
n, compile = int(sys.argv[3]), sys.argv[6] == "compiled"
with torch.inference_mode(), fast.decoding(model, compile) as decoder:
    decoder.generate(ids, 4, temperature=0)  # compiles (not counted)
    stamps, out = [], []
    # (the thread count fixed by --threads: the steps of lumen.decode through the door's step, untuned)
    for t in stream(model, ids, n, GREEDY, step=decoder.step, cache_slots=256 if compile else None):
        stamps.append(time.perf_counter()); out.append(int(t[0]))
print(json.dumps({"tok_s": (n - 1) / (stamps[-1] - stamps[0]), "max_rss_mib": status_kib("VmHWM") / 1024,
                  "text": tok.decode(out)}))
"""


def install(where: Path) -> Path:
    if not (where / "node_modules" / "node-llama-cpp").is_dir():
        where.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--ignore-scripts", "node-llama-cpp@3"],
                       cwd=where, check=True, stdout=subprocess.DEVNULL)
    script = where / "decode.mjs"
    script.write_text(NODE_SCRIPT)
    return script


def run(cmd: list[str], env: dict | None = None) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"{cmd[0]} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=1, help="both contenders' threads (default 1)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep", type=Path, default=None, help="install node-llama-cpp here and keep it")
    args = ap.parse_args()

    from lumen.fetch import fetch

    gguf = fetch("smollm2", quiet=True)
    here = Path(__file__).resolve().parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here.parent / "code"), os.environ.get("PYTHONPATH", "")]))
    with tempfile.TemporaryDirectory() as tmp:
        script = install(args.keep or Path(tmp))
        contenders = {
            "llama.cpp (node-llama-cpp)": ["node", str(script), str(gguf), str(args.threads), str(args.tokens), PROMPT],
        }
        for weights, mode in (("gguf", "compiled"), ("gguf", "eager"), ("float", "compiled")):
            contenders[f"lumen --weights {weights}, {mode}"] = [sys.executable, "-c", LUMEN_SCRIPT, weights,
                                                                str(args.threads), str(args.tokens), PROMPT, str(here),
                                                                mode]
        results: dict[str, list[dict]] = {name: [] for name in contenders}
        for r in range(args.rounds):
            for name, cmd in contenders.items():
                results[name].append(run(cmd, env))
                print(f"round {r + 1} {name}: {results[name][-1]['tok_s']:.1f} tok/s, load average "
                      f"{os.getloadavg()[0]:.1f}", file=sys.stderr, flush=True)
    base = statistics.median(x["tok_s"] for x in results["llama.cpp (node-llama-cpp)"])
    base_rss = statistics.median(x["max_rss_mib"] for x in results["llama.cpp (node-llama-cpp)"])
    print(f"\nSmolLM2-135M-Instruct Q4_1 GGUF, {args.threads} threads, greedy, {args.tokens} new tokens, "
          f"medians of {args.rounds} rounds")
    print("| | decode tok/s | x llama.cpp | max RSS MiB | x llama.cpp |")
    print("|---|---|---|---|---|")
    for name, rs in results.items():
        tps = statistics.median(x["tok_s"] for x in rs)
        rss = statistics.median(x["max_rss_mib"] for x in rs)
        print(f"| {name} | {tps:.1f} | {tps / base:.2f} | {rss:,.0f} | {rss / base_rss:.2f} |")
    for name, rs in results.items():
        print(f"{name}: {rs[-1]['text'][:80]!r}")


if __name__ == "__main__":
    main()
