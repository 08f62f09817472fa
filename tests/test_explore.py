"""The explorer page and `lumen serve`, in a real browser: Debian's Chromium driven by Selenium through
chromium-driver (skipped, with the reason, where either is missing). What the page shows is compared
with the library computed independently in the test: the lens's top tokens, the attribution of each
position, each head's attention pattern as drawn on the canvas; and a prompt submitted through the served
page's form comes back as a new page, an invalid one as an error in the page, without stopping the server."""

import base64
import json
import re
import shutil
import threading
import urllib.request

import pytest
import torch

from helpers.models import peaked_tiny_model
from lumen.errors import UserError
from lumen.inspect import TunedLens, logit_lens, run_with_cache
from lumen.inspect.attribution import attribute
from lumen.report.explore import explore_data, explore_page
from lumen.report.html import colour
from lumen.report.serve import make_server
from lumen.tokenizers.shown import shown

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"
PROMPT = "To be, or not to"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def subject():
    return peaked_tiny_model(TEXT)


@pytest.fixture(scope="module")
def page(subject, tmp_path_factory):
    model, tok = subject
    data = explore_data(model, tok, PROMPT, corrupt="To be, or nqt to", contrast=("t", "q"))
    path = tmp_path_factory.mktemp("explore") / "page.html"
    path.write_text(explore_page(data))
    return path, data


def embedded(html: str) -> dict:
    return json.loads(re.search(r"<script type='application/json' id='data'>(.*?)</script>", html, re.S)
                      .group(1).replace("<\\/", "</"))


def test_page_is_self_contained_and_carries_the_numbers(subject, page):
    model, tok = subject
    path, data = page
    html = path.read_text()
    assert not re.search(r"(src|href)=|https?:|@import|fetch\(|XMLHttpRequest", html)
    assert embedded(html) == json.loads(json.dumps(data))
    ids = tok.encode(PROMPT)
    T, L, H = len(ids), model.n_layers, model.cfg.n_heads
    _, cache = run_with_cache(model, torch.tensor([ids]), [f"blocks.{i}.attn_pattern" for i in range(L)])
    raw = torch.frombuffer(bytearray(base64.b64decode(data["patterns"])), dtype=torch.uint8).view(L, H, -1)
    rows, cols = torch.tril_indices(T, T)
    for i in range(L):   # each weight stored to within half a step of 1/255
        err = (raw[i].float() / 255 - cache[f"blocks.{i}.attn_pattern"][0][:, rows, cols]).abs().max()
        assert err <= 0.5 / 255 + 1e-6
    assert set(data["patching"]["maps"]) == {"resid_pre", "attn_out", "mlp_out", "head"}
    # where the two prompts agree (before position 11), patching the stream restores nothing
    assert data["patching"]["maps"]["resid_pre"][0][:11] == pytest.approx([0.0] * 11, abs=1e-5)
    with pytest.raises(UserError, match="must match"):
        explore_data(model, tok, PROMPT, corrupt="To be")
    with pytest.raises(UserError, match="not one"):
        explore_data(model, tok, PROMPT, contrast=("to", "q"))


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip("no browser: the page tests need Debian's chromium and chromium-driver "
                    "(apt-get install -y chromium chromium-driver; make setup does it as root)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for f in CHROMIUM_FLAGS + [f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
                               "--window-size=1400,1000"]:
        opts.add_argument(f)
    opts.binary_location = chromium
    drv = webdriver.Chrome(service=Service(driver), options=opts)   # the system driver: nothing is downloaded
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def css(drv, selector):
    from selenium.webdriver.common.by import By

    return drv.find_elements(By.CSS_SELECTOR, selector)


def test_hover_a_lens_cell_shows_its_top_tokens(subject, page, browser):
    from selenium.webdriver.common.action_chains import ActionChains

    model, tok = subject
    browser.get(page[0].as_uri())
    assert browser.find_element("tag name", "body").get_attribute("data-rendered")
    r = logit_lens(model, tok.encode(PROMPT), k=5, tokenizer=tok)
    assert len(css(browser, "#lens td.cell")) == (r.n_layers + 1) * len(r.tokens)
    for layer, t in [(2, 5), (0, 0), (3, len(r.tokens) - 1)]:
        cell = css(browser, f'#lens td.cell[data-layer="{layer}"][data-t="{t}"]')[0]
        ActionChains(browser).move_to_element(cell).perform()
        assert css(browser, "#tip")[0].is_displayed()
        tips = [e.get_attribute("textContent") for e in css(browser, "#tip .tip-token")]
        assert tips == [shown(tok.decode([int(i)])) for i in r.top_ids[layer, t]]
        probs = [float(e.get_attribute("textContent")) for e in css(browser, "#tip .tip-prob")]
        assert probs == pytest.approx(r.top_probs[layer, t].tolist(), abs=6e-4)


