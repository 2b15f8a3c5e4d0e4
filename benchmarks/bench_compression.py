"""Compressed replay on real Atari frames: bytes per transition and the learner's step rate.

    python benchmarks/bench_compression.py [--steps 2500] [--repeats 5] [--out benchmarks/results/compression.json]
    python benchmarks/bench_compression.py --decode-only   # per frame: decode and digest times
    python benchmarks/bench_compression.py --rates-only --repeats 15 --out /tmp/rates.json  # learner steps only

For each game (Pong, Breakout, MsPacman, Qbert; ale-py, 84x84 gray, 4-frame stacks, a random policy,
see ``atari_frames.py``) the same transitions (obs and next_obs stacks, action, reward, done) go into:

* ``raw``: the host storage as it is (what ``PrioritizedReplay`` keeps without a codec);
* ``lz4``/``zstd``: ``storage_options={"codec": ...}``, one compressed record per stack;
* ``lz4+frames``/``zstd+frames``: ``{"codec": ..., "frames": True}``, each distinct frame once;
* ``cpprb``: cpprb 11's ``ReplayBuffer`` with ``stack_compress="obs"`` and ``next_of="obs"``;
* ``torchrl``: TorchRL's ``CompressedListStorage`` (its default codec and level 3; on Python < 3.14
  its default compression is zlib, not zstd: TorchRL's own code picks ``compression.zstd`` only on 3.14).

Bytes per transition are what the buffer allocated in Python's heap, measured with ``tracemalloc``
(NumPy arrays, ``bytes`` records and every Python object around them, so a frame pool's dictionaries
count, and our PER tree and priorities too), divided by the transitions held. TorchRL's
records are torch tensors, which tracemalloc does not see: its figure is the compressed tensors'
bytes only (its per-item metadata dicts are left out, so it is a lower bound).

The learner step is ``sample(B)`` with the batch's data plus ``update_priorities`` on a buffer
holding every game's transitions, for B = 32 and 256; variants are interleaved, ``--repeats``
times, medians reported, torch and the batch pool at the machine's threads (2 here). ``add`` is
timed per transition as SB3 adds them (one row a call).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from atari_frames import GAMES, SCHEMA, play, stacks  # noqa: E402

from hetero_replay import PrioritizedReplay  # noqa: E402

RAW_BYTES = 2 * 4 * 84 * 84 + 8 + 4 + 4
VARIANTS: dict[str, dict[str, Any] | None] = {
    "raw": None,
    "lz4": {"codec": "lz4"},
    "zstd": {"codec": "zstd"},
    "lz4+frames": {"codec": "lz4", "frames": True},
    "zstd+frames": {"codec": "zstd", "frames": True},
}


def transitions(game: str, steps: int, seed: int) -> dict[str, np.ndarray]:
    """``steps`` transitions of ``game``; at an episode's end next_obs is the terminal stack."""
    frames, starts = play(game, steps, seed)
    s = stacks(frames, starts)
    done = starts[1:].copy()
    nxt = s[1:].copy()
    for i in np.flatnonzero(done):  # the terminal observation: the last stack shifted by the last frame seen
        nxt[i] = np.concatenate([s[i][1:], frames[i][None]])
    rng = np.random.default_rng(seed)
    return {
        "obs": s[:-1],
        "action": rng.integers(0, 18, steps),
        "reward": rng.choice([-1.0, 0.0, 1.0], steps).astype(np.float32),
        "next_obs": nxt,
        "done": done.astype(np.float32),
    }


def ours_bytes(data: dict[str, np.ndarray], options: dict[str, Any] | None) -> tuple[float, float]:
    """(bytes per transition, seconds per one-row add) of a PrioritizedReplay holding ``data``.

    The bytes include the PER bookkeeping (tree and priorities, ~30 bytes a row); the raw storage's
    ``np.zeros`` records count in full when allocated (they are all written here).
    """
    n = len(data["done"])
    tracemalloc.start()
    buf = PrioritizedReplay(n, SCHEMA, seed=0, storage_options=options)
    t = time.perf_counter()
    for i in range(n):
        buf.add({k: v[i : i + 1] for k, v in data.items()})
    add_s = (time.perf_counter() - t) / n
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    got = buf.storage.gather(np.arange(n, dtype=np.int64))
    assert all(np.array_equal(got[k], data[k]) for k in SCHEMA)  # bit for bit
    buf.close()
    return used / n, add_s


