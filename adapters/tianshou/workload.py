"""The placement advisor's Tianshou workload: standard setups, timed host steps and replay primitives, real runs.

:func:`make_workload` builds a :class:`TianshouWorkload`, the
:class:`~hetero_replay.advisor.workload.Workload` of one Tianshou 2.x training
setup: an off-policy algorithm wrapped in
:class:`~hetero_replay.adapters.tianshou.PEROffPolicyWrapper`, a
:class:`~hetero_replay.adapters.tianshou.HeteroPrioritizedVectorReplayBuffer`,
a ``Collector`` over a ``DummyVectorEnv`` and Tianshou's ``OffPolicyTrainer``,
as :mod:`hetero_replay.apps.compare.tianshou_runs` trains. Everything it times
is Tianshou's own code path, and the steps that make up training are timed
*inside* the trainer's loop, where they run:

* One timed call runs an epoch of :data:`STEPS_PER_CALL` training steps (each a
  collect phase of ``collect_steps`` vector steps, then ``gradient_steps``
  gradient steps) of a real ``OffPolicyTrainer`` whose epochs, gradient steps
  and buffer calls are clocked (:class:`~hetero_replay.advisor.profile.Clock`,
  :func:`~hetero_replay.advisor.profile.measure_in_loop`). ``learn`` is one gradient step as
  the trainer does it: ``algorithm.update(sample_size=B, buffer=buffer)``, then
  the moving averages and logging of its statistics (``_sample_and_update``).
  ``collect`` is the rest of the training step's time, per vector step:
  ``Collector.collect``, the trainer's ``hasnull`` check after it, its
  bookkeeping. ``phase`` is the whole training step, so ``collect_steps *
  collect + gradient_steps * learn = phase``, the time per training step
  :meth:`TianshouWorkload.run` measures. ``phase_inline`` is ``phase`` with
  the wrapper's ``staleness=1``; its setup and the strict one run their epochs
  in turn within each timed call, so their difference is not a change of the
  machine's load.
* The replay primitives (:meth:`TianshouWorkload.time_replay`) are the
  buffer's ``add`` of one vector step as the collector calls it, ``sample(B)``
  and ``update_weight(indices, td)`` as the algorithm calls them (with the TD
  errors it leaves, a float tensor on the learner device), clocked in the same
  loop. Tianshou's batches are Python objects built under the GIL, so the
  wrapper runs the relaxed schedule on the learner's thread: there is no
  worker thread to time (``phase_relaxed`` is ``None``).
* ``env_step`` and ``inference`` are timed alone (the model only uses them to
  split the collect step's time): one ``DummyVectorEnv.step`` of random actions
  (resetting finished envs, as the collector does), and the policy's forward
  on ``n_envs`` observations with exploration, as the collector computes actions.

Why in the loop: timed apart, each in a loop of its own, Tianshou's collect
phases and gradient steps ran about 20% faster than alternating in training
(DQN on CartPole, caches warm for one kind of work), and the torch tree's
sample and update about 1.7 times faster; a collect of a single vector step
pays ``Collector.collect``'s per-call cost (~0.5 ms there) that a collect
phase pays once.

Every buffer starts full: real transitions collected once with random actions
(:data:`SOURCE_ROWS` per env, cut at an episode end) are tiled over all ``N``
slots in one storage write, with each sub-buffer's bookkeeping set as after a
long run, and given random priorities (``|N(0, 1)|`` TD errors, turned into
priorities by the trees' own arithmetic and loaded into the tree at once);
DQN's epsilon sits at its final value. Each method builds what it times
afresh, runs with fixed seeds and restores the random generators and thread
settings it found.

The standard setups (:data:`STANDARD_HYPERPARAMS`, :func:`standard_algorithm`)
are the ones the comparison runner trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm.algorithm_base import OffPolicyAlgorithm
from tianshou.data import Batch, Collector, CollectStats, VectorReplayBuffer, to_numpy
from tianshou.data.types import RolloutBatchProtocol
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OffPolicyTrainer, OffPolicyTrainerParams
from tianshou.utils.torch_utils import policy_within_training_step, torch_train_mode

import hetero_replay
from hetero_replay import Placement
from hetero_replay.adapters.tianshou.buffers import HeteroPrioritizedVectorReplayBuffer
from hetero_replay.adapters.tianshou.episode_book import EpisodeBook
from hetero_replay.adapters.tianshou.schedules import LinearBetaSchedule
from hetero_replay.adapters.tianshou.weighted_updates import check_supported
from hetero_replay.adapters.tianshou.wrapper import PEROffPolicyWrapper
from hetero_replay.extend import (
    ALGOS,
    HOST_REPETITION_S,
    Candidate,
    Clock,
    ReplayConfig,
    Timer,
    Timing,
    WorkloadSpec,
    check_int,
)

#: Priority exponent and the IS-weight exponent's linear schedule of the PER setups.
ALPHA, BETA_START, BETA_END = 0.6, 0.4, 1.0
#: Real transitions collected per env to tile the buffer with (a few hundred, cut at an episode end).
SOURCE_ROWS = 256
#: Training steps per timed call (each repetition averages over them).
STEPS_PER_CALL = 4
#: Seed of the envs, networks, exploration and the buffer's sampling.
SEED = 0
#: The replay primitives, by the buffer method Tianshou calls for each.
_PRIMITIVES = {"insert": "add", "sample": "sample", "update": "update_weight"}


@dataclasses.dataclass(frozen=True)
class Hyperparams:
    """What a training setup of one algorithm needs besides the env: network, optimiser, schedule, sizes."""

    hidden_sizes: tuple[int, ...] = (64, 64)
    lr: float = 1e-3
    gamma: float = 0.99
    batch_size: int = 64
    buffer_size: int = 50_000
    warmup_steps: int = 1000  # random transitions collected before training
    collect_per_env: int = 4  # env steps per env between update phases
    updates_per_step: float = 0.25  # gradient steps per collected env step
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)  # algorithm-specific arguments


#: Per algorithm. DQN: a stock CartPole setup (target network every 250
#: gradient steps, MSE loss, epsilon 1 -> 0.05 over 30% of the run).
STANDARD_HYPERPARAMS: dict[str, Hyperparams] = {
    "dqn": Hyperparams(extra=dict(target_update_freq=250, eps_final=0.05, eps_fraction=0.3)),
    "ddpg": Hyperparams(buffer_size=20_000, collect_per_env=1, updates_per_step=1.0, extra=dict(noise=0.1)),
    "td3": Hyperparams(buffer_size=20_000, collect_per_env=1, updates_per_step=1.0, extra=dict(noise=0.1)),
    "sac": Hyperparams(buffer_size=20_000, collect_per_env=1, updates_per_step=1.0, extra=dict(alpha=0.2)),
    # Tianshou's own Rainbow test setup (test/discrete/test_rainbow.py): dueling net with noisy heads, 51 atoms,
    # 3-step returns, one gradient step per 8 env steps, epsilon 0.1 -> 0.05 over the first half (noisy nets explore).
    "rainbow": Hyperparams(
        hidden_sizes=(128, 128, 128, 128),
        gamma=0.9,
        buffer_size=20_000,
        warmup_steps=512,
        collect_per_env=1,
        updates_per_step=0.125,
        extra=dict(
            target_update_freq=320,
            eps_start=0.1,
            eps_final=0.05,
            eps_fraction=0.5,
            num_atoms=51,
            v_min=-10.0,
            v_max=10.0,
            n_step=3,
            noisy_std=0.1,
        ),
    ),  # fmt: skip
}


def standard_algorithm(algo: str, env: Any, hp: Hyperparams) -> OffPolicyAlgorithm:
    """A stock Tianshou ``algo`` (DQN, DDPG, TD3, SAC or Rainbow) for ``env``'s spaces.

    Raises:
        ValueError: the action space does not suit ``algo`` (DQN and Rainbow need a discrete one,
            the others a continuous one).
    """
    from gymnasium import spaces
    from tianshou.algorithm import DDPG, DQN
    from tianshou.algorithm.modelfree.ddpg import ContinuousDeterministicPolicy
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.modelfree.sac import SAC, SACPolicy
    from tianshou.algorithm.modelfree.td3 import TD3
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.exploration import GaussianNoise
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.continuous import (
        ContinuousActorDeterministic,
        ContinuousActorProbabilistic,
        ContinuousCritic,
    )

    obs_shape = env.observation_space.shape
    optim = AdamOptimizerFactory(lr=hp.lr)
    if algo in ("dqn", "rainbow") and not isinstance(env.action_space, spaces.Discrete):
        raise ValueError(f"{algo} needs a discrete action space, got {env.action_space}")
    if algo == "rainbow":
        return _rainbow(env, hp)
    if algo == "dqn":
        model = Net(state_shape=obs_shape, action_shape=int(env.action_space.n), hidden_sizes=list(hp.hidden_sizes))
        policy = DiscreteQLearningPolicy(
            model=model, action_space=env.action_space, eps_training=1.0, eps_inference=0.0
        )
        return DQN(policy=policy, optim=optim, gamma=hp.gamma, target_update_freq=hp.extra["target_update_freq"],
                   is_double=False)  # fmt: skip
    if not isinstance(env.action_space, spaces.Box):
        raise ValueError(f"{algo} needs a continuous (Box) action space, got {env.action_space}")
    act_shape = env.action_space.shape

    def critic() -> ContinuousCritic:
        net = Net(state_shape=obs_shape, action_shape=act_shape, hidden_sizes=list(hp.hidden_sizes), concat=True)
        return ContinuousCritic(preprocess_net=net)

    actor_net = Net(state_shape=obs_shape, hidden_sizes=list(hp.hidden_sizes))
    if algo == "sac":
        sac_actor = ContinuousActorProbabilistic(preprocess_net=actor_net, action_shape=act_shape, unbounded=True,
                                                 conditioned_sigma=True)  # fmt: skip
        return SAC(policy=SACPolicy(actor=sac_actor, action_space=env.action_space), policy_optim=optim,
                   critic=critic(), critic_optim=optim, critic2=critic(), gamma=hp.gamma, alpha=hp.extra["alpha"])  # fmt: skip
    actor = ContinuousActorDeterministic(preprocess_net=actor_net, action_shape=act_shape)
    deterministic = ContinuousDeterministicPolicy(actor=actor, exploration_noise=GaussianNoise(sigma=hp.extra["noise"]),
                                                  action_space=env.action_space)  # fmt: skip
    if algo == "td3":
        return TD3(policy=deterministic, policy_optim=optim, critic=critic(), critic_optim=optim, critic2=critic(),
                   gamma=hp.gamma)  # fmt: skip
    return DDPG(policy=deterministic, policy_optim=optim, critic=critic(), critic_optim=optim, gamma=hp.gamma)


def _rainbow(env: Any, hp: Hyperparams) -> OffPolicyAlgorithm:
    """Tianshou's ``RainbowDQN``: C51 over a dueling net whose value and advantage heads are noisy layers."""
    from tianshou.algorithm import RainbowDQN
    from tianshou.algorithm.modelfree.c51 import C51Policy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.utils.net.common import Net
    from tianshou.utils.net.discrete import NoisyLinear

    x = hp.extra

    def noisy_linear(inputs: int, outputs: int) -> NoisyLinear:
        return NoisyLinear(inputs, outputs, x["noisy_std"])

    net = Net(
        state_shape=env.observation_space.shape, action_shape=int(env.action_space.n),
        hidden_sizes=list(hp.hidden_sizes), softmax=True, num_atoms=x["num_atoms"],
        dueling_param=({"linear_layer": noisy_linear}, {"linear_layer": noisy_linear}),
    )  # fmt: skip
    policy = C51Policy(model=net, action_space=env.action_space, num_atoms=x["num_atoms"], v_min=x["v_min"],
                       v_max=x["v_max"], eps_training=x["eps_start"], eps_inference=0.0)  # fmt: skip
    return RainbowDQN(policy=policy, optim=AdamOptimizerFactory(lr=hp.lr), gamma=hp.gamma,
                      n_step_return_horizon=x["n_step"], target_update_freq=x["target_update_freq"])  # fmt: skip