def test_click_a_column_shows_that_positions_attribution(subject, page, browser):
    model, tok = subject
    browser.get(page[0].as_uri())
    ids = tok.encode(PROMPT)
    t_id, q_id = tok.encode("t")[0], tok.encode("q")[0]
    a = attribute(model, ids, contrast=(t_id, q_id))
    with torch.no_grad():
        logits = model(torch.tensor([ids]))[0][0]
    for t in (3, 0, len(ids) - 1):
        css(browser, f'#lens th.col[data-t="{t}"]')[0].click()
        bars = css(browser, "#attr .bar-row")
        assert [b.get_attribute("data-component") for b in bars] == a.components
        values = [float(b.get_attribute("data-value")) for b in bars]
        assert values == pytest.approx(a.values[:, t].tolist(), abs=2e-6)
        assert sum(values) == pytest.approx(float(logits[t, t_id] - logits[t, q_id]), abs=1e-4)
        assert f"position {t} " in css(browser, "#attr-title")[0].text
        heads = css(browser, "#heads td.head")          # the head map follows the chosen position too
        assert float(heads[6].get_attribute("data-value")) == pytest.approx(float(a.heads[1, 2, t]), abs=2e-6)


def test_the_attribution_bars_labels_never_overlap(page, browser):
    """Issue 39: at 1400x1000 the labels ("block 2 attention") ran into the bars. Every label, track and value of
    every row sits in its own box, left to right, and the rows stack without touching."""
    browser.get(page[0].as_uri())
    css(browser, '#lens th.col[data-t="0"]')[0].click()
    rows = css(browser, "#attr .bar-row")
    boxes = [browser.execute_script(
        "return [...arguments[0].children].map(e => { const r = e.getBoundingClientRect(); "
        "return [r.left, r.right, r.top, r.bottom, e.scrollWidth, e.clientWidth]; })", row) for row in rows]
    for row, (name, track, val) in zip(rows, boxes):
        assert name[4] <= name[5] + 1, f"{row.get_attribute('data-component')}: the label is cut or spills"
        assert name[1] <= track[0] + 0.5 and track[1] <= val[0] + 0.5, row.get_attribute("data-component")
    for (a, *_), (b, *_) in zip(boxes, boxes[1:]):
        assert a[3] <= b[2] + 0.5   # one row's label ends above the next one's


def test_click_a_head_draws_its_attention_pattern(subject, page, browser):
    model, tok = subject
    browser.get(page[0].as_uri())
    ids = tok.encode(PROMPT)
    T = len(ids)
    _, cache = run_with_cache(model, torch.tensor([ids]), ["blocks.1.attn_pattern"])
    css(browser, '#heads td.head[data-layer="1"][data-head="2"]')[0].click()
    assert "block 1, head 2" in css(browser, "#pattern-title")[0].text
    pixels = browser.execute_script(
        "const c = document.getElementById('pattern');"
        "return [c.width, c.height, Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data)];")
    w, h, rgba = pixels
    assert (w, h) == (T, T)
    img = torch.tensor(rgba, dtype=torch.float).view(T, T, 4)[..., :3]
    a = cache["blocks.1.attn_pattern"][0, 2]
    for q in range(T):
        for k in range(q + 1):
            want = torch.tensor([float(v) for v in colour(float(a[q, k]))[4:-1].split(",")])
            assert (img[q, k] - want).abs().max() <= 2, (q, k)
    assert float(a.max() - a[a > 0].min()) > 0.5   # a pattern with contrast: the check tells heads apart


