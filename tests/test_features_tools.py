"""The feature tools of issue 37 item 5 on a tiny model where the answer is known: a dictionary built by hand whose
features are the stream's own basis (feature j is relu(x_j), feature d + j is relu(-x_j)), so each feature's
activation is a coordinate of the stream read off independently with run_with_cache, its direction is a basis
vector whose logit lens is the final LayerNorm and unembedding written out by hand, and its density is the share
of tokens where that coordinate is positive (or negative)."""

from __future__ import annotations

import pytest
import torch

from helpers.features import basis_dictionary, tiny
from lumen import GPT
from lumen.errors import UserError
from lumen.features import density, feature_lens, scan, top_contexts
from lumen.inspect import TunedLens, run_with_cache
from lumen.tokenizers import CharTokenizer

D = 8




TOK = CharTokenizer([chr(ord("a") + i) for i in range(40)])
WINDOWS = torch.randint(0, 40, (6, 8), generator=torch.Generator().manual_seed(2))


def stream(model: GPT, site: str) -> torch.Tensor:
    return run_with_cache(model, WINDOWS, names=[site])[1][site]


def by_hand(model: GPT, h: torch.Tensor) -> torch.Tensor:
    """LayerNorm then the unembedding, each written from its formula."""
    ln = model.ln_f
    normed = (h - h.mean()) / torch.sqrt(h.var(unbiased=False) + ln.eps) * ln.g + ln.b
    return normed @ model.lm_head.weight.T + (model.lm_head.bias if model.lm_head.bias is not None else 0)


def test_the_logit_lens_of_a_basis_feature_is_the_final_norm_and_unembedding_of_that_basis_vector():
    model = tiny()
    sae = basis_dictionary("blocks.0.resid_post")
    e3 = torch.nn.functional.one_hot(torch.tensor(3), D).float()
    torch.testing.assert_close(feature_lens(model, sae, 3), by_hand(model, e3))
    torch.testing.assert_close(feature_lens(model, sae, D + 3, layer=0), by_hand(model, -e3))
    # the logit lens ranks tokens as the direct logit effect does: the norm rescales one vector only
    from lumen.features import feature_logits
    assert torch.equal(feature_lens(model, sae, 5).argsort(), feature_logits(model, sae, 5).argsort())
    with pytest.raises(UserError, match="layer 3 is out of range"):
        feature_lens(model, sae, 3, layer=3)


def test_a_tuned_lens_reads_a_features_direction_at_the_depth_the_dictionary_writes():
    model = tiny()
    lens = TunedLens(model)
    with torch.no_grad():
        for t in lens.translators:
            t.lin.weight.normal_()
            t.lin.bias.normal_()
    sae = basis_dictionary("blocks.0.resid_post")       # the stream after 1 block: translator 1
    e2 = torch.nn.functional.one_hot(torch.tensor(2), D).float()
    A, b = lens.translators[1].lin.weight.detach(), lens.translators[1].lin.bias.detach()
    want = by_hand(model, e2 + A @ e2 + b)
    torch.testing.assert_close(feature_lens(model, sae, 2, lens=lens), want)
    pre = basis_dictionary("blocks.0.resid_pre")          # the embedding's stream: translator 0
    A0, b0 = lens.translators[0].lin.weight.detach(), lens.translators[0].lin.bias.detach()
    torch.testing.assert_close(feature_lens(model, pre, 2, lens=lens), by_hand(model, e2 + A0 @ e2 + b0))
    assert not torch.allclose(want, by_hand(model, e2 + A0 @ e2 + b0))


def test_top_contexts_carry_the_features_activation_on_every_token_shown():
    model = tiny()
    sae = basis_dictionary("blocks.1.resid_post")
    x = stream(model, "blocks.1.resid_post")
    found = top_contexts(model, sae, TOK, WINDOWS, feature=D + 3, k=4, batch=4)   # relu(-x_3)
    want = (-x[..., 3]).relu().flatten().topk(4)
    assert [c.activation for c in found] == pytest.approx(want.values.tolist(), rel=1e-5)
    for c, p in zip(found, want.indices.tolist()):
        row, t = divmod(p, WINDOWS.size(1))
        lo = max(0, t - 12)
        assert c.activations == pytest.approx((-x[row, lo:t + 4, 3]).relu().tolist(), abs=1e-6)
        assert c.tokens == [TOK.decode([int(i)]) for i in WINDOWS[row, lo:t + 4]]
        assert c.tokens[c.at] == c.trigger and c.activations[c.at] == pytest.approx(c.activation, rel=1e-5)
        assert "".join(c.tokens) == c.before + c.trigger + c.after


def test_density_is_the_share_of_tokens_where_the_coordinate_has_the_features_sign():
    model = tiny()
    sae = basis_dictionary("blocks.1.resid_post")
    x = stream(model, "blocks.1.resid_post").flatten(0, 1)
    got = density(model, sae, WINDOWS, batch=4)
    want = torch.cat([(x > 0).double().mean(0), (x < 0).double().mean(0)])
    torch.testing.assert_close(got, want)
    assert 0 < float(got.min()) and float(got.max()) < 1   # a check that tells the two halves apart
    dens, values, positions = scan(model, sae, WINDOWS, k=3, batch=4)
    torch.testing.assert_close(dens, want)
    f = torch.cat([x.relu(), (-x).relu()], -1)
    torch.testing.assert_close(values, f.topk(3, dim=0).values.T)


def test_a_scan_counts_only_the_tokens_its_mask_keeps_and_reads_an_mlps_units_too():
    from lumen.features.tools import scan_site

    model = tiny()
    sae = basis_dictionary("blocks.1.resid_post")
    keep = torch.ones(WINDOWS.shape, dtype=torch.bool)
    keep[:, 0] = False                                   # each window's first token left out
    x = stream(model, "blocks.1.resid_post")
    dens, values, positions = scan(model, sae, WINDOWS, k=2, batch=4, mask=keep)
    torch.testing.assert_close(dens[:D], (x[:, 1:] > 0).double().mean((0, 1)))
    assert not (positions % WINDOWS.size(1) == 0).any()
    torch.testing.assert_close(values[:D], x[:, 1:].relu().flatten(0, 1).topk(2, dim=0).values.T)
    h = stream(model, "blocks.0.mlp_hidden")
    dens, values, _ = scan_site(model, WINDOWS, "blocks.0.mlp_hidden", lambda a: a, k=3, batch=4)
    torch.testing.assert_close(dens, (h > 0).double().mean((0, 1)))
    torch.testing.assert_close(values, h.flatten(0, 1).topk(3, dim=0).values.T)
