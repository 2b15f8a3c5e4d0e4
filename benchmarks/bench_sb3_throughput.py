"""SB3 env-steps/s: the stock algorithm (SB3's uniform buffer) vs ours with PER, interleaved, as ratios.

What a Stable-Baselines3 user pays for prioritized replay, end to end: the same
``learn`` loop with SB3's own buffer and with ours (strict, and with
``staleness``), one torch thread. All variants of a repeat live in one process and take
turns every ``--chunk`` env steps (``learn`` resumed where it stopped, the order of the
variants random in each round), so that the drifts of a shared machine (its speed moves by
10-20% within minutes) fall on every variant alike. Prints each variant's median
env-steps/s over the repeats (fresh models each) and its median ratio to the stock
algorithm, with each repeat's ratio. Cases:

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

``--flush-denormal`` runs torch with subnormal floats flushed to zero: the variants learn different weights, and
arithmetic on subnormal values in them (and in the optimizers' states) is several times slower on a CPU.

A turn ends at the first env step past ``--chunk`` (a callback stops ``learn``), so each
turn skips the training of one partial rollout, in every variant alike: with the
default chunks that is one gradient step in 500 (CartPole), one in 50 (Pendulum).

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
import numpy as np
import torch
from stable_baselines3 import DQN, SAC
from stable_baselines3.common.callbacks import BaseCallback
from tqdm import tqdm

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


#: case -> env steps per turn (about half a second of learning each)
CHUNKS = {"cartpole": 500, "cartpole-zoo": 1024, "pendulum": 50, "atari": 200}


class Learner:
    """One variant ("stock" or "per-k<staleness>") of ``case``, learning ``steps`` env steps in turns.

    With ``phases``, adds each phase's CPU seconds (of this thread) to it (see the module docstring).
    """

    def __init__(self, case: str, variant: str, steps: int, seed: int, phases: Counter[str] | None = None) -> None:
        make_env, stock, per, policy, kwargs = CASES[case]
        self.env, self.steps, self.phases = make_env(), steps, phases
        if variant == "stock":
            self.model = stock(policy, self.env, seed=seed, **kwargs)
        else:
            self.model = per(policy, self.env, seed=seed, staleness=int(variant.split("k")[1]), **kwargs)
        if phases is not None:
            for owner, name in ((self.model, "train"), (self.model, "collect_rollouts"),
                                (self.model.replay_buffer, "add"), (self.model.replay_buffer, "sample"),
                                (self.model.replay_buffer, "update_priorities"), (self.model.policy, "predict")):  # fmt: skip
                if hasattr(owner, name):
                    setattr(owner, name, _timed(getattr(owner, name), name, phases))

    @property
    def done(self) -> bool:
        return self.model.num_timesteps >= self.steps

    def turn(self, chunk: int) -> tuple[int, float]:
        """Learn on for about ``chunk`` env steps: ``(env steps, seconds)``.

        ``learn`` is told the steps left of the whole run, so its schedules
        (exploration, learning rate, beta) run as in one ``learn(steps)``.
        """
        before = self.model.num_timesteps
        start, cpu = time.perf_counter(), time.thread_time()
        self.model.learn(
            total_timesteps=self.steps - before, reset_num_timesteps=before == 0, callback=_StopAfter(chunk)
        )
        elapsed = time.perf_counter() - start
        if self.phases is not None:
            self.phases["total"] += time.thread_time() - cpu
        return self.model.num_timesteps - before, elapsed

    def close(self) -> None:
        getattr(self.model.replay_buffer, "close", lambda: None)()  # ours: its worker stops before the next run
        self.env.close()


class _StopAfter(BaseCallback):
    """Stops ``learn`` at the first env step past ``chunk`` steps of this call."""

    def __init__(self, chunk: int) -> None:
        super().__init__()
        self.chunk, self.start = chunk, 0

    def _on_training_start(self) -> None:
        self.start = self.num_timesteps

    def _on_step(self) -> bool:
        return self.num_timesteps - self.start <= self.chunk


def run(case: str, variant: str, steps: int, seed: int, phases: Counter[str] | None = None) -> float:
    """One ``learn`` of ``steps`` env steps of ``variant`` in a single turn; its env-steps/s."""
    learner = Learner(case, variant, steps, seed, phases)
    done, elapsed = learner.turn(steps)
    learner.close()
    return done / elapsed


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
    p.add_argument("--chunk", type=int, default=None, help="env steps per turn (default: per case, ~0.5 s)")
    p.add_argument("--phases", action="store_true", help="also split each run's CPU time by phase")
    p.add_argument("--flush-denormal", action="store_true", help="torch flushes subnormal floats to zero")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        p.error("--flush-denormal: this CPU cannot flush subnormal floats (no SSE3)")
    _, stock, per, _, _ = CASES[args.case]
    variants = ["stock", *(f"per-k{k}" for k in args.staleness)]
    names = {"stock": stock.__name__, **{f"per-k{k}": f"{per.__name__}(staleness={k})" for k in args.staleness}}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    phases: dict[str, list[Counter[str]]] = {v: [] for v in variants}
    chunk = args.chunk or CHUNKS[args.case]
    for r in range(args.repeats):
        learners = {}
        for v in variants:
            phases[v].append(Counter())
            learners[v] = Learner(args.case, v, args.steps, seed=r, phases=phases[v][-1] if args.phases else None)
        totals = {v: [0, 0.0] for v in variants}
        order = np.random.default_rng(r)
        with tqdm(total=args.steps * len(variants), desc=f"repeat {r + 1}/{args.repeats}", leave=False) as bar:
            while not all(learner.done for learner in learners.values()):
                for v in order.permutation(variants):  # no variant always follows the same one
                    if not learners[v].done:
                        gc.collect()  # the last turn's garbage goes now, not during this one
                        done, elapsed = learners[v].turn(chunk)
                        totals[v] = [totals[v][0] + done, totals[v][1] + elapsed]
                        bar.update(done)
        for v in variants:
            learners[v].close()
            rates[v].append(totals[v][0] / totals[v][1])
            print(f"repeat {r + 1}/{args.repeats} {names[v]:22s} {rates[v][-1]:8.0f} env-steps/s", flush=True)
    print(
        f"\n| {args.case} | env-steps/s (median of {args.repeats}) | ratio to {stock.__name__} (median) "
        "| ratios (each repeat) |"
    )
    print("|---|---|---|---|")
    for v in variants:
        ratios = [a / b for a, b in zip(rates[v], rates["stock"])]
        each = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"| {names[v]} | {statistics.median(rates[v]):.0f} | {statistics.median(ratios):.2f} | {each} |")
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
