"""A dataset of prompts (a file read by lumen.prompts) through the lens, direct logit attribution and activation
patching: every prompt's own result, read at its last token, and the dataset's mean. What `lumen lens`,
`attribute` and `patch --prompts FILE` print, for a Python user too.

    >>> prompts = read_prompts("ioi.jsonl", tok, model.cfg.context)     # doctest: +SKIP
    >>> found = attribute_prompts(model, prompts, tok)                  # doctest: +SKIP
    >>> float(found.mean.logit[0]), found.mean.row("blocks.9.attn")     # doctest: +SKIP

The prompts run as padded batches (`batch_size` side by side); each prompt's numbers are what it gets alone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ..errors import UserError
from ..model import GPT
from ..prompts import BATCH_SIZE, Prompt, batches, padded
from ..tokenizers import Batch
from ..tokenizers.shown import logit_name, quoted
from .attribution import Attribution, attribute, top_components
from .attribution_patching import attribution_patching
from .lens import Lens, LensResult, logit_lens
from .patching import KINDS, Patching, PatchingSet, logit_diff, logprob, patching_maps
from .stack import accumulated

METRICS = ("logit-diff", "logprob")   # what patching measures: logit[answer] - logit[wrong], or log p(answer)


def _rounded(x: torch.Tensor) -> list[float]:
    return [round(float(v), 6) for v in x]


def reading_name(tok, answer: int | None, wrong: int | None) -> str:
    """What a lens reads of the answer, in words: "logit[' Mary']" or "logit[' Mary'] - logit[' John']"."""
    if answer is None:
        return ""
    return logit_name(tok.decode([answer]), tok.decode([wrong]) if wrong is not None else None)


def answer_readings(model: GPT, lens: Lens, idx: torch.Tensor | Batch, answers: list[int],
                    wrongs: list[int] | None) -> torch.Tensor:
    """(layers + 1, B, T): logit[answer] (minus logit[wrong]) read through the lens after the embedding and every
    block (the accumulated stream, each row with its own norm scale), one answer (and wrong token) per prompt."""
    with torch.no_grad():
        stack = accumulated(model, idx, lens=lens)
        a = torch.tensor(answers)
        if wrongs is not None:
            return stack.logit_diff(a, torch.tensor(wrongs))
        return stack.logits(a).diagonal(dim1=1, dim2=3).permute(0, 2, 1)   # each prompt's own answer


# --- the lens -------------------------------------------------------------------------------------------------

@dataclass
class LensSet:
    """A lens on every prompt of a dataset, each read at its last token, and the mean over them per layer.
    values: (n, layers + 1) each prompt's reading of its answer (when the prompts name answers)."""

    prompts: list[Prompt]
    results: list[LensResult]
    values: torch.Tensor | None = None
    readings: list[str] | None = None    # each prompt's reading in words (reading_name)
    lens: str = "logit lens"

    @property
    def kl(self) -> torch.Tensor:
        """(n, layers + 1) KL from the final output after each layer, at each prompt's last token."""
        return torch.stack([r.kl[:, -1] for r in self.results])

    @property
    def top1_is_final(self) -> torch.Tensor:
        """(n, layers + 1) 1 where a layer's top-1 is already the model's final top-1."""
        return torch.stack([r.top_ids[:, -1, 0] == r.top_ids[-1, -1, 0] for r in self.results]).double()

    @property
    def first_top1(self) -> torch.Tensor:
        """(n,) the first layer whose top-1 is the final one (0: the embedding), per prompt."""
        return torch.tensor([r.first_top1_layer() for r in self.results], dtype=torch.float64)

    @property
    def what(self) -> str | None:
        """The answers' reading in general words, or None without answers."""
        if self.values is None:
            return None
        return "logit[answer] - logit[wrong]" if self.prompts[0].wrong is not None else "logit[answer]"

    def mean(self) -> dict[str, torch.Tensor]:
        """The dataset's mean per layer: "kl", "top1_is_final", "first_top1" (a number), "values" (with answers)."""
        found = {"kl": self.kl.double().mean(0), "top1_is_final": self.top1_is_final.mean(0),
                 "first_top1": self.first_top1.mean()}
        if self.values is not None:
            found["values"] = self.values.double().mean(0)
        return found

    def to_dict(self) -> dict:
        """Plain numbers: what it reads, every prompt's row, and the mean."""
        rows = []
        for i, (p, r) in enumerate(zip(self.prompts, self.results)):
            row = {"line": p.line, "prompt": p.text, "tokens": r.tokens, "final": r.vocab_of(int(r.top_ids[-1, -1, 0])),
                   "first_top1": r.first_top1_layer(), "top1": [r.vocab_of(int(t)) for t in r.top_ids[:, -1, 0]],
                   "top1_prob": _rounded(r.top_probs[:, -1, 0]), "kl": _rounded(r.kl[:, -1])}
            if self.values is not None and self.readings is not None:
                row |= {"what": self.readings[i], "values": _rounded(self.values[i])}
            rows.append(row)
        mean = self.mean()
        summary = {"kl": _rounded(mean["kl"]), "top1_is_final": _rounded(mean["top1_is_final"]),
                   "first_top1": round(float(mean["first_top1"]), 6)}
        if "values" in mean:
            summary["values"] = _rounded(mean["values"])
        return {"what": self.what, "prompts": rows, "mean": summary}


