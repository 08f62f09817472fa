"""One training step (forward, backward, AdamW) of the same GPT-2-shaped model in lumen and in Hugging Face
`GPT2LMHeadModel`, fp32 and bf16 autocast, with and without torch.compile, in one run.

    .venv/bin/python bench/bench_train.py [--layers 6 --d-model 384 --context 256 --batch 8] [--steps 8]
                                          [--repeats 3] [--no-compile] [--device cpu|cuda] [--threads N]

The default shape is nanoGPT's character-level Shakespeare model. Both models get the same config (through
lumen.formats.hf.config_to_hf), the same seed, the same batch and the same optimizer (lumen's: fused AdamW,
decay on matrices). Each setting runs in its own subprocess, where lumen and HF take turns: it prints
tokens/s (the best of --repeats rounds of --steps steps each: the machine may be shared), MFU against
the matmul peak measured in that subprocess in that dtype, and the peak memory of a step's tensors above the
weights and optimizer state (activations, gradients, temporaries: from the profiler's record of every
allocation on CPU, max_memory_allocated on CUDA). lumen's step is its training loop's (lumen.train.loop: the
same compile options, settings and attention path); HF's is torch.compile's defaults. Goals: bf16 >= 1.5x
the best HF setting, fp32 no slower than HF, peak memory no higher. The results go to docs/speed/train@KIND.json
(bench/results.py), which bench/speed_doc.py renders into docs/speed.md. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
import warnings

from results import Record  # bench/results.py: the table docs/speed.md renders (this script's folder is on sys.path)


def build(impl: str, args: argparse.Namespace):
    """(model, a function (x) -> loss) for lumen or HF, from the same ModelConfig."""
    import torch

    from lumen import GPT, ModelConfig

    cfg = ModelConfig(name="bench", vocab_size=args.vocab, context=args.context, d_model=args.d_model,
                      n_layers=args.layers, n_heads=args.d_model // 64)
    torch.manual_seed(0)
    if impl == "lumen":
        model = GPT(cfg)
        return cfg, model, lambda x: model(x[:, :-1], x[:, 1:])[1]
    from transformers import GPT2Config, GPT2LMHeadModel

    from lumen.formats.hf import config_to_hf

    hf_cfg = GPT2Config(**config_to_hf(cfg))
    model = GPT2LMHeadModel._from_config(hf_cfg, attn_implementation="sdpa")  # its fastest attention on CPU
    return cfg, model, lambda x: model(input_ids=x[:, :-1], labels=x[:, :-1]).loss


def contender(impl: str, bf16: bool, compiled: bool, args: argparse.Namespace):
    """(model config, a function that takes one training step, the process-wide settings its steps run in)
    for lumen or HF. lumen's settings are its training loop's, which hold for a whole run: here they hold
    for each round of steps, so HF's rounds run on the process's own (but for glibc's mmap threshold, which
    lumen.runtime.heap leaves fixed at 32 MiB, where glibc's own would move to as HF's buffers are freed)."""
    import torch

    from lumen.runtime.compiling import COMPILE_OPTIONS
    from lumen.train import TrainConfig
    from lumen.train.loop import run_settings, training_attention
    from lumen.train.optim import make_optimizer

    device = torch.device(args.device)
    cfg, model, loss_of = build(impl, args)
    model.to(device).train()
    opt = make_optimizer(model, 1e-4, 0.1, (0.9, 0.95))
    if impl == "lumen":  # as lumen.train.loop takes a step: its compile options, settings and attention path
        fwd = torch.compile(loss_of, options=COMPILE_OPTIONS) if compiled else loss_of
        run = TrainConfig(device=args.device, compile=compiled, threads=args.threads, save=False)
        settings = lambda: run_settings(run)  # noqa: E731
        attention = lambda: training_attention(model, compiled, bf16)  # noqa: E731
    else:
        fwd = torch.compile(loss_of) if compiled else loss_of
        settings = attention = contextlib.nullcontext
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=g).to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16), attention():
            loss = fwd(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return cfg, step, settings


def measure(dtype: str, compiled: bool, args: argparse.Namespace) -> list[dict]:
    """Run in a fresh process: HF's and lumen's steps in this setting, timed in alternating rounds (drift in
    the machine's speed hits both alike), args.repeats rounds of args.steps steps each."""
    import torch

    from lumen.train.speed import matmul_peak, training_flops_per_token

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    bf16 = dtype == "bfloat16"
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    steps, settings, peaks, best = {}, {}, {}, {}
    for impl in ("hf", "lumen"):
        cfg, steps[impl], settings[impl] = contender(impl, bf16, compiled, args)
        with settings[impl]():
            for _ in range(3 if compiled else 2):  # warm-up: compilation, optimizer state, allocator
                steps[impl]()
            sync()
            peaks[impl], best[impl] = step_memory(steps[impl], device), 0.0
    for _ in range(args.repeats):
        for impl, step in steps.items():
            with settings[impl]():
                t = time.perf_counter()
                for _ in range(args.steps):
                    step()
                sync()
                best[impl] = max(best[impl], args.steps * args.batch * args.context / (time.perf_counter() - t))
    flops = training_flops_per_token(cfg, args.context)
    mm_peak = matmul_peak(device, torch.bfloat16 if bf16 else torch.float32)
    return [{"impl": impl, "dtype": dtype, "compiled": compiled, "tokens_per_s": best[impl],
             "mfu": best[impl] * flops / mm_peak, "peak_mib": peaks[impl] / 2**20,
             "matmul_peak_tflops": mm_peak / 1e12} for impl in steps]


def step_memory(step, device) -> int:
    """Peak bytes of tensors alive during one step, above those alive before it (weights, optimizer state)."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    # every allocation and free of the step, replayed in order (the resident size would also count the
    # allocator's cached pages and the compiler's own memory)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True,
                                record_shapes=True, with_stack=True) as prof:
        step()
    with tempfile.NamedTemporaryFile(suffix=".json") as f, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated for CUDA, where memory snapshots replace it
        prof.export_memory_timeline(f.name, device="cpu")
        with open(f.name) as timeline:
            _, sizes = json.load(timeline)
    live = [sum(s) for s in sizes]
    return max(live) - live[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--d-model", type=int, default=384)
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--vocab", type=int, default=65)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile settings (slow to compile)")
    p.add_argument("--only", help=argparse.SUPPRESS)  # dtype,compiled: run one setting, print JSON
    args = p.parse_args()
    if args.only:
        dtype, compiled = args.only.split(",")
        print(json.dumps(measure(dtype, compiled == "1", args)))
        return

    settings = [(d, c) for c in ([False] if args.no_compile else [False, True]) for d in ("float32", "bfloat16")]
    with Record("train") as rec:
        rec.update(layers=args.layers, d_model=args.d_model, context=args.context, batch=args.batch,
                   steps=args.steps, repeats=args.repeats, device=args.device)
        rec["rows"] = compare(settings, args)


def compare(settings: list[tuple[str, bool]], args: argparse.Namespace) -> list[dict]:
    """Each setting in its own subprocess; prints the table and the goals, returns the rows."""
    rows = []
    print(f"training step, {args.layers} layers x {args.d_model} wide, context {args.context}, batch {args.batch}, "
          f"{args.device}; best of {args.repeats} x {args.steps} steps", flush=True)
    for dtype, compiled in settings:
        cmd = [sys.executable, __file__, *sys.argv[1:], "--only", f"{dtype},{int(compiled)}"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{dtype} compiled={compiled}: failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        for r in json.loads(done.stdout.strip().splitlines()[-1]):
            rows.append(r)
            mode = "compiled" if compiled else "eager"
            print(f"  {r['impl']:<6}{dtype:<10}{mode:<10}{r['tokens_per_s']:>10,.0f} tok/s"
                  f"{r['mfu']:>8.0%} MFU{r['peak_mib']:>9,.0f} MiB peak   (matmul peak "
                  f"{r['matmul_peak_tflops'] * 1e3:,.0f} GFLOP/s)", flush=True)
    best = {}
    for r in rows:
        key = (r["impl"], r["dtype"])
        best[key] = max(best.get(key, 0.0), r["tokens_per_s"])
    hf_best = max((v for (i, _), v in best.items() if i == "hf"), default=0.0)
    if hf_best and ("lumen", "bfloat16") in best:
        print(f"lumen bf16 / best HF setting: {best[('lumen', 'bfloat16')] / hf_best:.2f}x   (goal >= 1.5x)")
    if ("hf", "float32") in best and ("lumen", "float32") in best:
        ratio = best[("lumen", "float32")] / best[("hf", "float32")]
        print(f"lumen fp32 / HF fp32:         {ratio:.2f}x   (goal >= 1)")
    for dtype, compiled in settings:
        pair = {r["impl"]: r for r in rows if r["dtype"] == dtype and r["compiled"] == compiled}
        if len(pair) == 2:
            print(f"peak memory {dtype} {'compiled' if compiled else 'eager'}: lumen {pair['lumen']['peak_mib']:,.0f} "
                  f"MiB vs HF {pair['hf']['peak_mib']:,.0f} MiB")
    return rows


if __name__ == "__main__":
    main()
