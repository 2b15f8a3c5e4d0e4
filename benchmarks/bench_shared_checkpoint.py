"""Saving and loading a compressed shared buffer: its records copied out of the log, against the rows decompressed.

    python benchmarks/bench_shared_checkpoint.py [--game Pong] [--steps 5000] [--repeats 3]
        [--codecs lz4 zstd] [--dir /tmp] [--out benchmarks/results/shared_checkpoint.json]

A ``storage="shared"`` buffer of ``--steps`` real Atari transitions (``atari_frames.py``), its image
fields compressed in the shared record log, is written and read back two ways, interleaved,
``--repeats`` times (medians):

* ``records`` (what ``save`` writes now, format version 2): each row's records copied out of the log
  (headers, head and every record's decode checked); ``load`` into a shared buffer compressing alike
  appends them to its log as they are (each decompressed once to check it);
* ``rows`` (what ``save`` wrote before): the rows decompressed into the file, and ``load``
  compressing every row again.

Every load is checked: the loaded buffer's rows equal the saved buffer's, bit for bit. Files and the
segments go to ``--dir``; times include the ``fsync`` of the save.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_frames import SCHEMA  # noqa: E402
from bench_compressed_checkpoint import save_load_times, transitions  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402


def filled(data: dict[str, Any], codec: str, folder: Path) -> PrioritizedReplay:
    steps = len(data["action"])
    buf = PrioritizedReplay(
        steps, SCHEMA, seed=0, storage="shared", storage_options={"codec": codec, "dir": str(folder)}
    )
    for lo in range(0, steps, 256):
        buf.add({k: v[lo : lo + 256] for k, v in data.items()})
    return buf


def measure(buf: PrioritizedReplay, codec: str, folder: Path, repeats: int) -> dict[str, Any]:
    """Save and load times (medians) and file sizes of ``buf``, each load checked."""
    placement = {"storage": "shared", "storage_options": {"codec": codec, "dir": str(folder)}}
    loads = {"load records": ("records", placement), "load rows": ("rows", placement)}
    return {"bytes_per_row": buf.storage.bytes_per_row, **save_load_times(buf, folder, repeats, loads)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--steps", type=int, default=5_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp"))
    parser.add_argument("--codecs", nargs="+", choices=["lz4", "zstd"], default=["lz4", "zstd"])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    data = transitions(args.game, args.steps)
    results: dict[str, Any] = {
        "game": args.game,
        "steps": args.steps,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "codecs": {},
    }
    for codec in args.codecs:
        buf = filled(data, codec, args.dir)
        entry = measure(buf, codec, args.dir, args.repeats)
        buf.close()
        results["codecs"][codec] = entry
        print(codec, json.dumps({k: v for k, v in entry.items() if k != "all"}), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
