"""`lumen attribute / patch / explore / serve` end to end on a small lumen run directory: JSON whose numbers
add up, the files each writes, and one-line errors for bad input."""

import json

import pytest
import torch

from lumen import GPT, ModelConfig
from lumen.cli import main
from lumen.formats.checkpoint import save_checkpoint
from lumen.tokenizers import CharTokenizer

TEXT = "It is the east, and Juliet is the sun.\nArise, fair sun, and kill the envious moon,\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("explain_cli")
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=tok.vocab_size, context=64, d_model=32, n_layers=3, n_heads=4, name="tiny"))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(6.0)
    save_checkpoint(root / "run", model, tokenizer=tok)
    return root / "run", model.eval(), tok


def lumen(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_attribute_json_sums_to_the_logit_and_writes_files(run_dir, capsys, tmp_path):
    path, model, tok = run_dir
    code, out, err = lumen(capsys, "attribute", path, "--prompt", "It is the", "--contrast", "e", "s", "--json")
    assert code == 0, err
    d = json.loads(out)
    with torch.no_grad():
        z = model(torch.tensor([tok.encode("It is the")]))[0][0]
    e, s = tok.encode("e")[0], tok.encode("s")[0]
    for t in range(len(d["tokens"])):
        total = sum(v[t] for v in d["components"].values())
        assert total == pytest.approx(float(z[t, e] - z[t, s]), abs=1e-4) == pytest.approx(d["logit"][t], abs=1e-5)
    code, out, _ = lumen(capsys, "attribute", path, "--prompt", "It is the", "--out", tmp_path)
    assert code == 0 and "the components sum to" in out and "largest components" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attribution.json", "attribution.png"]


def test_patch_json_and_files(run_dir, capsys, tmp_path):
    path, _, _ = run_dir
    code, out, err = lumen(capsys, "patch", path, "--clean", "It is the sun", "--corrupt", "It is the moo",
                           "--answer", ".", "--wrong", "n", "--json")
    assert code == 0, err
    d = json.loads(out)
    assert len(d["maps"]["resid_pre"]) == 3 and len(d["maps"]["resid_pre"][0]) == len("It is the sun")
    assert len(d["maps"]["head"][0]) == 4
    assert d["maps"]["resid_pre"][0][:10] == pytest.approx([0.0] * 10, abs=1e-5)   # where the prompts agree
    code, out, _ = lumen(capsys, "patch", path, "--clean", "It is the sun", "--corrupt", "It is the moo",
                         "--answer", ".", "--wrong", "n", "--kinds", "resid_pre", "--out", tmp_path)
    assert code == 0 and "resid_pre:" in out and "mlp_out" not in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["patching.json", "patching.png"]


def test_explore_writes_one_page(run_dir, capsys, tmp_path):
    path, _, _ = run_dir
    code, out, err = lumen(capsys, "explore", path, "--prompt", "It is the east", "--out", tmp_path / "p.html")
    assert code == 0, err
    assert "wrote" in out and (tmp_path / "p.html").read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize("argv,message", [
    (["attribute", "{run}", "--prompt", "It is", "--target", "is"], "not one"),
    (["attribute", "{run}", "--prompt", "It is", "--position", "9"], "outside the prompt"),
    (["patch", "{run}", "--clean", "It is", "--corrupt", "It is a"], "same number of tokens"),
    (["patch", "{run}", "--clean", "It is", "--corrupt", "It as", "--answer", "e", "--wrong", "e"], "both"),
    (["explore", "{run}", "--prompt", "It is", "--corrupt", "It", "--out", "{tmp}/p.html"], "must match"),
    (["serve", "{run}", "--port", "70000"], "--port"),
])
def test_bad_input_is_one_clear_line(run_dir, capsys, tmp_path, argv, message):
    code, out, err = lumen(capsys, *[a.format(run=run_dir[0], tmp=tmp_path) for a in argv])
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
