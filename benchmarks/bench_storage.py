"""Replay storage service (issue 15): actor processes write, one learner samples, in shared memory or on disk.

    python benchmarks/bench_storage.py                          # both parts, full sizes
    python benchmarks/bench_storage.py --quick                  # smoke run: tiny sizes, ~1 s phases
    python benchmarks/bench_storage.py --part actors            # ours vs cpprb MPPrioritizedReplayBuffer
    python benchmarks/bench_storage.py --part workloads --rows DQN/Atari-Qbert --duration 60
    python benchmarks/bench_storage.py --part workloads --rows R2D2 IMPALA --codec lz4 --content atari
    python benchmarks/bench_storage.py --part workloads --codec lz4 --content atari --shared-rows DQN/Atari-Qbert

**Actors** (``--part actors``): 1, 2 and 4 actor processes add chunks of 1 and
of 64 transitions (obs float32 (4,), action int64, reward float32, next_obs
float32 (4,), done float32) as fast as they can while the learner process
samples B = 256 and updates B priorities, on ``PrioritizedReplay(storage=
"shared")`` (actors hold ``buf.writer()`` handles) and on cpprb's
``MPPrioritizedReplayBuffer`` (explorers call ``add``), same start method,
interleaved, repeated; medians of inserts/s and sampled transitions/s and the
ratio ours / cpprb.

**Workloads** (``--part workloads``): for each row of
``benchmarks/workloads/replay-needs.csv``, a ``storage="disk"`` buffer of
``capacity_items`` items of ``item_bytes`` (scaled down only where
``--max-bytes`` cannot hold the bytes it stores), prefilled by writer handles in
big chunks and evicted from the page cache; then actors insert at the row's
``insert_items_per_s`` while the learner samples at ``sample_items_per_s``
through ``RelaxedReplay(staleness=d, prefetch=d, worker="thread")``, sleeping
out the rest of each period as training would; then the same unpaced. Every
sampled row is checked for tearing (its id is written at both ends and inside
the payload). Reported: achieved vs required rates, ``sample()`` latency
p50/p99, torn rows (must be 0), maximum sustained rates.

**Latency as a learner sees it.** The depth ``d`` follows one rule for every
row (:func:`pipeline_depth`; ``--staleness`` fixes it instead): enough batches
to cover one batch's read and decode, timed on a cold batch before the phases,
plus the disk's read stalls (``STALL_S``), at the row's sample period; at least
2, at most what ``PIPELINE_BYTES`` of batches hold. Each phase first primes the
pipeline (one untimed ``sample``, then waits until ``d`` batches are drawn
ahead) and reports that wait as *start-up*; the clock starts after it. The
paced phase lasts ``--duration`` or ``--min-calls`` sample periods, whichever is
longer, so its p99 is a percentile, not the slowest of a few calls.

**Payloads per row.** ``--content atari`` fills the payloads of the rows whose
environment is Atari (``Atari-*``) with real Atari frame stacks (consecutive 4x84x84
stacks of the tests' Pong and Breakout sample, ``atari_frames.py``) and ``--codec lz4``
(or ``zstd``) keeps those payloads compressed in the record log
(``storage_options={"codec": {"obs": ...}, "byte_budget": ...}``, the budget 1.5x the
capacity times an item's compressed size measured on that content); the other rows
keep random raw payloads (they are not images, and random bytes do not compress).
``--max-bytes`` caps what a buffer stores: the record log's budget for compressed rows.

**In RAM** (``--shared-rows``): these rows run again on ``storage="shared"`` (a
segment in ``--shm-dir``, /dev/shm by default; the actors write through writer
handles as on disk), compressed as above; reported: the segment's resident bytes
and the learner's RSS.

Results go to ``<out>/storage-<name>.{json,md,png}``; the Markdown is printed.
Buffer files live under ``--dir`` and are removed at the end, also on Ctrl-C.
See benchmarks/README.md.
"""

from __future__ import annotations

import os

# Before numpy loads: its bundled OpenBLAS would start a thread per core in every process.
for _var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse
import csv
import gc
import json
import math
import multiprocessing as mp
import platform
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import report
from tqdm import tqdm

import hetero_replay
from hetero_replay import PrioritizedReplay, RelaxedReplay

#: The actors part's transition (CartPole-sized), as ours and cpprb declare it.
SCHEMA: dict[str, tuple[tuple[int, ...], str]] = {
    "obs": ((4,), "float32"),
    "action": ((), "int64"),
    "reward": ((), "float32"),
    "next_obs": ((4,), "float32"),
    "done": ((), "float32"),
}
CPPRB_ENV = {name: {"shape": shape or 1, "dtype": np.dtype(dtype)} for name, (shape, dtype) in SCHEMA.items()}
CONTENDERS = ("ours", "cpprb")
BATCH = 256
ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
#: Distinct chunks an actor cycles through, and |TD| arrays the learner cycles through.
POOL = 8
#: The quoted target: ours >= this x cpprb's insert and sample throughput at these actor counts.
TARGET_RATIO, TARGET_ACTORS = 1.5, (2, 4)

#: The workload table (its source: benchmarks/workloads/README.md).
WORKLOADS_CSV = Path(__file__).parent / "workloads" / "replay-needs.csv"
#: Workload rows are ``head`` int64, ``obs`` uint8 (item_bytes - 16,), ``tail`` int64.
ROW_OVERHEAD = 16
WORKLOAD_BATCH = 32
#: Read stalls of this VM's disk the pipeline must ride out: 100-300 ms at times, seen with nothing but
#: pread running (docs/storage.md). Shared memory has none.
STALL_S = 0.3
#: The most the batches drawn ahead may take (a row of 10 MB items holds 320 MB a batch).
PIPELINE_BYTES = 2 << 30
#: The shallowest pipeline: one batch served while the next is drawn.
MIN_DEPTH = 2
#: The paced phase lasts at least this many sample periods (a p99 over fewer calls is their maximum).
MIN_CALLS = 200
#: Seconds the learner waits for the pipeline to draw its batches ahead before a phase (then starts anyway).
PRIME_TIMEOUT = 120.0
#: A paced rate counts as met at this share of the required rate (pacing jitter, start-up).
MET_SHARE = 0.95
#: Bytes of one prefill chunk (rows of the item size, at least one).
PREFILL_CHUNK_BYTES = 64 << 20
#: The smallest capacity a scaled-down workload keeps.
MIN_CAPACITY = 16
#: ``--quick`` runs only the rows whose items are at most this big (unless ``--rows`` names others).
QUICK_MAX_ITEM = 64 << 10
#: Workload phases (part of every row id).
PREFILL, PACED, UNPACED = 1, 2, 3
#: The learner-visible p99 sample latency the issue asks of every paced workload.
P99_TARGET_MS = 5.0
#: Seconds the learner waits for an actor process to start and report ready.
START_TIMEOUT = 120.0
#: What the workloads' payloads hold (``--content``).
CONTENTS = ("random", "atari")
#: The compressed workloads' byte budget over the capacity times an item's measured compressed size.
BUDGET_MARGIN = 1.5

FULL = {"actors": [1, 2, 4], "chunks": [1, 64], "capacity": 1_000_000, "repeats": 3, "seconds": 3.0,
        "duration": 30.0, "unpaced_duration": 15.0, "ram_bytes": 2 << 30, "settle": 60.0,
        "min_calls": MIN_CALLS}  # fmt: skip
