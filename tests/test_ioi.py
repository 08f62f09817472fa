"""The `ioi` experiment (a worked IOI analysis): its dataset, and the whole study on a tiny random model held to
the definitions (each prompt alone, the attribution's sums, patching by hand); on SmolLM2 in the slow tier."""

import math

import pytest
import torch
from tokenizers import Tokenizer as HF
from tokenizers import decoders, models, pre_tokenizers

from helpers.presets import tiny_preset
from lumen.errors import UserError
from lumen.experiments import ioi, write_doc
from lumen.inspect import Site, logit_diff, patch
from lumen.tokenizers import CharTokenizer, HFTokenizer

SMALL = ioi.Size(prompts=4, exact=2, path=1, receivers=1)


def word_tokenizer() -> HFTokenizer:
    """A byte-level word tokenizer knowing every word of the templates and every name (" Mary" is one token)."""
    split = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = {w for t in ioi.TEMPLATES for w, _ in split.pre_tokenize_str(t.format(A="X", B="Y", S="Z"))}
    words |= {w for n in ioi.NAMES for w, _ in split.pre_tokenize_str(" " + n)}
    vocab = {w: i for i, w in enumerate(sorted(words) + ["<|endoftext|>"])}
    tok = HF(models.WordLevel(vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer, tok.decoder = split, decoders.ByteLevel()
    return HFTokenizer(tok, "<|endoftext|>")


@pytest.fixture(scope="module")
def tiny():
    tok = word_tokenizer()
    model = tiny_preset("smollm2-135m", vocab_size=tok.vocab_size, n_layers=3, scale=4.0)
    return model, tok, ioi.study(model, tok, SMALL)


def test_the_dataset_pairs_both_orders_and_swaps_only_the_second_mention():
    prompts = ioi.dataset(8, seed=0)
    assert prompts == ioi.dataset(8, seed=0) and prompts != ioi.dataset(8, seed=1)   # the seed fixes it
    for abb, bab in zip(prompts[::2], prompts[1::2]):
        assert (abb.order, bab.order) == ("ABB", "BAB") and (abb.io, abb.s) == (bab.io, bab.s) and abb.io != abb.s
    for p in prompts:
        clean, corrupt = p.clean.split(), p.corrupt.split()
        diff = [k for k, (a, b) in enumerate(zip(clean, corrupt)) if a != b]
        assert len(diff) == 1 and clean[diff[0]].strip(",.") == p.s and corrupt[diff[0]].strip(",.") == p.io
        assert p.clean.count(p.s) == 2 and p.clean.count(p.io) == 1   # IO once, S twice
        first, second = sorted((p.io, p.s), key=p.clean.index)
        assert (first, second) == ((p.io, p.s) if p.order == "ABB" else (p.s, p.io))
        # ABC: every mention of IO and of S replaced by two other names, nothing else changed
        assert len({p.io, p.s, p.c, p.d}) == 4 and p.io not in p.abc and p.s not in p.abc
        assert p.abc == p.clean.replace(p.io, "\0").replace(p.s, p.d).replace("\0", p.c)
        assert p.abc.count(p.d) == 2 and p.abc.count(p.c) == 1 and p.corrupted("ABC") == p.abc
    assert [(p.io, p.s) for p in prompts] == [(p.io, p.s) for p in ioi.dataset(8, seed=0)]
    with pytest.raises(ValueError, match="unknown corruption 'XYZ'"):
        prompts[0].corrupted("XYZ")


def test_the_names_are_single_tokens_and_the_roles_point_at_them():
    tok = word_tokenizer()
    data = ioi.tokenize(tok, ioi.dataset(8, seed=0))
    for b, r in enumerate(data.roles):
        ids = data.clean.row(b)
        assert len(ids) == len(data.corrupt.row(b))
        assert ids[r["IO"]] == data.io[b] and ids[r["S1"]] == ids[r["S2"]] == data.s[b] and r["END"] == len(ids) - 1
        assert tok.decode([data.io[b]]).strip() in ioi.NAMES and r["S1"] < r["S2"] < r["END"]
    with pytest.raises(UserError, match="IOI name .* tokens"):       # a tokenizer that splits the names
        ioi.tokenize(CharTokenizer.from_text("".join(ioi.TEMPLATES) + "".join(ioi.NAMES) + " "), ioi.dataset(2, 0))


def test_logit_difference_is_each_prompt_alone(tiny):
    model, tok, n = tiny
    prompts = ioi.dataset(SMALL["prompts"], 0)
    for b, p in enumerate(prompts):
        for text, got in ((p.clean, n["logit_diff"][b]), (p.corrupt, n["logit_diff_corrupt"][b])):
            with torch.no_grad():
                z = model(torch.tensor([tok.encode(text)]))[0][0, -1].double()
            io, s = tok.encode(" " + p.io)[0], tok.encode(" " + p.s)[0]
            assert got == pytest.approx(float(z[io] - z[s]), abs=1e-5)
    assert n["mean_logit_diff"] == pytest.approx(sum(n["logit_diff"]) / len(prompts), abs=1e-9)


def test_attribution_per_head_plus_the_rest_is_the_logit_difference(tiny):
    _, _, n = tiny
    a = n["attribution"]
    rows = a["mean_rows"]
    assert sum(rows.values()) == pytest.approx(n["mean_logit_diff"], abs=1e-5)   # every write, mean over prompts
    heads = torch.tensor(a["heads"])
    attn = sum(v for c, v in rows.items() if c.endswith(".attn"))
    rest = sum(v for c, v in rows.items() if not c.endswith(".attn"))
    bias = attn - float(heads.sum())                       # attn.out's bias (SmolLM2's attention has none)
    assert abs(bias) < 1e-5 and float(heads.sum()) + rest == pytest.approx(n["mean_logit_diff"], abs=1e-5)
    assert a["sum_error"] < 1e-5 and a["head_sum_error"] < 1e-5
    # the difference of two logits splits as each logit alone does (the read-out is linear once the scale is fixed)
    io, s = torch.tensor(a["heads_io"]), torch.tensor(a["heads_s"])
    torch.testing.assert_close(io - s, heads, atol=1e-6, rtol=0, check_dtype=False)
    top = a["writers"][0]
    assert top[2] == pytest.approx(float(heads.max())) and a["against"][0][2] == pytest.approx(float(heads.min()))


def test_patching_maps_match_patching_by_hand(tiny):
    model, tok, n = tiny
    p = n["patching"]
    k = p["pairs"]
    resid = torch.tensor(p["resid_pre_roles"])
    # entering block 0, clean and corrupted streams differ only at S2: patching it there is the clean run itself
    assert resid[0].tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0], abs=1e-5)
    data = ioi.tokenize(tok, ioi.dataset(SMALL["prompts"], 0))
    clean_m, corrupt_m = n["logit_diff"][:k], n["logit_diff_corrupt"][:k]
    for layer, head in [(1, 2), (2, 0)]:   # one head's output patched at every position, by the definition
        fracs = [patch(model, data.clean.row(b), data.corrupt.row(b), [Site("head", layer, None, head)],
                       logit_diff(data.io[b], data.s[b])) for b in range(k)]
        values = [c + f * (c0 - c) for f, c0, c in zip(fracs, clean_m, corrupt_m)]
        mean = (sum(values) / k - sum(corrupt_m) / k) / (sum(clean_m) / k - sum(corrupt_m) / k)
        assert p["head"][layer][head] == pytest.approx(mean, abs=1e-4)
    assert -1 <= p["correlation"]["head_mean"] <= 1 and not math.isnan(p["correlation"]["head_cells"])


