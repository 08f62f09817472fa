"""`lumen patch --method exact|attribution|both` and `--out` beside `--prompts`: the CLI's numbers must be the
Python API's (lumen.inspect.attribution_patching / patching_maps, called on each pair alone: an independent
route from the CLI's padded batches), the agreement Pearson's r computed by hand from those maps, and --out's
patching.json what --json prints."""

from __future__ import annotations

import json
import math

import pytest
import torch

from helpers.runs import PAIRS, peaked_run
from lumen.cli import main
from lumen.formats import load
from lumen.inspect import attribution_patching, logit_diff, patching_maps

KINDS = ["resid_pre", "attn_out", "head"]
TOL = 2e-5   # the JSON's 6 decimals, and float32 rounding between a padded batch and a pair alone


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return peaked_run(tmp_path_factory.mktemp("patch_methods"))


@pytest.fixture(scope="module")
def loaded(run):
    got = load(run)
    return got.model.eval(), got.tokenizer


@pytest.fixture
def pairs_file(tmp_path):
    f = tmp_path / "pairs.jsonl"
    f.write_text("".join(json.dumps({"clean": c, "corrupt": x, "answer": a, "wrong": w}) + "\n"
                         for c, x, a, w in PAIRS))
    return f


def lumen(capsys, *argv) -> str:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def api(model, tok, method: str, clean: str, corrupt: str, answer: str, wrong: str):
    """One pair through the Python API, unpadded."""
    run = attribution_patching if method == "attribution" else patching_maps
    metric = logit_diff(tok.single_token(answer), tok.single_token(wrong))
    return run(model, tok.encode(clean), tok.encode(corrupt), metric, kinds=KINDS)


def pearson(a: list, b: list) -> float:
    """Pearson's r by its formula, in plain Python."""
    x, y = (torch.tensor(v, dtype=torch.float64).flatten().tolist() for v in (a, b))
    mx, my = sum(x) / len(x), sum(y) / len(y)
    cov = sum((p - mx) * (q - my) for p, q in zip(x, y))
    return cov / math.sqrt(sum((p - mx) ** 2 for p in x) * sum((q - my) ** 2 for q in y))


def assert_maps(got: dict, want, tol: float = TOL) -> None:
    for kind in KINDS:
        torch.testing.assert_close(torch.tensor(got[kind], dtype=torch.float64), want.maps[kind].double(),
                                   atol=tol, rtol=tol)


def test_attribution_of_one_pair_is_the_python_api(run, loaded, capsys):
    model, tok = loaded
    c, x, a, w = PAIRS[0]
    data = json.loads(lumen(capsys, "patch", run, "--clean", c, "--corrupt", x, "--answer", a, "--wrong", w,
                            "--kinds", *KINDS, "--method", "attribution", "--json"))
    want = api(model, tok, "attribution", c, x, a, w)
    assert data["method"] == "attribution" and data["metric"] == f"logit[{a!r}] - logit[{w!r}]"
    assert data["clean_metric"] == pytest.approx(want.clean_metric, abs=TOL)
    assert_maps(data["maps"], want)
    assert max(abs(v) for row in data["maps"]["head"] for v in row) > 0.05   # not a map of zeros
    text = lumen(capsys, "patch", run, "--clean", c, "--corrupt", x, "--answer", a, "--wrong", w,
                 "--kinds", *KINDS, "--method", "attribution")
    assert "head (attribution estimate):" in text and f"clean {want.clean_metric:.4f}" in text


def test_both_of_one_pair_reports_each_and_their_correlation(run, loaded, capsys):
    model, tok = loaded
    c, x, a, w = PAIRS[0]
    argv = ["patch", run, "--clean", c, "--corrupt", x, "--answer", a, "--wrong", w, "--kinds", *KINDS]
    data = json.loads(lumen(capsys, *argv, "--method", "both", "--json"))
    exact = json.loads(lumen(capsys, *argv, "--json"))          # the default method
    assert data["exact"] == exact and data["attribution"]["method"] == "attribution"
    assert_maps(data["attribution"]["maps"], api(model, tok, "attribution", c, x, a, w))
    assert_maps(data["exact"]["maps"], api(model, tok, "exact", c, x, a, w))
    for kind in KINDS:
        r = pearson(data["exact"]["maps"][kind], data["attribution"]["maps"][kind])
        assert data["agreement"][kind]["map"] == pytest.approx(r, abs=1e-4)
    text = lumen(capsys, *argv, "--method", "both")
    for kind in KINDS:
        assert f"\n{kind} (exact):" in text and f"\n{kind} (attribution estimate):" in text
        r = data["agreement"][kind]["map"]
        assert f"{kind}: the estimate against exact patching, Pearson's r = {r:.3f}" in text