# -- the workload -------------------------------------------------------------------------


def make_workload(
    algo: str,
    env: str,
    batch_size: int,
    buffer_size: int,
    n_envs: int = 1,
    hyperparams: Hyperparams | None = None,
    algorithm_factory: Callable[[], OffPolicyAlgorithm] | None = None,
) -> TianshouWorkload:
    """The Tianshou workload of ``algo`` on gymnasium env ``env`` with ``B = batch_size``, ``N = buffer_size``.

    Args:
        algo: ``"dqn"``, ``"ddpg"``, ``"td3"`` or ``"sac"``.
        env: a gymnasium environment id (``"CartPole-v1"``).
        batch_size: transitions per gradient step.
        buffer_size: transitions the buffer holds (over all envs' sub-buffers, at least ``n_envs``).
        n_envs: environments stepped together by a ``DummyVectorEnv``.
        hyperparams: the training schedule (``collect_per_env``, ``updates_per_step``,
            DQN's final epsilon) and the standard algorithm's network and optimiser;
            default :data:`STANDARD_HYPERPARAMS[algo] <STANDARD_HYPERPARAMS>`.
            ``batch_size`` and ``buffer_size`` override its own.
        algorithm_factory: called with no arguments, returns a fresh, unwrapped Tianshou
            off-policy algorithm (e.g. ``lambda: copy.deepcopy(my_dqn)``) to profile instead
            of the standard one; each timing and run builds its own.

    Raises:
        ValueError: an unknown ``algo`` or ``env``, a size out of range, a schedule with
            no gradient step per training step, or an ``env`` whose action space does not suit ``algo``.
        TypeError: an argument of the wrong type, or a factory that does not return an
            unwrapped ``algo`` (an instance of its Tianshou class) the PER wrapper supports.
    """
    if algo not in ALGOS:
        raise ValueError(f"algo must be one of {ALGOS}, got {algo!r}")
    if not isinstance(env, str):
        raise TypeError(f"env must be a gymnasium environment id (a str), got {type(env).__name__}")
    for name, value in (("batch_size", batch_size), ("buffer_size", buffer_size), ("n_envs", n_envs)):
        check_int(value, name, low=1)
    if buffer_size < n_envs:
        raise ValueError(f"buffer_size must be >= n_envs={n_envs} (one sub-buffer per env), got {buffer_size}")
    if hyperparams is not None and not isinstance(hyperparams, Hyperparams):
        raise TypeError(f"hyperparams must be a Hyperparams, got {type(hyperparams).__name__}")
    if algorithm_factory is not None and not callable(algorithm_factory):
        raise TypeError(f"algorithm_factory must be a callable returning an algorithm, got {algorithm_factory!r}")
    hp = dataclasses.replace(hyperparams or STANDARD_HYPERPARAMS[algo], batch_size=batch_size, buffer_size=buffer_size)
    check_int(hp.collect_per_env, "hyperparams.collect_per_env", low=1)
    gradient_steps = round(hp.updates_per_step * hp.collect_per_env * n_envs)
    if gradient_steps < 1:
        raise ValueError(
            f"hyperparams give {hp.updates_per_step} * {hp.collect_per_env} * {n_envs} envs = "
            f"{hp.updates_per_step * hp.collect_per_env * n_envs} gradient steps per training step; "
            "Tianshou's trainer needs at least one (raise updates_per_step or collect_per_env)"
        )
    try:
        probe_env = gym.make(env)
    except gym.error.Error as e:
        raise ValueError(f"unknown environment {env!r}: {e}") from e
    # Built once here so a bad factory or a mismatched action space fails now, naming the argument.
    with _global_state():
        if algorithm_factory is None:
            algorithm = standard_algorithm(algo, probe_env, hp)
        else:
            algorithm = _checked_algorithm(algorithm_factory(), "algorithm_factory()")
            expected = _algorithm_class(algo)
            if not isinstance(algorithm, expected):
                raise TypeError(
                    f"algorithm_factory() returned a {type(algorithm).__name__}, but algo={algo!r} "
                    f"needs a {expected.__name__} (or a subclass)"
                )
    probe_env.close()
    if algorithm_factory is None:
        network = f"Net {list(hp.hidden_sizes)}"
    else:
        params = sum(p.numel() for p in algorithm.parameters())
        network = f"{type(algorithm).__name__}, {params:,} parameters"
    spec = WorkloadSpec(
        lib="tianshou",
        algo=algo,
        env=env,
        batch_size=batch_size,
        buffer_size=buffer_size,
        n_envs=n_envs,
        collect_steps=hp.collect_per_env,
        gradient_steps=gradient_steps,
        network=network,
    )
    return TianshouWorkload(spec, hp, algorithm_factory)


