"""`lumen explore MODEL --prompt P [--contrast A B] [--corrupt Q] [--tuned PATH] --out page.html`: one
self-contained HTML page to explore a prompt: logit lens (hover for the top tokens), direct logit
attribution per position (click a column), heads and their attention patterns (click a head), and the
activation-patching maps when a corrupted prompt is given. No network: everything is inline.

With `--sae DICT` (a sparse dictionary, as for `lumen features`), a page per feature too, in PAGE's folder under
NAME-features/ (the --features densest ones, or those named by --feature), each with its top contexts in the
--corpus (tokens shaded by activation), its logit effects, its logit lens and its density, linked from the page."""

from __future__ import annotations

import argparse
import time

from .models import (
    add_model_argument,
    add_text_arguments,
    at_least,
    check_corpus,
    load_with_tokenizer,
    output_file,
    path_text,
    read_windows,
)
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
    g = p.add_argument_group("feature pages")
    g.add_argument("--sae", metavar="DICT", help="a sparse dictionary (a SAELens folder or hf:ORG/NAME/FOLDER): "
                   "adds a page per feature")
    g.add_argument("--features", type=int, default=20, metavar="N", help="pages for the N densest features")
    g.add_argument("--feature", type=int, nargs="+", metavar="I", help="pages for these features instead")
    g.add_argument("--contexts", type=int, default=10, help="top contexts per feature page")
    add_text_arguments(p, seq_len=64, windows=64)   # the corpus the feature pages read
    return p


def run(args: argparse.Namespace) -> int:
    from ..files import write_text
    from ..inspect.tuned_lens import TunedLens
    from ..report.explore import explore_data, explore_page

    output_file(args.out)
    sae = None
    if args.sae:                                      # the small file and the corpus first: they fail fast
        from ..features import read_saelens
        from ..features.tools import check_feature

        at_least(args, "features", "contexts", "windows")
        at_least(args, "seq_len", least=2)
        sae = read_saelens(args.sae)
        for f in args.feature or []:
            check_feature(sae, f)
        check_corpus(args.corpus)
    model, tok = load_with_tokenizer(args.model)
    tuned = TunedLens.load(args.tuned, model) if args.tuned else None
    t0 = time.perf_counter()
    data = explore_data(model, tok, args.prompt, tuple(args.contrast) if args.contrast else None, args.corrupt, tuned,
                        patch_kinds=args.patch)
    index = ""
    if sae is not None:
        index = write_feature_pages(model, tok, sae, args, tuned)
    path = write_text(args.out, explore_page(data, features=index))
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB; {len(data['tokens'])} tokens, "
          f"{data['n_layers']} layers x {data['n_heads']} heads; computed in {time.perf_counter() - t0:.1f} s)")
    return 0


def write_feature_pages(model, tok, sae, args: argparse.Namespace, tuned) -> str:
    """Write a page per feature beside args.out (in NAME-features/); the explorer page's section linking them."""
    from pathlib import Path

    from ..features.pages import feature_data
    from ..features.splice import check_fits
    from ..files import write_text
    from ..report.explore import feature_file, feature_page, features_index

    check_fits(model, sae)
    out = Path(args.out)
    folder = f"{out.stem}-features"
    windows = read_windows(model, tok, args, "train", args.windows, args.seed)
    data = feature_data(model, tok, sae, windows, args.feature, args.features, args.contexts, lens=tuned,
                        corpus=args.corpus)
    for page in data["features"]:
        write_text(out.parent / folder / feature_file(page["feature"]), feature_page(data, page, f"../{out.name}"))
    print(f"wrote {len(data['features'])} feature pages in {out.parent / folder}")
    return features_index(data, folder)