QUICK = {"actors": [1, 2, 4], "chunks": [1, 64], "capacity": 200_000, "repeats": 1, "seconds": 0.5,
         "duration": 1.0, "unpaced_duration": 1.0, "ram_bytes": 4 << 20, "max_bytes": 32 << 20,
         "settle": 0.0, "min_calls": 0}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    ctx = mp.get_context(args.start_method)
    base = Path(args.dir).resolve()
    base.mkdir(parents=True, exist_ok=True)
    work = base / f"hetero-replay-bench-storage-{os.getpid()}"
    results: dict[str, Any] = {"machine": machine_info(base), "start_method": args.start_method}
    try:
        work.mkdir()
        if args.part in ("actors", "all"):
            results["actors"] = run_actors(ctx, args.actors, args.chunks, args.capacity, args.repeats,
                                           args.seconds, args.shm_dir)  # fmt: skip
        if args.part in ("workloads", "all"):
            table = read_workloads(args.workloads)
            workloads = select(table, args.rows)
            if args.quick and not args.rows:
                workloads = [w for w in workloads if w.item_bytes <= QUICK_MAX_ITEM]
            runs = [(w, "disk") for w in workloads]
            runs += [(w, "shared") for w in select(table, args.shared_rows)] if args.shared_rows else []
            results["workloads"] = run_workloads(ctx, runs, work, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["machine"]["loadavg_end"] = os.getloadavg()
    paths = write(results, Path(args.out), args.name)
    print(paths["md"].read_text())
    return 0


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--part", choices=("actors", "workloads", "all"), default="all")
    add("--quick", action="store_true", help="tiny sizes and ~1 s phases (name 'quick')")
    add("--actors", type=int, nargs="+", help="actor process counts of the actors part (1 2 4)")
    add("--chunks", type=int, nargs="+", help="rows per add in the actors part (1 64)")
    add("--capacity", type=float, help="transitions held in the actors part (1e6 / quick 2e5)")
    add("--repeats", type=int, help="interleaved repeats per actors cell (3 / quick 1)")
    add("--seconds", type=float, help="seconds per actors measurement (3 / quick 0.5)")
    add("--start-method", choices=mp.get_all_start_methods(), default="fork", help="for ours and cpprb alike")
    add("--shm-dir", default=None, help="storage_options['dir'] of the shared buffers (default: /dev/shm if room)")
    add("--workloads", type=Path, default=WORKLOADS_CSV, help="the workload table (replay-needs.csv)")
    add("--rows", nargs="+", help="workloads to run: algorithm, environment or algorithm/environment (any case)")
    add("--workload-actors", type=int, default=2, help="actor processes per workload (2)")
    add("--duration", type=float, help="seconds of the paced phase per workload (30 / quick 1)")
    add("--unpaced-duration", type=float, help="seconds of the unpaced phase per workload (15 / quick 1)")
    add("--dir", default=tempfile.gettempdir(), help="where the disk buffers live (a folder made inside, removed)")
    add("--max-bytes", type=_size,
        help="largest buffer stored, compressed or raw (70%% of free space in --dir, or all but 8 GiB if more)")  # fmt: skip
    add("--ram-bytes", type=_size, help="disk tier RAM cache of the newest rows (2 GiB / quick 4 MiB)")
    add("--read-threads", type=int, default=8, help="disk tier parallel readers (8)")
    add("--settle", type=float, default=None,
        help="workloads: idle seconds after the prefill before the timed phases (60 / quick 0)")  # fmt: skip
    add("--staleness", type=int, default=None,
        help="workloads: RelaxedReplay staleness = prefetch depth for every row (default: per row, pipeline_depth)")  # fmt: skip
    add("--min-calls", type=int,
        help=f"workloads: the paced phase lasts at least this many sample periods ({MIN_CALLS} / quick 0)")  # fmt: skip
    add("--codec", choices=("lz4", "zstd"), default=None,
        help="workloads: keep the Atari rows' payload compressed in the record log (default: raw rows)")  # fmt: skip
    add("--content", choices=CONTENTS, default="random",
        help="workloads: the Atari rows' payload bytes, random or real Atari frame stacks (random)")  # fmt: skip
    add("--shared-rows", nargs="+", default=[],
        help="workloads: also run these rows on storage='shared' (in RAM), after the disk rows")  # fmt: skip
    add("--out", default=str(Path(__file__).parent / "results"))
    add("--name", help="output <out>/storage-<name>.* (full / quick)")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    for key, value in base.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.capacity = int(args.capacity)
    if args.max_bytes is None:
        free = shutil.disk_usage(_existing(Path(args.dir))).free
        args.max_bytes = int(max(0.7 * free, free - (8 << 30)))
    args.name = args.name or ("quick" if args.quick else "full")
    return args


def _size(text: str) -> int:
    """``2e9``, ``2147483648``, ``512M``, ``2G`` (binary units) as bytes."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    text = text.strip().upper().removesuffix("B").removesuffix("I")
    scale = units.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (for disk_usage before it is made)."""
    while not path.exists() and path.parent != path:
        path = path.parent
    return path


# -- shared flags between the learner and its actors ----------------------------------------

GO, STOP = 0, 1


@dataclass
class Board:
    """What the learner and the actors of one phase share: two flags and one slot per actor.

    ``flags[GO]``, ``flags[STOP]`` are set by the learner; actor ``i`` writes
    ``ready[i]`` when it is set up, then ``rows[i]`` (committed so far) and
    ``seconds[i]`` (its time from GO to STOP).
    """

    flags: Any
    ready: Any
    rows: Any
    seconds: Any

    @classmethod
    def make(cls, ctx: Any, actors: int) -> Board:
        return cls(ctx.RawArray("i", 2), ctx.RawArray("i", actors), ctx.RawArray("d", actors),
                   ctx.RawArray("d", actors))  # fmt: skip


def _start(ctx: Any, target: Callable[..., None], arg_lists: list[tuple[Any, ...]]) -> list[Any]:
    procs = [ctx.Process(target=target, args=args, daemon=True) for args in arg_lists]
    for p in procs:
        p.start()
    return procs


def _wait_ready(procs: list[Any], board: Board) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not all(board.ready):
        _check_alive(procs)
        if time.monotonic() > deadline:
            raise TimeoutError(f"actors not ready after {START_TIMEOUT} s")
        time.sleep(0.002)


def _check_alive(procs: list[Any]) -> None:
    for i, p in enumerate(procs):
        if p.exitcode not in (None, 0):
            raise RuntimeError(f"actor {i} exited with code {p.exitcode} (its traceback is above)")


def _stop(procs: list[Any], board: Board, timeout: float = 60.0) -> None:
    """Set STOP, join every actor (terminate those that do not finish); raise if one failed."""
    board.flags[STOP] = 1
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for i in hung:
        procs[i].terminate()
        procs[i].join(5)
    if hung:
        raise RuntimeError(f"actors {hung} did not stop within {timeout:.0f} s; terminated")
    _check_alive(procs)


@contextmanager
def _actors(
    ctx: Any, target: Callable[..., None], arg_lists: list[tuple[Any, ...]], board: Board
) -> Iterator[list[Any]]:
    """Actor processes for one phase; stopped and joined on the way out, whatever happens."""
    procs = _start(ctx, target, arg_lists)
    try:
        yield procs
    finally:
        _stop(procs, board)


# -- part 1: actors vs cpprb -----------------------------------------------------------------


def transitions(rows: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``rows`` random transitions of :data:`SCHEMA`."""
    return {
        "obs": rng.random((rows, 4), dtype=np.float32),
        "action": rng.integers(0, 4, rows, dtype=np.int64),
        "reward": rng.random(rows, dtype=np.float32),
        "next_obs": rng.random((rows, 4), dtype=np.float32),
        "done": (rng.random(rows) < 0.05).astype(np.float32),
    }


def _insert_actor(kind: str, handle: Any, chunk: int, slot: int, board: Board) -> None:
    """An actor of the actors part: add chunks of ``chunk`` rows from GO to STOP, as fast as it can."""
    with suppress(KeyboardInterrupt):
        pool = [transitions(chunk, np.random.default_rng([slot, i])) for i in range(POOL)]
        if kind == "ours":
            add: Callable[[dict[str, np.ndarray]], Any] = handle.add
        else:
            add = lambda batch: handle.add(**batch)  # noqa: E731
        flags, rows = board.flags, 0
        add(pool[0])  # first-call costs (mapping the segment) before the clock starts
        board.ready[slot] = 1
        while not flags[GO]:
            time.sleep(0.0005)
        start = time.perf_counter()
        i = 0
        while not flags[STOP]:
            add(pool[i % POOL])
            rows += chunk
            i += 1
        board.seconds[slot] = time.perf_counter() - start
        board.rows[slot] = rows
        if kind == "ours":
            handle.close()


def make_contender(kind: str, capacity: int, ctx: Any, shm_dir: str | None) -> Any:
    """A full buffer of ``capacity`` transitions: ours on shared storage, or cpprb's MP buffer."""
    fill = transitions(capacity, np.random.default_rng(0))
    if kind == "ours":
        buf = PrioritizedReplay(capacity, SCHEMA, alpha=ALPHA, beta=BETA, eps=EPS, seed=0, storage="shared",
                                storage_options={"dir": shm_dir})  # fmt: skip
        try:
            buf.add(fill)
        except BaseException:
            buf.close()
            raise
        return buf
    import cpprb

    rb = cpprb.MPPrioritizedReplayBuffer(capacity, CPPRB_ENV, alpha=ALPHA, eps=EPS, ctx=ctx)
    rb.add(**fill)
    return rb


def measure_actors(
    kind: str, actors: int, chunk: int, capacity: int, seconds: float, ctx: Any, shm_dir: str | None
) -> dict[str, Any]:
    """One measurement: ``actors`` processes insert while the learner samples + updates for ``seconds``."""
    buf = make_contender(kind, capacity, ctx, shm_dir)
    try:
        board = Board.make(ctx, actors)
        handles = [buf.writer() for _ in range(actors)] if kind == "ours" else [buf] * actors
        td = [np.abs(np.random.default_rng(i).standard_normal(BATCH)).astype(np.float32) for i in range(POOL)]
        arg_lists = [(kind, handles[i], chunk, i, board) for i in range(actors)]
        with _actors(ctx, _insert_actor, arg_lists, board) as procs:
            _wait_ready(procs, board)
            steps = 0
            board.flags[GO] = 1
            start = time.perf_counter()
            if kind == "ours":
                while time.perf_counter() - start < seconds:
                    b = buf.sample(BATCH)
                    buf.update_priorities(b.indices, td[steps % POOL])
                    steps += 1
            else:
                while time.perf_counter() - start < seconds:
                    s = buf.sample(BATCH, beta=BETA)
                    buf.update_priorities(s["indexes"], td[steps % POOL])
                    steps += 1
            elapsed = time.perf_counter() - start
            board.flags[STOP] = 1
        inserts = sum(board.rows[i] / board.seconds[i] for i in range(actors) if board.seconds[i] > 0)
        return {"inserts_per_s": inserts, "samples_per_s": steps * BATCH / elapsed, "steps": steps,
                "rows_inserted": int(sum(board.rows)), "seconds": elapsed}  # fmt: skip
    finally:
        if kind == "ours":
            buf.close()


def run_actors(
    ctx: Any, actor_counts: Sequence[int], chunks: Sequence[int], capacity: int, repeats: int, seconds: float,
    shm_dir: str | None,
) -> dict[str, Any]:  # fmt: skip
    """Every (actors, chunk, contender) cell ``repeats`` times, round-robin (each round one cell later)."""
    tasks = [(n, c, kind) for n in actor_counts for c in chunks for kind in CONTENDERS]
    runs: dict[tuple[int, int, str], list[dict[str, Any]]] = {t: [] for t in tasks}
    with tqdm(total=len(tasks) * repeats, desc="actors", unit="run", leave=False, disable=None) as bar:
        for r in range(repeats):
            start = r % len(tasks)
            for n, c, kind in tasks[start:] + tasks[:start]:
                bar.set_postfix_str(f"{kind} {n} actors x {c} rows")
                runs[(n, c, kind)].append(attempt(measure_actors, kind, n, c, capacity, seconds, ctx, shm_dir))
                bar.update()
    cells: list[dict[str, Any]] = []
    for n, c, kind in tasks:
        rs = runs[(n, c, kind)]
        ok = [r for r in rs if "error" not in r]
        cells.append({"actors": n, "chunk": c, "label": kind, "repeats": rs,
                      "inserts_per_s": float(np.median([r["inserts_per_s"] for r in ok])) if ok else None,
                      "samples_per_s": float(np.median([r["samples_per_s"] for r in ok])) if ok else None,
                      "errors": sorted({r["error"] for r in rs if "error" in r})})  # fmt: skip
    ratios = []
    for n in actor_counts:
        for c in chunks:
            ours, theirs = (
                next(x for x in cells if (x["actors"], x["chunk"], x["label"]) == (n, c, k)) for k in CONTENDERS
            )
            ins = _ratio(ours["inserts_per_s"], theirs["inserts_per_s"])
            smp = _ratio(ours["samples_per_s"], theirs["samples_per_s"])
            ratios.append({"actors": n, "chunk": c, "insert_ratio": ins, "sample_ratio": smp,
                           "target": n in TARGET_ACTORS,
                           "met": None if n not in TARGET_ACTORS else bool(ins and smp and min(ins, smp) >= TARGET_RATIO)})  # fmt: skip
    return {"capacity": capacity, "batch": BATCH, "repeats": repeats, "seconds": seconds, "shm_dir": shm_dir,
            "cells": cells, "ratios": ratios}  # fmt: skip


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return ours / theirs if ours is not None and theirs else None


def attempt(fn: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """``fn(*args)``, or ``{"error": ...}`` if it raises: one failed measurement does not end the run."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported in the results, the run goes on
        tqdm.write(f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}", file=sys.stderr)
        return {"error": f"{type(e).__name__}: {e}"}


# -- part 2: workloads on the disk tier ------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """One row of replay-needs.csv."""

    algorithm: str
    environment: str
    capacity_items: int
    kind: str
    item_bytes: int
    insert_items_per_s: float
    sample_items_per_s: float

    @property
    def label(self) -> str:
        return f"{self.algorithm}/{self.environment}"


def read_workloads(path: Path) -> list[Workload]:
    with path.open(newline="") as f:
        return [
            Workload(r["algorithm"], r["environment"], int(r["capacity_items"]), r["prioritized_or_reuse"],
                     int(r["item_bytes"]), float(r["insert_items_per_s"]), float(r["sample_items_per_s"]))
            for r in csv.DictReader(f)
        ]  # fmt: skip


def select(workloads: list[Workload], names: Sequence[str] | None) -> list[Workload]:
    """The rows named (algorithm, environment or algorithm/environment, any case); all when ``names`` is None."""
    if not names:
        return workloads
    wanted = {n.lower() for n in names}
    chosen = [w for w in workloads if {w.algorithm.lower(), w.environment.lower(), w.label.lower()} & wanted]
    known = {k for w in workloads for k in (w.algorithm.lower(), w.environment.lower(), w.label.lower())}
    if unknown := [n for n in names if n.lower() not in known]:
        raise SystemExit(f"--rows: no workload named {unknown}; known: {[w.label for w in workloads]}")
    return chosen


def workload_schema(item_bytes: int) -> dict[str, tuple[tuple[int, ...], str]]:
    if item_bytes < ROW_OVERHEAD + 24:
        raise ValueError(f"item_bytes must be >= {ROW_OVERHEAD + 24}, got {item_bytes}")
    return {"head": ((), "int64"), "obs": ((item_bytes - ROW_OVERHEAD,), "uint8"), "tail": ((), "int64")}


def _stamp_offsets(payload: int) -> tuple[int, int, int]:
    """Where a row's id is written inside its payload: start, middle (8-aligned), end."""
    return 0, (payload // 2) & ~7, payload - 8


def rows_of(item_bytes: int, rows: int, rng: np.random.Generator, content: str = "random") -> dict[str, np.ndarray]:
    """A chunk of ``rows`` workload rows with random payloads, or Atari frame stacks (``content="atari"``:
    each payload consecutive stacks from a random one on, :func:`atari_tape`); :func:`stamp` gives them ids."""
    payload = item_bytes - ROW_OVERHEAD
    if content == "atari":
        tape = atari_tape()
        stack = 4 * 84 * 84
        obs = np.empty((rows, payload), np.uint8)
        for row, start in enumerate(rng.integers(0, len(tape) // stack, rows) * stack):
            done, at = 0, int(start)
            while done < payload:  # round the tape as often as the payload needs
                n = min(payload - done, len(tape) - at)
                obs[row, done : done + n] = tape[at : at + n]
                done, at = done + n, 0
    else:
        obs = rng.integers(0, 256, (rows, payload), dtype=np.uint8)
    return {"head": np.zeros(rows, np.int64), "obs": obs, "tail": np.zeros(rows, np.int64)}


_TAPE: list[np.ndarray] = []


def atari_tape() -> np.ndarray:
    """The tests' Pong and Breakout 4x84x84 frame stacks, consecutive, as one uint8 array (5.4 MB; cached)."""
    if not _TAPE:
        from atari_frames import sample_transitions

        _TAPE.append(np.ascontiguousarray(sample_transitions()["obs"]).reshape(-1))
    return _TAPE[0]


def compressed_item_bytes(item_bytes: int, codec: str, content: str) -> int:
    """Log bytes of one item's payload compressed with ``codec`` (the mean of 8 items, its 16-byte header included)."""
    from hetero_replay._native import compress_rows

    obs = rows_of(item_bytes, 8, np.random.default_rng(0), content)["obs"]
    return int(np.mean([len(r) + 16 for r in compress_rows(obs, codec, 1)]))


def stamp(chunk: dict[str, np.ndarray], ids: np.ndarray) -> None:
    """Write ``ids`` into ``head``, ``tail`` and three places of the payload (in place)."""
    chunk["head"][:] = ids
    chunk["tail"][:] = ids
    obs = chunk["obs"]
    for off in _stamp_offsets(obs.shape[1]):
        obs[:, off : off + 8].view(np.int64)[:, 0] = ids


def torn_rows(data: dict[str, Any]) -> tuple[int, int]:
    """(rows whose five id copies disagree, rows never written: id 0) of a sampled batch."""
    head, tail, obs = np.asarray(data["head"]), np.asarray(data["tail"]), np.asarray(data["obs"])
    bad = head != tail
    for off in _stamp_offsets(obs.shape[1]):
        bad |= np.ascontiguousarray(obs[:, off : off + 8]).view(np.int64)[:, 0] != head
    return int(bad.sum()), int(((head == 0) & ~bad).sum())


def _workload_actor(
    writer: Any,
    item_bytes: int,
    slot: int,
    board: Board,
    rows: int,
    chunk: int,
    rate: float,
    phase: int,
    content: str = "random",
) -> None:
    """Add rows of ``item_bytes``: ``rows`` of them (prefill) or until STOP, ``rate`` items/s (0: unpaced).

    Every phase starts at GO (so process start-up is not timed). Ids are
    ``phase << 48 | (slot + 1) << 40 | row``: unique within a run, never 0.
    """
    with suppress(KeyboardInterrupt):
        pool = [rows_of(item_bytes, chunk, np.random.default_rng([slot, i]), content) for i in range(2)]
        flags, done, seq = board.flags, 0, 0
        base = phase << 48 | (slot + 1) << 40
        board.ready[slot] = 1
        while not flags[GO]:
            time.sleep(0.0005)
        period = chunk / rate if rate > 0 else 0.0
        start = due = time.perf_counter()
        while not flags[STOP] and (rows <= 0 or done < rows):
            batch = pool[seq % len(pool)]
            take = chunk if rows <= 0 else min(chunk, rows - done)
            if take < chunk:
                batch = {k: v[:take] for k, v in batch.items()}
            stamp(batch, base + done + np.arange(take, dtype=np.int64))
            done += writer.add(batch)
            seq += 1
            board.rows[slot] = done
            if period:
                due += period
                while not flags[STOP] and (wait := due - time.perf_counter()) > 0:
                    time.sleep(min(wait, 0.05))
        elapsed = time.perf_counter() - start
        # Paced and on schedule, the last row was due at done / rate: do not count it early.
        board.seconds[slot] = max(elapsed, done / rate) if rate > 0 else elapsed
        writer.close()


def _evict(buf: PrioritizedReplay, path: Path) -> int:
    """A durable point, then every file under ``path`` fsync-ed and dropped from the page cache; their bytes.

    This empties the disk tier's RAM window of the newest rows too: the timed
    phase starts cold, and the window fills again with the rows actors add.
    """
    buf.flush()
    total = 0
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def _disk_bytes(path: Path) -> int:
    """Blocks allocated to the files under ``path`` (a sparse file counts what it holds)."""
    return sum(p.stat().st_blocks * 512 for p in path.rglob("*") if p.is_file())


def plan(w: Workload, max_bytes: int, stored_item_bytes: int | None = None) -> tuple[int, float]:
    """(capacity, scale): the row's capacity, or the largest that fits ``max_bytes`` (item size kept).

    ``stored_item_bytes``: what the storage takes per item (the record log's share of a compressed
    item), ``item_bytes`` when not given (raw rows).
    """
    stored = stored_item_bytes or w.item_bytes
    if w.capacity_items * stored <= max_bytes:
        return w.capacity_items, 1.0
    capacity = max(MIN_CAPACITY, max_bytes // stored)
    return capacity, capacity / w.capacity_items


def payload_of(w: Workload, args: argparse.Namespace) -> tuple[str, str | None]:
    """(content, codec) of a row: ``--content`` and ``--codec`` for Atari rows, random raw bytes for the others."""
    if w.environment.lower().startswith("atari"):
        return args.content, args.codec
    return "random", None


def pipeline_depth(batch_seconds: float, period: float, batch_bytes: int, stall: float) -> int:
    """Batches to draw ahead: one batch's read + decode (``batch_seconds``) and a ``stall`` covered at one
    batch per ``period``; at least :data:`MIN_DEPTH`, at most what :data:`PIPELINE_BYTES` holds."""
    want = math.ceil((batch_seconds + stall) / period)
    return max(MIN_DEPTH, min(want, PIPELINE_BYTES // batch_bytes))


def run_workloads(ctx: Any, runs: list[tuple[Workload, str]], work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Each (row, storage) of ``runs`` in turn (a failed one is reported, the rest go on)."""
    rows = []
    for w, storage in runs:
        path = work / f"{w.label}-{storage}".replace("/", "-").replace("(", "").replace(")", "")
        content, codec = payload_of(w, args)
        try:
            rows.append({"label": w.label, "storage": storage, "content": content, "codec": codec, **asdict(w),
                         **attempt(run_workload, ctx, w, path, args, storage)})  # fmt: skip
        finally:
            shutil.rmtree(path, ignore_errors=True)
    return {"actors": args.workload_actors, "staleness": args.staleness, "worker": "thread",
            "stall_s": STALL_S, "pipeline_bytes": PIPELINE_BYTES, "min_calls": args.min_calls,
            "duration_s": args.duration, "unpaced_duration_s": args.unpaced_duration, "max_bytes": args.max_bytes,
            "settle_s": args.settle,
            "ram_bytes": args.ram_bytes, "read_threads": args.read_threads, "met_share": MET_SHARE,
            "codec": args.codec, "content": args.content, "rows": rows}  # fmt: skip


def run_workload(ctx: Any, w: Workload, path: Path, args: argparse.Namespace, storage: str = "disk") -> dict[str, Any]:
    """Prefill, evict, size the pipeline, paced phase, evict, unpaced phase: one row's results.

    ``storage="shared"`` keeps the buffer in a shared-memory segment (nothing to evict or settle).
    """
    content, codec = payload_of(w, args)
    on_disk = storage == "disk"
    n = args.workload_actors
    batch = max(1, min(WORKLOAD_BATCH, int(w.sample_items_per_s)))
    period = batch / w.sample_items_per_s
    options: dict[str, Any] = (
        {"path": str(path), "ram_bytes": args.ram_bytes, "read_threads": args.read_threads}
        if on_disk
        else {"dir": args.shm_dir}
    )
    packed = None
    if codec is not None:
        packed = compressed_item_bytes(w.item_bytes, codec, content)
    capacity, scale = plan(w, args.max_bytes, None if packed is None else int(BUDGET_MARGIN * packed))
    if packed is not None:
        options.update(codec={"obs": codec}, byte_budget=int(BUDGET_MARGIN * capacity * packed))
    buf = PrioritizedReplay(capacity, workload_schema(w.item_bytes), alpha=ALPHA, beta=BETA, eps=EPS, seed=0,
                            storage=storage, storage_options=options)  # fmt: skip
    rr: RelaxedReplay | None = None
    try:
        prefill = _prefill(ctx, buf, w, capacity, n, content)
        evicted = _evict(buf, path) if on_disk else 0
        if on_disk:
            # A prefill writes at disk speed, which a run filling its buffer over hours never does; on this
            # VM the host then flushes its own cache for a while, stalling reads for 100-600 ms (measured
            # with bare pread, docs/storage.md). Let that pass: the phases measure the steady state.
            time.sleep(args.settle)
        # One cold batch, read and decoded by the learner: what the pipeline's depth must cover.
        start = time.perf_counter()
        buf.sample(batch)
        batch_seconds = time.perf_counter() - start
        depth = args.staleness or pipeline_depth(batch_seconds, period, batch * w.item_bytes,
                                                 STALL_S if on_disk else 0.0)  # fmt: skip
        if on_disk:
            _evict(buf, path)
        rr = RelaxedReplay(buf, staleness=depth, prefetch=depth, worker="thread")
        paced_s = max(args.duration, args.min_calls * period)
        paced = attempt(_phase, ctx, buf, rr, w, batch, n, paced_s, True, content)
        if on_disk:
            _evict(buf, path)
        unpaced = attempt(_phase, ctx, buf, rr, w, batch, n, args.unpaced_duration, False, content)
        disk = _disk_bytes(path) if on_disk else 0
        store = buf.storage
        # The disk tier keeps the newest cache_rows records in the page cache (``ram_bytes`` // record size).
        record = getattr(getattr(store, "format", None), "bytes", w.item_bytes)
        cache = getattr(store, "cache_rows", 0) * record
        in_ram = {} if on_disk else {"segment_bytes": os.stat(store.path).st_blocks * 512, **_memory()}
        compressed = {}
        if packed is not None:
            compressed = {"item_log_bytes": packed, "log_bytes_per_row": store.bytes_per_row,
                          "byte_budget": options["byte_budget"], "evicted_rows": store.evicted_rows}  # fmt: skip
    finally:
        (rr or buf).close()
    data_bytes = capacity * w.item_bytes
    return {"capacity": capacity, "scale": scale, "data_bytes": data_bytes, "record_bytes": record,
            "disk_bytes": disk, "evicted_bytes": evicted, "ram_bytes": args.ram_bytes, "ram_cache_bytes": cache,
            "ram_cache_share": cache / (capacity * record), "batch": batch, "period_s": period,
            "batch_probe_s": batch_seconds, "depth": depth,
            "learner_max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "prefill": prefill, "paced": paced, "unpaced": unpaced, **in_ram, **compressed}  # fmt: skip


def _memory() -> dict[str, int]:
    """The learner's resident bytes now: all, anonymous, and of shared memory mappings (/proc/self/status)."""
    fields = {"VmRSS": "rss_bytes", "RssAnon": "rss_anon_bytes", "RssShmem": "rss_shmem_bytes"}
    out = {}
    with suppress(OSError), open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in fields:
                out[fields[key]] = int(value.split()[0]) * 1024
    return out


def _drawn_ahead(rr: RelaxedReplay) -> int:
    """Batches the pipeline's worker has drawn ahead, waiting for the learner.

    Reads the thread executor's queue, which the library does not publish: a benchmark probe
    (the workloads run ``worker="thread"``).
    """
    core = rr._core  # noqa: SLF001 - see above
    return rr.prefetch if core is None else len(core.ready)


def _wait_primed(rr: RelaxedReplay) -> bool:
    """Wait until the worker has drawn ``rr.prefetch`` batches ahead (at most :data:`PRIME_TIMEOUT`); whether it did."""
    deadline = time.monotonic() + PRIME_TIMEOUT
    while _drawn_ahead(rr) < rr.prefetch:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.002)
    return True


def _prefill(
    ctx: Any, buf: PrioritizedReplay, w: Workload, capacity: int, n: int, content: str = "random"
) -> dict[str, Any]:
    """Fill the buffer to capacity from ``n`` writer handles in chunks of ~64 MiB."""
    chunk = max(1, min(capacity, PREFILL_CHUNK_BYTES // w.item_bytes))
    shares = [capacity // n + (i < capacity % n) for i in range(n)]
    board = Board.make(ctx, n)
    arg_lists = [(buf.writer(), w.item_bytes, i, board, shares[i], chunk, 0.0, PREFILL, content) for i in range(n)]
    with tqdm(total=capacity * w.item_bytes, desc=f"{w.label} prefill", unit="B", unit_scale=True, leave=False,
              disable=None) as bar, _actors(ctx, _workload_actor, arg_lists, board) as procs:  # fmt: skip
        _wait_ready(procs, board)
        board.flags[GO] = 1
        start = time.perf_counter()
        while any(p.is_alive() for p in procs):
            _check_alive(procs)
            bar.update(int(sum(board.rows)) * w.item_bytes - bar.n)
            time.sleep(0.1)
        _check_alive(procs)
        bar.update(int(sum(board.rows)) * w.item_bytes - bar.n)
    seconds = max(board.seconds) or time.perf_counter() - start  # each actor's own GO-to-last-row time
    written = int(sum(board.rows))
    if written != capacity:
        raise RuntimeError(f"{w.label}: prefill committed {written} rows, expected {capacity}")
    return {"seconds": seconds, "items_per_s": written / seconds, "bytes_per_s": written * w.item_bytes / seconds,
            "chunk": chunk}  # fmt: skip


def _phase(
    ctx: Any,
    buf: PrioritizedReplay,
    rr: RelaxedReplay,
    w: Workload,
    batch: int,
    n: int,
    duration: float,
    paced: bool,
    content: str = "random",
) -> dict[str, Any]:
    """Actors insert (at the row's rate if ``paced``) while the learner samples through ``rr`` for ``duration`` s."""
    board = Board.make(ctx, n)
    insert_rate = w.insert_items_per_s / n if paced else 0.0
    phase = PACED if paced else UNPACED
    arg_lists = [(buf.writer(), w.item_bytes, i, board, 0, 1, insert_rate, phase, content) for i in range(n)]
    period = batch / w.sample_items_per_s if paced else 0.0
    td = [np.abs(np.random.default_rng(i).standard_normal(batch)).astype(np.float32) for i in range(POOL)]
    latencies: list[float] = []
    called_at: list[float] = []  # seconds into the phase, to see when slow calls happen
    ahead: list[int] = []  # batches drawn ahead when the call came: 0 means it waited for the pipeline
    # Per call: the learner thread's CPU s, s waiting for a core, full (generation 2) garbage collections.
    spent: list[tuple[float, float, int]] = []
    dropped = rr.dropped_updates
    desc = f"{w.label} {'paced' if paced else 'unpaced'}"
    with tqdm(total=round(duration, 1), desc=desc, unit="s", leave=False, disable=None) as bar, \
            _actors(ctx, _workload_actor, arg_lists, board) as procs:  # fmt: skip
        _wait_ready(procs, board)
        # Start-up, untimed: one step (nothing is drawn ahead before the first), then the pipeline fills.
        primed_at = time.perf_counter()
        b = rr.sample(batch)
        torn, empty = torn_rows(b.data)
        rr.update_priorities(b.indices, td[0])
        primed = _wait_primed(rr)
        startup = time.perf_counter() - primed_at
        board.flags[GO] = 1
        start = due = time.perf_counter()
        while (due if paced else time.perf_counter()) - start < duration:
            found = _drawn_ahead(rr)
            waited, cpu, collected = _run_queue_s(), time.thread_time(), _full_collections()
            t = time.perf_counter()
            b = rr.sample(batch)
            latencies.append(time.perf_counter() - t)
            spent.append((time.thread_time() - cpu, _run_queue_s() - waited, _full_collections() - collected))
            called_at.append(t - start)
            ahead.append(found)
            bad, unwritten = torn_rows(b.data)
            torn, empty = torn + bad, empty + unwritten
            rr.update_priorities(b.indices, td[len(latencies) % POOL])
            if paced:
                due += period
                while (wait := due - time.perf_counter()) > 0:
                    time.sleep(min(wait, 0.05))
            bar.update(round(min(time.perf_counter() - start, duration) - bar.n, 1))
            if len(latencies) % 64 == 0:
                _check_alive(procs)
        elapsed = time.perf_counter() - start
        board.flags[STOP] = 1
    inserted = sum(board.rows)
    insert_seconds = max(board.seconds) or elapsed
    lat_ms = np.asarray(latencies) * 1e3
    result = {
        "seconds": elapsed,
        "startup_s": startup,
        "primed": primed,
        "sample_calls": len(latencies),
        "insert_items_per_s": inserted / insert_seconds,
        "sample_items_per_s": len(latencies) * batch / elapsed,
        "insert_bytes_per_s": inserted * w.item_bytes / insert_seconds,
        "sample_bytes_per_s": len(latencies) * batch * w.item_bytes / elapsed,
        "latency_ms": {
            "p50": float(np.percentile(lat_ms, 50)),
            "p99": float(np.percentile(lat_ms, 99)),
            "max": float(lat_ms.max()),
            "mean": float(lat_ms.mean()),
        },
        # When the calls slower than 5 ms came (s into the phase) and how slow (ms): at most 100; how many
        # batches were drawn ahead then (0: the pipeline ran dry; more: the learner's thread was late); and
        # of the call's ms, those the learner's thread ran on a core and those it waited for one (runnable,
        # not running; it may include a wait that began before the call); the rest it was blocked (a lock,
        # the GIL, a page fault's I/O); and the full garbage collections Python ran during the call.
        "slow_calls": [
            [
                round(called_at[i], 3),
                round(float(lat_ms[i]), 2),
                ahead[i],
                *(round(x * 1e3, 2) for x in spent[i][:2]),
                spent[i][2],
            ]
            for i in np.flatnonzero(lat_ms > 5)[:100]
        ],
        "full_collections": sum(gen2 for _, _, gen2 in spent),
        "dry_calls": ahead.count(0),
        "torn_rows": torn,
        "unwritten_rows": empty,
        "dropped_updates": rr.dropped_updates - dropped,
    }
    if paced:
        result["insert_required"] = w.insert_items_per_s
        result["sample_required"] = w.sample_items_per_s
        result["insert_met"] = result["insert_items_per_s"] >= MET_SHARE * w.insert_items_per_s
        result["sample_met"] = result["sample_items_per_s"] >= MET_SHARE * w.sample_items_per_s
    return result


# -- machine, outputs ----------------------------------------------------------------------------


def machine_info(directory: Path) -> dict[str, Any]:
    """CPU, cores, memory, the disk under ``directory``, kernel, versions, git revision, load."""
    cpu, mem_gib = report.cpu_model(), report.memory_gib()
    disk = shutil.disk_usage(directory)
    shm = shutil.disk_usage("/dev/shm") if Path("/dev/shm").is_dir() else None
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": mem_gib,
        "dir": str(directory),
        "disk_total_gib": round(disk.total / 2**30, 1),
        "disk_free_gib": round(disk.free / 2**30, 1),
        "shm_free_gib": None if shm is None else round(shm.free / 2**30, 1),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "versions": {pkg: report.package_version(pkg) for pkg in ("hetero-replay", "numpy", "cpprb")},
        "git": report.git_revision(),
        "replay_threads_default": hetero_replay.num_threads(),
        "loadavg_start": os.getloadavg(),
    }


def write(results: dict[str, Any], out: Path, name: str) -> dict[str, Path]:
    """``storage-<name>.json``, ``.md`` and ``.png`` (no ``png`` without matplotlib); their paths."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {ext: out / f"storage-{name}.{ext}" for ext in ("json", "md", "png")}
    paths["json"].write_text(json.dumps(results, indent=1))
    if not plot(results, paths["png"]):
        del paths["png"]
    paths["md"].write_text(markdown(results, paths.get("png")))
    return paths


def _rate(x: float | None) -> str:
    if x is None:
        return "—"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _bytes(x: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def _times(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def _mark(ok: bool | None) -> str:
    return "—" if ok is None else ("✓" if ok else "✗")


def markdown(results: dict[str, Any], png: Path | None = None) -> str:
    m = results["machine"]
    lines = [
        "# Replay storage service: actor processes and workloads",
        "",
        f"- **Machine:** {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB RAM, kernel {m['kernel']}; "
        f"`{m['dir']}`: {m['disk_free_gib']} of {m['disk_total_gib']} GiB free; /dev/shm {m['shm_free_gib']} GiB free; "
        f"load {m['loadavg_start'][0]:.2f} at start, {m.get('loadavg_end', [float('nan')])[0]:.2f} at end",
        f"- **Run:** {m['date']}, git {m['git']}, hetero-replay {m['versions']['hetero-replay']}, "
        f"cpprb {m['versions']['cpprb']}; processes started with `{results['start_method']}`",
    ]
    if png is not None:
        lines += ["", f"![ours vs cpprb, workloads]({png.name})"]
    if "actors" in results:
        lines += _actors_markdown(results["actors"])
    if "workloads" in results:
        lines += _workloads_markdown(results["workloads"])
    return "\n".join(lines) + "\n"


def _actors_markdown(a: dict[str, Any]) -> list[str]:
    cell = {(c["actors"], c["chunk"], c["label"]): c for c in a["cells"]}
    lines = [
        "",
        '## Actors: ours (`storage="shared"`) vs cpprb `MPPrioritizedReplayBuffer`',
        "",
        f"{a['capacity']:,} transitions held (full, so inserts overwrite); actor processes add chunks of *chunk* rows "
        f"as fast as they can while the learner samples B = {a['batch']} and updates B priorities. Median of "
        f"{a['repeats']} interleaved repeats of {a['seconds']} s. *inserts/s*: rows committed by all actors; "
        "*samples/s*: transitions sampled by the learner. `×`: ours ÷ cpprb (above 1: ours faster).",
        "",
        "| actors | chunk | ours inserts/s | cpprb inserts/s | × | ours samples/s | cpprb samples/s | × | target |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|:-:|",
    ]
    for r in a["ratios"]:
        o, c = cell[(r["actors"], r["chunk"], "ours")], cell[(r["actors"], r["chunk"], "cpprb")]
        lines.append(f"| {r['actors']} | {r['chunk']} | {_rate(o['inserts_per_s'])} | {_rate(c['inserts_per_s'])} | "
                     f"{_times(r['insert_ratio'])} | {_rate(o['samples_per_s'])} | {_rate(c['samples_per_s'])} | "
                     f"{_times(r['sample_ratio'])} | {_mark(r['met'])} |")  # fmt: skip
    targets = [r for r in a["ratios"] if r["target"]]
    if targets:
        met = sum(bool(r["met"]) for r in targets)
        lines += ["", f"**Target** (ours ≥ {TARGET_RATIO}× cpprb's insert and sample throughput at "
                      f"{' and '.join(map(str, TARGET_ACTORS))} actors): {met} of {len(targets)} cells met."]  # fmt: skip
    errors = [(c, e) for c in a["cells"] for e in c.get("errors", [])]
    if errors:
        lines += ["", "**Failed measurements** (left out of the medians):", ""]
        lines += [f"- {c['label']}, {c['actors']} actors × {c['chunk']} rows: {e}" for c, e in errors]
    return lines


def _get(d: dict[str, Any], *keys: str) -> Any:
    """``d[k0][k1]...``, or None where a level is missing (a phase that failed)."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def _ms(d: dict[str, Any]) -> str:
    p50, p99 = _get(d, "latency_ms", "p50"), _get(d, "latency_ms", "p99")
    return "—" if p50 is None else f"{p50:.2f} / {p99:.2f}"


def _depth(wl: dict[str, Any]) -> str:
    if wl.get("staleness"):
        return f"{wl['staleness']} for every row (`--staleness`)"
    if "stall_s" not in wl:  # results of a run before the per-row rule
        return f"{wl.get('prefetch', 8)} for every row"
    return (f"per row (*d*): ⌈(one cold batch's read + decode + {wl['stall_s']} s of disk stall) ÷ sample period⌉, "
            f"at least {MIN_DEPTH}, at most {_bytes(wl['pipeline_bytes'])} of batches (no stall term in RAM)")  # fmt: skip


def _workloads_markdown(wl: dict[str, Any]) -> list[str]:
    storages = sorted({r.get("storage", "disk") for r in wl["rows"]})
    lines = [
        "",
        "## Workloads (" + ", ".join(f'`storage="{s}"`' for s in storages) + ")",
        "",
        f"Rows of replay-needs.csv. Items are `head` int64, `obs` uint8 (item bytes − 16), `tail` int64; "
        f"{wl['actors']} actor processes insert one item per `add` through writer handles; the learner samples "
        f'through `RelaxedReplay(staleness=d, prefetch=d, worker="{wl["worker"]}")` and updates priorities; '
        f"depth {_depth(wl)}. The buffer is prefilled to capacity by the actors; on disk a durable point is made "
        "and its files are evicted from the page cache (fsync + `POSIX_FADV_DONTNEED`) before each timed phase, "
        f"and after the prefill the disk is left idle for {wl.get('settle_s', 0)} s (the host flushes its cache "
        "after a prefill at disk speed, stalling reads; a buffer filled over hours never sees that). "
        "*Start-up*: before each phase's clock starts, one untimed `sample` and the wait until *d* batches are "
        "drawn ahead (excluded from the latencies, reported here). "
        f"*Paced* ({wl['duration_s']} s or {wl.get('min_calls', 0)} sample periods, whichever is longer; *calls*: "
        "timed `sample` calls, *dry*: those that found no batch drawn ahead): actors at the row's insert rate, the learner at its sample rate, sleeping "
        f"out each period; ✓ when the achieved rate is ≥ {wl['met_share']:.0%} of the required. "
        f"*Max* ({wl['unpaced_duration_s']} s): actors and learner unpaced. Latency: the `rr.sample` call only. "
        "*torn*: sampled rows whose five id copies disagree (must be 0). "
        f"Budget {_bytes(wl['max_bytes'])} stored per buffer (`--max-bytes`); `ram_bytes` {_bytes(wl['ram_bytes'])} "
        f"(*RAM cache*: what the disk tier keeps of it, in whole records, and the share of the buffer); "
        f"{wl['read_threads']} read threads.",
        *_compressed_markdown(wl),
        "",
        "| workload | storage | items × bytes | scale | payload | RAM cache | B | d | insert/s req → paced | "
        "sample/s req → paced | start-up s | calls | p50 / p99 ms | torn | max insert/s | max sample/s (MB/s) | "
        "max p50 / p99 ms | prefill |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    errors = []
    for r in wl["rows"]:
        storage = r.get("storage", "disk")
        if "error" in r:
            lines.append(f"| {r['label']} | {storage} | " + " | ".join(["—"] * 16) + " |")
            errors.append((r["label"], "run", r["error"]))
            continue
        p, u, f = r["paced"], r["unpaced"], r["prefill"]
        errors += [(r["label"], name, ph["error"]) for name, ph in (("paced", p), ("max", u)) if "error" in ph]
        torn = sum(ph.get("torn_rows", 0) for ph in (p, u))
        paced_insert = (f"{_rate(r['insert_items_per_s'])} → {_rate(_get(p, 'insert_items_per_s'))} "
                        f"{_mark(_get(p, 'insert_met'))}")  # fmt: skip
        paced_sample = (f"{_rate(r['sample_items_per_s'])} → {_rate(_get(p, 'sample_items_per_s'))} "
                        f"{_mark(_get(p, 'sample_met'))}")  # fmt: skip
        max_bytes = _get(u, "sample_bytes_per_s")
        payload = f"{r.get('content', 'random')}, {r.get('codec') or 'raw'}"
        cache = "in RAM" if storage == "shared" else f"{_bytes(r['ram_cache_bytes'])} ({r['ram_cache_share']:.1%})"
        startup = " / ".join("—" if ph.get("startup_s") is None else f"{ph['startup_s']:.2f}" for ph in (p, u))
        lines.append(
            f"| {r['label']} | {storage} | {r['capacity']:,} × {_bytes(r['item_bytes'])} = {_bytes(r['data_bytes'])} | "
            f"{r['scale']:.3g} | {payload} | {cache} | {r['batch']} | {r.get('depth', '—')} | "
            f"{paced_insert} | {paced_sample} | {startup} | {_calls(p)} | {_ms(p)} | {torn} | "
            f"{_rate(_get(u, 'insert_items_per_s'))} | "
            f"{_rate(_get(u, 'sample_items_per_s'))} ({'—' if max_bytes is None else f'{max_bytes / 1e6:.0f}'}) | "
            f"{_ms(u)} | {f['seconds']:.1f} s, {f['bytes_per_s'] / 1e6:.0f} MB/s |"
        )
    done = [r for r in wl["rows"] if "error" not in r]
    scaled = [r for r in done if r["scale"] < 1]
    if scaled:
        lines += ["", "Scaled down to fit the budget (capacity scaled, item size kept): "
                  + ", ".join(f"{r['label']} ×{r['scale']:.3g} ({_bytes(r['capacity_items'] * r['item_bytes'])} "
                              f"→ {_bytes(r['data_bytes'])})" for r in scaled) + "."]  # fmt: skip
    slow = [f"{r['label']} ({r.get('storage', 'disk')}) {_slow(r['paced'])}" for r in done
            if _get(r, "paced", "slow_calls")]  # fmt: skip
    lines += ["", "*start-up s*: paced / max phase."
              + (" Paced calls over 5 ms (s into the phase, ms, batches drawn ahead when called: 0 = the pipeline "
                 "ran dry; then, where measured, ms the learner's thread ran, ms it waited for a core, full garbage collections "
                 "during the call): " + "; ".join(slow) + "." if slow else "")]  # fmt: skip
    phases = [ph for r in done for ph in (r["paced"], r["unpaced"])]
    torn = sum(ph.get("torn_rows", 0) for ph in phases)
    unwritten = sum(ph.get("unwritten_rows", 0) for ph in phases)
    met = sum(bool(_get(r, "paced", "insert_met") and _get(r, "paced", "sample_met")) for r in done)
    p99_met = sum((_get(r, "paced", "latency_ms", "p99") or math.inf) <= P99_TARGET_MS for r in done)
    lines += ["", f"**Summary:** {met} of {len(wl['rows'])} runs sustained at their required rates; "
                  f"{p99_met} of {len(wl['rows'])} with paced p99 ≤ {P99_TARGET_MS:g} ms; "
                  f"{torn} torn and {unwritten} never-written rows sampled (both must be 0)."]  # fmt: skip
    if errors:
        lines += ["", "**Failed:**", ""] + [f"- {label} ({what}): {e}" for label, what, e in errors]
    return lines


def _calls(phase: dict[str, Any]) -> str:
    """Timed calls of a phase, and how many found no batch drawn ahead (waited for the pipeline)."""
    if "sample_calls" not in phase:
        return "—"
    dry = phase.get("dry_calls")
    return f"{phase['sample_calls']}" + ("" if dry is None else f" ({dry} dry)")


def _full_collections() -> int:
    """Full (generation 2) garbage collections this process has run so far."""
    return gc.get_stats()[2]["collections"]


def _run_queue_s() -> float:
    """Seconds this thread has waited for a core so far (Linux schedstat; 0 where there is none)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def _slow(phase: dict[str, Any]) -> str:
    calls = phase.get("slow_calls", [])
    shown = ", ".join(f"({', '.join(f'{x:g}' for x in call)})" for call in calls[:6])
    return f"{len(calls)} of {phase['sample_calls']}: {shown}" + (", ..." if len(calls) > 6 else "")


def _compressed_markdown(wl: dict[str, Any]) -> list[str]:
    """The payloads and codecs of the rows, if not all random raw bytes, and what the in-RAM rows took."""
    rows = [r for r in wl["rows"] if "error" not in r]
    if all(r.get("content", wl.get("content")) == "random" and not r.get("codec", wl.get("codec")) for r in rows) and \
            not any(r.get("storage") == "shared" for r in rows):  # fmt: skip
        return []
    lines = ["", "Payloads (*payload* column): real Atari frame stacks (Pong, Breakout; `--content atari`) for the Atari "
             "rows, random bytes for the others; compressed ones are kept compressed in the record log, with a byte "
             f"budget {BUDGET_MARGIN}x capacity x an item's measured compressed size:"]  # fmt: skip
    for r in rows:
        if "item_log_bytes" in r:
            where = (f"files {_bytes(r['disk_bytes'])} on disk" if r.get("storage", "disk") == "disk" else
                     f"segment {_bytes(r['segment_bytes'])} resident in RAM ({r['capacity'] * r['item_bytes'] / r['segment_bytes']:.0f}x "
                     f"less than the raw rows), learner RSS {_bytes(r.get('rss_bytes', 0))} of which shared memory "
                     f"{_bytes(r.get('rss_shmem_bytes', 0))}")  # fmt: skip
            lines.append(
                f"- {r['label']} ({r.get('storage', 'disk')}): an item {_bytes(r['item_bytes'])} -> "
                f"{_bytes(r['item_log_bytes'])} of records ({r['item_bytes'] / r['item_log_bytes']:.0f}x); {where}; "
                f"{r['evicted_rows']} rows evicted"
            )
        elif r.get("storage") == "shared":
            lines.append(f"- {r['label']} (shared, raw): segment {_bytes(r['segment_bytes'])} resident in RAM")
    return lines


def plot(results: dict[str, Any], path: Path) -> bool:
    """Ours vs cpprb bars per actor count; per workload achieved ÷ required and p99 latency. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels: list[Callable[[Any], None]] = []
    if "actors" in results:
        a = results["actors"]
        for metric, title in (("inserts_per_s", "inserts/s"), ("samples_per_s", "sampled transitions/s")):
            for chunk in sorted({c["chunk"] for c in a["cells"]}):
                panels.append(partial(_bars_actors, a=a, metric=metric, title=title, chunk=chunk))
    rows = [r for r in results.get("workloads", {}).get("rows", []) if "error" not in r]
    if rows:
        panels += [partial(_bars_workloads_rates, rows=rows), partial(_bars_workloads_latency, rows=rows)]
    if not panels:
        return False
    cols = min(4, len(panels))
    fig, axes = plt.subplots(-(-len(panels) // cols), cols, figsize=(4.5 * cols, 3.8 * -(-len(panels) // cols)),
                             squeeze=False)  # fmt: skip
    for ax, draw in zip(axes.flat, panels, strict=False):
        draw(ax)
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _bars_actors(ax: Any, a: dict[str, Any], metric: str, title: str, chunk: int) -> None:
    counts = sorted({c["actors"] for c in a["cells"] if c["chunk"] == chunk})
    x = np.arange(len(counts))
    for k, label in enumerate(CONTENDERS):
        ys = [next(c[metric] for c in a["cells"] if (c["actors"], c["chunk"], c["label"]) == (n, chunk, label))
              for n in counts]  # fmt: skip
        ax.bar(x + (k - 0.5) * 0.4, [np.nan if y is None else y for y in ys], 0.4, label=label)
    ax.set_xticks(x, [str(n) for n in counts])
    ax.set_xlabel("actor processes")
    ax.set_title(f"{title}, chunk {chunk}")
    ax.legend()


def _name(r: dict[str, Any]) -> str:
    """A run's label in the plots: the row, and where it ran when not on disk."""
    return r["label"] + ("" if r.get("storage", "disk") == "disk" else f" ({r['storage']})")


def _share(phase: dict[str, Any], key: str, required: float) -> float:
    value = phase.get(key)
    return np.nan if value is None else value / required


def _bars_workloads_rates(ax: Any, rows: list[dict[str, Any]]) -> None:
    x = np.arange(len(rows))
    series = (
        ("insert paced", "paced", "insert_items_per_s"),
        ("sample paced", "paced", "sample_items_per_s"),
        ("insert max", "unpaced", "insert_items_per_s"),
        ("sample max", "unpaced", "sample_items_per_s"),
    )
    for k, (label, phase, key) in enumerate(series):
        ax.bar(x + (k - 1.5) * 0.2, [_share(r[phase], key, r[key]) for r in rows], 0.2, label=label)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_yscale("log")
    ax.set_xticks(x, [_name(r) for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set_title("achieved ÷ required rate")
    ax.legend(fontsize=7)


def _bars_workloads_latency(ax: Any, rows: list[dict[str, Any]]) -> None:
    x = np.arange(len(rows))
    for k, (label, phase) in enumerate((("paced", "paced"), ("max", "unpaced"))):
        p99 = [_get(r, phase, "latency_ms", "p99") for r in rows]
        ax.bar(x + (k - 0.5) * 0.4, [np.nan if v is None else v for v in p99], 0.4, label=label)
    ax.set_yscale("log")
    ax.set_xticks(x, [_name(r) for r in rows], rotation=45, ha="right", fontsize=7)
    ax.set_title("sample() p99 latency (ms)")
    ax.legend(fontsize=7)


if __name__ == "__main__":
    sys.exit(main())
