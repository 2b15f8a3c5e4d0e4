"""The placement advisor's workload for Stable-Baselines3: time SB3's own steps, train end to end.

The advisor (:mod:`hetero_replay.advisor`) never imports SB3; it asks a
:class:`SB3Workload` to

* time SB3's steps on a learner device (:meth:`SB3Workload.time_host`): one
  vectorised env step and one policy forward alone, then, inside
  ``learn()``'s own loop, a collect step, a gradient step of the PER
  algorithm's ``train()`` and a whole phase, strict and relaxed on the
  learner's thread;
* time the replay primitives of a replay configuration
  (:meth:`SB3Workload.time_replay`) where that loop calls them: the adapter
  buffer's ``add``, ``sample`` and ``update_priorities``; and a phase with the
  pipeline's worker thread;
* train for real with a candidate placement (:meth:`SB3Workload.run`), to check
  the advisor's predictions.

Everything timed is the real code path (``PERDQN``, ``PERDDPG``, ``PERTD3``,
``PERSAC``, their :class:`~hetero_replay.adapters.sb3.PrioritizedReplayBuffer`,
SB3's ``DummyVecEnv``), on a fresh model and fresh environments built for the
measurement: the user's own environment is never stepped.

Steady state: every buffer is filled to its capacity ``N`` before anything is
timed (real transitions collected with random actions, tiled; random
priorities), DQN explores at its final rate, and the first ``learning_starts``
steps are behind: what is timed is what a long run spends per step.

Example:
    >>> from hetero_replay.advisor.profile import measure
    >>> from hetero_replay.advisor.workload import ReplayConfig
    >>> workload = make_workload("dqn", "CartPole-v1", batch_size=256, buffer_size=100_000)
    >>> workload.spec.network
    'MlpPolicy [64, 64]'
    >>> times = workload.time_replay(ReplayConfig("native", 1, "host"), measure)  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import DDPG, DQN, SAC, TD3
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import Logger
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.type_aliases import TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.utils import ConstantSchedule
from stable_baselines3.common.vec_env import VecEnv

import hetero_replay
from hetero_replay import DeviceTree, Placement, PrioritizedReplay, RelaxedReplay
from hetero_replay.adapters.sb3.buffers import PrioritizedReplayBuffer
from hetero_replay.adapters.sb3.common import PERMixin
from hetero_replay.adapters.sb3.dqn import PERDQN
from hetero_replay.adapters.sb3.sac import PERSAC
from hetero_replay.adapters.sb3.td3 import PERDDPG, PERTD3
from hetero_replay.extend import AUTO_WINDOW, Candidate, Clock, ReplayConfig, Timer, Timing, WorkloadSpec, check_int
from hetero_replay.extend import HOST_REPETITION_S as LONG

#: The advisor's algorithm names -> the PER algorithms that train them.
ALGORITHMS: dict[str, type[PERMixin]] = {"dqn": PERDQN, "ddpg": PERDDPG, "td3": PERTD3, "sac": PERSAC}
#: SB3's base classes -> the advisor's names (DDPG first: SB3's DDPG is a TD3).
_FAMILIES: tuple[tuple[type[OffPolicyAlgorithm], str], ...] = ((DQN, "dqn"), (DDPG, "ddpg"), (TD3, "td3"), (SAC, "sac"))
#: Arguments the workload sets itself, per measurement; ``make_workload`` refuses them in ``algo_kwargs``.
RESERVED = (
    "policy",
    "env",
    "seed",
    "device",
    "verbose",
    "tensorboard_log",
    "placement",
    "staleness",
    "_init_setup_model",
)
#: Seed of every model and environment the workload builds, so runs are comparable.
SEED = 0
#: Real transitions collected (random actions) to fill buffers with, tiled to ``N``.
TRANSITIONS = 1024
#: Rows written to the engine per call while filling (and priorities per update call).
FILL_CHUNK = 1 << 16
#: Gradient steps of ``run``'s untimed warm-up: ``worker="auto"`` decides after 32 learner steps.
WARMUP_GRADIENT_STEPS = 64
#: Distinct pre-drawn inputs cycled through by a timed primitive (actions, rows, sampled indices).
VARIANTS = 64
#: ``total_timesteps`` of the timed collect steps: progress stays at its start (schedules do not move).
HORIZON = 10**9


@dataclass(frozen=True)
class _Step:
    """One collect step of ``n_envs`` transitions, as SB3 hands them to the buffer's ``add``."""

    obs: np.ndarray
    next_obs: np.ndarray
    action: np.ndarray  # what SB3 stores: the action rescaled to [-1, 1] for a Box space
    reward: np.ndarray
    done: np.ndarray
    infos: list[dict[str, Any]]


