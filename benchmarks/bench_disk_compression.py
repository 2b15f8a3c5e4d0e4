"""What a sampled batch costs from ``storage="disk"`` with raw rows and with LZ4 (or Zstd) records, side by side.

Two disk buffers hold the same ``--rows`` Atari transitions (the tests' Pong and Breakout sample,
cycled; ``benchmarks/atari_frames.py``): one raw (a row record of 56 KB), one with the image fields
compressed into ``records.log``. Each round times, in alternating order, ``sample(B)`` + ``update_priorities``
on each buffer, *warm* (the files in the page cache) and *cold* (both files dropped from the page
cache before each call: every row read from the disk). Medians over rounds, and the compressed
buffer's time over the raw one's from the same rounds.

    python benchmarks/bench_disk_compression.py --rows 4000 --rounds 15 --out benchmarks/results/disk-compression
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_frames import SCHEMA, sample_transitions  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402


def filled(path: Path, rows: int, codec: str | None, threads: int) -> PrioritizedReplay:
    options: dict = {"path": str(path), "read_threads": threads, "flush_seconds": 1e6, "flush_every": 10**9}
    if codec is not None:
        options.update(codec=codec, byte_budget=rows * 4000)
    buf = PrioritizedReplay(rows, SCHEMA, seed=0, storage="disk", storage_options=options)
    t = sample_transitions()
    n = len(t["action"])
    for lo in range(0, rows, 256):
        ids = np.arange(lo, min(lo + 256, rows)) % n
        buf.add({k: v[ids] for k, v in t.items()})
    buf.flush()
    return buf


def drop_cache(buf: PrioritizedReplay) -> None:
    """Both files of the buffer out of the page cache (synced: a durable point was made)."""
    storage = buf.storage
    os.posix_fadvise(storage.fd, 0, 0, os.POSIX_FADV_DONTNEED)
    if storage.records is not None:
        os.posix_fadvise(storage.records.fd, 0, 0, os.POSIX_FADV_DONTNEED)


def step(buf: PrioritizedReplay, batch: int, cold: bool) -> float:
    if cold:
        drop_cache(buf)
    start = time.perf_counter()
    sample = buf.sample(batch)
    buf.update_priorities(sample.indices, np.abs(sample.data["reward"]) + 0.1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=5, help="timed calls per contender and round (median)")
    parser.add_argument("--codec", default="lz4")
    parser.add_argument("--read-threads", type=int, default=8)
    parser.add_argument("--dir", default=None, help="where the buffers go (default: a temporary directory)")
    parser.add_argument("--out", default=None, help="write <out>.json and <out>.md")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        bufs = {
            "raw": filled(Path(tmp) / "raw", args.rows, None, args.read_threads),
            args.codec: filled(Path(tmp) / args.codec, args.rows, args.codec, args.read_threads),
        }
        sizes = {
            name: sum(f.stat().st_size for f in buf.storage.path.iterdir() if f.name in ("rows.dat", "records.log"))
            for name, buf in bufs.items()
        }
        held = {name: buf.storage.bytes_per_row for name, buf in bufs.items()}
        times: dict[str, list[float]] = {}
        for r in range(args.rounds):
            order = list(bufs) if r % 2 == 0 else list(reversed(bufs))
            for batch in args.batches:
                for cold in (False, True):
                    for name in order:
                        calls = [step(bufs[name], batch, cold) for _ in range(args.calls)]
                        key = f"{name} B={batch} {'cold' if cold else 'warm'}"
                        times.setdefault(key, []).append(statistics.median(calls))
        for buf in bufs.values():
            buf.close()
    rows = []
    for batch in args.batches:
        for state in ("warm", "cold"):
            raw = times[f"raw B={batch} {state}"]
            packed = times[f"{args.codec} B={batch} {state}"]
            ratios = [p / q for p, q in zip(packed, raw)]
            rows.append({
                "batch": batch, "cache": state, "raw_ms": 1e3 * statistics.median(raw),
                f"{args.codec}_ms": 1e3 * statistics.median(packed), "ratio": statistics.median(ratios),
                "ratio_min": min(ratios), "ratio_max": max(ratios),
            })  # fmt: skip
    result = {
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "machine": f"{platform.node()} {os.cpu_count()} CPUs",
        "rows": args.rows,
        "rounds": args.rounds,
        "calls": args.calls,
        "read_threads": args.read_threads,
        "file_bytes": sizes,
        "log_bytes_per_row": held[args.codec],
        "results": rows,
    }
    lines = [
        f"# Disk storage: raw rows vs {args.codec} records ({args.rows} Atari transitions)",
        "",
        f"`{result['command']}` on {result['machine']}; {args.rounds} rounds, contenders alternating, median of "
        f"{args.calls} calls each; read_threads={args.read_threads}. Files: raw {sizes['raw'] / 1e6:.1f} MB, "
        f"{args.codec} {sizes[args.codec] / 1e6:.1f} MB (its log sized {args.rows} x 4000 B; the records take "
        f"{held[args.codec]:.0f} B a row).",
        "",
        f"| B | page cache | raw ms | {args.codec} ms | {args.codec} / raw (median, min-max over rounds) |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['batch']} | {row['cache']} | {row['raw_ms']:.2f} | {row[f'{args.codec}_ms']:.2f} | "
            f"{row['ratio']:.2f} ({row['ratio_min']:.2f}-{row['ratio_max']:.2f}) |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(f"{args.out}.json").write_text(json.dumps(result, indent=1) + "\n")
        Path(f"{args.out}.md").write_text(text)


if __name__ == "__main__":
    main()
