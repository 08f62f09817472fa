"""The residual-stack helpers and the read-out: the writes of `decompose` add up to the final stream and their
read-outs to the model's own logits (every family preset, heads included, against `attribute` computed the
other way: through z and W_O); the rows of `accumulated` are the logit lens computed from the cache by hand;
the Readout is the model's final norm and unembedding, bit for bit."""

import pytest
import torch

from helpers.presets import NAMES, prompts, tiny_preset
from lumen.errors import UserError
from lumen.inspect import (
    Readout,
    TunedLens,
    accumulated,
    attribute,
    decompose,
    run_with_cache,
)
from lumen.tokenizers import pad


def close(a, b, atol=1e-5):
    torch.testing.assert_close(a, b, atol=atol, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_decompose_adds_up_to_the_logits_and_agrees_with_attribution(name):
    model = tiny_preset(name, scale=3.0)
    batch = pad(prompts(), "right")
    with torch.no_grad():
        logits = model(batch.ids, mask=batch.mask)[0].double()
        if model.cfg.final_softcap is not None:  # the writes add up to the logits before the soft-cap (its atanh)
            cap = model.cfg.final_softcap
            logits = cap * torch.atanh(logits / cap)
    for heads in (False, True):
        s = decompose(model, batch, heads=heads)
        d = s.logit_diff(5, 9)                                                  # (C, B, T)
        bias = s.bias_share(5, 9)
        total = d.sum(0) + (bias if bias is not None else 0)
        want = logits[..., 5] - logits[..., 9]
        close(total[batch.mask], want[batch.mask])
        assert float(want[batch.mask].abs().max()) > 0.1   # logits that differ, so the sums mean something
        t = s.logits([5, 9])                                                    # (C, B, T, 2)
        close(t[..., 0] - t[..., 1], d, atol=1e-9)
    a = attribute(model, batch, contrast=(5, 9))
    s = decompose(model, batch, heads=True)
    d = s.logit_diff(5, 9)
    L, H = model.cfg.n_layers, model.cfg.n_heads
    for b in range(len(batch)):
        cols = batch.mask[b]
        for i in range(L):
            for h in range(H):
                close(d[s.names.index(f"blocks.{i}.head.{h}"), b][cols], a[b].heads[i, h])
        close(d[s.names.index("blocks.0.mlp"), b][cols], a[b].row("blocks.0.mlp"))
    if model.pos_emb is not None:
        assert s.names[:2] == ["tok_emb", "pos_emb"]


@pytest.mark.parametrize("name", ["gpt2", "baby-llama", "gemma-2b"])
def test_accumulated_is_the_logit_lens(name):
    model = tiny_preset(name, scale=3.0)
    x = torch.tensor(prompts((8,))[0])[None]
    logits, c = run_with_cache(model, x)
    s = accumulated(model, x)
    assert s.names == ["embed"] + [f"block {i}" for i in range(model.cfg.n_layers)]
    lens = s.logit_diff(5, 9)                                                   # (L + 1, B, T)
    streams = c.streams()
    for layer in range(model.cfg.n_layers + 1):
        z = model.lm_head(model.ln_f(streams[layer]))
        close(lens[layer], (z[..., 5] - z[..., 9]).double())
        close(s.logits([3, 4])[layer], z[..., [3, 4]].double())
    close(lens[-1], (logits[..., 5] - logits[..., 9]).double())
    mid = accumulated(model, x, mid=True)
    assert mid.names[1] == "blocks.0.resid_mid" and len(mid) == 2 * model.cfg.n_layers + 1
    tuned = TunedLens(model)
    with torch.no_grad():
        for t in tuned.translators:
            t.lin.weight.normal_(0, 0.1)
    through = accumulated(model, x, lens=tuned).logits([5])
    for layer in range(model.cfg.n_layers + 1):
        close(through[layer][..., 0], tuned(streams[layer], layer)[..., 5].double())


def test_the_readout_is_the_models_and_its_frozen_norm_is_linear():
    for name in ("gpt2", "gemma-2b"):   # LayerNorm with a bias; Gemma's RMSNorm scaling by (1 + g)
        model = tiny_preset(name, scale=3.0)
        r = Readout(model)
        h = torch.randn(2, 5, 32)
        assert torch.equal(r(h), model.lm_head(model.ln_f(h)))
        parts = torch.randn(4, 2, 5, 32)
        s = r.scale(parts.sum(0))
        normed = r.frozen(parts, s).sum(0) + (r.bias if r.bias is not None else 0)
        close(normed, model.ln_f(parts.sum(0)))
        u = torch.randn(2, 5, 32)
        close((r.frozen(parts, s) * u).sum(-1), (parts * r.reading(u, s)).sum(-1))
        close(r.logit_diff(h, 3, 4), (r(h)[..., 3] - r(h)[..., 4]))


def test_stack_errors():
    model = tiny_preset("gpt2")
    s = decompose(model, torch.tensor([[1, 2, 3]]))
    with pytest.raises(UserError, match="no row"):
        s.row("blocks.9.mlp")
    with pytest.raises(UserError, match="answer pairs"):
        s.logit_diff([1, 2], [3, 4])
    post = tiny_preset("gpt2").cfg.replace(norm_placement="post")
    from lumen import GPT

    with pytest.raises(UserError, match="pre-LN"):
        decompose(GPT(post).eval(), torch.tensor([[1, 2, 3]]))
