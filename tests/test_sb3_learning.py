"""PERDQN learns CartPole-v1: on 2 of 3 seeds, a greedy evaluation return of 150 within 10,000 steps.

Which seed learns how fast is chaotic: one different rounding in one matrix product
(another CPU, another BLAS code path, another SIMD width) sends a run down another
trajectory. So the test asserts on what holds for nearly every trajectory, with margin:

* **a threshold far from random play and below the plateau.** A uniformly random policy
  scores about 22 on CartPole-v1, a constant action 8-10; trained runs evaluate at 100-250
  (now and then 500) once training starts, and nearly every seed first reaches 150 at 2,000
  or 3,000 steps. The budget is 10,000 steps.
* **several seeds.** 2 of the 3 seeds must reach the threshold, so one unlucky trajectory
  does not fail the test. Every seed also checks that PER was live (beta annealed,
  TD errors fed back as priorities), which holds on any trajectory.

``benchmarks/learning_pass_rates.py`` measures the pass rate of this rule over many seeds,
with torch's scalar/AVX2/AVX-512 kernels, MKL's SSE2/AVX2 code paths, flushed denormals, two
threads and a one-ulp change of one initial weight: 98 distinct trajectories of seeds 0-19 all
reached 150, by 5,000 steps at the latest (median 2,000); trained for the whole budget, seeds
0-9 peak at 187-500.

Hyperparameters: rl-zoo's CartPole-v1 DQN settings, except that training runs every 16 steps
(8 gradient steps) instead of every 256 (128), and the target network is synced every 100 steps
instead of every 10. With the rl-zoo interval the target was re-synced before every train()
call of only 8 gradient steps, and Q-values diverged: on all 10 seeds tried, TD errors reached
7e4-4e7 within 20,000 steps and 8 of the 10 ended on a constant-action policy (returns of 9);
stock SB3 DQN diverged the same way (2 of 2 seeds tried). The old test (400 within 20,000 steps, seed 0 only)
caught one seed's peak before the collapse, which another machine's rounding missed (seed 0
peaks at 199.8 on an AMD EPYC; 6 of seeds 0-9 reach 400). With 100, Q-values stay near their
true scale (~80), TD errors under ~130, and evaluations at 100-250 (500 now and then).

Cost: 2-4 s of one core per seed that reaches the threshold at 2,000-3,000 steps, about 15 s
for one that uses the whole budget; the test takes about 10 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch as th

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.callbacks import BaseCallback  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.evaluation import evaluate_policy  # noqa: E402

from hetero_replay.adapters.sb3 import PERDQN  # noqa: E402

HYPERPARAMS = dict(
    learning_rate=2.3e-3, batch_size=64, buffer_size=100_000, learning_starts=1000, gamma=0.99,
    target_update_interval=100, train_freq=16, gradient_steps=8, exploration_fraction=0.16,
    exploration_final_eps=0.04, policy_kwargs=dict(net_arch=[256, 256]),
)  # fmt: skip
SEEDS = (0, 1, 2)
NEEDED = 2  # seeds of SEEDS that must reach THRESHOLD
THRESHOLD = 150.0  # mean greedy return over EVAL_EPISODES; random play scores ~22
BUDGET = 10_000  # env steps per seed
EVAL_EVERY = 1000  # env steps; the first evaluation comes after the first train() calls
EVAL_EPISODES = 5


@dataclass
class Run:
    """One seed's training run: its evaluations, and the state of PER at the end."""

    seed: int
    steps: int  # env steps trained
    curve: list[tuple[int, float]] = field(default_factory=list)  # (env steps, mean evaluation return)
    beta: float = float("nan")
    max_priority: float = float("nan")
    n_updates: int = 0

    @property
    def best(self) -> float:
        return max((r for _, r in self.curve), default=float("nan"))

    def reached(self, threshold: float | None = None) -> int | None:
        """The env steps at the first evaluation of ``threshold`` (default THRESHOLD) or more; None: never."""
        threshold = THRESHOLD if threshold is None else threshold
        return next((s for s, r in self.curve if r >= threshold), None)

    def __str__(self) -> str:
        at = self.reached()
        outcome = f"reached {THRESHOLD:g} at {at} steps" if at is not None else f"MISSED {THRESHOLD:g}"
        curve = ", ".join(f"{r:.0f}" for _, r in self.curve)
        return f"seed {self.seed}: {outcome}, best {self.best:.1f} in {self.steps} steps (evaluations: {curve})"


