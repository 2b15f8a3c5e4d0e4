"""Would per-shard counts pay? Offsets per draw against counts from the multinomial (issue 29, item 1).

Today the learner of a ``ShardedReplay(batches_per_call=m)`` routes ``m * B`` global draws and sends
each shard its offsets (8 bytes a draw). The alternative draws each batch's per-shard counts from
``Multinomial(B, S_k / T)`` and sends each shard ``m`` counts and a seed; the shard draws its uniforms
itself. Only what the learner does differs, so this measures exactly that, on the learner:

- *routing*: ``ShardedReplay._route`` of a real sharded replay (``m * B`` uniforms, searchsorted, split
  per shard) against ``m`` multinomial draws over the same shard totals;
- *the calls*: one round of ``S`` Ray calls, all in flight, then one wait, to real actors whose reply
  is the same in both variants (the rows of ``m * B / S`` transitions, as a shard's draw returns); the
  arguments are what the learner sends (offsets, or counts and a seed, plus the version, the total,
  the carried updates and the max priority). Learner CPU (``time.process_time``) per round;
- *bytes sent*: the pickled size (protocol 5) of each call's arguments.

Variants interleaved, repeated, medians; one local Ray instance. The arguments are pickled Python objects, as
the calls were before ``hetero_replay/distributed/wire.py``: the study compares the two ways of routing, not
today's cost of a call (``profile_sharded_learner.py`` measures that).

    python benchmarks/bench_shard_counts.py
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS", "HETERO_REPLAY_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import json
import pickle
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BATCH = 256
SCHEMA = {"obs": ((8,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "float32")}


class Shard:
    """The far end of a draw call: returns the rows of ``rows`` transitions, whatever it was asked."""

    def __init__(self, rows: int) -> None:
        rng = np.random.default_rng(rows)
        self.reply = (
            {"obs": rng.random((rows, 8), dtype=np.float32), "action": np.zeros(rows, np.int64),
             "reward": np.zeros(rows, np.float32), "done": np.zeros(rows, np.float32)},
            np.arange(rows, dtype=np.int64), np.ones(rows, np.float32),
        )  # fmt: skip

    def draw(self, what: Any, incarnation: int, version: int, total: float, updates: Any, top: float) -> Any:
        return self.reply


def call_args(kind: str, s: int, m: int, rng: np.random.Generator) -> list[tuple[Any, ...]]:
    """What the learner sends each of ``s`` shards for one call of ``m`` batches (``kind``: offsets or counts)."""
    per = m * BATCH // s
    updates = ((np.arange(per, dtype=np.int64), np.zeros(per, np.int64), 0, rng.random(per)),)  # the carried updates
    if kind == "offsets":
        return [(rng.random(per) * 100.0, 0, 7, 100.0, updates, 1.0) for _ in range(s)]
    counts = rng.multinomial(BATCH, np.full(s, 1.0 / s), size=m).T  # one count per batch and shard
    return [((tuple(int(c) for c in counts[k]), int(rng.integers(2**63))), 0, 7, 100.0, updates, 1.0) for k in range(s)]


def time_calls(handles: list[Any], args: list[tuple[Any, ...]], rounds: int) -> float:
    """Learner CPU seconds per round of one call to every shard (all in flight, one wait)."""
    import ray

    c0 = time.process_time()
    for _ in range(rounds):
        ray.get([h.draw.remote(*a) for h, a in zip(handles, args, strict=True)])
    return (time.process_time() - c0) / rounds


def time_routing(s: int, m: int, rounds: int) -> dict[str, float]:
    """Learner CPU seconds per call: the real ``_route`` of ``m * B`` draws split per shard, and ``m`` multinomials."""
    from hetero_replay.distributed import ShardedReplay

    replay = ShardedReplay(s, 4096, SCHEMA, seed=0, staleness=2, batches_per_call=m)
    try:
        replay.add({k: np.zeros((1024 * s, *shape), dtype) for k, (shape, dtype) in SCHEMA.items()})
        totals = np.array([x.total for x in replay.summaries], np.float64)
        rng = np.random.default_rng(0)
        t0 = time.process_time()
        for _ in range(rounds):
            shard_of, offsets = replay._route(BATCH, totals)
            _ = [offsets[shard_of == k] for k in range(s)]  # what _send_draw does with them
        route = (time.process_time() - t0) / rounds
        t0 = time.process_time()
        for _ in range(rounds):
            rng.multinomial(BATCH, totals / totals.sum(), size=m)
            rng.integers(2**63)
        counts = (time.process_time() - t0) / rounds
    finally:
        replay.close()
    return {"offsets": route, "counts": counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--batches-per-call", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--name", default="distributed-shard-counts")
    args = parser.parse_args()
    import ray

    sys.path.insert(0, str(HERE))
    from report import cpu_model, git_revision, table

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    m, load0 = args.batches_per_call, os.getloadavg()[0]
    cells = []
    for s in args.shards:
        handles = [ray.remote(num_cpus=0)(Shard).remote(m * BATCH // s) for _ in range(s)]
        rng = np.random.default_rng(s)
        sent = {kind: call_args(kind, s, m, rng) for kind in ("offsets", "counts")}
        for kind in sent:
            time_calls(handles, sent[kind], 50)  # warm up
        cpu: dict[str, list[float]] = {"offsets": [], "counts": []}
        route: dict[str, list[float]] = {"offsets": [], "counts": []}
        for r in range(args.repeats):
            for kind in ("offsets", "counts") if r % 2 == 0 else ("counts", "offsets"):
                cpu[kind].append(time_calls(handles, sent[kind], args.rounds))
        for _ in range(args.repeats):
            for kind, seconds in time_routing(s, m, args.rounds).items():
                route[kind].append(seconds)
        cell: dict[str, Any] = {"shards": s, "batches_per_call": m, "calls_cpu_s": cpu, "routing_cpu_s": route}
        for kind in ("offsets", "counts"):
            cell[kind] = {
                "calls_cpu_per_step_us": statistics.median(cpu[kind]) / m * 1e6,
                "routing_cpu_per_step_us": statistics.median(route[kind]) / m * 1e6,
                "sent_bytes_per_call": sum(len(pickle.dumps(a, protocol=5)) for a in sent[kind]),
            }
        cells.append(cell)
        for h in handles:
            ray.kill(h)
        print(json.dumps({k: cell[k] for k in ("shards", "offsets", "counts")}), flush=True)
    ray.shutdown()
    body = []
    for c in cells:
        o, n = c["offsets"], c["counts"]
        step_o = o["calls_cpu_per_step_us"] + o["routing_cpu_per_step_us"]
        step_n = n["calls_cpu_per_step_us"] + n["routing_cpu_per_step_us"]
        body.append([str(c["shards"]), f"{o['sent_bytes_per_call']:,} / {n['sent_bytes_per_call']:,}",
                     f"{o['routing_cpu_per_step_us']:.1f} / {n['routing_cpu_per_step_us']:.1f}",
                     f"{o['calls_cpu_per_step_us']:.0f} / {n['calls_cpu_per_step_us']:.0f}",
                     f"{step_o:.0f} / {step_n:.0f}", f"{step_n / step_o:.3f}"])  # fmt: skip
    cmd = " ".join(["python", "benchmarks/bench_shard_counts.py", *sys.argv[1:]])
    lines = [
        "# ShardedReplay: offsets per draw vs per-shard counts (learner side)",
        "",
        f"`{cmd}`; {cpu_model()}, {os.cpu_count()} cores (shared: 1-min load {load0:.2f} at start, "
        f"{os.getloadavg()[0]:.2f} at end), git {git_revision()}, {time.strftime('%Y-%m-%d %H:%M')}. "
        f"B = {BATCH}, m = {m} batches per call; medians of {args.repeats} interleaved repeats of "
        f"{args.rounds} rounds. Per learner step = per call / m. Each cell: offsets / counts.",
        "",
        *table(
            ["S", "bytes sent per call", "routing µs/step", "Ray calls µs/step", "learner CPU µs/step", "ratio"], body
        ),  # fmt: skip
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.md").write_text("\n".join(lines))
    (args.out / f"{args.name}.json").write_text(json.dumps(cells, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
