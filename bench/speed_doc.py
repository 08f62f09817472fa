"""Render the measured sections of docs/speed.md from the benches' results (docs/speed/*.json, bench/results.py).

    .venv/bin/python bench/speed_doc.py [--page docs/speed.md] [--results docs/speed]   # `make bench` runs it last

The page's prose is written by hand; each measured section sits between two markers,
`<!-- measured: NAME -->` and `<!-- end: NAME -->`, and is rewritten from docs/speed/NAME@KIND.json: one table
per kind of machine measured (AMX, AVX-512, AVX2-only, ARM64: results.KINDS); a bench that never ran leaves a
line saying which command fills it. Every table names its machine, the load average
before and after, the date and the command. Not a test.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results import KINDS, RESULTS, kind, read_all

PAGE = Path(__file__).resolve().parent.parent / "docs" / "speed.md"


def provenance(r: dict[str, Any]) -> str:
    m = r["machine"]
    flags = ", ".join(m["flags"]) or "none of the flags that choose kernels"
    amx = "AMX" if m["amx"] else "no AMX"
    return (f"Measured {r['date']} by `{r['command']}` on a {m['cores']}-core {m['cpu']} "
            f"({m.get('arch', 'x86_64')}: {flags}; {amx}; kind: {KINDS[kind(m)]}), "
            f"torch {m['torch']}; load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after.")


def llamacpp(r: dict[str, Any]) -> str:
    threads = [str(t) for t in r["thread_counts"]]
    depths = [str(d) for d in r.get("depths", [0])]  # (older records: after a short prompt only)
    anchor = next(row for row in r["rows"] if row["anchor"])

    def decode(row: dict, t: str, d: str) -> float | None:
        cells = row["threads"][t]
        return cells.get("decode_by_depth", {}).get(d, cells.get("decode_tok_s") if d == depths[0] else None)

    plural = {t: f"{t} thread{'s' * (t != '1')}" for t in threads}
    head = ["contender"] + [f"decode, {plural[t]}" + (f", after {d} tokens" if d != "0" else "")
                            for d in depths for t in threads]
    head += [f"prefill {r['prompt']}, {t}t" for t in threads] + ["max RSS"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        cells = [f"**{row['contender']}**" if row["anchor"] else row["contender"]]
        for d in depths:
            for t in threads:
                x, base = decode(row, t, d), decode(anchor, t, d)
                cells.append("" if x is None else f"{x:.1f} tok/s" + ("" if row["anchor"] or not base
                                                                     else f" (**{x / base:.2f}x**)"))
        for t in threads:
            x, base = row["threads"][t].get("prefill_tok_s"), anchor["threads"][t].get("prefill_tok_s")
            cells.append("" if x is None else f"{x:.0f} tok/s" + ("" if row["anchor"] or not base
                                                                   else f" ({x / base:.2f}x)"))
        rss = row["max_rss_mib"]
        cells.append(f"{rss:,.0f} MiB" + ("" if row["anchor"] or not anchor["max_rss_mib"]
                                          else f" ({rss / anchor['max_rss_mib']:.2f}x)"))
        lines.append("| " + " | ".join(cells) + " |")
    text = [f"{r['model']}, greedy, {r['tokens']} new tokens, medians of {r['rounds']} rounds (contenders taking "
            "turns in every round); x: against the first row. Goals: decoding from the blocks >= 1.5x at every "
            "thread count" + (" and depth" if len(depths) > 1 else "") + ", max RSS <= 2x.", "", *lines]
    if "from" in anchor:  # the anchor is llama.cpp's best, cell by cell
        empty = [row["contender"] for row in r["rows"] if row["contender"].startswith("llama.cpp native")
                 and not row["threads"][threads[0]].get("prefill_tok_s")]
        text += ["", "The first row is llama.cpp's best cell by cell: " + "; ".join(
            f"{cell}: {who.removeprefix('llama.cpp native, ')}" for cell, who in anchor["from"].items()) + "."
            + (f" Empty cells: llama-bench failed there ({'; '.join(empty)}: its prompts crash)." if empty else "")]
    if "bandwidth" in r:
        b = r["bandwidth"]
        limit = b["bytes_per_s"] / b["bytes_per_token"]
        best = max(decode(row, threads[-1], depths[0]) or 0 for row in r["rows"] if not row["anchor"])
        text += ["", f"The memory limit: a token reads {b['bytes_per_token'] / 2**20:.0f} MiB of weights; this "
                 f"machine streamed {b['bytes_per_s'] / 1e9:.1f} GB/s in the same run ({b['how']}), so at most "
                 f"{limit:.0f} tokens/s. lumen's best at {threads[-1]} threads: {best / limit:.0%} of it."]
    return "\n".join(text)


def profile(r: dict[str, Any]) -> str:
    parts = list(next(iter(r["threads"].values()))["parts_ms"])
    head = ["step", "threads", "ms per token (profiled / not)"] + parts
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    steps = {"torch.compile": r["threads"], "AOTInductor": r.get("aot", {})}  # (older records: the first only)
    for step, by_threads in steps.items():
        for t, x in by_threads.items():
            cells = [step, t, f"{x['ms_per_token']:.1f} / {x['unprofiled_ms_per_token']:.1f}"]
            cells += [f"{x['parts_ms'][p]:.1f} ({x['parts_ms'][p] / x['ms_per_token']:.0%})" for p in parts]
            lines.append("| " + " | ".join(cells) + " |")
    return ("Decoding SmolLM2 from its GGUF blocks through the door's compiled steps (torch.compile's, and "
            "AOTInductor's: `compile=\"aot\"`), by torch's profiler: products (quant.cpp's kernel), attention "
            "and the other fused kernels, dynamo's guards, the compiled graph's Python wrapper, and the rest "
            "(the loop's Python; for AOTInductor, its C++ wrapper too). The parts come from builds that record "
            "each kernel as a profiler event, which run slower (for AOTInductor, the rest is mostly that cost); "
            "the unprofiled time is the builds a user runs.\n\n" + "\n".join(lines))


def kernel_builds(r: dict[str, Any]) -> str:
    builds = r["builds"]
    now = list(builds)[-1]  # (this tree: the last build)
    rows = [[str(x["threads"]), f"`-march={x['march']}`"]
            + [f"{x['ms'][name]['token_ms']:.1f} / {x['ms'][name]['cpu_ms']:.1f}"
               + ("" if name == now else f" (**{x['ms'][name]['token_ms'] / x['ms'][now]['token_ms']:.2f}x** / "
                                         f"**{x['ms'][name]['cpu_ms'] / x['ms'][now]['cpu_ms']:.2f}x**)")
               for name in builds] + [f"{x['load']:.1f}"] for x in r["products"]]
    said = "; ".join(f"{name}: {what}" for name, what in builds.items() if what)
    return ("quant.cpp's one-row products for one SmolLM2-135M token (its matrices' shapes and kinds, random "
            "blocks), builds for the same instruction set side by side, each in a process of its own, taking "
            f"turns; the best round of each. The commits' AVX2 paths read {said}; this tree's reads a row's "
            "two blocks as one register and adds four rows' sums per block by unpacking. Wall time and the CPU time "
            "the process used, in ms a token (on a busy machine one thread's wall time is mostly the scheduler's "
            "share), and in brackets how many times this tree's each is.\n\n"
            + table(["threads", "built for", *(f"{name}: ms wall / CPU" for name in builds), "load"], rows))


def rounds(n: int, what: str = "round") -> str:
    return f"one {what}" if n == 1 else f"{n} {what}s"


def table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(row) + " |" for row in rows])


def smollm2(r: dict[str, Any]) -> str:
    short = {"float32": "fp32", "bfloat16": "bf16"}
    goals = {("float32", "prefill"): ">= 1.2x", ("float32", "decode"): ">= 2x", ("bfloat16", "decode"): ">= 3x HF fp32"}
    hf32 = r["dtypes"].get("float32", {}).get("hf")
    rows = []
    for dtype, d in r["dtypes"].items():
        for task, n in (("prefill", r["prefill"]), ("decode", r["decode"])):
            key = f"{task}_tok_s"
            best = max(d["lumen"][key], d["lumen-compiled"][key])
            ratio = f"**{best / d['hf'][key]:.2f}x**"
            if dtype != "float32" and task == "decode" and hf32:
                ratio += f"; **{best / hf32[key]:.2f}x HF fp32**"
            rows.append([f"{task} {short[dtype]}, {n} tokens"] + [f"{d[who][key]:,.1f} tok/s" for who in
                                                                  ("lumen", "lumen-compiled", "hf")]
                        + [ratio, goals.get((dtype, task), "")])
    same = "; ".join(f"{short[dtype]} eager {'yes' if d['same_tokens']['lumen'] else 'NO'}, compiled "
                     f"{'yes' if d['same_tokens']['lumen-compiled'] else 'NO'}" for dtype, d in r["dtypes"].items())
    compile_s = ", ".join(f"{d['compile_s']:.0f} s ({short[dtype]})" for dtype, d in r["dtypes"].items())
    return (f"SmolLM2-135M from its GGUF file, both loaded in the dtype named, {r['threads']} threads; "
            f"{'medians of ' * (r['repeats'] != 1)}{rounds(r['repeats'])} (the contenders taking turns); decoding is "
            "greedy with a KV cache after a short prompt, its prefill included; compile time not counted.\n\n"
            + table(["", "lumen eager", "lumen compiled", "HF transformers", "best lumen / HF", "goal"], rows)
            + f"\n\nGreedy tokens the same as HF's: {same}. Compiling took {compile_s}.")


def train(r: dict[str, Any]) -> str:
    short = {"float32": "fp32", "bfloat16": "bf16 autocast"}
    pairs: dict[tuple[str, bool], dict[str, dict]] = {}
    for row in r["rows"]:
        pairs.setdefault((row["dtype"], row["compiled"]), {})[row["impl"]] = row

    def cell(x: dict) -> str:
        return f"{x['tokens_per_s']:,.0f} tok/s, {x['mfu']:.0%} MFU, {x['peak_mib']:,.0f} MiB peak"

    rows = [[f"{short[dtype]} {'compiled' if compiled else 'eager'}", cell(p["lumen"]), cell(p["hf"]),
             f"{p['lumen']['tokens_per_s'] / p['hf']['tokens_per_s']:.2f}x"]
            for (dtype, compiled), p in pairs.items() if len(p) == 2]

    def best(impl: str, dtype: str | None = None) -> float:
        return max((x["tokens_per_s"] for x in r["rows"] if x["impl"] == impl and dtype in (None, x["dtype"])),
                   default=0.0)

    goals = []
    if best("lumen", "bfloat16") and best("hf"):
        goals.append(f"lumen's best bf16 / HF's best setting: **{best('lumen', 'bfloat16') / best('hf'):.2f}x** "
                     "(goal >= 1.5x)")
    if best("lumen", "float32") and best("hf", "float32"):
        goals.append(f"lumen's best fp32 / HF's best fp32: **{best('lumen', 'float32') / best('hf', 'float32'):.2f}x**"
                     " (goal >= 1x, peak memory no higher)")
    return (f"One training step (forward, backward, AdamW) of the same GPT-2-shaped model, {r['layers']}x"
            f"{r['d_model']}, context {r['context']}, batch {r['batch']}, on {r['device']}; best of "
            f"{rounds(r['repeats'])} of {r['steps']} steps, lumen and HF taking turns; peak memory is "
            "that of the step's tensors above the weights and optimizer state.\n\n"
            + table(["", "lumen", "HF `GPT2LMHeadModel`", "lumen / HF"], rows) + "\n\n" + "; ".join(goals) + ".")


def contention(r: dict[str, Any]) -> str:
    parts = [(name, r[key]) for key, name in (("train", "training"), ("decode", "decoding"),
                                              ("decode_aot", "SmolLM2 AOT decoding")) if key in r]
    busy = [row["busy"] for row in parts[0][1]["rows"]]
    cores = parts[0][1]["cores"]
    head = ["busy processes"]
    for name, _ in parts:
        head += [f"{name} fixed / tuned, tok/s", "tuned x quiet / x fair share"]
    rows = []
    for i, n in enumerate(busy):
        cells = [f"{n}" + (" (= the number of cores)" if n == cores else "")]
        for _, b in parts:
            row, quiet = b["rows"][i], b["rows"][0]["fixed"]
            cells += [f"{row['fixed']:,.0f} / {row['tuned']:,.0f}",
                      f"{row['tuned'] / quiet:.2f} / {row['tuned'] / row['fair']:.2f}"]
        rows.append(cells)
    loads = "; ".join(f"{name}: " + ", ".join("/".join(f"{x:.1f}" for x in rnd) for rnd in b["loads"])
                      for name, b in parts)
    what = " and ".join(b["title"] for _, b in parts)
    return (what[:1].upper() + what[1:] + ", alone and beside busy processes (each a Python "
            "loop spinning); \"fixed\" is torch's default of one thread per core, \"tuned\" lumen's ThreadTuner; "
            f"{'medians of ' * (r['rounds'] != 1)}{rounds(r['rounds'])} of {r['seconds']:g} s. Goals: >= 0.8x the "
            f"fair share at every count, >= 0.4x quiet with as many busy processes as cores.\n\n"
            + table(head, rows) + f"\n\nLoad average after each setting, round by round: {loads}.")


def nanogpt(r: dict[str, Any]) -> str:
    rows = [[x["run"], f"{x['steps']:,}" if x["steps"] is not None else "",
             f"{x['tokens'] / 1e6:.2f}M" if x["tokens"] else "", f"{x['nats_per_char']:.3f}"] for x in r["rows"]]
    return ("The main job against nanoGPT's CPU recipe, the same split and one evaluator (every token of the "
            "five held-out works, total nats over characters):\n\n"
            + table(["run", "steps", "tokens seen", "held-out nats/char"], rows))


def train_isa(r: dict[str, Any]) -> str:
    cell = {(x["isa"], x["contender"], x["threads"]): x for x in r["rows"]}
    isas, threads = r["isas"], r["threads"]
    names = {"native": "this CPU's instructions", "avx2": "AVX2 only"}

    def one(x: dict) -> str:
        text = f"{1e3 * x['seconds']:,.1f} ms ({x['tokens'] / x['seconds']:,.0f} tok/s)"
        return f"**{text}**" if x.get("main_jobs_dtype") else text

    rows = [[what] + [one(cell[(i, c, t)]) for i in isas for t in threads]
            + [f"{cell[(isas[-1], c, t)]['seconds'] / cell[(isas[0], c, t)]['seconds']:.2f}x" for t in threads]
            for c, what in r["contenders"].items()]
    return ("A training step of the main job (`make`: its model, batch, optimizer and compiled step, as "
            "`lumen train --preset shakespeare` takes it) and of nanoGPT's CPU recipe (its README's, on random "
            "tokens), each in a process of its own, on this CPU's instructions and held to AVX2 as an AVX2-only CPU "
            "runs them (`common.AVX2_STAND_IN`: lumen's choices, torch's kernels and torch.compile's code); "
            f"medians of {r['steps']} steps, the best of {rounds(r['rounds'])} taking turns. In bold, the dtype the "
            "main job chooses there (`dtype = \"auto\"`: bf16 autocast only where the CPU computes bf16 natively). "
            "The last columns: how many times longer a step takes on AVX2 only.\n\n"
            + table(["step"] + [f"{names.get(i, i)}, {t} thread{'s' * (t > 1)}" for i in isas for t in threads]
                    + [f"AVX2 only / this CPU, {t}t" for t in threads], rows))


def speedrun(r: dict[str, Any]) -> str:
    rows, before = [], None
    for x in r["rows"]:
        gain = "" if before is None else f"{x['nats_per_char'] - before:+.3f}"
        at = x["time_to_milestone"]
        steps_only = f" ({x['step_seconds']:.0f} s)" if "step_seconds" in x else ""
        rows.append([str(x["row"]), x["what"], " ".join(f"`{s}`" for s in x["sets"]) or "(none)",
                     f"{x['steps']:,}", f"{x['tokens'] / 1e6:.1f}M",
                     f"{x['seconds']:.0f} s{steps_only}",
                     "" if at is None else f"{at:.0f} s", f"{x['nats_per_char']:.3f}", gain])
        before = x["nats_per_char"]
    return (f"Each row is the one above it with one change, trained from scratch in its own process (the "
            f"`--set`s turn today's preset into that row); the score is every token of the five held-out works, "
            f"nats per character, by the evaluator nanoGPT's row is scored by. Goal: <= {r['goal']:.2f} within "
            f"{r['budget']:.0f} s of training. The time is the run's, start to end (compiling, the evaluations and "
            f"samples included), and in brackets the optimizer steps' own; \"{r['milestone']:.2f} at\" "
            f"is the run's clock at its first evaluation at or below {r['milestone']:.2f}.\n\n"
            + table(["row", "change", "settings", "steps", "tokens", "training time", f"{r['milestone']:.2f} at",
                     "held-out nats/char", "gain"], rows))


def features(r: dict[str, Any]) -> str:
    g = r["goal"]
    rows = []
    for x in r["rows"]:
        load = x.get("load_average_end")
        # the FVU without massive activations: quality's, else the last evaluation's (held-out activations that
        # held none)
        fvu = x["fvu_typical"] if x.get("fvu_typical") is not None else x.get("fvu_eval", x["fvu"])
        met = (fvu <= g["fvu"] and x["dead"] < g["dead"] and x["ce_recovered"] >= g["ce_recovered"]
               and x["train_seconds"] <= 60 * g["minutes"])
        rows.append([x["name"], x["note"], f"{x['kind']} k={x['k']}, {x['d_sae']:,} latents, batch {x['batch']:,}"
                     f" x {x['steps']:,} steps, reuse {x['reuse']}", f"{x['tokens_read'] / 1e3:,.0f}k",
                     f"{x['train_seconds'] / 60:.1f} min ({x['model_seconds'] / 60:.1f} + {x['sae_seconds'] / 60:.1f})",
                     f"{x['model_tokens_per_s']:,.0f} tok/s" + (f" ({x['model_tokens_per_cpu_s']:,.0f} per CPU-s)"
                                                                 if x.get("model_tokens_per_cpu_s") else ""),
                     f"{load[0]:.0f}" if load else "", f"{x['quiet_seconds_estimate'] / 60:.1f} min",
                     f"{fvu:.3f}" + (f" ({x['fvu']:.3f} with {x['massive']})" if x.get("massive") else
                                     f" ({x['fvu']:.3f} with them)" if x.get("fvu_typical") is None else ""),
                     f"{x['l0']:.1f}", f"{x['dead']:.1%}",
                     f"{x['ce_recovered']:.1%} (+{x['loss_spliced'] - x['loss']:.2f} nats)",
                     f"{x['error_norm']:.3g} / {x['site_norm']:.3g}", "**yes**" if met else "no"])
    return (f"`lumen features train` on {r['rows'][-1]['model']}'s {r['rows'][-1]['site']}, one row a run "
            f"(`bench/features_record.py OUT` adds one). Goal: FVU <= {g['fvu']} at L0 ~ {g['l0']}, dead < "
            f"{g['dead']:.0%}, >= {g['ce_recovered']:.0%} of the cross-entropy recovered, in <= {g['minutes']} minutes "
            "of training on 2 cores. Measured on held-out windows of the validation split, the first position of "
            "each left out (the attention sink: features/quality.py, skip); the cross-entropy recovered is against "
            "zeroing the site. FVU: without the massive activations (a stream 10x the median norm or more, an "
            "attention sink elsewhere than the first position: most of the variance wherever one falls), in "
            "brackets with them and how many (a run whose report predates that measure: its last evaluation's FVU, "
            "on held-out activations that held none); + nats: the loss spliced over the model's own. Training time: "
            "reading activations (the model up to the site) + training the "
            "dictionary, wall-clock; the quiet-machine estimate is the run's CPU seconds over the cores.\n\n"
            + table(["run", "change", "dictionary", "tokens read", "training time (model + SAE)",
                     "model reading", "load", "quiet estimate", "FVU", "L0", "dead", "CE recovered",
                     "error / site norm", "goal met"], rows))


RENDER: dict[str, Callable[[dict[str, Any]], str]] = {
    "llamacpp": llamacpp, "llamacpp_avx2": llamacpp,
    "profile": profile, "smollm2": smollm2, "train": train, "contention": contention,
    "nanogpt": nanogpt, "train_isa": train_isa, "speedrun": speedrun, "kernel_builds": kernel_builds,
    "features": features}
SCRIPT = {"llamacpp": "bench_llamacpp.py",
          "profile": "profile_decode.py", "smollm2": "bench_smollm2.py",
          "train": "bench_train.py", "contention": "bench_contention.py", "speedrun": "speedrun.py",
          "kernel_builds": "kernel_builds.py", "features": "features_record.py"}
# what fills a section that never ran here
COMMAND = {name: f"`.venv/bin/python bench/{script}`" for name, script in SCRIPT.items()} | {
    "llamacpp_avx2": "`.venv/bin/python bench/bench_llamacpp.py --stand-in avx2`",
    "train_isa": "`.venv/bin/python bench/vs_nanogpt.py isa NANOGPT` (a clone of nanoGPT)",
    "nanogpt": ("the three steps in bench/vs_nanogpt.py's docstring (clone nanoGPT, export lumen's split, train "
                "it five minutes, then `.venv/bin/python bench/vs_nanogpt.py eval NANOGPT NANOGPT/out-lumen "
                "runs/shakespeare`)"),
    "features": "`.venv/bin/python bench/features_record.py` OUT after `lumen features train ... --out OUT`"}


def render(page: str, where: Path = RESULTS) -> str:
    """The page with every measured section rewritten from its results."""
    def section(m: re.Match) -> str:
        name = m.group(1)
        found = read_all(name, where)
        # one table per kind of machine measured, each headed by the kind when there are several
        body = (f"Not measured on this machine yet: run {COMMAND[name]}." if not found else "\n\n".join(
            (f"**{KINDS[kind(r['machine'])]}:**\n\n" if len(found) > 1 else "") + RENDER[name](r) + "\n\n"
            + provenance(r) for r in found))
        return f"<!-- measured: {name} -->\n{body}\n<!-- end: {name} -->"

    return re.sub(r"<!-- measured: (\w+) -->.*?<!-- end: \1 -->", section, page, flags=re.S)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", type=Path, default=PAGE, help="the page to rewrite (default: docs/speed.md)")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the benches' JSON (default: docs/speed/)")
    args = ap.parse_args(argv)
    text = args.page.read_text()
    missing = [n for n in RENDER if f"<!-- measured: {n} -->" not in text or f"<!-- end: {n} -->" not in text]
    unknown = sorted(set(re.findall(r"<!-- measured: (\w+) -->", text)) - set(RENDER))
    if missing or unknown:  # one line, the page left as it was
        print(f"{args.page}: no '<!-- measured: {missing[0]} -->' ... '<!-- end: {missing[0]} -->' section; add its "
              "markers where its table belongs" if missing else
              f"{args.page}: '<!-- measured: {unknown[0]} -->' names no bench; use one of {', '.join(RENDER)}",
              file=sys.stderr)
        sys.exit(2)
    args.page.write_text(render(text, args.results))
    print(f"wrote {args.page}", file=sys.stderr)


if __name__ == "__main__":
    main()
