"""The Stable-Baselines3 runner: the same algorithm with SB3's uniform buffer or with PER.

Variants:

* ``uniform`` — the stock SB3 algorithm (DQN, DDPG, TD3, SAC; QR-DQN, TQC, CrossQ from
  sb3-contrib) with its own ``ReplayBuffer``;
* ``per`` — its PER subclass from :mod:`hetero_replay.adapters.sb3` (``PERDQN``, ...)
  with the default :class:`~hetero_replay.adapters.sb3.PrioritizedReplayBuffer`
  (alpha 0.6, beta annealed from 0.4 to 1); with ``--staleness`` once per staleness.

Run only when ``--variants`` names them (the IS-weight scale study, docs/is-weights.md):

* ``per-batchnorm`` — ``per`` with IS weights divided by the batch maximum
  (``weight_norm="batch"``) instead of the buffer's;
* ``per-eps1e-3`` — ``per`` with ``eps=1e-3`` instead of the default ``1e-6``.

With ``--n-steps k`` both train on k-step returns: SB3's ``NStepReplayBuffer``
and :class:`~hetero_replay.adapters.sb3.NStepPrioritizedReplayBuffer`.

On a goal-conditioned env (``Dict`` observations with ``achieved_goal`` and
``desired_goal``) both use hindsight experience replay with SB3's settings
(``n_sampled_goal=4``, ``"future"``): SB3's ``HerReplayBuffer`` and
:class:`~hetero_replay.adapters.sb3.PrioritizedHerReplayBuffer`. ``BitFlipping-v0``
(registered here) is SB3's ``BitFlippingEnv`` with 10 bits.

Both get the same hyperparameters: the rl-zoo settings for the pairs in
:data:`HYPERPARAMS`, SB3's defaults otherwise. Evaluations run the greedy
policy on a separate environment reseeded identically each time, so every
point of a curve is scored on the same start states.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hetero_replay.apps.compare.base import RunResult, RunSpec, register_runner

#: rl-zoo hyperparameters (rl-baselines3-zoo, hyperparams/<algo>.yml) per (algo, env id).
HYPERPARAMS: dict[tuple[str, str], dict[str, Any]] = {
    ("dqn", "CartPole-v1"): dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
    ),
    ("ddpg", "Pendulum-v1"): dict(
        gamma=0.98, buffer_size=200_000, learning_starts=10_000, gradient_steps=1, train_freq=1,
        learning_rate=1e-3, action_noise_std=0.1, policy_kwargs=dict(net_arch=[400, 300]),
    ),
    ("td3", "Pendulum-v1"): dict(
        gamma=0.98, buffer_size=200_000, learning_starts=10_000, gradient_steps=1, train_freq=1,
        learning_rate=1e-3, action_noise_std=0.1, policy_kwargs=dict(net_arch=[400, 300]),
    ),
    ("sac", "Pendulum-v1"): dict(learning_rate=1e-3),
    ("tqc", "Pendulum-v1"): dict(learning_rate=1e-3),  # rl-baselines3-zoo, hyperparams/tqc.yml
    ("crossq", "Pendulum-v1"): dict(policy_delay=2, policy_kwargs=dict(net_arch=[256, 256])),  # ... crossq.yml
    # rl-baselines3-zoo, hyperparams/qrdqn.yml: DQN's CartPole settings with 10 quantiles.
    ("qrdqn", "CartPole-v1"): dict(
        learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
        target_update_interval=10, train_freq=256, gradient_steps=128, exploration_fraction=0.16,
        exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256], n_quantiles=10),
    ),
    # tests/test_sb3_her.py's settings (SB3's test of HER on this env uses DQN's defaults, which learn slower).
    ("dqn", "BitFlipping-v0"): dict(
        learning_starts=200, buffer_size=100_000, learning_rate=1e-3, batch_size=64, train_freq=1,
        gradient_steps=1, exploration_fraction=0.2, exploration_final_eps=0.05, target_update_interval=250,
        gamma=0.95, policy_kwargs=dict(net_arch=[64, 64]),
    ),
}  # fmt: skip

#: Hindsight experience replay's settings on goal-conditioned envs (SB3's defaults), for both variants.
HER_KWARGS = dict(n_sampled_goal=4, goal_selection_strategy="future")

#: SB3's algorithms and sb3-contrib's (``qrdqn``, ``tqc``, ``crossq``: the ``contrib`` extra).
ALGOS = ("dqn", "ddpg", "td3", "sac", "qrdqn", "tqc", "crossq")
VARIANTS = ("uniform", "per", "per-batchnorm", "per-eps1e-3")
#: The replay-buffer options of each PER variant.
PER_OPTIONS: dict[str, dict[str, Any]] = {
    "per": {},
    "per-batchnorm": dict(weight_norm="batch"),
    "per-eps1e-3": dict(eps=1e-3),
}
#: Batches drawn after training to measure the final mean IS weight.
FINAL_BATCHES = 16


def algorithm_class(algo: str, variant: str) -> type:
    """The SB3 (or sb3-contrib) class (``uniform``) or its PER subclass (``per``) for ``algo``."""
    import hetero_replay.adapters.sb3 as per

    if algo not in ALGOS or variant not in VARIANTS:
        raise ValueError(f"sb3 runs {ALGOS} in variants {VARIANTS}, not {algo!r} / {variant!r}")
    name = {"qrdqn": "QRDQN", "crossq": "CrossQ"}.get(algo, algo.upper())
    per_class: type = getattr(per, f"PER{name}")  # sb3-contrib's: an ImportError naming the extra if missing
    return per_class if variant in PER_OPTIONS else per_class.__bases__[-1]  # PERX(mixin, X): the stock X


def hyperparameters(algo: str, env_id: str, steps: int) -> dict[str, Any]:
    """Keyword arguments for the algorithm: :data:`HYPERPARAMS` or SB3's defaults.

    ``learning_starts`` is capped at half of ``steps`` (as in rl-zoo's own budgets) so that a short
    budget still trains; ``action_noise_std`` becomes a Gaussian action noise.
    """
    params = copy.deepcopy(HYPERPARAMS.get((algo, env_id), {}))  # SB3 may edit policy_kwargs
    if "learning_starts" in params:
        params["learning_starts"] = min(params["learning_starts"], steps // 2)
    return params


def _make_model(spec: RunSpec) -> Any:
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    params = hyperparameters(spec.algo, spec.env_id, spec.steps)
    env = make_vec_env(spec.env_id, n_envs=spec.n_envs, seed=spec.seed)
    noise_std = params.pop("action_noise_std", None)
    if noise_std is not None:
        dim = int(np.prod(env.action_space.shape or ()))
        params["action_noise"] = NormalActionNoise(np.zeros(dim), noise_std * np.ones(dim))
    policy = "MultiInputPolicy" if hasattr(env.observation_space, "spaces") else "MlpPolicy"
    if {"achieved_goal", "desired_goal"} <= set(getattr(env.observation_space, "spaces", ())):
        params["replay_buffer_class"] = _her_buffer(spec.variant)
        params["replay_buffer_kwargs"] = dict(HER_KWARGS)
    if spec.staleness is not None:
        params["staleness"] = spec.staleness  # only "per" is relaxable
    if spec.n_steps > 1:  # SB3's NStepReplayBuffer for "uniform", NStepPrioritizedReplayBuffer for "per"
        params["n_steps"] = spec.n_steps
    if PER_OPTIONS.get(spec.variant):
        params["replay_buffer_kwargs"] = {**params.get("replay_buffer_kwargs", {}), **PER_OPTIONS[spec.variant]}
    return algorithm_class(spec.algo, spec.variant)(policy, env, seed=spec.seed, **params)


def _her_buffer(variant: str) -> type:
    """SB3's ``HerReplayBuffer`` (``uniform``) or ours with priorities (``per``)."""
    from stable_baselines3 import HerReplayBuffer

    from hetero_replay.adapters.sb3 import PrioritizedHerReplayBuffer

    return PrioritizedHerReplayBuffer if variant in PER_OPTIONS else HerReplayBuffer


def _register_goal_envs() -> None:
    """Give SB3's ``BitFlippingEnv`` (10 bits) a gymnasium id, so ``--env BitFlipping-v0`` names it."""
    import gymnasium

    if "BitFlipping-v0" not in gymnasium.registry:
        gymnasium.register("BitFlipping-v0", "stable_baselines3.common.envs:BitFlippingEnv", kwargs=dict(n_bits=10))


def _evaluator(spec: RunSpec, model: Any) -> Callable[[], float]:
    """Mean greedy return over ``eval_episodes``, always from the same start states."""
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    eval_env = make_vec_env(spec.env_id, n_envs=1, seed=spec.seed + 1_000_000)

    def evaluate() -> float:
        eval_env.seed(spec.seed + 1_000_000)
        mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=spec.eval_episodes, deterministic=True)
        return float(mean)  # type: ignore[arg-type]  # a float when return_episode_rewards is False

    return evaluate


