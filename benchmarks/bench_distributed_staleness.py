"""ShardedReplay learner steps with staleness 0, 1 and 2: how much of Ray's round trips training hides.

A learner step is sample(B) + a stand-in for training (sleeping ``--train-ms``, as a GPU step
would leave the CPU free) + update_priorities(B). Staleness 0 is exact PER: two rounds of
calls per step (the update's, collected before the next draw, and the draw's). Staleness 1
carries the update on the next draw's calls: one round. Staleness 2 also sends the next draw
before training, so the shards serve it while the learner trains. Interleaved repeats,
medians; torch is not imported. Writes ``benchmarks/results/distributed-staleness.{md,json}``.

    python benchmarks/bench_distributed_staleness.py          # about 2 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import cpu_model, git_revision, table  # noqa: E402

SCHEMA = {"obs": ((8,), "float32"), "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "float32")}


def steps_per_second(replay: object, batch: int, train_s: float, steps: int, rng: np.random.Generator) -> float:
    start = time.perf_counter()
    for _ in range(steps):
        sample = replay.sample(batch)  # type: ignore[attr-defined]
        if train_s:
            time.sleep(train_s)
        replay.update_priorities(sample.indices, rng.random(batch))  # type: ignore[attr-defined]
    return steps / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--train-ms", type=float, nargs="+", default=[0.0, 2.0, 5.0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()

    import ray

    from hetero_replay.distributed import ShardedReplay

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    rng = np.random.default_rng(0)
    cells: dict[tuple[int, float, int], list[float]] = {}
    replays = {}
    for shards in args.shards:
        for k in (0, 1, 2):
            replays[shards, k] = r = ShardedReplay(shards, 65_536 // shards, SCHEMA, seed=0, staleness=k)
            r.add({"obs": rng.random((65_536, 8)), "action": np.zeros(65_536, np.int64),
                   "reward": rng.random(65_536), "done": np.zeros(65_536)})  # fmt: skip
    for repeat in range(args.repeats):  # interleaved: the machine's noise falls on every cell alike
        for train_ms in args.train_ms:
            for (shards, k), replay in replays.items():
                rate = steps_per_second(replay, args.batch, train_ms / 1e3, args.steps, rng)
                cells.setdefault((shards, train_ms, k), []).append(rate)
                print(f"repeat {repeat}: S={shards} train {train_ms} ms staleness {k}: {rate:.0f} steps/s", flush=True)
    stats = {f"S={s}, k={k}": dict(r.stats) for (s, k), r in replays.items() if k}
    for r in replays.values():
        r.close()
    ray.shutdown()

    body = []
    for shards in args.shards:
        for train_ms in args.train_ms:
            rates = [statistics.median(cells[shards, train_ms, k]) for k in (0, 1, 2)]
            ideal = 1e3 / train_ms if train_ms else float("nan")
            body.append([str(shards), f"{train_ms:g}", *(f"{r:.0f}" for r in rates),
                         f"{rates[1] / rates[0]:.2f}×", f"{rates[2] / rates[0]:.2f}×",
                         "–" if not train_ms else f"{ideal:.0f}"])  # fmt: skip
    lines = [
        "# ShardedReplay: learner steps per second with staleness 0, 1, 2",
        "",
        f"`python benchmarks/bench_distributed_staleness.py`; {cpu_model()}, {os.cpu_count()} cores, "
        f"git {git_revision()}, {time.strftime('%Y-%m-%d')}. One local Ray instance; 65,536 transitions over S "
        f"shards; a step = sample B = {args.batch} + sleep (the training stand-in) + update B priorities; "
        f"median of {args.repeats} interleaved repeats of {args.steps} steps.",
        "",
        *table(["S", "train ms", "k = 0", "k = 1", "k = 2", "k=1 / k=0", "k=2 / k=0", "training alone"], body),
        "",
        "k = 0: exact PER (each batch sees every earlier update); k = 1: the update rides on the next draw's "
        "calls (batch t sees the updates of steps <= t - 2); k = 2: the next draw is also sent before training "
        "(batch t sees the updates of steps <= t - 3). *training alone*: steps/s if the replay cost nothing.",
        "",
        f"Redraws and inexact batches (k >= 1, no writers): {stats}",
        "",
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "distributed-staleness.md").write_text("\n".join(lines))
    (args.out / "distributed-staleness.json").write_text(json.dumps({f"{k}": v for k, v in cells.items()}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