class TianshouWorkload:
    """A Tianshou training setup, timed step by step and trained end to end for the advisor.

    Build it with :func:`make_workload`. Attributes: ``spec`` (the
    :class:`~hetero_replay.advisor.workload.WorkloadSpec`) and ``hyperparams``.
    """

    def __init__(
        self,
        spec: WorkloadSpec,
        hyperparams: Hyperparams,
        algorithm_factory: Callable[[], OffPolicyAlgorithm] | None = None,
    ) -> None:
        self.spec = spec
        self.hyperparams = hyperparams
        self._factory = algorithm_factory
        self._source: _Source | None = None

    def __repr__(self) -> str:
        return f"TianshouWorkload({self.spec.title()})"

    # -- the Workload protocol --------------------------------------------------------------

    def time_host(self, learner: str, reference: ReplayConfig, timer: Timer) -> dict[str, Timing]:
        """Time Tianshou's own steps on ``learner`` with the ``reference`` replay configuration.

        Returns ``{"env_step", "inference", "collect", "learn", "phase", "phase_inline"}``
        (see the module docstring for what each covers); ``collect`` is per
        vector step (``n_envs`` env steps), ``phase`` per training step
        (``collect_steps`` vector steps, then ``gradient_steps`` gradient
        steps, as the trainer's loop runs them), ``learn`` per gradient step, and
        ``phase_inline`` a training step with the wrapper's ``staleness=1``.

        Raises:
            ValueError: ``reference`` trains on another device than ``learner``, or
                its storage is not ``"host"`` (Tianshou keeps transitions in NumPy).
            hetero_replay.placement.DeviceUnavailableError: this machine lacks a device it names.
        """
        if reference.learner != learner:
            raise ValueError(f"reference trains on {reference.learner!r}, not on learner={learner!r}")
        placement = reference.placement().checked()
        sync = _sync_for(placement)
        with _global_state(reference.threads), contextlib.ExitStack() as closing:
            strict = closing.enter_context(self._setup(placement, staleness=0))
            times = {
                "env_step": self._time_env_step(timer),
                "inference": _time_inference(strict, self._source_data(), timer, sync),
            }
            relaxed = closing.enter_context(self._setup(placement, staleness=1))
            measured = self._time_training({"strict": strict, "relaxed": relaxed}, timer, sync)
        times.update({step: measured["strict"][step] for step in ("collect", "learn", "phase")})
        times["phase_inline"] = measured["relaxed"]["phase"]
        return times

    def time_replay(self, config: ReplayConfig, timer: Timer) -> dict[str, Timing | None]:
        """Time the replay primitives of ``config`` in training, in a buffer of ``N`` rows filled to capacity.

        Returns ``{"insert", "sample", "update", "phase_relaxed"}``: the buffer's
        ``add`` of one vector step's ``n_envs`` transitions (the collector's
        call), ``sample(B)`` and ``update_weight(indices, td)`` (the algorithm's
        calls, with the TD errors it leaves: a float tensor on the learner
        device), each timed where Tianshou calls it in the trainer's loop, and
        ``None`` for ``phase_relaxed`` (no worker thread in the Tianshou adapter).

        Raises:
            ValueError: the storage is not ``"host"``, or the tree backend refuses the configuration.
            hetero_replay.placement.DeviceUnavailableError: this machine lacks a device it names.
        """
        placement = config.placement().checked()
        sync = _sync_for(placement)
        with _global_state(config.threads), self._setup(placement, staleness=0) as setup:
            measured = self._time_training({"strict": setup}, timer, sync)["strict"]
        times: dict[str, Timing | None] = {primitive: measured[primitive] for primitive in _PRIMITIVES}
        times["phase_relaxed"] = None
        return times

    def run(self, candidate: Candidate, env_steps: int) -> float:
        """Train with ``candidate`` through Tianshou's ``OffPolicyTrainer``; env steps per second.

        A buffer filled to capacity, DQN's epsilon at its final value, an untimed
        warm-up epoch (a quarter of the timed steps, at least two training
        steps), then one timed epoch of ``env_steps`` env steps rounded to whole
        training steps (``collect_steps * n_envs`` env steps each). No test
        collector, no evaluation.

        Raises:
            TypeError, ValueError: ``env_steps`` is not a positive integer.
            hetero_replay.placement.DeviceUnavailableError: this machine lacks a device the candidate names.
        """
        check_int(env_steps, "env_steps", low=1)
        placement = candidate.placement.checked()
        per_step = self.spec.collect_steps * self.spec.n_envs
        timed = max(1, round(env_steps / per_step)) * per_step
        warmup = max(2, math.ceil(timed / per_step / 4)) * per_step
        with _global_state(candidate.threads), self._setup(placement, candidate.staleness) as setup:
            trainer, collector = setup.trainer, setup.collector
            trainer.params.epoch_num_steps = warmup
            trainer.reset()  # resets the envs and the collector's counts, not the buffer
            trainer.execute_epoch()
            trainer.params.epoch_num_steps = timed
            done_before = collector.collect_step
            start = time.perf_counter()
            trainer.execute_epoch()
            _sync_for(placement)()
            seconds = time.perf_counter() - start
            return (collector.collect_step - done_before) / seconds

    # -- building ---------------------------------------------------------------------------

    def _algorithm(self) -> OffPolicyAlgorithm:
        """A fresh, unwrapped algorithm: the factory's or the standard one."""
        if self._factory is not None:
            return _checked_algorithm(self._factory(), "algorithm_factory()")
        return standard_algorithm(self.spec.algo, gym.make(self.spec.env), self.hyperparams)

    def _envs(self) -> DummyVectorEnv:
        envs = DummyVectorEnv([lambda: gym.make(self.spec.env) for _ in range(self.spec.n_envs)])
        envs.seed(SEED)
        return envs

    def _source_data(self) -> _Source:
        """Real transitions to fill buffers with, collected once (random actions, a real ``Collector``)."""
        if self._source is None:
            with _global_state():
                self._source = _Source.collect(self._algorithm(), self._envs(), SOURCE_ROWS)
        return self._source

    def _filled_buffer(self, placement: Placement) -> HeteroPrioritizedVectorReplayBuffer:
        buffer = HeteroPrioritizedVectorReplayBuffer(
            self.spec.buffer_size, self.spec.n_envs, alpha=ALPHA, beta=BETA_START, random_seed=SEED, placement=placement
        )
        self._source_data().fill(buffer, np.random.default_rng(SEED))
        return buffer

    def _setup(self, placement: Placement, staleness: int) -> _Setup:
        """Wrapper, full buffer, collector and trainer in steady state."""
        algorithm = PEROffPolicyWrapper(
            wrapped_algorithm=self._algorithm(),
            beta=LinearBetaSchedule(BETA_START, BETA_END, 100_000),
            placement=placement,
            staleness=staleness,
        )
        eps_final = self.hyperparams.extra.get("eps_final", 0.05)
        if hasattr(algorithm.policy, "set_eps_training"):  # DQN: exploration at its final rate
            algorithm.policy.set_eps_training(eps_final)
        buffer = self._filled_buffer(placement)
        collector = Collector[CollectStats](algorithm, self._envs(), buffer, exploration_noise=True)
        collector.reset(reset_buffer=False)
        per_step = self.spec.collect_steps * self.spec.n_envs
        trainer = algorithm.create_trainer(
            OffPolicyTrainerParams(
                training_collector=collector,
                test_collector=None,
                max_epochs=1,  # epochs are driven one by one with execute_epoch
                epoch_num_steps=per_step,
                collection_step_num_env_steps=per_step,
                update_step_num_gradient_steps_per_sample=self.hyperparams.updates_per_step,
                batch_size=self.spec.batch_size,
                verbose=False,
                show_progress=False,
            )
        )
        return _Setup(algorithm, buffer, collector, trainer)

    # -- timing -----------------------------------------------------------------------------

    def _time_env_step(self, timer: Timer) -> Timing:
        envs = self._envs()
        envs.reset()
        space = gym.make(self.spec.env).action_space
        space.seed(SEED)
        actions = [np.stack([space.sample() for _ in range(self.spec.n_envs)]) for _ in range(64)]
        steps = itertools.count()

        def step() -> None:
            _, _, terminated, truncated, _ = envs.step(actions[next(steps) % len(actions)])
            done = np.logical_or(terminated, truncated)
            if done.any():  # the collector resets finished envs within its step
                envs.reset(np.flatnonzero(done))

        timing = timer(step, min_repetition_s=HOST_REPETITION_S)
        envs.close()
        return timing

    def _time_training(
        self, setups: dict[str, _Setup], timer: Timer, sync: Callable[[], Any]
    ) -> dict[str, dict[str, Timing]]:
        """Per setup: ``phase``, ``collect``, ``learn`` and the replay primitives, timed in the trainer's loop.

        One timed call runs, for each setup in turn, one epoch of
        :data:`STEPS_PER_CALL` training steps, so setups timed together share
        the same stretch of the machine's time. ``learn`` is the trainer's
        ``_sample_and_update``; ``collect`` is a training step less its
        gradient steps, per vector step.
        """
        f = self.spec.collect_steps
        clock = Clock(sync)
        for name, setup in setups.items():
            setup.trainer.params.epoch_num_steps = STEPS_PER_CALL * f * self.spec.n_envs
            setup.trainer.reset()  # resets the envs and the collector's counts, not the buffer
            clock.watch(setup.trainer, "execute_epoch", f"{name}/epoch")
            # The trainer's whole gradient step: algorithm.update(sample_size=B, buffer=buffer),
            # then the moving averages and logging of the step's statistics.
            clock.watch(setup.trainer, "_sample_and_update", f"{name}/learn")
            clock.watch_rest(setup.trainer, "execute_epoch", f"{name}/rest", f"{name}/learn")
            for primitive, method in _PRIMITIVES.items():
                clock.watch(setup.buffer, method, f"{name}/{primitive}")
            # With staleness the wrapper applies its deferred updates through update_weight_since instead.
            clock.watch(setup.buffer, "update_weight_since", f"{name}/update")

        def training_steps() -> None:
            for setup in setups.values():
                setup.trainer.execute_epoch()

        _, parts = timer.in_loop(training_steps, clock, sync=sync)
        results = {}
        for name in setups:
            measured = {primitive: parts[f"{name}/{primitive}"] for primitive in _PRIMITIVES}
            epoch, learn, rest = parts[f"{name}/epoch"], parts[f"{name}/learn"], parts[f"{name}/rest"]
            measured["learn"] = learn
            measured["phase"] = epoch.per(STEPS_PER_CALL)
            measured["collect"] = rest.per(STEPS_PER_CALL * f)  # per vector step: the step less its gradient steps
            results[name] = measured
        return results