def run(spec: RunSpec, progress: Callable[[int], None]) -> RunResult:
    """Train ``spec.algo`` on ``spec.env_id`` with the ``spec.variant`` replay for ``spec.steps`` steps."""
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    import hetero_replay

    torch.set_num_threads(spec.torch_threads)
    hetero_replay.set_num_threads(spec.torch_threads)
    start = time.perf_counter()
    model = _make_model(spec)
    evaluate = _evaluator(spec, model)
    eval_steps: list[int] = []
    eval_returns: list[float] = []

    def record(step: int) -> tuple[float, float]:
        """Evaluate at ``step``; returns the (wall, CPU) seconds it took."""
        wall, cpu = time.perf_counter(), time.process_time()
        eval_steps.append(step)
        eval_returns.append(evaluate())
        return time.perf_counter() - wall, time.process_time() - cpu

    class EvalAndProgress(BaseCallback):
        """Evaluates every ``eval_every`` env steps and reports progress; keeps the time evaluations took."""

        def __init__(self) -> None:
            super().__init__()
            self.next_eval = spec.eval_every
            self.report_every = max(spec.steps // 100, 1)
            self.reported = 0
            self.eval_wall = self.eval_cpu = 0.0

        def _on_step(self) -> bool:
            done = min(self.num_timesteps, spec.steps)  # SB3 may overshoot by up to train_freq
            if done - self.reported >= self.report_every:
                progress(done - self.reported)
                self.reported = done
            if self.num_timesteps >= self.next_eval:
                self.next_eval += spec.eval_every
                if self.num_timesteps < spec.steps:  # the final evaluation follows learn()
                    wall, cpu = record(self.num_timesteps)
                    self.eval_wall += wall
                    self.eval_cpu += cpu
            return True

    callback = EvalAndProgress()
    record(0)
    wall, cpu = time.perf_counter(), time.process_time()
    model.learn(spec.steps, callback=callback)
    train_s = time.perf_counter() - wall - callback.eval_wall
    train_cpu_s = time.process_time() - cpu - callback.eval_cpu
    progress(spec.steps - callback.reported)
    record(spec.steps)
    extra: dict[str, Any] = {"train_cpu_s": train_cpu_s, "env_steps_done": int(model.num_timesteps)}
    buffer = model.replay_buffer
    if hasattr(buffer, "update_priorities"):
        extra.update(final_beta=buffer.beta, max_priority=buffer.max_priority)
        # The scale of the learner's last updates (docs/is-weights.md): the mean IS weight of a few fresh batches.
        extra["final_mean_weight"] = float(
            np.mean([float(buffer.sample(model.batch_size).weights.mean()) for _ in range(FINAL_BATCHES)])
        )
    return RunResult(
        spec=spec,
        wall_s=time.perf_counter() - start,
        train_s=train_s,
        eval_steps=eval_steps,
        eval_returns=eval_returns,
        extra=extra,
    )


_register_goal_envs()
register_runner("sb3", VARIANTS, ALGOS, run, relaxable=tuple(PER_OPTIONS), n_step=True, defaults=VARIANTS[:2])
