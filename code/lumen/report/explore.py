"""One self-contained HTML page to explore a prompt (`lumen explore`, `lumen serve`): everything inline, no
network. It shows

    the logit lens     layers x positions, colour = the probability of the model's final prediction at
                       that position; hover a cell for the lens's top tokens (tuned lens: a toggle)
    attribution        click a column: each component's direct contribution to that position's logit
    heads              layers x heads, coloured by each head's contribution there; click one for its
                       attention pattern (queries down, keys across)
    patching           with a corrupted prompt: the fraction of the clean answer each patch restores
    features           with a sparse dictionary: a page per feature (its top contexts, logit effects, logit
                       lens and density), linked from a table at the end (`feature_data`, `feature_page`)

    >>> page = explore_page(explore_data(model, tok, "The Eiffel Tower is in"))   # doctest: +SKIP

The numbers travel as one JSON block; a small script draws the page from it. Attention patterns are
stored as bytes (weight x 255, lower triangle only), which keeps SmolLM2's 30 x 9 heads on a 100-token
prompt under ~2 MB.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from html import escape

import torch

from .. import names
from ..errors import UserError
from ..inspect.attribution import attribute
from ..inspect.cache import run_with_cache
from ..inspect.lens import LogitLens, logit_lens
from ..inspect.patching import KINDS, logit_diff, patching_maps
from ..model import GPT
from ..progress import progress
from ..tokenizers import single_token
from ..tokenizers.shown import logit_name, shown
from .html import DARK, LIGHT

MAX_TOKENS = 256   # longer prompts make a page too large to be useful


def explore_data(model: GPT, tokenizer, prompt: str, contrast: tuple[str, str] | None = None,
                 corrupt: str | None = None, tuned=None, k: int = 5, patch_kinds: Sequence[str] = tuple(KINDS)) -> dict:
    """Everything the page shows, as plain JSON-ready numbers. contrast: two token texts whose logit
    difference the attribution splits (default: each position's own top prediction); corrupt: a prompt
    of the same token length for the patching maps (of patch_kinds: each (layer, position) cell is a
    forward pass); tuned: a TunedLens for the lens toggle."""
    ids = tokenizer.encode(prompt)
    if not ids:
        raise UserError("the prompt is empty: give some text")
    if len(ids) > min(MAX_TOKENS, model.cfg.context):
        raise UserError(f"the prompt is {len(ids)} tokens; the page shows at most {min(MAX_TOKENS, model.cfg.context)}")
    model.eval()
    pair = (single_token(tokenizer, contrast[0], "contrast token"),
            single_token(tokenizer, contrast[1], "contrast token")) if contrast else None
    # the page's parts, each one forward pass with its cache: equal pieces of work for the bar's estimate
    # (the patching maps below draw their own bar, by cells)
    with progress(total=3 + (tuned is not None), desc="exploring", unit="part") as bar:
        bar.set_postfix_str("lens")
        lenses = {"logit lens": logit_lens(model, ids, LogitLens(model), k, tokenizer)}
        bar.update()
        if tuned is not None:
            bar.set_postfix_str("tuned lens")
            lenses["tuned lens"] = logit_lens(model, ids, tuned, k, tokenizer)
            bar.update()
        bar.set_postfix_str("attribution")
        a = attribute(model, ids, contrast=pair, tokenizer=tokenizer)
        bar.update()
        bar.set_postfix_str("heads")
        patterns = _patterns(model, ids)
        bar.update()
    texts: dict[int, str] = {}
    for r in lenses.values():
        texts.update(r.texts)
    texts.update({i: tokenizer.decode([i]) for i in a.target + (a.minus or [])})
    L, T = len(model.blocks), len(ids)
    data = {
        "model": model.cfg.name, "prompt": prompt, "tokens": [shown(t) for t in a.tokens], "ids": ids,
        "n_layers": L, "n_heads": model.attention(0).n_heads, "layer_names": [names.stream(i) for i in range(L + 1)],
        "texts": {str(i): shown(t) for i, t in texts.items()},
        "lenses": {name: {"top_ids": r.top_ids.tolist(), "top_probs": _round(r.top_probs, 4),
                          "final_prob": _round(r.final_prob, 4)} for name, r in lenses.items()},
        "attribution": a.to_dict(lambda i: shown(tokenizer.decode([i]))),
        "display": {c: names.display(c) for c in a.components},
        "patterns": patterns,
        "contrast": list(contrast) if contrast else None,
        "patching": None,
    }
    if corrupt:
        bad = tokenizer.encode(corrupt)
        if len(bad) != T:
            raise UserError(f"the corrupted prompt is {len(bad)} tokens, the prompt {T}: they must match "
                            f"({tokenizer.str_tokens(ids)} vs {tokenizer.str_tokens(bad)})")
        with torch.no_grad():
            ans = pair or (int(model(torch.tensor([ids]))[0][0, -1].argmax()),
                           int(model(torch.tensor([bad]))[0][0, -1].argmax()))
        if ans[0] == ans[1]:
            raise UserError("both prompts predict the same next token: give a contrast pair to compare")
        name = logit_name(tokenizer.decode([ans[0]]), tokenizer.decode([ans[1]]))
        p = patching_maps(model, ids, bad, logit_diff(*ans), patch_kinds, tokenizer=tokenizer, metric_name=name)
        data["patching"] = p.to_dict() | {"corrupt": corrupt, "corrupt_tokens": [shown(t) for t in p.corrupt_tokens]}
    return data


def _round(t: torch.Tensor | list | float | None, digits: int) -> list | float | None:
    """A tensor as nested lists of numbers rounded for JSON (None stays None: JSON's null)."""
    if t is None:
        return None
    if isinstance(t, torch.Tensor):
        t = t.tolist()
    return [_round(x, digits) for x in t] if isinstance(t, list) else round(t, digits)


def _patterns(model: GPT, ids: list[int]) -> str:
    """Every head's attention pattern as bytes, base64: for each layer and head, the lower triangle
    (query q, keys 0..q) row by row, each weight as round(255 w)."""
    wanted = [names.activation(i, "attn_pattern") for i in range(len(model.blocks))]
    _, cache = run_with_cache(model, torch.tensor([ids], device=model.device), wanted)
    a = cache.stack("attn_pattern")[:, 0].float().cpu()                       # (L, H, T, T)
    T = a.size(-1)
    rows, cols = torch.tril_indices(T, T)
    tri = a[..., rows, cols]                                                  # (L, H, T(T+1)/2)
    return base64.b64encode((tri * 255).round().clamp(0, 255).to(torch.uint8).numpy().tobytes()).decode()


STYLE = """
body { font: 13px/1.4 system-ui, sans-serif; margin: 16px; color: #222; background: #fff; }
h1 { font-size: 18px; margin: 0 0 6px; } h2 { font-size: 15px; margin: 18px 0 6px; }
.scroll { overflow: auto; max-width: 100%; max-height: 70vh; border: 1px solid #ddd; }
table.grid { border-collapse: collapse; }
table.grid td, table.grid th { border: 1px solid #ddd; padding: 1px 3px; white-space: pre; font-size: 11px; }
table.grid th { background: #f3f3f3; font-weight: normal; position: sticky; top: 0; }
table.grid th.row { position: sticky; left: 0; z-index: 1; }
th.col { cursor: pointer; } td.cell { cursor: pointer; font-family: monospace; text-align: center; max-width: 70px;
  overflow: hidden; text-overflow: ellipsis; }
.sel { outline: 2px solid #e6550d; outline-offset: -2px; }
#tip { display: none; position: fixed; z-index: 10; background: #fff; border: 1px solid #888; padding: 4px 8px;
  box-shadow: 0 2px 6px #0004; font-family: monospace; pointer-events: none; }
.tip-token { white-space: pre; }
.row-flex { display: flex; gap: 28px; flex-wrap: wrap; align-items: flex-start; }
.row-flex .note { max-width: 380px; }
.bar-row { display: flex; align-items: center; height: 15px; font-size: 11px; }
.bar-row .name { flex: none; width: var(--name-width, 18ch); text-align: right; padding-right: 6px;
                 font-family: monospace; white-space: nowrap; box-sizing: content-box; }
.bar-row .track { flex: none; width: 260px; position: relative; height: 11px; background: #f6f6f6; }
.bar-row .bar { position: absolute; top: 0; height: 11px; }
.bar-row .val { flex: none; width: 9ch; padding-left: 6px; font-family: monospace; white-space: nowrap; }
td.head { width: 18px; height: 13px; cursor: pointer; padding: 0; }
#pattern { image-rendering: pixelated; border: 1px solid #ccc; width: 360px; height: 360px; }
#error { color: #a00; background: #fee; border: 1px solid #e99; padding: 6px 10px; margin: 8px 0; }
form textarea { width: 90%; height: 3em; font: inherit; }
form input[type=text] { width: 12em; }
.note { color: #666; font-size: 12px; }
button.lens { margin-right: 6px; }
button.lens.on { background: #08306b; color: #fff; }
"""

SCRIPT = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const LIGHT = %LIGHT%, DARK = %DARK%;
const T = D.tokens.length, L = D.n_layers, H = D.n_heads;
let lens = Object.keys(D.lenses)[0], pos = T - 1, chosen = null;
function blue(p) {
  p = Math.min(1, Math.max(0, p));
  return LIGHT.map((lo, i) => Math.round(lo + (DARK[i] - lo) * p));
}
function rgb(c) { return 'rgb(' + c.join(',') + ')'; }
function diverging(v, lim) {          // red adds, blue takes away, white 0
  const x = Math.min(1, Math.abs(v) / (lim || 1));
  const to = v >= 0 ? [178, 24, 43] : [33, 102, 172];
  return rgb([255, 255, 255].map((w, i) => Math.round(w + (to[i] - w) * x)));
}
function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const k in attrs || {}) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
}
function word(id) { return D.texts[String(id)] !== undefined ? D.texts[String(id)] : String(id); }
function buildLens() {
  const tab = document.getElementById('lens'), data = D.lenses[lens];
  tab.textContent = '';
  const head = el('tr');
  head.appendChild(el('th', {class: 'row'}, 'layer \\ input'));
  D.tokens.forEach((t, i) => head.appendChild(el('th', {class: 'col', 'data-t': i}, t)));
  tab.appendChild(head);
  for (let l = L; l >= 0; l--) {
    const tr = el('tr');
    tr.appendChild(el('th', {class: 'row'}, D.layer_names[l]));
    for (let t = 0; t < T; t++) {
      const p = data.final_prob[l][t];
      const td = el('td', {class: 'cell', 'data-layer': l, 'data-t': t}, word(data.top_ids[l][t][0]));
      td.style.background = rgb(blue(p));
      td.style.color = p > 0.55 ? '#fff' : '#000';
      tr.appendChild(td);
    }
    tab.appendChild(tr);
  }
  markColumn();
}
function markColumn() {
  document.querySelectorAll('#lens .sel').forEach(e => e.classList.remove('sel'));
  document.querySelectorAll('#lens [data-t="' + pos + '"]').forEach(e => e.classList.add('sel'));
}
function showTip(td, ev) {
  const l = +td.dataset.layer, t = +td.dataset.t, data = D.lenses[lens], tip = document.getElementById('tip');
  tip.textContent = '';
  tip.appendChild(el('b', {}, lens + ', ' + D.layer_names[l] + ', after ' + JSON.stringify(D.tokens[t])));
  data.top_ids[l][t].forEach((id, j) => {
    const line = el('div', {class: 'tip-line'});
    line.appendChild(el('span', {class: 'tip-token'}, word(id)));
    line.appendChild(el('span', {class: 'tip-prob'}, '  ' + data.top_probs[l][t][j].toFixed(3)));
    tip.appendChild(line);
  });
  tip.style.display = 'block';
  tip.style.left = Math.min(ev.clientX + 12, window.innerWidth - 260) + 'px';
  tip.style.top = (ev.clientY + 14) + 'px';
}
function select(t) { pos = t; markColumn(); buildAttr(); buildHeads(); if (chosen) showPattern(chosen[0], chosen[1]); }
function buildAttr() {
  const A = D.attribution, box = document.getElementById('attr');
  const what = A.minus ? 'logit[' + JSON.stringify(A.target[pos]) + '] - logit[' + JSON.stringify(A.minus[pos]) + ']'
                       : 'logit[' + JSON.stringify(A.target[pos]) + ']';
  document.getElementById('attr-title').textContent =
    'position ' + pos + ' (' + JSON.stringify(D.tokens[pos]) + '): ' + what + ' = ' + A.logit[pos].toFixed(3);
  box.textContent = '';
  const names = Object.keys(A.components);
  // the label column as wide as the longest label ("block 29 attention"), so no label runs into its bar
  box.style.setProperty('--name-width', Math.max(...names.map(n => D.display[n].length)) + 'ch');
  const lim = Math.max(...names.map(n => Math.abs(A.components[n][pos]))) || 1;
  names.forEach(n => {
    const v = A.components[n][pos];
    const row = el('div', {class: 'bar-row', 'data-component': n, 'data-value': String(v)});
    row.appendChild(el('span', {class: 'name'}, D.display[n]));
    const track = el('span', {class: 'track'}), bar = el('span', {class: 'bar'});
    const w = 50 * Math.abs(v) / lim;
    bar.style.width = w + '%';
    bar.style.left = (v >= 0 ? 50 : 50 - w) + '%';
    bar.style.background = v >= 0 ? '#b2182b' : '#2166ac';
    track.appendChild(bar);
    row.appendChild(track);
    row.appendChild(el('span', {class: 'val'}, (v >= 0 ? '+' : '') + v.toFixed(3)));
    box.appendChild(row);
  });
}
function buildHeads() {
  const tab = document.getElementById('heads'), A = D.attribution;
  tab.textContent = '';
  const head = el('tr');
  head.appendChild(el('th', {}, 'block \\ head'));
  for (let h = 0; h < H; h++) head.appendChild(el('th', {}, String(h)));
  tab.appendChild(head);
  let lim = 0;
  A.heads.forEach(layer => layer.forEach(v => { lim = Math.max(lim, Math.abs(v[pos])); }));
  for (let l = 0; l < L; l++) {
    const tr = el('tr');
    tr.appendChild(el('th', {}, String(l)));
    for (let h = 0; h < H; h++) {
      const v = A.heads[l][h][pos];
      const td = el('td', {class: 'head', 'data-layer': l, 'data-head': h, 'data-value': String(v),
                           title: 'block ' + l + ' head ' + h + ': ' + v.toFixed(4)});
      td.style.background = diverging(v, lim);
      if (chosen && chosen[0] === l && chosen[1] === h) td.classList.add('sel');
      tr.appendChild(td);
    }
    tab.appendChild(tr);
  }
}
const PAT = Uint8Array.from(atob(D.patterns), c => c.charCodeAt(0));
const TRI = T * (T + 1) / 2;
function weight(l, h, q, k) { return PAT[(l * H + h) * TRI + q * (q + 1) / 2 + k] / 255; }
function showPattern(l, h) {
  chosen = [l, h];
  document.querySelectorAll('#heads .sel').forEach(e => e.classList.remove('sel'));
  const cell = document.querySelector('#heads td[data-layer="' + l + '"][data-head="' + h + '"]');
  if (cell) cell.classList.add('sel');
  const c = document.getElementById('pattern');
  c.width = T; c.height = T;
  c.dataset.layer = l; c.dataset.head = h;
  const ctx = c.getContext('2d'), img = ctx.createImageData(T, T);
  for (let q = 0; q < T; q++) for (let k = 0; k < T; k++) {
    const px = 4 * (q * T + k), col = k <= q ? blue(weight(l, h, q, k)) : [221, 221, 221];
    img.data[px] = col[0]; img.data[px + 1] = col[1]; img.data[px + 2] = col[2]; img.data[px + 3] = 255;
  }
  ctx.putImageData(img, 0, 0);
  let best = 0;
  for (let k = 0; k <= pos; k++) if (weight(l, h, pos, k) > weight(l, h, pos, best)) best = k;
  document.getElementById('pattern-title').textContent = 'block ' + l + ', head ' + h +
    ': queries down, keys across; from position ' + pos + ' it attends most to ' + best + ' ' +
    JSON.stringify(D.tokens[best]) + ' (' + weight(l, h, pos, best).toFixed(2) + ')';
}
function buildPatching() {
  const P = D.patching;
  if (!P) return;
  document.getElementById('patching-box').style.display = 'block';
  document.getElementById('patching-title').textContent = 'clean: ' + JSON.stringify(D.prompt) + '  corrupt: ' +
    JSON.stringify(P.corrupt) + '.  ' + P.metric + ': clean ' + P.clean_metric.toFixed(3) + ', corrupt ' +
    P.corrupt_metric.toFixed(3) + '. Each cell: the fraction a patch restores (red 1, white 0, blue -1).';
  const box = document.getElementById('patching');
  for (const kind in P.maps) {
    const wrap = el('div'), tab = el('table', {class: 'grid patch', id: 'patch-' + kind});
    wrap.appendChild(el('h3', {}, kind.replace('_', ' ')));
    const m = P.maps[kind], head = el('tr');
    head.appendChild(el('th', {}, 'block'));
    (kind === 'head' ? m[0].map((_, h) => 'h' + h) : D.tokens).forEach(c => head.appendChild(el('th', {}, c)));
    tab.appendChild(head);
    m.forEach((row, l) => {
      const tr = el('tr');
      tr.appendChild(el('th', {}, String(P.layers[l])));
      row.forEach((v, j) => {
        const td = el('td', {'data-value': String(v),
                             title: kind + ' block ' + P.layers[l] + ' ' + j + ': ' + v.toFixed(3)});
        td.style.background = diverging(v, 1);
        td.style.width = '14px';
        tr.appendChild(td);
      });
      tab.appendChild(tr);
    });
    wrap.appendChild(tab);
    box.appendChild(wrap);
  }
}
function init() {
  const lensTab = document.getElementById('lens');
  lensTab.addEventListener('mouseover', ev => { const td = ev.target.closest('td.cell'); if (td) showTip(td, ev); });
  lensTab.addEventListener('mouseleave', () => { document.getElementById('tip').style.display = 'none'; });
  lensTab.addEventListener('click', ev => { const e = ev.target.closest('[data-t]'); if (e) select(+e.dataset.t); });
  document.getElementById('heads').addEventListener('click', ev => {
    const td = ev.target.closest('td.head'); if (td) showPattern(+td.dataset.layer, +td.dataset.head); });
  const sw = document.getElementById('lens-switch');
  Object.keys(D.lenses).forEach(name => {
    const b = el('button', {class: 'lens' + (name === lens ? ' on' : ''), type: 'button', 'data-lens': name}, name);
    b.onclick = () => { lens = name; sw.querySelectorAll('button').forEach(x => x.classList.toggle('on', x === b));
                        buildLens(); };
    sw.appendChild(b);
  });
  if (Object.keys(D.lenses).length < 2) sw.style.display = 'none';
  buildLens(); buildAttr(); buildHeads(); showPattern(L - 1, 0); buildPatching();
  document.body.dataset.rendered = performance.now().toFixed(1);
}
init();
"""


def _form(values: dict) -> str:
    v = {k: escape(values.get(k) or "", quote=True) for k in ("prompt", "contrast_a", "contrast_b", "corrupt")}
    return (
        "<form method='get' action='/' id='form'>"
        f"<div><textarea name='prompt' id='prompt' placeholder='a prompt'>{v['prompt']}</textarea></div>"
        f"<div>contrast <input type='text' name='contrast_a' id='contrast_a' value='{v['contrast_a']}'> minus "
        f"<input type='text' name='contrast_b' id='contrast_b' value='{v['contrast_b']}'> "
        f"corrupted prompt (same token length) <input type='text' name='corrupt' id='corrupt' value='{v['corrupt']}'>"
        " <button type='submit' id='go'>explore</button></div>"
        "<div class='note'>contrast: two single tokens (with their leading space, e.g. ' Paris' and ' Rome'); "
        "empty: each position's own prediction.</div></form>"
    )


def explore_page(data: dict | None, form: dict | None = None, error: str | None = None, features: str = "") -> str:
    """The page as one string. data: from explore_data (None: only the form and the error); form: the
    served page's text box values (None: a static page without a form); features: the section that links the
    feature pages (`features_index`)."""
    title = f"lumen explore: {data['model']}" if data else "lumen explore"
    parts = ["<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
             f"<title>{escape(title)}</title><style>{STYLE}{FEATURE_STYLE if features else ''}</style></head><body>",
             f"<h1>{escape(title)}</h1>"]
    if form is not None:
        parts.append(_form(form))
    if error:
        parts.append(f"<div id='error'>error: {escape(error)}</div>")
    if data:
        payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
        script = SCRIPT.replace("%LIGHT%", json.dumps(list(LIGHT))).replace("%DARK%", json.dumps(list(DARK)))
        parts += [
            f"<p>prompt: <code id='prompt-text'>{escape(data['prompt'])}</code></p>",
            "<h2>Logit lens</h2><div id='lens-switch'></div>",
            "<p class='note'>Each cell: the top-1 next token read from the stream after that layer; colour: the "
            "probability the lens gives the model's own final prediction at that position (white 0, dark blue 1). "
            "Hover a cell for the top tokens; click a column to attribute its prediction.</p>",
            "<div class='scroll'><table class='grid' id='lens'></table></div><div id='tip'></div>",
            "<div class='row-flex'><div><h2>Direct logit attribution</h2><div id='attr-title'></div>"
            "<p class='note'>Each write into the stream, read through the final norm (its scale frozen): they sum "
            "to the logit.</p><div id='attr'></div></div>",
            "<div><h2>Heads</h2><p class='note'>Each head's direct contribution at the chosen position "
            "(red adds, blue takes away); click a head.</p><table class='grid' id='heads'></table></div>",
            "<div><h2>Attention pattern</h2><div id='pattern-title' class='note'></div>"
            "<canvas id='pattern'></canvas></div></div>",
            "<div id='patching-box' style='display:none'><h2>Activation patching</h2>"
            "<div id='patching-title' class='note'></div><div id='patching' class='row-flex'></div></div>",
            f"<script type='application/json' id='data'>{payload}</script><script>{script}</script>",
        ]
    parts.append(f"{features}</body></html>\n")
    return "".join(parts)


# --- feature pages (`lumen explore --sae DICT`): one page per feature of a sparse dictionary -------------------
#
#     top contexts     where the feature fires hardest in a corpus, every token shaded by its activation there
#     logit effects    the tokens its decoder row promotes and suppresses (lumen.features.feature_logits)
#     logit lens       its direction read as the stream is read at the depth it writes (feature_lens), in probabilities
#     density          the share of the corpus's tokens it fires on
#
# The numbers come from lumen.features.pages.feature_data; the pages are plain HTML (no script): every number sits in
# a data- attribute beside the text that shows it.

FEATURE_STYLE = """
.context { font-family: monospace; white-space: pre; margin: 3px 0; display: flex; align-items: baseline; }
.context .act { flex: none; width: 8ch; color: #666; text-align: right; padding-right: 1ch; }
.context .tok { padding: 1px 0; }
.context .trigger { outline: 1px solid #a63603; }
table.features td, table.features th { border: 1px solid #ddd; padding: 2px 6px; white-space: pre; font-size: 12px; }
table.features { border-collapse: collapse; }
table.features code { background: #f3f3f3; padding: 0 2px; white-space: pre; }
"""


def shade(a: float, top: float) -> str:
    """A token's background for activation a of a feature whose largest is top: white at 0, orange at top."""
    x = min(1.0, max(0.0, a / top)) if top > 0 else 0.0
    return "rgb({},{},{})".format(*(round(w + (o - w) * x) for w, o in zip((255, 255, 255), (253, 141, 60))))


def _bars(rows: Sequence[tuple[str, float]], kind: str, digits: int = 3) -> str:
    """A bar per (token, value), the bars scaled to the largest |value|; the label column as wide as the longest."""
    rows = [(shown(t), v) for t, v in rows]
    lim = max((abs(v) for _, v in rows), default=0.0) or 1.0
    width = max((len(t) for t, _ in rows), default=1)
    out = [f"<div class='bars' id='{kind}' style='--name-width: {width + 1}ch'>"]
    for t, v in rows:
        colour_ = "#b2182b" if v >= 0 else "#2166ac"
        out.append(f"<div class='bar-row' data-token='{escape(t, quote=True)}' data-value='{v!r}'>"
                   f"<span class='name'>{escape(t)}</span><span class='track'><span class='bar' style='left:0;"
                   f"width:{100 * abs(v) / lim:.1f}%;background:{colour_}'></span></span>"
                   f"<span class='val'>{v:.{digits}f}</span></div>")
    return "".join(out) + "</div>"


def _context(c: dict, top: float) -> str:
    toks = "".join(
        f"<span class='tok{' trigger' if j == c['at'] else ''}' data-activation='{a!r}' title='{a:.3f}' "
        f"style='background:{shade(a, top)}'>{escape(shown(t))}</span>" for j, (t, a) in enumerate(zip(c["tokens"],
                                                                                               c["activations"])))
    return (f"<div class='context' data-activation='{c['activation']!r}'><span class='act'>{c['activation']:.3f}"
            f"</span><span class='text'>{toks}</span></div>")


def feature_page(data: dict, page: dict, index: str = "") -> str:
    """One feature's page as a string: page is one of feature_data(...)["features"]; index: a link back."""
    f = page["feature"]
    title = f"feature {f} of {data['site']}"
    top = max((c["activation"] for c in page["contexts"]), default=0.0)
    parts = ["<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>",
             f"<title>{escape(title)}</title><style>{STYLE}{FEATURE_STYLE}</style></head><body>",
             f"<h1>{escape(title)}</h1>"]
    if index:
        parts.append(f"<p><a href='{escape(index, quote=True)}'>all features</a></p>")
    parts.append(f"<p>{escape(data['model'])}, a {data['d_sae']:,}-feature {escape(data['activation'])} dictionary. "
                 f"Density: fires on <b id='density' data-value='{page['density']!r}'>{page['density']:.3%}</b> "
                 f"of {data['tokens']:,} tokens of {escape(data['corpus'] or 'the corpus')}.</p>")
    parts.append("<h2>Top contexts</h2><p class='note'>Where the feature fires hardest; each token shaded by the "
                 "feature's activation on it (white 0, orange the largest here), the token it fires hardest on "
                 "outlined. Hover a token for its activation.</p>")
    parts += [_context(c, top) for c in page["contexts"]] or ["<p>It never fires on this text.</p>"]
    if "promoted" in page:
        parts.append("<div class='row-flex'><div><h2>Logit effects</h2><p class='note'>Its decoder row through the "
                     "final norm's gain and the unembedding: the logits it adds to and takes from.</p>"
                     f"<h3>promotes</h3>{_bars(page['promoted'], 'promoted')}"
                     f"<h3>suppresses</h3>{_bars(page['suppressed'], 'suppressed')}</div>")
        parts.append(f"<div><h2>Logit lens</h2><p class='note'>Its direction read by the {escape(data['lens'])} as "
                     f"the stream after {escape(data['depth'])} is read: the most likely tokens.</p>"
                     f"{_bars(page['lens'], 'lens', 4)}</div></div>")
    parts.append("</body></html>\n")
    return "".join(parts)


def feature_file(f: int) -> str:
    return f"feature-{f}.html"


def _code(token: str) -> str:
    return f"<code>{escape(shown(token))}</code>"


def features_index(data: dict, folder: str) -> str:
    """The explorer page's section that lists the feature pages (in `folder`, relative to the page)."""
    rows = []
    for page in data["features"]:
        f, ctx = page["feature"], page["contexts"]
        fires_on = _code(ctx[0]["tokens"][ctx[0]["at"]]) if ctx else ""
        promotes = " ".join(_code(t) for t, _ in page.get("promoted", [])[:5])
        rows.append(f"<tr data-feature='{f}'><td><a href='{escape(folder, quote=True)}/{feature_file(f)}'>feature {f}"
                    f"</a></td><td>{page['density']:.3%}</td><td>{fires_on}</td><td>{promotes}</td></tr>")
    return (f"<h2>Features of {escape(data['site'])}</h2><p class='note'>{len(rows)} of the dictionary's "
            f"{data['d_sae']:,} features, each on a page of its own: density over {data['tokens']:,} tokens, the "
            "token of its top context, the tokens it promotes.</p><table class='features' id='features'><tr>"
            "<th>feature</th><th>density</th><th>fires hardest on</th><th>promotes</th></tr>" + "".join(rows)
            + "</table>")