def lens_prompts(model: GPT, prompts: Sequence[Prompt], lens: Lens, k: int = 5, tokenizer=None,
                 batch_size: int = BATCH_SIZE, name: str = "logit lens") -> LensSet:
    """The lens on every prompt, batch by batch: each read at its last token, and its answer's reading
    (logit[answer], or minus logit[wrong]) after every layer when the prompts name answers."""
    found: list[LensResult] = []
    values: list[torch.Tensor] = []          # each prompt's (layers + 1,) reading of its answer
    answered = prompts[0].answer is not None
    for group in batches(prompts, batch_size, model.cfg.vocab_size, "reading each prompt"):
        batch = padded(group).to(model.device)
        found += logit_lens(model, batch, lens, k, tokenizer)
        if answered:
            wrongs = [int(p.wrong) for p in group if p.wrong is not None] or None
            reading = answer_readings(model, lens, batch, [int(p.answer) for p in group if p.answer is not None],
                                      wrongs)
            values += [reading[:, b, int(batch.last[b])].cpu() for b in range(len(group))]
    if not answered:
        return LensSet(list(prompts), found, lens=name)
    names = [reading_name(tokenizer, p.answer, p.wrong) for p in prompts] if tokenizer is not None else None
    return LensSet(list(prompts), found, torch.stack(values), names, name)


# --- direct logit attribution ---------------------------------------------------------------------------------

def summary(a: Attribution, t: int) -> dict:
    """Position t of an attribution as plain numbers: the logit, every component, every head, the largest parts."""
    return {"logit": round(float(a.logit[t]), 6),
            "components": {c: round(float(v[t]), 6) for c, v in zip(a.components, a.values)},
            "heads": [[round(float(x), 6) for x in layer] for layer in a.heads[..., t]],
            "attn_bias": [round(float(x), 6) for x in a.attn_bias[:, t]],
            "top": [[c, round(v, 6)] for c, v in top_components(a, t, 10)]}


@dataclass
class AttributionSet:
    """Direct logit attribution of every prompt of a dataset at its last token, and the mean of every component,
    which adds up to the mean logit (a mean of sums is the sum of the means)."""

    prompts: list[Prompt]
    results: list[Attribution]

    @property
    def mean(self) -> Attribution:
        """The dataset's mean as an Attribution of one position (index 0), drawn and printed like a prompt's."""
        found = self.results
        return Attribution([-1], ["(mean)"], [], None, found[0].components,
                           torch.stack([a.values[:, -1] for a in found]).mean(0)[:, None],
                           torch.stack([a.heads[..., -1] for a in found]).mean(0)[..., None],
                           torch.stack([a.attn_bias[:, -1] for a in found]).mean(0)[:, None],
                           torch.stack([a.logit[-1] for a in found]).double().mean()[None])

    @property
    def what(self) -> str:
        if self.prompts[0].answer is None:
            return "logit[the model's own top-1]"
        return "logit[answer] - logit[wrong]" if self.prompts[0].wrong is not None else "logit[answer]"

    def row(self, i: int, name_of: Callable[[int], str] = str) -> dict:
        """Prompt i's row: its line, text and target tokens (named by name_of), and its split at its last token."""
        p, a = self.prompts[i], self.results[i]
        t = len(a.ids) - 1
        target, minus = name_of(a.target[t]), name_of(a.minus[t]) if a.minus is not None else None
        what = logit_name(target, minus)
        return {"line": p.line, "prompt": p.text, "target": target, "minus": minus, "what": what, **summary(a, t)}

    def to_dict(self, name_of: Callable[[int], str] = str) -> dict:
        """Plain numbers: what is split, every prompt's row, and the mean's."""
        return {"what": self.what, "prompts": [self.row(i, name_of) for i in range(len(self.prompts))],
                "mean": summary(self.mean, 0)}


