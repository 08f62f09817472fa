"""How many CPU threads a loop of equal steps should use, chosen from the steps' own times.

On a CPU, torch runs each operation (and each kernel that torch.compile writes) as an OpenMP parallel
region: the work is split between the threads, and the region ends when the last thread is done. When
other programs take a core, one of our threads waits in the scheduler's queue while the others wait for
it at the region's barrier, spinning first. A compiled training step is a few hundred such regions, so
a step that takes milliseconds on an idle machine can take seconds on a busy one. One thread has no
barrier to wait at. No fixed count is right everywhere: all cores win on an idle machine, fewer on a
busy one, and the load changes during a run; so the tuner below measures.

    >>> tuner = ThreadTuner()            # doctest: +SKIP
    >>> for step in range(steps):        # doctest: +SKIP
    ...     t0 = time.perf_counter(); train_step(); tuner.record(time.perf_counter() - t0)

Numbers may change in the last bit when the thread count does (sums split differently between
threads), so a run that must repeat bit for bit pins its thread count instead.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Generator, Iterable
from typing import TypeVar

import torch

from ..errors import LumenError, UserError
from .cpu import cpu_count

T = TypeVar("T")


def check_threads(n: int, what: str, error: type[LumenError] = UserError) -> int:
    """n, a thread count to pin torch to, if it is 0 (lumen chooses) or a count this machine can run: more
    OpenMP threads than CPUs only wait for each other, and a million of them crash the process."""
    if not 0 <= n <= cpu_count():
        raise error(f"{what} must be between 0 (lumen chooses) and this machine's {cpu_count()} CPUs, got {n:,}")
    return n


def thread_choices(most: int) -> list[int]:
    """The counts worth trying: all threads, then halvings down to one (8 -> [8, 4, 2, 1])."""
    choices = [max(most, 1)]
    while choices[-1] > 1:
        choices.append(choices[-1] // 2)
    return choices


def idle_seconds() -> float | None:
    """The CPU-seconds this machine's cores have spent idle since boot (Linux's /proc/stat; None elsewhere)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()  # "cpu  user nice system idle iowait irq softirq steal ..."
        return (int(fields[4]) + int(fields[5])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class ThreadTuner:
    """Keeps torch's thread count at whichever count ran the recent steps fastest.

    It tries each count for a few steps (the count in use is measured by its recent steps; a count whose
    first step is already `slack` times slower than the best so far is dropped at once, so a trial costs
    little when one count is far off), keeps the fastest, and tries again when the steps grow `slack` times
    slower or faster than when it chose (other work started or stopped), or after `every` steps. The steps
    tried are real steps: only their speed differs.

    Steps shorter than `sample` seconds (a decoded token takes milliseconds) are timed in groups that last
    at least that long: one short step's time is mostly the scheduler's noise on a busy machine, and a tuner
    that reacts to noise spends its time trying counts. "Step" below means such a group.

    One change the steps cannot show: a core freed while we run on fewer threads than cores (one thread runs
    as fast beside one busy process as alone). So the tuner also reads how long the machine's cores sat idle
    (`idle`: cumulative idle CPU-seconds, /proc/stat by default): most of a core idle during a step while a
    larger count is possible starts a trial; a trial that keeps the same count doubles the wait before the
    next such one (a machine whose idle core cannot be used is not tried every step)."""

    def __init__(self, most: int | None = None, every: int = 200, trial_steps: int = 3, slack: float = 1.5,
                 skip: int = 2, sample: float = 0.2, idle: Callable[[], float | None] | None = idle_seconds):
        self.choices = thread_choices(most or torch.get_num_threads())
        self.every, self.trial_steps, self.slack, self.sample = every, trial_steps, slack, sample
        self.skip = skip  # the first steps compile or warm caches: not counted
        self.group_time, self.group_steps = 0.0, 0  # short steps waiting to make one sample
        self.times: dict[int, list[float]] = {}
        self.chosen: int = self.choices[0]
        self.reference = float("inf")  # the chosen count's step time when chosen
        self.recent: list[float] = []
        self.since = 0
        self.trying: list[int] = []
        self.used = {torch.get_num_threads()}
        self.fresh = False  # the next step is the first at a new count: it recompiles, not counted
        self.idle = idle
        self.idle_mark: tuple[float, float] | None = None  # (wall clock, idle CPU-seconds) when a group ended
        self.idle_wait = trial_steps  # steps before an idle core may start a trial
        self.idle_trial = False  # the trial under way was started by an idle core
        if len(self.choices) > 1:
            self._start_trial()

    def _set(self, n: int) -> None:
        """torch.compile guards on the thread count: the first step at a new count compiles again."""
        if n not in self.used:
            self.used.add(n)
            self.fresh = True
        self.group_time, self.group_steps = 0.0, 0  # a sample measures one count
        torch.set_num_threads(n)

    def record(self, seconds: float) -> None:
        """One step took `seconds`; may set torch's thread count for the next steps."""
        if self.skip > 0:
            self.skip -= 1
            return
        if len(self.choices) == 1:
            return
        if self.fresh:
            self.fresh = False
            return
        self.group_time += seconds
        self.group_steps += 1
        if self.group_time < self.sample:
            return
        seconds = self.group_time / self.group_steps  # the mean step of the group
        self.group_time, self.group_steps = 0.0, 0
        idle = self._idle_cores()
        if self.trying:
            self._trial_step(seconds)
            return
        self.since += 1
        self.recent = (self.recent + [seconds])[-self.trial_steps:]
        now = statistics.median(self.recent)
        moved = len(self.recent) == self.trial_steps and not (
            self.reference / self.slack <= now <= self.slack * self.reference)
        if moved or self.since >= self.every:
            self._start_trial()
        elif self.since >= self.idle_wait and self.chosen < self.choices[0] and idle >= 0.75:
            self.idle_trial = True
            self._start_trial()

    def _idle_now(self) -> tuple[float, float] | None:
        idle = self.idle() if self.idle is not None else None
        return None if idle is None else (time.monotonic(), idle)

    def _idle_cores(self) -> float:
        """How many cores sat idle, on average, since the last group ended (0 when that cannot be read)."""
        now, mark = self._idle_now(), self.idle_mark
        self.idle_mark = now
        if now is None or mark is None or now[0] - mark[0] < 0.05:  # (the kernel counts in 10 ms ticks)
            return 0.0
        return (now[1] - mark[1]) / (now[0] - mark[0])

    def _start_trial(self) -> None:
        # the recent steps already measured the count in use: try the others
        self.times = {self.chosen: list(self.recent)} if self.recent else {}
        self.trying = [n for n in self.choices if n not in self.times]
        self._set(self.trying[0])

    def _trial_step(self, seconds: float) -> None:
        n = self.trying[0]
        self.times.setdefault(n, []).append(seconds)
        best = min((statistics.median(t) for k, t in self.times.items() if k != n), default=float("inf"))
        done = len(self.times[n]) >= self.trial_steps or seconds > self.slack * best
        if not done:
            return
        self.trying.pop(0)
        if self.trying:
            self._set(self.trying[0])
            return
        medians = {k: statistics.median(t) for k, t in self.times.items()}
        before, self.chosen = self.chosen, min(medians, key=medians.__getitem__)
        if self.idle_trial and self.chosen == before:  # the idle core did not help: wait longer next time
            self.idle_wait = min(2 * self.idle_wait, self.every)
        elif self.chosen != before:
            self.idle_wait = self.trial_steps
        self.idle_trial = False
        self.reference = medians[self.chosen]
        self.recent, self.since = [], 0
        self._set(self.chosen)


def tuned(steps: Iterable[T], tuner: ThreadTuner | None = None) -> Generator[T, None, None]:
    """Yield from steps (e.g. `lumen.decode.tokens(...)`, one token each), timing how long each took to make and
    letting a ThreadTuner choose the thread count for the next; torch's count is restored at the end."""
    tuner = tuner or ThreadTuner()
    before = torch.get_num_threads()
    try:
        t0 = time.perf_counter()
        for item in steps:
            tuner.record(time.perf_counter() - t0)
            yield item
            t0 = time.perf_counter()  # the consumer's time between steps is not the step's
    finally:
        torch.set_num_threads(before)
