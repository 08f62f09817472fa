"""Experiment `ioi`: indirect-object identification on SmolLM2, the worked analysis of a dataset of prompts.

"When Mary and John went to the store, John gave a drink to" -> " Mary" over " John" (Wang et al. 2022). The
name to say is the indirect object (IO), the one mentioned once; the subject (S) is mentioned twice. Two
corruptions: "S2": the second mention of S swapped for the IO ("..., Mary gave a drink to"), so that the other
name becomes the answer and the logit difference logit[IO] - logit[S] flips sign; "ABC": both names replaced
everywhere by a third and a fourth ("When Tom and Anna went to the store, Anna gave a drink to"), so that the
prompt has the same structure but neither name, and the logit difference goes to about 0. On padded batches:

1. the logit difference per prompt and its mean;
2. direct logit attribution (lumen.inspect.attribute): which blocks and heads write IO over S at the last position;
3. activation patching (patching_maps): the stream entering each block at the prompt's named positions, and each
   head's output; attribution patching (one forward and one backward pass) beside it, and their correlation;
4. path patching: which heads feed the queries of the heads that write the answer;
5. exact and attribution patching again against the ABC corruption: what carries the names themselves, not
   only which of them is repeated.

`study(model, tokenizer, size)` runs it on any lumen model whose tokenizer has the names as single tokens (the
fast test uses a tiny one); `run` is the experiment on SmolLM2.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import TypedDict

import torch

from .. import names
from ..inspect import (
    Site,
    attribute,
    attribution_patching,
    logit_diff,
    patch,
    patching_maps,
    path_patching,
    run_with_cache,
)
from ..inspect.attribution_patching import correlation
from ..inspect.patching import Patching, PatchingSet
from ..model import GPT
from ..prompts import IOI_NAMES as NAMES
from ..prompts import IOI_TEMPLATES as TEMPLATES
from ..tokenizers import Batch, Tokenizer, single_token
from ..tokenizers.shown import quoted
from .result import Result, Table, figure
from .subjects import smollm2

NAME = "ioi"
CLAIM = ("Attention heads copy facts from other positions' memories into this one; late layers' heads often copy "
         "likely continuations from the context (the chapter's residual picture): here, which of SmolLM2's heads "
         "copy the right name of two into the last position.")

# {A} and {B}: the two names in the order they are introduced; {S}: the subject's second mention
ROLES = ("IO", "S1", "S2", "END")   # the indirect object, the subject's two mentions, the last token
CORRUPTIONS = {"S2": "S2 -> IO", "ABC": "all names replaced"}


class Size(TypedDict):
    prompts: int     # the dataset (half ABB: IO first, half BAB: S first; the same names and template for both)
    exact: int       # the prompts patched exactly (the first ones), beside attribution patching
    path: int        # the prompts path patching runs on
    receivers: int   # the top heads by direct attribution whose queries are the receivers


SIZES = {False: Size(prompts=32, exact=6, path=3, receivers=3), True: Size(prompts=4, exact=1, path=1, receivers=1)}


@dataclass(frozen=True)
class Prompt:
    """One IOI prompt and its corruptions: the answer is " " + io over " " + s (S2's corrupt prompt: s over io);
    c and d: the names that replace io and s in the ABC corruption."""

    template: int
    io: str
    s: str
    order: str   # "ABB" (the IO introduced first) or "BAB"
    c: str
    d: str

    def text(self, second: str, io: str | None = None, s: str | None = None) -> str:
        io, s = io or self.io, s or self.s
        a, b = (io, s) if self.order == "ABB" else (s, io)
        return TEMPLATES[self.template].format(A=a, B=b, S=second)

    @property
    def clean(self) -> str:
        return self.text(self.s)

    @property
    def corrupt(self) -> str:
        """The second mention of S swapped for the IO: now the other name is the one mentioned once."""
        return self.text(self.io)

    @property
    def abc(self) -> str:
        """Both names replaced everywhere (IO by c, S by d): the same structure, neither name."""
        return self.text(self.d, self.c, self.d)

    def corrupted(self, corruption: str) -> str:
        """The prompt corrupted by one of CORRUPTIONS."""
        if corruption not in CORRUPTIONS:
            raise ValueError(f"unknown corruption {corruption!r}; the corruptions are {', '.join(CORRUPTIONS)}")
        return self.corrupt if corruption == "S2" else self.abc


def dataset(n: int, seed: int) -> list[Prompt]:
    """n prompts (n even): n/2 draws of a template and two names, each in both orders; the ABC corruption's two
    other names from a draw of their own (so that the IO and S of a seed do not depend on it)."""
    rng, others = random.Random(seed), random.Random(f"abc {seed}")
    found = []
    for k in range(n // 2):
        io, s = rng.sample(NAMES, 2)
        c, d = others.sample([m for m in NAMES if m not in (io, s)], 2)
        t = k % len(TEMPLATES)
        found += [Prompt(t, io, s, "ABB", c, d), Prompt(t, io, s, "BAB", c, d)]
    return found


@dataclass
class Tokens:
    """A dataset as the model reads it: padded Batches of the clean and corrupted prompts, the two names' ids
    per prompt, and each prompt's named positions (its own token indices)."""

    clean: Batch
    corrupt: Batch
    io: list[int]
    s: list[int]
    roles: list[dict[str, int]]
    tokens: list[list[str]] = field(default_factory=list)


def tokenize(tok: Tokenizer, prompts: list[Prompt], corruption: str = "S2") -> Tokens:
    """The dataset's ids, corrupted by `corruption` (CORRUPTIONS); every name must be one token of `tok` (a clear
    error otherwise)."""
    io = [single_token(tok, " " + p.io, f"IOI name {p.io!r}") for p in prompts]
    s = [single_token(tok, " " + p.s, f"IOI name {p.s!r}") for p in prompts]
    clean, corrupt = tok.pad([p.clean for p in prompts]), tok.pad([p.corrupted(corruption) for p in prompts])
    roles = []
    for b, (x, y) in enumerate(zip(clean.rows(), corrupt.rows())):
        if len(x) != len(y):
            raise AssertionError(f"prompt {b}: clean and corrupted must tokenize to one length ({len(x)}, {len(y)})")
        at_s = [t for t, i in enumerate(x) if i == s[b]]
        roles.append({"IO": x.index(io[b]), "S1": at_s[0], "S2": at_s[-1], "END": len(x) - 1})
    return Tokens(clean, corrupt, io, s, roles, [tok.str_tokens(r) for r in clean.rows()])


def first(batch: Batch, n: int) -> Batch:
    """The first n prompts of a left-padded batch, padding trimmed to the longest of them."""
    width = int(batch.lengths[:n].max())
    return Batch(batch.ids[:n, -width:], batch.mask[:n, -width:], batch.side)


def by_role(patched: PatchingSet, roles: list[dict[str, int]]) -> torch.Tensor:
    """resid_pre patching over the dataset at each named position (L, roles): the fraction restored, (mean patched
    metric - mean corrupt) / (mean clean - mean corrupt), with prompts aligned at their roles, not their columns."""
    vals = torch.stack([torch.stack([p.values("resid_pre")[:, r[role]] for role in ROLES], -1)
                        for p, r in zip(patched.pairs, roles)]).mean(0)
    return (vals - patched.corrupt_metric) / (patched.clean_metric - patched.corrupt_metric)


def every_cell(patched: PatchingSet) -> torch.Tensor:
    """Every pair's head map, stacked: (pairs, L, H)."""
    return torch.stack([p.maps["head"] for p in patched.pairs])


def top_heads(m: torch.Tensor, n: int, sign: float = 1.0) -> list[tuple[int, int, float]]:
    """The n cells (layer, head, value) of an (L, H) map largest in sign * value (NaN last)."""
    flat = torch.nan_to_num(sign * m.double(), nan=-float("inf")).flatten()
    order = flat.argsort(descending=True)[:n]
    return [(int(k) // m.size(1), int(k) % m.size(1), float(m.flatten()[k])) for k in order]


@torch.no_grad()
def attention_to_names(model: GPT, data: Tokens, heads: list[tuple[int, int, float]]) -> list[dict[str, float]]:
    """How much each head's query at END attends to the IO and to S's two mentions, averaged over the dataset."""
    want = sorted({names.activation(i, "attn_pattern") for i, _, _ in heads})
    _, cache = run_with_cache(model, data.clean, want)
    width = data.clean.ids.size(1)
    found = []
    for i, h, _ in heads:
        pat = cache[names.activation(i, "attn_pattern")]                         # (B, H, T, T), padded columns
        share = {role: 0.0 for role in ("IO", "S1", "S2")}
        for b, r in enumerate(data.roles):
            off = width - (r["END"] + 1)                                          # left padding
            for role in share:
                share[role] += float(pat[b, h, off + r["END"], off + r[role]]) / len(data.roles)
        found.append(share)
    return found


def patched(model: GPT, tok: Tokenizer, data: Tokens, metrics: list, k: int) -> dict:
    """Exact patching of the first k prompts (the stream at the named positions, every head's output), attribution
    patching of the same ones and of all beside it, and how well the two agree (Pearson's r)."""
    with torch.no_grad():
        exact = patching_maps(model, first(data.clean, k), first(data.corrupt, k), metrics[:k],
                              kinds=("resid_pre", "head"), tokenizer=tok)
    approx = attribution_patching(model, first(data.clean, k), first(data.corrupt, k), metrics[:k],
                                  kinds=("resid_pre", "head"), tokenizer=tok)
    approx_all = attribution_patching(model, data.clean, data.corrupt, metrics, kinds=("head",), tokenizer=tok)
    resid = by_role(exact, data.roles[:k])                                     # (L, roles)
    resid_approx = by_role(approx, data.roles[:k])
    exact_heads, approx_heads = exact.mean("head"), approx.mean("head")
    agree = {"head_mean": correlation(exact_heads, approx_heads),
             "head_cells": correlation(every_cell(exact), every_cell(approx)),
             "resid_pre_roles": correlation(resid, resid_approx)}
    return {"pairs": k, "resid_pre_roles": resid.tolist(), "resid_pre_roles_attribution": resid_approx.tolist(),
            "head": exact_heads.tolist(), "head_attribution": approx_heads.tolist(),
            "head_attribution_all": approx_all.mean("head").tolist(), "top": top_heads(exact_heads, 5),
            "correlation": agree}


def study(model: GPT, tok: Tokenizer, size: Size, seed: int = 0) -> dict:
    """The whole analysis (module docstring) on one model; every number the page states."""
    prompts = dataset(size["prompts"], seed)
    data = tokenize(tok, prompts)
    n, L = len(prompts), len(model.blocks)
    H = model.attention(0).n_heads

    # 1. the logit difference per prompt, clean and corrupted
    diffs = {}
    with torch.no_grad():
        for what, batch in (("clean", data.clean), ("corrupt", data.corrupt)):
            logits = model(batch.ids, mask=batch.mask)[0][torch.arange(n), batch.last].double()
            diffs[what] = (logits[torch.arange(n), data.io] - logits[torch.arange(n), data.s])
            if what == "clean":
                top1_io = float((logits.argmax(-1) == torch.tensor(data.io)).double().mean())

    # 2. direct logit attribution at the last position, per block and per head
    attrs = attribute(model, data.clean, contrast=(data.io, data.s), tokenizer=tok)
    per_prompt = torch.stack([a.values[:, -1] for a in attrs])                  # (n, C)
    heads = torch.stack([a.heads[:, :, -1] for a in attrs])                     # (n, L, H)
    biases = torch.stack([a.attn_bias[:, -1] for a in attrs])                   # (n, L)
    logit = torch.stack([a.logit[-1] for a in attrs]).double()
    comps = attrs[0].components
    not_attn = [c for c, name in enumerate(comps) if not name.endswith(".attn")]
    sum_error = float((per_prompt.sum(1) - logit).abs().max())
    head_sum_error = float((heads.sum((1, 2)) + biases.sum(1) + per_prompt[:, not_attn].sum(1) - logit).abs().max())
    mean_rows = {c: float(per_prompt[:, k].mean()) for k, c in enumerate(comps)}
    dla = heads.mean(0)                                                        # (L, H)
    writers = top_heads(dla, 5)
    against = top_heads(dla, 3, -1.0)
    # the same split for logit[IO] and logit[S] alone: does a head raise the IO, or push the subject down?
    alone = {who: torch.stack([a.heads[:, :, -1] for a in attribute(model, data.clean, target=ids)]).mean(0)
             for who, ids in (("io", data.io), ("s", data.s))}

    # 3. exact patching of the first prompts, and attribution patching of the same ones and of all
    k = size["exact"]
    metrics = [logit_diff(a, b) for a, b in zip(data.io, data.s)]
    patching = patched(model, tok, data, metrics, k)

    # 4. path patching: every earlier head -> the queries, at END, of the heads that write the answer most
    # (the top writers outside block 0, whose heads have no senders)
    receivers = [(i + 1, h) for i, h, _ in top_heads(dla[1:], size["receivers"])]
    paths: list[Patching] = []
    for b in range(size["path"]):
        end = data.roles[b]["END"]
        found = path_patching(model, data.clean.row(b), data.corrupt.row(b), metrics[b],
                              [Site("q", i, end, h) for i, h in receivers], tokenizer=tok)
        assert isinstance(found, Patching)
        paths.append(found)
    path_mean = PatchingSet(paths).mean("head")                               # (L, H), NaN above the receivers
    # what the receivers can carry at most: their queries at END, or their whole outputs, patched all together
    bound = {kind: [patch(model, data.clean.row(b), data.corrupt.row(b),
                          [Site(kind, i, data.roles[b]["END"] if kind == "q" else None, h) for i, h in receivers],
                          metrics[b]) for b in range(size["path"])] for kind in ("q", "head")}
    senders = top_heads(path_mean, 5)

    # 5. the ABC corruption: both names replaced, so that the corrupted prompt names neither
    other = tokenize(tok, prompts, "ABC")
    with torch.no_grad():
        logits = model(other.corrupt.ids, mask=other.corrupt.mask)[0][torch.arange(n), other.corrupt.last].double()
    abc_diff = logits[torch.arange(n), data.io] - logits[torch.arange(n), data.s]
    abc = {"logit_diff_corrupt": abc_diff.tolist(), "mean_logit_diff_corrupt": float(abc_diff.mean()),
           "example": prompts[0].abc, **patched(model, tok, other, metrics, k)}

    return {
        "prompts": [{"clean": p.clean, "corrupt": p.corrupt, "abc": p.abc, "io": p.io, "s": p.s, "c": p.c,
                     "d": p.d, "order": p.order, "template": p.template} for p in prompts],
        "tokens_first": data.tokens[0], "roles_first": data.roles[0],
        "n_layers": L, "n_heads": H,
        "logit_diff": diffs["clean"].tolist(), "logit_diff_corrupt": diffs["corrupt"].tolist(),
        "mean_logit_diff": float(diffs["clean"].mean()), "mean_logit_diff_corrupt": float(diffs["corrupt"].mean()),
        "fraction_positive": float((diffs["clean"] > 0).double().mean()), "top1_is_io": top1_io,
        "by_order": {o: float(diffs["clean"][[p.order == o for p in prompts]].mean()) for o in ("ABB", "BAB")},
        "attribution": {"mean_rows": mean_rows, "heads": dla.tolist(), "sum_error": sum_error,
                        "head_sum_error": head_sum_error, "writers": writers, "against": against,
                        "writers_io_s": [[float(alone["io"][i, h]), float(alone["s"][i, h])] for i, h, _ in writers],
                        "heads_io": alone["io"].tolist(), "heads_s": alone["s"].tolist(),
                        "mean_logit": float(logit.mean()),
                        "attn_total": float(heads.sum((1, 2)).mean() + biases.sum(1).mean()),
                        "mlp_total": sum(v for c, v in mean_rows.items() if c.endswith(".mlp"))},
        "attention": attention_to_names(model, data, writers),
        "patching": patching,
        "abc": abc,
        "path": {"pairs": size["path"], "receivers": receivers, "head": path_mean.tolist(), "top": senders,
                 "receivers_queries": sum(bound["q"]) / len(bound["q"]),
                 "receivers_outputs": sum(bound["head"]) / len(bound["head"])},
    }


def run(quick: bool, seed: int) -> Result:
    model, tok = smollm2()
    n = study(model, tok, SIZES[quick], seed)
    return result(n)


def heads_text(cells: list) -> str:
    """Heads (block.head) with a value in logit units."""
    return ", ".join(f"{i}.{h} ({v:+.2f})" for i, h, v in cells)


def fractions(cells: list) -> str:
    """Heads (block.head) with a fraction restored."""
    return ", ".join(f"{i}.{h} ({v:.0%})" for i, h, v in cells)


def result(n: dict) -> Result:
    """The page's tables, verdict and figure from `study`'s numbers."""
    L, H = n["n_layers"], n["n_heads"]
    a, p, path, abc = n["attribution"], n["patching"], n["path"], n["abc"]
    clean, corrupt = torch.tensor(n["logit_diff"]), torch.tensor(n["logit_diff_corrupt"])
    t_data = Table(f"logit[IO] - logit[S] at the last position, {len(clean)} prompts "
                   f"({len(TEMPLATES)} templates, both orders)",
                   ["prompts", "mean", "min", "max", "> 0"],
                   [[what, float(d.mean()), float(d.min()), float(d.max()), float((d > 0).double().mean())]
                    for what, d in (("clean", clean), ("corrupted (S2 -> IO)", corrupt),
                                    ("corrupted (all names replaced)", torch.tensor(abc["logit_diff_corrupt"])))])
    att = n["attention"]
    t_dla = Table("Direct logit attribution of logit[IO] - logit[S] at the last position, mean over the prompts: the "
                  "heads (block.head) that write the most for IO, and the attention their query at END pays to each "
                  "name", ["head", "to logit[IO] - logit[S]", "to logit[IO]", "to logit[S]", "attention to IO",
                           "to S1", "to S2"],
                  [[f"{i}.{h}", v, io, s_, w["IO"], w["S1"], w["S2"]]
                   for (i, h, v), (io, s_), w in zip(a["writers"], a["writers_io_s"], att)]
                  + [[f"{i}.{h}", v, None, None, None, None, None] for i, h, v in a["against"]])
    resid, approx = p["resid_pre_roles"], p["resid_pre_roles_attribution"]
    t_resid = Table(f"Patching the stream entering each block at the prompt's named positions, {p['pairs']} prompts: "
                    "the fraction of the logit difference restored (exact; attribution patching estimates S2 and END)",
                    ["block", *ROLES, "S2 (attribution)", "END (attribution)"],
                    [[i, *[round(v, 3) + 0.0 for v in resid[i]], round(approx[i][2], 3) + 0.0,
                      round(approx[i][3], 3) + 0.0] for i in range(L)])
    est = torch.tensor(p["head_attribution"])
    dla = torch.tensor(a["heads"])
    t_heads = Table(f"Patching one head's output (all positions), {p['pairs']} prompts: the heads that restore most, "
                    "beside attribution patching's estimate and the head's direct logit attribution",
                    ["head", "restored (exact)", "restored (attribution patching)", "direct contribution"],
                    [[f"{i}.{h}", v, float(est[i, h]), float(dla[i, h])] for i, h, v in p["top"]])
    recv = ", ".join(f"{i}.{h}" for i, h in path["receivers"])
    t_path = Table(f"Path patching, {path['pairs']} prompts: the fraction restored by the path from each head to the "
                   f"queries at END of {recv} alone (the top senders), beside patching those queries all together and "
                   "those heads' whole outputs all together", ["patched", "restored"],
                   [[f"path from {i}.{h}", v] for i, h, v in path["top"]]
                   + [[f"the receivers' queries at END ({recv})", path["receivers_queries"]],
                      [f"the receivers' outputs ({recv})", path["receivers_outputs"]]])
    c, c_abc = p["correlation"], abc["correlation"]
    t_agree = Table("Attribution patching against exact patching (Pearson's r), for each corruption",
                    ["cells", "r (S2 -> IO)", "r (all names replaced)"],
                    [[f"head map, mean over {p['pairs']} prompts ({L * H} cells)", c["head_mean"], c_abc["head_mean"]],
                     [f"head map, every prompt's cells ({p['pairs'] * L * H})", c["head_cells"], c_abc["head_cells"]],
                     [f"stream at the named positions, mean ({L * len(ROLES)} cells)", c["resid_pre_roles"],
                      c_abc["resid_pre_roles"]]])
    both = torch.tensor(abc["resid_pre_roles"])
    t_abc = Table(f"All names replaced (ABC), {abc['pairs']} prompts: patching the stream entering each block at "
                  "the named positions (exact; attribution patching's estimate at END beside it), and beside it the "
                  "S2 -> IO swap's END", ["block", *ROLES, "END (attribution)", "END (S2 -> IO)"],
                  [[i, *[round(float(v), 3) + 0.0 for v in both[i]],
                    round(abc["resid_pre_roles_attribution"][i][3], 3) + 0.0, round(resid[i][3], 3) + 0.0]
                   for i in range(L)])
    exact_s2, est_abc = torch.tensor(p["head"]), torch.tensor(abc["head_attribution"])
    t_abc_heads = Table(f"All names replaced (ABC), {abc['pairs']} prompts: the heads whose output restores most, "
                        "beside attribution patching's estimate and the same head under the S2 -> IO swap",
                        ["head", "restored (exact)", "restored (attribution patching)", "restored (S2 -> IO, exact)"],
                        [[f"{i}.{h}", v, float(est_abc[i, h]), float(exact_s2[i, h])] for i, h, v in abc["top"]])
    numbers = {k: v for k, v in n.items()}
    return Result(NAME, CLAIM, [t_data, t_dla, t_heads, t_resid, t_agree, t_path, t_abc, t_abc_heads], verdict(n),
                  numbers, {"ioi": draw(n)}, notes(n))


def moved_at(resid: list[list[float]], role: str, level: float = 0.5) -> int | None:
    """The first block at whose entry the stream at `role` alone restores at least `level`."""
    k = ROLES.index(role)
    return next((i for i, row in enumerate(resid) if row[k] >= level), None)


def verdict(n: dict) -> str:
    a, p, path = n["attribution"], n["patching"], n["path"]
    L = n["n_layers"]
    parts = [f"SmolLM2 prefers the indirect object on {n['fraction_positive']:.0%} of the {len(n['logit_diff'])} "
             f"prompts (mean logit difference {n['mean_logit_diff']:+.2f}; ABB {n['by_order']['ABB']:+.2f}, BAB "
             f"{n['by_order']['BAB']:+.2f}; the IO is its top-1 token on {n['top1_is_io']:.0%}), and the swap of the "
             f"subject's second mention moves it to {n['mean_logit_diff_corrupt']:+.2f}."]
    attn, mlp = a["attn_total"], a["mlp_total"]
    w = a["writers"]
    att = n["attention"]
    split = a["writers_io_s"]
    movers = [f"{i}.{h}" for (i, h, _), s, (io, sj) in zip(w, att, split) if s["IO"] > s["S1"] + s["S2"] and io > -sj]
    pushers = [f"{i}.{h}" for (i, h, _), s, (io, sj) in zip(w, att, split)
               if s["S1"] + s["S2"] > s["IO"] and -sj > io]
    parts.append(f"Direct logit attribution (it sums to the model's logit difference to {a['sum_error']:.0e}, heads "
                 f"and biases included to {a['head_sum_error']:.0e}): attention writes {attn:+.2f} of the mean "
                 f"{a['mean_logit']:+.2f} and the MLPs {mlp:+.2f}; the heads writing most for IO are "
                 f"{heads_text(w[:3])}, and {heads_text(a['against'][:2])} write for S.")
    if movers:
        parts.append(f"Of the top five, {', '.join(movers)} attend{'s' if len(movers) == 1 else ''} from END more to "
                     "the IO than to both mentions of S together and raise logit[IO] more than they lower logit[S]: "
                     "name movers in Wang et al.'s sense.")
    if pushers:
        one = len(pushers) == 1
        it, s_ = ("it", "s") if one else ("they", "")
        parts.append(f"{', '.join(pushers)} instead attend{s_} to S's mentions and lower{s_} logit[S] more than "
                     f"{it} raise{s_} logit[IO]: {it} suppress{'es' if one else ''} the repeated name rather than "
                     "copying the other.")
    blind = [f"{i}.{h} ({s['IO'] + s['S1'] + s['S2']:.0%})" for (i, h, _), s in zip(w, att)
             if s["IO"] + s["S1"] + s["S2"] < 0.05]
    if blind:
        parts.append(f"{', '.join(blind)} {'writes' if len(blind) == 1 else 'write'} for IO with almost none of "
                     "the attention at END on the three mentions (the share in brackets): that write is not copied "
                     "from a name's position.")
    if not movers and not pushers:
        parts.append("None of the top five attends from END mostly to one name: their writes are not a plain copy.")
    resid = p["resid_pre_roles"]
    end = moved_at(resid, "END")
    leaves = next((i for i, row in enumerate(resid) if row[2] < 0.9), None)
    if end is not None and resid[0][2] >= 0.9:
        parts.append(f"Patching the stream: what decides the answer sits at S2 (restoring {resid[0][2]:.0%} at block "
                     f"0) until blocks {leaves}-{end - 1} move it to END (END alone restores {resid[end][3]:.0%} "
                     f"entering block {end} of {L}).")
    elif end is not None:
        parts.append(f"Patching the stream: END alone restores {resid[end][3]:.0%} at block {end} of {L}.")
    else:
        parts.append("Patching the stream at END never restores half of the difference at any block's entry.")
    top = p["top"]
    dla = torch.tensor(a["heads"])
    dla_top = {(i, h) for i, h, _ in w}
    both = [f"{i}.{h}" for i, h, _ in top[:3] if (i, h) in dla_top]
    indirect = [f"{i}.{h}" for i, h, _ in top[:3] if abs(float(dla[i, h])) < 0.1 * float(dla.abs().max())]
    parts.append(f"Patching single heads' outputs, {fractions(top[:3])} restore most"
                 + (f"; {', '.join(both)} {'is' if len(both) == 1 else 'are'} also among the top direct writers"
                    if both else "; none of them is among the top direct writers")
                 + (f", while {', '.join(indirect)} {'writes' if len(indirect) == 1 else 'write'} almost nothing "
                    f"directly: {'it acts' if len(indirect) == 1 else 'they act'} through later blocks."
                    if indirect else "."))
    c = p["correlation"]
    good = c["head_mean"] >= 0.8
    parts.append(f"Attribution patching agrees with exact patching on the head map (r = {c['head_mean']:.2f} on the "
                 f"mean, {c['head_cells']:.2f} over every prompt's cells) "
                 + ("well enough to rank heads" if good else "only roughly: check the heads it ranks high exactly")
                 + f"; on the stream at the named positions r = {c['resid_pre_roles']:.2f}"
                 + (" (a patch there moves the nonlinearities far: the first-order estimate is poor)."
                    if c["resid_pre_roles"] < 0.8 else "."))
    est = torch.tensor(p["head_attribution"])
    missed = [(i, h, v, float(est[i, h])) for i, h, v in top if v - float(est[i, h]) > 0.5 * v > 0]
    if missed:
        parts.append("Of the heads patching ranks highest, it underestimates by more than half "
                     + ", ".join(f"{i}.{h} ({v:.0%} exact, {e:.0%} estimated)" for i, h, v, e in missed) + ".")
    recv = ", ".join(f"{i}.{h}" for i, h in path["receivers"])
    senders = path["top"]
    q, z = path["receivers_queries"], path["receivers_outputs"]
    parts.append(f"Path patching to the queries at END of the top writers {recv}: the senders restoring most are "
                 f"{fractions(senders[:3])}; patching those queries all together restores {q:.0%}, the receivers' "
                 f"whole outputs {z:.0%}"
                 + (": what the receivers do differently on the clean prompt comes mostly through what they read at "
                    "the other positions (their keys and values), not through their queries at END, and the paths to "
                    "those queries are small too."
                    if abs(q) < 0.5 * abs(z) else
                    ": their queries carry most of it."))
    if end is not None and leaves is not None and resid[0][2] >= 0.9:   # a one-sentence summary up front
        parts.insert(0, f"Blocks {leaves}-{end - 1} move what decides the name from the subject's second mention "
                        f"to the last position; the heads writing most of the answer directly are "
                        f"{', '.join(f'{i}.{h}' for i, h, _ in w[:3])}"
                        + (f" ({', '.join(movers)} copying the IO's name, {', '.join(pushers)} pushing S down)."
                           if movers and pushers else "."))
    parts += abc_verdict(n)
    parts.append("SmolLM2 is a 135M model and need not have GPT-2 small's clean IOI circuit; the numbers above are "
                 f"what its heads do on this dataset, with exact and path patching on its first {p['pairs']} and "
                 f"{path['pairs']} prompts only.")
    return " ".join(parts)


def abc_verdict(n: dict) -> list[str]:
    """What the second corruption (all names replaced) adds, from its numbers."""
    abc, p = n["abc"], n["patching"]
    resid = abc["resid_pre_roles"]
    k = {role: ROLES.index(role) for role in ROLES}
    parts = [f"With all names replaced instead (ABC: {abc['example']!r}), the corrupted logit difference is "
             f"{abc['mean_logit_diff_corrupt']:+.2f} (against {n['mean_logit_diff_corrupt']:+.2f} for the S2 -> IO "
             "swap): the prompt names neither answer."]
    io, s1, s2 = (resid[0][k[role]] for role in ("IO", "S1", "S2"))
    end = moved_at(resid, "END")
    why = (" (with the IO's own name back, the prompt names the IO and not S at all, so the difference passes the "
           "clean one; S's name back at one mention makes S a name mentioned once, a candidate answer)"
           if io > 1 and s1 < 0 and s2 < 0 else "")
    parts.append(f"Patching the stream entering block 0 at one position restores IO {io:.0%}, S1 {s1:.0%}, S2 "
                 f"{s2:.0%}{why}"
                 + (f"; END alone restores half or more from block {end} on ({resid[end][k['END']]:.0%} there, "
                    f"{resid[end - 1][k['END']]:.0%} entering block {end - 1}; {resid[-1][k['END']]:.0%} entering "
                    "the last block)." if end is not None else "; END alone never restores half at any block's entry."))
    if end is not None and end >= 1 and resid[end - 1][k["END"]] < 0.1:
        parts.append(f"So block {end - 1} alone moves the names themselves to the last position, while the S2 -> IO "
                     f"swap shows what decides between them moving there over blocks "
                     f"{next((i for i, row in enumerate(p['resid_pre_roles']) if row[2] < 0.9), '?')}-"
                     f"{(moved_at(p['resid_pre_roles'], 'END') or 1) - 1}.")
    top, s2_top = abc["top"], {(i, h) for i, h, _ in p["top"]}
    shared = [f"{i}.{h}" for i, h, _ in top[:3] if (i, h) in s2_top]
    parts.append(f"The heads whose output restores most are {fractions(top[:3])}"
                 + (f"; {', '.join(shared)} {'is' if len(shared) == 1 else 'are'} also among the S2 -> IO swap's top "
                    "five" if shared else "; none of them is among the S2 -> IO swap's top five")
                 + f". Attribution patching agrees on the head map with r = {abc['correlation']['head_mean']:.2f} "
                 f"(S2 -> IO: {p['correlation']['head_mean']:.2f}) and on the stream at the named positions with "
                 f"r = {abc['correlation']['resid_pre_roles']:.2f} ({p['correlation']['resid_pre_roles']:.2f}).")
    return parts


def notes(n: dict) -> list[str]:
    p, path = n["patching"], n["path"]
    first = n["prompts"][0]
    io, s = quoted(" " + first["io"]), quoted(" " + first["s"])
    return [f"Dataset: {len(n['prompts'])} prompts from {len(TEMPLATES)} templates and {len(NAMES)} single-token names "
            f"(seeded draws, each pair of names in both orders), e.g. {first['clean']!r} -> {io} over "
            f"{s}; corrupted: {first['corrupt']!r} (S2 -> IO) and {first['abc']!r} (all names "
            "replaced, by two names drawn apart from the pair). Named positions: IO, S1, S2 (the subject's two "
            "mentions), END (the last token).",
            f"Exact patching runs on the first {p['pairs']} prompts (for each corruption), path patching on the "
            f"first {path['pairs']} (S2 -> IO only); "
            "attribution patching runs on all of them too (numbers.json: head_attribution_all). Fractions: 1 = the "
            "clean logit difference, 0 = the corrupted one, over the dataset (mean patched - mean corrupt) / "
            "(mean clean - mean corrupt); the stream's positions are aligned by role across templates.",
            "Attribution patching estimates every cell from one forward and one backward pass; path patching patches "
            "each sender head's clean output into the corrupted run with every later head frozen, records the "
            "receivers' queries at END, then runs the corrupted prompt with only those queries replaced."]


def draw(n: dict):
    H = n["n_heads"]
    fig, axes = figure(5, 4.0, 5.0)
    fig.set_layout_engine("constrained")   # room for the colour bars between the panels
    maps = [(n["attribution"]["heads"], "direct logit attribution\n(logit units)", "RdBu_r"),
            (n["patching"]["head"], "head patching: fraction\nrestored (exact)", "RdBu_r"),
            (n["path"]["head"], "path patching to the\nreceivers' queries", "RdBu_r"),
            (n["abc"]["head"], "head patching (exact),\nall names replaced", "RdBu_r")]
    for ax, (m, title, cmap) in zip(axes, maps):
        t = torch.tensor(m, dtype=torch.float64)
        lim = float(torch.nan_to_num(t, nan=0.0).abs().max()) or 1.0
        im = ax.imshow(t.numpy(), cmap=cmap, vmin=-lim, vmax=lim, aspect="auto")
        ax.set(xlabel="head", ylabel="block", title=title)
        ax.set_xticks(range(H))
        fig.colorbar(im, ax=ax, fraction=0.05)
    ax = axes[4]
    exact = torch.tensor(n["patching"]["head"]).flatten()
    est = torch.tensor(n["patching"]["head_attribution"]).flatten()
    ax.scatter(exact.numpy(), est.numpy(), s=8)
    lo, hi = float(min(exact.min(), est.min())), float(max(exact.max(), est.max()))
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=0.8)
    ax.set(xlabel="exact patching", ylabel="attribution patching",
           title=f"per head (r = {n['patching']['correlation']['head_mean']:.2f})")
    ax.grid(alpha=0.3)
    return fig


WALKTHROUGH = '''\
The same analysis by hand, on four prompts; `study` in
`lumen/experiments/ioi.py` is this, at the dataset's size, with the numbers the page reports:

```python
import torch
from lumen.formats import load
from lumen.experiments.ioi import dataset, tokenize
from lumen.inspect import Site, attribute, attribution_patching, logit_diff, patching_maps, path_patching

loaded = load("smollm2")
model, tok = loaded.model.eval(), loaded.tokenizer
data = tokenize(tok, dataset(4, seed=0))    # padded Batches (clean, corrupt), the names' ids, named positions
rows = torch.arange(4)
with torch.no_grad():
    logits, _ = model(data.clean.ids, mask=data.clean.mask)
last = logits[rows, data.clean.last]                          # each prompt's last real token
print(last[rows, data.io] - last[rows, data.s])             # logit[IO] - logit[S], per prompt

attrs = attribute(model, data.clean, contrast=(data.io, data.s))   # one Attribution per prompt
heads = torch.stack([a.heads[:, :, -1] for a in attrs]).mean(0)    # (blocks, heads): direct writes at END
print(heads.flatten().topk(3))                                     # flat index = block * heads + head

metrics = [logit_diff(a, b) for a, b in zip(data.io, data.s)]      # one metric per pair
late = range(18, len(model.blocks))
exact = patching_maps(model, data.clean, data.corrupt, metrics, kinds=("head",), layers=late)
approx = attribution_patching(model, data.clean, data.corrupt, metrics, kinds=("head",), layers=late)
print(torch.corrcoef(torch.stack([exact.mean("head").flatten(), approx.mean("head").flatten()]))[0, 1])
abc = tokenize(tok, dataset(4, seed=0), "ABC")                     # the other corruption: all names replaced
print(patching_maps(model, abc.clean, abc.corrupt, metrics, kinds=("head",), layers=late).mean("head"))

end = data.roles[0]["END"]                                          # path patching: one pair
paths = path_patching(model, data.clean.row(0), data.corrupt.row(0), metrics[0], [Site("q", 23, end, 3)],
                      senders=[(i, h) for i in range(18, 23) for h in range(model.attention(0).n_heads)])
print(paths.maps["head"][18:23])                                    # senders' fractions restored
```
'''


def page(r: Result, figure_dir: str, command: str) -> str:
    """docs/ioi.md: what the study does, the code of each step, and the result (every number from `command`)."""
    lines = ["# A worked analysis: indirect-object identification on SmolLM2", "",
             f"*Generated by `{command}` (do not edit by hand); the same result is a section of "
             "[experiments.md](experiments.md#ioi).*", "",
             "When Mary and John went to the store, John gave a drink to ... Mary. A model that gets this right must "
             "find the name that is mentioned once. This page asks, on a dataset of such prompts, which of SmolLM2's "
             "heads write that name, where the information travels, and whether the cheap gradient estimate of "
             "patching agrees with the real thing. The steps, each one call of `lumen.inspect` on padded batches:",
             "",
             "1. the logit difference logit[IO] - logit[S] per prompt (IO: the indirect object, mentioned once; S: "
             "the subject, mentioned twice);",
             "2. direct logit attribution (`attribute`): each block's and each head's write at the last position, "
             "which sums to the model's logit difference;",
             "3. activation patching (`patching_maps`) of corrupted prompts, whose second mention of S is swapped for "
             "the IO, so that the other name becomes the answer: the stream at the named positions, and each head; "
             "attribution patching (`attribution_patching`) beside it;",
             "4. path patching (`path_patching`): which earlier heads feed the queries of the heads that write the "
             "answer;",
             "5. patching again against a second corruption, all names replaced (ABC: IO and S swapped for two other "
             "names everywhere): the first asks what knows which name is repeated, this one what carries the names "
             "themselves.", "", WALKTHROUGH, "## The result", "",
             r.markdown(figure_dir=figure_dir).split("\n", 2)[2]]
    return "\n".join(lines)
