"""lumen.runtime.threads: the tuner keeps whichever thread count the step times say is fastest, and follows changes."""

from __future__ import annotations

import pytest
import torch

from lumen.runtime.threads import ThreadTuner, thread_choices, tuned


@pytest.fixture(autouse=True)
def keep_threads():
    """Each test may change torch's thread count; the next one starts from the count before."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_thread_choices_halve_down_to_one():
    assert thread_choices(8) == [8, 4, 2, 1] and thread_choices(6) == [6, 3, 1] and thread_choices(1) == [1]


def run(tuner: ThreadTuner, seconds_at: dict[int, float], steps: int) -> list[int]:
    """Feed the tuner steps whose time depends on the thread count it set; the counts it used."""
    used = []
    for _ in range(steps):
        n = torch.get_num_threads()
        used.append(n)
        tuner.record(seconds_at[n])
    return used


def test_tuner_follows_the_machine():
    tuner = ThreadTuner(most=4, every=100, skip=1, idle=None)
    quiet = {4: 0.10, 2: 0.17, 1: 0.30}
    used = run(tuner, quiet, 30)
    assert tuner.chosen == 4 and used[-10:] == [4] * 10
    busy = {4: 6.8, 2: 1.2, 1: 0.5}  # cores taken: all threads wait at barriers
    used = run(tuner, busy, 30)
    assert tuner.chosen == 1 and used[-10:] == [1] * 10
    # a count far slower than the best so far is left after one step
    assert used.count(4) <= 1 + 3 and used.count(2) <= 3
    used = run(tuner, quiet, 60)  # quiet again: one thread got faster, so it tries again
    assert tuner.chosen == 4 and used[-10:] == [4] * 10


def test_one_core_never_changes_threads():
    torch.set_num_threads(3)
    tuner = ThreadTuner(most=1)
    run(tuner, {3: 0.1}, 10)
    assert torch.get_num_threads() == 3


def test_tuned_steps_pass_through_and_restore_threads():
    torch.set_num_threads(2)
    assert list(tuned(iter(range(20)), ThreadTuner(most=2, skip=0))) == list(range(20))
    assert torch.get_num_threads() == 2


def test_the_first_step_at_a_new_count_is_not_counted():
    """torch.compile compiles again at a thread count it has not run with: that step's time says nothing."""
    torch.set_num_threads(2)
    tuner = ThreadTuner(most=2, skip=0, idle=None)
    firsts = {1: True}
    for _ in range(20):
        n = torch.get_num_threads()
        slow_first = n == 1 and firsts.pop(1, False)
        tuner.record(30.0 if slow_first else {2: 0.5, 1: 0.2}[n])
    assert tuner.chosen == 1


def test_a_run_with_threads_0_tunes_and_restores(monkeypatch, keep_threads):
    """`threads = 0` (the default) hands the loop's step times to a ThreadTuner; the run ends with torch's
    thread count as it found it."""
    from lumen.data import prepare
    from lumen.train import load_config, loop, train

    seen = []

    class Recording(ThreadTuner):
        def record(self, seconds: float) -> None:
            seen.append(seconds)
            super().record(seconds)

    monkeypatch.setattr(loop, "ThreadTuner", Recording)
    cfg, model_cfg = load_config(preset="tiny", sets=["progress=false", "save=false", "threads=0", "steps=12",
                                                      "sample_tokens=0"])
    result = train(cfg, model_cfg, data=prepare("shakespeare", "char"))
    assert result.steps == 12 and len(seen) == 12 and all(s > 0 for s in seen)
    assert torch.get_num_threads() == keep_threads


def test_short_noisy_steps_are_judged_in_groups():
    """A decoded token takes milliseconds, and on a busy machine one token's time is mostly the scheduler's
    noise (a step that waited a time slice): judged one by one, the tuner would keep trying counts."""
    import random

    def noisy(rng: random.Random, base: float) -> float:
        return base * (10 if rng.random() < 0.1 else 1 + 0.3 * rng.random())

    def share_at_best(**sample: float) -> float:
        rng = random.Random(0)
        torch.set_num_threads(2)
        tuner = ThreadTuner(most=2, skip=0, idle=None, **sample)
        tuner.used = {1, 2}  # nothing compiles here
        used = []
        for _ in range(20_000):
            n = torch.get_num_threads()
            used.append(n)
            tuner.record(noisy(rng, {2: 0.002, 1: 0.003}[n]))
        return used[2000:].count(2) / len(used[2000:])

    assert share_at_best() > 0.95  # the default grouping
    assert share_at_best(sample=0.0) < 0.9  # the same steps judged one by one: the property above is not free


class Machine:
    """Two cores and a clock: our steps and a neighbour's process, with the idle CPU-seconds /proc/stat would
    count (a core is idle when neither we nor the neighbour run on it)."""

    def __init__(self) -> None:
        self.clock, self.idle, self.neighbour = 0.0, 0.0, True

    def step(self, threads: int) -> float:
        seconds = 0.2 if threads == 2 and not self.neighbour else 0.3  # one thread: as fast either way
        busy = min(2, threads + self.neighbour)
        self.clock += seconds
        self.idle += (2 - busy) * seconds
        return seconds


def test_a_freed_core_is_found_by_its_idleness(monkeypatch):
    """Chosen at one thread beside a busy process, the tuner cannot see the process leave in its own steps
    (one thread is as fast either way); the cores' idle time shows it, and it moves to two threads long before
    its periodic retrial. Without the idle reading it stays at one thread."""
    import lumen.runtime.threads as threads

    def settle(idle: bool) -> tuple[ThreadTuner, Machine, list[int]]:
        m = Machine()
        monkeypatch.setattr(threads.time, "monotonic", lambda: m.clock)
        torch.set_num_threads(2)
        tuner = ThreadTuner(most=2, every=100, skip=0, sample=0.0, idle=(lambda: m.idle) if idle else None)
        tuner.used = {1, 2}
        busy = {2: 0.9, 1: 0.3}  # beside the neighbour two threads wait at barriers
        for _ in range(20):
            tuner.record(busy[torch.get_num_threads()])
        assert tuner.chosen == 1
        m.neighbour = False
        used = []
        for _ in range(30):
            n = torch.get_num_threads()
            used.append(n)
            tuner.record(m.step(n))
        return tuner, m, used

    tuner, _, used = settle(idle=True)
    assert tuner.chosen == 2 and used[-20:] == [2] * 20
    tuner, _, used = settle(idle=False)
    assert tuner.chosen == 1 and used == [1] * 30