@dataclasses.dataclass
class _Setup:
    """One training setup built from scratch.

    A context manager: leaving it closes the envs.
    """

    algorithm: PEROffPolicyWrapper
    buffer: HeteroPrioritizedVectorReplayBuffer
    collector: Collector
    trainer: OffPolicyTrainer

    def __enter__(self) -> _Setup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.collector.close()


@dataclasses.dataclass
class _Source:
    """Real transitions of each env, as a ``Collector`` stores them, each env's rows ending an episode.

    Attributes:
        rows: every transition, a Tianshou ``Batch`` with the buffer's keys.
        per_env: per env, the indices into ``rows`` of its transitions in order.
    """

    rows: RolloutBatchProtocol
    per_env: list[np.ndarray]

    @classmethod
    def collect(cls, algorithm: OffPolicyAlgorithm, envs: DummyVectorEnv, rows_per_env: int) -> _Source:
        """``rows_per_env`` random-action steps of each env, cut after its last episode end.

        An env that ends no episode in that many steps gets its last transition
        marked truncated, as a time limit would, so every env's rows end an episode.
        """
        n = envs.env_num
        store = VectorReplayBuffer(n * rows_per_env, n)
        collector = Collector[CollectStats](algorithm, envs, store)
        collector.reset()
        collector.collect(n_step=n * rows_per_env, random=True)
        envs.close()
        rows = store._meta  # the storage as the collector wrote it, in env order
        per_env = []
        for env in range(n):
            index = env * rows_per_env + np.arange(rows_per_env)
            ends = np.flatnonzero(rows.done[index])
            if ends.size:
                index = index[: ends[-1] + 1]
            else:
                rows.truncated[index[-1]] = rows.done[index[-1]] = True
            per_env.append(index)
        return cls(rows, per_env)

    def vector_step(self, t: int) -> RolloutBatchProtocol:
        """Step ``t`` of every env: one transition per env, as the collector adds them."""
        return self.rows[np.array([index[t % len(index)] for index in self.per_env])]

    def fill(self, buffer: HeteroPrioritizedVectorReplayBuffer, rng: np.random.Generator) -> None:
        """Fill every slot of ``buffer`` with these transitions and give them random priorities.

        Sub-buffer ``k`` gets env ``k``'s rows tiled so that its last slot ends an
        episode; its bookkeeping is set as after a long run: full, the oldest
        slot (0) written next, no episode running. Priorities come from
        ``|N(0, 1)|`` TD errors, ``(|td| + eps) ** alpha`` as the trees compute
        it, loaded in one call (:meth:`hetero_replay.Priorities.load`).
        """
        n = buffer.buffer_num
        size = buffer.maxsize // n
        if len(self.per_env) != n:
            raise ValueError(f"transitions of {len(self.per_env)} envs for a buffer of {n} sub-buffers")
        with buffer.lock:
            if not buffer._meta.get_keys():  # storage is allocated by the first add, in the collector's layout
                buffer.add(self.vector_step(0), buffer_ids=np.arange(n))
            slots = np.arange(size) - size  # slot size - 1 takes each env's last row, an episode's end
            gather = np.concatenate([index[slots % len(index)] for index in self.per_env])
            buffer.set_batch(self.rows[gather])
            book: EpisodeBook = buffer._book
            book.counters[:, EpisodeBook.INSERTION] = 0
            book.counters[:, EpisodeBook.STORED] = size
            book.counters[:, EpisodeBook.LAST] = size - 1
            book.counters[:, EpisodeBook.EP_LEN] = 0
            book.counters[:, EpisodeBook.EP_START] = 0
            book.ep_return[:] = 0.0
            buffer._lengths[:] = size
            buffer.last_index[:] = buffer._offset + size - 1
            # One bulk update through the engine: chunked updates cost a device tree seconds at N = 10^6.
            td = np.abs(rng.standard_normal(buffer.maxsize))
            buffer.priorities.update(np.arange(buffer.maxsize), td)


