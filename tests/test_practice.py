"""`lumen practice`: the exercises in the chapter's order, starting files that import and fail as "not written
yet", a learner's file that cannot be used as one line with exit 2, checks that pass or fail with their hint,
lumen's own solution found by file and line, and nothing beyond torch, numpy and lumen in the package (so a
plain `pip install .` runs it offline)."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pytest
import torch

from lumen import practice
from lumen.cli import main
from lumen.practice.exercise import PROCESS_HINTS, STEPS, Check, Exercise, Hint, Spec
from lumen.practice.mlp import WORKED_ROUNDED, WORKED_W1, WORKED_W2, WORKED_X, worked_result

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = ROOT / "tests" / "practice_solutions"

# the chapter's headings, in its order (copied from its text): every section with something to practise
CHAPTER_SECTIONS = [
    "The problem: mixing is not thinking",
    "The feed-forward block (MLP)",
    "GELU, and why not ReLU",
    "Residual connections: the stream",
    "LayerNorm: keeping the stream well-behaved",
    "The full transformer block",
    "Stacking N blocks: what the layers do",
    "Parameter accounting per block",
    "Dropout",
    "Initialisation and the 1/√(2N) residual trick",
    "Compute: FLOPs per token ≈ 2 × parameters",
]


def test_every_section_has_an_exercise_in_the_chapters_order():
    sections = [e.section for e in practice.EXERCISES.values()]
    assert set(sections) == set(CHAPTER_SECTIONS)
    order = [CHAPTER_SECTIONS.index(s) for s in sections]
    assert order == sorted(order)


def test_list_names_every_exercise_under_its_section(capsys):
    assert main(["practice", "list"]) == 0
    out = capsys.readouterr().out
    for section in CHAPTER_SECTIONS:
        assert f"\n{section}\n" in out
    positions = [re.search(rf"^ +\d+\. {name} ", out, re.M).start() for name in practice.EXERCISES]
    assert positions == sorted(positions)
    assert out.count("(loads SmolLM2)") == 2


@pytest.mark.parametrize("name", list(practice.EXERCISES))
def test_a_starting_file_imports_and_is_not_written_yet(name, tmp_path, capsys):
    assert main(["practice", "start", name, str(tmp_path)]) == 0
    ex = practice.EXERCISES[name]
    path = tmp_path / ex.file_name
    source = path.read_text()
    assert f"lumen practice check {name}" in source and ex.task.splitlines()[0] in source
    capsys.readouterr()
    assert main(["practice", "check", name, str(path)]) == 1   # a failed check, not a file error
    out = capsys.readouterr().out
    assert "not written yet" in out or "not answered yet" in out
    assert "Traceback" not in out


def test_start_refuses_to_overwrite(tmp_path, capsys):
    assert main(["practice", "start", "layernorm", str(tmp_path)]) == 0
    (tmp_path / "layernorm.py").write_text("# my work\n")
    assert main(["practice", "start", "layernorm", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "already exists" in err
    assert (tmp_path / "layernorm.py").read_text() == "# my work\n"


def test_check_reads_name_py_by_default(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "layernorm.py").write_text((SOLUTIONS / "reference" / "layernorm.py").read_text())
    assert main(["practice", "check", "layernorm"]) == 0
    assert "all 5 checks passed" in capsys.readouterr().out


def _learners(tmp_path: Path, source: Path, name: str = "layernorm.py") -> Path:
    """The learner's copy of a solution, in a practice folder of its own (where check keeps its verdict)."""
    path = tmp_path / name
    path.write_text(source.read_text())
    return path


