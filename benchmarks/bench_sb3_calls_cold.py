"""The SB3 buffer calls as a training run makes them: each right after a gradient step, ours vs SB3's.

In ``learn`` every buffer call follows an environment step or a gradient step, which evict the
CPU's caches, so a call pays for its code and data anew each time. Timed back to back (``timeit``)
the same call looks several times cheaper. This benchmark times each call of SB3's ``DQN`` buffer
and of ours (``PERDQN``'s) once after each gradient step of a 256x256 Q-network (CartPole-v1,
rl-zoo's hyperparameters, a 50k buffer after ``--learn`` steps of learning, 3,000 by default), the two buffers taking turns,
and also back to back; medians over ``--repeats`` rounds of ``--calls`` calls, torch on one thread.

A second table times the buffer's share of one ``train()`` cycle as ``learn`` makes it: ``train_freq``
adds, then ``sample`` (ours commits the rows staged by the adds there) and ``update_priorities``, each
call after a gradient step, for SB3's buffer and ``PERDQN``'s at staleness 0 and 1.

    python benchmarks/bench_sb3_calls_cold.py
    python benchmarks/bench_sb3_calls_cold.py --repeats 15 --calls 300
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import torch as th
from bench_sb3_throughput import DQN_ARGS  # rl-zoo's CartPole DQN, as the end-to-end benchmark runs it
from stable_baselines3 import DQN
from torch.nn import functional as F

from hetero_replay.adapters.sb3 import PERDQN


def gradient_step(model: DQN, batch: Any) -> None:
    """One DQN gradient step of ``model`` on ``batch``: what runs between two buffer calls of a run."""
    with th.no_grad():
        best_next = model.q_net_target(batch.next_observations).max(dim=1).values.reshape(-1, 1)
        target = batch.rewards + (1 - batch.dones) * model.gamma * best_next
    current = th.gather(model.q_net(batch.observations), dim=1, index=batch.actions.long())
    loss = F.smooth_l1_loss(current, target)
    loss.item()
    model.policy.optimizer.zero_grad()
    loss.backward()
    th.nn.utils.clip_grad_norm_(model.policy.parameters(), model.max_grad_norm)
    model.policy.optimizer.step()


def calls(model: Any) -> dict[str, Callable[[], Any]]:
    """The buffer calls of one training run's step: ``add`` (one env step), ``sample``, ``update_priorities``."""
    buffer = model.replay_buffer
    obs = np.zeros((1, 4), np.float32)
    args = (obs, obs, np.zeros(1, np.int64), np.ones(1, np.float32), np.zeros(1, bool), [{}])
    out = {"add": lambda: buffer.add(*args), "sample": lambda: buffer.sample(64)}
    if hasattr(buffer, "update_priorities"):
        batch = buffer.sample(64)
        td = th.randn(64, 1)
        out["update_priorities"] = lambda: buffer.update_priorities(batch.indices, td)
    return out


def cycle(model: Any, trainer: DQN, batch: Any, adds: int) -> tuple[float, float, float]:
    """One ``train()`` cycle of ``model``'s buffer, each call cold: µs spent in ``adds`` adds, ``sample``, update."""
    buffer = model.replay_buffer
    add, sample = calls(model)["add"], lambda: buffer.sample(64)
    spent = [0.0, 0.0, 0.0]
    for _ in range(adds):
        gradient_step(trainer, batch)
        start = time.perf_counter()
        add()
        spent[0] += time.perf_counter() - start
    gradient_step(trainer, batch)
    start = time.perf_counter()
    drawn = sample()
    spent[1] += time.perf_counter() - start
    if hasattr(buffer, "update_priorities"):
        td = th.randn(64, 1)
        gradient_step(trainer, batch)
        start = time.perf_counter()
        buffer.update_priorities(drawn.indices, td)
        spent[2] += time.perf_counter() - start
    return spent[0] * 1e6, spent[1] * 1e6, spent[2] * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9, help="rounds (default 9)")
    parser.add_argument("--calls", type=int, default=200, help="calls of each kind per round (default 200)")
    parser.add_argument("--learn", type=int, default=3000, help="env steps each model learns first (default 3000)")
    args = parser.parse_args(argv)
    th.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*sampled .* times without update_priorities")
    models = {
        "SB3 (DQN)": DQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_ARGS),
        "ours (PERDQN)": PERDQN("MlpPolicy", "CartPole-v1", seed=0, **DQN_ARGS),
        "ours (PERDQN, staleness=1)": PERDQN("MlpPolicy", "CartPole-v1", seed=0, staleness=1, **DQN_ARGS),
    }
    for model in models.values():
        model.learn(args.learn)
    trainer = models["SB3 (DQN)"]
    batch = trainer.replay_buffer.sample(64)
    cold: dict[tuple[str, str], list[float]] = {}
    warm: dict[tuple[str, str], list[float]] = {}
    cycles: dict[str, list[tuple[float, float, float]]] = {}
    adds = int(DQN_ARGS["train_freq"])
    for _ in range(args.repeats):
        for name, model in models.items():
            spent = [cycle(model, trainer, batch, adds) for _ in range(args.calls)]
            cycles.setdefault(name, []).append(tuple(statistics.mean(x) for x in zip(*spent)))
            if "staleness" in name:
                continue  # the single calls: as the strict buffer's
            for op, fn in calls(model).items():
                spent = 0.0
                for _ in range(args.calls):
                    gradient_step(trainer, batch)
                    start = time.perf_counter()
                    fn()
                    spent += time.perf_counter() - start
                cold.setdefault((name, op), []).append(spent / args.calls * 1e6)
                warm.setdefault((name, op), []).append(timeit.timeit(fn, number=args.calls) / args.calls * 1e6)
    print(f"us per call, median of {args.repeats} rounds of {args.calls} calls (torch on 1 thread)\n")
    print("| buffer | call | after a gradient step (as in a run) | back to back |")
    print("|---|---|---|---|")
    for (name, op), times in cold.items():
        print(f"| {name} | {op} | {statistics.median(times):.1f} | {statistics.median(warm[name, op]):.1f} |")
    print(f"\nA train() cycle's buffer calls, each after a gradient step: us per cycle ({adds} adds, sample, update)\n")
    print("| buffer | cycle | adds | sample | update_priorities |")
    print("|---|---|---|---|---|")
    for name, rounds in cycles.items():
        parts = [statistics.median(r[i] for r in rounds) for i in range(3)]
        print(f"| {name} | {sum(parts):.1f} | {parts[0]:.1f} | {parts[1]:.1f} | {parts[2]:.1f} |")


if __name__ == "__main__":
    main()
