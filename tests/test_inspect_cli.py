"""`lumen lens / tuned-lens / delete-layer / neurons / heads` end to end on a small lumen run directory
and a text corpus: tables, JSON, figures, and one-line errors for bad input."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers.runs import TEXT, tiny_run
from helpers.signals import ctrl_c_restored
from lumen import GPT, ModelConfig
from lumen.cli import main
from lumen.tokenizers import CharTokenizer


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("inspect_cli"))


def lumen(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_lens_table_json_and_files(run_dir, capsys, tmp_path):
    code, out, _ = lumen(capsys, "lens", run_dir / "run", "--prompt", "It is the east", "--out", tmp_path)
    assert code == 0
    assert "block 2" in out and "embed" in out and "first becomes top-1 after" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kl.png", "lens.html", "lens.json", "lens.png"]
    code, out, _ = lumen(capsys, "lens", run_dir / "run", "--prompt", "It is the east", "--json", "--top-k", "2")
    data = json.loads(out)["logit lens"]
    assert data["tokens"] == list("It is the east") and len(data["layers"]) == 4
    assert len(data["layers"][0]["top"][0]) == 2 and max(data["layers"][-1]["kl"]) < 1e-5


def test_tuned_lens_train_eval_and_use(run_dir, capsys, tmp_path):
    lens = tmp_path / "tiny.lens"
    code, out, err = lumen(capsys, "tuned-lens", "train", run_dir / "run", "--corpus", run_dir / "corpus",
                           "--steps", "3", "--seq-len", "32", "--eval-windows", "2", "--out", lens)
    assert code == 0, err
    assert "KL logit" in out and "tiny.lens/tuned-lens.safetensors" in err
    assert sorted(p.name for p in lens.iterdir()) == ["kl.png", "perplexity.png", "tuned-lens.safetensors",
                                                      "tuned_lens.json"]
    code, _, err = lumen(capsys, "tuned-lens", "eval", run_dir / "run", lens, "--corpus", run_dir / "corpus",
                         "--seq-len", "32", "--eval-windows", "2", "--report", tmp_path / "report")  # the old name
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "report").iterdir()) == ["kl.png", "perplexity.png", "tuned_lens.json"]
    code, out, _ = lumen(capsys, "tuned-lens", "eval", run_dir / "run", lens, "--corpus", run_dir / "corpus",
                         "--seq-len", "32", "--eval-windows", "2", "--json")
    report = json.loads(out)
    assert code == 0 and len(report["tuned_lens"]["kl"]) == 4
    assert report["tuned_lens"]["kl"][-1] == pytest.approx(report["logit_lens"]["kl"][-1])
    code, out, _ = lumen(capsys, "lens", run_dir / "run", "--prompt", "Juliet", "--tuned", lens, "--json")
    assert code == 0 and set(json.loads(out)) == {"logit lens", "tuned lens"}


def test_delete_layer_neurons_heads(run_dir, capsys, tmp_path):
    code, out, _ = lumen(capsys, "delete-layer", run_dir / "run", "--corpus", run_dir / "corpus", "--windows", "2",
                         "--seq-len", "32", "--out", tmp_path)
    assert code == 0 and "deleted" in out and len(out.strip().splitlines()) == 2 + 3
    assert (tmp_path / "deletion.png").is_file() and (tmp_path / "deletion.json").is_file()
    code, out, _ = lumen(capsys, "neurons", run_dir / "run", "--layer", "1", "--corpus", run_dir / "corpus",
                         "--windows", "4", "--seq-len", "32", "--show", "2", "--top-k", "3")
    assert code == 0 and out.count("\nunit ") == 2 and "[[" in out and "promotes:" in out
    code, out, _ = lumen(capsys, "neurons", run_dir / "run", "--layer", "2", "--unit", "7", "--corpus",
                         run_dir / "corpus", "--windows", "2", "--seq-len", "32", "--json")
    (report,) = json.loads(out)
    assert code == 0 and report["unit"] == 7 and len(report["contexts"]) == 8 and len(report["promoted"]) == 10
    code, out, _ = lumen(capsys, "heads", run_dir / "run", "--corpus", run_dir / "corpus", "--windows", "2",
                         "--seq-len", "32", "--half", "8", "--out", tmp_path)
    assert code == 0 and "induction" in out and (tmp_path / "heads.png").is_file()


@pytest.mark.parametrize("argv, message", [
    (["neurons", "{run}", "--layer", "3"], "layer 3 is out of range: this model has blocks 0..2"),
    (["neurons", "{run}", "--layer", "0", "--unit", "128"], "unit 128 is out of range"),
    (["delete-layer", "{run}", "--layers", "0,9"], "layer 9 is out of range"),
    (["lens", "{run}", "--prompt", "It is the east. " * 5], "exceeds the model's context of 64"),
    (["lens", "{run}", "--prompt", ""], "--prompt is empty"),
    (["lens", "{run}", "--prompt", "sun", "--tuned", "{missing}"], "--tuned: no tuned lens at"),
    (["tuned-lens", "train", "{run}", "--corpus", "{missing}", "--seq-len", "16"], "no such file or directory"),
])
def test_bad_input_is_one_clear_line(run_dir, capsys, tmp_path, argv, message):
    argv = [a.format(run=run_dir / "run", missing=tmp_path / "missing") for a in argv]
    if argv[0] in ("neurons", "delete-layer"):
        argv += ["--corpus", str(run_dir / "corpus"), "--windows", "1", "--seq-len", "16"]
    code, _, err = lumen(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_a_lens_for_another_model_is_refused(run_dir, capsys, tmp_path):
    from lumen.inspect import TunedLens

    torch.manual_seed(1)
    tok = CharTokenizer.from_text(TEXT)
    other = GPT(ModelConfig(vocab_size=tok.vocab_size, context=64, d_model=32, n_layers=3, n_heads=4))
    TunedLens(other).save(tmp_path / "other.lens")
    code, _, err = lumen(capsys, "lens", run_dir / "run", "--prompt", "sun", "--tuned", tmp_path / "other.lens")
    assert code == 2 and "trained for another model" in err


@pytest.mark.parametrize("argv, message", [
    (["lens", "{run}", "--prompts", "{missing}"], "--prompts: no prompt file at"),
    (["lens", "{run}", "--prompts", "{folder}"], "is a folder, not a prompt file"),
    (["lens", "{run}", "--prompt", "sun", "--tuned", "{missing}"], "--tuned: no tuned lens at"),
    (["attribute", "{run}", "--prompts", "{missing}"], "--prompts: no prompt file at"),
    (["patch", "{run}", "--prompts", "{missing}"], "--prompts: no prompt file at"),
    (["tuned-lens", "train", "{run}", "--corpus", "{missing}"], "--corpus"),
    (["tuned-lens", "train", "{run}", "--corpus", "{folder}/*.nothing"], "the glob matches no files"),
    (["tuned-lens", "eval", "{run}", "{missing}"], "LENS: no tuned lens at"),
    (["neurons", "{run}", "--block", "0", "--corpus", "{missing}"], "--corpus"),
    (["heads", "{run}", "--corpus", "{missing}"], "--corpus"),
    (["delete-layer", "{run}", "--corpus", "{missing}"], "--corpus"),
])
def test_files_given_are_checked_before_the_model_loads(run_dir, capsys, tmp_path, monkeypatch, argv, message):
    """Issue 39: a missing --prompts file was reported after SmolLM2 had loaded (52 s). Every command's
    loading goes through lumen.cli.models.load_model: here it fails the test if it is reached."""
    def no_load(*args, **kwargs):
        raise AssertionError("the model was loaded before the files given were checked")

    monkeypatch.setattr("lumen.cli.models.load_model", no_load)
    argv = [a.format(run=run_dir / "run", missing=tmp_path / "missing", folder=tmp_path) for a in argv]
    code, _, err = lumen(capsys, *argv)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    # the same command with the file there does reach the loader (so the check above is what stopped it)
    good = [a.replace(str(tmp_path / "missing"), str(run_dir / "corpus" / "a.txt")) for a in argv]
    if good != argv:
        code, _, err = lumen(capsys, *good)
        assert code == 1 and "the model was loaded before" in err   # (lumen's report of an internal error)


def test_ctrl_c_during_tuned_lens_training_saves_the_lens(run_dir, tmp_path):
    """Issue 39: a Ctrl-C during `lumen tuned-lens train` kept nothing. Now the lens as its finished steps left
    it is saved (atomically), the step said, and the exit status is 130: SIGINT sent to the real command."""
    from lumen.formats import load
    from lumen.inspect import TunedLens

    out = tmp_path / "lens"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "code")}
    env.pop("LUMEN_DEBUG", None)
    argv = ["tuned-lens", "train", run_dir / "run", "--corpus", run_dir / "corpus", "--steps", "20000",
            "--seq-len", "16", "--out", out, "-q"]
    p = subprocess.Popen([sys.executable, "-m", "lumen", *map(str, argv)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c_restored)
    try:
        said = [p.stderr.readline()]   # lines up to the one that says training begins (or the end)
        while said[-1] and "Ctrl-C saves" not in said[-1]:
            said.append(p.stderr.readline())
        assert "Ctrl-C saves" in said[-1], "".join(said)
        time.sleep(5.0)   # some steps (a few ms each on an idle machine, 0.5 s at load 19), far from all 20000
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    found = re.search(r"interrupted after step (\d+) of 20000: saved the lens trained so far to (\S+)", err)
    assert found, err
    assert 1 <= int(found[1]) < 20000 and Path(found[2]) == out / "tuned-lens.safetensors"
    assert sorted(f.name for f in out.iterdir()) == ["tuned-lens.safetensors"]   # no half-written file left
    lens = TunedLens.load(out / "tuned-lens.safetensors", load(str(run_dir / "run")).model)
    assert any(t.get_parameter("lin.weight").abs().sum() > 0 for t in lens.translators)   # trained, not the logit lens