def attribute_prompts(model: GPT, prompts: Sequence[Prompt], tokenizer=None,
                      batch_size: int = BATCH_SIZE) -> AttributionSet:
    """Direct logit attribution of every prompt, batch by batch: logit[answer] - logit[wrong] where the prompts
    name both, logit[answer] where they name one, else the logit of each prompt's own top-1 prediction."""
    found: list[Attribution] = []
    for group in batches(prompts, batch_size, model.cfg.vocab_size, "attributing each prompt"):
        answers = [p.answer for p in group]
        if group[0].wrong is not None:
            kw: dict = {"contrast": (answers, [p.wrong for p in group])}
        else:
            kw = {"target": answers} if group[0].answer is not None else {}
        found += attribute(model, padded(group).to(model.device), tokenizer=tokenizer, **kw)
    return AttributionSet(list(prompts), found)


# --- activation patching --------------------------------------------------------------------------------------

def metric_name(tok, metric: str, a: int, b: int | None) -> str:
    """A pair's metric in words: "logit[' Mary'] - logit[' John']" (logit-diff) or "log p(' Mary')" (logprob)."""
    if metric == "logit-diff":
        return logit_name(tok.decode([a]), tok.decode([b]))
    return f"log p({quoted(tok.decode([a]))})"


def patch_prompts(model: GPT, prompts: Sequence[Prompt], metric: str = "logit-diff",
                  kinds: Sequence[str] = tuple(KINDS), methods: Sequence[str] = ("exact",), tokenizer=None,
                  batch_size: int = BATCH_SIZE, source: str = "the prompts") -> dict[str, PatchingSet]:
    """Patching on every pair (prompts read with pairs=True), batch by batch, by each method ("exact": one
    patched run per cell, lumen.inspect.patching; "attribution": the first-order estimate): method -> PatchingSet.
    metric: "logit-diff" (logit[answer] - logit[wrong]) or "logprob" (log p(answer)); a pair without answers
    compares its clean and its corrupted prompt's own predictions. source names the prompts in errors."""
    if metric not in METRICS:
        raise UserError(f"unknown metric {metric!r}; the metrics are {', '.join(METRICS)}")
    run = {"exact": patching_maps, "attribution": attribution_patching}
    unknown = [m for m in methods if m not in run]
    if unknown:
        raise UserError(f"unknown method {unknown[0]!r}; the methods are {', '.join(run)}")
    found: dict[str, list[Patching]] = {m: [] for m in methods}
    for group in batches(prompts, batch_size, model.cfg.vocab_size, "patching each pair"):
        pairs = [_answers(p, own, metric, tokenizer, source) for p, own in zip(group, _predictions(model, group))]
        metrics = [logit_diff(a, b) if metric == "logit-diff" else logprob(a) for a, b in pairs]
        for method, kept in found.items():
            try:
                result = run[method](model, padded(group).to(model.device),
                                     padded(group, corrupt=True).to(model.device), metrics, kinds=kinds,
                                     tokenizer=tokenizer)
            except UserError as e:
                lines = ", ".join(str(p.line) for p in group)
                raise UserError(f"{source}, the pairs of lines {lines}: {e}") from None
            if tokenizer is not None:
                for r, (a, b) in zip(result.pairs, pairs):
                    r.metric_name = metric_name(tokenizer, metric, a, b)
            kept += result.pairs
    return {m: PatchingSet(pairs) for m, pairs in found.items()}


def _predictions(model: GPT, group: list[Prompt]) -> list[tuple[int, int]]:
    """Each pair's own next-token predictions at its last token: (clean, corrupt)."""
    found = []
    with torch.no_grad():
        for corrupt in (False, True):
            b = padded(group, corrupt).to(model.device)
            logits, _ = model(b.ids, mask=b.mask)
            found.append(logits[torch.arange(len(b)), b.last].argmax(-1).tolist())
    return list(zip(*found))


def _answers(p: Prompt, own: tuple[int, int], metric: str, tok, source: str) -> tuple[int, int]:
    """A pair's answer and wrong token: the file's (or the command line's), else each prompt's own prediction."""
    a = p.answer if p.answer is not None else own[0]
    b = p.wrong if p.wrong is not None else own[1]
    if metric == "logit-diff" and a == b:
        said = quoted(tok.decode([a])) if tok is not None else f"id {a}"
        raise UserError(f"{source}, line {p.line}: the answer and the wrong token are both {said}: "
                        "give \"answer\" and \"wrong\" in the file")
    return a, b