def test_a_failed_check_prints_what_it_saw_and_where_the_hint_is_not_the_fix(tmp_path, capsys):
    path = _learners(tmp_path, SOLUTIONS / "wrong" / "layernorm__unbiased.py")
    assert main(["practice", "check", "layernorm", str(path)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "sqrt((d-1)/d)" in out and "skipped" in out
    assert "unbiased=False" not in out   # the fix waits for the hint's last step
    assert f"lumen practice hint layernorm {path}" in out


BAD_FILES = {
    "syntax": ("class LayerNorm(nn.Module)\n    pass\n", r"layernorm\.py:1: syntax error"),
    "import": ("import torch\nraise RuntimeError('half written')\n",
               r"layernorm\.py:2: importing it raised RuntimeError: half written"),
    "missing": ("import torch\n", r"defines no LayerNorm; the exercise asks for class LayerNorm\(nn\.Module\)"),
    "signature": ("import torch.nn as nn\nclass LayerNorm(nn.Module):\n    def __init__(self):\n"
                  "        super().__init__()\n    def forward(self, x):\n        return x\n",
                  r"LayerNorm\(\) cannot be called as the exercise calls it \(too many positional arguments\)"),
    "forward": ("import torch.nn as nn\nclass LayerNorm(nn.Module):\n    def __init__(self, d, eps=1e-5):\n"
                "        super().__init__()\n    def forward(self):\n        return 0\n",
                r"LayerNorm\.forward\(self\) cannot be called"),
    "not a module": ("class LayerNorm:\n    def __init__(self, d, eps=1e-5):\n        pass\n",
                     r"LayerNorm is not a class \(an nn\.Module\)"),
    "exit": ("import sys\nsys.exit(3)\n", r"importing it raised SystemExit"),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_file_that_cannot_be_checked_is_one_line_and_exit_2(case, tmp_path, capsys):
    source, message = BAD_FILES[case]
    path = tmp_path / "layernorm.py"
    path.write_text(source)
    assert main(["practice", "check", "layernorm", str(path)]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lumen practice: error: "), captured.err
    assert re.search(message, lines[0]), lines[0]
    assert "Traceback" not in captured.err + captured.out
    assert not [m for m in sys.modules if m.startswith("lumen_practice_")]   # nothing left imported


def test_a_missing_file_and_an_unknown_exercise_are_one_line(tmp_path, capsys):
    assert main(["practice", "check", "layernorm", str(tmp_path / "nope.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["practice", "hint", "layernrom"]) == 2
    assert "did you mean layernorm" in capsys.readouterr().err


def test_an_exception_in_the_learners_code_is_a_failure_with_its_line(tmp_path):
    path = tmp_path / "gelu.py"
    path.write_text("def gelu(x):\n    return x.gleu()\n")
    report = practice.check_file("gelu", path)
    first = report.failed[0]
    assert "AttributeError" in first.seen and "gelu.py line 2" in first.seen
    assert [o.status for o in report.outcomes] == ["failed", "skipped", "skipped"]


def test_a_bug_in_a_check_is_lumens_and_is_not_dressed_as_the_learners(tmp_path):
    def broken(m, ctx):
        return 1 / 0

    ex = Exercise("broken", "Dropout", "", "", "", (Spec("x", "value", "x = 1"),), (Check("divides", broken),),
                  {"task": "."}, ())
    path = tmp_path / "broken.py"
    path.write_text("x = 1\n")
    with pytest.raises(ZeroDivisionError):
        practice.run(ex, practice.load(path, ex))


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_hint_before_any_check_gives_the_nudge_and_no_mistakes_fix(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["practice", "hint", "layernorm"]) == 0
    out = _flat(capsys.readouterr().out)
    ex = practice.EXERCISES["layernorm"]
    assert _flat(str(ex.hints["task"])) in out and "No check of layernorm.py yet" in out
    assert not any(_flat(ex.hint(k)) in out for k in ex.hints if k != "task")


def test_hint_answers_the_mistake_the_last_check_saw_one_step_at_a_time(tmp_path, capsys, monkeypatch):
    """check keeps its verdict in the learner's folder (JSON); hint gives what to look at, then the formula
    (--more), then the fix (--more again), for that mistake alone; another mistake starts again at step 1."""
    monkeypatch.chdir(tmp_path)
    ex = practice.EXERCISES["layernorm"]
    _learners(tmp_path, SOLUTIONS / "wrong" / "layernorm__unbiased.py")
    assert main(["practice", "check", "layernorm"]) == 1
    capsys.readouterr()
    look, formula, fix = (_flat(t) for t in (ex.hints["unbiased"].look, ex.hints["unbiased"].formula,
                                             ex.hint("unbiased")))
    others = [_flat(ex.hint(k)) for k in ex.hints if k not in ("task", "unbiased")]
    shown = []
    for flags in ([], ["--more"], ["--more"], ["--more"], []):
        assert main(["practice", "hint", "layernorm", *flags]) == 0
        out = _flat(capsys.readouterr().out)
        shown.append(tuple(t in out for t in (look, formula, fix)))
        assert not any(o in out for o in others)   # only the mistake the check saw
    assert shown == [(True, False, False), (True, True, False), (True, True, True), (True, True, True),
                     (True, True, True)]
    assert main(["practice", "hint", "layernorm", "--step", "2"]) == 0
    out = _flat(capsys.readouterr().out)
    assert formula in out and look not in out and fix not in out
    kept = json.loads((tmp_path / ".lumen-practice.json").read_text())["layernorm"]
    assert kept["hint"] == "unbiased" and kept["shown"] == 3 and kept["passed"] is False

    _learners(tmp_path, SOLUTIONS / "wrong" / "layernorm__eps.py")   # another mistake: step 1 again
    assert main(["practice", "check", "layernorm"]) == 1
    capsys.readouterr()
    assert main(["practice", "hint", "layernorm"]) == 0
    out = _flat(capsys.readouterr().out)
    assert _flat(ex.hints["eps"].look) in out and _flat(ex.hints["eps"].formula) not in out
    assert main(["practice", "hint", "layernorm", "--step", "4"]) == 2
    assert "steps 1 to 3" in capsys.readouterr().err

    _learners(tmp_path, SOLUTIONS / "reference" / "layernorm.py")
    assert main(["practice", "check", "layernorm"]) == 0
    capsys.readouterr()
    assert main(["practice", "hint", "layernorm"]) == 0
    assert "passed" in capsys.readouterr().out


def test_a_verdict_file_that_is_not_lumens_counts_as_no_check(tmp_path, capsys, monkeypatch):
    """The verdict is JSON read as data: garbage, a list, or wrong types there are no verdict (never an error),
    and the next check writes it afresh."""
    monkeypatch.chdir(tmp_path)
    _learners(tmp_path, SOLUTIONS / "wrong" / "layernorm__gain.py")
    kept = tmp_path / ".lumen-practice.json"
    for junk in ("not json {", "[1, 2]", '{"layernorm": {"file": 3, "passed": "no"}}', '{"layernorm": 7}'):
        kept.write_text(junk)
        assert main(["practice", "hint", "layernorm"]) == 0
        assert "No check of layernorm.py yet" in capsys.readouterr().out
    assert main(["practice", "check", "layernorm"]) == 1
    capsys.readouterr()
    assert json.loads(kept.read_text())["layernorm"]["hint"] == "gain"


def test_every_mistake_has_a_hint_in_steps_ending_with_its_fix():
    for ex in practice.EXERCISES.values():
        for key in ex.hints:
            steps = ex.steps("a check", "what it saw", key)
            assert [t for t, _ in steps[:2]] == ["what to look at", "the formula"], (ex.name, key)
            if key != "task":
                assert steps[-1] == ("the fix", ex.hint(key)), (ex.name, key)
                assert ex.hint(key) not in steps[0][1] + steps[1][1], (ex.name, key)


# code in a fix: a backticked span, a call (F.gelu(u), torch.rand_like(x)) or a dotted name (model.ln_f)
CODE = re.compile(r"`[^`]+`|[A-Za-z_][\w.]*\([^()]*\)|\b[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")


def _code(fix: str) -> set[str]:
    return {c for c in CODE.findall(fix) if len(c) > 3}   # "e.g" is prose, not code


def test_code_in_a_fix_is_found_by_the_pattern():
    """The pattern the next test relies on finds the fixes' code (and not prose): checked on fixes written
    here, independently of the exercises."""
    assert _code("Use F.gelu(u) without approximate='tanh' (e.g. as `lumen.block.MLP` does)") == {
        "F.gelu(u)", "`lumen.block.MLP`"}
    assert _code("Apply lm_head(ln_f(h)) to model.blocks[k]") == {"ln_f(h)", "model.blocks"}
    assert _code("Scale by 1/(1-p): 2N writes, 8 d^2 of 12 d^2.") == set()


def test_every_known_mistake_has_its_own_three_steps_and_step_one_shows_no_code_of_the_fix():
    """No mistake falls back to the generic steps (what the check saw, the task's nudge): each has a Hint
    written for it, and what to look at names neither the fix nor any of its code."""
    hints = [(ex.name, key, h) for ex in practice.EXERCISES.values() for key, h in ex.hints.items()
             if key != "task"] + [("any", key, h) for key, h in PROCESS_HINTS.items()]
    assert len(hints) > 80
    for name, key, h in hints:
        assert isinstance(h, Hint), (name, key)
        assert h.look and h.formula and h.fix and len({h.look, h.formula, h.fix}) == 3, (name, key)
        assert _flat(h.fix) not in _flat(h.look + " " + h.formula), (name, key)
        shown = [c for c in _code(h.fix) if c in h.look]
        assert not shown, (name, key, shown)
    for ex in practice.EXERCISES.values():
        for key in PROCESS_HINTS:   # the process's mistakes: three steps in every exercise, ending with the fix
            h = PROCESS_HINTS[key]
            assert ex.steps("a check", "what it saw", key) == list(zip(STEPS, (h.look, h.formula, h.fix)))


def test_an_exception_in_a_check_is_shown_with_its_line_and_no_unrelated_hint(tmp_path, capsys, monkeypatch):
    """The shape check used to answer any exception with the keepdim hint: now only a shape error it recognises."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "layernorm.py"
    path.write_text("import torch\nimport torch.nn as nn\n\n\nclass LayerNorm(nn.Module):\n"
                    "    def __init__(self, d, eps=1e-5):\n        super().__init__()\n"
                    "        self.g, self.b = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))\n"
                    "        self.eps = eps\n\n    def forward(self, x):\n"
                    "        return (x - x.mean(-1, keepdim=True)) * self.bias\n")
    assert main(["practice", "check", "layernorm"]) == 1
    out = _flat(capsys.readouterr().out)
    assert "FAILED the output has the input's shape" in out
    assert "AttributeError" in out and "layernorm.py line 12" in out
    assert main(["practice", "hint", "layernorm", "--step", "1"]) == 0
    out = _flat(capsys.readouterr().out)
    assert "layernorm.py line 12" in out and "keepdim" not in out
    assert main(["practice", "hint", "layernorm", "--step", "3"]) == 2   # no fix to give for an exception
    capsys.readouterr()

    keepdim = _learners(tmp_path, SOLUTIONS / "wrong" / "layernorm__keepdim.py")   # the one it recognises
    assert main(["practice", "check", "layernorm", str(keepdim)]) == 1
    capsys.readouterr()
    assert main(["practice", "hint", "layernorm", "--step", "3"]) == 0
    assert _flat(practice.EXERCISES["layernorm"].hint("keepdim")) in _flat(capsys.readouterr().out)


ONE_BRANCH = {   # (exercise, the branch left without its residual): the forward's two lines
    ("block", "attn"): ("x = self.drop(self.attn(self.ln1(x), mask))", "x = x + self.mlp(self.ln2(x))"),
    ("block", "mlp"): ("x = x + self.drop(self.attn(self.ln1(x), mask))", "x = self.mlp(self.ln2(x))"),
    ("post-ln", "attn"): ("x = self.ln1(self.drop(self.attn(x, mask)))", "x = self.ln2(x + self.mlp(x))"),
    ("post-ln", "mlp"): ("x = self.ln1(x + self.drop(self.attn(x, mask)))", "x = self.ln2(self.mlp(x))"),
}


@pytest.mark.parametrize("case", list(ONE_BRANCH), ids=lambda c: f"{c[0]}-{c[1]}")
def test_a_residual_missing_on_one_branch_is_named(case, tmp_path, capsys):
    """Checked against lumen's block with that one residual dropped: the check names the branch."""
    name, branch = case
    ex = practice.exercise(name)
    source = (SOLUTIONS / "wrong" / f"{ex.file_name[:-3]}__residual.py").read_text()
    body = source[:source.index("    def forward")]
    path = tmp_path / ex.file_name
    path.write_text(body + "    def forward(self, x, mask=None):\n" +
                    "".join(f"        {line}\n" for line in ONE_BRANCH[case]) + "        return x\n")
    assert main(["practice", "check", name, str(path)]) == 1
    out = _flat(capsys.readouterr().out)
    named = {"attn": "attention's branch is not added to x", "mlp": "the MLP's branch is not added to the stream"}
    assert named[branch] in out and "differs from lumen's" not in out, out
    assert main(["practice", "hint", name, str(path), "--step", "3"]) == 0
    assert _flat(ex.hint("residual")) in _flat(capsys.readouterr().out)


def test_an_import_error_keeps_its_line_with_a_relative_path(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "layernorm.py").write_text("import torch\n\n\ndef f():\n    raise RuntimeError('half')\n"
                                                    "\n\nf()\n")
    for given in ("mine/layernorm.py", "./mine/layernorm.py"):
        assert main(["practice", "check", "layernorm", given]) == 2
        err = capsys.readouterr().err
        assert f"{Path(given)}:5: importing it raised RuntimeError: half" in err, err


def _definition_line(path: Path, name: str) -> int:
    """Where `name` (Class, Class.method, function or NAME) is defined, read from the file's text."""
    lines = path.read_text().splitlines()
    *outer, last = name.split(".")
    start = 0
    for o in outer:
        start = next(i for i, line in enumerate(lines) if re.match(rf"\s*class {o}\b", line))
    for i in range(start, len(lines)):
        if re.match(rf"\s*(class|def) {re.escape(last)}\b|{re.escape(last)}\s*[:=]", lines[i]):
            if i > 0 and lines[i - 1].strip() == "@overload":
                continue   # a typing stub: the definition is the one without @overload
            # a decorator above a def belongs to it (inspect starts there)
            while i > 0 and lines[i - 1].lstrip().startswith("@"):
                i -= 1
            return i + 1
    raise AssertionError(f"{name} not in {path}")


@pytest.mark.parametrize("name", list(practice.EXERCISES))
def test_solution_points_at_lumens_own_code(name, capsys):
    import importlib

    assert main(["practice", "solution", name]) == 0
    out = capsys.readouterr().out
    for loc in practice.solutions(name):
        module, _, attr = loc.name.rpartition(".")
        while True:   # the module part of the dotted name
            try:
                importlib.import_module(module)
                break
            except ImportError:
                module, _, head = module.rpartition(".")
                attr = f"{head}.{attr}"
        assert loc.file == Path(importlib.import_module(module).__file__)
        assert loc.first == _definition_line(loc.file, attr)
        assert loc.last >= loc.first and f"{loc.file}:{loc.first}-{loc.last}" in out
        assert loc.source().splitlines()[0].strip() in out


def test_the_worked_example_reconstruction():
    """The chapter states x = [1, -1], x W1 = [1, -1, -2, 0], h = [0.84, -0.16, -0.05, 0] and x + h W2 =
    [1.79, -1.21]. The reconstructed W1 gives those pre-activations; among W2 with entries in -2..2 (row 4
    is multiplied by GELU(0) = 0, so it is free) exactly one gives the chapter's figure from the rounded h, and
    the same W2 gives [1.796, -1.204] from the exact h: the chapter's 1.79 and -1.21 come from rounding first."""
    import itertools

    x, W1 = torch.tensor(WORKED_X, dtype=torch.float64), torch.tensor(WORKED_W1, dtype=torch.float64)
    assert (x @ W1).tolist() == [1.0, -1.0, -2.0, 0.0]
    h_rounded = torch.tensor([0.84, -0.16, -0.05, 0.0], dtype=torch.float64)
    assert torch.nn.functional.gelu(x @ W1).tolist() == pytest.approx(h_rounded.tolist(), abs=0.005)
    fits = []
    for entries in itertools.product((-2.0, -1.0, 0.0, 1.0, 2.0), repeat=6):
        W2 = torch.tensor(entries + (0.0, 0.0), dtype=torch.float64).view(4, 2)
        if torch.allclose(x + h_rounded @ W2, torch.tensor(WORKED_ROUNDED, dtype=torch.float64), atol=1e-9):
            fits.append(W2[:3].tolist())
    assert fits == [[list(r) for r in WORKED_W2[:3]]]
    assert [round(v, 3) for v in worked_result()] == [1.796, -1.204]
    assert [round(v, 2) for v in worked_result()] == [1.8, -1.2]   # not the chapter's figure at any rounding
    # the starting file holds the same matrices
    ns: dict = {}
    exec(compile(practice.EXERCISES["worked-mlp"].template.replace("[..., ...]", "None"), "t", "exec"), ns)
    assert ns["W1"].tolist() == [list(r) for r in WORKED_W1] and ns["W2"].tolist() == [list(r) for r in WORKED_W2]


def test_the_package_needs_only_torch_numpy_and_lumen():
    """So `lumen practice` runs from a plain `pip install .` (no test framework, no transformers)."""
    allowed = {"torch", "numpy", "lumen"} | set(sys.stdlib_module_names)
    folder = ROOT / "code" / "lumen" / "practice"
    for path in [*folder.glob("*.py"), ROOT / "code" / "lumen" / "cli" / "practice.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            for n in names:
                assert n.split(".")[0] in allowed, f"{path.name} imports {n}"


@pytest.mark.slow
def test_practice_runs_without_the_dev_extras(tmp_path):
    """A subprocess in which importing pytest, hypothesis or transformers fails, as in a plain install, offline:
    start, check (failing, then passing), hint and solution still work."""
    import os
    import subprocess

    block = tmp_path / "sitecustomize.py"
    block.write_text("import sys\nfor name in ('pytest', 'hypothesis', 'transformers', 'accelerate', 'selenium'):\n"
                     "    sys.modules[name] = None\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "LUMEN_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}

    def lumen(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "lumen", "practice", *args], capture_output=True, text=True,
                              env=env, cwd=tmp_path, timeout=300)

    assert lumen("start", "rmsnorm").returncode == 0
    assert lumen("check", "rmsnorm").returncode == 1
    (tmp_path / "rmsnorm.py").write_text((SOLUTIONS / "other" / "rmsnorm__rsqrt.py").read_text())
    done = lumen("check", "rmsnorm")
    assert done.returncode == 0 and "all 6 checks passed" in done.stdout, done.stdout + done.stderr
    assert lumen("hint", "rmsnorm").returncode == 0 and lumen("solution", "rmsnorm").returncode == 0
    probe = subprocess.run([sys.executable, "-c", "import pytest"], capture_output=True, env=env, cwd=tmp_path)
    assert probe.returncode != 0   # the blocking works


@pytest.mark.slow
def test_smoke_the_lens_on_smollm2_through_the_command(capsys, smollm2_loaded, monkeypatch, tmp_path):
    """The feature's one real-model smoke test: `lumen practice check logit-lens` on a hand-written lens, with
    SmolLM2 read from lumen's cache (the session's copy, loaded once)."""
    monkeypatch.setattr(practice, "_smollm2", lambda: smollm2_loaded)
    path = _learners(tmp_path, SOLUTIONS / "other" / "logit_lens__loop.py", "logit_lens.py")
    assert main(["practice", "check", "logit-lens", str(path)]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2, three prompts" in out and "all 2 checks passed" in out
