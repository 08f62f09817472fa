"""Padded batches: for every family preset, each prompt's results in a batch padded on the left or on the right
are its results alone, to 1e-5: the logits (both attention paths, the KV cache), every activation hooks can
reach at the prompt's own positions, greedy generation, the lens, attribution, patching, neurons and head
scores. The reference is always the prompt run by itself, unpadded."""

import pytest
import torch

from helpers.presets import NAMES, prompts, tiny_preset
from lumen.attention import KVCache
from lumen.errors import UserError
from lumen.inspect import (
    activation_names,
    attribute,
    attribution_patching,
    logit_lens,
    patching_maps,
    positional_scores,
    run_with_cache,
    top_activations,
)
from lumen.inspect.patching import logit_diff
from lumen.model import plain_attention
from lumen.tokenizers import ByteTokenizer, pad

SIDES = ("left", "right")
ATOL = 1e-5


def close(a, b, atol=ATOL):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


def test_pad_left_and_right():
    b = pad([[5, 6, 7], [8]], side="left", pad_id=0)
    assert b.ids.tolist() == [[5, 6, 7], [0, 0, 8]] and b.mask.tolist() == [[True] * 3, [False, False, True]]
    assert b.last.tolist() == [2, 2] and b.lengths.tolist() == [3, 1] and b.rows() == [[5, 6, 7], [8]]
    r = pad([[5, 6, 7], [8]], side="right", pad_id=9)
    assert r.ids.tolist() == [[5, 6, 7], [8, 9, 9]] and r.last.tolist() == [2, 0]
    tok = ByteTokenizer()
    t = tok.pad(["hello", "hi"])
    assert t.rows() == [tok.encode("hello"), tok.encode("hi")] and t.side == "left"
    assert tok.str_tokens("hi") == ["h", "i"] and tok.single_token("h") == 104
    with pytest.raises(UserError, match="not one"):
        tok.single_token("hi", "--answer")
    with pytest.raises(UserError, match="empty"):
        pad([[1], []])
    with pytest.raises(UserError, match="left or right"):
        pad([[1]], side="middle")


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_logits_of_a_padded_batch_are_each_prompts_alone(name, side):
    model = tiny_preset(name)
    seqs = prompts()
    batch = pad(seqs, side)
    with torch.no_grad():
        for plain in (False, True):
            with plain_attention(model, range(len(model.blocks)) if plain else []):
                logits, _ = model(batch.ids, mask=batch.mask)
                for b, s in enumerate(seqs):
                    alone, _ = model(torch.tensor([s]))
                    close(logits[b][batch.mask[b]], alone[0])
            assert torch.isfinite(logits).all()   # the padding's own rows too (a pad token reads itself)


@pytest.mark.parametrize("name", NAMES)
def test_the_kv_cache_holds_the_padding(name):
    """A left-padded batch prefilled in two pieces and continued token by token: the full forward's logits."""
    model = tiny_preset(name)
    batch = pad(prompts(), "left")
    more = torch.tensor([[3, 4], [5, 6], [7, 8]])
    ids, mask = torch.cat([batch.ids, more], 1), torch.cat([batch.mask, torch.ones(3, 2, dtype=torch.bool)], 1)
    with torch.no_grad():
        full, _ = model(ids, mask=mask)
        cache = KVCache(model.cfg, 3, 16)
        parts = [model(batch.ids[:, :5], cache=cache, mask=batch.mask[:, :5])[0],
                 model(batch.ids[:, 5:], cache=cache, mask=batch.mask[:, 5:])[0],
                 model(more[:, :1], cache=cache)[0], model(more[:, 1:], cache=cache)[0]]
    close(torch.cat(parts, 1)[mask], full[mask])


@pytest.mark.parametrize("use_cache", [True, False])
@pytest.mark.parametrize("name", NAMES)
def test_batched_generation_continues_each_prompt_as_alone(name, use_cache):
    """Greedy, past the context too (the window slides), on weights large enough for sharp choices."""
    model = tiny_preset(name, scale=4.0, context=16)
    seqs = prompts()
    batch = pad(seqs, "left")
    n = 12   # 9 + 12 tokens: past the 16-token context
    out = model.generate(batch.ids, n, temperature=0, mask=batch.mask, use_cache=use_cache)
    for b, s in enumerate(seqs):
        alone = model.generate(torch.tensor([s]), n, temperature=0, use_cache=use_cache)
        assert out[b, batch.ids.size(1):].tolist() == alone[0, len(s):].tolist()
    with pytest.raises(UserError, match="padded on the left"):
        model.generate(pad(seqs, "right").ids, 2, mask=pad(seqs, "right").mask)