def test_all_names_replaced_is_patched_as_by_hand(tiny):
    model, tok, n = tiny
    abc = n["abc"]
    k = abc["pairs"]
    prompts = ioi.dataset(SMALL["prompts"], 0)
    data = ioi.tokenize(tok, prompts, "ABC")
    for b, p in enumerate(prompts):   # the corrupted logit difference, each prompt alone
        with torch.no_grad():
            z = model(torch.tensor([tok.encode(p.abc)]))[0][0, -1].double()
        assert abc["logit_diff_corrupt"][b] == pytest.approx(float(z[data.io[b]] - z[data.s[b]]), abs=1e-5)
        r = data.roles[b]
        row = data.corrupt.row(b)
        assert row[r["IO"]] == tok.encode(" " + p.c)[0] and row[r["S1"]] == row[r["S2"]] == tok.encode(" " + p.d)[0]
    resid = torch.tensor(abc["resid_pre_roles"])
    assert resid[0, 3] == 0.0 and resid[0, :3].abs().sum() > 0.01   # END's token is the same; the names' are not
    clean_m, corrupt_m = n["logit_diff"][:k], abc["logit_diff_corrupt"][:k]
    for b in range(k):   # entering block 0 the streams differ only at the three names: all three patched is clean
        r = data.roles[b]
        sites = [Site("resid_pre", 0, r[role]) for role in ("IO", "S1", "S2")]
        metric = logit_diff(data.io[b], data.s[b])
        assert patch(model, data.clean.row(b), data.corrupt.row(b), sites, metric) == pytest.approx(1.0, abs=1e-5)
    layer, head = 1, 2   # one head's output, by the definition, averaged as the page averages
    fracs = [patch(model, data.clean.row(b), data.corrupt.row(b), [Site("head", layer, None, head)],
                   logit_diff(data.io[b], data.s[b])) for b in range(k)]
    values = [c + f * (c0 - c) for f, c0, c in zip(fracs, clean_m, corrupt_m)]
    mean = (sum(values) / k - sum(corrupt_m) / k) / (sum(clean_m) / k - sum(corrupt_m) / k)
    assert abc["head"][layer][head] == pytest.approx(mean, abs=1e-4)
    r = ioi.result(n)
    assert f"{abc['mean_logit_diff_corrupt']:+.2f}" in r.verdict and "all names replaced" in r.verdict