def cpprb_bytes(data: dict[str, np.ndarray]) -> float:
    """cpprb with ``stack_compress`` (it stacks along the last axis: stacks go in channel-last) and ``next_of``."""
    from cpprb import ReplayBuffer

    n = len(data["done"])
    obs, nxt = (np.ascontiguousarray(data[k].transpose(0, 2, 3, 1)) for k in ("obs", "next_obs"))
    tracemalloc.start()
    rb = ReplayBuffer(
        n,
        {"obs": {"shape": (84, 84, 4), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {}, "done": {}},
        next_of="obs",
        stack_compress="obs",
    )
    for i in range(n):
        rb.add(obs=obs[i], next_obs=nxt[i], act=data["action"][i], rew=data["reward"][i], done=data["done"][i])
        if data["done"][i]:
            rb.on_episode_end()
    used = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    got = rb.get_all_transitions()
    assert np.array_equal(got["obs"], obs) and np.array_equal(got["next_obs"], nxt)
    return used / n


def torchrl_bytes(data: dict[str, np.ndarray]) -> float:
    import torch
    from tensordict import TensorDict
    from torchrl.data import CompressedListStorage, ReplayBuffer

    n = len(data["done"])
    rb = ReplayBuffer(storage=CompressedListStorage(max_size=n))
    for i in range(n):
        rb.add(TensorDict({k: torch.as_tensor(v[i]) for k, v in data.items()}, batch_size=[]))
    held = 0
    for item in rb.storage._storage:
        held += sum(t.numel() for t in item.values() if isinstance(t, torch.Tensor))
    return held / n


def step_rates(data: dict[str, np.ndarray], repeats: int) -> dict[str, dict[str, float]]:
    """Median learner steps per second (sample B + update) per variant, B = 32 and 256, interleaved."""
    n = len(data["done"])
    bufs = {}
    for name, options in VARIANTS.items():
        buf = PrioritizedReplay(n, SCHEMA, seed=0, storage_options=options)
        for lo in range(0, n, 1000):
            buf.add({k: v[lo : lo + 1000] for k, v in data.items()})
        bufs[name] = buf
    times: dict[str, dict[int, list[float]]] = {name: {32: [], 256: []} for name in bufs}
    rng = np.random.default_rng(0)
    for _ in range(repeats):
        for b in (32, 256):
            for name, buf in bufs.items():
                steps = 200 if b == 32 else 40
                t = time.perf_counter()
                for _ in range(steps):
                    s = buf.sample(b)
                    buf.update_priorities(s.indices, rng.random(b) + 0.01)
                times[name][b].append(steps / (time.perf_counter() - t))
    for buf in bufs.values():
        buf.close()
    return {name: {f"B={b}": statistics.median(v) for b, v in per.items()} for name, per in times.items()}


def decode_us(repeats: int) -> dict[str, dict[str, float]]:
    """Per frame: microseconds to decompress 256 distinct random MsPacman frames in one call, and bytes a frame."""
    from hetero_replay._native import compress_rows, decompress_rows

    frames = play("MsPacman", 600, seed=0)[0].reshape(-1, 84 * 84)
    idx = np.random.default_rng(0).permutation(len(frames))[:256]  # distinct: each frame decoded (none copied)
    out = np.empty((256, 84 * 84), np.uint8)
    result = {}
    for codec, level in [("lz4", 1), ("lz4", 5), ("zstd", 1), ("zstd", 3)]:
        records = compress_rows(frames, codec, level)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            decompress_rows(records, idx, out)
            times.append(time.perf_counter() - t)
        result[f"{codec}-{level}"] = {
            "us_per_frame": statistics.median(times) / 256 * 1e6,
            "bytes_per_frame": sum(map(len, records)) / len(records),
        }
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out[:] = frames[idx]
        times.append(time.perf_counter() - t)
    result["raw copy"] = {"us_per_frame": statistics.median(times) / 256 * 1e6, "bytes_per_frame": 84 * 84}
    return result


def hash_us(repeats: int) -> dict[str, float]:
    """Per frame: microseconds to take a 128-bit digest of 256 MsPacman frames (what ``frames`` does on add)."""
    import hashlib

    frames = [f.data for f in play("MsPacman", 255, seed=0)[0].reshape(-1, 84 * 84)]
    digests = {
        "sha256[:16] (ours)": lambda b: hashlib.sha256(b).digest()[:16],
        "blake2b-16 (before)": lambda b: hashlib.blake2b(b, digest_size=16).digest(),
    }
    times: dict[str, list[float]] = {name: [] for name in digests}
    for _ in range(repeats):  # interleaved
        for name, digest in digests.items():
            t = time.perf_counter()
            for f in frames:
                digest(f)
            times[name].append((time.perf_counter() - t) / len(frames) * 1e6)
    return {name: statistics.median(v) for name, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2500, help="transitions per game")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="benchmarks/results/compression.json")
    parser.add_argument(
        "--decode-only", action="store_true", help="only the per-frame decode and hash times (json on stdout)"
    )
    parser.add_argument(
        "--rates-only", action="store_true", help="only the learner step rates (no bytes, cpprb, TorchRL, add times)"
    )
    args = parser.parse_args()
    if args.decode_only:
        report = {"command": "python " + " ".join(sys.argv), "decode": decode_us(31), "hash_us_per_frame": hash_us(31)}
        print(json.dumps(report, indent=1))
        return
    import torch

    result: dict[str, Any] = {
        "command": "python " + " ".join(sys.argv),
        "machine": f"{platform.machine()}, {__import__('os').cpu_count()} cores",
        "torch_threads": torch.get_num_threads(),
        "raw_bytes_per_transition": RAW_BYTES,
        "bytes_per_transition": {},
        "add_us": {},
    }
    all_data = []
    for g, game in enumerate(GAMES):
        data = transitions(game, args.steps, seed=g)
        all_data.append(data)
        if args.rates_only:
            continue
        per: dict[str, float] = {}
        for name, options in VARIANTS.items():
            per[name], add_s = ours_bytes(data, options)
            result["add_us"].setdefault(name, []).append(add_s * 1e6)
        per["cpprb"] = cpprb_bytes(data)
        per["torchrl"] = torchrl_bytes(data)
        per["episodes"] = float(data["done"].sum())
        result["bytes_per_transition"][game] = per
        print(game, {k: round(v) for k, v in per.items()}, flush=True)
    result["add_us"] = {k: statistics.median(v) for k, v in result["add_us"].items()}  # empty with --rates-only
    mixed = {k: np.concatenate([d[k] for d in all_data]) for k in SCHEMA}
    result["learner_steps_per_s"] = step_rates(mixed, args.repeats)
    result["learner_transitions"] = len(mixed["done"])
    print(json.dumps(result, indent=1))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