class SB3Workload:
    """One Stable-Baselines3 training setup, as the advisor times and validates it.

    Build it with :func:`make_workload` (an algorithm name and an env id) or
    the class and arguments a PER algorithm was constructed with. Every method
    builds what it times from scratch and leaves the random generators
    (``random``, NumPy's and torch's global ones), torch's thread count, the
    replay thread count (:func:`hetero_replay.set_num_threads`) and cuDNN's flags
    as it found them.

    Args:
        algorithm_class: a PER algorithm (``PERDQN``, ``PERDDPG``, ``PERTD3``,
            ``PERSAC`` or a subclass of one).
        policy: the policy, as the algorithm takes it (``"MlpPolicy"`` or a class).
        env: a gymnasium environment id; fresh copies are made with SB3's
            ``make_vec_env`` (``DummyVecEnv``).
        n_envs: environments stepped together.
        algo_kwargs: the algorithm's other arguments (``batch_size``,
            ``buffer_size``, ``train_freq``, ``policy_kwargs``, ...); SB3's
            defaults for the rest. Not the ones in :data:`RESERVED`.

    Attributes:
        spec: the :class:`~hetero_replay.advisor.workload.WorkloadSpec`, read
            from a model built once here.

    Raises:
        TypeError: ``algorithm_class`` is not a PER algorithm; an argument of
            the wrong type (naming it).
        ValueError: an unknown env id, an action space the algorithm does not
            take, ``train_freq`` in episodes, ``gradient_steps=0``, a reserved
            argument in ``algo_kwargs``.
        ImportError: the environment needs a package that is not installed.
    """

    spec: WorkloadSpec

    def __init__(
        self,
        algorithm_class: type[PERMixin],
        policy: str | type,
        env: str,
        n_envs: int = 1,
        algo_kwargs: dict[str, Any] | None = None,
    ) -> None:
        algo = _algo_name(algorithm_class)
        if not isinstance(env, str) or not env:
            raise TypeError(f"env must be a gymnasium environment id (a non-empty str), got {type(env).__name__}")
        check_int(n_envs, "n_envs", low=1)
        kwargs = dict(algo_kwargs or {})
        reserved = [name for name in RESERVED if name in kwargs]
        if reserved:
            raise ValueError(
                f"algo_kwargs may not set {reserved}: the workload sets them for each measurement "
                "(the replay configuration's placement sets the device)"
            )
        for name in ("batch_size", "buffer_size"):
            if name in kwargs:
                check_int(kwargs[name], name, low=1)
        if kwargs.get("buffer_size", n_envs) < n_envs:
            raise ValueError(
                f"buffer_size must hold one row of n_envs={n_envs} transitions, got {kwargs['buffer_size']}"
            )
        self._algorithm = algorithm_class
        self._policy = policy
        self._env_id = env
        self._n_envs = int(n_envs)
        self._kwargs = kwargs
        _check_action_space(algo, env)
        self._transitions: list[_Step] | None = None
        with _preserved_state(None):
            model = self.build(Placement())  # the CPU placement: present everywhere
            try:
                self.spec = self._spec_of(model, algo)
            finally:
                _close(model)

    # -- construction ---------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"SB3Workload({self.spec.title()}, {self.spec.network})"

    # -- the advisor's protocol --------------------------------------------------------------

    def time_host(self, learner: str, reference: ReplayConfig, timer: Timer) -> dict[str, Timing]:
        """Time SB3's own steps with the learner on ``learner`` and the ``reference`` replay.

        Returns:
            ``"env_step"``: one ``VecEnv.step`` of pre-drawn random actions and
            ``"inference"``: ``policy.predict`` for ``n_envs`` observations (the
            call a collect step makes, ``deterministic=False``), each alone; then,
            inside ``learn()``'s own loop (``collect_rollouts`` of ``train_freq``
            steps, then ``train(gradient_steps)``, into the full buffer):
            ``"collect"`` one collect step, ``"learn"`` one gradient step (a
            ``train()`` call's share, its bookkeeping included once, as in a
            run), ``"phase"`` one whole phase, and ``"phase_inline"`` a phase with
            staleness 1 on the learner's thread (``worker="inline"``), of a
            second model whose phases alternate with the first one's.

        Raises:
            ValueError: ``reference`` trains on another device than ``learner``.
            hetero_replay.placement.DeviceUnavailableError: a device of ``reference`` is missing here.
        """
        if reference.learner != learner:
            raise ValueError(
                f"reference must train on the learner device {learner!r}, got one on {reference.learner!r}"
            )
        sync = _sync_for(reference)
        times: dict[str, Timing] = {}
        with _preserved_state(reference.threads):
            times["env_step"] = self._time_env_step(timer)
            strict = self.build(reference.placement(check=True))
            relaxed = self.build(reference.placement(check=True))
            try:
                strict_phase = self._training_loop(strict)
                relaxed_phase = self._training_loop(relaxed)
                _relax(relaxed.replay_buffer, worker="inline")
                obs = np.array(strict._last_obs, copy=True)
                times["inference"] = timer(lambda: strict.policy.predict(obs, deterministic=False), sync=sync)
                clock = Clock(sync)
                for name, model in (("strict", strict), ("inline", relaxed)):
                    clock.watch(model, "collect_rollouts", f"{name}/collect")
                    clock.watch(model, "train", f"{name}/learn")

                def both() -> None:  # in turn, so a change of the machine's load hits both alike
                    strict_phase()
                    relaxed_phase()

                _, parts = timer.in_loop(both, clock, sync=sync)
            finally:
                _close(strict)
                _close(relaxed)
        f, g = self.spec.collect_steps, self.spec.gradient_steps
        times["collect"] = parts["strict/collect"].per(f)
        times["learn"] = parts["strict/learn"].per(g)
        times["phase"] = _sum(parts["strict/collect"], parts["strict/learn"])
        times["phase_inline"] = _sum(parts["inline/collect"], parts["inline/learn"])
        return times

    def time_replay(self, config: ReplayConfig, timer: Timer) -> dict[str, Timing | str | None]:
        """Time the replay primitives of ``config`` inside ``learn()``'s loop, in a buffer filled to ``N`` rows.

        Returns:
            Per call, timed where SB3 makes it: ``"insert"`` the buffer's ``add``
            of one collect step (``n_envs`` rows, staged), ``"sample"``
            ``sample(B)``, a batch on the learner device (the first of a phase
            also hands the phase's staged rows to the engine, as SB3's buffer
            does), ``"update"`` ``update_priorities`` of the TD errors; and
            ``"phase_relaxed"``, one whole phase with staleness 1, prefetch 1
            and ``worker="auto"`` once it has decided, and ``"worker"``, what it
            decided (``"thread"`` or ``"inline"``); ``"engine_work"``, the core engine's own
            sample and update of a gradient step (what the relaxed pipeline's
            ``worker="auto"`` weighs against the interval between samples).

        Raises:
            hetero_replay.placement.DeviceUnavailableError: a device of ``config`` is missing here.
            ValueError, TypeError: the buffer refuses the configuration.
        """
        sync = _sync_for(config)
        with _preserved_state(config.threads):
            model = self.build(config.placement(check=True))
            try:
                one_phase = self._training_loop(model)
                clock = Clock(sync)
                buffer = model.replay_buffer
                for method, part in (("add", "insert"), ("sample", "sample"), ("update_priorities", "update")):
                    clock.watch(buffer, method, part)
                for method in ("sample", "update_priorities"):  # the engine's own share: what worker="auto" weighs
                    clock.watch(buffer.replay, method, f"engine {method}")
                _, parts = timer.in_loop(one_phase, clock, sync=sync)
                times: dict[str, Timing | str | None] = {part: parts[part] for part in ("insert", "sample", "update")}
                times["engine_work"] = _sum(parts["engine sample"], parts["engine update_priorities"])
                times["worker"] = _settle_auto(model, one_phase)
                times["phase_relaxed"] = timer(one_phase, sync=sync, min_repetition_s=LONG)
            finally:
                _close(model)
        return times

    def run(self, candidate: Candidate, env_steps: int) -> float:
        """Train with ``candidate`` in the real adapter; env steps per second over ``env_steps`` timed steps.

        The model is ``PER<algo>(..., placement=candidate.placement.checked(),
        staleness=candidate.staleness)`` with the candidate's replay threads.
        Before the clock starts: the buffer is filled to its capacity, DQN
        explores at its final rate, ``learning_starts`` is behind (the full
        buffer stands for it), and an untimed ``learn`` makes at least
        :data:`WARMUP_GRADIENT_STEPS` gradient steps (the relaxed buffer's
        ``worker="auto"`` decides within them). Then ``learn(env_steps,
        reset_num_timesteps=False)`` is timed.

        Returns:
            Env steps taken per second of wall-clock time (SB3 may take up to
            one collect phase more than ``env_steps``; those count).

        Raises:
            TypeError, ValueError: ``env_steps`` is not a positive integer.
            hetero_replay.placement.DeviceUnavailableError: a device of the candidate is missing here.
        """
        check_int(env_steps, "env_steps", low=1)
        placement = candidate.placement.checked()
        with _preserved_state(candidate.threads):
            model = self.build(placement, staleness=candidate.staleness)
            try:
                self.fill(model.replay_buffer)
                _steady_state(model)
                model.learning_starts = 0  # the full buffer stands for the steps learning_starts waits for
                phase = self.spec.collect_steps * self.spec.n_envs  # env steps per training phase
                phases = math.ceil(WARMUP_GRADIENT_STEPS / self.spec.gradient_steps)
                model.learn(phases * phase)  # with learning_starts 0, SB3 trains after every phase
                before = model.num_timesteps
                start = time.perf_counter()
                model.learn(env_steps, reset_num_timesteps=False)
                seconds = time.perf_counter() - start
                return (model.num_timesteps - before) / seconds
            finally:
                _close(model)

    # -- the pieces ---------------------------------------------------------------------------

    def build(self, placement: Placement, staleness: int = 0) -> PERMixin:
        """A fresh model of this workload on fresh environments, placed by ``placement``.

        Seeded with :data:`SEED`, ``verbose=0`` and a logger with no outputs
        (nothing printed, no log folder). Its buffer is empty: :meth:`fill` it.
        The caller closes it (``model.replay_buffer.replay.close()``, ``model.env.close()``).
        """
        venv = make_vec_env(self._env_id, n_envs=self._n_envs, seed=SEED)
        kwargs = copy.deepcopy(self._kwargs)  # SB3 edits policy_kwargs in place
        try:
            model = self._algorithm(
                self._policy, venv, placement=placement, staleness=staleness, seed=SEED, verbose=0, **kwargs
            )
        except BaseException:
            venv.close()
            raise
        # A logger with no outputs: nothing printed, no log folder made (SB3's default makes one per learn()).
        model.set_logger(Logger(folder=None, output_formats=[]))
        return model

    def _spec_of(self, model: PERMixin, algo: str) -> WorkloadSpec:
        train_freq = model.train_freq
        assert isinstance(train_freq, TrainFreq)  # _setup_model converted it
        if train_freq.unit != TrainFrequencyUnit.STEP:
            raise ValueError(
                f"train_freq={tuple(train_freq)!r} counts episodes; the advisor models a fixed number of env "
                "steps per training phase: pass train_freq=(n, 'step')"
            )
        collect_steps = int(train_freq.frequency)
        gradient_steps = int(model.gradient_steps)
        if gradient_steps < 0:  # SB3: as many gradient steps as env steps collected
            gradient_steps = collect_steps * self._n_envs
        if gradient_steps == 0:
            raise ValueError("gradient_steps=0 never trains: there is nothing to advise on")
        return WorkloadSpec(
            lib="sb3",
            algo=algo,
            env=self._env_id,
            batch_size=int(model.batch_size),
            buffer_size=int(model.buffer_size),
            n_envs=self._n_envs,
            collect_steps=collect_steps,
            gradient_steps=gradient_steps,
            network=_network(self._policy, model.policy),
        )

    def _steps(self) -> list[_Step]:
        """Real collect steps with random actions, from a fresh environment (collected once)."""
        if self._transitions is None:
            venv = make_vec_env(self._env_id, n_envs=self._n_envs, seed=SEED)
            try:
                space = venv.action_space
                space.seed(SEED)
                obs = venv.reset()
                steps = []
                for _ in range(math.ceil(TRANSITIONS / self._n_envs)):
                    action = np.array([space.sample() for _ in range(self._n_envs)])
                    new_obs, reward, done, infos = venv.step(action)
                    next_obs = np.array(new_obs, copy=True)
                    for i, finished in enumerate(done):  # as SB3's _store_transition: the real last observation
                        if finished and infos[i].get("terminal_observation") is not None:
                            next_obs[i] = infos[i]["terminal_observation"]
                    stored = _scaled(space, action) if isinstance(space, spaces.Box) else action
                    infos = [{"TimeLimit.truncated": bool(info.get("TimeLimit.truncated", False))} for info in infos]
                    steps.append(_Step(np.array(obs, copy=True), next_obs, stored, reward, done, infos))
                    obs = new_obs
            finally:
                venv.close()
            self._transitions = steps
        return self._transitions

    def fill(self, buffer: PrioritizedReplayBuffer) -> None:
        """Fill the empty ``buffer`` of a :meth:`build` model to its capacity, as after a long run.

        The rows are :data:`TRANSITIONS` real transitions (random actions in a
        fresh environment, collected once per workload), tiled; they go
        straight to the core engine in chunks of :data:`FILL_CHUNK` (``N =
        10**6`` takes a fraction of a second with the C++ tree), then get
        ``|N(0, 1)|`` TD errors through the engine's ``update_priorities``. The
        adapter's ``pos``/``full`` say the ring is full, so samples draw over
        all ``N`` rows. A relaxed buffer (staleness >= 1) is filled through the
        engine it wraps, before its first sample: no batch is scheduled yet,
        and its updates would otherwise wait for learner steps.

        Raises:
            ValueError: the buffer is not empty.
        """
        engine = buffer.replay
        # A relaxed buffer's wrapped engine, before its first sample: nothing is scheduled yet.
        core = engine.replay if isinstance(engine, RelaxedReplay) else engine
        assert isinstance(core, PrioritizedReplay)  # (the advisor profiles buffers in this process)
        if len(core) != 0:
            raise ValueError(f"fill needs an empty buffer, this one holds {len(core)} transitions")
        rows = self._rows(core)
        capacity = core.capacity
        chunk = min(FILL_CHUNK, capacity)
        tiled = {name: np.resize(value, (chunk, *value.shape[1:])) for name, value in rows.items()}
        for start in range(0, capacity, chunk):
            n = min(chunk, capacity - start)
            core.add({name: value[:n] for name, value in tiled.items()})
        rng = np.random.default_rng(SEED)
        for start in range(0, capacity, chunk):
            indices = np.arange(start, min(start + chunk, capacity), dtype=np.int64)
            td = np.abs(rng.standard_normal(len(indices))).astype(np.float32)
            core.update_priorities(*_tree_inputs(core, indices, td))
        buffer.pos, buffer.full = 0, True
        if buffer.optimize_memory_usage:
            # Row `pos` holds the next observations of the newest row, not a transition (see the buffer's add).
            core.clear_priorities(np.arange(buffer.n_envs, dtype=np.int64))

    def _rows(self, core: PrioritizedReplay) -> dict[str, np.ndarray]:
        """The collected transitions as the engine's fields (one row per transition)."""
        steps = self._steps()
        columns = {
            "obs": [s.obs for s in steps],
            "next_obs": [s.next_obs for s in steps],
            "action": [s.action for s in steps],
            "reward": [s.reward for s in steps],
            "done": [s.done for s in steps],
            "timeout": [[info["TimeLimit.truncated"] for info in s.infos] for s in steps],
        }
        rows = {}
        for name, field in core.schema.items():
            if name not in columns:
                raise ValueError(f"the workload cannot fill the buffer field {name!r} (Dict observations?)")
            rows[name] = np.asarray(columns[name]).reshape(-1, *field.shape).astype(field.dtype)
        return rows

    def _time_env_step(self, timer: Timer) -> Timing:
        venv = make_vec_env(self._env_id, n_envs=self._n_envs, seed=SEED)
        try:
            space = venv.action_space
            space.seed(SEED)
            venv.reset()
            actions = itertools.cycle(
                [np.array([space.sample() for _ in range(self._n_envs)]) for _ in range(VARIANTS)]
            )
            return timer(lambda: venv.step(next(actions)))
        finally:
            venv.close()

    def _training_loop(self, model: PERMixin) -> Callable[[], None]:
        """One phase of ``learn()``'s loop on ``model``, in steady state: its buffer full, DQN's epsilon final.

        ``collect_rollouts`` of ``train_freq`` steps, then ``train(gradient_steps)``,
        as ``learn()`` calls them; the stages run interleaved, as in a run, so
        what they cost each other (caches and the allocator shared by env,
        buffer and network) is counted.
        """
        self.fill(model.replay_buffer)
        _steady_state(model)
        _, callback = model._setup_learn(HORIZON, callback=None, reset_num_timesteps=True)
        callback.on_training_start(locals(), globals())
        env = model.get_env()
        assert env is not None and model._last_obs is not None  # _setup_learn reset the environments
        phase = TrainFreq(self.spec.collect_steps, TrainFrequencyUnit.STEP)
        gradient_steps, batch_size = self.spec.gradient_steps, self.spec.batch_size

        def one_phase() -> None:
            model.collect_rollouts(
                env, callback=callback, train_freq=phase, replay_buffer=model.replay_buffer,
                action_noise=model.action_noise, learning_starts=0, log_interval=4,
            )  # fmt: skip
            model.train(gradient_steps=gradient_steps, batch_size=batch_size)

        return one_phase


