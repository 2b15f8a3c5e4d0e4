"""SB3 PERDQN env-steps/s on a real Atari env, raw buffer vs ``compress=`` (lz4, zstd), interleaved.

    python benchmarks/bench_compression_dqn.py --steps 1500 --repeats 5

ALE/Pong-v5 through SB3's ``make_atari_env`` (AtariWrapper: 84x84 gray) and ``VecFrameStack(4)``,
``CnnPolicy`` on the CPU with torch at 1 thread, buffer 10,000, learning_starts 500, batch 32,
train_freq 4. Every repeat runs every variant once, in turn, the order rotating from repeat to repeat;
prints each run's env-steps/s (wall clock, and on the process's CPU time, which other jobs on the
machine disturb less), then each variant's median and its median paired ratio to the raw buffer.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence

import ale_py  # noqa: F401  registers the ALE envs
import torch
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

from hetero_replay.adapters.sb3 import PERDQN

#: variant -> ``compress=`` of the SB3 buffer (None: raw rows).
VARIANTS = {"raw": None, "lz4": "lz4", "zstd": "zstd"}


def run(compress: str | None, steps: int, seed: int) -> tuple[float, float]:
    """One ``learn`` of ``steps``; its env-steps/s on the wall clock and on the process's CPU time."""
    env = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=1, seed=seed), 4)
    kwargs = {} if compress is None else {"compress": compress}
    model = PERDQN(
        "CnnPolicy", env, buffer_size=10_000, learning_starts=500, batch_size=32, train_freq=4,
        replay_buffer_kwargs=kwargs, seed=seed, device="cpu",
    )  # fmt: skip
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(steps)
    rates = steps / (time.perf_counter() - wall), steps / (time.process_time() - cpu)
    model.replay_buffer.close()
    env.close()
    return rates


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1500, help="env steps per run (default 1500)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    names = list(VARIANTS)
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(args.repeats):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            w, c = run(VARIANTS[name], args.steps, seed=rep)
            wall[name].append(w)
            cpu[name].append(c)
            print(f"repeat {rep + 1}/{args.repeats} {name:5s} {w:6.1f} env-steps/s (CPU time: {c:6.1f})", flush=True)
    print(f"\n| buffer | env-steps/s (median of {args.repeats}) | ratio to raw (wall) | ratio to raw (CPU) |")
    print("|---|---|---|---|")
    for name in names:
        ratio_wall = statistics.median(a / b for a, b in zip(wall[name], wall["raw"]))
        ratio_cpu = statistics.median(a / b for a, b in zip(cpu[name], cpu["raw"]))
        print(f"| {name} | {statistics.median(wall[name]):.1f} | {ratio_wall:.3f} | {ratio_cpu:.3f} |")
    print(json.dumps({"wall": wall, "cpu": cpu}))


if __name__ == "__main__":
    main()
