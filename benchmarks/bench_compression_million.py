"""A million-transition compressed DQN/Atari buffer, built for real: the memory it takes and PER on it.

    nice -n 10 python benchmarks/bench_compression_million.py --game MsPacman --codec zstd \\
        --out benchmarks/results/compression-million-mspacman-zstd.json
    python benchmarks/bench_compression_million.py --rows 2000   # a smoke run (seconds)

Issue 27's memory target is a 1,000,000-transition buffer of 84x84x4 uint8 ``obs`` and ``next_obs``
(56 GB raw) in 3 GB of RAM or less, with PER. Here ``--rows`` transitions are played by ale-py
(``atari_frames.transition_chunks``: 84x84 gray, 4 emulator frames a step max-pooled, up to 30
no-ops at reset, 4-frame stacks, a seeded random policy, episodes reset as they end; every
transition comes from the emulator) and streamed, ``--chunk`` rows an ``add``, into
``PrioritizedReplay(rows, SCHEMA, storage_options={"codec": codec, "frames": True})``; only one
chunk's raw stacks exist at a time.

Measured: the process's resident memory (``VmRSS`` of ``/proc/self/status``) before the buffer, with
it empty, once full and after the learner steps, and its peak (``ru_maxrss``); the records' bytes
(``storage.compressed.bytes_used``) and the frame pool's Python structures (``sys.getsizeof``
accounting); distinct frames held; the emulator's time against ``add``'s. Then ``--steps`` learner
steps on the full buffer: ``sample(--batch)`` with data and ``update_priorities``.

Checked bit for bit: each row's ``obs`` and ``next_obs`` are fingerprinted as they are streamed
(SHA-256 cut to 8 bytes, 8 MB for a million rows), and every sampled row is compared with its
fingerprint; ``--keep`` rows, drawn at random before the run, are kept aside whole (about 56 KB each,
counted apart from the buffer's memory) and compared field by field with the buffer's rows at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_frames import SCHEMA, transition_chunks  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402

#: Bytes of one raw transition (two 4x84x84 uint8 stacks, action, reward, done).
RAW_BYTES = 2 * 4 * 84 * 84 + 8 + 4 + 4
#: SB3's ``optimize_memory_usage`` keeps ``obs`` only (``next_obs`` is the next row's): about half.
SB3_OPTIMIZED_BYTES = 4 * 84 * 84 + 8 + 4 + 4
PREPROCESSING = (
    "ale-py ALE/<game>-v5, frameskip=1, repeat_action_probability=0, wrapped in gymnasium's AtariPreprocessing "
    "(frame_skip=4 with the last two frames max-pooled, 84x84 grayscale by cv2 INTER_AREA, noop_max=30); "
    "4-frame stacks, an episode's first frame repeated before it; random actions (numpy default_rng(seed))"
)


def rss_mb() -> float:
    """The process's resident memory now (``VmRSS``), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def peak_rss_mb() -> float:
    """The process's peak resident memory (``ru_maxrss``, KB on Linux), MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def fingerprint(obs: np.ndarray, next_obs: np.ndarray) -> int:
    """A row's ``obs`` and ``next_obs`` (C-contiguous) as 8 bytes of SHA-256."""
    h = hashlib.sha256(obs.data)
    h.update(next_obs.data)
    return int.from_bytes(h.digest()[:8], "little")