def make_workload(
    algo: str | type[PERMixin],
    env: str | gym.Env | VecEnv,
    batch_size: int | None = None,
    buffer_size: int | None = None,
    n_envs: int | None = None,
    policy: str | type = "MlpPolicy",
    **algo_kwargs: Any,
) -> SB3Workload:
    """The SB3 workload of ``algo`` on ``env``: SB3's defaults for every argument not given.

    ``hetero_replay.advisor.advise(lib="sb3", ...)`` calls it; so does a PER
    algorithm built with ``placement="auto"``, with its own class and arguments.

    Args:
        algo: ``"dqn"``, ``"ddpg"``, ``"td3"`` or ``"sac"`` (trained by
            ``PERDQN``, ``PERDDPG``, ``PERTD3``, ``PERSAC``), or a PER algorithm class.
        env: a gymnasium environment id (``"CartPole-v1"``), or a gymnasium
            environment or SB3 ``VecEnv`` with one (profiling steps fresh copies
            made from the id; a ``VecEnv``'s number of environments is kept).
        batch_size: ``B``, transitions per gradient step (default: the algorithm's).
        buffer_size: ``N``, transitions the replay holds (default: the algorithm's).
        n_envs: environments stepped together (SB3's ``DummyVecEnv``; default 1,
            or the ``VecEnv``'s).
        policy: the policy, as the algorithm takes it.
        **algo_kwargs: other arguments of the algorithm (``train_freq``,
            ``gradient_steps``, ``policy_kwargs``, ``learning_starts``,
            ``replay_buffer_kwargs``, ...).

    Raises:
        TypeError: ``algo`` neither a name nor a PER algorithm class, ``env`` of
            another type, ``batch_size``, ``buffer_size`` or ``n_envs`` not an integer.
        ValueError: an unknown ``algo`` or ``env``, an environment without an
            id, sizes below 1, a ``buffer_size`` smaller than ``n_envs``, an
            ``n_envs`` that contradicts the ``VecEnv``, an action space ``algo``
            does not take (DQN needs ``Discrete``, the others ``Box``),
            ``train_freq`` in episodes, or an argument the workload sets itself
            (:data:`RESERVED`).
    """
    if isinstance(algo, str):
        if algo.lower() not in ALGORITHMS:
            raise ValueError(f"algo must be one of {tuple(ALGORITHMS)}, got {algo!r}")
        algorithm_class = ALGORITHMS[algo.lower()]
    elif isinstance(algo, type):
        algorithm_class = algo
    else:
        raise TypeError(f"algo must be a str, one of {tuple(ALGORITHMS)}, or a PER algorithm class, got {algo!r}")
    env_id, env_count = _env_id(env)
    if n_envs is None:
        n_envs = env_count
    check_int(n_envs, "n_envs", low=1)
    if not isinstance(env, str) and n_envs != env_count:
        raise ValueError(f"n_envs={n_envs} contradicts env, which steps {env_count} environment(s)")
    kwargs = dict(algo_kwargs)
    for name, value in (("batch_size", batch_size), ("buffer_size", buffer_size)):
        if value is not None:
            check_int(value, name, low=1)
            kwargs[name] = value
    return SB3Workload(algorithm_class, policy, env_id, n_envs, kwargs)


