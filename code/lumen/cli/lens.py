"""`lumen lens MODEL (--prompt TEXT | --prompts FILE) [--answer TOK [--wrong TOK]] [--tuned PATH] [--out DIR] [--json]`:
what the stream predicts after each block.

Prints a table (embed and every block x the last positions: top-1 token and probability; with --answer, the
logit of the answer, or logit[answer] - logit[wrong], read after each block at the last position); --out
writes lens.png (the heatmap), kl.png (KL to the final output after each block), lens.html (hover a cell for
the top-k) and lens.json. With --prompts, every prompt of the file is read at its last token, one line each,
then the mean over the file per layer (lumen.prompts reads the file, lumen.inspect.datasets.LensSet holds the numbers).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from .. import names
from ..tokenizers.shown import quoted, shown
from .models import add_model_argument, add_out_argument, at_least, input_file, load_with_tokenizer, output_dir
from .prompts import add_prompts_arguments, check_prompts_file

TABLE_POSITIONS = 6
TRAIN_ONE = "train one with `lumen tuned-lens train MODEL`"
LENS_FILE = "tuned-lens.safetensors"   # the file name in a folder written by `lumen tuned-lens train --out`


def add_parser(sub: argparse._SubParsersAction, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="logit lens (or a tuned lens) on a prompt or a file of them: the prediction "
                       "after each block")
    add_model_argument(p)
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--prompt", help="the text to read")
    add_prompts_arguments(p, which)
    p.add_argument("--answer", metavar="TOK", help="also read logit[TOK] after each block at the last position, "
                   "e.g. ' Paris' (one token)")
    p.add_argument("--wrong", metavar="TOK", help="with --answer: read logit[answer] - logit[TOK] instead")
    p.add_argument("--tuned", metavar="PATH",
                   help="a tuned lens for this model: the folder `lumen tuned-lens train` wrote, or its .safetensors")
    p.add_argument("--top-tokens", dest="top_tokens", type=int, default=5,
                   help="most likely next tokens kept per cell (in the JSON and the HTML page)")
    p.add_argument("--top-k", dest="top_tokens", type=int, help=argparse.SUPPRESS)  # (old name; --top-k samples)
    add_out_argument(p, "write lens.png, kl.png, lens.html and lens.json into this folder (with --prompts: lens.json, "
                     "the mean curves kl.png and, with answers, answer.png)")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    return p


def run(args: argparse.Namespace) -> int:
    from ..inspect.datasets import answer_readings, lens_prompts, reading_name
    from ..inspect.lens import Lens, LogitLens, logit_lens
    from ..inspect.tuned_lens import TunedLens
    from ..prompts import read_prompts, with_answers
    from . import UserError

    at_least(args, "top_tokens")
    if args.wrong is not None and args.answer is None:
        raise UserError("--wrong needs --answer: the lens reads logit[answer] - logit[wrong]")
    out = output_dir(args.out) if args.out else None
    check_prompts_file(args)
    if args.tuned:
        input_file(lens_file(args.tuned), "--tuned", "tuned lens", TRAIN_ONE)
    model, tok = load_with_tokenizer(args.model)
    answer = tok.single_token(args.answer, "--answer") if args.answer is not None else None
    wrong = tok.single_token(args.wrong, "--wrong") if args.wrong is not None else None
    if answer is not None and answer == wrong:
        raise UserError(f"--answer and --wrong are both {args.answer!r}: give two different tokens")
    lenses: dict[str, Lens] = {"logit lens": LogitLens(model)}
    if args.tuned:
        lenses["tuned lens"] = TunedLens.load(lens_file(args.tuned), model)
    main_name = "tuned lens" if args.tuned else "logit lens"
    if args.prompts:
        prompts = with_answers(read_prompts(args.prompts, tok, model.cfg.context), answer, wrong, args.prompts)
        found = lens_prompts(model, prompts, lenses[main_name], args.top_tokens, tok, args.batch_size, main_name)
        return print_prompts(args, found, out)
    ids = tok.encode(args.prompt)
    if not ids:
        raise UserError("--prompt is empty: give some text")
    if len(ids) > model.cfg.context:
        raise UserError(f"--prompt is {len(ids)} tokens, which exceeds the model's context of {model.cfg.context} "
                        "(give a shorter prompt)")
    results = {name: logit_lens(model, ids, lens, args.top_tokens, tok) for name, lens in lenses.items()}
    result = results[main_name]
    reading = None
    if answer is not None:
        reading = answer_readings(model, lenses[main_name], torch.tensor([ids]), [answer],
                                  [wrong] if wrong is not None else None)[:, 0]          # (layers + 1, T)
    if out:
        write_outputs(out, results, main_name)
    if args.json:
        data = {name: r.to_dict() for name, r in results.items()}
        if reading is not None:
            data[main_name]["answer"] = {"what": reading_name(tok, answer, wrong),
                                         "values": [[round(float(x), 6) for x in row] for row in reading]}
        print(json.dumps(data, ensure_ascii=False))
        return 0
    print_table(result, main_name, reading[:, -1] if reading is not None else None,
                reading_name(tok, answer, wrong) if answer is not None else "")
    first = result.first_top1_layer()
    word = result.vocab_of(int(result.top_ids[-1, -1, 0]))
    print(f"the final top-1 {quoted(word)} first becomes top-1 after {names.stream(first)} "
          f"(of {result.n_layers} blocks; {main_name})")
    if args.out:
        print(f"wrote {args.out}/lens.png, kl.png, lens.html, lens.json")
    return 0


def print_prompts(args: argparse.Namespace, found, out: Path | None = None) -> int:
    """A file of prompts' lens (a LensSet): each prompt at its last token, then the mean per layer; out: write
    lens.json (what --json prints) and the mean curves (kl.png; answer.png with answers)."""
    data = {"lens": found.lens, "file": str(args.prompts), **found.to_dict()}
    n = len(found.results)
    if out:
        write_prompt_outputs(out, data, found.lens, n)
    if args.json:
        print(json.dumps(data, ensure_ascii=False))
        return 0
    what, mean, kl = found.what, found.mean(), found.kl
    print(f"{found.lens} on {n} prompts of {args.prompts}, read at each prompt's last token")
    print(f"{'line':>6}  {'final top-1':<16}{'prob':>6}  {'first top-1 after':<18}"
          + (f"  {what} after the last block" if what else ""))
    for i, (p, r) in enumerate(zip(found.prompts, found.results)):
        word = shown(r.vocab_of(int(r.top_ids[-1, -1, 0])), 14)
        tail = f"  {float(found.values[i][-1]):+.4f}" if found.values is not None else ""
        print(f"{p.line:>6}  {word:<16}{float(r.top_probs[-1, -1, 0]):>6.2f}  "
              f"{names.stream(r.first_top1_layer()):<18}{tail}")
    print(f"\nmean over the {n} prompts, per layer (the final top-1 first becomes top-1 after "
          f"{float(mean['first_top1']):.1f} blocks on average):")
    print(f"{'after':>9}  {'KL(last)':>9}  {'top-1 = final':>13}" + (f"  {what}" if what else ""))
    for layer in range(kl.size(1) - 1, -1, -1):
        tail = f"  {float(mean['values'][layer]):+.4f}" if "values" in mean else ""
        print(f"{names.stream(layer):>9}  {float(mean['kl'][layer]):>9.3f}  "
              f"{float(mean['top1_is_final'][layer]):>13.2f}{tail}")
    if out:
        print(f"wrote {args.out}/lens.json (every prompt and the mean), kl.png" + (", answer.png" if what else ""))
    return 0


def write_prompt_outputs(out: Path, data: dict, name: str, n: int) -> None:
    """A file of prompts' lens: the JSON, and the mean per layer as curves."""
    from ..files import write_text
    from ..report.figures import layer_curves

    write_text(out / "lens.json", json.dumps(data, ensure_ascii=False))
    mean = data["mean"]
    layer_curves({name: mean["kl"]}, out / "kl.png", title=f"KL to the final output at the last token, mean over "
                 f"{n} prompts", log=True)
    if "values" in mean:
        layer_curves({name: mean["values"]}, out / "answer.png", ylabel=data["what"],
                     title=f"{data['what']} at the last token, mean over {n} prompts")


