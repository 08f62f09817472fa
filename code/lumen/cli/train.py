"""`lumen train [--preset NAME | CONFIG.toml] [--set key=value ...] [--resume]`: train a GPT.

More than one process: `torchrun --nproc_per_node=N -m lumen train ...` (see lumen.train.distributed).
"""

from __future__ import annotations

import argparse

from ..train import PRESETS, TrainingError, load_config, to_toml, train
from ..train.distributed import launched_by_torchrun, leave
from . import UserError


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="train a model on a corpus (default: --preset shakespeare)",
                       description=__doc__.splitlines()[0])
    p.add_argument("config", nargs="?", help="a TOML config file (see `lumen train --print-config`)")
    p.add_argument("--preset", choices=list(PRESETS), help="a built-in run (default: shakespeare)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override one setting, e.g. --set steps=500 --set model.n_layers=2 (repeatable)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in out_dir")
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
    except TrainingError as e:
        raise UserError(str(e)) from None
    if launched_by_torchrun():
        leave(0)  # a torchrun worker skips interpreter shutdown: see distributed.leave
    return 0
