"""SB3 DQN env-steps/s: stock ``DQN`` (SB3's uniform buffer) vs ``PERDQN``, interleaved, as ratios.

What a Stable-Baselines3 user pays for prioritized replay, end to end: the same
``learn`` loop on CartPole-v1 with SB3's own buffer and with ours (strict, and
with ``staleness``), one torch thread, runs interleaved so that drifts of a
shared machine fall on every variant alike. Prints each variant's median
env-steps/s and its median ratio to stock DQN.

    python benchmarks/bench_sb3_throughput.py                      # 15k steps, 3 interleaved repeats
    python benchmarks/bench_sb3_throughput.py --steps 10000 --repeats 5 --staleness 0 1
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import gymnasium as gym
import torch
from stable_baselines3 import DQN

from hetero_replay.adapters.sb3 import PERDQN

#: SB3 DQN on CartPole as the rl-zoo tunes it, on a 50k buffer (what the pipeline issue measured).
DQN_ARGS = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=50_000, learning_starts=1000, gamma=0.99,
    target_update_interval=10, train_freq=4, gradient_steps=1, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), device="cpu",
)  # fmt: skip


def run(variant: str, steps: int, seed: int) -> float:
    """One ``learn`` of ``steps`` env steps; its env-steps/s."""
    env = gym.make("CartPole-v1")
    if variant == "dqn":
        model = DQN("MlpPolicy", env, seed=seed, **DQN_ARGS)
    else:
        model = PERDQN("MlpPolicy", env, seed=seed, staleness=int(variant.split("k")[1]), **DQN_ARGS)
    start = time.perf_counter()
    model.learn(total_timesteps=steps)
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=15_000, help="env steps per run (default 15000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1], help="PERDQN staleness values (default 0 1)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    variants = ["dqn", *(f"perdqn-k{k}" for k in args.staleness)]
    rates: dict[str, list[float]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for v in variants:
            rates[v].append(run(v, args.steps, seed=r))
            print(f"repeat {r + 1}/{args.repeats} {v:12s} {rates[v][-1]:8.0f} env-steps/s", flush=True)
    print(f"\n| variant | env-steps/s (median of {args.repeats}) | ratio to stock DQN (median of paired) |")
    print("|---|---|---|")
    for v in variants:
        ratio = statistics.median(a / b for a, b in zip(rates[v], rates["dqn"]))
        print(f"| {v} | {statistics.median(rates[v]):.0f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