def _real(name: str, a: torch.Tensor, b: int, mask: torch.Tensor) -> torch.Tensor:
    """Row b of a batch's activation at the prompt's own positions (queries and keys, for scores and patterns)."""
    cols = mask[b]
    if name.endswith(("attn_pattern", "attn_scores")):
        return a[b][:, cols][:, :, cols]
    return a[b][cols]


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_every_activation_at_real_positions_is_the_prompts_alone(name, side):
    model = tiny_preset(name)
    seqs = prompts()
    batch = pad(seqs, side)
    every = activation_names(model, every=True)
    _, cache = run_with_cache(model, batch, every)
    assert set(cache) == set(every)
    for b, s in enumerate(seqs):
        _, alone = run_with_cache(model, torch.tensor([s]), every)
        for n in every:
            close(_real(n, cache[n], b, batch.mask), alone[n][0])


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", NAMES)
def test_lens_and_attribution_of_a_batch_are_each_prompts_alone(name, side):
    model = tiny_preset(name)
    seqs = prompts()
    batch = pad(seqs, side)
    lenses = logit_lens(model, batch, k=3)
    attributions = attribute(model, batch, contrast=([5, 6, 7], [9, 9, 9]))
    targets = attribute(model, batch)              # each position's own top-1 prediction
    for b, s in enumerate(seqs):
        one = logit_lens(model, s, k=3)
        assert lenses[b].ids == s and torch.equal(lenses[b].top_ids, one.top_ids)
        for field in ("top_probs", "next_prob", "entropy", "kl", "final_prob"):
            close(getattr(lenses[b], field), getattr(one, field))
        alone = attribute(model, s, contrast=(5 + b, 9))
        got = attributions[b]
        assert got.components == alone.components and got.target == alone.target and got.minus == alone.minus
        for field in ("values", "heads", "attn_bias", "logit"):
            close(getattr(got, field), getattr(alone, field))
        assert targets[b].target == attribute(model, s).target


@pytest.mark.parametrize("name", NAMES)
def test_patching_a_dataset_of_pairs_is_each_pair_alone(name):
    model = tiny_preset(name, scale=3.0)
    cleans = prompts((8, 6), seed=4)
    corrupts = [c[:2] + [(c[2] + 1) % 97] + c[3:] for c in cleans]
    metrics = [logit_diff(5, 9), logit_diff(1, 2)]
    kinds = ("resid_pre", "head", "v")
    alone = [(patching_maps(model, c, x, m, kinds=kinds), attribution_patching(model, c, x, m, kinds=kinds))
             for c, x, m in zip(cleans, corrupts, metrics)]
    for side in SIDES:
        good, bad = pad(cleans, side), pad(corrupts, side)
        exact = patching_maps(model, good, bad, metrics, kinds=kinds)
        estimate = attribution_patching(model, good, bad, metrics, kinds=kinds)
        for b, (one, est) in enumerate(alone):
            for k in kinds:   # compared as metric values: a fraction of a small difference magnifies rounding
                close(exact.pairs[b].values(k), one.values(k))
                close(estimate.pairs[b].values(k), est.values(k))
    # the dataset's mean: the fraction of the mean difference, maps aligned at the last token
    m = exact.mean("resid_pre")
    want = (torch.stack([p.values("resid_pre")[:, -6:] for p in exact.pairs]).mean(0)
            - sum(p.corrupt_metric for p in exact.pairs) / 2) / (
        sum(p.clean_metric - p.corrupt_metric for p in exact.pairs) / 2)
    close(m, want)
    with pytest.raises(UserError, match="same length"):
        patching_maps(model, pad(cleans, "left"), pad([c[:-1] for c in corrupts], "left"), metrics)


@pytest.mark.parametrize("name", ["baby-gpt", "baby-llama", "pythia-70m", "gemma-2b", "mistral-7b"])
def test_neurons_and_head_scores_of_a_batch(name):
    model = tiny_preset(name)
    seqs = prompts((9, 4, 7, 12))
    for side in SIDES:
        batch = pad(seqs, side)
        values, positions = top_activations(model, batch, layer=1, k=4, batch=3)
        # brute force: every prompt alone, its activations concatenated at their flat batch positions
        flat_pos, acts = [], []
        for b, s in enumerate(seqs):
            _, c = run_with_cache(model, torch.tensor([s]), ["blocks.1.mlp_hidden"])
            acts.append(c["blocks.1.mlp_hidden"][0])
            flat_pos += (b * batch.ids.size(1) + batch.mask[b].nonzero()[:, 0]).tolist()
        acts = torch.cat(acts)
        close(values, acts.topk(4, dim=0).values.T)
        assert torch.isin(positions, torch.tensor(flat_pos)).all()
        # head scores: the mean over every prompt's own queries 2.. (each prompt alone, weighted by its queries)
        got = positional_scores(model, batch)
        n = torch.tensor([len(s) - 2 for s in seqs], dtype=torch.float32)
        alone = [positional_scores(model, torch.tensor([s])) for s in seqs]
        for k in ("previous_token", "first_token"):
            close(got[k], sum(w * a[k] for w, a in zip(n, alone)) / n.sum())
