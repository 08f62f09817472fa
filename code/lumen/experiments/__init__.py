"""The chapter's claims as experiments: one module per claim, each returning a Result (tables, numbers,
figures) that the runner writes as table.md, numbers.json and PNGs.

    >>> result = run("init-scaling", quick=True, seed=0, out="runs/experiments")   # doctest: +SKIP

Each module has NAME, CLAIM and `run(quick: bool, seed: int) -> Result`, in one shape: SIZES holds a typed
Size for the full and the quick run; `measure(size, seed)` trains and measures and returns the numbers (plain
JSON); `tables`, `verdict` and `draw` read only those numbers (and the size); `run` composes them (ioi.py names
its measuring `study`). The numbers are deterministic for a seed on one machine (wall times aside). A quick run
is a smoke run: it draws no conclusion (see SMOKE).
"""

from __future__ import annotations

import importlib
import re
import time
from pathlib import Path
from types import ModuleType

import torch

from ..errors import MissingFileError, UserError
from ..files import write_text
from ..progress import progress
from ..runtime import cpu
from . import fit
from .result import Result, Table

# experiment name -> module under lumen.experiments, in the chapter's order
EXPERIMENTS: dict[str, str] = {
    "mixing": "mixing",
    "depth": "depth",
    "norm-placement": "norm_placement",
    "init-scaling": "init_scaling",
    "activations": "activations",
    "norms": "norms",
    "dropout": "dropout",
    "accounting": "accounting",
    "logit-lens": "logit_lens",
    "delete-layer": "delete_layer",
    "key-value-memories": "key_value_memories",
    "attention-heads": "attention_heads",
    "fact-recall": "fact_recall",
    "ioi": "ioi",
}

# what a quick run says instead of a verdict: its models are trained for seconds, too little to support any claim
# (norm-placement's quick losses are all above the unigram baseline). An experiment whose quick size measures
# exactly what the full one does (an exact count) sets QUICK_CONCLUDES = True and keeps its verdict.
SMOKE = ("Smoke run (--quick): the models are far too small and too briefly trained to support a conclusion; these "
         "numbers only show that the experiment runs. Run `lumen experiment {name}` (without --quick) for the result.")

__all__ = ["EXPERIMENTS", "Result", "Table", "load_all", "module", "run", "run_all", "write_doc"]


def module(name: str) -> ModuleType:
    """The module implementing experiment `name`, with a clear error for an unknown name."""
    if name not in EXPERIMENTS:
        raise UserError(f"unknown experiment {name!r}; choose one of: {', '.join(EXPERIMENTS)}, or all")
    return importlib.import_module(f"lumen.experiments.{EXPERIMENTS[name]}")


def run(name: str, quick: bool = False, seed: int = 0, out: str | Path | None = None) -> Result:
    """Run one experiment; with `out`, write its table.md, numbers.json and figures into out/name/."""
    mod = module(name)
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with progress(desc=name, unit="step") as fit.BAR:   # its total: the training steps it declares (fit.expect)
        try:
            result = mod.run(quick=quick, seed=seed)
        finally:
            fit.BAR = None
    result.seconds = time.perf_counter() - t0
    result.quick, result.seed, result.machine = quick, seed, cpu.machine(versions=True)
    if quick and not getattr(mod, "QUICK_CONCLUDES", False):
        result.verdict = SMOKE.format(name=name)
    if out is not None:
        result.write(Path(out) / name)
    return result


def run_all(quick: bool = False, seed: int = 0, out: str | Path | None = None, names: list[str] | None = None,
            progress=print) -> list[Result]:
    """Every experiment (or those named), in the chapter's order."""
    results = []
    for name in names or list(EXPERIMENTS):
        progress(f"lumen experiment: {name} ...")
        results.append(run(name, quick, seed, out))
        progress(f"lumen experiment: {name} done in {results[-1].seconds:.0f} s")
    return results


def machines(results: list[Result]) -> str:
    """Where the page's numbers were measured: the one machine, or, where sections were run on several, a word
    that each section names its own."""
    seen = sorted({r.machine or "a machine not recorded" for r in results})
    if len(seen) == 1:
        return f"Machine: {seen[0]}."
    return (f"Machines: {len(seen)} (the sections were run at different times; each names its machine under "
            "its tables).")


def first_sentence(text: str) -> str:
    """Up to the first full stop that ends a sentence (not one inside "et al." or "e.g.")."""
    return re.split(r"(?<=\.)\s+(?=[A-Z])", text, maxsplit=1)[0]


def load_all(out: str | Path, but: str | None = None) -> list[Result]:
    """Every experiment's result as written into out/ (all must be there; `but` may be missing: the one about
    to run, whose result is checked after it)."""
    missing = [n for n in EXPERIMENTS if n != but and not (Path(out) / n / "numbers.json").is_file()]
    if missing:
        raise MissingFileError(f"no results for {', '.join(missing)} in {out} "
                                f"(run `lumen experiment all --out {out}` first)")
    return [Result.load(Path(out) / n) for n in EXPERIMENTS if (Path(out) / n / "numbers.json").is_file()]


def write_doc(results: list[Result], path: str | Path, out: str | Path, command: str) -> Path:
    """docs/experiments.md: every result with its figures (linked relative to the doc), the machine, the wall
    time (the sum of the experiments' own), and the command that regenerates it. An experiment whose module has
    `page(result, figure_dir, command)` also gets a page of its own beside it (docs/NAME.md)."""
    path, out = Path(path), Path(out)
    try:
        rel = out.resolve().relative_to(path.parent.resolve())
    except ValueError:
        rel = out.resolve()
    wall = sum(r.seconds for r in results)
    summed = ", summed over the machines" if len({r.machine for r in results}) > 1 else ""
    sizes = {"quick" if r.quick else "full" for r in results}
    lines = [
        "# The chapter's claims, measured",
        "",
        "Generated by `" + command + "` (do not edit by hand; rerunning one experiment with"
        " `lumen experiment NAME --out " + out.as_posix() + " --doc " + path.as_posix() + "` refreshes its section).",
        "",
        f"{machines(results)} Wall time: {wall / 60:.1f} minutes for all experiments together "
        f"({' and '.join(sorted(sizes))} size{summed}).",
        "",
        "Each section states the chapter's claim, the measured numbers, and what they show, including where they"
        " disagree with the chapter or where the effect needs more compute than this budget. One experiment:"
        " `lumen experiment NAME [--quick] [--seed S] [--out DIR]` (`lumen experiment list` names them). The numbers"
        " are the same for the same seed on the same machine and thread count; wall times vary, and the CPU was"
        " shared with other work while these ran.",
        "",
        "| experiment | what it shows |",
        "|---|---|",
    ]
    lines += [f"| [{r.name}](#{r.name}) | {first_sentence(r.verdict)} |" for r in results]
    lines.append("")
    for r in results:
        lines.append(r.markdown(figure_dir=f"{rel.as_posix()}/{r.name}"))
        page = getattr(module(r.name), "page", None)
        if page is not None:   # an experiment with a page of its own (a worked analysis): beside this one
            own = f"lumen experiment {r.name} --out {out.as_posix()} --doc {path.as_posix()}"
            write_text(path.parent / f"{r.name}.md", page(r, f"{rel.as_posix()}/{r.name}", own))
    return write_text(path, "\n".join(lines))
