"""The figures and the self-contained HTML page: written atomically, drawn, and (in headless Chromium)
rendered as a coloured grid without any network access."""

import shutil
import subprocess
from html.parser import HTMLParser

import matplotlib.image
import pytest
import torch

from helpers.models import peaked_tiny_model
from lumen.files import atomic_path, write_text
from lumen.inspect import deletion_table, head_scores, logit_lens
from lumen.report.figures import deletion_bars, head_scores_plot, layer_curves, lens_heatmap
from lumen.report.html import colour, lens_page

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
PROMPT = "To be, or not to be"


@pytest.fixture(scope="module")
def result():
    model, tok = peaked_tiny_model(TEXT)
    return model, tok, logit_lens(model, tok.encode(PROMPT), k=4, tokenizer=tok)


def test_figures_are_drawn(tmp_path, result):
    model, tok, r = result
    x = torch.tensor([tok.encode(TEXT[:40]), tok.encode(TEXT[40:80])])
    paths = [
        lens_heatmap(r, tmp_path / "lens.png"),
        layer_curves({"logit lens": r.kl.mean(1).tolist()}, tmp_path / "kl.png", log=True),
        deletion_bars(deletion_table(model, x), tmp_path / "deletion.png"),
        head_scores_plot(head_scores(model, x, n_random=1, half=8), tmp_path / "heads.png"),
    ]
    for p in paths:
        img = matplotlib.image.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
        assert img[..., :3].std() > 0.05  # something was drawn on the white canvas
    assert sorted(f.name for f in tmp_path.iterdir()) == ["deletion.png", "heads.png", "kl.png", "lens.png"]


def test_atomic_path_leaves_nothing_on_failure(tmp_path):
    target = tmp_path / "out.txt"
    write_text(target, "old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("crash while writing")
    assert target.read_text() == "old" and [f.name for f in tmp_path.iterdir()] == ["out.txt"]


def shown(token: str) -> str:
    """How the page must show a token: a newline as \\n, a space-only token as open boxes."""
    if token == "\n":
        return "\\n"
    return "\u2423" * len(token) if token.isspace() else token


class Cells(HTMLParser):
    """Collects each grid cell's text: the top-1 token, then the tooltip's lines."""

    def __init__(self):
        super().__init__()
        self.cells, self.depth, self.refs = [], 0, []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.refs += [v for k, v in attrs if k in ("src", "href")]
        if tag == "td" and a.get("class") == "cell":
            self.cells.append([])
            self.depth = 1
        elif self.depth and tag in ("div", "b"):
            self.cells[-1].append("")
            self.depth += 1

    def handle_endtag(self, tag):
        if self.depth and tag in ("td", "div", "b"):
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            if not self.cells[-1]:
                self.cells[-1].append("")
            self.cells[-1][-1] += data


def test_html_page_is_self_contained_with_the_top_k_in_each_cell(result):
    _, tok, r = result
    page = lens_page(r)
    parser = Cells()
    parser.feed(page)
    T, L = len(r.tokens), r.n_layers
    assert len(parser.cells) == (L + 1) * T
    assert not parser.refs and "<script" not in page and "http" not in page and "@import" not in page
    for n, cell in enumerate(parser.cells):  # rows run from the last layer down to the embedding
        layer, t = L - n // T, n % T
        top = [shown(tok.decode([int(i)])) for i in r.top_ids[layer, t]]
        assert cell[0] == top[0]
        lines = [c for c in cell[1:] if c and not c.startswith(("top", "KL"))]
        assert [line.rsplit("\xa0", 1)[0][:-1] for line in lines] == top  # the tooltip: all top-k tokens


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


def test_html_page_renders_the_grid_in_headless_chromium(tmp_path, result):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (make setup installs it with apt-get; or apt-get install -y chromium)")
    _, _, r = result
    page = write_text(tmp_path / "lens.html", lens_page(r))
    shot = tmp_path / "shot.png"
    cmd = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}",
           "--window-size=1400,1000", page.as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert shot.is_file(), done.stderr[-2000:]
    img = matplotlib.image.imread(shot)[..., :3] * 255
    R, G, B = img[..., 0], img[..., 1], img[..., 2]
    blue = (B - R > 25) & (B > G)                      # cell colours run from pale to dark blue
    cells = (r.n_layers + 1) * len(r.tokens)
    assert blue.sum() > cells * 150, f"only {int(blue.sum())} cell-coloured pixels for {cells} cells"
    p_max = float(r.top_probs[..., 0].max())          # the most confident cell is drawn in its own colour
    want = [int(v) for v in colour(p_max)[4:-1].split(",")]
    same = (abs(R - want[0]) <= 3) & (abs(G - want[1]) <= 3) & (abs(B - want[2]) <= 3)
    assert same.sum() > 150, f"no cell drawn in {colour(p_max)} (probability {p_max:.2f})"
    rows = blue.any(1).nonzero()[0]
    assert rows.max() - rows.min() > (r.n_layers + 1) * 15  # the grid spans every layer's row
