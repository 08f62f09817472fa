"""SmolLM2-135M on this machine's CPU: lumen against Hugging Face transformers, in the same run.

    .venv/bin/python bench/bench_smollm2.py [--decode 128] [--prefill 512] [--repeats 3] [--threads N]
                                           [--dtypes float32 bfloat16]

Both load the same GGUF file and run greedy decoding with a KV cache. For each dtype it prints
  prefill  tokens/s of one forward pass over a 512-token prompt (all logits, as both models compute them)
  decode   tokens/s of greedy decoding of 128 new tokens after a short prompt (KV cache; prefill included)
  memory   the weights' bytes (with packed copies), and the peak extra resident memory (Linux VmHWM)
for lumen eager and compiled, both through the speed wing's door as `lumen generate` runs them
(`lumen.fast.decoding(model, compile)`: its step for the prefill, its generate for decoding; the time to compile
is printed, not counted), and the ratios lumen/HF, by wall time and by CPU time; the goals
are decode >= 2x HF fp32, bf16 weights >= 3x HF fp32, prefill >= 1.2x.
The results go to docs/speed/smollm2@KIND.json (bench/results.py), which bench/speed_doc.py renders into
docs/speed.md. Timings are medians over --repeats rounds that take lumen eager, lumen compiled and HF in turn
(the machine may be shared: run it twice). On a machine shared by more busy processes than cores,
--threads 1 gives steadier numbers: a multi-threaded op then waits for a second core to be scheduled.
Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time

import torch

from lumen import fast
from lumen.runtime import cpu
from results import Record  # bench/results.py: the table docs/speed.md renders
from rss import reset_peak, status_kib  # bench/rss.py (the script's own folder is on sys.path)

PROMPT = "Once upon a time, in a small village by the sea, there lived"
FILLER = (
    "The residual stream is a working memory: attention heads copy facts between positions, MLPs read "
    "patterns and write conclusions, and the last layers turn them into a prediction of the next token. "
)


def timed(contenders: dict, repeats: int) -> dict[str, dict[str, tuple[float, float, float]]]:
    """{contender: {task: (median wall seconds, median CPU seconds of this process, peak extra MiB)}}: each
    contender is (a context to run inside, e.g. lumen.fast's door, entered once per round outside the timing;
    {task: fn}). The rounds take the contenders in turn, so a machine that slows down or speeds up midway
    affects them alike; each task is run once untimed first; CPU time counts only the work done."""
    walls = {name: {task: [] for task in tasks} for name, (_, tasks) in contenders.items()}
    cpus = {name: {task: [] for task in tasks} for name, (_, tasks) in contenders.items()}
    peak = {name: dict.fromkeys(tasks, 0.0) for name, (_, tasks) in contenders.items()}
    for r in range(repeats + 1):
        for name, (context, tasks) in contenders.items():
            with context():
                for task, fn in tasks.items():
                    base = status_kib("VmRSS")
                    reset_peak()
                    t, c = time.perf_counter(), time.process_time()
                    fn()
                    if r:  # round 0 warms up
                        walls[name][task].append(time.perf_counter() - t)
                        cpus[name][task].append(time.process_time() - c)
                        peak[name][task] = max(peak[name][task], (status_kib("VmHWM") - base) / 1024)
    return {name: {task: (statistics.median(walls[name][task]), statistics.median(cpus[name][task]),
                          peak[name][task]) for task in tasks} for name, (_, tasks) in contenders.items()}


def weights_mib(model: torch.nn.Module) -> float:
    """Parameters (a tied matrix once), in MiB."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    for m in model.modules():
        packed = getattr(m, "_packed", None)
        if packed is not None:
            total += packed.numel() * packed.element_size()
    return total / 2**20


def load_both(dtype: torch.dtype):
    import transformers

    from lumen.fetch import fetch
    from lumen.formats import load

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    path = fetch("smollm2")
    lumen = load("smollm2", dtype=dtype)
    with contextlib.redirect_stderr(io.StringIO()):  # transformers' GGUF progress bar
        hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype).eval()
    assert all(p.dtype == dtype for p in hf.parameters()), "HF kept quantized weights: not a like-for-like run"
    return lumen.model, lumen.tokenizer, hf


