"""Where a decoded token's time goes: lumen decoding SmolLM2's GGUF blocks through the door's compiled step,
at each thread count, by torch's profiler (inductor's kernels recorded one by one).

    .venv/bin/python bench/profile_decode.py [--threads 1,2] [--tokens 32]

Per token: the products (quant.cpp's block kernel), attention (inductor's softmax kernels), the other fused
elementwise kernels (norms, rotations, residual adds), dynamo's guards (its cache lookup), the compiled
graph's Python wrapper, and what is left of the wall time (the Python of the loop). Shares are of the
profiled wall time; the profiler itself adds a little to each event. Results go to docs/speed/profile.json.
Not a test.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

from results import Record

PARTS = ("products", "attention", "elementwise", "guards", "wrapper", "rest")


def part(name: str) -> str | None:
    """Which part of a token's time a profiler event is (None: an event that only contains others)."""
    if name in ("lumen::blocks_row", "aten::mm", "aten::addmm", "lumen::onednn_linear"):
        return "products"
    if name.startswith("graph_"):
        return "attention" if "softmax" in name else "elementwise"
    if name == "TorchDynamo Cache Lookup":
        return "guards"
    if name.startswith(("## Call CompiledFxGraph", "Pregraph", "AOTDispatcher", "Torch-Compiled Region", "aten::")):
        return "wrapper"
    return None


def profile(threads: int, n: int) -> dict:
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from lumen import fast
    from lumen.attention import KVCache

    torch.set_num_threads(threads)
    loaded = fast.load_blocks("smollm2")
    model = loaded.model
    ids = torch.tensor([loaded.tokenizer.encode("The capital of France is")])
    with torch.inference_mode(), fast.decoding(model, compile=True) as decoder:
        def steps(k: int, cache: KVCache) -> float:
            t = time.perf_counter()
            for _ in range(k):
                decoder.step(torch.tensor([[42]]), cache=cache)
            return (time.perf_counter() - t) / k

        def prompted() -> KVCache:  # the prompt's keys in a fresh cache (its prefill is not a step)
            cache = KVCache(model.cfg, 1, 256)
            model(ids, cache=cache)
            return cache

        steps(4, prompted())  # compiles
        plain_ms = 1000 * min(steps(n, prompted()) for _ in range(2))
        cache = prompted()
        with torch_profile(activities=[ProfilerActivity.CPU]) as p:
            wall = steps(n, cache)
    ms = dict.fromkeys(PARTS, 0.0)
    events = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
    top = {e.key[:60]: round(e.self_cpu_time_total / 1000 / n, 3) for e in events[:12]}
    for e in events:
        where = part(e.key)
        if where is not None:
            ms[where] += e.self_cpu_time_total / 1000 / n
    ms["rest"] = max(0.0, 1000 * wall - sum(ms.values()))
    return {"ms_per_token": 1000 * wall, "unprofiled_ms_per_token": plain_ms, "parts_ms": ms, "top_events_ms": top,
            "load": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default=None, help="thread counts (default 1 up to every core)")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    import torch._inductor.config

    torch._inductor.config.cpp.enable_kernel_profile = True  # each fused kernel a profiler event
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(range(1, (os.cpu_count() or 1) + 1))
    with Record("profile") as rec:
        rec["threads"] = {str(t): profile(t, args.tokens) for t in threads}
    for t, r in rec["threads"].items():
        shares = ", ".join(f"{k} {v / r['ms_per_token']:.0%}" for k, v in r["parts_ms"].items())
        print(f"{t} threads: {r['ms_per_token']:.1f} ms/token profiled: {shares}")


if __name__ == "__main__":
    main()
