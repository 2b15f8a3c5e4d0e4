"""Side-by-side replay benchmark: hetero-replay's tree backends against cpprb, TorchRL,
Tianshou (prioritized) and Stable-Baselines3 (uniform), in one process.

    python benchmarks/bench_replay.py            # full: N in {1e5, 1e6, 4e6} x B in {32, 256, 1024, 4096}
    python benchmarks/bench_replay.py --quick    # smoke run: N = 1e5, B in {32, 1024}, 3 repeats
    python benchmarks/bench_replay.py --capacities 4e6 --batches 4096   # one cell ("custom")

For each capacity N every contender is filled with the same N random transitions
(LunarLander-like: obs float32 (8,), action int64, reward float32, next_obs
float32 (8,), done float32), then timed on: sample B (data gather and IS
weights included), priority update of B indices, learner step (sample +
update), and insert of 1 and of 64 transitions. Times are medians over
interleaved repeats (see timing.py). Results go to
``<out>/replay-<name>.{json,md,png}`` and the Markdown is printed to stdout.
See benchmarks/README.md.
"""

from __future__ import annotations

import os

# Before numpy loads: its bundled OpenBLAS would start a thread per core and
# steal cycles from whatever is being timed.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")
# Before torchrl loads: it logs every storage it creates at INFO, over the progress bar.
os.environ.setdefault("RL_LOGGING_LEVEL", "WARNING")

import argparse
import gc
import itertools
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import report
import torch
from contenders import Contender, Workload, factories, make_transitions
from timing import Task, calibrate, run_interleaved
from tqdm import tqdm

import hetero_replay