# -- helpers ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _preserved_state(threads: int | None) -> Iterator[None]:
    """Run with ``threads`` replay threads; restore every global state SB3 or the replay may change.

    SB3 seeds ``random``, NumPy's and torch's global generators (and sets
    cuDNN's deterministic flags with CUDA); the buffer draws its own seed from
    NumPy's global generator.
    """
    python_rng, numpy_rng, torch_rng = random.getstate(), np.random.get_state(), th.get_rng_state()
    cuda = th.cuda.is_available()
    cuda_rng = th.cuda.get_rng_state_all() if cuda else None
    cudnn = (th.backends.cudnn.deterministic, th.backends.cudnn.benchmark)
    replay_threads, torch_threads = hetero_replay.num_threads(), th.get_num_threads()
    try:
        if threads is not None:
            hetero_replay.set_num_threads(threads)
        yield
    finally:
        hetero_replay.set_num_threads(replay_threads)
        if th.get_num_threads() != torch_threads:
            th.set_num_threads(torch_threads)
        th.backends.cudnn.deterministic, th.backends.cudnn.benchmark = cudnn
        random.setstate(python_rng)
        np.random.set_state(numpy_rng)
        th.set_rng_state(torch_rng)
        if cuda_rng is not None:
            th.cuda.set_rng_state_all(cuda_rng)


