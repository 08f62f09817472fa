"""`lumen lens MODEL --prompt TEXT [--tuned PATH] [--out DIR] [--json]`: what the stream predicts after each block.

Prints a table (embed and every block x the last positions: top-1 token and probability); --out writes lens.png (the
heatmap), kl.png (KL to the final output after each block), lens.html (hover a cell for the top-k) and lens.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import names
from .models import add_model_argument, add_out_argument, at_least, load_with_tokenizer, output_dir

TABLE_POSITIONS = 6
LENS_FILE = "tuned-lens.safetensors"   # the file name in a folder written by `lumen tuned-lens train --out`


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="logit lens (or a tuned lens) on one prompt: the prediction after each block")
    add_model_argument(p)
    p.add_argument("--prompt", required=True, help="the text to read")
    p.add_argument("--tuned", metavar="PATH",
                   help="a tuned lens for this model: the folder `lumen tuned-lens train` wrote, or its .safetensors")
    p.add_argument("--top-tokens", dest="top_tokens", type=int, default=5,
                   help="most likely next tokens kept per cell (in the JSON and the HTML page)")
    p.add_argument("--top-k", dest="top_tokens", type=int, help=argparse.SUPPRESS)  # (old name; --top-k samples)
    add_out_argument(p, "write lens.png, kl.png, lens.html and lens.json into this folder")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.lens import LogitLens, logit_lens
    from ..inspect.tuned_lens import TunedLens
    from ..report.figures import visible
    from . import UserError

    at_least(args, "top_tokens")
    out = output_dir(args.out) if args.out else None
    model, tok = load_with_tokenizer(args.model)
    ids = tok.encode(args.prompt)
    if not ids:
        raise UserError("--prompt is empty: give some text")
    if len(ids) > model.cfg.context:
        raise UserError(f"--prompt is {len(ids)} tokens, which exceeds the model's context of {model.cfg.context} "
                        "(give a shorter prompt)")
    results = {"logit lens": logit_lens(model, ids, LogitLens(model), args.top_tokens, tok)}
    if args.tuned:
        results["tuned lens"] = logit_lens(model, ids, TunedLens.load(lens_file(args.tuned), model),
                                           args.top_tokens, tok)
    main_name = "tuned lens" if args.tuned else "logit lens"
    result = results[main_name]
    if out:
        write_outputs(out, results, main_name)
    if args.json:
        print(json.dumps({name: r.to_dict() for name, r in results.items()}, ensure_ascii=False))
        return 0
    print_table(result, main_name)
    first = result.first_top1_layer()
    word = visible(result.vocab_of(int(result.top_ids[-1, -1, 0])))
    print(f"the final top-1 {word!r} first becomes top-1 after {names.stream(first)} "
          f"(of {result.n_layers} blocks; {main_name})")
    if args.out:
        print(f"wrote {args.out}/lens.png, kl.png, lens.html, lens.json")
    return 0


def lens_file(path: str) -> Path:
    """A tuned lens: its .safetensors file, or the folder `lumen tuned-lens train --out` wrote it into."""
    p = Path(path)
    return p / LENS_FILE if p.is_dir() else p


def print_table(result, name: str) -> None:
    T = len(result.tokens)
    cols = list(range(max(0, T - TABLE_POSITIONS), T))
    width = 16
    print(f"{name}: top-1 next token (probability) read after the embedding and after each block; "
          "KL to the final output at the last position")
    print(f"{'after':>9}  " + "".join(f"{_clip(result.tokens[t], width):<{width}}" for t in cols) + "KL(last)")
    for layer in range(result.n_layers, -1, -1):
        cells = []
        for t in cols:
            word = _clip(result.vocab_of(int(result.top_ids[layer, t, 0])), width - 8)
            cells.append(f"{word} {float(result.top_probs[layer, t, 0]):.2f}".ljust(width))
        print(f"{names.stream(layer):>9}  " + "".join(cells) + f"{float(result.kl[layer, -1]):.3f}")


def _clip(text: str, n: int) -> str:
    """A token as the figures and the HTML page show it (a token of spaces as ␣), cut to n characters."""
    from ..report.figures import visible

    text = visible(text)
    return text if len(text) <= n else text[: n - 1] + "…"


def write_outputs(out: Path, results: dict, main_name: str) -> None:
    from ..files import write_text
    from ..report.figures import layer_curves, lens_heatmap
    from ..report.html import lens_page

    result = results[main_name]
    lens_heatmap(result, out / "lens.png", title=main_name)
    layer_curves({name: r.kl.mean(1).tolist() for name, r in results.items()}, out / "kl.png",
                 title="KL to the final output, mean over positions", log=True)
    write_text(out / "lens.html", lens_page(result, title=f"{main_name}: {''.join(result.tokens)}"))
    write_text(out / "lens.json", json.dumps({n: r.to_dict() for n, r in results.items()}, ensure_ascii=False))