def test_path_patching_has_senders_only_below_its_receivers(tiny):
    _, _, n = tiny
    path = n["path"]
    (i, h), = path["receivers"]
    m = torch.tensor(path["head"])
    assert i >= 1 and m[:i].isfinite().all() and m[i:].isnan().all()
    assert path["top"][0][2] == pytest.approx(float(m[:i].max()))


def test_the_page_states_the_numbers_and_shows_the_code(tiny, tmp_path):
    _, _, n = tiny
    r = ioi.result(n)
    assert f"{n['mean_logit_diff']:+.2f}" in r.verdict and f"{n['fraction_positive']:.0%}" in r.verdict
    r.write(tmp_path / "experiments" / "ioi")
    assert (tmp_path / "experiments" / "ioi" / "ioi.png").stat().st_size > 5000
    write_doc([r], tmp_path / "experiments.md", tmp_path / "experiments", "lumen experiment ioi")
    page = (tmp_path / "ioi.md").read_text()
    assert r.verdict in page and "](experiments/ioi/ioi.png)" in page and "```python" in page
    assert "lumen experiment ioi --out" in page and "## ioi" in (tmp_path / "experiments.md").read_text()


def test_smollm2_knows_every_name_and_the_attribution_sums(smollm2, smollm2_tokenizer):
    tok = smollm2_tokenizer
    everything = [ioi.Prompt(t, io, s, order, c, d) for t in range(len(ioi.TEMPLATES))
                  for io, s, c, d in zip(*(ioi.NAMES[k:] + ioi.NAMES[:k] for k in range(4)))
                  for order in ("ABB", "BAB")]
    data = ioi.tokenize(tok, everything)              # every name one token, every pair one length
    assert len(data.roles) == len(everything) == len(ioi.tokenize(tok, everything, "ABC").roles)
    n = ioi.study(smollm2, tok, ioi.SIZES[True])
    assert n["attribution"]["sum_error"] < 1e-4 and n["attribution"]["head_sum_error"] < 1e-4
    with torch.no_grad():
        z = smollm2(torch.tensor([data.clean.row(0)]))[0][0, -1]
    assert float(z[data.io[0]] - z[data.s[0]]) > 0          # SmolLM2 names the indirect object
    assert n["patching"]["resid_pre_roles"][0] == pytest.approx([0.0, 0.0, 1.0, 0.0], abs=1e-3)
