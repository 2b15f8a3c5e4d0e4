"""The rate limiter at every front door: writers alternate bursts and pauses, the learner samples as fast as allowed.

For each door, W writers (processes, threads or Ray tasks, as that door is written to) add
chunks in bursts of 1-30 adds with pauses of up to ``--pause-ms`` between them for ``--seconds``,
while the learner samples B and updates priorities as fast as the limiter lets it. Reported: the
achieved samples-per-insert ratio against the target, the largest deviation of the running ratio
once the learner caught up with the rows added before ``min_size``, rows inserted, and whether every side stopped (no
deadlock: a side whose partner stopped raises ``RateLimited`` after the limiter's timeout).

* ``shared``: ``PrioritizedReplay(storage="shared")``, W writer processes (fork) through ``writer()``;
  their rows are counted when the learner polls them (they are not held back).
* ``relaxed``: ``RelaxedReplay`` (staleness 2) over a host ``PrioritizedReplay``, W writer threads.
* ``tianshou``: ``HeteroPrioritizedVectorReplayBuffer``, W collector threads adding a step of 4 envs.
* ``sharded``: ``ShardedReplay`` (2 shards, staleness 1), W Ray tasks adding through ``writer()``.

Writes ``benchmarks/results/rate-limiter.{md,json}``.

    python benchmarks/bench_rate_limiter.py                  # 60 s per door: about 5 minutes
    python benchmarks/bench_rate_limiter.py --seconds 5 --doors shared relaxed   # a quick look
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import cpu_model, git_revision, table  # noqa: E402

from hetero_replay import PrioritizedReplay, RateLimited, RateLimiter, RelaxedReplay  # noqa: E402

SCHEMA = {"obs": ((8,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "float32")}
ENVS = 4  # the Tianshou door's environments per step
MIN_SIZE = 10_000  # the limiter's: no sample before, so the running ratio counts from there


def rows(n: int) -> dict[str, np.ndarray]:
    return {"obs": np.zeros((n, 8), np.float32), "action": np.zeros(n, np.int64),
            "reward": np.zeros(n, np.float32), "done": np.zeros(n, np.float32)}  # fmt: skip


def bursts(add: Callable[[], Any], seed: int, seconds: float, pause_s: float) -> None:
    """Call ``add`` in bursts of 1-30, pausing up to ``pause_s`` between them, for ``seconds`` (a refused add is retried)."""
    rng = np.random.default_rng(seed)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(int(rng.integers(1, 31))):
            try:
                add()
            except RateLimited:  # the learner did not move for the limiter's timeout (catching up, or stopped)
                if time.monotonic() >= end:
                    return
        time.sleep(float(rng.uniform(0, pause_s)))


def _process_writer(writer: Any, chunk: int, seed: int, seconds: float, pause_s: float) -> None:
    batch = rows(chunk)
    bursts(lambda: writer.add(batch), seed, seconds, pause_s)


def _ray_writer(writer: Any, chunk: int, seed: int, seconds: float, pause_s: float) -> None:
    batch = rows(chunk)
    bursts(lambda: writer.add(batch), seed, seconds, pause_s)


class Door:
    """One front door: its buffer, how its writers start and join, its learner step and its counters."""

    def __init__(self, name: str, args: argparse.Namespace, limiter: RateLimiter, tmp: str) -> None:
        self.name, self.args, self.limiter = name, args, limiter
        self.writers: list[Any] = []
        w, secs, pause = args.writers, args.seconds, args.pause_ms / 1e3
        if name == "shared":
            self.buf: Any = PrioritizedReplay(
                1 << 16, SCHEMA, seed=0, storage="shared", storage_options={"dir": tmp}, rate_limiter=limiter
            )
            ctx = mp.get_context("fork")
            self.writers = [
                ctx.Process(target=_process_writer, args=(self.buf.writer(), args.chunk, s, secs, pause), daemon=True)
                for s in range(w)
            ]
        elif name == "relaxed":
            self.buf = RelaxedReplay(PrioritizedReplay(1 << 16, SCHEMA, seed=0, rate_limiter=limiter), staleness=2)
            batch = rows(args.chunk)
            self.writers = [
                threading.Thread(target=bursts, args=(lambda: self.buf.add(batch), s, secs, pause), daemon=True)
                for s in range(w)
            ]
        elif name == "tianshou":
            from tianshou.data import Batch

            from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

            self.buf = HeteroPrioritizedVectorReplayBuffer(1 << 16, ENVS, random_seed=0, rate_limiter=limiter)
            step = Batch(obs=np.zeros((ENVS, 8), np.float32), act=np.zeros(ENVS, np.int64), rew=np.zeros(ENVS),
                         terminated=np.zeros(ENVS, bool), truncated=np.zeros(ENVS, bool),
                         obs_next=np.zeros((ENVS, 8), np.float32), info=Batch())  # fmt: skip
            lock = threading.Lock()  # Tianshou's add of one env twice in a step is sequential: one step at a time

            def add() -> None:
                with lock:
                    self.buf.add(step, buffer_ids=np.arange(ENVS))

            self.writers = [threading.Thread(target=bursts, args=(add, s, secs, pause), daemon=True) for s in range(w)]
        elif name == "sharded":
            import ray

            from hetero_replay.distributed import ShardedReplay

            self.buf = ShardedReplay(2, 1 << 15, SCHEMA, seed=0, staleness=1, rate_limiter=limiter)
            task = ray.remote(num_cpus=0)(_ray_writer)
            self._task, self._handles = task, [self.buf.writer() for _ in range(w)]
        else:
            raise ValueError(f"unknown door {name!r}")

    def start(self) -> None:
        if self.name == "sharded":
            a = self.args
            self.writers = [
                self._task.remote(h, a.chunk, s, a.seconds, a.pause_ms / 1e3) for s, h in enumerate(self._handles)
            ]
            return
        for t in self.writers:
            t.start()

    def join(self) -> bool:
        """Whether every writer stopped within 60 s."""
        if self.name == "sharded":
            import ray

            ready, _ = ray.wait(self.writers, num_returns=len(self.writers), timeout=60)
            return len(ready) == len(self.writers)
        for t in self.writers:
            t.join(60)
        return not any(t.is_alive() for t in self.writers)

    def step(self, batch: int, rng: np.random.Generator) -> None:
        if self.name == "tianshou":
            _, indices = self.buf.sample(batch)
            self.buf.update_weight(indices, rng.random(batch))
            return
        sample = self.buf.sample(batch)
        self.buf.update_priorities(sample.indices, rng.random(batch))

    def counters(self) -> tuple[int, int]:
        if self.name == "sharded":
            state = self.buf.rate_limiter
            return int(state["inserted"]), int(state["sampled"])
        return self.limiter.inserted, self.limiter.sampled

    def close(self) -> None:
        self.buf.close()


def run(door: Door, args: argparse.Namespace) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    door.start()
    start = time.monotonic()
    trace: list[tuple[float, int, int]] = []
    next_look = start
    learner_stopped_by = None
    while True:
        try:
            door.step(args.batch, rng)
        except RateLimited as e:  # the writers stopped (or are still starting: Ray tasks take seconds)
            if time.monotonic() - start < args.seconds:
                continue
            learner_stopped_by = str(e)
            break
        now = time.monotonic()
        if now >= next_look:
            trace.append((now - start, *door.counters()))
            next_look = now + 0.25
        if now - start > args.seconds + 30:
            break  # against a hang: reported as not stopped
    writers_stopped = door.join()
    inserted, sampled = door.counters()
    door.close()
    target, error = args.target, door.limiter.error
    # Rows added before min_size go whatever the ratio: the learner starts behind and catches up. The band
    # holds from the first look at which it has (its credit within the error).
    caught = next((k for k, (_, i, s) in enumerate(trace) if i >= MIN_SIZE and i * target - s <= error), len(trace))
    after = trace[caught:]
    worst = max((abs(s / i - target) / target for _, i, s in after), default=float("nan"))
    return {
        "door": door.name, "inserted": inserted, "sampled": sampled, "ratio": sampled / max(inserted, 1),
        "deviation": abs(sampled / max(inserted, 1) - target) / target, "worst_running_deviation": worst,
        "caught_up_s": after[0][0] if after else float("nan"),
        "learner_stopped": learner_stopped_by is not None, "writers_stopped": writers_stopped,
        "seconds": time.monotonic() - start, "trace": trace,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--doors", nargs="+", default=["shared", "relaxed", "tianshou", "sharded"])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=16, help="rows per add (the Tianshou door adds 4 per step)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--target", type=float, default=4.0, help="samples per insert")
    parser.add_argument("--pause-ms", type=float, default=50.0)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    if "sharded" in args.doors:
        import ray

        ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.doors:
            limiter = RateLimiter(args.target, error=4 * args.batch, min_size=MIN_SIZE, timeout=2.0)
            result = run(Door(name, args, limiter, tmp), args)
            results.append(result)
            print(f"{name}: ratio {result['ratio']:.4f} (target {args.target:g}), inserted {result['inserted']}, "
                  f"worst running deviation {100 * result['worst_running_deviation']:.2f}%", flush=True)  # fmt: skip
    body = [
        [r["door"], f"{r['inserted']:,}", f"{r['sampled']:,}", f"{r['ratio']:.4f}", f"{100 * r['deviation']:.2f}%",
         f"{r['caught_up_s']:.1f}", f"{100 * r['worst_running_deviation']:.2f}%",
         "yes" if r["learner_stopped"] and r["writers_stopped"] else "NO"]
        for r in results
    ]  # fmt: skip
    lines = [
        "# Rate limiter: the samples-per-insert ratio under bursty writers, at every front door",
        "",
        f"`python benchmarks/bench_rate_limiter.py --seconds {args.seconds:g} --writers {args.writers}`; "
        f"{cpu_model()}, {os.cpu_count()} cores, git {git_revision()}, {time.strftime('%Y-%m-%d')}. "
        f"Target {args.target:g} samples per insert, error {4 * args.batch} (4 batches), min_size {MIN_SIZE}, timeout 2 s; "
        f"{args.writers} writers adding {args.chunk}-row chunks (Tianshou: steps of {ENVS} envs) in bursts of 1-30 "
        f"adds with pauses up to {args.pause_ms:g} ms, for {args.seconds:g} s; the learner samples B = {args.batch} "
        "and updates priorities as fast as the limiter lets it.",
        "",
        *table(
            [
                "door",
                "inserted",
                "sampled",
                "ratio",
                "deviation",
                "caught up at (s)",
                "worst running after",
                "both sides stopped",
            ],
            body,
        ),  # fmt: skip
        "",
        "*deviation*: |achieved - target| / target over the run. *Caught up at*: rows added before min_size go "
        "whatever the ratio, so the learner starts behind; the first look (every 0.25 s) at which its credit "
        "was within the error (Ray writer tasks start seconds late). *Worst running after*: the largest "
        "deviation of the ratio so far at any look from then on. *Both sides stopped*: the writers finished, "
        "then the learner's wait ended in RateLimited after the timeout (no deadlock).",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rate-limiter.md").write_text("\n".join(lines))
    (args.out / "rate-limiter.json").write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items() if k != "out"},
                                                            "results": results}, indent=1))  # fmt: skip
    print("\n".join(lines))
    if "sharded" in args.doors:
        import ray

        ray.shutdown()


if __name__ == "__main__":
    main()