@torch.inference_mode()
def bench(dtype: torch.dtype, n_prefill: int, n_decode: int, repeats: int) -> dict:
    model, tok, hf = load_both(dtype)
    long_ids = tok.encode(FILLER * (n_prefill // 20 + 1))[:n_prefill]
    prompt = torch.tensor([long_ids])
    short = torch.tensor([tok.encode(PROMPT)])
    eos = tok.eos_id

    doors: dict[str, fast.Decoder] = {}

    @contextlib.contextmanager
    def door(compile: bool):  # lumen.fast's door, as `lumen generate` decodes
        with fast.decoding(model, compile) as decoder:
            doors["compiled" if compile else "eager"] = decoder
            yield

    def lumen_decode(compile: bool = False):
        return doors["compiled" if compile else "eager"].generate(short, n_decode, temperature=0)

    t = time.perf_counter()
    with door(compile=True):  # compiles the one-token step and the prefill
        lumen_decode(compile=True), doors["compiled"].step(prompt)
    compile_s = time.perf_counter() - t

    def hf_decode():
        return hf.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=n_decode,
                           min_new_tokens=n_decode, do_sample=False, pad_token_id=eos)

    contenders = {
        "lumen": (lambda: door(False), {"prefill": lambda: doors["eager"].step(prompt), "decode": lumen_decode}),
        "lumen-compiled": (lambda: door(True), {"prefill": lambda: doors["compiled"].step(prompt),
                                                "decode": lambda: lumen_decode(True)}),
        "hf": (contextlib.nullcontext, {"prefill": lambda: hf(prompt, use_cache=False), "decode": hf_decode}),
    }
    times = timed(contenders, repeats)
    pre, dec = {who: t["prefill"] for who, t in times.items()}, {who: t["decode"] for who, t in times.items()}
    prefills = contenders
    out = {}
    for who in prefills:
        (t_pre, c_pre, mem_pre), (t_dec, c_dec, mem_dec) = pre[who], dec[who]
        print(f"  {dtype} {who}: prefill {n_prefill / t_pre:.1f} tok/s ({n_prefill / c_pre:.1f} per CPU-second), "
              f"decode {n_decode / t_dec:.1f} tok/s ({n_decode / c_dec:.1f} per CPU-second)", flush=True)
        out[who] = {"prefill_tok_s": n_prefill / t_pre, "decode_tok_s": n_decode / t_dec,
                    "prefill_tok_cpu_s": n_prefill / c_pre, "decode_tok_cpu_s": n_decode / c_dec,
                    "weights_mib": weights_mib(hf if who == "hf" else model),
                    "peak_extra_mib_prefill": mem_pre, "peak_extra_mib_decode": mem_dec}
    # HF's greedy tokens up to where it stops (its timed runs were held to n_decode tokens, past an end token)
    theirs = hf.generate(short, attention_mask=torch.ones_like(short), max_new_tokens=n_decode, do_sample=False,
                         pad_token_id=eos)[0, short.size(1):].tolist()
    out["same_tokens"] = {}
    for who, compile in (("lumen", False), ("lumen-compiled", True)):
        with door(compile):
            out["same_tokens"][who] = lumen_decode(compile)[0, short.size(1):].tolist()[: len(theirs)] == theirs
    out["compile_s"] = compile_s
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefill", type=int, default=512)
    p.add_argument("--decode", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(cpu.machine(versions=True))
    with Record("smollm2") as rec:
        rec.update(prefill=args.prefill, decode=args.decode, repeats=args.repeats, threads=torch.get_num_threads())
        rec["dtypes"] = results = {name: bench(getattr(torch, name), args.prefill, args.decode, args.repeats)
                                   for name in args.dtypes}
    hf32 = results.get("float32", {}).get("hf")
    print(f"\n{'':10}{'who':15}{'prefill tok/s':>15}{'decode tok/s':>14}{'weights MiB':>13}"
          f"{'peak+ prefill':>15}{'peak+ decode':>14}")
    for name, r in results.items():
        for who in ("lumen", "lumen-compiled", "hf"):
            m = r[who]
            print(f"{name:10}{who:15}{m['prefill_tok_s']:>15.1f}{m['decode_tok_s']:>14.1f}{m['weights_mib']:>13.0f}"
                  f"{m['peak_extra_mib_prefill']:>15.0f}{m['peak_extra_mib_decode']:>14.0f}")
        hf = r["hf"]
        for who in ("lumen", "lumen-compiled"):
            lu = r[who]
            for unit, sfx in (("wall", "_s"), ("CPU", "_cpu_s")):
                pre, dec = "prefill_tok" + sfx, "decode_tok" + sfx
                print(f"{name:10}{who}/HF ({unit:4}): prefill {lu[pre] / hf[pre]:.2f}x, "
                      f"decode {lu[dec] / hf[dec]:.2f}x"
                      + (f", decode vs HF float32 {lu[dec] / hf32[dec]:.2f}x" if hf32 else ""))
        print(f"{name:10}greedy tokens identical to HF: {r['same_tokens']}; compiling took {r['compile_s']:.0f} s")


if __name__ == "__main__":
    main()
