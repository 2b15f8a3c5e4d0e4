"""SB3 PERDQN env-steps/s on a real Atari env, raw buffer vs ``compress=`` (lz4, zstd), interleaved.

    python benchmarks/bench_compression_dqn.py [STEPS=1500]

ALE/Pong-v5 through SB3's ``make_atari_env`` (AtariWrapper: 84x84 gray) and ``VecFrameStack(4)``,
``CnnPolicy`` on the CPU with torch at 1 thread, buffer 10,000, learning_starts 500, batch 32,
train_freq 4; two repeats of each variant, interleaved; prints each run's env-steps/s and the medians.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import ale_py  # noqa: F401  registers the ALE envs
import torch
from stable_baselines3.common.env_util import make_atari_env
from stable_baselines3.common.vec_env import VecFrameStack

from hetero_replay.adapters.sb3 import PERDQN


def main() -> None:
    torch.set_num_threads(1)
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 1500
    rates: dict[str, list[float]] = {}
    for rep in range(2):
        for name, compress in [("raw", None), ("lz4", "lz4"), ("zstd", "zstd")]:
            env = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=1, seed=rep), 4)
            kwargs = {} if compress is None else {"compress": compress}
            model = PERDQN(
                "CnnPolicy", env, buffer_size=10_000, learning_starts=500, batch_size=32, train_freq=4,
                replay_buffer_kwargs=kwargs, seed=rep, device="cpu",
            )  # fmt: skip
            t = time.perf_counter()
            model.learn(steps)
            rates.setdefault(name, []).append(steps / (time.perf_counter() - t))
            print(name, rep, round(rates[name][-1], 1), flush=True)
            env.close()
    print(json.dumps({"runs": rates, "median": {k: statistics.median(v) for k, v in rates.items()}}))


if __name__ == "__main__":
    main()