def _algo_name(algorithm_class: Any) -> str:
    """The advisor's name of a PER algorithm class; ``TypeError``/``ValueError`` naming ``algorithm_class``."""
    if not isinstance(algorithm_class, type) or not issubclass(algorithm_class, OffPolicyAlgorithm):
        raise TypeError(f"algorithm_class must be an SB3 off-policy algorithm class, got {algorithm_class!r}")
    if not issubclass(algorithm_class, PERMixin):
        raise TypeError(
            f"algorithm_class must be a PER algorithm (PERDQN, PERDDPG, PERTD3, PERSAC or a subclass), "
            f"got {algorithm_class.__name__}"
        )
    for family, name in _FAMILIES:
        if issubclass(algorithm_class, family):
            return name
    raise ValueError(
        f"algorithm_class {algorithm_class.__name__} extends none of DQN, DDPG, TD3, SAC: the advisor models those"
    )


def _check_action_space(algo: str, env_id: str) -> None:
    """``ValueError`` unless ``env_id`` is a gymnasium id whose action space ``algo`` takes."""
    try:
        env = gym.make(env_id)
    except gym.error.DependencyNotInstalled as e:
        raise ImportError(f"env {env_id!r} needs a package that is not installed: {e}") from e
    except gym.error.Error as e:
        raise ValueError(f"env must be a registered gymnasium environment id, got {env_id!r} ({e})") from e
    try:
        space = env.action_space
    finally:
        env.close()
    wanted = spaces.Discrete if algo == "dqn" else spaces.Box
    if not isinstance(space, wanted):
        kind = "discrete (Discrete)" if algo == "dqn" else "continuous (Box)"
        raise ValueError(f"algo {algo!r} needs a {kind} action space, but env {env_id!r} has {space}")


