"""The buffer calls of Tianshou's training loop, side by side: our Tianshou buffer vs Tianshou's own.

    python benchmarks/bench_tianshou_buffer.py            # envs in {1, 4, 16, 64}
    python benchmarks/bench_tianshou_buffer.py --quick    # smoke run, a few seconds

A Tianshou off-policy loop touches its buffer through five calls; each is timed
for every contender on the same data, interleaved (timing.py), torch on one
thread, our tree on one thread:

* **add** — one collector step: a transition from each of ``envs`` environments
  (``buffer.add(batch, buffer_ids)``), buffer full so slots are overwritten;
* **sample** — ``buffer.sample(64)``: indices, rows and IS weights;
* **index** — ``buffer[indices]`` for 64 indices (n-step targets read ``obs_next`` so);
* **update** — ``buffer.update_weight(indices, td)`` with a torch TD-error tensor;
* **add+hasnull** — an ``add`` then the trainer's NaN check, which follows every ``collect`` (the ``add``
  row gives the add alone; ours checks only the rows written since the previous check).

``--e2e`` measures the whole loop instead: env-steps/s of Tianshou DQN on CartPole-v1
with 4 envs through ``OffPolicyTrainer`` (the standard setup of
``hetero_replay.adapters.tianshou.workload``: buffer 50k filled with 1000 random
steps, 16 env steps and 4 updates of batch 64 per training step), as a user runs
it either way: Tianshou's stock DQN with its ``PrioritizedVectorReplayBuffer``,
against our buffer with the DQN wrapped in
:class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper` at staleness 0 and 1, and
Tianshou's stock DQN with its uniform ``VectorReplayBuffer`` (what PER costs over no PER);
all of them in one process, taking turns every ``--chunk`` env steps (a short epoch
each, in a new random order every round), so that the machine's drifts (its speed moves by 10-20%
within minutes on a shared VM) fall on every contender alike; each repeat builds
fresh contenders and reports each one's rate over its ``--steps`` timed steps.
Medians over repeats of those rates and of their ratios, for wall-clock time and
for CPU time (the process's CPU seconds: less sensitive to other jobs on the machine):

    python benchmarks/bench_tianshou_buffer.py --e2e --steps 8000 --repeats 5
    python benchmarks/bench_tianshou_buffer.py --e2e --steps 8000 --repeats 5 --warmup 50000  # buffer full

``--warmup`` is the random transitions collected before the timed epoch (default: the
standard setup's 1000). Tianshou's trainer checks the whole buffer for NaNs after
every collect, so a buffer's cost grows with what it holds: ``--warmup 50000`` times
the steady state of a long run, its buffer full.

Contenders: ``ours`` = :class:`~hetero_replay.adapters.tianshou.HeteroPrioritizedVectorReplayBuffer`,
``tianshou-per`` = ``PrioritizedVectorReplayBuffer``, ``tianshou-uniform`` =
``VectorReplayBuffer`` (no priorities: it has no ``update``). Transitions are
CartPole-shaped, as Tianshou's ``Collector`` stores them. Results go to
``<out>/tianshou-buffer.{json,md}`` and the Markdown is printed.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from bench_replay import machine_info
from tianshou.data import Batch, PrioritizedVectorReplayBuffer, VectorReplayBuffer
from timing import Task, calibrate, run_interleaved
from tqdm import tqdm

import hetero_replay
from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

OPS = ("add", "sample", "index", "update", "add+hasnull")
BATCH = 64

CONTENDERS: dict[str, Callable[[int, int], Any]] = {
    "ours": lambda size, envs: HeteroPrioritizedVectorReplayBuffer(size, envs, alpha=0.6, beta=0.4, random_seed=0),
    "tianshou-per": lambda size, envs: PrioritizedVectorReplayBuffer(size, envs, alpha=0.6, beta=0.4),
    "tianshou-uniform": lambda size, envs: VectorReplayBuffer(size, envs),
}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 and 4 envs, 3 short repeats")
    parser.add_argument("--envs", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--size", type=int, default=50_000, help="transitions held (default 50,000)")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of calls per repeat")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--e2e", action="store_true", help="env-steps/s of DQN CartPole training instead")
    parser.add_argument("--steps", type=int, default=8000, help="--e2e: env steps per timed run (default 8000)")
    parser.add_argument("--warmup", type=int, default=None, help="--e2e: random env steps before (default 1000)")
    parser.add_argument("--chunk", type=int, default=400, help="--e2e: env steps of each turn (default 400)")
    args = parser.parse_args(argv)
    if args.e2e:
        return end_to_end(args.steps, 5 if args.repeats == 15 else args.repeats, args.warmup, args.chunk)
    envs, repeats, min_time = ([1, 4], 3, 0.01) if args.quick else (args.envs, args.repeats, args.min_time)
    torch.set_num_threads(1)
    hetero_replay.set_num_threads(1)
    results = run(envs, args.size, repeats, min_time)
    text = markdown(results)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "tianshou-buffer" + ("-quick" if args.quick else "") + ("" if args.size == 50_000 else f"-{args.size}")
    (out / f"{name}.json").write_text(json.dumps(results, indent=1))
    (out / f"{name}.md").write_text(text)
    print(text)
    return 0


#: --e2e contenders: label -> (buffer, staleness); "ours" is trained through PEROffPolicyWrapper.
E2E = {"tianshou-per": ("tianshou-per", 0), "ours-k0": ("ours", 0), "ours-k1": ("ours", 1),
       "tianshou-uniform": ("tianshou-uniform", 0)}  # fmt: skip


def end_to_end(steps: int, repeats: int, warmup: int | None = None, chunk: int = 400) -> int:
    """Env-steps/s of DQN CartPole (4 envs) training with each buffer of :data:`E2E`, taking turns; a table."""
    import statistics

    torch.set_num_threads(1)
    hetero_replay.set_num_threads(1)
    labels = list(E2E)
    rates: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    for r in range(repeats):
        runs = {label: TrainingRun(*E2E[label], seed=r, warmup=warmup, chunk=chunk) for label in labels}
        for run in runs.values():
            run.epoch()  # untimed: the first updates build the optimizer's state
        totals: dict[str, list[float]] = {label: [0, 0.0, 0.0] for label in labels}
        order = np.random.default_rng(r)
        for _ in tqdm(range(-(-steps // chunk)), desc=f"repeat {r + 1}/{repeats}", leave=False):
            for label in order.permutation(labels):  # no contender always follows the same one
                gc.collect()  # the last turn's garbage goes now, not during this one
                totals[label] = [t + p for t, p in zip(totals[label], runs[label].epoch())]
        for label, (done, wall, cpu) in totals.items():
            runs[label].close()
            rates[label].append((done / wall, done / cpu))
            print(f"repeat {r + 1}/{repeats} {label:16s} {done / wall:8.0f} env-steps/s, {done / cpu:8.0f} per CPU-s")
    print(
        f"\n| DQN CartPole, 4 envs, {warmup or 1000} random steps first | env-steps/s (median of {repeats}) "
        "| ratio to tianshou-per (median) | ratios (each repeat) | env-steps per CPU-s | ratio (CPU) |"
    )
    print("|---|---|---|---|---|---|")
    base = rates["tianshou-per"]
    for label, values in rates.items():
        ratios = [a[0] / b[0] for a, b in zip(values, base)]
        cpu_ratio = statistics.median(a[1] / b[1] for a, b in zip(values, base))
        wall, cpu = statistics.median(v[0] for v in values), statistics.median(v[1] for v in values)
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"| {label} | {wall:.0f} | {statistics.median(ratios):.2f} | {each} | {cpu:.0f} | {cpu_ratio:.2f} |")
    return 0


class TrainingRun:
    """One contender of :func:`end_to_end`: an ``OffPolicyTrainer`` whose epochs are ``chunk`` env steps.

    ``kind``: ``"ours"`` (our buffer, the DQN wrapped in ``PEROffPolicyWrapper`` at ``staleness``),
    ``"tianshou-per"`` or ``"tianshou-uniform"`` (Tianshou's buffer, its stock DQN). The buffer
    first gets ``warmup`` random env steps (default: the standard setup's 1000).
    """

    def __init__(self, kind: str, staleness: int, seed: int, warmup: int | None, chunk: int) -> None:
        import gymnasium as gym
        from tianshou.data import Collector, CollectStats
        from tianshou.env import DummyVectorEnv
        from tianshou.trainer import OffPolicyTrainerParams

        from hetero_replay.adapters.tianshou import LinearBetaSchedule, PEROffPolicyWrapper
        from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS, standard_algorithm

        hp, n_envs = STANDARD_HYPERPARAMS["dqn"], 4
        torch.manual_seed(seed)
        np.random.seed(seed)
        algorithm: Any = standard_algorithm("dqn", gym.make("CartPole-v1"), hp)
        ours = kind == "ours"
        if ours:  # Tianshou's own buffers go with its stock algorithm, which weights and updates by itself
            algorithm = PEROffPolicyWrapper(
                wrapped_algorithm=algorithm, beta=LinearBetaSchedule(0.4, 1.0, 100_000), staleness=staleness
            )
        algorithm.policy.set_eps_training(hp.extra["eps_final"])
        buffer: Any
        if ours:
            buffer = HeteroPrioritizedVectorReplayBuffer(hp.buffer_size, n_envs, alpha=0.6, beta=0.4, random_seed=seed)
        elif kind == "tianshou-per":
            buffer = PrioritizedVectorReplayBuffer(hp.buffer_size, n_envs, alpha=0.6, beta=0.4)
        else:
            buffer = VectorReplayBuffer(hp.buffer_size, n_envs)
        envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(n_envs)])
        envs.seed(seed)
        self.collector = Collector[CollectStats](algorithm, envs, buffer, exploration_noise=True)
        self.collector.reset()
        self.collector.collect(n_step=hp.warmup_steps if warmup is None else warmup, random=True)
        self.trainer = algorithm.create_trainer(
            OffPolicyTrainerParams(
                training_collector=self.collector, test_collector=None, max_epochs=10**9, epoch_num_steps=chunk,
                collection_step_num_env_steps=hp.collect_per_env * n_envs,
                update_step_num_gradient_steps_per_sample=hp.updates_per_step, batch_size=hp.batch_size,
                verbose=False, show_progress=False,
            )
        )  # fmt: skip
        self.trainer.reset()  # the envs and the collector's counts, not the buffer

    def epoch(self) -> tuple[int, float, float]:
        """One epoch: ``(env steps, wall-clock seconds, CPU seconds of the process)``."""
        before = self.collector.collect_step
        start, cpu = time.perf_counter(), time.process_time()
        self.trainer.execute_epoch()
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        return self.collector.collect_step - before, wall, cpu

    def close(self) -> None:
        self.collector.close()


def step_batches(envs: int, count: int, rng: np.random.Generator) -> list[Batch]:
    """``count`` collector steps of ``envs`` CartPole-shaped transitions, about 5% ending an episode."""
    return [
        Batch(obs=rng.random((envs, 4), dtype=np.float32), act=rng.integers(0, 2, envs), rew=np.ones(envs),
              terminated=rng.random(envs) < 0.05, truncated=np.zeros(envs, bool),
              obs_next=rng.random((envs, 4), dtype=np.float32), info=Batch(env_id=np.arange(envs)), policy=Batch())
        for _ in range(count)
    ]  # fmt: skip


def run(env_counts: Sequence[int], size: int, repeats: int, min_time: float) -> dict[str, Any]:
    """Time every op of every contender for each number of environments; a dict for JSON."""
    rng = np.random.default_rng(0)
    rows: list[dict[str, Any]] = []
    for envs in env_counts:
        steps = step_batches(envs, 64, rng)
        fill = step_batches(envs, -(-size // envs), rng)
        tasks = []
        for label, build in CONTENDERS.items():
            buf = build(size, envs)
            for batch in fill:
                buf.add(batch, buffer_ids=np.arange(envs))
            tasks += _tasks(label, envs, buf, steps, rng)
        with tqdm(total=len(tasks) * (repeats + 1), desc=f"{envs} envs", leave=False, disable=None) as bar:
            for task in tasks:
                calibrate(task, min_time)
                bar.update()
            run_interleaved(tasks, repeats, bar.update)
        rows += [task.summary() for task in tasks]
    return {"machine": machine_info(), "size": size, "batch": BATCH,
            "method": {"repeats": repeats, "min_time_s": min_time}, "results": rows}  # fmt: skip


def _tasks(label: str, envs: int, buf: Any, steps: list[Batch], rng: np.random.Generator) -> list[Task]:
    """One task per op of ``buf``; adds cycle over ``steps``, the rest over 8 sampled index sets."""
    ids = np.arange(envs)
    step_cycle = itertools.cycle(steps)
    picks = itertools.cycle(
        [(np.sort(buf.sample_indices(BATCH)), torch.as_tensor(rng.standard_normal(BATCH), dtype=torch.float32))
         for _ in range(8)]
    )  # fmt: skip
    ops: dict[str, Callable[[], Any]] = {
        "add": lambda: buf.add(next(step_cycle), buffer_ids=ids),
        "sample": lambda: buf.sample(BATCH),
        "index": lambda: buf[next(picks)[0]],
        "add+hasnull": lambda: (buf.add(next(step_cycle), buffer_ids=ids), buf.hasnull()),
    }
    if hasattr(buf, "update_weight"):
        ops["update"] = lambda: buf.update_weight(*next(picks))
    return [Task({"envs": envs, "label": label, "op": op}, fn, lambda: None) for op, fn in ops.items()]


def markdown(results: dict[str, Any]) -> str:
    """Median µs per call, one table per operation: rows = envs, a column per contender and our ratio."""
    machine = results["machine"]
    labels = list(CONTENDERS)
    median = {(r["envs"], r["label"], r["op"]): r["median_s"] * 1e6 for r in results["results"]}
    env_counts = sorted({r["envs"] for r in results["results"]})
    lines = [
        "# Tianshou buffer calls: ours vs Tianshou's",
        "",
        f"- **Machine:** {machine['cpu']}, {machine['cores']} cores; load {machine['loadavg_start'][0]:.2f} at start",
        f"- **Run:** {machine['date']}, git {machine['git']}; torch and our tree on 1 thread",
        f"- **Workload:** {results['size']:,} CartPole transitions held, batch {results['batch']}; median of "
        f"{results['method']['repeats']} interleaved repeats of ≥ {results['method']['min_time_s']} s",
        "",
        "Median µs per call; `÷` columns: Tianshou's time over ours (above 1: ours faster).",
    ]
    for op in OPS:
        lines += ["", f"## {op}", "", "| envs | " + " | ".join(labels) + " | tianshou-per ÷ ours |",
                  "|---" * (len(labels) + 2) + "|"]  # fmt: skip
        for envs in env_counts:
            cells = [f"{median[(envs, label, op)]:.1f}" if (envs, label, op) in median else "—" for label in labels]
            ours, theirs = median.get((envs, "ours", op)), median.get((envs, "tianshou-per", op))
            ratio = f"{theirs / ours:.2f}×" if ours and theirs else "—"
            lines.append(f"| {envs} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
