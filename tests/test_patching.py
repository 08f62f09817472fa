"""Activation patching: answers known without running it (everything patched at the bottom restores all,
nothing restores nothing, a site that cannot reach the read-out restores nothing), and every map entry
against the model's forward pass written out by hand with the clean activation pasted in."""

import pytest
import torch

from lumen import GPT, ModelConfig
from lumen.errors import UserError
from lumen.inspect import run_with_cache
from lumen.inspect.patching import Site, logit_diff, logprob, patch, patching_maps

V = 61
CFGS = {
    "gpt2": dict(),
    "llama": dict(mlp="swiglu", norm="rmsnorm", positions="rope", bias=False, n_kv_heads=2),
}


def model_of(name):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=V, context=32, d_model=32, n_layers=3, n_heads=4, d_ff=64, name=name)
    model = GPT(cfg.replace(**CFGS[name])).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)   # large enough weights that every position matters
    return model


def prompts(T=10):
    g = torch.Generator().manual_seed(3)
    clean = torch.randint(0, V, (T,), generator=g)
    corrupt = clean.clone()
    corrupt[2:4] = torch.randint(0, V, (2,), generator=g)  # two tokens differ, the rest is shared
    return clean, corrupt


@pytest.mark.parametrize("name", CFGS)
def test_known_answers(name):
    model = model_of(name)
    clean, corrupt = prompts()
    metric = logit_diff(5, 9)
    T = len(clean)
    # the whole stream entering the first block: the corrupted run becomes the clean run, exactly
    assert patch(model, clean, corrupt, [Site("resid_pre", 0)], metric) == 1.0
    assert patch(model, clean, corrupt, [Site("resid_pre", 0, t) for t in range(T)], metric) == 1.0
    assert patch(model, clean, corrupt, [], metric) == 0.0
    # read at position T - 3: a later position cannot influence it (attention is causal)
    assert patch(model, clean, corrupt, [Site("resid_pre", 1, T - 1)], metric, position=T - 3) == 0.0
    # the last block's MLP at an earlier position writes only into that position's stream, which nothing
    # reads after the last block: no path to the read-out
    assert patch(model, clean, corrupt, [Site("mlp_out", 2, 3)], metric) == 0.0
    # the positions that differ, patched into the stream at the first block, restore everything; a
    # position where both prompts agree restores nothing
    assert patch(model, clean, corrupt, [Site("resid_pre", 0, 2), Site("resid_pre", 0, 3)], metric) == 1.0
    assert patch(model, clean, corrupt, [Site("resid_pre", 0, 5)], metric) == 0.0
    # every head of a block (all positions) is the block's whole attention output
    heads = patch(model, clean, corrupt, [Site("head", 1, None, h) for h in range(4)], metric)
    assert heads == pytest.approx(patch(model, clean, corrupt, [Site("attn_out", 1)], metric), abs=1e-5)


@torch.no_grad()
def by_hand(model, x, paste):
    """The forward pass written out, with paste(i, kind, tensor) free to replace resid_pre, attn_out and
    mlp_out of block i; returns the last position's logits."""
    h = model.embed(x)
    for i, b in enumerate(model.blocks):
        h = paste(i, "resid_pre", h)
        h = h + paste(i, "attn_out", b.attn(b.ln1(h)))
        h = h + paste(i, "mlp_out", b.mlp(b.ln2(h)))
    return model.lm_head(model.ln_f(h))[:, -1]


@pytest.mark.parametrize("name", CFGS)
def test_maps_against_the_forward_pass_by_hand(name):
    model = model_of(name)
    clean, corrupt = prompts(8)
    r = patching_maps(model, clean, corrupt, metric=logit_diff(5, 9))
    _, cache = run_with_cache(model, clean[None])
    m = lambda z: float(z[0, 5] - z[0, 9])  # noqa: E731
    m_clean = m(by_hand(model, clean[None], lambda i, k, a: a))
    m_corrupt = m(by_hand(model, corrupt[None], lambda i, k, a: a))
    assert r.clean_metric == pytest.approx(m_clean, abs=1e-4) and r.corrupt_metric == pytest.approx(m_corrupt, abs=1e-4)
    assert abs(m_clean - m_corrupt) > 0.1
    L, T = 3, 8
    for kind in ("resid_pre", "attn_out", "mlp_out"):
        assert r.maps[kind].shape == (L, T)
        # one copy of the corrupted prompt per cell (i, t), row i * T + t, with that one activation pasted in

        def paste(j, k, a, kind=kind):
            if k != kind:
                return a
            a = a.clone()
            for t in range(T):
                a[j * T + t, t] = cache[f"blocks.{j}.{kind}"][0, t]
            return a

        z = by_hand(model, corrupt[None].expand(L * T, -1), paste)
        want = (z[:, 5] - z[:, 9] - m_corrupt) / (m_clean - m_corrupt)
        torch.testing.assert_close(r.maps[kind].flatten(), want.double(), atol=1e-4, rtol=0)
    assert r.maps["head"].shape == (3, 4)
    assert r.maps["resid_pre"][0, 2:4].sum() > 0.1 and r.maps["resid_pre"][0, 4:].abs().max() < 1e-5


def test_errors_and_metrics():
    model = model_of("gpt2")
    clean, corrupt = prompts()
    with pytest.raises(UserError, match="same number of tokens"):
        patch(model, clean, corrupt[:-1], [], logprob(3))
    with pytest.raises(UserError, match="out of range"):
        patch(model, clean, corrupt, [Site("mlp_out", 3)], logprob(3))
    with pytest.raises(UserError, match="needs a head"):
        patch(model, clean, corrupt, [Site("head", 0)], logprob(3))
    with pytest.raises(UserError, match="nothing to restore"):
        patch(model, clean, clean, [], logprob(3))
    assert patch(model, clean, corrupt, [Site("resid_pre", 0)], logprob(3)) == 1.0
