"""Speed on a busy machine: the default training step, a compiled decoding loop and SmolLM2 decoded from its
GGUF's blocks by the step compiled ahead of time, alone and beside N busy processes that this bench starts itself
(N = 1, 2, number of cores), each with all cores' threads fixed (torch's default) and with lumen's measured
thread count (lumen.runtime.threads.ThreadTuner, what `lumen train` does when threads = 0, and the door's decoding).

    .venv/bin/python bench/bench_contention.py [--seconds 4] [--rounds 2] [--only train|decode|decode-aot]

A busy process is one Python interpreter spinning (`while True: pass`). Rounds visit the settings in turn
(quiet, N=1, N=2, ...; fixed and tuned one after the other in each), so drift in the machine's own load
reaches all alike; each setting reports the median of its rounds, as a fraction of the fixed policy's quiet
speed (the speed before lumen measured its threads) and of the fair share: quiet x (cores we could get) /
cores, where the cores we could get are the larger of the cores left idle (cores - N) and an equal share
(cores / (N + 1)). Goals: >= 0.8x the fair share at every N;
>= 0.4x quiet with two busy processes on two cores. The machine's load average is printed with each round:
on a shared machine "quiet" is only as quiet as the others let it be. The results go to
docs/speed/contention@KIND.json (bench/results.py), which bench/speed_doc.py renders into docs/speed.md. Not a test.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time

from results import Record  # bench/results.py: the table docs/speed.md renders (this script's folder is on sys.path)


def busy(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def training_step():
    """(a function that takes one step of the default preset's training, tokens per step)."""
    from lumen.train import load_config
    from lumen.train.loop import Trainer

    cfg, model_cfg = load_config(preset="shakespeare", sets=["save=false", "progress=false"])
    trainer = Trainer(cfg, model_cfg, None)
    return trainer.train_step, cfg.windows_per_step * trainer.T


def decoding_step():
    """(a function that decodes one token with a compiled step, 1): a random baby-llama, packed, greedy."""
    import torch

    from lumen import GPT, ModelConfig
    from lumen.fast.decoding import Decoder
    from lumen.fast.packing import fast_linears

    torch.manual_seed(0)
    model = GPT(ModelConfig.from_name("baby-llama")).eval()
    fast_linears(model)  # (what lumen.fast.decoding does on entering; this bench times its own steps)
    return one_token(model, torch.zeros(1, 8, dtype=torch.long), Decoder(model, compile=True).step), 1


def one_token(model, prompt, decode_step):
    """A function that decodes one more greedy token through decode_step, and starts again from the prompt
    when the 256-slot cache is full."""
    from lumen.decode import GREEDY, tokens

    state = {"steps": iter(())}

    def step() -> None:
        try:
            next(state["steps"])
        except StopIteration:
            state["steps"] = tokens(model, prompt, 240, GREEDY, step=decode_step, cache_slots=256)
            next(state["steps"])

    return step


def aot_decoding_step(stack: contextlib.ExitStack):
    """(a function that decodes one token, 1): SmolLM2 from its GGUF's blocks through the door's step compiled
    ahead of time (`compile="aot"`, its package built before the rounds), greedy; the door stays open on stack."""
    import torch

    from lumen import fast

    loaded = fast.load_quantized("smollm2")
    model = loaded.model
    stack.enter_context(torch.inference_mode())
    decoder = stack.enter_context(fast.decoding(model, compile="aot"))
    prompt = torch.tensor([loaded.tokenizer.encode("The capital of France is")])
    return one_token(model, prompt, decoder.step), 1


def rate(step, per_step: int, seconds: float, tuner) -> float:
    n, t_start = 0, time.perf_counter()
    while time.perf_counter() - t_start < seconds or n < 3:
        t0 = time.perf_counter()
        step()
        if tuner is not None:
            tuner.record(time.perf_counter() - t0)
        n += 1
    return n * per_step / (time.perf_counter() - t_start)


def measure(name: str, step, per_step: int, args: argparse.Namespace) -> dict:
    """Prints the table; returns {"title", "cores", "threads", "loads": [per round, per setting], "rows":
    [{"busy", "fair", "fixed", "tuned"}]}: median tokens/s, and the fair share's tokens/s."""
    import torch

    from lumen.runtime.threads import ThreadTuner

    cores = os.cpu_count() or 1
    all_threads = torch.get_num_threads()
    tuner = ThreadTuner(most=all_threads, skip=0)  # one tuner for the whole run, as in a long run
    for n in tuner.choices:  # compile (once per thread count: torch.compile guards on it), warm caches
        torch.set_num_threads(n)
        for _ in range(3):
            step()
    tuner.used.update(tuner.choices)  # so its first step at each count is counted like any other
    torch.set_num_threads(all_threads)
    settings = sorted({0, 1, 2, cores})
    speeds: dict[tuple[int, str], list[float]] = {}
    round_loads = []
    for r in range(args.rounds):
        loads = []
        for n in settings:
            procs = busy(n)
            time.sleep(0.3)
            try:
                torch.set_num_threads(all_threads)
                speeds.setdefault((n, "fixed"), []).append(rate(step, per_step, args.seconds, None))
                torch.set_num_threads(tuner.chosen)
                speeds.setdefault((n, "tuned"), []).append(rate(step, per_step, args.seconds, tuner))
            finally:
                stop(procs)
            loads.append(round(os.getloadavg()[0], 2))
        round_loads.append(loads)
        print(f"{name} round {r + 1}: load average "
              + ", ".join(f"N={n}: {x:.1f}" for n, x in zip(settings, loads)), file=sys.stderr, flush=True)
    torch.set_num_threads(all_threads)
    quiet = statistics.median(speeds[(0, "fixed")])
    unit = "tok/s"
    print(f"\n{name} ({cores} cores, {all_threads} threads fixed; medians of {args.rounds} rounds of "
          f"{args.seconds:g} s)")
    print(f"| busy processes | policy | {unit} | x quiet (fixed) | x fair share |")
    print("|---|---|---|---|---|")
    rows = []
    for n in settings:
        fair = quiet * max(cores - n, cores / (n + 1)) / cores
        row = {"busy": n, "fair": fair}
        for policy in ("fixed", "tuned"):
            row[policy] = s = statistics.median(speeds[(n, policy)])
            print(f"| {n} | {policy} | {s:,.0f} | {s / quiet:.2f} | {s / fair:.2f} |")
        rows.append(row)
    return {"title": name, "cores": cores, "threads": all_threads, "loads": round_loads, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each measurement")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", choices=("train", "decode", "decode-aot"), default=None)
    args = ap.parse_args()
    import warnings

    warnings.filterwarnings("ignore")
    from lumen.train import load_config
    from lumen.train.loop import run_settings

    with Record("contention") as rec:
        rec.update(seconds=args.seconds, rounds=args.rounds)
        if args.only in (None, "train"):
            cfg, _ = load_config(preset="shakespeare", sets=["save=false", "progress=false"])
            with run_settings(cfg):  # what `lumen train` runs under (deterministic mode when compiled)
                rec["train"] = measure("training step (preset shakespeare, compiled)", *training_step(), args)
        if args.only in (None, "decode"):
            rec["decode"] = measure("compiled decoding (baby-llama, one token per step)", *decoding_step(), args)
        if args.only in (None, "decode-aot"):
            with contextlib.ExitStack() as stack:
                rec["decode_aot"] = measure("SmolLM2 decoded from its blocks, the step compiled ahead of time",
                                            *aot_decoding_step(stack), args)


if __name__ == "__main__":
    main()
