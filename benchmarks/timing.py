"""Interleaved timing: every contender is timed once per round, rounds repeated.

Machine noise (another process, frequency changes) then hits all contenders
alike instead of whichever happened to run during the noisy stretch, and the
median over rounds discards the rounds it hit hardest.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

WARMUP_CALLS = 3


@dataclass
class Task:
    """One operation of one contender, timed ``number`` calls at a time.

    Attributes:
        key: what is measured, copied into the results (capacity, op, size, label...).
        fn: the operation; its result is discarded.
        activate: run before each timed repeat (sets the contender's thread count).
        number: calls per repeat, set by :func:`calibrate`.
        times: seconds per call, one entry per repeat.
    """

    key: dict[str, Any]
    fn: Callable[[], Any]
    activate: Callable[[], None]
    number: int = 0
    times: list[float] = field(default_factory=list)

    def run(self, calls: int) -> float:
        """Seconds for ``calls`` back-to-back calls, garbage collection paused (as timeit does).

        No ``gc.collect()`` first: paused, the collector cannot run during the calls anyway, and a full
        collection of a process that holds torch, Tianshou and numba takes ~0.3 s, paid per repeat.
        """
        self.activate()
        gc.disable()
        try:
            fn = self.fn
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            return time.perf_counter() - start
        finally:
            gc.enable()

    def summary(self) -> dict[str, Any]:
        """The key plus median, quartiles and all repeats (seconds per call)."""
        q1, _, q3 = statistics.quantiles(self.times, n=4) if len(self.times) > 1 else (self.times * 3)
        return {
            **self.key,
            "median_s": statistics.median(self.times),
            "q1_s": q1,
            "q3_s": q3,
            "calls_per_repeat": self.number,
            "repeats_s": self.times,
        }


def calibrate(task: Task, min_time: float) -> None:
    """Warm ``task`` up (first calls, JIT compiles, caches), then size a repeat to ``min_time``."""
    task.run(WARMUP_CALLS)
    calls = 1
    while True:
        elapsed = task.run(calls)
        if elapsed >= min_time / 5 or calls >= 1 << 20:
            break
        calls *= 2
    task.number = max(1, math.ceil(min_time * calls / max(elapsed, 1e-9)))


def run_interleaved(tasks: list[Task], repeats: int, tick: Callable[[], None] = lambda: None) -> None:
    """Time every task ``repeats`` times, round-robin; each round starts one task later."""
    for r in range(repeats):
        start = r % len(tasks)
        for task in tasks[start:] + tasks[:start]:
            task.times.append(task.run(task.number) / task.number)
            tick()