def lens_file(path: str) -> Path:
    """A tuned lens: its .safetensors file, or the folder `lumen tuned-lens train --out` wrote it into."""
    p = Path(path)
    return p / LENS_FILE if p.is_dir() else p


def print_table(result, name: str, reading: torch.Tensor | None = None, what: str = "") -> None:
    """The table: top-1 per layer at the last positions, KL at the last one, and the answer's reading (layers + 1,)."""
    T = len(result.tokens)
    cols = list(range(max(0, T - TABLE_POSITIONS), T))
    width = 16
    print(f"{name}: top-1 next token (probability) read after the embedding and after each block; "
          "KL to the final output at the last position" + (f"; {what} there" if reading is not None else ""))
    print(f"{'after':>9}  " + "".join(f"{shown(result.tokens[t], width):<{width}}" for t in cols) + "KL(last)"
          + (f"  {what}" if reading is not None else ""))
    for layer in range(result.n_layers, -1, -1):
        cells = []
        for t in cols:
            word = shown(result.vocab_of(int(result.top_ids[layer, t, 0])), width - 8)
            cells.append(f"{word} {float(result.top_probs[layer, t, 0]):.2f}".ljust(width))
        tail = f"  {float(reading[layer]):+.4f}" if reading is not None else ""
        print(f"{names.stream(layer):>9}  " + "".join(cells) + f"{float(result.kl[layer, -1]):.3f}{tail}")


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
