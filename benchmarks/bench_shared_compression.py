"""Compressed rows in the shared storage: segment bytes, a writer process's add rate, the learner's step rate.

    python benchmarks/bench_shared_compression.py [--game Pong] [--steps 5000] [--rows 100000]
        [--rate-rows 8192] [--repeats 3] [--layout-repeats 15] [--out benchmarks/results/shared-compression.json]

Transitions are ``--steps`` real steps of one game (ale-py, 84x84 gray, 4-frame stacks, a random
policy: ``bench_compression.transitions``), cycled to fill larger buffers (each row is compressed on
its own, so a row's bytes do not depend on what else the buffer holds).

* **Memory**: a ``--rows`` buffer (``storage="shared"``) with ``codec`` LZ4 and Zstd, its
  ``byte_budget`` the measured mean log bytes per row (records and headers) times the capacity times
  1.1, filled with ``--rows`` rows: the segment file's size (every page of it allocated, in
  ``/dev/shm``: RAM), rows evicted, against the raw shared storage's segment for the same capacity
  (computed from its layout: allocating 5.6 GB for it here would only confirm the arithmetic).
* **Frames** (``frames=True``: each writer stores each distinct frame once, ``storage/log_frames.py``):
  a buffer of the ``--steps`` distinct transitions with LZ4 rows and with LZ4 frames, filled 1-8 rows
  an add (an actor's batches): log bytes per row (``bytes_per_row``, each record once) and their ratio.
* **Gather layout** (frames): the native gather decodes each frame into its place in the batch's
  stacks (out rows a stack apart) against decoding each frame column into a contiguous block and
  copying it into the stacks (``--layout-repeats`` interleaved, medians, B = 256).
* **Rates**, ``--rate-rows`` buffers of each variant (raw, lz4, zstd, lz4-frames), interleaved ``--repeats``
  times, medians: a writer process (fork) adding 1,000 rows one a call (an actor's step), and the
  learner's ``sample(B)`` + ``update_priorities`` for B = 32 and 256 on a full buffer. The frames
  buffer's budget is 2.2x its measured bytes per row times the capacity (rows outlive half the log).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_frames import SCHEMA  # noqa: E402
from bench_compression import transitions  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay._native import compress_rows  # noqa: E402
from hetero_replay.storage.host import record_layout  # noqa: E402
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES  # noqa: E402
from hetero_replay.storage.schema import Schema  # noqa: E402

CODECS = ("lz4", "zstd")
ADD_ROWS = 1000


def cycled(data: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    idx = np.arange(lo, hi) % len(data["done"])
    return {k: v[idx] for k, v in data.items()}


def log_bytes_per_row(data: dict[str, np.ndarray], codec: str) -> float:
    """Mean bytes a row takes in the record log (both stacks' records and their headers)."""
    return float(
        sum(
            np.mean([len(r) + RECORD_HEADER_BYTES for r in compress_rows(data[n].reshape(len(data[n]), -1), codec, 1)])
            for n in ("obs", "next_obs")
        )
    )


def make(capacity: int, codec: str | None, per_row: float | None, frames: bool = False) -> PrioritizedReplay:
    margin = 2.2 if frames else 1.1  # with frames a row outlives half the log, not all of it
    options = None if codec is None else {"codec": codec}
    if options is not None and per_row is not None:
        options["byte_budget"] = int(capacity * per_row * margin)
    if frames:
        options = {**(options or {}), "frames": True}
    return PrioritizedReplay(capacity, SCHEMA, seed=0, storage="shared", storage_options=options)


def isolated(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a forked process (its result through a pipe).

    Each variant runs in a process of its own, so that none inherits another's heap, caches or
    per-thread compression contexts.
    """
    ctx = mp.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_send_result, args=(send, fn, args))
    p.start()
    result = recv.recv()
    p.join()
    return result


def _send_result(conn: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    conn.send(fn(*args))


def _frames_fill(data: dict[str, np.ndarray], frames: bool) -> dict[str, float]:
    rows = len(data["done"])
    options = {"codec": "lz4", "frames": frames}
    buf = PrioritizedReplay(rows, SCHEMA, seed=0, storage="shared", storage_options=options)
    sizes = np.random.default_rng(0).integers(1, 9, rows)
    t, lo = time.perf_counter(), 0
    for size in sizes:
        if lo >= rows:
            break
        buf.add(cycled(data, lo, min(lo + int(size), rows)))
        lo += int(size)
    fill_s = time.perf_counter() - t
    got = buf.storage.gather(np.arange(rows))
    assert all(np.array_equal(got[k], data[k]) for k in SCHEMA)  # bit for bit
    out = {"log_bytes_per_row": buf.storage.bytes_per_row, "fill_s": fill_s}
    buf.close()
    return out


def frames_bytes(data: dict[str, np.ndarray]) -> dict[str, Any]:
    """Log bytes per row of the distinct transitions with LZ4 rows and with LZ4 frames, added 1-8 rows a call."""
    out: dict[str, Any] = {"rows": len(data["done"])}
    for name, frames in (("lz4", False), ("lz4-frames", True)):
        out[name] = isolated(_frames_fill, data, frames)
    out["frames_vs_rows"] = out["lz4-frames"]["log_bytes_per_row"] / out["lz4"]["log_bytes_per_row"]
    print("frames", out, flush=True)
    return out


def fill(buf: PrioritizedReplay, data: dict[str, np.ndarray], rows: int) -> None:
    for lo in range(0, rows, 256):
        buf.add(cycled(data, lo, min(lo + 256, rows)))


def memory(data: dict[str, np.ndarray], rows: int, per_row: dict[str, float]) -> dict[str, Any]:
    raw_row = record_layout(Schema(SCHEMA))[1]
    out: dict[str, Any] = {"rows": rows, "raw_segment_bytes": rows * (raw_row + 8), "raw_row_bytes": raw_row}
    for codec in CODECS:
        buf = make(rows, codec, per_row[codec])
        t = time.perf_counter()
        fill(buf, data, rows)
        fill_s = time.perf_counter() - t
        s = buf.sample(256)  # the learner's poll: evictions found
        assert all(np.array_equal(s.data[k], data[k][s.indices % len(data["done"])]) for k in SCHEMA)  # bit for bit
        storage = buf.storage
        out[codec] = {
            "segment_bytes": storage.nbytes,
            "byte_budget": storage.byte_budget,
            "log_bytes_per_row": storage.bytes_per_row,
            "evicted_rows": storage.evicted_rows,
            "fill_s": fill_s,
        }
        out[codec]["ratio_vs_raw"] = out["raw_segment_bytes"] / storage.nbytes
        print(codec, out[codec], flush=True)
        buf.close()
    return out


def _layout(data: dict[str, np.ndarray], repeats: int) -> dict[str, Any]:
    rows = min(len(data["done"]), 2048)
    buf = make(rows, "lz4", None, frames=True)
    fill(buf, data, rows)
    len(buf)
    seg, seen = buf.storage.segment, buf.storage.reader.seen
    names = ["obs", "next_obs"]

    def strided(slots: np.ndarray) -> dict[str, np.ndarray]:
        return seg.decode(slots, seen[slots], names)[0]

    def contiguous(slots: np.ndarray) -> dict[str, np.ndarray]:
        n = len(slots)
        blocks = [np.empty((n, 84 * 84), np.uint8) for _ in range(8)]
        seg.log.gather(seg.offsets[slots], seg.lengths[slots], seg.tags[slots], blocks)
        out = {}
        for f, name in enumerate(names):
            out[name] = np.empty((n, 4, 84, 84), np.uint8)
            for k in range(4):
                out[name].reshape(n, 4, -1)[:, k] = blocks[4 * f + k]
        return out

    rng = np.random.default_rng(0)
    ms: dict[str, list[float]] = {"strided": [], "contiguous+copy": []}
    for r in range(repeats):
        slots = rng.integers(0, rows, 256)
        a, b = strided(slots), contiguous(slots)
        assert all(np.array_equal(a[k], b[k]) for k in names)
        order = [("strided", strided), ("contiguous+copy", contiguous)]
        for name, fn in order if r % 2 else order[::-1]:
            t = time.perf_counter()
            for _ in range(10):
                fn(slots)
            ms[name].append((time.perf_counter() - t) / 10 * 1e3)
    buf.close()
    med = {k: statistics.median(v) for k, v in ms.items()}
    return {"ms_per_gather_B256": med, "contiguous_vs_strided": med["contiguous+copy"] / med["strided"], "samples": ms}


def _writer_adds(writer: Any, data: dict[str, np.ndarray], conn: Any) -> None:
    t = time.perf_counter()
    for i in range(ADD_ROWS):
        writer.add(cycled(data, i, i + 1))
    conn.send(ADD_ROWS / (time.perf_counter() - t))
    writer.close()


def _variant(
    conn: Any, data: dict[str, np.ndarray], capacity: int, codec: str | None, per_row: float | None, frames: bool
) -> None:
    """One variant's buffer in a process of its own (see :func:`isolated`), timing what ``conn`` asks for:
    ``"add"`` (a writer process adds :data:`ADD_ROWS` rows), ``(B, steps)`` (sample + update), ``None`` (done:
    it answers the rows evicted)."""
    buf = make(capacity, codec, per_row, frames)
    fill(buf, data, capacity)
    rng = np.random.default_rng(0)
    ctx = mp.get_context("fork")
    while (ask := conn.recv()) is not None:
        if ask == "add":
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_writer_adds, args=(buf.writer(), data, send))
            p.start()
            conn.send(recv.recv())
            p.join()
            len(buf)  # take the writer's rows in
            continue
        b, steps = ask
        t = time.perf_counter()
        for _ in range(steps):
            s = buf.sample(b)
            buf.update_priorities(s.indices, rng.random(b) + 0.01)
        conn.send(steps / (time.perf_counter() - t))
    conn.send(getattr(buf.storage, "evicted_rows", 0))
    buf.close()


def rates(
    data: dict[str, np.ndarray], capacity: int, repeats: int, per_row: dict[str, float], frames_row: float
) -> dict[str, Any]:
    variants: dict[str, str | None] = {"raw": None, **{c: c for c in CODECS}, "lz4-frames": "lz4"}
    ctx = mp.get_context("fork")
    conns, procs = {}, []
    for name, codec in variants.items():
        frames = name == "lz4-frames"
        budget_row = frames_row if frames else None if codec is None else per_row[codec]
        conns[name], theirs = ctx.Pipe()
        procs.append(ctx.Process(target=_variant, args=(theirs, data, capacity, codec, budget_row, frames)))
        procs[-1].start()
    times: dict[str, dict[str, list[float]]] = {n: {"add": [], "B=32": [], "B=256": []} for n in variants}
    asks = [("add", "add"), ("B=32", (32, 300)), ("B=256", (256, 60))]
    for _ in range(repeats):
        for key, ask in asks:
            for name, conn in conns.items():  # interleaved: one variant at a time, in turn
                conn.send(ask)
                times[name][key].append(conn.recv())
    for name, conn in conns.items():
        conn.send(None)
        assert conn.recv() == 0, f"{name}: rows evicted"
    for p in procs:
        p.join()
    med = {n: {k: statistics.median(v) for k, v in per.items()} for n, per in times.items()}
    ratios = {n: {k: med[n][k] / med["raw"][k] for k in med[n]} for n in med if n != "raw"}
    ratios["lz4-frames vs lz4"] = {k: med["lz4-frames"][k] / med["lz4"][k] for k in med["lz4"]}
    return {"per_s": med, "vs_raw": ratios, "samples": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--steps", type=int, default=5000, help="distinct transitions played")
    parser.add_argument("--rows", type=int, default=100_000, help="capacity of the memory measurement")
    parser.add_argument("--rate-rows", type=int, default=8192, help="capacity of the rate measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layout-repeats", type=int, default=15)
    parser.add_argument("--out", default="benchmarks/results/shared-compression.json")
    args = parser.parse_args()
    data = transitions(args.game, args.steps, seed=0)
    per_row = {c: log_bytes_per_row(data, c) for c in CODECS}
    print("log bytes per row", per_row, flush=True)
    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at start",
        "game": args.game,
        "distinct_transitions": args.steps,
        "log_bytes_per_row": per_row,
        "memory": memory(data, args.rows, per_row),
    }
    result["frames"] = frames_bytes(data)
    result["gather_layout"] = isolated(_layout, data, args.layout_repeats)
    print("gather layout", result["gather_layout"]["ms_per_gather_B256"], flush=True)
    frames_row = result["frames"]["lz4-frames"]["log_bytes_per_row"]
    result["rates"] = rates(data, args.rate_rows, args.repeats, per_row, frames_row)
    result["load_at_end"] = os.getloadavg()[0]
    print(json.dumps({k: v for k, v in result.items() if k != "rates"} | {"rates": result["rates"]["per_s"]}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
