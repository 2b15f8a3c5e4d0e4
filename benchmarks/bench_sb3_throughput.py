"""SB3 env-steps/s: the stock algorithm (SB3's uniform buffer) vs ours with PER, interleaved, as ratios.

What a Stable-Baselines3 user pays for prioritized replay, end to end: the same
``learn`` loop with SB3's own buffer and with ours (strict, and with
``staleness``), one torch thread, runs interleaved so that drifts of a shared
machine fall on every variant alike (each variant leads one repeat in turn, so none always runs
last). Prints each variant's median env-steps/s
and its median ratio (of paired runs) to the stock algorithm. Cases:

* ``cartpole``: DQN vs ``PERDQN`` on CartPole-v1, rl-zoo's DQN hyperparameters except a 50k buffer and
  SB3's default training rhythm (``train_freq=4``, ``gradient_steps=1``), as the pipeline issue measured:
  every gradient step follows a commit of new rows, the hardest case for batches drawn ahead;
* ``cartpole-zoo``: the same with rl-zoo's own rhythm and buffer (``train_freq=256``,
  ``gradient_steps=128``, 100k): 128 gradient steps in a row after each 256 env steps;
* ``pendulum``: SAC vs ``PERSAC`` on Pendulum-v1, rl-zoo's SAC hyperparameters;
* ``atari``: DQN vs ``PERDQN`` with ``CnnPolicy`` on ``ALE/Pong-v5`` (ale-py) through SB3's
  ``AtariWrapper`` and a 4-frame stack: 84x84x4 uint8 observations, rl-zoo's Atari DQN
  hyperparameters with a 10k buffer and learning from step 1000, so short runs train.

    python benchmarks/bench_sb3_throughput.py                      # cartpole, 15k steps, 3 repeats
    python benchmarks/bench_sb3_throughput.py --case cartpole --steps 10000 --repeats 5 --staleness 0 1
    python benchmarks/bench_sb3_throughput.py --case cartpole-zoo --steps 10000 --repeats 7 --staleness 0 1
    python benchmarks/bench_sb3_throughput.py --case pendulum --steps 3000 --repeats 5 --staleness 1
    python benchmarks/bench_sb3_throughput.py --case atari --steps 4000 --repeats 5 --staleness 1
    python benchmarks/bench_sb3_throughput.py --case cartpole --steps 10000 --repeats 6 --phases

``--phases`` also splits each run's CPU time (of the learning thread) by phase: ``train()`` and
``collect_rollouts()``, and inside them the buffer's ``add``, ``sample`` and ``update_priorities`` and the
policy's ``predict``; it prints each phase's median seconds per variant and its difference to the stock
algorithm's, so that a gap in env-steps/s can be put where it is spent.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3 import DQN, SAC

from hetero_replay.adapters.sb3 import PERDQN, PERSAC

#: SB3 DQN on CartPole as the rl-zoo tunes it, but on a 50k buffer and training every 4 steps, one gradient step
#: each (SB3's default rhythm: what the pipeline issue measured).
DQN_ARGS = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=50_000, learning_starts=1000, gamma=0.99,
    target_update_interval=10, train_freq=4, gradient_steps=1, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]), device="cpu",
)  # fmt: skip

#: SB3 DQN on CartPole exactly as the rl-zoo tunes it (hyperparams/dqn.yml): 128 gradient steps every 256 env steps.
ZOO_DQN_ARGS = {**DQN_ARGS, "buffer_size": 100_000, "train_freq": 256, "gradient_steps": 128}

#: SB3 SAC on Pendulum as the rl-zoo tunes it (learning rate 1e-3, SB3's defaults otherwise), a 50k buffer.
SAC_ARGS = dict(learning_rate=1e-3, buffer_size=50_000, learning_starts=100, device="cpu")

#: SB3 DQN on Atari as the rl-zoo tunes it, with a 10k buffer and learning from step 1000 (rl-zoo: 100k, 100k).
ATARI_ARGS = dict(
    learning_rate=1e-4, batch_size=32, buffer_size=10_000, learning_starts=1000, target_update_interval=1000,
    train_freq=4, gradient_steps=1, exploration_fraction=0.1, exploration_final_eps=0.01,
    optimize_memory_usage=False, device="cpu",
)  # fmt: skip


def _cartpole() -> Any:
    return gym.make("CartPole-v1")


def _pendulum() -> Any:
    return gym.make("Pendulum-v1")


def _pong() -> Any:
    import ale_py
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    return VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=1, seed=0), n_stack=4)


#: case -> (env factory, stock algorithm, PER algorithm, policy, arguments)
CASES: dict[str, tuple[Callable[[], Any], type, type, str, dict[str, Any]]] = {
    "cartpole": (_cartpole, DQN, PERDQN, "MlpPolicy", DQN_ARGS),
    "cartpole-zoo": (_cartpole, DQN, PERDQN, "MlpPolicy", ZOO_DQN_ARGS),
    "pendulum": (_pendulum, SAC, PERSAC, "MlpPolicy", SAC_ARGS),
    "atari": (_pong, DQN, PERDQN, "CnnPolicy", ATARI_ARGS),
}


def run(case: str, variant: str, steps: int, seed: int, phases: Counter[str] | None = None) -> float:
    """One ``learn`` of ``steps`` env steps of ``variant`` ("stock" or "per-k<staleness>"); its env-steps/s.

    With ``phases``, adds each phase's CPU seconds (of this thread) to it (see the module docstring).
    """
    make_env, stock, per, policy, kwargs = CASES[case]
    env = make_env()
    if variant == "stock":
        model = stock(policy, env, seed=seed, **kwargs)
    else:
        model = per(policy, env, seed=seed, staleness=int(variant.split("k")[1]), **kwargs)
    if phases is not None:
        for owner, name in ((model, "train"), (model, "collect_rollouts"), (model.replay_buffer, "add"),
                            (model.replay_buffer, "sample"), (model.replay_buffer, "update_priorities"),
                            (model.policy, "predict")):  # fmt: skip
            if hasattr(owner, name):
                setattr(owner, name, _timed(getattr(owner, name), name, phases))
    start, cpu = time.perf_counter(), time.thread_time()
    model.learn(total_timesteps=steps)
    elapsed = time.perf_counter() - start
    if phases is not None:
        phases["total"] += time.thread_time() - cpu
    getattr(model.replay_buffer, "close", lambda: None)()  # ours: its worker stops before the next run
    env.close()
    return steps / elapsed


def _timed(method: Callable[..., Any], name: str, phases: Counter[str]) -> Callable[..., Any]:
    """``method``, adding the CPU time of this thread it takes to ``phases[name]``."""

    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            phases[name] += time.thread_time() - start

    return timed


def main(argv: Sequence[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", choices=list(CASES), default="cartpole", help="environment and algorithm")
    p.add_argument("--steps", type=int, default=15_000, help="env steps per run (default 15000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    p.add_argument("--staleness", type=int, nargs="+", default=[0, 1], help="PER staleness values (default 0 1)")
    p.add_argument("--phases", action="store_true", help="also split each run's CPU time by phase")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    _, stock, per, _, _ = CASES[args.case]
    variants = ["stock", *(f"per-k{k}" for k in args.staleness)]
    names = {"stock": stock.__name__, **{f"per-k{k}": f"{per.__name__}(staleness={k})" for k in args.staleness}}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    phases: dict[str, list[Counter[str]]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for v in variants[r % len(variants) :] + variants[: r % len(variants)]:  # each variant leads in turn
            gc.collect()  # the last run's model goes now, not during this one
            phases[v].append(Counter())
            rates[v].append(run(args.case, v, args.steps, seed=r, phases=phases[v][-1] if args.phases else None))
            print(f"repeat {r + 1}/{args.repeats} {names[v]:22s} {rates[v][-1]:8.0f} env-steps/s", flush=True)
    print(f"\n| {args.case} | env-steps/s (median of {args.repeats}) | ratio to {stock.__name__} (median of paired) |")
    print("|---|---|---|")
    for v in variants:
        ratio = statistics.median(a / b for a, b in zip(rates[v], rates["stock"]))
        print(f"| {names[v]} | {statistics.median(rates[v]):.0f} | {ratio:.2f} |")
    if args.phases:
        _print_phases(variants, names, phases)


def _print_phases(variants: list[str], names: dict[str, str], phases: dict[str, list[Counter[str]]]) -> None:
    """Each phase's median CPU seconds per variant, and its difference to the stock variant's."""
    keys = ["total", "collect_rollouts", "predict", "add", "train", "sample", "update_priorities"]
    median = {v: {k: statistics.median(c[k] for c in phases[v]) for k in keys} for v in variants}
    print("\nCPU seconds of the learning thread per run (median; in brackets: minus the stock algorithm's)\n")
    print("| variant | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for v in variants:
        cells = [f"{median[v][k]:.3f}" + ("" if v == "stock" else f" ({median[v][k] - median['stock'][k]:+.3f})")
                 for k in keys]  # fmt: skip
        print(f"| {names[v]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
