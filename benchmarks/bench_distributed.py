"""Distributed replay (issue 16): ShardedReplay on a local Ray instance, next to RLlib's buffers sharded as RLlib shards them.

    python benchmarks/bench_distributed.py            # full (~5 min on 2 cores) -> results/distributed.{json,md,png}
    python benchmarks/bench_distributed.py --quick    # smoke run (~1 min)      -> results/distributed-quick.*

Four parts, in one run:

1. **Throughput** for 1, 2, 4 shards with 1-4 writer processes (Ray actors
   holding a ``replay.writer()``, adding chunks of 64 transitions as fast as
   they can) while the learner samples B = 256 and updates B priorities:
   inserts/s, sampled transitions/s, redraws and inexact batches; the same
   for RLlib's ``PrioritizedReplayBuffer``, one Ray actor per shard, each
   sampled B/S (what RLlib's replay shards do). A few cells also run with
   ``stage_rows=0`` (writers' adds join a shard's tree at once, as before
   staging), to show what staging changes. Medians of interleaved repeats.
2. **Coordination overhead** per batch: the sharded learner step against a
   local ``PrioritizedReplay`` of the same total capacity, the bare Ray round
   trip (one actor, and S actors at once), a writer's stage call, each
   shard's own work (timed in-process: draw, update, stage, and a draw that
   takes staged rows in) and the learner's CPU per step.
3. **Sampling bias** with 4 shards whose priority masses differ 100x: the
   empirical distribution over (shard, slot) against the exact global
   ``p^alpha / sum p^alpha`` (chi-square, total variation) and the IS weights
   against the single-buffer formula, for ours and for RLlib-style per-shard
   sampling.
4. **Projection** to 8 and 64 nodes from the measured costs and stated
   network assumptions (the formula is in the report): batch time with the
   shards taking writers' rows in, each shard's busy share, and the insert
   rate the shards can take.

Results go to ``<out>/distributed[-quick].{json,md,png}``; the Markdown is printed.
See benchmarks/README.md.
"""

from __future__ import annotations

import os

# Before numpy, torch and Ray load; Ray's workers inherit this environment, so
# every shard and writer process runs its math on one thread too.
THREAD_ENV = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "HETERO_REPLAY_NUM_THREADS")
for _var in THREAD_ENV:
    os.environ.setdefault(_var, "1")

import argparse
import gc
import itertools
import json
import math
import platform
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import report
from timing import Task, calibrate
from tqdm import tqdm

import hetero_replay
from hetero_replay import PrioritizedReplay
from hetero_replay.distributed import INDEX_DTYPE, ReplayShard, ShardedReplay
from hetero_replay.distributed.cluster import find_shards

#: The transition every part uses: LunarLander-sized, 48 bytes a row.
SCHEMA: dict[str, tuple[tuple[int, ...], str]] = {
    "obs": ((8,), "float32"),
    "action": ((), "int64"),
    "reward": ((), "float32"),
    "done": ((), "float32"),
}
ROW_BYTES = 8 * 4 + 8 + 4 + 4
BATCH = 256
CHUNK = 64
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
#: Distinct chunks a writer cycles through, and |TD| arrays the learner cycles through.
POOL = 8
CONTENDERS = ("ours", "rllib")
#: Part 1: ours with ``stage_rows=0`` (every writer's add joins its shard's tree at once: the behaviour before
#: staging), run in these (shards, writers) cells next to the others.
UNSTAGED = "ours, stage_rows=0"
UNSTAGED_CELLS = ((2, 2), (4, 4))
#: Part 2: 64-row chunks staged on a shard before the timed draw that takes them in.
STAGED_CHUNKS = 16
#: Seconds between submitting a measurement's writers and its common start (they are already set up).
LEAD_S = 0.3
#: Part 3: the shards' priority masses (sum of p^alpha) relative to shard 0, and the batch drawn per call.
BIAS_MASSES = (1.0, 3.0, 10.0, 100.0)
BIAS_BATCH = 1024
#: Part 3: the chi-square groups consecutive (shard, slot) cells into bins of about this many expected draws.
BIN_EXPECTED = 20
#: Part 4: network assumptions (defaults of --rtt-us / --gbps) and the nodes projected.
RTT_US, GBPS = 50.0, 25.0
PROJECT_NODES = (8, 64)
PROJECT_LOADS = (0.0, 1e4, 1e5, 1e6)
VERSIONED = ("hetero-replay", "ray", "numpy", "scipy", "torch", "dm-tree")

FULL = {"shards": [1, 2, 4], "writers": [1, 2, 4], "capacity": 2**17, "repeats": 3, "seconds": 3.0,
        "overhead_repeats": 7, "min_time": 0.2, "draws": 2**18, "bias_capacity": 1024}  # fmt: skip
QUICK = {"shards": [1, 2, 4], "writers": [1, 4], "capacity": 2**14, "repeats": 1, "seconds": 1.0,
         "overhead_repeats": 3, "min_time": 0.05, "draws": 2**16, "bias_capacity": 512}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    warnings.filterwarnings("ignore")  # RLlib and Ray warn about deprecations on import
    import ray

    # address="local": a fresh instance of our own, even where another process left a cluster running here
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, namespace="hetero_replay",
             log_to_driver=False)  # fmt: skip
    # Here, not first in an actor: a missing RLlib fails at once, and torch (which it imports) gets pinned below.
    from ray.rllib.utils.replay_buffers.prioritized_replay_buffer import PrioritizedReplayBuffer  # noqa: F401

    torch_pinned = _pin_torch()
    hetero_replay.set_num_threads(1)
    results: dict[str, Any] = {"machine": machine_info(args, torch_pinned), "plan": _plan(args)}
    live: list[Any] = []
    try:
        helpers = start_helpers(max(max(args.writers), 8))
        contenders = build_contenders(args.shards, args.unstaged, args.capacity, helpers[: max(args.writers)], live)
        results["throughput"] = run_throughput(
            contenders, helpers, args.writers, args.unstaged, args.repeats, args.seconds
        )
        results["overhead"] = run_overhead(contenders, helpers, args.capacity, args.overhead_repeats, args.min_time)
        for c in contenders.values():
            c.close()
        live.clear()
        results["bias"] = run_bias(args.bias_capacity, args.draws)
        results["projection"] = project(results["overhead"], results["throughput"], args.rtt_us, args.gbps)
    finally:
        for c in live:
            c.close()
        ray.shutdown()
    results["machine"]["loadavg_end"] = os.getloadavg()
    paths = write(results, Path(args.out), args.name)
    print(paths["md"].read_text())
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--quick", action="store_true", help="small sizes, one short repeat (name 'distributed-quick')")
    add("--shards", type=int, nargs="+", help="shard counts of parts 1-2 (1 2 4)")
    add("--writers", type=int, nargs="+", help="writer processes of part 1 (1 2 4 / quick 1 4)")
    add("--capacity", type=float, help="total transitions held, split over the shards (2^17 / quick 2^14)")
    add("--repeats", type=int, help="interleaved repeats per throughput cell (3 / quick 1)")
    add("--seconds", type=float, help="seconds per throughput measurement (3 / quick 1)")
    add("--overhead-repeats", type=int, help="interleaved repeats per overhead task (7 / quick 3)")
    add("--min-time", type=float, help="seconds of back-to-back calls per overhead repeat (0.2 / quick 0.05)")
    add("--draws", type=int, help="transitions drawn per contender in the bias part (2^18 / quick 2^16)")
    add("--bias-capacity", type=int, help="transitions per shard in the bias part (1024 / quick 512)")
    add("--num-cpus", type=int, default=os.cpu_count() or 1, help="CPUs of the local Ray instance (all)")
    add("--rtt-us", type=float, default=RTT_US, help=f"projection: network round trip between nodes, us ({RTT_US:g})")
    add("--gbps", type=float, default=GBPS, help=f"projection: the learner's network bandwidth, Gb/s ({GBPS:g})")
    add("--out", default=str(Path(__file__).parent / "results"))
    add("--name", help="output <out>/<name>.{json,md,png} (distributed / distributed-quick)")
    args = parser.parse_args(argv)
    args.command = " ".join(["python", "benchmarks/bench_distributed.py", *map(shlex.quote, sys.argv[1:])])
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.capacity = int(args.capacity)
    for s in args.shards:
        if s < 1 or args.capacity % s or BATCH % s:
            raise SystemExit(f"--shards: {s} must divide the capacity ({args.capacity}) and B ({BATCH})")
    if min(args.writers) < 1:
        raise SystemExit("--writers: at least one writer per measurement")
    # The stage_rows=0 comparison runs in the cells of UNSTAGED_CELLS this run measures.
    args.unstaged = [(s, w) for s, w in UNSTAGED_CELLS if s in args.shards and w in args.writers]
    args.name = args.name or ("distributed-quick" if args.quick else "distributed")
    return args


def _pin_torch() -> bool:
    """One torch thread in this process, if anything imported torch (RLlib does); whether it did."""
    if "torch" not in sys.modules:
        return False
    sys.modules["torch"].set_num_threads(1)
    return True


