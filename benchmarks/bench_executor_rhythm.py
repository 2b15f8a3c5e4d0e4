"""The native executor against the learner's rhythm: is the next batch drawn when the learner comes for it?

A learner step here is ``sample(B) -> train -> update_priorities``, the training a busy wait of
``--train-us`` microseconds (it holds one core as training does, and its length is exact, so the
rhythm is the only variable). With ``--evict-mb M`` each training step first reads M MiB, as a
real one moves its weights and activations through the caches: the replay calls then run with
cold caches, as they do in ``learn``. For strict PER and for ``RelaxedReplay(staleness=1, worker="native")``
on a host buffer of N = 100,000 DQN-like rows (obs float32 (4,)), per rhythm:

* **learner µs**: the learner's own time in ``sample`` + ``update_priorities`` per step (strict:
  the whole replay work; staleness 1: collecting the drawn batch, handing over the next job and
  the update, plus the job itself whenever the executor's thread had not run it in time);
* **not drawn**: the share of steps whose job the thread had not finished when the learner came
  for it (the learner then runs it itself, or waits for it);
* **other core µs**: CPU time per step beyond the learner's core (the thread's jobs and polls).

Medians of ``--repeats`` interleaved rounds; torch is not involved. Run it on a quiet machine
(the thread polls only where a core is idle for it).

    python benchmarks/bench_executor_rhythm.py
    python benchmarks/bench_executor_rhythm.py --train-us 150 1000 --batch 256 --repeats 7
    python benchmarks/bench_executor_rhythm.py --train-us 300 --evict-mb 8      # cold caches
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

import hetero_replay
from hetero_replay import PrioritizedReplay, RelaxedReplay

CAPACITY = 100_000
SCHEMA = {"obs": ((4,), np.float32), "action": ((), np.int64), "reward": ((), np.float32),
          "next_obs": ((4,), np.float32), "done": ((), np.float32)}  # fmt: skip


def filled_buffer(staleness: int) -> Any:
    """A full host buffer on the C++ tree; relaxed (native executor) when ``staleness`` > 0."""
    replay = PrioritizedReplay(CAPACITY, SCHEMA, seed=0)
    replay.add({name: np.zeros((CAPACITY, *shape), dtype) for name, (shape, dtype) in SCHEMA.items()})
    return RelaxedReplay(replay, staleness=staleness, worker="native") if staleness else replay


def busy_wait(seconds: float, evict: np.ndarray) -> None:
    """Hold this core for ``seconds``, as a training step does, after reading ``evict`` (may be empty)."""
    evict.sum()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def measure(buffer: Any, batch: int, train_us: float, steps: int, evict: np.ndarray) -> tuple[float, float, float]:
    """``steps`` learner steps: (learner µs per step in replay calls, share not drawn in time, other core µs)."""
    td = np.random.default_rng(0).random(batch)
    core = getattr(buffer, "_core", None)  # the native pipeline: read only to count jobs not done in time
    clock, train = time.perf_counter, train_us * 1e-6
    learner = late = 0.0
    wall, cpu = clock(), time.process_time()
    for _ in range(steps):
        if core is not None and core.executor.pending and not core.executor.finished:
            late += 1
        start = clock()
        drawn = buffer.sample(batch)
        learner += clock() - start
        busy_wait(train, evict)
        start = clock()
        buffer.update_priorities(drawn.indices, td)
        learner += clock() - start
    wall, cpu = clock() - wall, time.process_time() - cpu
    return learner / steps * 1e6, late / steps, max(cpu - wall, 0.0) / steps * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-us", type=float, nargs="+", default=[150, 500, 1000], help="training step lengths (µs)")
    p.add_argument("--batch", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default 5)")
    p.add_argument("--seconds", type=float, default=0.6, help="seconds per measurement (default 0.6)")
    p.add_argument("--evict-mb", type=float, default=0.0, help="MiB each training step reads first (default 0)")
    args = p.parse_args(argv)
    hetero_replay.set_num_threads(1)
    evict = np.ones(int(args.evict_mb * 2**20) // 4, np.float32)
    buffers = {"strict": filled_buffer(0), "staleness 1": filled_buffer(1)}
    results: dict[tuple[float, str], list[tuple[float, float, float]]] = {}
    for r in range(args.repeats):
        for train_us in args.train_us:
            steps = max(int(args.seconds / (train_us * 1e-6)), 50)
            for label, buffer in buffers.items():
                measure(buffer, args.batch, train_us, 100, evict)  # warm up; the thread learns the rhythm
                results.setdefault((train_us, label), []).append(measure(buffer, args.batch, train_us, steps, evict))
        print(f"round {r + 1}/{args.repeats} done", flush=True)
    cold = f", {args.evict_mb:g} MiB read per step" if args.evict_mb else ""
    print(
        f"\n| B = {args.batch}{cold}, train µs | replay | learner µs / step | not drawn in time | other core µs / step |"
    )
    print("|---|---|---|---|---|")
    for (train_us, label), rows in results.items():
        learner, late, other = (statistics.median(column) for column in zip(*rows))
        print(f"| {train_us:.0f} | {label} | {learner:.1f} | {late:.1%} | {other:.0f} |")
    for buffer in buffers.values():
        buffer.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