def _time_inference(setup: _Setup, source: _Source, timer: Timer, sync: Callable[[], Any]) -> Timing:
    """One forward of the policy on ``n_envs`` observations, as the collector computes actions."""
    policy = setup.algorithm.policy
    first = source.vector_step(0)
    obs = Batch(obs=first.obs, info=first.info)

    def act() -> None:
        # Collector._compute_action_policy_hidden: forward, to NumPy, exploration, action mapping.
        action = to_numpy(policy(obs).act)
        policy.map_action(policy.add_exploration_noise(action, obs))

    # As in a collect phase: inside a training step, the modules in evaluation mode.
    with policy_within_training_step(policy), torch_train_mode(policy, enabled=False):
        return timer(act, sync=sync, min_repetition_s=HOST_REPETITION_S)


# -- helpers ------------------------------------------------------------------------------


def _checked_algorithm(algorithm: Any, what: str) -> OffPolicyAlgorithm:
    """``algorithm`` if it is an unwrapped off-policy algorithm the PER wrapper supports; ``TypeError`` otherwise."""
    if isinstance(algorithm, PEROffPolicyWrapper):
        raise TypeError(f"{what} must return an unwrapped algorithm (the workload wraps it), got a PEROffPolicyWrapper")
    if not isinstance(algorithm, OffPolicyAlgorithm):
        raise TypeError(f"{what} must return a Tianshou OffPolicyAlgorithm, got {type(algorithm).__name__}")
    check_supported(algorithm)
    return algorithm