def _plan(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("shards", "writers", "unstaged", "capacity", "repeats", "seconds", "overhead_repeats", "min_time", "draws",
            "bias_capacity", "num_cpus", "rtt_us", "gbps", "quick", "command")  # fmt: skip
    return {k: getattr(args, k) for k in keys} | {"batch": BATCH, "chunk": CHUNK, "alpha": ALPHA, "beta": BETA,
                                                    "eps": EPS}  # fmt: skip


def transitions(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``rows`` random transitions of :data:`SCHEMA`."""
    return {
        "obs": rng.random((rows, 8), dtype=np.float32),
        "action": rng.integers(0, 4, rows, dtype=np.int64),
        "reward": rng.random(rows, dtype=np.float32),
        "done": (rng.random(rows) < 0.05).astype(np.float32),
    }


def td_pool(seed: int = 0) -> list[np.ndarray]:
    """|N(0, 1)| TD errors of one batch, :data:`POOL` of them, for the learner to cycle through."""
    return [np.abs(np.random.default_rng([seed, i]).standard_normal(BATCH)).astype(np.float32) for i in range(POOL)]


# -- Ray actors of the benchmark: writer processes and the far end of a no-op round trip ----------


class Helper:
    """A process of the benchmark (a Ray actor): a writer adding chunks as fast as it can, or a no-op target.

    Args:
        slot: this helper's number; seeds its chunks.
    """

    def __init__(self, slot: int) -> None:
        self.pool = [transitions(CHUNK, np.random.default_rng([slot, i])) for i in range(POOL)]
        self.targets: dict[str, Any] = {}

    def noop(self) -> None:
        """Nothing: the round trip alone."""

    def prepare(self, key: str, target: Any) -> None:
        """Keep ``target`` (anything with ``add(batch)``) under ``key``; one add first (connecting, finding shards)."""
        target.add(self.pool[0])
        self.targets[key] = target

    def run(self, key: str, start_at: float, seconds: float) -> dict[str, float]:
        """Add chunks through ``targets[key]`` from wall-clock ``start_at`` for ``seconds``; rows and seconds."""
        add = self.targets[key].add
        end = start_at + seconds
        while (wait := start_at - time.time()) > 0:
            time.sleep(min(wait, 0.01))
        rows = 0
        for i in itertools.count():
            if time.time() >= end:
                break
            add(self.pool[i % POOL])
            rows += CHUNK
        return {"rows": rows, "seconds": time.time() - start_at}


def start_helpers(count: int) -> list[Any]:
    """``count`` helper actors (no CPU reserved: writers, shards and the learner share the cores), started."""
    import ray

    actor = ray.remote(num_cpus=0)(Helper)
    helpers = [actor.remote(i) for i in range(count)]
    ray.get([h.noop.remote() for h in helpers])
    return helpers


# -- the two sharded replays ----------------------------------------------------------------------


class Ours:
    """:class:`ShardedReplay` over ``num_shards`` shards: exact global PER (see its module docstring).

    Args:
        num_shards, capacity_per_shard, seed: as for :class:`ShardedReplay`.
        label: how the results name it (``"ours"``; :data:`UNSTAGED` with ``stage_rows=0``).
        options: more :class:`ShardedReplay` keywords (``stage_rows``, ``stratified``).
    """

    def __init__(
        self, num_shards: int, capacity_per_shard: int, seed: int = 0, label: str = "ours", **options: Any
    ) -> None:
        self.label = label
        self.num_shards = num_shards
        self.replay = ShardedReplay(num_shards, capacity_per_shard, SCHEMA, alpha=ALPHA, beta=BETA, eps=EPS,
                                    seed=seed, **options)  # fmt: skip

    def fill(self, batch: dict[str, np.ndarray]) -> None:
        """Add ``batch`` split evenly over the shards and wait for them (timed: :attr:`fill_seconds`)."""
        start = time.perf_counter()
        self.replay.add(batch)
        self.settle()
        self.fill_seconds = time.perf_counter() - start

    def writer(self) -> Any:
        return self.replay.writer()

    def step(self, td: np.ndarray) -> None:
        """One learner step: sample B, update their priorities (sent without waiting)."""
        batch = self.replay.sample(BATCH)
        self.replay.update_priorities(batch.indices, td)

    def settle(self) -> None:
        """Collect every reply still out (and have the shards take in writers' staged rows)."""
        self.replay.summaries  # noqa: B018 - the property collects pending replies and refreshes every shard

    def counters(self) -> dict[str, int]:
        return dict(self.replay.stats)

    def close(self) -> None:
        self.replay.close()


class RllibWriter:
    """Adds chunks to RLlib shard actors in turn, waiting for each (as a ``ShardWriter`` waits), picklable."""

    def __init__(self, shards: list[Any]) -> None:
        self.shards = shards
        self._turn = 0

    def add(self, batch: dict[str, np.ndarray]) -> int:
        import ray
        from ray.rllib.policy.sample_batch import SampleBatch

        shard = self.shards[self._turn]
        self._turn = (self._turn + 1) % len(self.shards)
        ray.get(shard.add.remote(SampleBatch(batch)))
        return len(batch["reward"])


class RllibShards:
    """RLlib's ``PrioritizedReplayBuffer``, one Ray actor per shard, sampled B/S from each shard.

    This is how RLlib shards prioritized replay (its replay actors each hold a
    ``capacity / num_shards`` buffer): every shard draws from its own sum tree
    and normalises IS weights by its own minimum priority and size.
    """

    label = "rllib"

    def __init__(self, num_shards: int, capacity_per_shard: int) -> None:
        import ray
        from ray.rllib.utils.replay_buffers.prioritized_replay_buffer import PrioritizedReplayBuffer

        self.num_shards = num_shards
        actor = ray.remote(num_cpus=0)(PrioritizedReplayBuffer)
        self.shards = [actor.remote(capacity=capacity_per_shard, alpha=ALPHA) for _ in range(num_shards)]
        self._pending: list[Any] = []

    def fill(self, batch: dict[str, np.ndarray]) -> None:
        """Add ``batch`` split evenly over the shards (row j of shard k's part lands in its slot j); timed."""
        import ray
        from ray.rllib.policy.sample_batch import SampleBatch

        start = time.perf_counter()
        parts = _split(batch, self.num_shards)
        ray.get([h.add.remote(SampleBatch(part)) for h, part in zip(self.shards, parts)])
        self.fill_seconds = time.perf_counter() - start  # the actors' start (imports) included

    def writer(self) -> RllibWriter:
        return RllibWriter(self.shards)

    def sample(self, batch_size: int, beta: float) -> list[Any]:
        """``batch_size / S`` from every shard (SampleBatches with ``weights`` and ``batch_indexes``)."""
        import ray

        self.settle()  # as ours: the previous step's priority updates land before the next draw
        n = batch_size // self.num_shards
        return ray.get([h.sample.remote(n, beta=beta) for h in self.shards])

    def step(self, td: np.ndarray) -> None:
        """One learner step: a batch from every shard, concatenated, then each shard's priorities (not waited for)."""
        from ray.rllib.policy.sample_batch import concat_samples

        parts = self.sample(BATCH, BETA)
        concat_samples(parts)  # the learner's train batch
        start = 0
        for h, part in zip(self.shards, parts):
            n = len(part["batch_indexes"])
            self._pending.append(h.update_priorities.remote(part["batch_indexes"], td[start : start + n] + EPS))
            start += n

    def settle(self) -> None:
        import ray

        pending, self._pending = self._pending, []
        ray.get(pending)

    def counters(self) -> dict[str, int]:
        return {}

    def close(self) -> None:
        import ray

        for h in self.shards:
            ray.kill(h, no_restart=True)
        self.shards = []


def _split(batch: dict[str, np.ndarray], parts: int) -> list[dict[str, np.ndarray]]:
    rows = len(next(iter(batch.values())))
    bounds = np.linspace(0, rows, parts + 1).astype(int)
    return [{k: v[bounds[j] : bounds[j + 1]] for k, v in batch.items()} for j in range(parts)]


def build_contenders(
    shard_counts: Sequence[int], unstaged: Sequence[tuple[int, int]], capacity: int, writers: list[Any],
    live: list[Any],
) -> dict[tuple[str, int], Any]:  # fmt: skip
    """Ours and RLlib's for every shard count (and ours with ``stage_rows=0`` at the shard counts of ``unstaged``).

    Each is filled to ``capacity`` in all, and every writer prepared for it.
    """
    import ray

    fill = transitions(capacity, np.random.default_rng(0))
    unstaged_shards = {s for s, _ in unstaged}
    contenders: dict[tuple[str, int], Any] = {}
    total = 2 * len(shard_counts) + len(unstaged_shards)
    with tqdm(total=total, desc="build", unit="replay", leave=False, disable=None) as bar:
        for s in shard_counts:
            built = [Ours(s, capacity // s), RllibShards(s, capacity // s)]
            if s in unstaged_shards:
                built.append(Ours(s, capacity // s, label=UNSTAGED, stage_rows=0))
            for c in built:
                live.append(c)
                c.fill(fill)
                ray.get([w.prepare.remote(f"{c.label}-{s}", c.writer()) for w in writers])
                contenders[(c.label, s)] = c
                bar.update()
    return contenders


# -- part 1: throughput with concurrent writers ------------------------------------------------------


def measure_throughput(contender: Any, writers: list[Any], seconds: float, tds: list[np.ndarray]) -> dict[str, Any]:
    """``writers`` add chunks while the learner steps, for ``seconds`` from a common start; rates and counters."""
    import ray

    contender.settle()
    before = contender.counters()
    start_at = time.time() + LEAD_S
    refs = [w.run.remote(f"{contender.label}-{contender.num_shards}", start_at, seconds) for w in writers]
    while (wait := start_at - time.time()) > 0:
        time.sleep(min(wait, 0.005))
    end, steps = start_at + seconds, 0
    t0 = time.perf_counter()
    while time.time() < end:
        contender.step(tds[steps % POOL])
        steps += 1
    elapsed = time.perf_counter() - t0
    runs = ray.get(refs)
    contender.settle()
    after = contender.counters()
    delta = {k: after[k] - before.get(k, 0) for k in after}
    return {
        "inserts_per_s": sum(r["rows"] / r["seconds"] for r in runs),
        "samples_per_s": steps * BATCH / elapsed,
        "steps": steps,
        "rows_inserted": sum(r["rows"] for r in runs),
        "seconds": elapsed,
        **delta,
    }


def run_throughput(
    contenders: dict[tuple[str, int], Any], helpers: list[Any], writer_counts: Sequence[int],
    unstaged: Sequence[tuple[int, int]], repeats: int, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    """Every (contender, shards, writers) cell ``repeats`` times, round-robin, each round one cell later.

    Ours and RLlib's run at every shard count and writer count; ours with
    ``stage_rows=0`` in the (shards, writers) cells of ``unstaged``.
    """
    tds = td_pool()
    cells = [(label, s, w) for (label, s) in contenders if label in CONTENDERS for w in writer_counts]
    cells += [(UNSTAGED, s, w) for s, w in unstaged]
    runs: dict[tuple[str, int, int], list[dict[str, Any]]] = {c: [] for c in cells}
    with tqdm(total=len(cells) * repeats, desc="throughput", unit="run", leave=False, disable=None) as bar:
        for r in range(repeats):
            start = r % len(cells)
            for label, s, w in cells[start:] + cells[:start]:
                bar.set_postfix_str(f"{label} {s} shards {w} writers")
                runs[(label, s, w)].append(measure_throughput(contenders[(label, s)], helpers[:w], seconds, tds))
                bar.update()
    out = []
    for label, s, w in cells:
        rs = runs[(label, s, w)]
        cell = {"label": label, "shards": s, "writers": w, "repeats": rs}
        for key in ("inserts_per_s", "samples_per_s"):
            cell[key] = float(np.median([x[key] for x in rs]))
        if label != "rllib":
            batches = sum(x["batches"] for x in rs)
            cell["redraws_per_batch"] = sum(x["redraws"] for x in rs) / max(batches, 1)
            cell["inexact_share"] = sum(x["inexact_batches"] for x in rs) / max(batches, 1)
            cell["batches"] = batches
            cell["stage_rows"] = contenders[(label, s)].replay.config.stage_rows
            # Writers' rows reaching one shard per learner batch: what it queues between the learner's calls (at most).
            cell["rows_per_shard_per_batch"] = cell["inserts_per_s"] / s * BATCH / cell["samples_per_s"]
        out.append(cell)
    fills = {f"{label}, S = {s}": c.fill_seconds for (label, s), c in contenders.items()}
    return {"batch": BATCH, "chunk": CHUNK, "repeats": repeats, "seconds": seconds, "cells": out, "fill_s": fills}


# -- part 2: coordination overhead ------------------------------------------------------------------


def _cycle(fn: Callable[[Any], Any], items: Sequence[Any]) -> Callable[[], Any]:
    """A no-argument call of ``fn`` on the next of ``items`` (round and round)."""
    it = itertools.cycle(items)
    return lambda: fn(next(it))


def shard_work_tasks(config: Any, n: int, staging: bool = True) -> list[Task]:
    """In-process :class:`ReplayShard` calls, as a shard actor runs them, each on its own full shard.

    *draw* ``n`` offsets (that shard's tree stays as filled); *update* ``n``
    priorities; with ``staging``, also *stage* one chunk (a writer's add,
    queued only: that shard's queue never overflows) and *stage + draw*:
    :data:`STAGED_CHUNKS` chunks staged, then a draw of ``n``, which serves
    and then takes the staged rows into its tree, as a learner's draw does.

    Args:
        config: a ShardedReplay's shard config (capacity, schema, options).
        n: offsets drawn and priorities updated per call.
        staging: add the two staging tasks.
    """
    from hetero_replay.distributed.wire import updates_by_shard  # (here: bench_distributed_scaling runs older code)

    rng = np.random.default_rng(1)

    def full_shard(k: int, **changes: Any) -> ReplayShard:
        shard = ReplayShard(k, replace(config, **changes))
        shard.add(transitions(config.capacity, rng), 1.0)
        return shard

    drawn, updated = full_shard(0), full_shard(1)
    total = drawn.replay.tree.total()
    offsets = [(rng.random(n) * total).tobytes() for _ in range(POOL)]  # as the learner sends them (wire)
    epochs, incarnations = np.full(n, updated.replay.write_epoch, np.int64), np.full(n, updated.incarnation, np.int64)
    entries = [  # the update entries as the learner sends them (wire)
        updates_by_shard(np.zeros(n, np.int64), rng.integers(0, config.capacity, n), epochs, incarnations,
                         np.abs(rng.standard_normal(n)), 1)[0]
        for _ in range(POOL)
    ]  # fmt: skip

    def draw(o: bytes) -> Any:
        return drawn.draw((o, drawn.incarnation, drawn.version, total, False))

    def update(i: int) -> Any:
        return updated.update(entries[i], 1.0)

    nothing = lambda: None  # noqa: E731
    size = config.capacity
    tasks = [
        Task({"op": "shard draw", "rows": n, "shard_size": size}, _cycle(draw, offsets), nothing),
        Task({"op": "shard update", "rows": n, "shard_size": size}, _cycle(update, range(POOL)), nothing),
    ]
    if not staging:
        return tasks
    chunks = [transitions(CHUNK, rng) for _ in range(POOL)]
    stager = full_shard(2, stage_rows=2**40)
    intake = full_shard(3, stage_rows=STAGED_CHUNKS * CHUNK)  # holds the chunks without taking them in unasked

    def stage_then_draw(o: bytes) -> Any:
        for i in range(STAGED_CHUNKS):
            intake.stage(chunks[i % POOL], 1.0)
        return intake.draw((o, intake.incarnation, intake.version, intake.replay.tree.total(), False))

    staged = STAGED_CHUNKS * CHUNK
    return tasks + [
        Task(
            {"op": "shard stage", "rows": CHUNK, "shard_size": size},
            _cycle(partial(stager.stage, max_priority=1.0), chunks),
            nothing,
        ),  # fmt: skip
        Task(
            {"op": "shard stage + draw", "rows": n, "staged": staged, "shard_size": size},
            _cycle(stage_then_draw, offsets),
            nothing,
        ),  # fmt: skip
    ]


def process_cpu(actor: Any) -> float:
    """CPU seconds of the process running ``actor`` so far (called through ``__ray_call__``)."""
    return time.process_time()


def remote_cpu(handles: Sequence[Any]) -> float:
    """CPU seconds of the actor processes behind ``handles``, summed."""
    import ray

    return float(sum(ray.get([h.__ray_call__.remote(process_cpu) for h in handles]))) if handles else 0.0


def run_overhead(
    contenders: dict[tuple[str, int], Any], helpers: list[Any], capacity: int, repeats: int, min_time: float
) -> dict[str, Any]:
    """Learner steps without writers, a local replay, Ray round trips, a writer's stage call and shard work.

    Timed round-robin. Every task also records, per call, the learner
    process's CPU time (``time.process_time``, Ray's client threads included)
    and the CPU time of the actor processes it calls (shards, RLlib buffers,
    no-op targets; read before and after each repeat): where a batch's time goes.
    """
    import ray

    tds = td_pool(1)
    nothing = lambda: None  # noqa: E731
    tasks: list[Task] = []
    remote: dict[int, Sequence[Any]] = {}  # task -> the actors it calls
    shard_counts = sorted({s for _, s in contenders})
    for (label, s), c in contenders.items():
        if label not in CONTENDERS:  # without writers, stage_rows changes nothing
            continue
        c.settle()
        task = Task({"op": f"{label} step", "shards": s}, _cycle(c.step, tds), nothing)
        remote[id(task)] = find_shards(c.replay.name) if label == "ours" else c.shards
        tasks.append(task)
    local = PrioritizedReplay(capacity, SCHEMA, alpha=ALPHA, beta=BETA, eps=EPS, seed=0)
    local.add(transitions(capacity, np.random.default_rng(0)))

    def local_step(td: np.ndarray) -> None:
        batch = local.sample(BATCH)
        local.update_priorities(batch.indices, td)

    tasks.append(Task({"op": "local step", "shards": 0}, _cycle(local_step, tds), nothing))
    for s in sorted({1, 2, 4, 8, *shard_counts} & set(range(1, len(helpers) + 1))):
        targets = helpers[:s]
        task = Task({"op": "no-op fan-out", "shards": s}, lambda t=targets: ray.get([h.noop.remote() for h in t]),
                    nothing)  # fmt: skip
        remote[id(task)] = targets
        tasks.append(task)
    # A writer's add, from this process, to a shard whose queue never overflows (so every call only stages).
    stager = ShardedReplay(1, CHUNK, SCHEMA, alpha=ALPHA, beta=BETA, eps=EPS, stage_rows=2**40)
    chunks = [transitions(CHUNK, np.random.default_rng([2, i])) for i in range(POOL)]
    task = Task({"op": "writer stage call", "rows": CHUNK}, _cycle(stager.writer().add, chunks), nothing)
    remote[id(task)] = find_shards(stager.name)
    tasks.append(task)
    # Each shard's own work at this run's shard sizes; the smallest shards also at the projected B/S.
    for s in shard_counts:
        tasks += shard_work_tasks(contenders[("ours", s)].replay.config, BATCH // s)
    smallest = contenders[("ours", max(shard_counts))].replay.config
    for nodes in PROJECT_NODES:
        tasks += shard_work_tasks(smallest, BATCH // nodes, staging=False)

    cpu: dict[int, list[float]] = {id(t): [] for t in tasks}
    far: dict[int, list[float]] = {id(t): [] for t in tasks}
    gc.collect()
    gc.freeze()  # the collector then does not rescan torch's and Ray's objects during the repeats
    try:
        with tqdm(total=len(tasks) * (repeats + 1), desc="overhead", unit="task", leave=False, disable=None) as bar:
            for t in tasks:
                calibrate(t, min_time)
                bar.update()
            for r in range(repeats):
                start = r % len(tasks)
                for t in tasks[start:] + tasks[:start]:
                    handles = remote.get(id(t), ())
                    r0, c0 = remote_cpu(handles), time.process_time()
                    t.times.append(t.run(t.number) / t.number)
                    c1, r1 = time.process_time(), remote_cpu(handles)
                    cpu[id(t)].append((c1 - c0) / t.number)
                    far[id(t)].append((r1 - r0) / t.number)
                    bar.update()
    finally:
        gc.unfreeze()
        stager.close()
    for c in contenders.values():
        c.settle()
    rows = [
        t.summary() | {"cpu_median_s": float(np.median(cpu[id(t)]))}
        | ({"remote_cpu_median_s": float(np.median(far[id(t)]))} if id(t) in remote else {})
        for t in tasks
    ]  # fmt: skip
    return {"batch": BATCH, "capacity": capacity, "repeats": repeats, "min_time": min_time, "cores": os.cpu_count(),
            "tasks": rows, "derived": decompose(rows, shard_counts, capacity)}  # fmt: skip


def _find(tasks: list[dict[str, Any]], **key: Any) -> dict[str, Any]:
    """The first timed task whose key has these values."""
    return next(t for t in tasks if all(t.get(k) == v for k, v in key.items()))


def decompose(rows: list[dict[str, Any]], shard_counts: Sequence[int], capacity: int) -> dict[str, Any]:
    """Per shard count: ours' step split into round trips, shard work, learner work and the rest.

    A learner step is two rounds of S calls (the updates, whose replies the
    next sample collects, and the draws), so ``step = 2 x no-op fan-out(S)``
    (the bare round trips) ``+ shard work`` (a shard process's CPU per step
    beyond two no-op calls, on the critical path: ``ceil(S / cores)`` shards
    deep on this machine) ``+ learner work`` (the learner's CPU per step beyond
    two no-op fan-outs: routing, assembly, checks, payloads) ``+ rest``
    (waiting, scheduling; negative where things overlapped). The overhead is
    ``step - local step``. Also per shard count: the take-in of one staged
    chunk inside a draw (``(stage + draw - k stages - draw) / k``); and a
    writer's stage call: its round trip and the shard's CPU per call.
    """
    cores = os.cpu_count() or 1
    local = _find(rows, op="local step")
    fan = {r["shards"]: r for r in rows if r["op"] == "no-op fan-out"}
    noop_actor = fan[1]["remote_cpu_median_s"]
    per_shard = []
    for s in shard_counts:
        step = _find(rows, op="ours step", shards=s)
        rllib = _find(rows, op="rllib step", shards=s)
        size = capacity // s
        draw = _find(rows, op="shard draw", rows=BATCH // s, shard_size=size)["median_s"]
        update = _find(rows, op="shard update", rows=BATCH // s, shard_size=size)["median_s"]
        stage = _find(rows, op="shard stage", shard_size=size)["median_s"]
        stage_draw = _find(rows, op="shard stage + draw", rows=BATCH // s, shard_size=size)["median_s"]
        trips = 2 * fan[s]["median_s"]
        shard_cpu = step["remote_cpu_median_s"] / s  # one shard's CPU per step
        work = math.ceil(s / cores) * (shard_cpu - 2 * noop_actor)
        learner = step["cpu_median_s"] - 2 * fan[s]["cpu_median_s"]
        overhead = step["median_s"] - local["median_s"]
        per_shard.append({
            "shards": s, "step_s": step["median_s"], "local_step_s": local["median_s"], "overhead_s": overhead,
            "round_trips_s": trips, "shard_cpu_s": shard_cpu, "shard_work_s": work, "shard_draw_s": draw,
            "shard_update_s": update, "shard_stage_s": stage,
            "take_in_chunk_s": (stage_draw - STAGED_CHUNKS * stage - draw) / STAGED_CHUNKS,
            "learner_cpu_s": step["cpu_median_s"], "learner_own_s": learner,
            "rest_s": step["median_s"] - trips - work - learner,
            "rllib_step_s": rllib["median_s"], "rllib_learner_cpu_s": rllib["cpu_median_s"],
            "rllib_shard_cpu_s": rllib["remote_cpu_median_s"] / s,
        })  # fmt: skip
    fan_s = sorted(fan)
    counts = [p["shards"] for p in per_shard]
    fit = np.polyfit(counts, [p["learner_cpu_s"] for p in per_shard], 1) if len(counts) > 1 else (0.0, 0.0)
    one = per_shard[0] if per_shard[0]["shards"] == 1 else None
    stage_call = _find(rows, op="writer stage call")
    return {
        "per_shards": per_shard,
        "noop_rtt_s": fan[1]["median_s"],
        "noop_learner_cpu_s": fan[1]["cpu_median_s"],
        "noop_actor_cpu_s": noop_actor,
        "fanout_wall_per_call_s": float(np.polyfit(fan_s, [fan[s]["median_s"] for s in fan_s], 1)[0]),
        "fanout_cpu_per_call_s": float(np.polyfit(fan_s, [fan[s]["cpu_median_s"] for s in fan_s], 1)[0]),
        "learner_cpu_per_shard_s": float(fit[0]),
        "learner_cpu_base_s": float(fit[1]),
        # A shard's CPU per call beyond a no-op's and its replay work (payloads), from one shard alone.
        "shard_call_cpu_s": (
            (one["shard_cpu_s"] - one["shard_draw_s"] - one["shard_update_s"]) / 2 - noop_actor if one else 0.0
        ),
        "local_step_s": local["median_s"],
        "stage_call_s": stage_call["median_s"],
        "stage_call_writer_cpu_s": stage_call["cpu_median_s"],
        "stage_call_shard_cpu_s": stage_call["remote_cpu_median_s"],
    }


# -- part 3: sampling bias with unequal shard masses ---------------------------------------------------


def bias_priorities(num_shards: int, capacity: int, seed: int = 7) -> np.ndarray:
    """``p^alpha`` per (shard, slot): shard k's mass ``BIAS_MASSES[k]`` x lognormal(0, 0.5) spread within it."""
    rng = np.random.default_rng(seed)
    spread = rng.lognormal(0.0, 0.5, (num_shards, capacity))
    return np.asarray(BIAS_MASSES[:num_shards])[:, None] * spread / spread.mean(axis=1, keepdims=True)


def draw_ours(pa: np.ndarray, draws: int, stratified: bool) -> dict[str, Any]:
    """Counts per (shard, slot) and sampled IS weights from a ShardedReplay holding priorities ``pa``.

    The priorities are set through ``update_priorities`` with indices built for
    every slot: each shard's incarnation and write epoch are read off one
    sample taken after the fill (all slots were written before it, so none is
    dropped as stale).
    """
    num_shards, capacity = pa.shape
    ours = Ours(num_shards, capacity, seed=3, stratified=stratified)
    try:
        ours.fill(transitions(num_shards * capacity, np.random.default_rng(5)))
        probe = ours.replay.sample(BIAS_BATCH).indices  # equal priorities: every shard serves B/S of it
        index = np.empty(pa.size, INDEX_DTYPE)
        index["shard"] = np.repeat(np.arange(num_shards), capacity)
        index["slot"] = np.tile(np.arange(capacity), num_shards)
        for k in range(num_shards):
            mine = probe[probe["shard"] == k][0]
            index["incarnation"][index["shard"] == k] = mine["incarnation"]
            index["epoch"][index["shard"] == k] = mine["epoch"]
        ours.replay.update_priorities(index, pa.reshape(-1) ** (1 / ALPHA) - EPS)
        totals = np.array([s.total for s in ours.replay.summaries])
        if not np.allclose(totals, pa.sum(axis=1), rtol=1e-4):
            raise RuntimeError(f"priorities were not applied: shard totals {totals}, wanted {pa.sum(axis=1)}")
        weights: list[np.ndarray] = []
        cells: list[np.ndarray] = []
        before = ours.counters()
        for _ in range(draws // BIAS_BATCH):
            s = ours.replay.sample(BIAS_BATCH, beta=BETA)
            cell = s.indices["shard"].astype(np.int64) * capacity + s.indices["slot"]
            cells.append(cell)
            weights.append(s.weights)
        after = ours.counters()
    finally:
        ours.close()
    cell = np.concatenate(cells)
    return {"counts": np.bincount(cell, minlength=pa.size), "cells": cell, "weights": np.concatenate(weights),
            "redraws": after["redraws"] - before["redraws"]}  # fmt: skip


def draw_rllib(pa: np.ndarray, draws: int) -> dict[str, Any]:
    """Counts and IS weights from RLlib buffers (one actor per shard) holding ``pa``, each sampled B/S a call."""
    import ray

    num_shards, capacity = pa.shape
    rl = RllibShards(num_shards, capacity)
    try:
        rl.fill(transitions(num_shards * capacity, np.random.default_rng(5)))
        # RLlib keeps p ** alpha of the priority it is given; row j of a shard's fill is its index j.
        ray.get([h.update_priorities.remote(np.arange(capacity), pa[k] ** (1 / ALPHA))
                 for k, h in enumerate(rl.shards)])  # fmt: skip
        totals = np.array(ray.get([h.__ray_call__.remote(lambda b: b._it_sum.sum()) for h in rl.shards]))
        if not np.allclose(totals, pa.sum(axis=1), rtol=1e-9):
            raise RuntimeError(f"priorities were not applied: shard totals {totals}, wanted {pa.sum(axis=1)}")
        cells, weights = [], []
        for _ in range(draws // BIAS_BATCH):
            for k, part in enumerate(rl.sample(BIAS_BATCH, BETA)):
                cells.append(k * capacity + np.asarray(part["batch_indexes"], np.int64))
                weights.append(np.asarray(part["weights"], np.float64))
    finally:
        rl.close()
    cell = np.concatenate(cells)
    return {"counts": np.bincount(cell, minlength=pa.size), "cells": cell, "weights": np.concatenate(weights)}


def equal_mass_bins(p: np.ndarray, draws: int) -> np.ndarray:
    """Bin number per cell: consecutive cells grouped to about :data:`BIN_EXPECTED` expected draws, none under 5."""
    target = BIN_EXPECTED / draws
    bins = np.empty(p.size, np.int64)
    b, acc = 0, 0.0
    for i, q in enumerate(p):
        bins[i] = b
        acc += q
        if acc >= target:
            b, acc = b + 1, 0.0
    if acc * draws < 5 and b > 0:  # a short last bin joins the one before
        bins[bins == b] = b - 1
    return bins


def bias_stats(p: np.ndarray, w_exact: np.ndarray, got: dict[str, Any], num_shards: int) -> dict[str, Any]:
    """Chi-square (binned cells, and shards), total variation, per-shard shares and IS-weight errors of one sampler."""
    from scipy.stats import chisquare

    counts = got["counts"]
    n = int(counts.sum())
    bins = equal_mass_bins(p, n)
    obs, exp = np.bincount(bins, counts), np.bincount(bins, p) * n
    shard_obs = counts.reshape(num_shards, -1).sum(axis=1)
    shard_exp = p.reshape(num_shards, -1).sum(axis=1) * n
    w = got["weights"]
    rel = np.abs(w - w_exact[got["cells"]]) / w_exact[got["cells"]]
    return {
        "draws": n,
        "bins": int(bins.max() + 1),
        "min_expected": float(exp.min()),
        "chi2_cells": float(chisquare(obs, exp).statistic),
        "p_cells": float(chisquare(obs, exp).pvalue),
        "chi2_shards": float(chisquare(shard_obs, shard_exp).statistic),
        "p_shards": float(chisquare(shard_obs, shard_exp).pvalue),
        "tv_cells": float(0.5 * np.abs(counts / n - p).sum()),
        "tv_binned": float(0.5 * np.abs(obs / n - exp / n).sum()),
        "tv_shards": float(0.5 * np.abs(shard_obs / n - shard_exp / n).sum()),
        "shard_share": (shard_obs / n).tolist(),
        "weight_max_rel_error": float(rel.max()),
        "weight_mean_rel_error": float(rel.mean()),
    }


def run_bias(capacity: int, draws: int, num_shards: int = 4) -> dict[str, Any]:
    """Part 3: ours (stratified, and i.i.d. draws) and RLlib-style shards against the exact global law."""
    pa = bias_priorities(num_shards, capacity)
    p = (pa / pa.sum()).reshape(-1)
    w_exact = (pa.min() / pa).reshape(-1) ** BETA  # (N P(i))^-beta / max_j (N P(j))^-beta
    draws = draws // BIAS_BATCH * BIAS_BATCH
    samplers: dict[str, Callable[[], dict[str, Any]]] = {
        "ours": lambda: draw_ours(pa, draws, stratified=True),
        "ours (i.i.d.)": lambda: draw_ours(pa, draws, stratified=False),
        "rllib": lambda: draw_rllib(pa, draws),
    }
    out: dict[str, Any] = {}
    for label, fn in tqdm(samplers.items(), desc="bias", unit="sampler", leave=False, disable=None):
        got = fn()
        out[label] = bias_stats(p, w_exact, got, num_shards) | ({"redraws": got["redraws"]} if "redraws" in got else {})
    # An exact i.i.d. sampler's figures at the same number of draws: the noise floor of TV and chi-square.
    reference = np.random.default_rng(11).multinomial(draws, p)
    ref = {"counts": reference, "cells": np.flatnonzero(reference), "weights": w_exact[np.flatnonzero(reference)]}
    out["exact i.i.d. (reference)"] = bias_stats(p, w_exact, ref, num_shards)
    return {"shards": num_shards, "capacity_per_shard": capacity, "draws": draws, "batch": BIAS_BATCH,
            "masses": list(BIAS_MASSES[:num_shards]), "exact_shard_share": (pa.sum(axis=1) / pa.sum()).tolist(),
            "samplers": out}  # fmt: skip


# -- part 4: projection to many nodes --------------------------------------------------------------


def model_batch(
    nodes: int, inserts_per_s: float, m: dict[str, float], rtt_s: float, bytes_per_s: float, stage_rows: int
) -> dict[str, Any]:
    """One learner batch over ``nodes`` shards (one per node) while writers add ``inserts_per_s``; see :func:`project`."""
    draw_bytes = BATCH * (ROW_BYTES + 8 + 4 + 8)  # rows, slots, priorities, and the offsets sent
    update_bytes = BATCH * 24  # slots, epochs, TD errors
    call = rtt_s + m["noop_rtt_s"] + m["shard_call_cpu_s"]
    half = m["learner_cpu_per_shard_s"] / 2 * nodes  # the learner's per-shard CPU, one of two rounds
    update_round = call + m["update_s"] + half + update_bytes / bytes_per_s
    draw_round = call + m["draw_s"] + m["learner_base_s"] + half + draw_bytes / bytes_per_s
    per_shard = inserts_per_s / nodes  # writers' rows/s into each shard
    intake = per_shard * m["take_in_row_s"]  # the share of time a shard takes rows in, inside the learner's calls
    batch = (update_round + draw_round) / (1 - intake) if intake < 1 else math.inf
    busy = per_shard / CHUNK * m["stage_call_cpu_s"] + intake + learner_serving(m) / batch
    queued = per_shard * batch
    return {"nodes": nodes, "inserts_per_s": inserts_per_s, "draw_round_s": draw_round,
            "update_round_s": update_round, "rows_per_shard_per_batch": queued,
            "take_in_s": queued * m["take_in_row_s"], "batch_s": batch, "samples_per_s": BATCH / batch,
            "shard_busy": busy, "overflow": queued > stage_rows}  # fmt: skip


def learner_serving(m: dict[str, float]) -> float:
    """A shard's CPU per learner batch, take-in aside: a draw and an update call (Ray's share, payloads, replay work)."""
    return 2 * (m["noop_actor_cpu_s"] + m["shard_call_cpu_s"]) + m["draw_s"] + m["update_s"]


def shard_insert_limit(
    nodes: int, m: dict[str, float], rtt_s: float, bytes_per_s: float, stage_rows: int
) -> dict[str, float]:
    """Aggregate inserts/s at which each shard is busy all the time (``rho = 1``), the writers that takes, and
    the inserts/s from which a shard's queue overflows between the learner's batches (``x T = stage_rows``).

    Both are in closed form: ``rho(x) = F / T0 + x * (c_stage / 64 + t_in * (1 - F / T0))``
    is linear in the rows per shard and second ``x`` (``T = T0 / (1 - x t_in)``,
    ``T0`` the batch without writers, ``F`` the learner's calls' shard CPU per
    batch), and ``x T = stage_rows`` at ``x = stage_rows / (T0 + stage_rows t_in)``.
    """
    t0 = model_batch(nodes, 0.0, m, rtt_s, bytes_per_s, stage_rows)["batch_s"]
    spare = 1 - learner_serving(m) / t0
    per_shard = spare / (m["stage_call_cpu_s"] / CHUNK + m["take_in_row_s"] * spare)
    writer_rate = CHUNK / (rtt_s + m["stage_call_s"])
    return {"inserts_per_s": nodes * per_shard, "writer_rows_per_s": writer_rate,
            "writers_needed": nodes * per_shard / writer_rate,
            "overflow_inserts_per_s": nodes * stage_rows / (t0 + stage_rows * m["take_in_row_s"])}  # fmt: skip


def project(overhead: dict[str, Any], throughput: dict[str, Any], rtt_us: float, gbps: float) -> dict[str, Any]:
    """Part 4: samples/s, shard load and insert limit at 8 and 64 nodes from this machine's measured costs.

    Model (one shard per node, the learner on its own node; times per batch of B)::

        update round U = RTT + r + o + t_update(B/S) + k/2 * S + 24 B / BW
        draw round   D = RTT + r + o + t_draw(B/S) + L + k/2 * S + (48 + 20) B / BW
        rows per shard and second  x = inserts/s / S
        batch        T = U + D + x T t_in = (U + D) / (1 - x t_in),     samples/s = B / T
        shard busy   rho = x / 64 * c_stage + x t_in + (2 (a + o) + t_draw + t_update) / T   (must stay < 1)
        redraws ~ 0 while x T <= stage_rows

    RTT: the network round trip (assumed); r: a bare Ray round trip (measured
    with no-op calls: both ends' Ray software); a: a no-op call's actor CPU;
    o: a shard's CPU per call beyond a no-op's and its replay work (payloads;
    measured with one shard); t_draw, t_update: one shard's replay work for
    B/S rows (measured in-process); L + k S: the learner's CPU per batch beyond
    the two no-op calls r already holds (measured, a linear fit over S; k covers
    two calls per shard, one per round); BW: the learner's network bandwidth
    (assumed). Writers: a shard queues their rows and takes the x T rows of a
    batch into its tree inside the learner's calls, at t_in per row (measured
    in-process); each of their stage calls costs the shard c_stage of CPU
    (measured through Ray), served one at a time with the learner's calls: the
    shard's busy share rho bounds the inserts. A shard changes unannounced only
    when more than stage_rows rows wait (x T is at most what queues between two
    of the learner's calls to it), so below that no batch is redrawn.
    """
    d = overhead["derived"]
    largest = max(p["shards"] for p in d["per_shards"])
    size = overhead["capacity"] // largest  # the smallest shards measured
    rows = overhead["tasks"]
    finest = next(p for p in d["per_shards"] if p["shards"] == largest)

    def work(op: str, n: int) -> float:
        return _find(rows, op=op, rows=n, shard_size=size)["median_s"]

    base = {"noop_rtt_s": d["noop_rtt_s"], "noop_actor_cpu_s": d["noop_actor_cpu_s"],
            "shard_call_cpu_s": d["shard_call_cpu_s"], "learner_cpu_per_shard_s": d["learner_cpu_per_shard_s"],
            "learner_base_s": d["learner_cpu_base_s"] - 2 * d["noop_learner_cpu_s"],
            "take_in_row_s": finest["take_in_chunk_s"] / CHUNK, "stage_call_cpu_s": d["stage_call_shard_cpu_s"],
            "stage_call_s": d["stage_call_s"]}  # fmt: skip
    stage_rows = next(c["stage_rows"] for c in throughput["cells"] if c["label"] == "ours")
    rtt, bw = rtt_us * 1e-6, gbps * 1e9 / 8
    projected = []
    for nodes in PROJECT_NODES:
        m = base | {"draw_s": work("shard draw", BATCH // nodes), "update_s": work("shard update", BATCH // nodes)}
        limit = shard_insert_limit(nodes, m, rtt, bw, stage_rows)
        for load in sorted((*PROJECT_LOADS, limit["inserts_per_s"])):
            row = model_batch(nodes, load, m, rtt, bw, stage_rows)
            projected.append(row | {"shard_limit": limit, "max_load": load not in PROJECT_LOADS})
    # The model on this machine (no network, no writers, every shard on these cores) against what was measured.
    checks = []
    for p in d["per_shards"]:
        m = base | {"draw_s": p["shard_draw_s"], "update_s": p["shard_update_s"]}
        checks.append({"shards": p["shards"], "measured_s": p["step_s"],
                       "model_s": model_batch(p["shards"], 0.0, m, 0.0, math.inf, stage_rows)["batch_s"]})  # fmt: skip
    staged = [c for c in throughput["cells"] if c["label"] == "ours"]
    staging_check = {
        "stage_rows": stage_rows,
        "max_rows_per_shard_per_batch": max(c["rows_per_shard_per_batch"] for c in staged),
        "redraws_per_batch": sum(c["redraws_per_batch"] * c["batches"] for c in staged)
        / max(sum(c["batches"] for c in staged), 1),
        "max_redraws_per_batch": max(c["redraws_per_batch"] for c in staged),
        "max_inexact_share": max(c["inexact_share"] for c in staged),
    }
    return {"rtt_us": rtt_us, "gbps": gbps, "shard_size": size, "stage_rows": stage_rows, "measured": base,
            "rows": projected, "local_check": checks, "staging_check": staging_check,
            "formula": project.__doc__}  # fmt: skip


# -- machine, outputs --------------------------------------------------------------------------------


def machine_info(args: argparse.Namespace, torch_pinned: bool) -> dict[str, Any]:
    """CPU, cores, memory, versions, git revision, thread settings, load average."""
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": report.cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": report.memory_gib(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {pkg: report.package_version(pkg) for pkg in VERSIONED},
        "git": report.git_revision(),
        "ray_num_cpus": args.num_cpus,
        "torch_threads": 1 if torch_pinned else None,
        "thread_env": {v: os.environ.get(v) for v in THREAD_ENV},
        "loadavg_start": os.getloadavg(),
    }


def write(results: dict[str, Any], out: Path, name: str) -> dict[str, Path]:
    """``<name>.json``, ``.md`` and ``.png`` (no ``png`` without matplotlib); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(results, indent=1, default=_json) + "\n")
    if not plot(results, paths["png"]):
        del paths["png"]
    paths["md"].write_text(markdown(results, paths.get("png")))
    return paths


def _json(x: Any) -> Any:
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON: {type(x).__name__}")


def _us(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1e6:,.0f}"


def markdown(results: dict[str, Any], png: Path | None = None) -> str:
    """The readable report: machine and method, then the four parts."""
    m, plan = results["machine"], results["plan"]
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    threads = {k: v for k, v in m["thread_env"].items() if v is not None}
    lines = [
        "# Distributed replay: ShardedReplay on Ray vs RLlib-style sharded PER",
        "",
        f"- **Command:** `{plan['command']}`",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; {m['os']}; 1-min load average "
        f"{m['loadavg_start'][0]:.2f} at start, {m.get('loadavg_end', [float('nan')])[0]:.2f} at end",
        f"- **Run:** {m['date']}, git {m['git']}; Python {m['python']}; {versions}",
        f"- **Ray:** one local instance, `ray.init(num_cpus={m['ray_num_cpus']})`; shards, writers and RLlib's "
        "buffers are actors reserving no CPU, so the learner, the shards and the writers all share these cores "
        "(a shard's or a writer's process is not a separate machine: absolute rates here are a lower bound).",
        f"- **Threads:** torch {m['torch_threads'] or 'not imported'} (`torch.set_num_threads(1)` in the learner: "
        f"RLlib imports torch); environment {threads} in every process (Ray's workers inherit it).",
        f"- **Workload:** transitions obs float32 (8,), action int64, reward float32, done float32 ({ROW_BYTES} B); "
        f"alpha {ALPHA}, beta {BETA}, eps {EPS}; learner batch B = {BATCH}; writers add chunks of {CHUNK}.",
    ]
    if png is not None:
        lines += ["", f"![throughput and bias]({png.name})"]
    lines += _throughput_md(results["throughput"], plan)
    lines += _overhead_md(results["overhead"])
    lines += _bias_md(results["bias"])
    lines += _projection_md(results["projection"])
    return "\n".join(lines) + "\n"


def _throughput_md(t: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    cell = {(c["label"], c["shards"], c["writers"]): c for c in t["cells"]}
    stage_rows = next(c["stage_rows"] for c in t["cells"] if c["label"] == "ours")
    lines = [
        "",
        "## 1. Throughput vs shards, writers adding concurrently",
        "",
        f"{plan['capacity']:,} transitions in all, split over S shards (full: inserts overwrite). W writer processes "
        f"(Ray actors) add chunks of {CHUNK} as fast as they can, each waiting for its add's reply: ours through "
        "`replay.writer()` (a `ShardWriter`, least-full policy), RLlib's through `shard.add.remote(SampleBatch)` "
        f"to the shards in turn. Meanwhile the learner samples B = {BATCH} and updates B priorities: ours "
        f"`replay.sample` + `replay.update_priorities`; RLlib-style: `sample.remote(B/S, beta)` on every shard, "
        "`concat_samples`, then `update_priorities.remote(idx, |td| + eps)` per shard. Both send the updates without "
        "waiting and collect the replies before the next draw. Median of "
        f"{t['repeats']} interleaved repeats of {t['seconds']} s. Ours stages writers' rows: a shard queues them "
        "and takes them into its tree during the learner's next call to it (after serving a draw, or with an "
        "update), whose reply carries the new summary, so writers do not make the learner's draws stale; their "
        "rows become sampleable one learner call later. *redraws/batch* and *inexact*: ours' `stats` over all "
        "repeats. A batch is redrawn only when a shard changed unannounced: its queue overflowed (more than "
        f"`stage_rows` = {stage_rows:,} rows waiting), it restarted, or another learner used it; after 8 redraws "
        "it is served rescaled (exact within each shard, the split one reply old): *inexact*.",
        "",
        "| S | W | ours inserts/s | RLlib inserts/s | × | ours samples/s | RLlib samples/s | × | ours redraws/batch "
        "| ours inexact |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in plan["shards"]:
        for w in plan["writers"]:
            o, r = cell[("ours", s, w)], cell[("rllib", s, w)]
            lines.append(
                f"| {s} | {w} | {report.rate(o['inserts_per_s'])} | {report.rate(r['inserts_per_s'])} | "
                f"{report.ratio(o['inserts_per_s'] / r['inserts_per_s'])} | {report.rate(o['samples_per_s'])} | "
                f"{report.rate(r['samples_per_s'])} | {report.ratio(o['samples_per_s'] / r['samples_per_s'])} | "
                f"{o['redraws_per_batch']:.2f} | {o['inexact_share']:.1%} |"
            )
    fills = "; ".join(f"{k}: {v:.1f} s" for k, v in t["fill_s"].items())
    lines += ["", f"Fill times (untimed setup): {fills}."]
    unstaged = [c for c in t["cells"] if c["label"] == UNSTAGED]
    if unstaged:
        lines += [
            "",
            "**Staging, before and after.** The same cells with `ShardedReplay(stage_rows=0)`, the behaviour before "
            "staging: a writer's add joins its shard's tree at once, and a draw routed before it is redrawn. Run "
            "interleaved with the cells above. *rows/shard/batch*: writers' rows reaching one shard per learner "
            "batch (inserts/s ÷ S × B ÷ samples/s), at most what a shard queues between two of the learner's calls.",
            "",
            "| S | W | stage_rows | inserts/s | samples/s | redraws/batch | inexact | rows/shard/batch |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for u in unstaged:
            for c in (cell[("ours", u["shards"], u["writers"])], u):
                lines.append(
                    f"| {c['shards']} | {c['writers']} | {c['stage_rows']:,} | {report.rate(c['inserts_per_s'])} | "
                    f"{report.rate(c['samples_per_s'])} | {c['redraws_per_batch']:.2f} | {c['inexact_share']:.1%} | "
                    f"{c['rows_per_shard_per_batch']:,.0f} |"
                )
    return lines


def _task_name(r: dict[str, Any]) -> str:
    """How the overhead table names a timed task."""
    if r["op"] == "local step":
        return r["op"]
    if r["op"] == "writer stage call":
        return f"writer stage call of {r['rows']} rows (`ShardWriter.add`, in the learner's process)"
    if "shard_size" not in r:
        return f"{r['op']}, S = {r['shards']}"
    if r["op"] == "shard stage + draw":
        return (f"shard stage of {r['staged'] // CHUNK} × {CHUNK} rows, then draw of {r['rows']} rows (takes the "
                f"{r['staged']:,} in), shard of {r['shard_size']:,}")  # fmt: skip
    return f"{r['op']} of {r['rows']} rows, shard of {r['shard_size']:,}"


def _overhead_md(o: dict[str, Any]) -> list[str]:
    d = o["derived"]
    lines = [
        "",
        "## 2. Coordination overhead per batch (no writers)",
        "",
        f"Median of {o['repeats']} interleaved repeats, each ≥ {o['min_time']} s of back-to-back calls, garbage "
        f"collector off during a repeat. *local step*: `PrioritizedReplay({o['capacity']:,})` in the learner's "
        "process, `sample(B)` + `update_priorities`. *no-op*: a Ray call to an actor method that does nothing, "
        "waited for; *fan-out S*: S such calls to S actors at once. *Writer stage call*: a `ShardWriter.add` of one "
        "chunk to a one-shard replay whose queue never overflows (so the shard only queues it). *Shard work*: a "
        "`ReplayShard` (the class a shard actor runs) called in-process: `draw` of B/S offsets, `update` of B/S "
        f"priorities, `stage` of a chunk (queued only), and {STAGED_CHUNKS} chunks staged then a `draw` of B/S, "
        "which serves and then takes them into its tree (the learner's draw call with writers adding). "
        "*Learner CPU*: the learner process's CPU time per call (`time.process_time`, Ray's client threads "
        "included); *actors' CPU*: the same for the actor processes called (all shards, or all no-op targets), "
        "read before and after each repeat.",
        "",
        "| op | wall µs | learner CPU µs | actors' CPU µs |",
        "|---|---:|---:|---:|",
    ]
    for r in o["tasks"]:
        lines.append(f"| {_task_name(r)} | {_us(r['median_s'])} | {_us(r['cpu_median_s'])} | "
                     f"{_us(r.get('remote_cpu_median_s'))} |")  # fmt: skip
    lines += [
        "",
        "**Decomposition** (µs per batch): ours step = 2 × fan-out(S) (two rounds of bare round trips: the update "
        "round, whose replies the next sample collects, and the draw round) + shard work (one shard's CPU per step "
        f"beyond two no-op calls, ⌈S / {o['cores']} cores⌉ shards deep on this machine: replay work, payloads) + "
        "learner own (its CPU per step beyond two no-op fan-outs: routing, assembly, checks, payloads) + rest "
        "(waiting, scheduling; negative where they overlapped). *overhead* = ours step − local step. RLlib-style: the "
        "same learner step on RLlib's buffers.",
        "",
        "| S | ours step | local step | overhead | 2 × fan-out | shard work | learner own | rest | learner CPU | "
        "one shard's CPU | RLlib-style step | its learner CPU | its shard's CPU |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in d["per_shards"]:
        lines.append(
            f"| {p['shards']} | {_us(p['step_s'])} | {_us(p['local_step_s'])} | {_us(p['overhead_s'])} | "
            f"{_us(p['round_trips_s'])} | {_us(p['shard_work_s'])} | {_us(p['learner_own_s'])} | {_us(p['rest_s'])} | "
            f"{_us(p['learner_cpu_s'])} | {_us(p['shard_cpu_s'])} | {_us(p['rllib_step_s'])} | "
            f"{_us(p['rllib_learner_cpu_s'])} | {_us(p['rllib_shard_cpu_s'])} |"
        )
    lines += [
        "",
        f"Bare Ray round trip to one actor: {_us(d['noop_rtt_s'])} µs wall; {_us(d['noop_learner_cpu_s'])} µs "
        f"learner CPU and {_us(d['noop_actor_cpu_s'])} µs actor CPU (Ray's threads in both processes run in "
        f"parallel, so the CPU times may add up to more than the wall time); each extra actor in a fan-out adds "
        f"{_us(d['fanout_wall_per_call_s'])} µs wall and {_us(d['fanout_cpu_per_call_s'])} µs learner CPU. Learner "
        f"CPU per sharded step ≈ {_us(d['learner_cpu_base_s'])} + {_us(d['learner_cpu_per_shard_s'])} × S µs (fit "
        f"over S); a shard's CPU per call beyond a no-op's and its replay work: {_us(d['shard_call_cpu_s'])} µs "
        f"(S = 1). A writer's stage call: {_us(d['stage_call_s'])} µs round trip, {_us(d['stage_call_shard_cpu_s'])} "
        f"µs of the shard's CPU. Taking one staged chunk of {CHUNK} rows into a tree inside a draw (stage + draw, "
        f"less {STAGED_CHUNKS} stages and a plain draw, ÷ {STAGED_CHUNKS}): "
        + ", ".join(f"{_us(p['take_in_chunk_s'])} µs (S = {p['shards']})" for p in d["per_shards"])
        + ".",
    ]
    return lines


def _bias_md(b: dict[str, Any]) -> list[str]:
    names = list(b["samplers"])
    masses = " : ".join(f"{m:g}" for m in b["masses"])
    lines = [
        "",
        "## 3. Sampling bias with unequal shard masses",
        "",
        f"{b['shards']} shards of {b['capacity_per_shard']:,} transitions; shard k's `p^alpha` = mass_k × "
        f"lognormal(0, 0.5) (normalised per shard), masses {masses}, so shard masses differ up to "
        f"{max(b['masses']) / min(b['masses']):g}×. The same priorities are set in both (ours: `update_priorities` "
        "with indices built for every slot from one probe sample's incarnation and epoch; RLlib: "
        "`update_priorities(range(C), p)` per shard, checked against its sum tree). "
        f"{b['draws']:,} transitions drawn from each, in batches of {b['batch']} (RLlib-style: {b['batch']} / "
        f"{b['shards']} from every shard per call, `sample(n, beta={BETA})`). Exact law: `p_i^alpha / sum_all p^alpha`; "
        "exact IS weight: `(min_all p^alpha / p_i^alpha)^beta` (the single-buffer formula with the global N and "
        "minimum). *χ² cells*: `scipy.stats.chisquare` over consecutive (shard, slot) cells grouped to about "
        f"{BIN_EXPECTED} expected draws a bin (all ≥ 5); *χ² shards*: over the {b['shards']} shard totals. *TV*: "
        "total variation distance over cells (its floor at this many draws is the exact i.i.d. reference's). Ours "
        "draws stratified batches by default (less spread than i.i.d., so its χ² p-values lean high); "
        "*ours (i.i.d.)* is the same replay with `stratified=False`, for which the χ² test is exact.",
        "",
        "| sampler | " + " | ".join(f"shard {k} share" for k in range(b["shards"])) + " | TV shards | TV cells | "
        "χ² cells (bins) | p cells | χ² shards | p shards | IS weight max rel. error | mean rel. error |",
        "|---|" + "---:|" * (b["shards"] + 8),
        "| exact | " + " | ".join(f"{x:.2%}" for x in b["exact_shard_share"]) + " | 0 | 0 | – | – | – | – | 0 | 0 |",
    ]
    for name in names:
        s = b["samplers"][name]
        lines.append(
            f"| {name} | " + " | ".join(f"{x:.2%}" for x in s["shard_share"]) + f" | {s['tv_shards']:.4f} | "
            f"{s['tv_cells']:.4f} | {s['chi2_cells']:,.0f} ({s['bins']}) | {s['p_cells']:.3g} | "
            f"{s['chi2_shards']:,.1f} | {s['p_shards']:.3g} | {s['weight_max_rel_error']:.2e} | "
            f"{s['weight_mean_rel_error']:.2e} |"
        )
    redraws = [f"{n}: {b['samplers'][n]['redraws']}" for n in names if "redraws" in b["samplers"][n]]
    lines += [
        "",
        f"Redraws while drawing (no writers): {', '.join(redraws)}. For an exact i.i.d. sampler a χ² p-value is "
        "uniform on [0, 1] (one run in 20 falls below 0.05), so one p-value decides little; the TV columns against "
        "the reference's, and RLlib-style's p = 0, do. With no writers the seeds fix every draw: each run repeats "
        "these numbers.",
    ]
    return lines


def _projection_md(p: dict[str, Any]) -> list[str]:
    m = p["measured"]
    lines = [
        "",
        "## 4. Projection to 8 and 64 nodes",
        "",
        "A model, not a measurement: one shard per node, the learner on its own node, fanning out one call per shard "
        "for the update round and one for the draw round of every batch; writers on other nodes stage rows into the "
        "shards, which take them in during the learner's calls.",
        "",
        "```",
        *[line.strip() for line in p["formula"].split("::")[1].split("RTT:")[0].strip().splitlines()],
        "```",
        "",
        "| term | value | source |",
        "|---|---:|---|",
        f"| RTT, network round trip between two nodes | {p['rtt_us']:g} µs | assumption: a datacenter network "
        "(same rack or neighbouring racks); not measured here |",
        f"| BW, the learner's network bandwidth | {p['gbps']:g} Gb/s | assumption: a common datacenter NIC; at "
        "these payloads (~23 kB per batch) it hardly matters |",
        f"| r, a bare Ray round trip | {_us(m['noop_rtt_s'])} µs | measured (part 2, no-op call to one actor) on "
        "this machine, kept as the software part of a round trip between nodes |",
        f"| a, a no-op call's actor CPU | {_us(m['noop_actor_cpu_s'])} µs | measured (part 2) |",
        f"| o, a shard's CPU per call beyond a no-op's and its replay work | {_us(m['shard_call_cpu_s'])} µs | "
        "measured (part 2, one shard's CPU per step) |",
        f"| L, learner CPU per batch at any S, beyond two no-op calls | {_us(m['learner_base_s'])} µs | measured: "
        "intercept of the learner's CPU per step over S, less two no-op calls' learner CPU (a fitted intercept: "
        "only L + k S, over the S measured, is a measurement) |",
        f"| k, learner CPU per shard and batch | {_us(m['learner_cpu_per_shard_s'])} µs | measured: slope of the "
        "same fit (two calls per shard) |",
        f"| t_draw, t_update at B/S | part 2 | measured in-process, shard of {p['shard_size']:,} (the smallest of "
        "part 2; a tree's depth grows with log16 of its size) |",
        f"| t_in, taking one staged row into a tree | {m['take_in_row_s'] * 1e9:,.0f} ns | measured in-process "
        f"(part 2, stage + draw, shard of {p['shard_size']:,}) |",
        f"| c_stage, a shard's CPU per writer stage call of {CHUNK} rows | {_us(m['stage_call_cpu_s'])} µs | "
        "measured through Ray (part 2, writer stage call: the shard's CPU) |",
        f"| a writer's stage round trip | RTT + {_us(m['stage_call_s'])} µs | measured (part 2, writer stage call, "
        "wall) plus RTT; a synchronous writer adds 64 rows per round trip |",
        f"| stage_rows | {p['stage_rows']:,} | the ShardedReplay default |",
        "",
        "Assumptions beyond the table: writers spread their rows evenly over the shards (the least-full policy does); "
        "the learner's calls never wait behind writers' stage calls (a shard serves one call at a time, so as rho "
        "nears 1 they do: the model is optimistic there); a shard's busy share rho counts its CPU, so a shard with "
        "more than one core's worth of work (rho ≥ 1) cannot keep up. *Limit*: the inserts/s at which rho = 1; "
        "*writers*: synchronous writers it takes to reach it. *rows/shard/batch*: x T, compared with stage_rows; "
        "*overflow from*: the inserts/s at which x T = stage_rows.",
        "",
        "| nodes | inserts/s | rows/shard/batch | take-in µs/batch | batch µs | learner samples/s | shard busy rho "
        "| redraws | limit inserts/s | writers | overflow from |",
        "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in p["rows"]:
        lim = r["shard_limit"]
        load = report.rate(r["inserts_per_s"]) + (" (limit)" if r["max_load"] else "")
        saturated = r["shard_busy"] > 1 + 1e-9
        redraws = "yes: queue overflows" if r["overflow"] else "~0"
        lines.append(
            f"| {r['nodes']} | {load} | {r['rows_per_shard_per_batch']:,.0f} | {_us(r['take_in_s'])} | "
            f"{'–' if saturated else _us(r['batch_s'])} | "
            f"{'– (over the limit)' if saturated else report.rate(r['samples_per_s'])} | {r['shard_busy']:.0%} | "
            f"{'–' if saturated else redraws} | {report.rate(lim['inserts_per_s'])} | {lim['writers_needed']:.0f} | "
            f"{report.rate(lim['overflow_inserts_per_s'])} |"
        )
    lines += [
        "",
        "**The model on this machine** (RTT = 0, BW = ∞, no writers) against the measured step of part 2; the shards "
        "here share the cores with the learner, which the model does not know:",
        "",
        "| S | measured µs | model µs |",
        "|---:|---:|---:|",
        *[f"| {c['shards']} | {_us(c['measured_s'])} | {_us(c['model_s'])} |" for c in p["local_check"]],
        "",
        _staging_check_md(p["staging_check"]),
    ]
    return lines


def _staging_check_md(c: dict[str, Any]) -> str:
    """Part 1's staged cells against the model's redraw condition (rows per shard and batch vs stage_rows)."""
    below = c["max_rows_per_shard_per_batch"] <= c["stage_rows"]
    expect = "so the model predicts no redraws" if below else "so the model expects queue overflows"
    return (
        f"**Staging against part 1.** With staging, at most {c['max_rows_per_shard_per_batch']:,.0f} writers' rows "
        f"reached a shard per learner batch, {'below' if below else 'above'} stage_rows = {c['stage_rows']:,}, "
        f"{expect}; measured: {c['redraws_per_batch']:.3f} redraws per batch over all cells (at most "
        f"{c['max_redraws_per_batch']:.3f} in a cell), at most {c['max_inexact_share']:.1%} of batches inexact."
    )


def plot(results: dict[str, Any], path: Path) -> bool:
    """Inserts/s and samples/s against S per writer count (ours vs RLlib; ours with stage_rows=0), part 3's shares."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    t, b = results["throughput"], results["bias"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, key, title in ((axes[0], "inserts_per_s", "inserts/s"), (axes[1], "samples_per_s", "learner samples/s")):
        for label, style in zip(CONTENDERS, ("-o", "--s")):
            for i, w in enumerate(sorted({c["writers"] for c in t["cells"]})):  # one colour per writer count
                pts = sorted((c["shards"], c[key]) for c in t["cells"] if (c["label"], c["writers"]) == (label, w))
                ax.plot(*zip(*pts), style, color=f"C{i}", label=f"{label}, W = {w}")
        unstaged = [c for c in t["cells"] if c["label"] == UNSTAGED]
        for j, c in enumerate(unstaged):
            ax.plot(c["shards"], c[key], "kx", markersize=9, label=f"{UNSTAGED} (before staging)" if j == 0 else None)
            ax.annotate(f"W = {c['writers']}", (c["shards"], c[key]), fontsize=7, xytext=(4, -10),
                        textcoords="offset points")  # fmt: skip
        ax.set_xlabel("shards S")
        ax.set_yscale("log")
        ax.set_xticks(sorted({c["shards"] for c in t["cells"]}))
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=7)  # below: the lines fill the axes
    shares = {"exact": b["exact_shard_share"]} | {n: s["shard_share"] for n, s in b["samplers"].items()
                                                  if "reference" not in n}  # fmt: skip
    x = np.arange(b["shards"])
    width = 0.8 / len(shares)
    for i, (name, share) in enumerate(shares.items()):
        axes[2].bar(x + (i - (len(shares) - 1) / 2) * width, share, width, label=name)
    axes[2].set_xticks(x, [f"shard {k}\nmass {m:g}" for k, m in zip(x, b["masses"])])
    axes[2].set_title("share of draws per shard")
    axes[2].legend(fontsize=7)
    m = results["machine"]
    fig.suptitle(f"{m['cpu']}, {m['cores']} cores, local Ray, {m['date'][:10]}", fontsize=9)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    sys.exit(main())
