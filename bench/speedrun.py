"""The CPU speedrun: the default training run (`make`, `lumen train --preset shakespeare`) against the clock.

The rules: the chapter's pre-LN block and its GPT-2 init; the Shakespeare split with its five held-out works;
at most five minutes of training on the machine's cores, evaluations and compiling included; the score is
the held-out nats per character over every token of those works, scored by bench/vs_nanogpt.py's evaluator
(the one nanoGPT's row of docs/speed.md is scored by). Free: the optimizer, the schedule, batch and sequence
sizes, the tokenizer, compile settings. Each row below is the row before it with one change, trained from
scratch in its own process as `make` trains it (its evaluations and samples included: when a run reached 1.50
is read at those); the last row is the preset as it stands.

    .venv/bin/python bench/speedrun.py              # every row, about five minutes each, one after another
    .venv/bin/python bench/speedrun.py --rows 0 4   # the first and the last only

The table goes to docs/speed/speedrun.json (bench/results.py), rendered into docs/speed.md by speed_doc.py.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from results import Record, load_average  # bench/results.py (this script's folder is on sys.path)
from vs_nanogpt import nats_per_char

GOAL, MILESTONE, BUDGET = 1.40, 1.50, 300.0  # nats/char; nats/char; seconds

# (what changed, the --set overrides that turn today's preset into that row)
WAVE2 = ["batch_size=16", "warmup=50"]  # what every row keeps of the last wave's run
LAST = ["steps=2100", "eval_interval=500"]  # the steps and evaluations of the rows before the last
# rows before StackedMuon take torch.optim.Muon's step one matrix at a time (the same numbers, bit for bit here)
ONE_AT_A_TIME = "one matrix at a time"
# rows before lumen.runtime.heap run on glibc's own heap settings (a step's freed buffers may go back to the system)
GLIBC_HEAP = "glibc's own heap"
ROWS: list[tuple[str, list[str]]] = [
    ("the last wave's default: AdamW, cosine down to lr/10, 2,400 steps of 16 x 128 tokens",
     ["optimizer=adamw", "schedule=cosine", "min_lr=3e-4", "steps=2400", "eval_interval=500", *WAVE2, GLIBC_HEAP]),
    ("Muon for the blocks' matrices (AdamW keeps the embedding and the vectors)",
     ["schedule=cosine", "min_lr=3e-4", "steps=2400", "eval_interval=500", *WAVE2, ONE_AT_A_TIME, GLIBC_HEAP]),
    ("warm-up, stable, then a straight line down to lr/100 over the last 40%",
     ["steps=2400", "eval_interval=500", *WAVE2, ONE_AT_A_TIME, GLIBC_HEAP]),
    ("2,100 steps, to fit five minutes", [*LAST, ONE_AT_A_TIME, GLIBC_HEAP]),
    ("Muon's Newton-Schulz over each stack of same-shape matrices at once (StackedMuon)", [*LAST, GLIBC_HEAP]),
    ("a step's freed buffers kept for the next step (lumen.runtime.heap), not faulted in again page by page", LAST),
    ("2,200 steps in the time saved, evaluations every 550 (today's preset)", []),
]
MARKERS = (ONE_AT_A_TIME, GLIBC_HEAP)
# the row's own process: torch.optim.Muon in place of StackedMuon, glibc's heap as it is (the library has one
# Muon and one heap setting; these are the bench's)
PATCHES = {ONE_AT_A_TIME: "import torch, lumen.train.optim as optim; optim.StackedMuon = torch.optim.Muon",
           GLIBC_HEAP: "import contextlib, lumen.train.machine as machine; "
                       "machine.reuse_freed_buffers = contextlib.nullcontext"}
LAUNCH = "import sys; from lumen.cli import main; sys.exit(main())"


def train(sets: list[str], out: Path) -> dict:
    """One row: a fresh run in its own process; its summary and its evaluations (in nats per character)."""
    program = "; ".join([*(PATCHES[s] for s in MARKERS if s in sets), LAUNCH])
    cmd = [sys.executable, "-c", program, "train", "--preset", "shakespeare", "--set", f"out_dir={out}",
           "--set", "progress=false", *(a for s in sets if s not in MARKERS for a in ("--set", s))]
    subprocess.run(cmd, check=True)
    summary = json.loads((out / "summary.json").read_text())
    cpt = summary["final_val_loss"] / summary["val_loss_per_char"]
    evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [{"step": r["step"], "time": r["time"], "nats_per_char": r["val_loss"] / cpt}
             for r in evals if "val_loss" in r]
    return {"summary": summary, "evals": evals}


def held_out(out: Path) -> float:
    """Every token of the held-out works through the trained model: nats per character."""
    from lumen.formats import load
    from lumen.train.config import load_config

    model = load(str(out)).model.eval()
    cfg, _ = load_config(str(out / "config.toml"))
    return nats_per_char(lambda x: model(x)[0], cfg.prepare_data(), model.cfg.context)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="*", default=None, help="which rows (default: all)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="keep the runs in this folder (rowN/, e.g. for bench/vs_nanogpt.py eval), not a temporary one")
    args = ap.parse_args()
    chosen = range(len(ROWS)) if args.rows is None else args.rows
    with Record("speedrun") as rec, tempfile.TemporaryDirectory() as scratch:
        tmp = args.keep or Path(scratch)
        rec.update(goal=GOAL, milestone=MILESTONE, budget=BUDGET, rows=[])
        for i in chosen:
            what, sets = ROWS[i]
            out = tmp / f"row{i}"
            before = load_average()
            run = train(sets, out)
            s = run["summary"]
            first = next((e for e in run["evals"] if e["nats_per_char"] <= MILESTONE), None)
            row = {"row": i, "what": what, "sets": sets, "steps": s["steps"], "tokens": s["tokens"],
                   "seconds": s["wall_time"], "tokens_per_s": s["tokens_per_s"],
                   "step_seconds": s["tokens"] / s["tokens_per_s"], "nats_per_char": held_out(out),
                   "run_nats_per_char": s["val_loss_per_char"], "time_to_milestone": first and first["time"],
                   "evals": run["evals"], "load": [before, load_average()]}
            rec["rows"] = sorted([*rec["rows"], row], key=lambda r: r["row"])  # (rows may run in any order)
            print(f"row {i}: {what}: {row['nats_per_char']:.4f} nats/char held out, {row['seconds']:.0f} s "
                  f"({row['step_seconds']:.0f} s in steps), "
                  f"{MILESTONE} at {row['time_to_milestone']} s", file=sys.stderr)


if __name__ == "__main__":
    main()
