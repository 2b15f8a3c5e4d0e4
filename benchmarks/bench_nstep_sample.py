"""What n-step returns cost per SB3 sample: SB3's buffers against ours, 1-step and n-step.

One process, one thread (torch and replay), CartPole-shaped rows (4 floats, a discrete action),
the buffer filled with 20,000 rows of episodes ending with probability 0.05 per step. Each
repeat times ``sample(B)`` back to back for every buffer, in alternating order; ours also
``update_priorities`` each batch (what PERDQN's ``train()`` adds), SB3's are uniform. Medians
over the repeats, in microseconds per batch.

Run:
    python benchmarks/bench_nstep_sample.py                 # -> benchmarks/results/nstep-sample.md
    python benchmarks/bench_nstep_sample.py --repeats 3     # quicker
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3.common.buffers import NStepReplayBuffer, ReplayBuffer

import hetero_replay
from hetero_replay.adapters.sb3 import NStepPrioritizedReplayBuffer, PrioritizedReplayBuffer

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = spaces.Discrete(2)


def buffers(capacity: int, n_steps: int) -> dict[str, ReplayBuffer]:
    """The compared buffers by label, empty."""
    nstep = dict(n_steps=n_steps, gamma=0.99)
    return {
        "sb3 1-step": ReplayBuffer(capacity, OBS, ACT, device="cpu"),
        f"sb3 {n_steps}-step": NStepReplayBuffer(capacity, OBS, ACT, device="cpu", **nstep),
        "ours 1-step": PrioritizedReplayBuffer(capacity, OBS, ACT, device="cpu", seed=0),
        f"ours {n_steps}-step": NStepPrioritizedReplayBuffer(capacity, OBS, ACT, device="cpu", seed=0, **nstep),
    }


def fill(all_buffers: dict[str, ReplayBuffer], rows: int) -> None:
    rng = np.random.default_rng(0)
    for _ in range(rows):
        obs, next_obs = rng.normal(size=(2, 1, 4)).astype(np.float32)
        action, reward = rng.integers(0, 2, (1, 1)), rng.normal(size=1).astype(np.float32)
        done = rng.random(1) < 0.05
        for buffer in all_buffers.values():
            buffer.add(obs, next_obs, action, reward, done, [{}])


def time_sampling(buffer: ReplayBuffer, batch_size: int, calls: int) -> float:
    """Microseconds per ``sample`` (plus ``update_priorities`` for ours)."""
    ones = np.ones(batch_size)
    start = time.perf_counter()
    for _ in range(calls):
        batch = buffer.sample(batch_size)
        if isinstance(buffer, PrioritizedReplayBuffer):
            buffer.update_priorities(batch.indices, ones)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--calls", type=int, default=500, help="samples per buffer per repeat")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--n-steps", type=int, default=3)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "nstep-sample.md"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    hetero_replay.set_num_threads(1)
    compared = buffers(100_000, args.n_steps)
    fill(compared, 20_000)
    lines = [
        f"# sample cost with n-step returns ({platform.processor() or platform.machine()}, 1 thread)",
        "",
        f"`python benchmarks/bench_nstep_sample.py --repeats {args.repeats} --calls {args.calls}`: "
        "median us per batch (ours: sample + update_priorities); 20,000 CartPole-shaped rows.",
        "",
        "| B | " + " | ".join(compared) + f" | ours {args.n_steps}-step / sb3 {args.n_steps}-step |",
        "|---" * (len(compared) + 2) + "|",
    ]
    for batch_size in args.batch_sizes:
        times: dict[str, list[float]] = {label: [] for label in compared}
        for repeat in range(args.repeats):
            order = list(compared.items())
            for label, buffer in order if repeat % 2 == 0 else order[::-1]:
                times[label].append(time_sampling(buffer, batch_size, args.calls))
        median = {label: float(np.median(t)) for label, t in times.items()}
        labels = list(compared)
        ratio = median[labels[3]] / median[labels[1]]
        lines.append(f"| {batch_size} | " + " | ".join(f"{median[k]:.0f}" for k in labels) + f" | {ratio:.2f} |")
    report = "\n".join(lines) + "\n"
    print(report)
    with open(args.out, "w") as f:
        f.write(report)


if __name__ == "__main__":
    main()
