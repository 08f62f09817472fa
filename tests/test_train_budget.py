"""time_budget: a run times its first steps and chooses its step count from their speed (lumen.train.budget);
the count goes into the run's config, a rerun with that config and a resumed run take the same steps, bit for bit."""

from __future__ import annotations

import shutil

import pytest
import torch

from lumen.data import prepare
from lumen.train import budget as B
from lumen.train import load_config, loop, train


@pytest.fixture(scope="module")
def data():
    return prepare("shakespeare", "char")


def test_the_count_is_the_time_left_over_the_measured_step():
    b = B.StepBudget(60.0, warmup=50)
    times = [5.0, 1.0, 1.0] + [0.25 + 0.01 * (i % 3) for i in range(40)]  # compiles, warms, then steady
    answers = iter(b.record(t) for t in times)  # recorded until the first answer
    n, per_step = next((i, a) for i, a in enumerate(answers, 1) if a is not None)
    assert n == B.SKIP + B.TIMED  # (12 steady steps take under a minute)
    steady = sorted(times[B.SKIP:n])
    assert per_step == steady[len(steady) // 2] if len(steady) % 2 else per_step == sum(steady[5:7]) / 2
    left = 60.0 - sum(times[B.SKIP:n])  # (compiling is not the budget's)
    assert b.steps(per_step) == 10 * round((n + left / per_step) / 10)
    assert B.StepBudget(1.0, warmup=50).steps(10.0) == 60  # no time left: the warm-up and ten more, in tens


def test_slow_steps_are_timed_for_fewer_steps_and_within_warmup():
    b = B.StepBudget(300.0, warmup=50)
    got = [b.record(15.0) for _ in range(20)]
    first = B.SKIP + B.MIN_TIMED - 1  # a minute of steps, but no fewer than MIN_TIMED
    assert got[:first] == [None] * first and got[first] == 15.0
    b = B.StepBudget(300.0, warmup=50)  # a step that compiles again (another thread count) does not set the pace
    got = [b.record(t) for t in [90.0] * B.SKIP + [1.0, 1.0, 120.0, 1.0, 1.1, 0.9] + [1.0] * 10]
    first = next(i for i, a in enumerate(got) if a is not None)
    assert first == B.SKIP + B.MIN_TIMED - 1 and got[first] == 1.0  # (a minute passed: five steps, their median)
    b = B.StepBudget(300.0, warmup=B.MIN_WARMUP)
    got = [b.record(0.001) for _ in range(B.MIN_WARMUP)]
    assert got.index(0.001) == B.MIN_WARMUP - 2  # the last step inside the warm-up ends the timing


def test_budget_needs_a_warmup_and_steps_given_turn_it_off():
    with pytest.raises(ValueError, match="warmup must be at least"):
        load_config(preset="tiny", sets=["time_budget=5", "warmup=2"])
    assert load_config(preset="shakespeare")[0].time_budget == 300
    assert load_config(preset="shakespeare", sets=["steps=100"])[0].time_budget == 0  # the count asked for
    assert load_config(preset="shakespeare", sets=["steps=100", "time_budget=60"])[0].time_budget == 60


def test_a_budgeted_run_chooses_writes_and_repeats_its_count(tmp_path, data, monkeypatch):
    chosen: list[tuple[int, float]] = []

    class Spy(B.StepBudget):
        def steps(self, per_step: float) -> int:
            n = super().steps(per_step)
            chosen.append((n, per_step, self.done + self.taken, self.elapsed))
            return n

    monkeypatch.setattr(loop, "StepBudget", Spy)
    sets = ["progress=false", "time_budget=1.5", "warmup=10", "sample_tokens=0", "dtype=float32", "threads=1"]
    cfg, m = load_config(preset="tiny", sets=[*sets, f"out_dir={tmp_path / 'a'}"])
    a = train(cfg, m, data=data)
    (n, per_step, taken, elapsed), = chosen
    assert n == max(10 * round((taken + (1.5 - elapsed) / per_step) / 10), 20) and a.steps == n
    assert [r["step"] for r in a.evals] == [-(-n // 2), n]  # the preset's two evaluations, over the chosen steps
    written, _ = load_config(tmp_path / "a" / "config.toml")
    assert written.steps == n and written.time_budget == 0 and written.eval_interval == -(-n // 2)
    # a rerun from the written config takes the same steps with the same rates: the same weights
    again = train(*load_config(tmp_path / "a" / "config.toml", sets=[f"out_dir={tmp_path / 'b'}"]), data=data)
    assert again.steps == n and len(chosen) == 1
    for (k, x), (_, y) in zip(a.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(x, y), k
    # resumed from its middle checkpoint with the budgeted config: it ends where it would have, not re-timed
    shutil.copytree(tmp_path / "a", tmp_path / "c")
    shutil.rmtree(tmp_path / "c" / "checkpoints" / f"step-{n:06d}")
    (tmp_path / "c" / "best.json").unlink(missing_ok=True)
    cfg, m = load_config(preset="tiny", sets=[*sets, f"out_dir={tmp_path / 'c'}"])
    resumed = train(cfg, m, data=data, resume=True)
    assert resumed.steps == n and len(chosen) == 1
    for (k, x), (_, y) in zip(a.model.state_dict().items(), resumed.model.state_dict().items()):
        assert torch.equal(x, y), k