def _env_id(env: Any) -> tuple[str, int]:
    """``(gymnasium id, number of environments)`` of an id, a gymnasium environment or a ``VecEnv``.

    Reads only the specification: the environment is not stepped or reset.
    """
    if isinstance(env, str):
        return env, 1
    if isinstance(env, VecEnv):
        spec = env.get_attr("spec", indices=[0])[0]
        n_envs = int(env.num_envs)
    elif isinstance(env, gym.Env):
        spec, n_envs = env.spec, 1
    else:
        raise TypeError(f"env must be an env id, a gymnasium environment or an SB3 VecEnv, got {type(env).__name__}")
    env_id = getattr(spec, "id", None)
    if not env_id:
        raise ValueError(
            "env: the advisor profiles fresh copies of the environment, made from its gymnasium id, and this "
            f"{type(env).__name__} has none (its spec is None); register it (gymnasium.register) and make it "
            "with gymnasium.make, or pass its id"
        )
    return str(env_id), n_envs


def _network(policy_arg: str | type, policy: Any) -> str:
    """A short description of the policy's network: ``"MlpPolicy [64, 64]"``."""
    name = policy_arg if isinstance(policy_arg, str) else policy_arg.__name__
    arch = getattr(policy, "net_arch", None)
    if isinstance(arch, dict):
        text = " ".join(f"{key}={list(value)}" for key, value in arch.items())
    else:
        text = str(list(arch)) if arch is not None else ""
    activation = getattr(policy, "activation_fn", None)
    if activation is not None and activation is not th.nn.ReLU:
        text += f" {activation.__name__}"
    return f"{name} {text}".strip()