INSERT_CHUNKS = (1, 64)
#: Distinct (indices, |td|) pairs an update cycles through, so it does not rewrite one batch.
POOL = 8
THREAD_ENV = (
    "HETERO_REPLAY_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)
VERSIONED = (
    "numpy",
    "torch",
    "cpprb",
    "torchrl",
    "tensordict",
    "tianshou",
    "numba",
    "stable-baselines3",
    "gymnasium",
    "hetero-replay",
)


@dataclass(frozen=True)
class Plan:
    """What to run: capacities N, batch sizes B, and how long to time each."""

    capacities: tuple[int, ...]
    batches: tuple[int, ...]
    repeats: int
    min_time: float


FULL = Plan((100_000, 1_000_000, 4_000_000), (32, 256, 1024, 4096), repeats=15, min_time=0.1)
QUICK = Plan((100_000,), (32, 1024), repeats=3, min_time=0.02)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    torch.set_num_threads(1)
    base = QUICK if args.quick else FULL
    plan = Plan(
        tuple(args.capacities or base.capacities),
        tuple(args.batches or base.batches),
        args.repeats or base.repeats,
        args.min_time or base.min_time,
    )
    name = args.name or ("custom" if args.capacities or args.batches else "quick" if args.quick else "full")
    results = run(plan, Workload(), profile=args.profile, skip=args.skip)
    paths = report.write(results, Path(args.out), name)
    print(paths["md"].read_text())
    print(f"written: {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def run(plan: Plan, workload: Workload, profile: bool = False, skip: Sequence[str] = ()) -> dict[str, Any]:
    """Build, fill and time every contender for every capacity of ``plan``; return the raw results."""
    rng = np.random.default_rng(0)
    machine = machine_info()
    records: list[dict[str, Any]] = []
    fills: list[dict[str, Any]] = []
    described: dict[str, dict[str, Any]] = {}
    unavailable: dict[str, str] = {}
    bar = tqdm(total=0, unit="repeat", dynamic_ncols=True, disable=None)  # no bar when not a terminal
    first_units = 0
    for n, capacity in enumerate(plan.capacities):
        bar.set_description(f"N={capacity:.0e} build+fill")
        contenders = _build(capacity, workload, unavailable, skip)
        # Progress unit: one timed repeat, or one calibration. Later capacities are
        # assumed to have the same contenders until they are built.
        units = _task_count(contenders, len(plan.batches), profile) * (plan.repeats + 1)
        if n == 0:
            first_units = units
            bar.total = units * len(plan.capacities)
        else:
            bar.total += units - first_units
        data = make_transitions(capacity, rng)
        for c in contenders:
            described.setdefault(c.label, _describe(c))
            if not c.owns_buffer:
                continue
            start = time.perf_counter()
            c.fill(data)
            fills.append({"capacity": capacity, "label": c.label, "seconds": time.perf_counter() - start})
        del data
        groups: list[tuple[str, Callable[[], list[Task]]]] = [
            (f"N={capacity:.0e} B={b}", partial(_batch_tasks, contenders, capacity, b, rng, profile))
            for b in plan.batches
        ]
        groups.append((f"N={capacity:.0e} insert", partial(_insert_tasks, contenders, capacity, rng)))
        for desc, make_tasks in groups:
            tasks = make_tasks()
            bar.set_description(desc)
            # Everything alive now (libraries, buffers) leaves the collector's view, so
            # the collection before each timed repeat costs microseconds, not 0.5 s.
            gc.collect()
            gc.freeze()
            for task in tasks:
                calibrate(task, plan.min_time)
                bar.update()
            run_interleaved(tasks, plan.repeats, lambda: bar.update())
            records.extend(task.summary() for task in tasks)
            gc.unfreeze()
        for c in contenders:
            c.close()
        del contenders
        gc.collect()
    bar.close()
    machine["loadavg_end"] = os.getloadavg()
    return {
        "machine": machine,
        "plan": asdict(plan),
        "workload": asdict(workload),
        "method": {
            "statistic": "median over interleaved repeats of seconds per call",
            "torch_threads": torch.get_num_threads(),
            "warmup_calls": 3,
            "update_pool": POOL,
            "gc": "garbage collector run before each timed repeat and off during it",
        },
        "contenders": described,
        "unavailable": unavailable,
        "fills": fills,
        "results": records,
    }


def _build(capacity: int, workload: Workload, unavailable: dict[str, str], skip: Sequence[str]) -> list[Contender]:
    """Every available contender for ``capacity``; a factory that fails once is not retried."""
    out: list[Contender] = []
    for name, factory in factories():
        if name in unavailable:
            continue
        try:
            made = factory(capacity, workload)
        except Exception as e:  # any failure only removes this library's column
            unavailable[name] = f"{type(e).__name__}: {_first_line(str(e))}"
            continue
        out.extend(c for c in made if not any(s in c.label for s in skip))
    return out


def _task_count(contenders: list[Contender], batches: int, profile: bool) -> int:
    """How many tasks one capacity makes: per B, per contender and op; then the inserts."""
    per_batch = sum(1 + (2 + profile * len(c.profile_parts)) * c.prioritized for c in contenders)
    return per_batch * batches + len(INSERT_CHUNKS) * len(contenders)


def _batch_tasks(
    contenders: list[Contender], capacity: int, batch: int, rng: np.random.Generator, profile: bool
) -> list[Task]:
    """sample / update / learner-step tasks (and profile parts) of every contender at batch size B."""
    tasks = []
    for c in contenders:
        key = {"capacity": capacity, "size": batch, "label": c.label}
        tasks.append(Task({**key, "op": "sample"}, partial(c.sample, batch), c.activate))
        if not c.prioritized:
            continue
        td = [np.abs(rng.standard_normal(batch)).astype(np.float32) for _ in range(POOL)]
        tds = [c.prepare_td(t) for t in td]
        c.activate()
        pairs = [(c.indices(c.sample(batch)), t) for t in tds]
        tasks.append(Task({**key, "op": "update"}, _cycling(c.update, pairs), c.activate))
        tasks.append(Task({**key, "op": "step"}, _learner_step(c, batch, tds), c.activate))
        if profile:
            for part, fn in c.profile_ops(batch, td[0]).items():
                tasks.append(Task({**key, "op": f"profile:{part}"}, fn, c.activate))
    return tasks


def _insert_tasks(contenders: list[Contender], capacity: int, rng: np.random.Generator) -> list[Task]:
    """Insert tasks of every contender for each chunk size in ``INSERT_CHUNKS``."""
    tasks = []
    for c in contenders:
        for chunk in INSERT_CHUNKS:
            prepared = c.prepare_insert(make_transitions(chunk, rng))
            key = {"capacity": capacity, "size": chunk, "label": c.label, "op": "insert"}
            tasks.append(Task(key, partial(c.insert, prepared), c.activate))
    return tasks


def _cycling(fn: Callable[..., Any], args: list[tuple[Any, ...]]) -> Callable[[], Any]:
    it = itertools.cycle(args)
    return lambda: fn(*next(it))


def _learner_step(c: Contender, batch: int, tds: list[Any]) -> Callable[[], None]:
    """Sample B, then feed B new |TD| back on the sampled indices: what a PER learner does per step."""
    it = itertools.cycle(tds)
    sample, indices, update = c.sample, c.indices, c.update

    def step() -> None:
        update(indices(sample(batch)), next(it))

    return step


def _describe(c: Contender) -> dict[str, Any]:
    return {
        "library": c.library,
        "version": report.package_version(c.library),
        "role": c.role,
        "prioritized": c.prioritized,
        "threads": c.threads,
        "setup": c.setup,
    }


def machine_info() -> dict[str, Any]:
    """Where and with what this run happens: CPU, memory, versions, thread settings, load."""
    cpu, mem_gib = report.cpu_model(), report.memory_gib()
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "caches": _caches(),
        "memory_gib": mem_gib,
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {pkg: report.package_version(pkg) for pkg in VERSIONED},
        "git": report.git_revision(),
        "torch_threads": torch.get_num_threads(),
        "replay_threads_default": hetero_replay.num_threads(),
        "thread_env": {k: os.environ.get(k) for k in THREAD_ENV},
        "loadavg_start": os.getloadavg(),
    }


def _caches() -> str | None:
    """CPU caches as "L1d 48K, L2 2048K, ..." (Linux sysfs), the sizes a tree's depth is set against."""
    found = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / f).read_text().strip() for f in ("level", "type", "size"))
        except OSError:
            continue
        if kind != "Instruction":
            found.append(f"L{level}{'d' if kind == 'Data' else ''} {size}")
    return ", ".join(found) or None


def _first_line(text: str, limit: int = 300) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="smoke run: N = 1e5, B in {32, 1024}, 3 short repeats")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"), help="output directory")
    p.add_argument("--name", help="output file stem after 'replay-' (default: full, quick or custom)")
    p.add_argument("--capacities", type=_count, nargs="+", metavar="N", help="capacities, e.g. 1e5 4e6")
    p.add_argument("--batches", type=_count, nargs="+", metavar="B", help="batch sizes")
    p.add_argument("--repeats", type=int, help=f"interleaved repeats (full {FULL.repeats}, quick {QUICK.repeats})")
    p.add_argument(
        "--min-time", type=float, help=f"seconds per timed repeat (full {FULL.min_time}, quick {QUICK.min_time})"
    )
    p.add_argument("--profile", action="store_true", help="also time the parts of our learner step")
    p.add_argument(
        "--skip", nargs="+", default=[], metavar="TEXT", help="leave out contenders whose label contains TEXT"
    )
    return p.parse_args(argv)


def _count(text: str) -> int:
    value = float(text)
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole number: {text}")
    return int(value)


if __name__ == "__main__":
    sys.exit(main())
