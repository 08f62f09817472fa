"""Activation patching maps of SmolLM2-135M on 16-token pairs: the loop lumen had before (kept here, below: one
full forward pass of the corrupted prompt per cell, batched) beside today's `patching_maps` (patched copies run
only from their block and first changed position up, cells that change nothing not run) and attribution
patching (one forward and one backward pass), side by side in one run.

    .venv/bin/python bench/bench_patching.py [--repeats 1] [--pairs ioi,first] [--threads N]

Pairs: "ioi", the TransformerLens demo's corruption (the second mention of the subject swapped, so the answer
flips: the prompts share their first 9 tokens), and "first", a pair that differs at its second token (the
worst case for skipping: only the first token is shared). Every map kind the old loop draws (resid_pre,
attn_out, mlp_out, head). Reported: the wall time of each (median of --repeats), the speed-ups, the largest
difference between the old and the new exact maps, and the correlation of attribution patching with exact
patching, per kind. Name the machine and its load with the numbers (printed). On a busy machine the thread count
matters more than anything (one thread waits for no other at each operation's barrier: lumen.runtime.threads): both
run at the same count, --threads N. Not a test.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

import torch

from common import timed  # bench/common.py (the script's own folder is on sys.path)

PAIRS = {
    "ioi": ("When Mary and John went to the store, John gave a bottle of milk to",
            "When Mary and John went to the store, Mary gave a bottle of milk to", " Mary", " John"),
    "first": ("When Mary and John went to the store, John gave a bottle of milk to",
              "When Anna and John went to the store, John gave a bottle of milk to", " Mary", " Anna"),
}
KINDS = ("resid_pre", "attn_out", "mlp_out", "head")


# --- the patching loop as it was at the start of this work (lumen.inspect.patching before it scaled) --------

class _Read(Exception):
    """Stops the forward pass once the final stream exists (the full logits are never needed)."""


@torch.no_grad()
def old_run_patched(model, clean_cache: dict, corrupt: torch.Tensor, groups, position: int = -1) -> torch.Tensor:
    """Logits (len(groups), V) at `position` of the corrupted prompt (1, T), run once per group of sites (as one
    batch), each copy with its group's activations taken from clean_cache. A site: (kind, layer, position, head)."""
    from lumen.inspect.cache import hooks

    old_kinds = {"resid_pre": "resid_pre", "attn_out": "attn_out", "mlp_out": "mlp_out", "head": "attn_heads"}
    by_name: dict[str, list] = {}
    for b, group in enumerate(groups):
        for kind, layer, pos, head in group:
            by_name.setdefault(f"blocks.{layer}.{old_kinds[kind]}", []).append((b, layer, pos, head))

    def patcher(name: str):
        clean = clean_cache[name][0]

        def fn(a: torch.Tensor) -> torch.Tensor:
            a = a.clone()
            for b, layer, pos, head in by_name[name]:
                t = slice(None) if pos is None else pos
                if head is None:
                    a[b, t] = clean[t]
                else:
                    hd = a.size(-1) // model.attention(layer).n_heads
                    cols = slice(head * hd, (head + 1) * hd)
                    a[b, t, cols] = clean[t, cols]
            return a
        return fn

    got: list[torch.Tensor] = []

    def read(a: torch.Tensor) -> None:
        got.append(a[:, position])
        raise _Read

    fns = {name: patcher(name) for name in by_name}
    fns["final"] = read
    with hooks(model, fns):
        try:
            model(corrupt.expand(len(groups), -1))
        except _Read:
            pass
    return model.lm_head(got[0])


@torch.no_grad()
def old_patching_maps(model, clean: torch.Tensor, corrupt: torch.Tensor, metric, kinds: Sequence[str],
                      position: int = -1) -> dict[str, torch.Tensor]:
    from lumen.inspect.cache import run_with_cache

    L, T, H = len(model.blocks), clean.size(1), model.attention(0).n_heads
    wanted = [f"blocks.{i}.{k}" for i in range(L) for k in ("resid_pre", "attn_out", "mlp_out", "attn_heads")]
    _, cache = run_with_cache(model, clean, wanted + ["final"])
    m_clean = float(metric(model.lm_head(cache["final"][:, position])))
    m_corrupt = float(metric(old_run_patched(model, cache, corrupt, [[]], position)))
    per_run = max(1, 256 * 2**20 // (T * (8 * model.cfg.d_model + 3 * model.cfg.hidden) * 4))
    maps = {}
    for kind in kinds:
        if kind == "head":
            groups = [[("head", i, None, h)] for i in range(L) for h in range(H)]
        else:
            groups = [[(kind, i, t, None)] for i in range(L) for t in range(T)]
        values = torch.cat([metric(old_run_patched(model, cache, corrupt, groups[a:a + per_run], position)).float()
                            for a in range(0, len(groups), per_run)])
        maps[kind] = ((values.double() - m_corrupt) / (m_clean - m_corrupt)).view(L, -1)
    return maps


# --- the comparison ------------------------------------------------------------------------------------------

def corr(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([a.flatten().double(), b.flatten().double()]))[0, 1])


def bench_pair(model, tok, name: str, repeats: int) -> None:
    from lumen.inspect.attribution_patching import attribution_patching
    from lumen.inspect.patching import logit_diff, patching_maps

    clean_text, corrupt_text, answer, wrong = PAIRS[name]
    clean, corrupt = torch.tensor([tok.encode(clean_text)]), torch.tensor([tok.encode(corrupt_text)])
    shared = int((clean[0] != corrupt[0]).int().argmax())
    metric = logit_diff(tok.single_token(answer), tok.single_token(wrong))
    print(f"\npair {name!r}: {clean.size(1)} tokens, the first {shared} shared; "
          f"logit[{answer!r}] - logit[{wrong!r}]; maps {', '.join(KINDS)}")
    t_old, old = timed(lambda: old_patching_maps(model, clean, corrupt, metric, KINDS), repeats)
    t_new, new = timed(lambda: patching_maps(model, clean, corrupt, metric, KINDS), repeats)
    t_att, att = timed(lambda: attribution_patching(model, clean, corrupt, metric, KINDS), repeats)
    print(f"  exact, the old loop (a full forward per cell)   {t_old:8.2f} s")
    print(f"  exact, patching_maps                             {t_new:8.2f} s   {t_old / t_new:6.1f}x faster")
    print(f"  attribution patching (1 forward + 1 backward)    {t_att:8.2f} s   {t_new / t_att:6.1f}x faster than "
          f"exact, {t_old / t_att:.0f}x than the old loop")
    diff = max(float((new.maps[k] - old[k]).abs().max()) for k in KINDS)
    print(f"  old and new exact maps: largest difference {diff:.1e} (fraction restored)")
    every = corr(torch.cat([att.maps[k].flatten() for k in KINDS]), torch.cat([new.maps[k].flatten() for k in KINDS]))
    print("  attribution patching against exact, correlation per map: "
          + ", ".join(f"{k} {corr(att.maps[k], new.maps[k]):.3f}" for k in KINDS) + f"; all cells {every:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--pairs", default="ioi,first", help="which pairs: " + ", ".join(PAIRS))
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads for both (default: torch's choice)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from lumen.formats import load
    from lumen.runtime import cpu

    loaded = load("smollm2")
    model, tok = loaded.model.eval(), loaded.tokenizer
    print(f"machine: {cpu.machine(load=True, versions=True)}")
    for name in args.pairs.split(","):
        bench_pair(model, tok, name, args.repeats)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
