"""Render the measured sections of docs/speed.md from the benches' results (docs/speed/*.json, bench/results.py).

    .venv/bin/python bench/speed_doc.py          # after a bench; `make bench` runs it last

The page's prose is written by hand; each measured section sits between two markers,
`<!-- measured: NAME -->` and `<!-- end: NAME -->`, and is rewritten from docs/speed/NAME.json (a bench that
never ran here leaves a line saying which command fills it). Every table names its machine, the load average
before and after, the date and the command. Not a test.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from results import RESULTS, read

PAGE = Path(__file__).resolve().parent.parent / "docs" / "speed.md"


def provenance(r: dict[str, Any]) -> str:
    m = r["machine"]
    flags = ", ".join(m["flags"]) or "none of the AVX-512/AMX flags"
    amx = "AMX" if m["amx"] else "no AMX"
    return (f"Measured {r['date']} by `{r['command']}` on a {m['cores']}-core {m['cpu']} ({flags}; {amx}), "
            f"torch {m['torch']}; load average {r['load_before'][0]:.1f} before, {r['load_after'][0]:.1f} after.")


def llamacpp(r: dict[str, Any]) -> str:
    threads = [str(t) for t in r["thread_counts"]]
    anchor = next(row for row in r["rows"] if row["anchor"])
    head = ["contender"] + [f"decode, {t} thread{'s' * (t != '1')}" for t in threads]
    head += [f"prefill {r['prompt']}, {t}t" for t in threads] + ["max RSS"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        cells = [row["contender"]]
        for t in threads:
            x, base = row["threads"][t]["decode_tok_s"], anchor["threads"][t]["decode_tok_s"]
            cells.append(f"{x:.1f} tok/s" + ("" if row["anchor"] else f" (**{x / base:.2f}x**)"))
        for t in threads:
            x, base = row["threads"][t].get("prefill_tok_s"), anchor["threads"][t].get("prefill_tok_s")
            cells.append("" if x is None else f"{x:.0f} tok/s" + ("" if row["anchor"] or not base
                                                                   else f" ({x / base:.2f}x)"))
        rss = row["max_rss_mib"]
        cells.append(f"{rss:,.0f} MiB" + ("" if row["anchor"] else f" ({rss / anchor['max_rss_mib']:.2f}x)"))
        lines.append("| " + " | ".join(cells) + " |")
    text = [f"{r['model']}, greedy, {r['tokens']} new tokens, medians of {r['rounds']} rounds (contenders taking "
            "turns in every round); x: against the first row. Goals: decoding from the blocks >= 1.5x at every "
            "thread count, max RSS <= 2x.", "", *lines]
    if "bandwidth" in r:
        b = r["bandwidth"]
        limit = b["bytes_per_s"] / b["bytes_per_token"]
        best = max(row["threads"][threads[-1]]["decode_tok_s"] for row in r["rows"] if not row["anchor"])
        text += ["", f"The memory limit: a token reads {b['bytes_per_token'] / 2**20:.0f} MiB of weights; this "
                 f"machine streamed {b['bytes_per_s'] / 1e9:.1f} GB/s in the same run ({b['how']}), so at most "
                 f"{limit:.0f} tokens/s. lumen's best at {threads[-1]} threads: {best / limit:.0%} of it."]
    return "\n".join(text)


def profile(r: dict[str, Any]) -> str:
    parts = list(next(iter(r["threads"].values()))["parts_ms"])
    head = ["threads", "ms per token (profiled / not)"] + parts
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t, x in r["threads"].items():
        cells = [t, f"{x['ms_per_token']:.1f} / {x['unprofiled_ms_per_token']:.1f}"]
        cells += [f"{x['parts_ms'][p]:.1f} ({x['parts_ms'][p] / x['ms_per_token']:.0%})" for p in parts]
        lines.append("| " + " | ".join(cells) + " |")
    return ("Decoding SmolLM2 from its GGUF blocks through the door's compiled step, by torch's profiler: "
            "products (quant.cpp's kernel), attention and the other fused kernels, dynamo's guards, the "
            "compiled graph's Python wrapper, and the rest (the loop's Python).\n\n" + "\n".join(lines))


RENDER: dict[str, Callable[[dict[str, Any]], str]] = {"llamacpp": llamacpp, "profile": profile}
COMMAND = {"llamacpp": "bench/bench_llamacpp.py", "profile": "bench/profile_decode.py"}


def render(page: str, where: Path = RESULTS) -> str:
    """The page with every measured section rewritten from its results."""
    def section(m: re.Match) -> str:
        name = m.group(1)
        r = read(name, where)
        body = (f"Not measured on this machine yet: run `.venv/bin/python {COMMAND[name]}`." if r is None
                else RENDER[name](r) + "\n\n" + provenance(r))
        return f"<!-- measured: {name} -->\n{body}\n<!-- end: {name} -->"

    return re.sub(r"<!-- measured: (\w+) -->.*?<!-- end: \1 -->", section, page, flags=re.S)


def main() -> None:
    text = PAGE.read_text()
    missing = [n for n in RENDER if f"<!-- measured: {n} -->" not in text]
    if missing:
        sys.exit(f"{PAGE}: no '<!-- measured: {missing[0]} -->' section; add its markers where it belongs")
    PAGE.write_text(render(text))
    print(f"wrote {PAGE}", file=sys.stderr)


if __name__ == "__main__":
    main()