def load_emulator(game: str) -> None:
    """Import ale-py, gymnasium and cv2 and open ``game`` once, so that the memory they take is in the baseline."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    gym.make(f"ALE/{game}-v5", frameskip=1).close()
    import cv2  # noqa: F401  (AtariPreprocessing resizes with it)


def pool_accounting(buf: PrioritizedReplay) -> dict[str, int]:
    """Bytes of the frame pool's parts, by ``sys.getsizeof`` (the objects' own bytes, no allocator slack).

    Reads the pool's private structures: this is a measurement of them, not a use.
    """
    pool = buf.storage.compressed.pool
    records = [r for r in pool._records if r is not None]
    ints = {id(r): sys.getsizeof(r) for r in pool._refs if not -5 <= r <= 256}  # small ints are shared
    return {
        "records_objects": sum(map(sys.getsizeof, records)),
        "records_payload": sum(map(len, records)),
        "digest_objects": sum(sys.getsizeof(d) for d in pool._digests if d),
        "lists": sum(sys.getsizeof(x) for x in (pool._records, pool._digests, pool._refs, pool._free)),
        "ref_count_ints": sum(ints.values()),
        "digest_dict": sys.getsizeof(pool._slot),
        "slot_tables": sum(t.nbytes for t in pool._slot_of_row.values()),
    }


def run(
    game: str,
    rows: int,
    codec: str,
    chunk: int = 1000,
    keep: int = 1000,
    steps: int = 200,
    batch: int = 32,
    seed: int = 0,
) -> dict[str, Any]:
    """Build the buffer of ``rows`` transitions of ``game`` compressed with ``codec`` and frames; measure and check it.

    Raises:
        AssertionError: a sampled or kept row differs from what was written.
    """
    rng = np.random.default_rng(seed)
    kept_ids = np.sort(rng.choice(rows, min(keep, rows), replace=False))
    kept = {name: np.empty((len(kept_ids), *shape), dtype) for name, (shape, dtype) in SCHEMA.items()}
    prints = np.empty(rows, np.uint64)
    load_emulator(game)
    rss: dict[str, Any] = {"start": rss_mb()}
    buf = PrioritizedReplay(rows, SCHEMA, storage_options={"codec": codec, "frames": True}, seed=seed)
    rss["empty_buffer"] = rss_mb()

    seconds = {"play": 0.0, "add": 0.0, "fingerprint": 0.0}
    episodes = 0
    rss["while_filling"] = []  # [rows added, MB], every tenth of the rows
    every = max(rows // 10, 1)
    bar = tqdm(total=rows, desc=f"{game} {codec}+frames", unit="row", unit_scale=True, mininterval=5, file=sys.stderr)
    chunks = transition_chunks(game, rows, seed, chunk)
    start = 0
    while True:
        t0 = time.perf_counter()
        data = next(chunks, None)
        seconds["play"] += time.perf_counter() - t0
        if data is None:
            break
        n = len(data["obs"])
        t0 = time.perf_counter()
        prints[start : start + n] = [fingerprint(o, x) for o, x in zip(data["obs"], data["next_obs"])]
        mine = (kept_ids >= start) & (kept_ids < start + n)
        for name in SCHEMA:
            kept[name][mine] = data[name][kept_ids[mine] - start]
        seconds["fingerprint"] += time.perf_counter() - t0
        t0 = time.perf_counter()
        buf.add(data)
        seconds["add"] += time.perf_counter() - t0
        episodes += int(data["done"].sum())
        if start // every != (start + n) // every:
            rss["while_filling"].append([start + n, rss_mb()])
        start += n
        bar.update(n)
    bar.close()
    del data
    assert len(buf) == rows
    rss["full"] = rss_mb()
    compressed = buf.storage.compressed
    accounting = pool_accounting(buf)

    t0 = time.perf_counter()
    for name in SCHEMA:
        got = buf.read_rows(name, kept_ids)
        assert np.array_equal(got, kept[name]), f"{name}: a kept row differs from what was written"
    seconds["check_kept"] = time.perf_counter() - t0

    learn, checked = 0.0, 0
    for _ in range(steps):
        t0 = time.perf_counter()
        s = buf.sample(batch)
        buf.update_priorities(s.indices, rng.exponential(size=batch))
        learn += time.perf_counter() - t0
        got = [fingerprint(o, x) for o, x in zip(s.data["obs"], s.data["next_obs"])]
        assert np.array_equal(np.array(got, np.uint64), prints[s.indices]), "a sampled row differs from its fingerprint"
        checked += batch
    seconds["learner_steps"] = learn
    rss["after_learner_steps"] = rss_mb()
    check_bytes = prints.nbytes + sum(a.nbytes for a in kept.values())

    return {
        "game": game,
        "rows": rows,
        "codec": list(compressed.pool.codec),
        "frames": True,
        "seed": seed,
        "chunk": chunk,
        "episodes_ended": episodes,
        "preprocessing": PREPROCESSING,
        "distinct_frames": compressed.pool.frames,
        "records_bytes": compressed.bytes_used,
        "records_bytes_per_transition": compressed.bytes_used / rows,
        "pool_accounting_bytes": accounting,
        "pool_accounting_total": sum(accounting.values()) - accounting["records_payload"],
        "rss_mb": rss,
        "peak_rss_mb": peak_rss_mb(),
        "check_bytes": check_bytes,
        "buffer_rss_mb": rss["full"] - rss["start"] - check_bytes / 2**20,
        "buffer_rss_bytes_per_transition": ((rss["full"] - rss["start"]) * 2**20 - check_bytes) / rows,
        "raw_bytes": RAW_BYTES * rows,
        "sb3_optimize_memory_usage_bytes": SB3_OPTIMIZED_BYTES * rows,
        "seconds": seconds,
        "learner": {"steps": steps, "batch": batch, "steps_per_s": steps / learn if learn else None},
        "checked": {"kept_rows": len(kept_ids), "sampled_rows": checked, "bit_exact": True},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Parse the arguments, run, print and (with ``--out``) write the results."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", default="MsPacman")
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--codec", default="zstd", choices=("lz4", "zstd"))
    p.add_argument("--chunk", type=int, default=1000, help="rows an add")
    p.add_argument("--keep", type=int, default=1000, help="rows kept aside whole to compare")
    p.add_argument("--steps", type=int, default=200, help="learner steps on the full buffer")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    t0 = time.perf_counter()
    results = run(a.game, a.rows, a.codec, a.chunk, a.keep, a.steps, a.batch, a.seed)
    results["wall_s"] = time.perf_counter() - t0
    results["command"] = "python benchmarks/bench_compression_million.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    results["machine"] = {
        "python": platform.python_version(),
        "processor": platform.processor(),
        "cpus": os.cpu_count(),
    }
    text = json.dumps(results, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")
    return results


if __name__ == "__main__":
    main()