class EvaluateAndStop(BaseCallback):
    """Every ``EVAL_EVERY`` env steps after learning starts: the mean greedy return over
    ``EVAL_EPISODES`` episodes; stops training at the first one of ``stop_at`` or more."""

    def __init__(self, seed: int, stop_at: float | None) -> None:
        super().__init__()
        self.eval_env = make_vec_env("CartPole-v1", seed=100 + seed)
        self.stop_at = stop_at
        self.curve: list[tuple[int, float]] = []

    def _on_step(self) -> bool:
        if self.num_timesteps % EVAL_EVERY or self.num_timesteps <= self.model.learning_starts:
            return True  # evaluate trained policies only: an untrained network is not learning
        mean, _ = evaluate_policy(self.model, self.eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
        self.curve.append((self.num_timesteps, float(mean)))
        return self.stop_at is None or mean < self.stop_at


def train(
    seed: int, budget: int = BUDGET, stop_at: float | None = THRESHOLD, threads: int = 1, tree: str = "auto",
    shards: int = 0, n_steps: int = 1,
) -> Run:  # fmt: skip
    """Train PERDQN on CartPole-v1 (``threads`` torch threads, sum tree ``tree``; with ``shards``, a
    ``ShardedReplay`` of that many shards on Ray; ``n_steps``-step returns) until an evaluation reaches
    ``stop_at`` or for ``budget`` env steps. Also used by ``benchmarks/learning_pass_rates.py``
    and ``tests/test_sb3_nstep.py``."""
    before = th.get_num_threads()
    th.set_num_threads(threads)
    kwargs: dict = {} if tree == "auto" else dict(tree=tree)
    if shards:
        kwargs["distributed"] = dict(num_shards=shards)
    buffer = dict(replay_buffer_kwargs=kwargs) if kwargs else {}
    try:
        model = PERDQN("MlpPolicy", "CartPole-v1", seed=seed, device="cpu", n_steps=n_steps, **HYPERPARAMS, **buffer)
        evaluation = EvaluateAndStop(seed, stop_at)
        model.learn(budget, callback=evaluation)
    finally:
        th.set_num_threads(before)
    buf = model.replay_buffer
    run = Run(seed, model.num_timesteps, evaluation.curve, buf.beta, buf.max_priority, model._n_updates)
    if shards:
        buf.replay.close()  # the shards' actors
    return run


@pytest.mark.learning
@pytest.mark.parametrize(
    "tree, shards",
    # The C++ tree; the FPGA RMM's emulation (fixed point); a 2-shard ShardedReplay on a local Ray instance.
    [("auto", 0), ("fpga", 0), ("auto", 2)],
    ids=["native", "fpga", "2-shards"],
)
def test_perdqn_learns_cartpole_on_most_seeds(tree: str, shards: int, request: pytest.FixtureRequest) -> None:
    if shards:
        request.getfixturevalue("ray_local")
    runs = [train(seed, tree=tree, shards=shards) for seed in SEEDS]
    report = "\n".join(map(str, runs))
    learned = [run for run in runs if run.reached() is not None]
    assert len(learned) >= NEEDED, f"{len(learned)} of {len(SEEDS)} seeds reached {THRESHOLD:g}:\n{report}"
    for run in runs:  # PER was live on every trajectory: beta annealing, TD errors fed back as priorities
        assert run.n_updates > 0 and run.beta > 0.4 and run.max_priority > 1.0, (
            f"seed {run.seed}: {run.n_updates} updates, beta {run.beta}, max priority {run.max_priority}\n{report}"
        )
