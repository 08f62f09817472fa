"""Every exercise of `lumen practice`, held to the learner files in tests/practice_solutions/:

- reference/NAME.py, lumen's own code (or a thin wrapper of it), passes every check;
- other/NAME__WHAT.py, a correct solution written differently (another formula, another layout), passes;
- wrong/NAME__HINT.py makes exactly one mistake and fails with exactly that hint, and every hint of every
  exercise has such a file.

The checks that read SmolLM2 are skipped here (small random models stand in); the slow tests run them on the
real model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lumen import practice
from lumen.practice.exercise import STEPS, Hint

SOLUTIONS = Path(__file__).resolve().parent / "practice_solutions"


def _name(stem: str) -> str:
    return stem.split("__")[0].replace("_", "-")


def _files(kind: str) -> list[Path]:
    return sorted((SOLUTIONS / kind).glob("*.py"))


def _ids(paths: list[Path]) -> list[str]:
    return [p.stem for p in paths]


def _run(path: Path, smollm2=None) -> practice.Report:
    """The checks as `lumen practice check` runs them: the file's code in a process of its own."""
    ex = practice.exercise(_name(path.stem))
    with practice.Sandbox(path, ex, smollm2=smollm2) as learner:
        return practice.run(ex, learner, 0, smollm2)


def test_every_exercise_has_a_reference_and_every_hint_a_wrong_solution():
    assert sorted(_name(p.stem) for p in _files("reference")) == sorted(practice.EXERCISES)
    wrong: dict[str, set[str]] = {}
    for p in _files("wrong"):
        wrong.setdefault(_name(p.stem), set()).add(p.stem.split("__")[1])
    for name, ex in practice.EXERCISES.items():
        assert list(ex.hints)[0] == "task", name
        assert wrong.get(name, set()) == set(ex.hints) - {"task"}, name
    # a differently written correct solution for at least LayerNorm, the block and the lens
    others = {_name(p.stem) for p in _files("other")}
    assert {"layernorm", "block", "logit-lens"} <= others


@pytest.mark.parametrize("path", _files("reference"), ids=_ids(_files("reference")))
def test_lumens_own_code_passes(path):
    report = _run(path)
    assert all(o.status == "passed" or "SmolLM2" in o.seen for o in report.outcomes), report.outcomes
    assert not report.failed


@pytest.mark.parametrize("path", _files("other"), ids=_ids(_files("other")))
def test_a_correct_solution_written_differently_passes(path):
    report = _run(path)
    assert not report.failed, [(o.check, o.seen) for o in report.failed]


def _wrong_fast() -> list[Path]:
    return [p for p in _files("wrong") if p.stem != "kv_memory__find"]


@pytest.mark.parametrize("path", _wrong_fast(), ids=_ids(_wrong_fast()))
def test_a_mistake_fails_with_its_hint(path):
    report = _run(path)
    hint = path.stem.split("__")[1]
    assert not report.passed
    assert {o.hint for o in report.failed} == {hint}, [(o.check, o.seen, o.hint) for o in report.failed]
    # what the check saw is said in one line, and the hint's text is the exercise's
    assert all(o.seen and "\n" not in o.seen for o in report.failed)
    # and its own three steps: what to look at, the formula, the fix written for this mistake
    ex = practice.exercise(_name(path.stem))
    h = ex.hints[hint]
    assert isinstance(h, Hint)
    assert all(ex.steps(o.check, o.seen, o.hint) == list(zip(STEPS, (h.look, h.formula, h.fix)))
               for o in report.failed)


def test_a_check_is_repeatable_and_leaves_torchs_generator_alone():
    import torch

    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = _run(SOLUTIONS / "wrong" / "dropout__rescale.py")
    assert torch.equal(torch.get_rng_state(), before)
    b = _run(SOLUTIONS / "wrong" / "dropout__rescale.py")
    assert a.outcomes == b.outcomes


# -- SmolLM2 (slow: the real model) ------------------------------------------------------------------------

SMOLLM2_EXERCISES = [n for n, e in practice.EXERCISES.items() if e.reads_smollm2]


def test_the_smollm2_exercises_are_the_lens_and_the_memory():
    assert sorted(SMOLLM2_EXERCISES) == ["kv-memory", "logit-lens"]


@pytest.mark.parametrize("kind", ["reference", "other"])
@pytest.mark.parametrize("name", SMOLLM2_EXERCISES)
def test_smollm2_checks_pass_for_correct_solutions(smollm2_loaded, name, kind):
    paths = [p for p in _files(kind) if _name(p.stem) == name]
    assert paths
    for path in paths:
        report = _run(path, lambda: smollm2_loaded)
        assert report.passed, (path.stem, [(o.check, o.seen) for o in report.failed])


@pytest.mark.parametrize("stem", ["kv_memory__find", "logit_lens__final-norm"])
def test_smollm2_mistakes_fail_with_their_hint_on_the_real_model(smollm2_loaded, stem):
    report = _run(SOLUTIONS / "wrong" / f"{stem}.py", lambda: smollm2_loaded)
    assert {o.hint for o in report.failed} == {stem.split("__")[1]}


def test_lumen_neurons_finds_a_unit_the_memory_check_accepts(smollm2_loaded, tmp_path):
    """The exercise's own route to an answer works: the clearest unit `lumen neurons smollm2 --block B
    --windows 16` lists (the same windows the check reads) passes the check."""
    from lumen.inspect import scan_layer
    from lumen.inspect.corpus import token_windows
    from lumen.practice import inside

    model, tok = smollm2_loaded.model, smollm2_loaded.tokenizer
    windows = token_windows(tok, "shakespeare", "train", **inside.NEURON_WINDOWS)
    best = scan_layer(model, tok, windows, 8, k=inside.NEURON_CONTEXTS, show=1)[0]
    source = (SOLUTIONS / "reference" / "kv_memory.py").read_text().replace(
        'LAYER, UNIT, TRIGGER = 22, 543, "."', f"LAYER, UNIT, TRIGGER = 8, {best.unit}, {best.common_trigger!r}")
    path = tmp_path / "kv_memory.py"
    path.write_text(source)
    report = _run(path, lambda: smollm2_loaded)
    assert report.passed == (best.trigger_share >= inside.TRIGGER_SHARE), report.outcomes
    assert best.trigger_share >= inside.TRIGGER_SHARE
