"""Where a decoded token's time goes: lumen decoding SmolLM2's GGUF blocks through the door's compiled steps,
torch.compile's and AOTInductor's (`compile="aot"`), side by side at each thread count, by torch's profiler
(inductor's kernels recorded one by one).

    .venv/bin/python bench/profile_decode.py [--threads 1,2] [--tokens 32]

Per token: the products (quant.cpp's block kernel), attention (attend.cpp's kernel, or inductor's softmax
kernels), the other fused elementwise kernels (norms, rotations, residual adds), dynamo's guards (its cache
lookup), the compiled graph's Python wrapper, and what is left of the wall time (the Python of the loop; for
the AOTInductor step, its C++ wrapper too, and the cost of recording its kernels). Shares are of the profiled
wall time, from builds that record each kernel as an event: they run slower (the AOT step by about half, shown
as "rest"). The unprofiled time per token comes from the builds a user runs, the best of three rounds, the two
steps taking turns in each. Results go to docs/speed/profile@KIND.json. Not a test.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

from results import Record

PARTS = ("products", "attention", "elementwise", "guards", "wrapper", "rest")
STEPS = {"threads": True, "aot": "aot"}  # the record's key for each step: the door's `compile`


def part(name: str) -> str | None:
    """Which part of a token's time a profiler event is (None: an event that only contains others)."""
    if name in ("lumen::q4_1_row", "lumen::q8_0_row", "aoti_torch_cpu_q4_1_row", "aoti_torch_cpu_q8_0_row", "aten::mm",
                "aten::addmm", "lumen::onednn_linear"):
        return "products"
    if name in ("lumen::attend_one", "aoti_torch_cpu_attend_one"):
        return "attention"
    if name.startswith("graph_"):
        return "attention" if "softmax" in name else "elementwise"
    if name == "TorchDynamo Cache Lookup":
        return "guards"
    if name.startswith(("## Call CompiledFxGraph", "Pregraph", "AOTDispatcher", "Torch-Compiled Region", "aten::")):
        return "wrapper"
    return None


def profile(threads: int, n: int) -> dict[str, dict]:
    """{record key: that step's profile} at this thread count."""
    import torch
    import torch._inductor.config as inductor
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from lumen import fast
    from lumen.attention import KVCache

    torch.set_num_threads(threads)
    loaded = fast.load_quantized("smollm2")
    model = loaded.model
    ids = torch.tensor([loaded.tokenizer.encode("The capital of France is")])

    def run(step, k: int, cache: KVCache) -> float:
        t = time.perf_counter()
        for _ in range(k):
            step(torch.tensor([[42]]), cache=cache)
        return (time.perf_counter() - t) / k

    def prompted() -> KVCache:  # the prompt's keys in a fresh cache (its prefill is not a step)
        cache = KVCache(model.cfg, 1, 256)
        model(ids, cache=cache)
        return cache

    def built(profiled: bool) -> dict:
        """Each step, compiled (or loaded) with inductor's kernels recorded as profiler events or not: a build
        that records them runs slower even with no profiler listening (the AOT step by about half), so the
        unprofiled times come from builds that do not."""
        inductor.cpp.enable_kernel_profile = profiled
        torch._dynamo.reset()  # (torch.compile's step compiles again, as this build)
        steps = {key: fast.Decoder(model, compile).step for key, compile in STEPS.items()}
        for step in steps.values():
            run(step, 4, prompted())  # compiles (or loads)
        return steps

    with torch.inference_mode(), fast.decoding(model, compile=True):
        steps = built(profiled=False)
        plain: dict[str, list[float]] = {key: [] for key in steps}
        for _ in range(3):  # the steps take turns: a machine that slows down slows both
            for key, step in steps.items():
                plain[key].append(run(step, n, prompted()))
        out = {}
        try:
            for key, step in built(profiled=True).items():
                cache = prompted()
                with torch_profile(activities=[ProfilerActivity.CPU]) as p:
                    wall = run(step, n, cache)
                ms = dict.fromkeys(PARTS, 0.0)
                events = sorted(p.key_averages(), key=lambda e: -e.self_cpu_time_total)
                top = {e.key[:60]: round(e.self_cpu_time_total / 1000 / n, 3) for e in events[:12]}
                for e in events:
                    where = part(e.key)
                    if where is not None:
                        ms[where] += e.self_cpu_time_total / 1000 / n
                ms["rest"] = max(0.0, 1000 * wall - sum(ms.values()))
                out[key] = {"ms_per_token": 1000 * wall, "unprofiled_ms_per_token": 1000 * min(plain[key]),
                            "parts_ms": ms, "top_events_ms": top, "load": os.getloadavg()[0]}
        finally:
            inductor.cpp.enable_kernel_profile = False
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default=None, help="thread counts (default 1 up to every core)")
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    threads = [int(t) for t in args.threads.split(",")] if args.threads else list(range(1, (os.cpu_count() or 1) + 1))
    with Record("profile") as rec:
        measured = {str(t): profile(t, args.tokens) for t in threads}
        for key in STEPS:  # "threads": torch.compile's step, as the record always held it
            rec[key] = {t: m[key] for t, m in measured.items()}
    for key in STEPS:
        for t, r in rec[key].items():
            shares = ", ".join(f"{k} {v / r['ms_per_token']:.0%}" for k, v in r["parts_ms"].items())
            print(f"{'aot' if key == 'aot' else 'compiled'}, {t} threads: {r['ms_per_token']:.1f} ms/token "
                  f"profiled ({r['unprofiled_ms_per_token']:.1f} not): {shares}")


if __name__ == "__main__":
    main()
