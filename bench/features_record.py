"""Add a `lumen features train` run to the sparse-autoencoder record table (docs/speed/features@KIND.json, which
bench/speed_doc.py renders into docs/speed.md's "Sparse autoencoders" section). Not a test.

    .venv/bin/python bench/features_record.py OUT [--name NAME] [--note "what changed"]

OUT is the run's folder (`lumen features train ... --out OUT`): its report.json (held-out quality, seconds and CPU
seconds of each phase, the load average at the end) and sae_train.json (its settings). A row of the same name is
replaced. The quiet-machine estimate is the CPU seconds spread over the machine's cores: what the same work takes
when nothing else runs (the run's own threads never waited on each other's slices of a core).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from results import RESULTS, Record, kind

GOAL = {"fvu": 0.15, "l0": 32, "dead": 0.01, "ce_recovered": 0.85, "minutes": 30}


def row(out: Path, name: str, note: str, cores: int) -> dict:
    r = json.loads((out / "report.json").read_text())
    s = r["settings"]
    cpu = r.get("model_cpu_seconds", 0.0) + r.get("sae_cpu_seconds", 0.0)
    return {"name": name, "note": note, "model": r["model"], "site": r["site"], "kind": r["kind"], "k": r["k"],
            "d_sae": r["d_sae"], "tokens_read": r["tokens_read"], "steps": r["steps"], "batch": s["batch"],
            "reuse": s["reuse"], "lr": s["lr"], "dtype": r["dtype"],
            "train_seconds": r["model_seconds"] + r["sae_seconds"], "model_seconds": r["model_seconds"],
            "sae_seconds": r["sae_seconds"], "cpu_seconds": cpu, "quiet_seconds_estimate": cpu / cores,
            "model_tokens_per_s": r["model_tokens_per_s"], "model_tokens_per_cpu_s":
                r["tokens_read"] / r["model_cpu_seconds"] if r.get("model_cpu_seconds") else None,
            "load_average_end": r.get("load_average"), "fvu": r["fvu"], "l0": r["l0"], "dead": r["dead"],
            "ce_recovered": r["ce_recovered"], "error_norm": r["error_norm"], "site_norm": r["site_norm"],
            "heldout_tokens": r["tokens"], "skip_first": r["skip_first"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the run's folder (lumen features train --out)")
    ap.add_argument("--name", help="the row's name (default: the folder's)")
    ap.add_argument("--note", default="", help="what this run changed")
    args = ap.parse_args(argv)
    if not (args.out / "report.json").is_file():
        sys.exit(f"{args.out}: no report.json (a finished `lumen features train` run writes one)")
    with Record("features") as rec:
        path = RESULTS / f"features@{kind(rec['machine'])}.json"
        rows = json.loads(path.read_text())["rows"] if path.exists() else []
        new = row(args.out, args.name or args.out.name, args.note, rec["machine"]["cores"] or 2)
        rec["goal"] = GOAL
        rec["rows"] = [r for r in rows if r["name"] != new["name"]] + [new]


if __name__ == "__main__":
    main()
