"""docs/features.md's measurements (lumen.features.study) on a tiny model where the answers are known: token classes
against hand-labelled tokens, the coherence shares against a loop with a Counter, chance against its formula, and
the IOI patching with a dictionary of the stream's own basis (no error term: every feature restored is the clean
run itself) against lumen.features.patch_feature and feature_attribution."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from helpers.features import basis_dictionary, tiny
from lumen.errors import UserError
from lumen.features import SAE, feature_attribution, patch_feature, spliced
from lumen.features.study import (
    CLASSES,
    Pair,
    chance,
    coherence,
    ioi_features,
    ioi_pairs,
    measure,
    page,
    restored,
    token_class,
    verdict,
)
from lumen.tokenizers import CharTokenizer

D = 8




@pytest.mark.parametrize("text, cls", [
    (" the", "function word"), ("And", "function word"), (" London", "capitalised word"), ("Rome", "capitalised word"),
    (" apple", "word start"), ("ing", "word piece"), (",", "punctuation"), (".\n", "punctuation"),
    (" (", "punctuation"), ("\ufffd", "punctuation"), (" 19", "digits"), ("7", "digits"), (" ", "whitespace"),
    ("\n\n", "whitespace"), ("x2", "other"), (" don't", "other"), (" été", "word start"),
])
def test_token_classes_are_the_pages_definitions(text, cls):
    assert token_class(text) == cls


def test_coherence_is_the_commonest_class_and_tokens_share_of_each_units_top_contexts():
    g = torch.Generator().manual_seed(0)
    windows = torch.randint(0, 6, (5, 7), generator=g)
    classes = windows % 3                                 # a class per token id
    positions = torch.randint(0, 35, (4, 10), generator=g)
    got = coherence(windows, classes, positions)
    for u in range(4):
        ids = [int(windows.flatten()[p]) for p in positions[u]]
        assert float(got["token"][u]) == pytest.approx(Counter(ids).most_common(1)[0][1] / 10)
        assert float(got["class"][u]) == pytest.approx(Counter(i % 3 for i in ids).most_common(1)[0][1] / 10)


def test_chance_is_the_share_random_tokens_give():
    windows = torch.arange(1000).view(10, 100)            # every token its own id: the same token never recurs
    classes = windows % 2                                 # two classes, half each
    keep = torch.ones_like(windows, dtype=torch.bool)
    got = chance(windows, classes, keep, k=2, draws=20000)
    assert got["token"] == 0.5                            # of 2 distinct tokens, the commonest is 1 of 2
    assert got["class"] == pytest.approx(0.5 + 0.5 * 499 / 999, abs=0.01)   # both alike with p = 499/999
    assert chance(windows, torch.zeros_like(windows), keep, k=5)["class"] == 1.0


CLEAN, CORRUPT = [5, 9, 6, 9, 2], [5, 9, 6, 5, 2]        # IO 5 at 0, S 9 at 1 and 3; S2 given to the IO


def test_restoring_every_feature_of_a_perfect_dictionary_is_the_clean_run():
    model = tiny()
    sae = basis_dictionary("blocks.0.resid_post")
    clean, corrupt = torch.tensor([CLEAN]), torch.tensor([CORRUPT])
    torch.testing.assert_close(restored(model, sae, clean, corrupt), model(clean)[0], rtol=1e-5, atol=1e-5)
    with torch.no_grad(), spliced(model, sae, error=True) as seen:
        model(clean)
    f_clean = seen["blocks.0.resid_post.features"]
    torch.testing.assert_close(restored(model, sae, clean, corrupt, [3]),
                               patch_feature(model, sae, corrupt, 3, f_clean[..., 3]))


def test_ioi_features_are_ranked_by_attribution_and_measured_by_exact_patching():
    model = tiny()
    sae = basis_dictionary("blocks.0.resid_post")
    pairs = [Pair(CLEAN, CORRUPT, 5, 9), Pair([7, 4, 8, 4, 1, 3], [7, 4, 8, 7, 1, 3], 7, 4),
             Pair([1, 2, 3, 2, 6], [1, 2, 3, 1, 6], 1, 2)]   # two of one length: a batch
    got = ioi_features(model, sae, pairs, top=3)
    with torch.no_grad():
        gap = sum(float(p.metric(model(torch.tensor([p.clean]))[0]) - p.metric(model(torch.tensor([p.corrupt]))[0]))
                  for p in pairs)
    assert got["all"] == pytest.approx(1.0, abs=1e-4)     # no error term: the features are the whole stream
    assert got["gap"] == pytest.approx(gap / 3, rel=1e-5)
    attr = sum(feature_attribution(model, sae, torch.tensor([p.clean]), torch.tensor([p.corrupt]), p.metric)[0].sum(0)
               for p in pairs)
    assert [r["feature"] for r in got["top"]] == attr.topk(3).indices.tolist()
    for r in got["top"]:
        f = r["feature"]
        assert r["estimate"] == pytest.approx(float(attr[f]) / gap, rel=1e-4)
        exact = 0.0
        for p in pairs:
            clean, corrupt = torch.tensor([p.clean]), torch.tensor([p.corrupt])
            with torch.no_grad():
                before = float(p.metric(model(corrupt)[0]))
            exact += float(p.metric(restored(model, sae, clean, corrupt, [f]))) - before
        assert r["exact"] == pytest.approx(exact / gap, rel=1e-4)
        assert r["where"] in ("S2", "after S2", "END", "nowhere")   # the prompts agree before the second mention


def test_the_control_is_a_random_dictionary_of_the_same_shape_and_sparsity():
    from lumen.features import TopK
    from lumen.features.study import random_like

    sae = SAE(D, 24, TopK(3), "blocks.1.resid_post")
    with torch.no_grad():
        sae.b_dec.normal_()
    control = random_like(sae)
    assert control.W_dec.shape == sae.W_dec.shape and control.site == sae.site and control.act.k == 3
    torch.testing.assert_close(control.W_dec.norm(dim=-1), torch.ones(24))
    torch.testing.assert_close(control.b_dec, sae.b_dec)
    assert not torch.allclose(control.W_dec, sae.W_dec)
    x = torch.randn(5, D)
    assert int((control.encode(x) > 0).sum(-1).max()) <= 3


def test_ioi_pairs_need_names_of_one_token():
    with pytest.raises(UserError, match="one token each"):
        ioi_pairs(CharTokenizer.from_text("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ ,"))


def test_the_page_carries_the_numbers_and_a_verdict_they_decide():
    model = tiny()
    tok = CharTokenizer([chr(ord("a") + i) for i in range(30)] + [" ", ",", ".", "A", "B", "1", "2", "\n", "T", "x"])
    windows = torch.randint(0, 40, (8, 8), generator=torch.Generator().manual_seed(4))
    n = measure(model, tok, basis_dictionary("blocks.1.resid_post"), windows, [Pair(CLEAN, CORRUPT, 5, 9)])
    assert n["tokens"] == 8 * 7 and n["features"]["units"] == 2 * D and n["neurons"]["units"] == model.cfg.hidden
    assert {e["class"] for e in n["features"]["examples"]} <= set(CLASSES)
    assert n["control"]["units"] == 2 * D and "a random dictionary (control)" in page(n, "cmd", "about")
    text = page(n, "python -m lumen.features.study out.md --sae x", "about")
    assert f"{100 * n['features']['class_share']:.1f}%" in text and f"| {n['ioi']['top'][0]['feature']} |" in text
    base = {"ioi": {"top": []}, "chance": {"class": 0.4}}
    kinds = {"token_share": 0.1, "density_median": 0.01}
    more = verdict(base | {"features": kinds | {"class_share": 0.8}, "neurons": kinds | {"class_share": 0.5}})
    same = verdict(base | {"features": kinds | {"class_share": 0.5}, "neurons": kinds | {"class_share": 0.52}})
    assert "more often" in more and "about as often" in same
    control = {"token_share": 0.1}
    learned = verdict(base | {"features": kinds | {"class_share": 0.8}, "neurons": kinds | {"class_share": 0.5},
                              "control": control | {"class_share": 0.6}})
    slight = verdict(base | {"features": kinds | {"class_share": 0.63}, "neurons": kinds | {"class_share": 0.5},
                             "control": control | {"class_share": 0.6}})
    nothing = verdict(base | {"features": kinds | {"class_share": 0.58}, "neurons": kinds | {"class_share": 0.5},
                              "control": control | {"class_share": 0.6}})
    assert "+20.0 points, is what training adds" in learned and "only +3.0 points" in slight
    assert "do no better" in nothing


def test_the_page_command_refuses_a_missing_dictionary_in_one_line(tmp_path, capsys):
    from lumen.features.study import main

    assert main([str(tmp_path / "features.md"), "--sae", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nowhere" in err[0] and not (tmp_path / "features.md").exists()


def test_the_positions_of_an_ioi_prompt_are_named_by_their_role():
    from lumen.features.study import role

    p = Pair([8, 5, 9, 6, 9, 7, 3, 2], [8, 5, 9, 6, 5, 7, 3, 2], 5, 9)   # x IO S1 y S2 z z END
    assert [role(p, t) for t in range(8)] == ["other", "IO", "S1", "other", "S2", "after S2", "after S2", "END"]
