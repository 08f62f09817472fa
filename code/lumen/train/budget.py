"""A run sized by time: `time_budget = 300` asks for about five minutes of training on whatever machine runs it.

The same preset trains at 1,100 tokens/s on one 2-core machine and at 10,000 on another: a fixed step count
is minutes on one and an hour on the other. So the run times its own first steps (after the first few, which
compile and warm the caches: their time is not the budget's) and chooses its step count from their speed:

    steps = steps taken  +  (budget - time the timed steps took) / seconds per step        (rounded to tens)

Seconds per step is the median of the timed steps: a step that compiles again (the thread tuner trying
another count, lumen.runtime.threads) is an outlier, not the typical step.

The steps timed are real steps, taken while the learning rate still ramps up (warm-up: a rate that does
not depend on the step count), so the chosen count is the run's from its first step: the schedule
follows it, and it is written into the run's config (config.toml, the checkpoints), with the budget set to
0, so that a rerun with that config takes the same steps, bit for bit where the thread count is pinned.

    >>> budget = StepBudget(300.0, warmup=50)                    # doctest: +SKIP
    >>> for step in ...: chosen = budget.record(seconds)         # None until it has measured enough  # doctest: +SKIP
"""

from __future__ import annotations

import statistics

SKIP = 3  # the first steps compile the model and warm the caches: not timed, not counted in the budget
TIMED = 12  # steps timed, at most
MIN_TIMED, TIMED_SECONDS = 5, 60.0  # or fewer (but at least MIN_TIMED), when they already took this long
ROUND = 10  # the chosen count is a multiple of this
MIN_WARMUP = SKIP + 3  # the warm-up a budgeted run needs: its timed steps all fall inside it


class StepBudget:
    """Times a run's first steps and chooses its step count for `seconds` of training (see the module)."""

    def __init__(self, seconds: float, warmup: int, done: int = 0):
        self.seconds, self.warmup = seconds, warmup
        self.done = done  # steps taken before this session (a resumed run)
        self.times: list[float] = []
        self.taken = 0  # steps this session
        self.elapsed = 0.0  # the timed steps' time

    def record(self, seconds: float) -> float | None:
        """One step took `seconds`; returns the measured seconds per step once enough steps are timed
        (before warm-up ends), None before."""
        self.taken += 1
        if self.taken > SKIP:
            self.times.append(seconds)
            self.elapsed += seconds
        last_in_warmup = self.done + self.taken >= self.warmup - 1
        enough = len(self.times) >= TIMED or (len(self.times) >= MIN_TIMED and self.elapsed >= TIMED_SECONDS)
        if self.times and (enough or last_in_warmup):
            return statistics.median(self.times)
        return None

    def steps(self, per_step: float) -> int:
        """The step count for the budget at `per_step` seconds a step: at least the warm-up and ten more."""
        left = max(0.0, self.seconds - self.elapsed)
        steps = self.done + self.taken + left / max(per_step, 1e-9)
        return max(ROUND * round(steps / ROUND), ROUND * -(-(self.warmup + ROUND) // ROUND))
