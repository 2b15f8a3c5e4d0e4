"""Saving and loading a compressed buffer: its records as they are, against the rows decompressed.

    python benchmarks/bench_compressed_checkpoint.py [--game MsPacman] [--steps 20000] [--repeats 3]
        [--settings zstd+frames ...] [--dir /tmp] [--out benchmarks/results/compressed_checkpoint.json]

A buffer of ``--steps`` real Atari transitions (``atari_frames.py``: ale-py, 84x84 gray, 4-frame
stacks, a random policy; obs, next_obs, action, reward, done) is kept compressed, for each setting
(``zstd+frames``, ``lz4+frames``, ``zstd`` rows), and written and read back two ways, interleaved,
``--repeats`` times (medians):

* ``records`` (format version 2): ``save`` writes the records as they are; ``load`` into a buffer
  compressed alike adopts them (each record decompressed once to check it, frames hashed again);
* ``rows`` (format version 1, what ``save`` wrote before): the rows decompressed into the file,
  and ``load`` recompressing every row (the path a version-1 file still takes).

Also ``load`` converting a ``records`` file to another setting (``--convert-to``). Every load is
checked: the loaded buffer's rows equal the saved buffer's, bit for bit. Files go to ``--dir``;
times include the ``fsync`` of the save.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_frames import SCHEMA, play, stacks  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.storage import checkpoint  # noqa: E402

SETTINGS: dict[str, dict[str, Any]] = {
    "zstd+frames": {"codec": "zstd", "frames": True},
    "lz4+frames": {"codec": "lz4", "frames": True},
    "zstd": {"codec": "zstd"},
}


def transitions(game: str, steps: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``steps`` transitions of ``game`` (next_obs: the following stack)."""
    frames, starts = play(game, steps, seed)
    s = stacks(frames, starts)
    rng = np.random.default_rng(seed)
    return {
        "obs": s[:-1],
        "action": rng.integers(0, 18, steps),
        "reward": rng.choice([-1.0, 0.0, 1.0], steps).astype(np.float32),
        "next_obs": s[1:],
        "done": starts[1:].astype(np.float32),
    }


def filled(data: dict[str, np.ndarray], options: dict[str, Any]) -> PrioritizedReplay:
    steps = len(data["action"])
    buf = PrioritizedReplay(steps, SCHEMA, seed=0, storage_options=options)
    for lo in range(0, steps, 1000):
        buf.add({k: v[lo : lo + 1000] for k, v in data.items()})
    return buf


def save_rows(buf: PrioritizedReplay, path: Path) -> None:
    """What ``save`` wrote before format version 2: every field's rows, the compressed ones decompressed."""
    state = buf._state(copy=False, rows=False)
    arrays = {f"storage/{n}": a for n, a in buf.storage.export_rows(len(buf), copy=False).items()}
    arrays["priorities"] = buf.priorities.leaves()[: len(buf)]
    checkpoint.write(path, state, arrays)


def timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - start, out


def check_equal(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    idx = np.arange(len(a), dtype=np.int64)
    for lo in range(0, len(a), 2000):
        x, y = a.storage.gather(idx[lo : lo + 2000]), b.storage.gather(idx[lo : lo + 2000])
        for name in SCHEMA:
            if not np.array_equal(x[name], y[name]):
                raise AssertionError(f"field {name!r} differs after the load")


def save_load_times(
    buf: PrioritizedReplay, folder: Path, repeats: int, loads: dict[str, tuple[str, dict[str, Any]]]
) -> dict[str, Any]:
    """Save ``buf`` as records and as decompressed rows, then time each load, interleaved; each load checked.

    ``loads``: name -> (``"records"`` or ``"rows"``, the file it loads; ``PrioritizedReplay.load``'s keywords).
    Returns the file sizes, each step's median seconds (``"<step> s"``) and every time (``"all"``).
    """
    files = {"records": folder / "bench_records.replay", "rows": folder / "bench_rows.replay"}
    times: dict[str, list[float]] = {"save records": [], "save rows": [], **{key: [] for key in loads}}
    for _ in range(repeats):
        times["save records"].append(timed(buf.save, files["records"])[0])
        times["save rows"].append(timed(save_rows, buf, files["rows"])[0])
        for key, (which, kwargs) in loads.items():
            t, loaded = timed(PrioritizedReplay.load, files[which], **kwargs)
            times[key].append(t)
            check_equal(buf, loaded)
            loaded.close()
    entry = {
        "file_bytes_records": files["records"].stat().st_size,
        "file_bytes_rows": files["rows"].stat().st_size,
        **{f"{k} s": statistics.median(v) for k, v in times.items()},
        "all": times,
    }
    for path in files.values():
        path.unlink()
    return entry


def measure(buf: PrioritizedReplay, options: dict[str, Any], other: str, folder: Path, repeats: int) -> dict[str, Any]:
    """Save and load times (medians) and file sizes of ``buf``, each load checked; ``other``: the converting load's."""
    loads = {
        "load records": ("records", {"storage_options": options}),
        "load rows": ("rows", {"storage_options": options}),
        f"load records converting to {other}": ("records", {"storage_options": SETTINGS[other]}),
    }
    return {"ram_record_bytes": buf.storage.compressed.bytes_used, **save_load_times(buf, folder, repeats, loads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="MsPacman")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--convert-to", default="lz4+frames")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    data = transitions(args.game, args.steps)
    results: dict[str, Any] = {
        "game": args.game,
        "steps": args.steps,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "settings": {},
    }
    for name in args.settings:
        options = SETTINGS[name]
        other = args.convert_to if args.convert_to != name else "zstd"
        entry = measure(filled(data, options), options, other, args.dir, args.repeats)
        results["settings"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "all"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
