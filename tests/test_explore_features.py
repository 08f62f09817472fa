"""The explorer's feature pages (`lumen explore --sae`): every number a page shows is the feature tools' own,
computed independently in the test (density, the top contexts with each token's activation, the logit effects, the
logit lens), on a tiny model whose dictionary is the stream's own basis; the pages are offline, linked from the
explorer page, and written by the command. The browser checks (labels that never overlap) are in test_explore.py."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
import torch

from helpers.features import basis_dictionary
from helpers.models import peaked_tiny_model
from helpers.runs import TEXT, peaked_run
from lumen.features import density, feature_lens, feature_logits, save_saelens
from lumen.features.pages import feature_data
from lumen.inspect import run_with_cache
from lumen.inspect.neurons import shifted_tokens
from lumen.report.explore import feature_page, features_index, shade
from lumen.tokenizers.shown import shown as cell


@pytest.fixture(scope="module")
def subject():
    model, tok = peaked_tiny_model(TEXT)
    ids = tok.encode(TEXT)
    windows = torch.tensor([ids[i:i + 24] for i in range(0, len(ids) - 24, 24)])
    return model, tok, basis_dictionary("blocks.1.resid_post", model.cfg.d_model), windows


class Page(HTMLParser):
    """What a feature page shows, read off its tags: the data- attributes of each element class."""

    def __init__(self, html: str):
        super().__init__()
        self.found: dict[str, list[dict]] = {}
        self.links: list[str] = []
        self.bars: str | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "a":
            self.links.append(a["href"])
        if a.get("class") == "bars":
            self.bars = a["id"]
        for cls in (a.get("class") or "").split():
            self.found.setdefault(cls if cls != "bar-row" else f"bar-row {self.bars}", []).append(a)
        if a.get("id") == "density":
            self.found["density"] = [a]


def test_a_feature_pages_numbers_are_the_tools_numbers(subject):
    model, tok, sae, windows = subject
    data = feature_data(model, tok, sae, windows, features=[3, 40], k=4, n_tokens=5, corpus="TEXT")
    assert [p["feature"] for p in data["features"]] == [3, 40]
    keep = torch.ones(windows.shape, dtype=torch.bool)
    keep[:, 0] = False                                     # each window's first token is never counted
    dens = density(model, sae, windows, mask=keep)
    x = run_with_cache(model, windows, names=["blocks.1.resid_post"])[1]["blocks.1.resid_post"]
    for page in data["features"]:
        f = page["feature"]
        shown = Page(feature_page(data, page, "../page.html"))
        assert float(shown.found["density"][0]["data-value"]) == pytest.approx(float(dens[f]))
        d = model.cfg.d_model
        acts = (x[..., f] if f < d else -x[..., f - d]).relu()             # the feature: a coordinate of the stream
        top = acts[:, 1:].flatten().topk(4)
        want = [(float(v), divmod(int(p), windows.size(1) - 1)) for v, p in zip(*top) if v > 0]
        assert [float(c["data-activation"]) for c in shown.found["context"]] == pytest.approx(
            [v for v, _ in want], rel=1e-5)
        toks = [float(t["data-activation"]) for t in shown.found["tok"]]
        assert toks == pytest.approx([a for _, (row, t) in want for a in acts[row, max(0, t + 1 - 12):t + 5].tolist()],
                                     abs=1e-5)
        assert len(shown.found["trigger"]) == len(want)
        shifts = shifted_tokens(tok, feature_logits(model, sae, f), 5)
        for kind in ("promoted", "suppressed"):
            bars = shown.found[f"bar-row {kind}"]
            assert [b["data-token"] for b in bars] == [cell(t) for t, _ in shifts[kind]]
            assert [float(b["data-value"]) for b in bars] == pytest.approx([v for _, v in shifts[kind]], rel=1e-6)
        probs = feature_lens(model, sae, f).softmax(-1)
        lens = shown.found["bar-row lens"]
        assert [float(b["data-value"]) for b in lens] == pytest.approx(probs.topk(5).values.tolist(), rel=1e-6)
        assert [b["data-token"] for b in lens] == [cell(tok.decode([int(i)])) for i in probs.topk(5).indices]
        assert shown.links == ["../page.html"]
    # the top N by density, those that fire only
    top = feature_data(model, tok, sae, windows, top=5, k=2)
    assert [p["feature"] for p in top["features"]] == dens.topk(5).indices.tolist()
    assert [p["density"] for p in top["features"]] == sorted(dens.tolist(), reverse=True)[:5]


def test_feature_pages_are_offline_and_linked_from_the_explorer_page(subject):
    model, tok, sae, windows = subject
    data = feature_data(model, tok, sae, windows, top=3, k=3)
    for page in data["features"]:
        html = feature_page(data, page, "../page.html")
        assert not re.search(r"src=|https?:|@import|fetch\(|XMLHttpRequest|<script", html)
    index = Page(features_index(data, "page-features"))
    assert index.links == [f"page-features/feature-{p['feature']}.html" for p in data["features"]]
    assert shade(0.0, 2.0) == "rgb(255,255,255)" and shade(2.0, 2.0) == "rgb(253,141,60)"


def test_the_explore_command_writes_the_feature_pages(subject, tmp_path):
    from lumen.cli import main

    model, tok, sae, _ = subject
    run = peaked_run(tmp_path)
    save_saelens(sae, tmp_path / "sae")
    (tmp_path / "text.txt").write_text(TEXT)
    out = tmp_path / "page.html"
    args = ["explore", str(run), "--prompt", TEXT[:12], "--out", str(out), "--sae", str(tmp_path / "sae"),
            "--corpus", str(tmp_path / "text.txt"), "--windows", "3", "--seq-len", "16", "--feature", "1", "33"]
    assert main(args) == 0
    page = Page(out.read_text())
    assert page.links == ["page-features/feature-1.html", "page-features/feature-33.html"]
    shown = Page((tmp_path / "page-features" / "feature-33.html").read_text())
    assert shown.links == ["../page.html"] and shown.found["context"]
    assert main(args[:-2] + ["64"]) == 2   # out of range: the usual one line
