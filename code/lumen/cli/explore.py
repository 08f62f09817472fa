"""`lumen explore MODEL --prompt P [--contrast A B] [--corrupt Q] [--tuned PATH] --out page.html`: one
self-contained HTML page to explore a prompt: logit lens (hover for the top tokens), direct logit
attribution per position (click a column), heads and their attention patterns (click a head), and the
activation-patching maps when a corrupted prompt is given. No network: everything is inline."""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Callable, Iterator
from unittest import mock

from .models import add_model_argument, load_with_tokenizer, output_file, path_text
from .patch import KINDS


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="one self-contained HTML page: lens, attribution, heads, patching")
    add_model_argument(p)
    p.add_argument("--prompt", required=True, help="the text to explore")
    p.add_argument("--contrast", nargs=2, metavar=("A", "B"),
                   help="attribute logit[A] - logit[B] (default: each position's own prediction)")
    p.add_argument("--corrupt", metavar="Q", help="a prompt of the same token length: adds the patching maps")
    p.add_argument("--patch", nargs="+", choices=KINDS, default=list(KINDS), metavar="KIND",
                   help=f"the patching maps to compute with --corrupt (default all: {' '.join(KINDS)}; each "
                   "(layer, position) cell is a forward pass)")
    p.add_argument("--tuned", metavar="PATH", help="a tuned lens for this model: adds a lens toggle")
    p.add_argument("--out", required=True, metavar="PAGE", type=path_text, help="the HTML file to write")
    return p


def run(args: argparse.Namespace) -> int:
    from ..files import write_text
    from ..inspect.tuned_lens import TunedLens
    from ..report.explore import explore_data, explore_page

    output_file(args.out)
    model, tok = load_with_tokenizer(args.model)
    tuned = TunedLens.load(args.tuned, model) if args.tuned else None
    t0 = time.perf_counter()
    with _parts_bar(tuned is not None):
        data = explore_data(model, tok, args.prompt, tuple(args.contrast) if args.contrast else None,
                            args.corrupt, tuned, patch_kinds=args.patch)
    path = write_text(args.out, explore_page(data))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB; {len(data['tokens'])} tokens, "
          f"{data['n_layers']} layers x {data['n_heads']} heads; computed in {time.perf_counter() - t0:.1f} s)")
    return 0


# the parts of lumen.report.explore.explore_data that each run the model once, with what the bar calls them
PARTS = {"logit_lens": "lens", "attribute": "attribution", "_patterns": "heads"}


@contextlib.contextmanager
def _parts_bar(tuned: bool) -> Iterator[None]:
    """A bar (lumen.progress) over explore_data's parts: the lens (and the tuned lens), the attribution and the
    heads' patterns, each one forward pass with its cache, so equal pieces of work for the estimate. The part
    running is named after the bar; the patching maps (--corrupt) close it and draw their own bar, by cells."""
    from ..progress import progress
    from ..report import explore as page

    with progress(total=len(PARTS) + tuned, desc="exploring", unit="part") as bar, contextlib.ExitStack() as stack:
        def counted(f: Callable, part: str) -> Callable:
            def part_of_the_page(*args, **kwargs):
                bar.set_postfix_str(part)
                out = f(*args, **kwargs)
                bar.update()
                return out
            return part_of_the_page

        def patching(*args, **kwargs):
            bar.close()   # done: the maps' own bar (by cells) draws now
            return maps(*args, **kwargs)

        maps = page.patching_maps
        for name, part in PARTS.items():
            stack.enter_context(mock.patch.object(page, name, counted(getattr(page, name), part)))
        stack.enter_context(mock.patch.object(page, "patching_maps", patching))
        yield
