"""Prioritized experience replay for Stable-Baselines3's DDPG on Pendulum-v1.

``PERDDPG`` is SB3's DDPG whose critic loss is weighted per transition by the
importance-sampling weights and whose ``|TD error|`` becomes each sampled
transition's new priority. The example trains it, evaluates it, saves and
reloads both the model and its replay buffer, and trains on.

    python examples/sb3_ddpg_pendulum.py               # 6k steps, one to two minutes
    python examples/sb3_ddpg_pendulum.py --steps 20000
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.noise import NormalActionNoise

from hetero_replay.adapters.sb3 import PERDDPG


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6_000, help="environment steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    env = make_vec_env("Pendulum-v1", seed=args.seed)
    eval_env = make_vec_env("Pendulum-v1", seed=args.seed + 100)

    # rl-baselines3-zoo's Pendulum-v1 settings, with a shorter random warm-up
    model = PERDDPG(
        "MlpPolicy", env, gamma=0.98, buffer_size=200_000, learning_starts=1_000, learning_rate=1e-3,
        action_noise=NormalActionNoise(np.zeros(1), 0.1 * np.ones(1)), policy_kwargs=dict(net_arch=[400, 300]),
        replay_buffer_kwargs=dict(alpha=0.6, beta=0.4), seed=args.seed,
    )  # fmt: skip
    first = args.steps * 3 // 4
    model.learn(first, progress_bar=True)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=5, deterministic=True)
    buf = model.replay_buffer
    print(f"after {first:,} steps: return {mean:.1f} ± {std:.1f} (random policy: about -1200; solved: about -150)")
    print(f"beta {buf.beta:.3f}, largest |TD error| seen {buf.max_priority:.2f}")

    with tempfile.TemporaryDirectory() as tmp:
        model.save(Path(tmp) / "ddpg")
        model.save_replay_buffer(Path(tmp) / "buffer")
        model = PERDDPG.load(Path(tmp) / "ddpg", env=env)
        model.load_replay_buffer(Path(tmp) / "buffer")
    print(f"reloaded: {model.replay_buffer.size():,} transitions with their priorities")

    # reset_num_timesteps=False: the step count goes on, and beta follows SB3's progress over the new total
    model.learn(args.steps - first, reset_num_timesteps=False, progress_bar=True)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=5, deterministic=True)
    print(f"after {args.steps:,} steps: return {mean:.1f} ± {std:.1f}; beta {model.replay_buffer.beta:.3f}")


if __name__ == "__main__":
    main()
