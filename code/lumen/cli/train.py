"""`lumen train [--preset NAME | CONFIG.toml] [--set key=value ...] [--resume]`: train a GPT.

More than one process: `torchrun --nproc_per_node=N -m lumen train ...` (see lumen.train.distributed).
Ctrl-C saves the current step and prints the command that continues the run.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from ..errors import LumenError
from ..train import PRESETS, TrainingInterrupted, load_config, to_toml, train
from ..train.distributed import PeerLost, launched_by_torchrun, leave

ERROR_GRACE_S = 5.0


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="train a model on a corpus (default: --preset shakespeare)",
                       description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="a TOML config file (see `lumen train --print-config`)")
    p.add_argument("--preset", choices=list(PRESETS), help="a built-in run (default: shakespeare)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set steps=500 --set model.n_layers=2 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue from the newest intact checkpoint in out_dir")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as TOML and exit")
    return p


def run(args: argparse.Namespace) -> int:
    preset = args.preset or (None if args.config else "shakespeare")
    cfg, model_cfg = load_config(args.config, preset, args.sets)
    if args.print_config:
        print(to_toml(cfg, model_cfg), end="")
        return 0
    try:
        train(cfg, model_cfg, resume=args.resume)
    except TrainingInterrupted as e:
        if os.environ.get("RANK", "0") == "0":
            print(f"lumen train: interrupted at step {e.step}; saved {e.checkpoint}. Continue with:\n"
                  f"  {resume_command(args)}" if e.checkpoint else
                  f"lumen train: interrupted at step {e.step} (save = false: nothing saved)", file=sys.stderr)
        return 130
    except PeerLost as e:  # under torchrun: the first surviving process says it, the others stop quietly
        if e.first:
            print(f"lumen train: error: {e}", file=sys.stderr)
        leave(2)
    except LumenError as e:
        if launched_by_torchrun():
            # every rank usually meets the same error: rank 0 says it, and torchrun stops the others while they
            # wait; an error of one other rank alone is still said, a moment later
            rank = os.environ.get("RANK", "0")
            if rank != "0":
                time.sleep(ERROR_GRACE_S)
            print(f"lumen train: error: {e}" + (f" (rank {rank})" if rank != "0" else ""), file=sys.stderr)
            leave(2)
        raise
    if launched_by_torchrun():
        leave(0)  # a torchrun worker skips interpreter shutdown: see distributed.leave
    return 0


def resume_command(args: argparse.Namespace) -> str:
    """The command line that continues this run."""
    words = ["lumen", "train", *([args.config] if args.config else []), *(["--preset", args.preset] if args.preset
                                                                          else [])]
    for s in args.sets:
        words += ["--set", s]
    return shlex.join([*words, "--resume"])