def _steady_state(model: PERMixin) -> None:
    """Explore as a long run does: DQN's epsilon at its final value from the first step."""
    if isinstance(model, DQN):
        model.exploration_schedule = ConstantSchedule(model.exploration_final_eps)
        model.exploration_rate = model.exploration_final_eps


def _settle_auto(model: PERMixin, one_phase: Callable[[], None]) -> str:
    """Relax the model's buffer with ``worker="auto"``, run phases until it has decided; ``"thread"`` or ``"inline"``."""
    _relax(model.replay_buffer, worker="auto")
    engine = model.replay_buffer.replay
    assert isinstance(engine, RelaxedReplay)
    per_phase = max(1, int(model.gradient_steps))  # SB3's -1 (one per env step): at least one
    for _ in range(math.ceil((AUTO_WINDOW + 2) / per_phase)):
        one_phase()
    return "thread" if engine.on_worker_thread else "inline"


def _relax(buffer: PrioritizedReplayBuffer, worker: str) -> None:
    """Wrap the buffer's strict engine for staleness 1, prefetch 1, on ``worker`` (``"thread"`` or ``"inline"``)."""
    engine = buffer.replay
    assert isinstance(engine, PrioritizedReplay)
    # The buffer has no public way to change its engine's schedule: swap what it delegates to.
    buffer._replay = RelaxedReplay(engine, staleness=1, prefetch=1, worker=worker)