def test_both_on_prompts_is_each_pair_alone_and_out_writes_what_json_prints(run, loaded, capsys, pairs_file, tmp_path):
    model, tok = loaded
    argv = ["patch", run, "--prompts", pairs_file, "--kinds", *KINDS, "--batch-size", 2, "--method", "both"]
    data = json.loads(lumen(capsys, *argv, "--json"))
    out = tmp_path / "out"
    text = lumen(capsys, *argv, "--out", out)
    assert json.loads((out / "patching.json").read_text()) == data
    for png in ("patching.png", "patching-attribution.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (out / png).stat().st_size > 5000
    assert "wrote " + str(out) + "/patching.json, patching.png, patching-attribution.png" in text
    singles = {m: [api(model, tok, m, *p) for p in PAIRS] for m in ("exact", "attribution")}
    for m, alone in singles.items():
        assert data[m]["method"] == m and [p["line"] for p in data[m]["pairs"]] == [1, 2, 3]
        for pair, want in zip(data[m]["pairs"], alone):
            assert pair["clean_metric"] == pytest.approx(want.clean_metric, abs=TOL)
            assert_maps(pair["maps"], want, 1e-4)
    for kind in KINDS:
        cells = [sum((torch.tensor(p["maps"][kind]).flatten().tolist() for p in data[m]["pairs"]), [])
                 for m in ("exact", "attribution")]
        assert data["agreement"][kind]["cells"] == pytest.approx(pearson(*cells), abs=1e-4)
        r = pearson(data["exact"]["mean"][kind], data["attribution"]["mean"][kind])
        assert data["agreement"][kind]["mean"] == pytest.approx(r, abs=1e-4)
        assert f"{kind}: the estimate against exact patching, Pearson's r = {r:.3f} (the mean map)" in text


def test_out_with_prompts_writes_the_pairs_and_the_mean(run, capsys, pairs_file, tmp_path):
    argv = ["patch", run, "--prompts", pairs_file, "--kinds", *KINDS]
    data = json.loads(lumen(capsys, *argv, "--json"))
    lumen(capsys, *argv, "--out", tmp_path / "out")
    written = json.loads((tmp_path / "out" / "patching.json").read_text())
    assert written == data and len(written["pairs"]) == len(PAIRS) and set(written["mean"]) == set(KINDS)
    assert (tmp_path / "out" / "patching.png").stat().st_size > 5000
    assert not (tmp_path / "out" / "patching-attribution.png").exists()


def test_a_bad_method_is_one_line(run, capsys):
    with pytest.raises(SystemExit) as e:
        main(["patch", str(run), "--clean", "It is", "--corrupt", "It it", "--method", "gradient"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--method: invalid choice: 'gradient'" in err and len(err.strip().splitlines()) == 1


def test_both_on_smollm2_the_estimate_ranks_heads_as_exact_patching(smollm2, smollm2_tokenizer, capsys):
    """The IOI pair on SmolLM2: the CLI's estimate is the API's, and it tracks exact patching on the head map."""
    tok = smollm2_tokenizer
    clean, corrupt = ("When Mary and John went to the store, John gave a drink to",
                      "When Mary and John went to the store, Mary gave a drink to")
    data = json.loads(lumen(capsys, "patch", "smollm2", "--clean", clean, "--corrupt", corrupt, "--answer", " Mary",
                            "--wrong", " John", "--kinds", "head", "--method", "both", "--json"))
    metric = logit_diff(tok.single_token(" Mary"), tok.single_token(" John"))
    want = attribution_patching(smollm2.eval(), tok.encode(clean), tok.encode(corrupt), metric, kinds=["head"])
    torch.testing.assert_close(torch.tensor(data["attribution"]["maps"]["head"], dtype=torch.float64),
                               want.maps["head"].double(), atol=1e-4, rtol=1e-4)
    r = data["agreement"]["head"]["map"]
    assert r == pytest.approx(pearson(data["exact"]["maps"]["head"], data["attribution"]["maps"]["head"]), abs=1e-4)
    assert r > 0.5   # (docs/ioi.md: r = 0.90 on the mean head map of 6 IOI prompts)