def _algorithm_class(algo: str) -> type:
    """Tianshou's class of ``algo``."""
    from tianshou.algorithm import DDPG, DQN, SAC, TD3

    return {"dqn": DQN, "ddpg": DDPG, "td3": TD3, "sac": SAC}[algo]


def _sync_for(placement: Placement) -> Callable[[], Any]:
    """Waits for a GPU's queued work where the placement puts the learner or the tree on one (else does nothing)."""
    if any(str(device).startswith("cuda") for device in (placement.train, placement.sample)):
        return torch.cuda.synchronize
    return _nothing


def _nothing() -> None:
    return None


@contextlib.contextmanager
def _global_state(threads: int | None = None) -> Iterator[None]:
    """Run seeded with ``threads`` tree threads; restore the generators and thread counts found."""
    np_state = np.random.get_state()  # Tianshou's exploration draws from np.random
    torch_state = torch.get_rng_state()
    cuda_states = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    torch_threads, replay_threads = torch.get_num_threads(), hetero_replay.num_threads()
    try:
        if threads is not None:
            hetero_replay.set_num_threads(threads)
        np.random.seed(SEED)
        torch.manual_seed(SEED)
        yield
    finally:
        np.random.set_state(np_state)
        torch.set_rng_state(torch_state)
        if cuda_states is not None:
            torch.cuda.set_rng_state_all(cuda_states)
        if torch.get_num_threads() != torch_threads:
            torch.set_num_threads(torch_threads)
        hetero_replay.set_num_threads(replay_threads)


__all__ = [
    "ALPHA",
    "BETA_END",
    "BETA_START",
    "STANDARD_HYPERPARAMS",
    "Hyperparams",
    "TianshouWorkload",
    "make_workload",
    "standard_algorithm",
]
