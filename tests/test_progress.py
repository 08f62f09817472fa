"""lumen.progress's estimate is the machine's own: the work left over the rate measured so far. A fake slow
job on a fake clock checks it against the work actually left (through the real helper, as the commands use
it); an experiment's bar moves by the steps of its runs, not by runs; and a real command (`lumen
delete-layer`, LUMEN_PROGRESS=always as in a log) shows the estimate."""

from __future__ import annotations

import itertools
import re

import pytest
import tqdm.std

from helpers.runs import tiny_run
from lumen.cli import main
from lumen.progress import progress, seconds_left


class Clock:
    """A clock that moves only when the fake job works."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def work(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(tqdm.std, "time", c)   # tqdm's bars read their time through it
    monkeypatch.setenv("LUMEN_PROGRESS", "always")
    return c


def test_a_slow_jobs_estimate_is_the_work_left_at_its_own_speed(clock, capsys):
    per_piece, pieces = 0.75, 40
    with progress(total=pieces, desc="a slow job", unit="piece") as bar:
        for done in range(1, pieces + 1):
            clock.work(per_piece)
            bar.update()
            if done >= 3:
                assert seconds_left(bar) == pytest.approx((pieces - done) * per_piece, rel=0.02), done
        drawn = capsys.readouterr().err
    # what the bar draws says the same: at 20 of 40 pieces, 15 s left ("<00:15")
    assert re.search(r"20/40 \[00:15<00:15", drawn), drawn[-400:]


def test_the_estimate_follows_the_machine_when_it_slows_down(clock):
    with progress(total=100, desc="a job on a machine that gets busy", unit="piece") as bar:
        for done in range(1, 101):
            clock.work(0.2 if done <= 50 else 0.6)   # another job starts halfway: three times slower
            bar.update()
            if done == 80:
                assert seconds_left(bar) == pytest.approx(20 * 0.6, rel=0.05)


def test_an_experiments_bar_moves_by_the_steps_of_its_runs_not_by_runs(clock):
    """Three training runs of 10 steps (their own bars silent, as fit.train_lm's are) inside an experiment
    that declared 30 steps: after every step the estimate is the steps left at the measured speed."""
    from lumen.experiments import fit

    with progress(desc="an experiment", unit="step") as fit.BAR:
        try:
            fit.expect(30)
            for run in range(3):
                with progress(total=10, unit="step", silent=True) as inner:
                    for step in range(10):
                        clock.work(0.5)
                        inner.update()
                        done = run * 10 + step + 1
                        assert fit.BAR.n == done
                        if done >= 3:
                            assert seconds_left(fit.BAR) == pytest.approx((30 - done) * 0.5, rel=0.02)
        finally:
            fit.BAR = None


def test_a_bar_inside_a_bar_with_a_total_stays_silent(clock, capsys):
    with progress(total=2, desc="the whole job", unit="pass") as outer:
        with progress(total=5, desc="one part", unit="batch") as inner:
            inner.update(5)
        outer.update(2)
    drawn = capsys.readouterr().err
    assert "the whole job" in drawn and "one part" not in drawn


def test_delete_layer_shows_its_estimate(tmp_path, monkeypatch, capsys):
    """The real command, its bar drawn into a log: one pass intact and one per block, each with the estimate."""
    root = tiny_run(tmp_path)
    monkeypatch.setenv("LUMEN_PROGRESS", "always")
    # tqdm redraws at most every 0.1 s: on a fast machine the tiny model's passes would all fall between two
    # redraws, so its clock ticks half a second at each reading
    ticks = itertools.count(1000.0, 0.5)
    monkeypatch.setattr(tqdm.std, "time", lambda: next(ticks))
    assert main(["delete-layer", str(root / "run"), "--corpus", str(root / "corpus"), "--windows", "1",
                 "--seq-len", "16"]) == 0
    drawn = capsys.readouterr().err
    blocks = 3   # tiny_run's model
    shown = re.findall(r"deleting blocks:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+) \[[\d:]+<([\d:?]+)", drawn)
    assert shown and {int(t) for _, t, _ in shown} == {blocks + 1}, drawn
    assert any(eta != "?" for done, _, eta in shown if int(done) > 0), drawn   # an estimate once a pass is done


@pytest.mark.slow
@pytest.mark.parametrize("name", ["norms", "mixing"])
def test_an_experiment_declares_the_steps_its_runs_take(name, monkeypatch, capsys):
    """fit.expect's total is the steps the runs take (the bar ends at its total), so the estimate is true.
    (Checked on every training experiment once by hand: norms 60, activations 120, init-scaling 30, dropout
    240, depth 80, norm-placement 160, mixing 360 steps at the quick size, each equal to its declared total.)"""
    import lumen.experiments as experiments

    made = []

    def spy(*args, **kwargs):
        made.append(progress(*args, **kwargs))
        return made[-1]

    monkeypatch.setenv("LUMEN_PROGRESS", "always")
    monkeypatch.setattr(experiments, "progress", spy)
    experiments.run(name, quick=True)
    bar = made[0]
    assert bar.total and bar.n == bar.total
    assert re.search(rf"{name}:.*\| *\d+/{bar.total} \[[\d:]+<[\d:]+,", capsys.readouterr().err)   # an estimate


class Ticking:
    """A clock that moves on at every read: each piece of work a bar counts takes a measurable time."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 1000.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_explore_shows_an_estimate_over_its_parts_then_patchings_own_bar(tmp_path, monkeypatch, capsys):
    """The real command: a bar over the lens, the attribution and the heads (each one forward pass), naming
    the part running, with an estimate once a part is done; with --corrupt the patching maps then draw their own
    bar (not silenced by the parts' bar, which counts other work)."""
    root = tiny_run(tmp_path)
    monkeypatch.setattr(tqdm.std, "time", Ticking(0.5))
    monkeypatch.setenv("LUMEN_PROGRESS", "always")
    assert main(["explore", str(root / "run"), "--prompt", "It is the east", "--corrupt", "It is the west",
                 "--contrast", "e", "a", "--patch", "resid_pre", "--out", str(tmp_path / "p.html")]) == 0
    drawn = capsys.readouterr().err
    shown = re.findall(r"exploring:\s+\d+%\|[^|]*\|\s*(\d+)/(\d+) \[[\d:]+<([\d:?]+)", drawn)
    assert shown and {int(t) for _, t, _ in shown} == {3}, drawn
    assert {int(d) for d, _, _ in shown} >= {1, 2}, drawn
    assert all(eta != "?" for done, _, eta in shown if int(done) > 0), drawn   # the estimate, once a part is done
    for part in ("lens", "attribution", "heads"):
        assert re.search(rf"exploring:[^\n]*(?:part/s|s/part), {part}\]", drawn), (part, drawn)   # the part running
    after = drawn[drawn.rindex("exploring"):]
    assert re.search(r"patching:\s+\d+%\|[^|]*\|\s*\d+/\d+", after), drawn   # patching's own bar, after the parts


def test_generate_compile_says_it_is_compiling_then_how_long_it_took_before_the_text(tmp_path, monkeypatch):
    """A compiler's time has no total for a bar: --compile says it is compiling, then, when the prompt's pass
    and the warm-up steps are done (where compiling happens), how long they took, and only then the text. (The
    compiled path is stood in for by the eager one with 0.2 s added to each of those three tokens, as compiling
    adds; stdout and stderr go to one stream to see the order.)"""
    import contextlib
    import io
    import sys
    import time

    import lumen.fast as fast

    root = tiny_run(tmp_path)
    real = fast.decoding

    @contextlib.contextmanager
    def pretend(model, compile=False):
        with real(model, False) as decoder:
            tokens = decoder.tokens

            def compiling_first(*a, **k):
                for i, t in enumerate(tokens(*a, **k)):
                    if compile and i < 3:
                        time.sleep(0.2)
                    yield t

            decoder.tokens = compiling_first
            yield decoder

    monkeypatch.setattr(fast, "decoding", pretend)
    both = io.StringIO()
    monkeypatch.setattr(sys, "stdout", both)
    monkeypatch.setattr(sys, "stderr", both)
    assert main(["generate", str(root / "run"), "--prompt", "ROMEO.", "--max-new-tokens", "10", "--greedy",
                 "--compile"]) == 0
    lines = both.getvalue().splitlines()
    said = [i for i, w in enumerate(lines) if w.startswith("lumen generate: compiling the decoding step")]
    done = [i for i, w in enumerate(lines) if w.startswith("lumen generate: compiled: ")]
    text = [i for i, w in enumerate(lines) if not w.startswith("lumen generate:")]
    assert len(said) == 1 and len(done) == 1 and text, lines
    assert said[0] < done[0] < text[0], lines   # compiling, compiled, then the text
    took = float(re.search(r"compiled: ([\d.]+) s for the prompt's pass and 2 steps", lines[done[0]])[1])
    assert took >= 0.6   # the three slowed tokens, measured on this run's clock
