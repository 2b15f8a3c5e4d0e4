"""The Tianshou runner: one off-policy algorithm with Tianshou's PER, ours, or uniform replay.

Variants, baseline first:

* ``stock-per`` — Tianshou's ``PrioritizedVectorReplayBuffer`` with the stock
  algorithm. Beta is annealed from a ``training_fn``, through
  ``PrioritizedReplayBuffer.set_beta`` because the vector buffer's own
  ``set_beta`` never reaches sampling.
* ``hetero-per`` — :class:`~hetero_replay.adapters.tianshou.HeteroPrioritizedVectorReplayBuffer`
  with the algorithm wrapped in :class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`.
* ``uniform`` — Tianshou's ``VectorReplayBuffer``.

Run only when ``--variants`` names them (the IS-weight scale study, docs/is-weights.md):

* ``hetero-per-batchnorm`` — ``hetero-per`` with IS weights divided by the batch maximum
  (``weight_norm=True``, Tianshou's rule) instead of the buffer's;
* ``hetero-per-eps1e-3`` — ``hetero-per`` with ``eps=1e-3`` instead of the default ``1e-6``.

Both PER variants use alpha 0.6 and beta annealed linearly from 0.4 to 1 over
the run. Every variant gets the same hyperparameters and algorithm: the
standard setups of :mod:`hetero_replay.adapters.tianshou.workload`
(:data:`HYPERPARAMS` is its ``STANDARD_HYPERPARAMS``, ``make_algorithm`` its
``standard_algorithm``; for DQN on CartPole: an MLP of two 64-unit layers, Adam
at 1e-3, gamma 0.99, batch 64, one gradient step per 4 env steps, the target
network copied every 250 gradient steps (Tianshou's ``target_update_freq``
counts gradient steps, not env steps), Tianshou's MSE loss rather than Huber,
epsilon from 1 to 0.05 over the first 30% of the run), which the placement
advisor profiles too. ``rainbow`` is Tianshou's own Rainbow test setup
(``RainbowDQN``: C51 with 51 atoms, 3-step returns, a dueling net with noisy
heads, gamma 0.9, one gradient step per 8 env steps, epsilon 0.1 -> 0.05);
run it with ``--n-envs 8`` and the variants ``uniform``, ``stock-per`` and
``hetero-per-batchnorm`` (Tianshou's Rainbow normalises by the batch maximum). Each run first
collects ``warmup_steps`` random transitions (untimed, not counted in
``steps``), then trains in epochs of ``eval_every`` env steps with Tianshou's
``OffPolicyTrainer``; between epochs the greedy policy is evaluated on
separate envs reseeded identically each time, so every point of a curve is
scored on the same start states. ``train_s`` covers the epochs only. Epochs are
whole update phases (``collect_per_env * n_envs`` env steps), so a run may do
a few more than ``steps`` env steps (``extra["env_steps_done"]``; e.g. 10,080
for 10,000 with 4 envs); all variants do the same number.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

# The standard setups live with the advisor's Tianshou workload, which profiles the same training.
from hetero_replay.adapters.tianshou.workload import ALPHA, BETA_END, BETA_START, Hyperparams
from hetero_replay.adapters.tianshou.workload import STANDARD_HYPERPARAMS as HYPERPARAMS
from hetero_replay.adapters.tianshou.workload import standard_algorithm as make_algorithm
from hetero_replay.apps.compare.base import RunResult, RunSpec, register_runner

ALGOS = ("dqn", "ddpg", "td3", "sac", "rainbow")
VARIANTS = ("stock-per", "hetero-per", "uniform", "hetero-per-batchnorm", "hetero-per-eps1e-3")
#: Batches drawn after training to measure the final mean IS weight.
FINAL_BATCHES = 16
#: What each of our PER variants sets on :class:`~hetero_replay.adapters.tianshou.HeteroPrioritizedVectorReplayBuffer`.
HETERO_OPTIONS: dict[str, dict[str, Any]] = {
    "hetero-per": {},
    "hetero-per-batchnorm": dict(weight_norm=True),
    "hetero-per-eps1e-3": dict(eps=1e-3),
}


def make_buffer(variant: str, hp: Hyperparams, n_envs: int, seed: int) -> Any:
    """The replay buffer of ``variant``, with ``n_envs`` sub-buffers."""
    from tianshou.data import PrioritizedVectorReplayBuffer, VectorReplayBuffer

    from hetero_replay.adapters.tianshou import HeteroPrioritizedVectorReplayBuffer

    if variant == "stock-per":
        return PrioritizedVectorReplayBuffer(hp.buffer_size, n_envs, alpha=ALPHA, beta=BETA_START)
    if variant in HETERO_OPTIONS:
        return HeteroPrioritizedVectorReplayBuffer(
            hp.buffer_size, n_envs, alpha=ALPHA, beta=BETA_START, random_seed=seed, **HETERO_OPTIONS[variant]
        )
    if variant == "uniform":
        return VectorReplayBuffer(hp.buffer_size, n_envs)
    raise ValueError(f"tianshou has the variants {VARIANTS}, not {variant!r}")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def run(spec: RunSpec, progress: Callable[[int], None]) -> RunResult:
    """Train ``spec.algo`` on ``spec.env_id`` with the ``spec.variant`` replay for ``spec.steps`` env steps."""
    import gymnasium as gym
    import torch
    from tianshou.data import Collector, CollectStats, PrioritizedReplayBuffer
    from tianshou.env import DummyVectorEnv
    from tianshou.trainer import OffPolicyTrainerParams

    import hetero_replay
    from hetero_replay.adapters.tianshou import LinearBetaSchedule, PEROffPolicyWrapper

    if spec.algo not in ALGOS or spec.variant not in VARIANTS:
        raise ValueError(f"tianshou runs {ALGOS} in variants {VARIANTS}, not {spec.algo!r} / {spec.variant!r}")
    start = time.perf_counter()
    torch.set_num_threads(spec.torch_threads)
    hetero_replay.set_num_threads(spec.torch_threads)
    np.random.seed(spec.seed)  # Tianshou's PER and Gaussian exploration noise draw from np.random
    torch.manual_seed(spec.seed)
    hp = HYPERPARAMS[spec.algo]

    train_envs = DummyVectorEnv([lambda: gym.make(spec.env_id) for _ in range(spec.n_envs)])
    train_envs.seed(spec.seed)
    eval_envs = DummyVectorEnv([lambda: gym.make(spec.env_id) for _ in range(spec.eval_episodes)])
    algorithm = make_algorithm(spec.algo, gym.make(spec.env_id), hp)
    buffer = make_buffer(spec.variant, hp, spec.n_envs, spec.seed)

    # Env steps per update phase (whole vector steps, at least one gradient step each, which Tianshou's trainer
    # requires); epochs and the run are whole numbers of phases.
    collect_steps = _round_up(max(hp.collect_per_env * spec.n_envs, math.ceil(1 / hp.updates_per_step)), spec.n_envs)
    epoch_steps = _round_up(spec.eval_every, collect_steps)
    num_epochs = max(1, math.ceil(spec.steps / epoch_steps))
    num_updates = round(num_epochs * epoch_steps * hp.updates_per_step)
    if spec.variant in HETERO_OPTIONS:
        algorithm = PEROffPolicyWrapper(
            wrapped_algorithm=algorithm,
            beta=LinearBetaSchedule(BETA_START, BETA_END, max(1, num_updates)),
            staleness=spec.staleness or 0,
        )
    policy = algorithm.policy
    total_steps = num_epochs * epoch_steps

    def training_fn(epoch: int, env_step: int) -> None:
        fraction = min(1.0, env_step / total_steps)
        if spec.algo in ("dqn", "rainbow"):
            eps_start = hp.extra.get("eps_start", 1.0)
            eps_final, eps_fraction = hp.extra["eps_final"], hp.extra["eps_fraction"]
            policy.set_eps_training(max(eps_final, eps_start - (eps_start - eps_final) * fraction / eps_fraction))
        if spec.variant == "stock-per":  # the manager's own beta: its set_beta only reaches the children
            PrioritizedReplayBuffer.set_beta(buffer, BETA_START + (BETA_END - BETA_START) * fraction)

    training_collector = Collector[CollectStats](algorithm, train_envs, buffer, exploration_noise=True)
    training_collector.reset()
    training_collector.collect(n_step=_round_up(hp.warmup_steps, spec.n_envs), random=True)
    eval_collector = Collector[CollectStats](algorithm, eval_envs)
    eval_steps: list[int] = []
    eval_returns: list[float] = []

    def evaluate(step: int) -> None:
        eval_envs.seed(spec.seed + 1_000_000)  # the same start states at every evaluation
        eval_collector.reset()
        stats = eval_collector.collect(n_episode=spec.eval_episodes)
        assert stats.returns_stat is not None  # set whenever episodes were collected
        eval_steps.append(step)
        eval_returns.append(float(stats.returns_stat.mean))

    trainer = algorithm.create_trainer(
        OffPolicyTrainerParams(
            training_collector=training_collector,
            test_collector=None,
            max_epochs=num_epochs,
            epoch_num_steps=epoch_steps,
            collection_step_num_env_steps=collect_steps,
            update_step_num_gradient_steps_per_sample=hp.updates_per_step,
            batch_size=hp.batch_size,
            training_fn=training_fn,
            verbose=False,
            show_progress=False,
        )  # fmt: skip
    )
    evaluate(0)
    trainer.reset()
    train_s = train_cpu_s = 0.0
    env_steps = reported = 0
    for _ in range(num_epochs):
        wall, cpu = time.perf_counter(), time.process_time()
        epoch = trainer.execute_epoch()
        train_s += time.perf_counter() - wall
        train_cpu_s += time.process_time() - cpu
        env_steps = epoch.info_stat.train_step  # the collector's count since trainer.reset()
        progress(min(env_steps, spec.steps) - reported)
        reported = min(env_steps, spec.steps)
        evaluate(env_steps)

    extra: dict[str, Any] = {
        "train_cpu_s": train_cpu_s,
        "env_steps_done": int(env_steps),
        "warmup_steps": _round_up(hp.warmup_steps, spec.n_envs),
        "gradient_steps": num_updates,
    }
    if spec.variant in HETERO_OPTIONS:
        extra.update(final_beta=buffer.beta, max_priority=buffer.max_priority)
        # The scale of the learner's last updates (docs/is-weights.md): the mean IS weight of a few fresh batches.
        extra["final_mean_weight"] = float(
            np.mean([buffer.sample(hp.batch_size)[0].weight for _ in range(FINAL_BATCHES)])
        )
    elif spec.variant != "uniform":  # Tianshou's own buffer keeps them private
        extra.update(final_beta=float(buffer._beta), max_priority=float(buffer._max_prio))
    return RunResult(
        spec=spec,
        wall_s=time.perf_counter() - start,
        train_s=train_s,
        eval_steps=eval_steps,
        eval_returns=eval_returns,
        extra=extra,
    )


register_runner("tianshou", VARIANTS, ALGOS, run, relaxable=tuple(HETERO_OPTIONS), defaults=VARIANTS[:3])