def test_the_tuned_lens_toggle_switches_the_grid(subject, browser, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains

    model, tok = subject
    torch.manual_seed(1)
    lens = TunedLens(model)
    with torch.no_grad():
        for t in lens.translators:
            t.lin.weight.normal_(0, 0.5)   # a lens that reads the stream differently from the logit lens
    path = tmp_path / "tuned.html"
    path.write_text(explore_page(explore_data(model, tok, PROMPT, tuned=lens)))
    browser.get(path.as_uri())
    ids = tok.encode(PROMPT)
    want = {name: logit_lens(model, ids, lens_, k=5, tokenizer=tok).top_ids[1, 4]
            for name, lens_ in [("logit lens", None), ("tuned lens", lens)]}
    assert not torch.equal(want["logit lens"], want["tuned lens"])
    for name in ("tuned lens", "logit lens"):
        css(browser, f'#lens-switch button[data-lens="{name}"]')[0].click()
        ActionChains(browser).move_to_element(css(browser, '#lens td.cell[data-layer="1"][data-t="4"]')[0]).perform()
        tips = [e.get_attribute("textContent") for e in css(browser, "#tip .tip-token")]
        assert tips == [shown(tok.decode([int(i)])) for i in want[name]], name


def test_serve_answers_prompts_through_the_page_and_survives_bad_ones(subject, browser):
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    model, tok = subject
    server = make_server(model, tok, port=0, prompt=PROMPT)
    assert server.server_address[0] == "127.0.0.1"
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    try:
        browser.get(server.url)
        assert css(browser, "#prompt-text")[0].text == PROMPT
        for prompt, corrupt, contrast, error in [("the mind to suffer", "", "", None),
                                                 ("that is the question", "that is", "", "must match"),
                                                 ("", "", "", "empty"),
                                                 ("nobler in the", "nobler on the", "tq", None),
                                                 ("nobler in the", "", "t", "both contrast tokens")]:
            for field, value in [("prompt", prompt), ("corrupt", corrupt), ("contrast_a", contrast[:1]),
                                 ("contrast_b", contrast[1:])]:
                css(browser, f"#{field}")[0].clear()
                css(browser, f"#{field}")[0].send_keys(value)
            browser.execute_script("window.lumenOldPage = true")
            css(browser, "#go")[0].click()
            # The answer is a new page: a fresh window has no mark. Mid-navigation the driver may answer
            # with any WebDriverException (chromedriver's "node does not belong to the document"), so retry.
            WebDriverWait(browser, 30, ignored_exceptions=(WebDriverException,)).until(
                lambda d: d.execute_script("return !window.lumenOldPage && document.readyState === 'complete'"))
            assert css(browser, "#prompt")[0].get_attribute("value") == prompt   # the form keeps what was sent
            if error:
                assert error in css(browser, "#error")[0].text and not css(browser, "#lens")
                continue
            assert not css(browser, "#error") and css(browser, "#prompt-text")[0].text == prompt
            cols = [e.get_attribute("textContent") for e in css(browser, "#lens th.col")]
            assert cols == [shown(tok.decode([i])) for i in tok.encode(prompt)]
            assert bool(css(browser, "#patch-resid_pre")) == bool(corrupt)
        with pytest.raises(urllib.error.HTTPError, match="404"):
            urllib.request.urlopen(server.url + "nothing-here", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    assert not thread.is_alive()


@pytest.fixture(scope="module")
def feature_page_file(subject, tmp_path_factory):
    """A feature page of the peaked model, its dictionary the stream's own basis (feature j: relu(x_j))."""
    from lumen.features import SAE, ReLU
    from lumen.features.pages import feature_data
    from lumen.report.explore import feature_page

    model, tok = subject
    d = model.cfg.d_model
    sae = SAE(d, 2 * d, ReLU(), "blocks.1.resid_post", apply_b_dec_to_input=False)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([torch.eye(d), -torch.eye(d)], 1))
        sae.W_dec.copy_(torch.cat([torch.eye(d), -torch.eye(d)], 0))
        sae.b_enc.zero_()
        sae.b_dec.zero_()
    ids = tok.encode(TEXT * 3)
    windows = torch.tensor([ids[i:i + 20] for i in range(0, len(ids) - 20, 20)])
    data = feature_data(model, tok, sae, windows, features=[5], k=6)
    path = tmp_path_factory.mktemp("features") / "feature-5.html"
    path.write_text(feature_page(data, data["features"][0], "../page.html"))
    return path, data["features"][0]


def test_a_feature_pages_labels_and_tokens_never_overlap(feature_page_file, browser):
    """Each bar's label, track and value sit side by side in their own boxes; each context's activation stands
    left of its text, its tokens left to right without overlapping, each shaded by its own activation; the rows
    stack without touching."""
    from lumen.report.explore import shade

    path, page = feature_page_file
    browser.get(path.as_uri())
    box = ("return [...arguments[0]].map(e => { const r = e.getBoundingClientRect(); "
           "return [r.left, r.right, r.top, r.bottom, e.scrollWidth, e.clientWidth, "
           "getComputedStyle(e).backgroundColor]; })")
    for kind in ("promoted", "suppressed", "lens"):
        rows = css(browser, f"#{kind} .bar-row")
        assert len(rows) == 10
        parts = [browser.execute_script(box, row.find_elements("css selector", ":scope > span")) for row in rows]
        for row, (name, track, val) in zip(rows, parts):
            assert name[4] <= name[5] + 1, f"{kind} {row.get_attribute('data-token')!r}: the label is cut or spills"
            assert name[1] <= track[0] + 0.5 and track[1] <= val[0] + 0.5, row.get_attribute("data-token")
        for a, b in zip(parts, parts[1:]):
            assert a[0][3] <= b[0][2] + 0.5
    contexts = css(browser, ".context")
    assert len(contexts) == len(page["contexts"]) > 1
    top = max(c["activation"] for c in page["contexts"])
    lines = []
    for ctx, want in zip(contexts, page["contexts"]):
        act = browser.execute_script(box, [ctx.find_element("css selector", ".act")])[0]
        toks = browser.execute_script(box, ctx.find_elements("css selector", ".tok"))
        assert len(toks) == len(want["tokens"])
        assert act[4] <= act[5] + 1 and act[1] <= toks[0][0] + 0.5, "the activation is cut or runs into the text"
        for a, b in zip(toks, toks[1:]):
            assert a[1] <= b[0] + 0.5 and abs(a[2] - b[2]) < 1, "tokens overlap or leave the line"
        for t, a in zip(toks, want["activations"]):
            assert t[6].replace(" ", "") == shade(a, top)
        lines.append(act)
    for a, b in zip(lines, lines[1:]):
        assert a[3] <= b[2] + 0.5