def _close(model: PERMixin) -> None:
    """Stop the buffer's worker thread (if any) and release its storage; close the environments."""
    try:
        buffer = getattr(model, "replay_buffer", None)
        if buffer is not None:
            buffer.replay.close()
    finally:
        if model.env is not None:
            model.env.close()


def _tree_inputs(core: PrioritizedReplay, indices: np.ndarray, td: np.ndarray) -> tuple[Any, Any]:
    """Indices and TD errors where the tree takes them: tensors on a device tree's device, else NumPy."""
    tree = core.tree
    if isinstance(tree, DeviceTree):
        return th.as_tensor(indices, device=tree.device), th.as_tensor(td, device=tree.device)
    return indices, td


def _scaled(space: spaces.Box, action: np.ndarray) -> np.ndarray:
    """An action of ``space`` rescaled to ``[-1, 1]``, what SB3 stores for a ``Box`` (its ``scale_action``)."""
    low, high = space.low, space.high
    return (2.0 * ((action - low) / (high - low)) - 1.0).astype(np.float32)


def _sum(a: Timing, b: Timing) -> Timing:
    """Two parts that happen one after the other, as one timing (quartiles added: an upper bound of the spread)."""
    return Timing(a.median + b.median, a.q1 + b.q1, a.q3 + b.q3, min(a.n, b.n), 1, a.expected + b.expected)


def _sync_for(config: ReplayConfig) -> Callable[[], None] | None:
    """``torch.cuda.synchronize`` where ``config`` puts work on a GPU (so asynchronous work is counted)."""
    devices = (config.learner, config.tree_device, config.storage)
    if any(str(d).startswith("cuda") or d == "pinned" for d in devices) and th.cuda.is_available():
        return th.cuda.synchronize
    return None


__all__ = ["ALGORITHMS", "RESERVED", "SB3Workload", "make_workload"]
