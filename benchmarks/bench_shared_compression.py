"""Compressed rows in the shared storage: segment bytes, a writer process's add rate, the learner's step rate.

    python benchmarks/bench_shared_compression.py [--game Pong] [--steps 5000] [--rows 100000]
        [--rate-rows 8192] [--repeats 3] [--out benchmarks/results/shared-compression.json]

Transitions are ``--steps`` real steps of one game (ale-py, 84x84 gray, 4-frame stacks, a random
policy: ``bench_compression.transitions``), cycled to fill larger buffers (each row is compressed on
its own, so a row's bytes do not depend on what else the buffer holds).

* **Memory**: a ``--rows`` buffer (``storage="shared"``) with ``codec`` LZ4 and Zstd, its
  ``byte_budget`` the measured mean log bytes per row (records and headers) times the capacity times
  1.1, filled with ``--rows`` rows: the segment file's size (every page of it allocated, in
  ``/dev/shm``: RAM), rows evicted, against the raw shared storage's segment for the same capacity
  (computed from its layout: allocating 5.6 GB for it here would only confirm the arithmetic).
* **Rates**, ``--rate-rows`` buffers of each variant (raw, lz4, zstd), interleaved ``--repeats``
  times, medians: a writer process (fork) adding 1,000 rows one a call (an actor's step), and the
  learner's ``sample(B)`` + ``update_priorities`` for B = 32 and 256 on a full buffer.
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


def make(capacity: int, codec: str | None, per_row: float | None) -> PrioritizedReplay:
    options = None if codec is None else {"codec": codec, "byte_budget": int(capacity * per_row * 1.1)}
    return PrioritizedReplay(capacity, SCHEMA, seed=0, storage="shared", storage_options=options)


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


def _writer_adds(writer: Any, data: dict[str, np.ndarray], conn: Any) -> None:
    t = time.perf_counter()
    for i in range(ADD_ROWS):
        writer.add(cycled(data, i, i + 1))
    conn.send(ADD_ROWS / (time.perf_counter() - t))
    writer.close()


def rates(data: dict[str, np.ndarray], capacity: int, repeats: int, per_row: dict[str, float]) -> dict[str, Any]:
    variants: dict[str, str | None] = {"raw": None, **{c: c for c in CODECS}}
    bufs = {}
    for name, codec in variants.items():
        bufs[name] = make(capacity, codec, None if codec is None else per_row[codec])
        fill(bufs[name], data, capacity)
    times: dict[str, dict[str, list[float]]] = {n: {"add": [], "B=32": [], "B=256": []} for n in bufs}
    rng = np.random.default_rng(0)
    ctx = mp.get_context("fork")
    for _ in range(repeats):
        for name, buf in bufs.items():
            recv, send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_writer_adds, args=(buf.writer(), data, send))
            p.start()
            times[name]["add"].append(recv.recv())
            p.join()
            len(buf)  # take the writer's rows in
        for b, steps in ((32, 300), (256, 60)):
            for name, buf in bufs.items():
                t = time.perf_counter()
                for _ in range(steps):
                    s = buf.sample(b)
                    buf.update_priorities(s.indices, rng.random(b) + 0.01)
                times[name][f"B={b}"].append(steps / (time.perf_counter() - t))
    for name, buf in bufs.items():
        assert getattr(buf.storage, "evicted_rows", 0) == 0, name
        buf.close()
    med = {n: {k: statistics.median(v) for k, v in per.items()} for n, per in times.items()}
    ratios = {n: {k: med[n][k] / med["raw"][k] for k in med[n]} for n in CODECS}
    return {"per_s": med, "vs_raw": ratios, "samples": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--steps", type=int, default=5000, help="distinct transitions played")
    parser.add_argument("--rows", type=int, default=100_000, help="capacity of the memory measurement")
    parser.add_argument("--rate-rows", type=int, default=8192, help="capacity of the rate measurement")
    parser.add_argument("--repeats", type=int, default=3)
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
        "rates": rates(data, args.rate_rows, args.repeats, per_row),
    }
    result["load_at_end"] = os.getloadavg()[0]
    print(json.dumps({k: v for k, v in result.items() if k != "rates"} | {"rates": result["rates"]["per_s"]}, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
