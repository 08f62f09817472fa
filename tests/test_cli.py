"""The `lumen` command as a user meets it: bad arguments end in one line and exit 2 through the real command;
progress bars only on a terminal; every default shown in --help; one vocabulary (model specs, "embed" /
"block i", --out) across commands; and the smaller promises of issue 13 (␣ in the lens table, nats per
character in eval, norms in count's exact block, a heads figure whose titles do not overlap)."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lumen
from helpers.runs import TEXT, tiny_run
from lumen import GPT, ModelConfig
from lumen.cli import build_parser, main
from lumen.formats.checkpoint import save_checkpoint

CODE = Path(__file__).resolve().parents[1] / "code"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny lumen run (3 blocks, context 64, characters), a corpus folder, and bad files of every kind."""
    root = tiny_run(tmp_path_factory.mktemp("cli"))
    (root / "text.txt").write_text(TEXT)
    (root / "empty.txt").write_text("")
    (root / "binary.dat").write_bytes(bytes(range(256)) * 4)
    (root / "latin1.txt").write_bytes("café au lait, crème brûlée\n".encode("latin-1") * 4)
    (root / "a-file").write_text("not a folder")
    return root


def lumen_cmd(*argv, cwd=None) -> subprocess.CompletedProcess:
    """The real command: a new Python process running `python -m lumen ARGS` (stderr not a terminal)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(CODE), os.environ.get("PYTHONPATH", "")])}
    env.pop("LUMEN_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "lumen", *map(str, argv)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


# --- bad arguments: exit 2, one line, no traceback ---------------------------------------------------------

TEXT_ARGS = ["--corpus", "{root}/corpus", "--windows", "1", "--seq-len", "16"]
BAD = {
    "zero windows": (["delete-layer", "{root}/run", *TEXT_ARGS, "--windows", "0"], "--windows must be at least 1"),
    "negative windows": (["heads", "{root}/run", *TEXT_ARGS, "--windows", "-3"], "--windows must be at least 1"),
    "zero steps": (["tuned-lens", "train", "{root}/run", "--steps", "0"], "--steps must be at least 1"),
    "negative max tokens": (["generate", "{root}/run", "--prompt", "It", "--max-new-tokens", "-1"],
                            "--max-new-tokens"),
    "zero top tokens": (["lens", "{root}/run", "--prompt", "It", "--top-tokens", "0"], "--top-tokens"),
    "context 0": (["eval", "{root}/run", "--text", "{root}/text.txt", "--context", "0"], "--context"),
    "context above the model's": (["eval", "{root}/run", "--text", "{root}/text.txt", "--context", "65"],
                                  "exceeds the model's context of 64"),
    "seq-len above the model's": (["delete-layer", "{root}/run", *TEXT_ARGS, "--seq-len", "65"],
                                  "exceeds the model's context of 64"),
    "block out of range": (["neurons", "{root}/run", "--block", "3", *TEXT_ARGS], "out of range"),
    "negative block": (["neurons", "{root}/run", "--layer", "-1", *TEXT_ARGS], "out of range"),
    "empty text": (["eval", "{root}/run", "--text", "{root}/empty.txt"], "empty"),
    "binary text": (["eval", "{root}/run", "--text", "{root}/binary.dat"], "binary.dat"),
    "non-UTF-8 text": (["eval", "{root}/run", "--text", "{root}/latin1.txt"], "not UTF-8"),
    "empty corpus": (["heads", "{root}/run", "--corpus", "{root}/empty.txt", "--seq-len", "16"], "empty"),
    "non-UTF-8 corpus": (["neurons", "{root}/run", "--block", "0", "--corpus", "{root}/latin1.txt"], "UTF-8"),
    "missing text": (["eval", "{root}/run", "--text", "{root}/nothing.txt"], "nothing.txt"),
    "missing model": (["lens", "{root}/no-run.gguf", "--prompt", "It"], "no-run.gguf"),
    "missing corpus": (["delete-layer", "{root}/run", "--corpus", "{root}/no-corpus", "--seq-len", "16"], "no-corpus"),
    "file as --out": (["lens", "{root}/run", "--prompt", "It", "--out", "{root}/a-file"], "is a file, not a folder"),
    "file as convert OUTDIR": (["convert", "{root}/run", "--to", "hf", "{root}/a-file"], "a-file"),
    "unknown option": (["count", "gpt2", "--bogus"], "unrecognized arguments: --bogus"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(BAD))
def test_bad_argument_is_one_line_and_exit_2(files, case):
    argv, message = BAD[case]
    r = lumen_cmd(*[a.format(root=files) for a in argv])
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, r.stderr
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("lumen") and "error:" in lines[0] and message in lines[0], lines[0]


# --- progress bars ------------------------------------------------------------------------------------------

class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_draws_on_a_terminal_only_and_not_when_quiet(monkeypatch):
    from lumen.progress import progress, quiet

    def drawn(stream) -> str:
        monkeypatch.setattr(sys, "stderr", stream)
        assert list(progress(range(3), desc="deleting blocks")) == [0, 1, 2]   # iterates either way
        return stream.getvalue()

    assert "deleting blocks" in drawn(Terminal())
    assert drawn(io.StringIO()) == ""                  # piped or redirected: silent
    with quiet():
        assert drawn(Terminal()) == ""                 # --quiet: silent on a terminal too


def test_long_jobs_have_a_bar_and_quiet_turns_it_off(files, monkeypatch, capsys):
    """delete-layer's, the tuned lens's, eval's, neurons' and heads' loops draw a bar on a terminal; --quiet
    turns it off."""
    monkeypatch.setattr(sys, "stderr", Terminal())
    argv = ["delete-layer", str(files / "run"), "--corpus", str(files / "corpus"), "--windows", "1", "--seq-len", "16"]
    assert main(argv) == 0 and "deleting blocks" in sys.stderr.getvalue()
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert main([*argv, "--quiet"]) == 0 and sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert main(["tuned-lens", "train", str(files / "run"), "--corpus", str(files / "corpus"), "--steps", "2",
                 "--seq-len", "16", "--eval-windows", "2", "--out", str(files / "tl")]) == 0
    err = sys.stderr.getvalue()
    assert "training the tuned lens" in err and "evaluating the logit and the tuned lens" in err
    assert "tuned lens on held-out text" not in err   # one bar for the evaluation: the two inside it are silent
    text = ["--corpus", str(files / "corpus"), "--windows", "2", "--seq-len", "16"]
    for argv, bar in ((["eval", str(files / "run"), "--text", str(files / "text.txt")], "evaluating"),
                      (["neurons", str(files / "run"), "--block", "0", *text], "reading block 0's MLP"),
                      (["heads", str(files / "run"), *text, "--half", "4"], "scoring heads")):
        monkeypatch.setattr(sys, "stderr", Terminal())
        assert main(argv) == 0 and bar in sys.stderr.getvalue()


# --- help, version, vocabulary ------------------------------------------------------------------------------

def parsers(parser: argparse.ArgumentParser, name: str = "lumen"):
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from parsers(sub, f"{name} {sub_name}")


def test_every_default_is_shown_in_help():
    """Each option with a default says it in its --help entry (0 is a default too)."""
    missing = []
    for name, p in parsers(build_parser()):
        formatter = p._get_formatter()
        for a in p._actions:
            unset = a.default is None or a.default is False or a.default is argparse.SUPPRESS   # (0 is a default)
            if a.option_strings and a.help != argparse.SUPPRESS and not unset:
                entry = " ".join(formatter._format_action(a).split())
                if "default" not in entry:
                    missing.append(f"{name} {a.option_strings[0]}: {entry}")
    assert not missing, missing


def test_version_and_a_top_level_help_for_users(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"lumen {lumen.__version__}"
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    from lumen.cli import COMMANDS

    assert all(f"    {name}" in out for name in COMMANDS) and "examples:" in out and "MODEL" in out


def test_count_takes_a_run_directory(files, capsys, tmp_path):
    """count reads a run directory (checkpoints/step-N inside) through the loader every command uses."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, context=32, d_model=48, n_layers=2, n_heads=4, name="a-run"))
    save_checkpoint(tmp_path / "runs" / "x" / "checkpoints" / "step-10", model)
    assert main(["count", str(tmp_path / "runs" / "x"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exact"]["total"] == sum(p.numel() for p in model.parameters())


@pytest.mark.slow
def test_count_smollm2_by_its_model_name(smollm2_gguf, capsys):
    assert main(["count", "smollm2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["exact"]["total"] == 134_515_008   # the chapter's number


@pytest.mark.parametrize("preset", ["gpt2", "smollm2-135m", "baby-gpt"])
def test_counts_exact_block_with_its_norms(preset, capsys):
    """"exact (with biases, norms)" is one real block's parameters, norms included (torch's own count)."""
    from lumen.accounting import report

    cfg = ModelConfig.from_name(preset)
    with torch.device("meta"):
        block = GPT(cfg.replace(n_layers=1)).blocks[0]
    norms = sum(p.numel() for n, p in block.named_parameters() if n.startswith("ln"))
    assert norms > 0
    assert report(cfg)["exact_per_block"] == sum(p.numel() for p in block.parameters())


def test_one_naming_scheme_for_layers_across_lens_heads_and_deletion(files, capsys, tmp_path):
    """"embed" for the embedding and "block i" for block i's output, in tables and JSON alike."""
    run, corpus = str(files / "run"), ["--corpus", str(files / "corpus"), "--windows", "1", "--seq-len", "16"]
    names = ["embed", "block 0", "block 1", "block 2"]
    assert main(["lens", run, "--prompt", "It is", "--json"]) == 0
    assert [layer["after"] for layer in json.loads(capsys.readouterr().out)["logit lens"]["layers"]] == names
    assert main(["lens", run, "--prompt", "It is"]) == 0
    out = capsys.readouterr().out
    assert all(n in out for n in names) and "layer" not in out
    assert main(["delete-layer", run, *corpus, "--json"]) == 0
    assert [r["block"] for r in json.loads(capsys.readouterr().out)["rows"]] == [0, 1, 2]
    assert main(["heads", run, *corpus, "--half", "4"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"block \d+ head \d+ ", out) and "layer" not in out  # names.display's scheme
    assert main(["tuned-lens", "train", run, *corpus[:2], "--steps", "1", "--seq-len", "16", "--eval-windows", "2",
                 "--out", str(tmp_path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["after"] == names


# --- issue 13, item 9 ---------------------------------------------------------------------------------------

def test_lens_table_shows_a_space_token_as_the_figures_do(files, capsys):
    from lumen.tokenizers.shown import shown

    assert main(["lens", str(files / "run"), "--prompt", "It is"]) == 0
    header = capsys.readouterr().out.splitlines()[1].split()
    assert header[1:6] == ["I", "t", shown(" "), "i", "s"] and shown(" ") == "\u2423"


@pytest.mark.slow
def test_eval_reports_nats_per_character(smollm2_gguf, smollm2, smollm2_tokenizer, capsys, tmp_path):
    """Total nats of the scored tokens over the characters they spell, beside nats per token."""
    text = "The capital of France is Paris. It lies on the Seine, and its museums are famous."
    (tmp_path / "t.txt").write_text(text)
    assert main(["eval", "smollm2", "--text", str(tmp_path / "t.txt"), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    ids = smollm2_tokenizer.encode(text)
    with torch.no_grad():
        logits, _ = smollm2(torch.tensor([ids[:-1]]))
    nats = torch.nn.functional.cross_entropy(logits[0], torch.tensor(ids[1:]), reduction="sum").item()
    first = len(smollm2_tokenizer.decode(ids[:1]))           # the first token is read, not predicted
    assert r["chars"] == len(text) - first
    assert r["loss_per_char"] == pytest.approx(nats / (len(text) - first), rel=1e-4)
    assert r["loss_per_char"] < r["loss"]                     # a token spells several characters


def test_heads_figure_title_does_not_overlap_a_panel_title(monkeypatch, tmp_path):
    from lumen.report import figures

    drawn = {}
    save = figures._save

    def keep(fig, path):
        drawn["fig"] = fig
        return save(fig, path)

    monkeypatch.setattr(figures, "_save", keep)
    scores = {k: torch.rand(6, 4) for k in ("previous_token", "first_token", "induction")}
    figures.head_scores_plot(scores, tmp_path / "heads.png", title="SmolLM2: attention heads by block")
    fig = drawn["fig"]
    renderer = fig.canvas.get_renderer()
    top = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:
        box = ax.title.get_window_extent(renderer)
        assert not top.overlaps(box), (top, box)
        assert ax.get_xlabel() == "block"


# --- item 7: quick experiments draw no conclusion --------------------------------------------------------

def test_a_quick_experiment_draws_no_conclusion(monkeypatch):
    from lumen import experiments
    from lumen.experiments import norm_placement
    from lumen.experiments.result import Result

    def fake(quick, seed):
        return Result("norm-placement", norm_placement.CLAIM, [], "Post-LN is not behind pre-LN.")

    monkeypatch.setattr(norm_placement, "run", fake)
    quick = experiments.run("norm-placement", quick=True)
    assert "Post-LN" not in quick.verdict and "Smoke run" in quick.verdict and "--quick" in quick.verdict
    assert experiments.run("norm-placement", quick=False).verdict == "Post-LN is not behind pre-LN."


def test_quick_accounting_keeps_its_verdict_as_counting_is_exact(monkeypatch):
    from lumen import experiments
    from lumen.experiments import accounting
    from lumen.experiments.result import Result

    monkeypatch.setattr(accounting, "run", lambda quick, seed: Result("accounting", "", [], "12 d^2 per block."))
    assert experiments.run("accounting", quick=True).verdict == "12 d^2 per block."


def test_convert_writes_ordinary_permissions(files, tmp_path, capsys):
    """A converted directory is readable like any new folder (not a temporary folder's 0700/0600)."""
    mask = os.umask(0)
    os.umask(mask)
    out = tmp_path / "hf"
    assert main(["convert", str(files / "run"), "--to", "hf", str(out)]) == 0
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask
    assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
        p.name: 0o666 & ~mask for p in out.iterdir()} and (out / "model.safetensors").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]   # no staging folder left behind


def test_old_option_spellings_still_parse():
    """Renamed options keep their old spelling as a hidden alias, so old commands and scripts still work."""
    p = build_parser()
    assert p.parse_args(["lens", "m", "--prompt", "x", "--top-k", "3"]).top_tokens == 3
    assert p.parse_args(["neurons", "m", "--layer", "1", "--top-k", "2"]).contexts == 2
    assert p.parse_args(["neurons", "m", "--layer", "1"]).block == 1
    assert p.parse_args(["delete-layer", "m", "--layers", "0,2"]).blocks == "0,2"
    assert p.parse_args(["tuned-lens", "eval", "m", "lens", "--report", "d"]).out == "d"
    assert "--report" not in p._subparsers._group_actions[0].choices["tuned-lens"].format_help()
    for command in ("lens", "neurons"):  # --top-k is generate's sampling option: elsewhere only an old spelling
        assert "--top-k" not in p._subparsers._group_actions[0].choices[command].format_help()


def test_an_experiment_shows_its_training_steps_on_a_terminal(monkeypatch):
    from lumen import experiments
    from lumen.experiments import fit, norms
    from lumen.experiments.result import Result

    counted = []

    def tiny_run(quick, seed):
        model = GPT(ModelConfig(vocab_size=16, context=8, d_model=16, n_layers=1, n_heads=2))
        x = torch.randint(0, 16, (8,))
        data = fit.TaskData(lambda gen: (x, x), vocab_size=16, context=8)   # the experiments' way into the loop
        fit.expect(3)   # the steps its runs will take: the bar's total
        fit.train_lm(model, data, steps=3, batch_size=2, eval_windows=2)
        counted.append(fit.BAR.n)  # (tqdm redraws at most every 0.1 s: three fast steps may never be drawn)
        return Result("norms", "", [], "")

    monkeypatch.setattr(norms, "run", tiny_run)
    monkeypatch.setattr(sys, "stderr", Terminal())
    experiments.run("norms", quick=True)
    assert "norms: " in sys.stderr.getvalue() and "/3 [" in sys.stderr.getvalue()   # steps out of those declared
    assert counted == [3]
    assert fit.BAR is None


def test_a_reader_that_stops_early_is_no_error():
    """`lumen ... | head`: the pipe is closed under lumen's output; no traceback, the shell's usual 141."""
    env = {**os.environ, "PYTHONPATH": str(Path(lumen.__file__).parents[1])}
    read, write = os.pipe()
    os.close(read)   # the reader is gone before lumen writes a line
    p = subprocess.Popen([sys.executable, "-m", "lumen", "train", "--print-config"], stdout=write,
                         stderr=subprocess.PIPE, env=env)
    os.close(write)
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and "Traceback" not in err and "Error" not in err, err
