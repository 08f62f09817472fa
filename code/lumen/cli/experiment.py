"""`lumen experiment NAME|all [--quick] [--seed S] [--out DIR] [--doc PATH]`: the chapter's claims, measured.

Each experiment writes DIR/NAME/table.md, numbers.json and PNG figures, and prints its table.
`lumen experiment all --out docs/experiments --doc docs/experiments.md` runs every one and writes the page that
collects them; `lumen experiment NAME --out docs/experiments --doc docs/experiments.md` reruns one and refreshes it.
"""

from __future__ import annotations

import argparse
import sys

from .. import experiments
from ..experiments import EXPERIMENTS
from ..runtime.threads import check_threads
from .models import add_out_argument, add_quiet_argument, output_dir


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="run one of the chapter's claims as an experiment (table, JSON, figures)",
                       description=__doc__.splitlines()[0])
    p.add_argument("name", metavar="NAME", help=f"one of: {', '.join(EXPERIMENTS)}; or all; or list")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: tiny models trained briefly (a minute or two each, not tens of minutes); "
                        "it checks that the experiment runs and draws no conclusion")
    p.add_argument("--seed", type=int, default=0, help="random seed; a seed gives the same numbers")
    add_out_argument(p, "output folder (one subfolder per experiment)", default="runs/experiments")
    p.add_argument("--doc", default=None,
                   help="also write the markdown page collecting every result in --out (e.g. docs/experiments.md)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    add_quiet_argument(p)
    return p


def run(args: argparse.Namespace) -> int:
    import torch

    check_threads(args.threads, "--threads")
    if args.threads:
        torch.set_num_threads(args.threads)
    output_dir(args.out)
    if args.name == "list":
        for name in EXPERIMENTS:
            print(f"{name:<20} {experiments.module(name).CLAIM}")
        return 0
    if args.doc and args.name != "all":
        experiments.load_all(args.out, but=args.name)   # fail before running if the others' results are missing
    if args.name == "all":
        results = experiments.run_all(args.quick, args.seed, args.out, progress=lambda m: print(m, file=sys.stderr))
    else:
        results = [experiments.run(args.name, args.quick, args.seed, args.out)]
    for r in results:
        print(r.markdown())
    if args.doc:
        command = "lumen experiment all" + (" --quick" if args.quick else "") + (
            f" --seed {args.seed}" if args.seed else "") + f" --out {args.out} --doc {args.doc}"
        experiments.write_doc(experiments.load_all(args.out), args.doc, args.out, command)
        print(f"lumen experiment: wrote {args.doc}", file=sys.stderr)
    print(f"lumen experiment: results in {args.out}/", file=sys.stderr)
    return 0

