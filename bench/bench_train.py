"""One training step (forward, backward, AdamW) of the same GPT-2-shaped model in lumen and in Hugging Face
`GPT2LMHeadModel`, fp32 and bf16 autocast, with and without torch.compile, in one run.

    .venv/bin/python bench/bench_train.py [--layers 6 --d-model 384 --context 256 --batch 8] [--steps 8]
                                          [--repeats 3] [--no-compile] [--device cpu|cuda] [--threads N]

The default shape is nanoGPT's character-level Shakespeare model. Both models get the same config (through
lumen.formats.hf.config_to_hf), the same seed, the same batch and the same optimizer (lumen's: fused AdamW,
decay on matrices). Each setting runs in its own subprocess, so that peak memory is that setting's alone.
It prints tokens/s (the best of --repeats timings of --steps steps: the machine may be shared), MFU against
the matmul peak measured in that subprocess in that dtype, and the peak extra memory of a step above the
weights and optimizer state (Linux VmHWM on CPU, max_memory_allocated on CUDA). Goals: bf16 >= 1.5x the
best HF setting, fp32 no slower than HF, peak memory no higher. Not a test.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import rss  # bench/rss.py (the script's own folder is on sys.path)


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


def measure(impl: str, dtype: str, compiled: bool, args: argparse.Namespace) -> dict:
    """Run in a fresh process: time args.steps training steps, args.repeats times."""
    import torch

    from lumen.train.optim import make_optimizer
    from lumen.train.speed import matmul_peak, training_flops_per_token

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cfg, model, loss_of = build(impl, args)
    model.to(device).train()
    opt = make_optimizer(model, 1e-4, 0.1, (0.9, 0.95), device)
    fwd = torch.compile(loss_of) if compiled else loss_of
    bf16 = dtype == "bfloat16"
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=g).to(device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = fwd(x)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    base, best = current_memory(device), 0.0  # weights only: before any step
    reset_peak(device)
    for _ in range(3 if compiled else 2):  # warm-up: compilation, optimizer state, allocator
        step()
    sync()
    for _ in range(args.repeats):
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync()
        best = max(best, args.steps * args.batch * args.context / (time.perf_counter() - t))
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if torch.is_tensor(t))
    peak = peak_memory(device) - base - state  # activations, gradients, temporaries of one step
    flops = training_flops_per_token(cfg, args.context)
    mm_peak = matmul_peak(device, torch.bfloat16 if bf16 else torch.float32)
    return {"impl": impl, "dtype": dtype, "compiled": compiled, "tokens_per_s": best,
            "mfu": best * flops / mm_peak, "peak_mib": peak / 2**20, "matmul_peak_tflops": mm_peak / 1e12}


def current_memory(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    return rss.status_kib("VmRSS") * 1024


def reset_peak(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    else:
        rss.reset_peak()  # VmHWM, the resident-memory high-water mark


def peak_memory(device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return rss.status_kib("VmHWM") * 1024


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
    p.add_argument("--only", help=argparse.SUPPRESS)  # impl,dtype,compiled: run one setting, print JSON
    args = p.parse_args()
    if args.only:
        impl, dtype, compiled = args.only.split(",")
        print(json.dumps(measure(impl, dtype, compiled == "1", args)))
        return

    settings = [(d, c) for c in ([False] if args.no_compile else [False, True]) for d in ("float32", "bfloat16")]
    rows = []
    print(f"training step, {args.layers} layers x {args.d_model} wide, context {args.context}, batch {args.batch}, "
          f"{args.device}; best of {args.repeats} x {args.steps} steps", flush=True)
    for dtype, compiled in settings:
        for impl in ("hf", "lumen"):
            cmd = [sys.executable, __file__, *sys.argv[1:], "--only", f"{impl},{dtype},{int(compiled)}"]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                print(f"{impl} {dtype} compiled={compiled}: failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(r)
            print(f"  {impl:<6}{dtype:<10}{'compiled' if compiled else 'eager':<10}{r['tokens_per_s']:>10,.0f} tok/s"
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


if __name__ == "__main__":
    main()
