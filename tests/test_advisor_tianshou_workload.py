"""The advisor's Tianshou workload: spec, argument checks, timed steps, the filled buffer, real runs.

Real Tianshou, real gymnasium envs, tiny sizes (N=2000, 2 envs) and three
repetitions per timing; nothing here asserts how fast anything is, only what
comes back and what is left behind (buffers, generators, thread settings).
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("tianshou")

import gymnasium as gym  # noqa: E402

import hetero_replay  # noqa: E402
from hetero_replay.adapters.tianshou import PEROffPolicyWrapper  # noqa: E402
from hetero_replay.adapters.tianshou import workload as ts_workload  # noqa: E402
from hetero_replay.adapters.tianshou.workload import (  # noqa: E402
    STANDARD_HYPERPARAMS,
    Hyperparams,
    TianshouWorkload,
    make_workload,
    standard_algorithm,
)
from hetero_replay.advisor import workload as advisor_workload  # noqa: E402
from hetero_replay.advisor.profile import HOST_STEPS, REPLAY_STEPS, Timer, Timing, measure, measure_in_loop  # noqa: E402
from hetero_replay.advisor.workload import Candidate, ReplayConfig, Workload  # noqa: E402
from hetero_replay.placement import Placement  # noqa: E402

N, B, ENVS = 2000, 32, 2
NATIVE = ReplayConfig("native", 1, "host")


class QuickTimer(Timer):
    """Three short repetitions: enough to check what comes back, not how fast."""

    def __call__(self, fn: Callable[[], Any], **kwargs: Any) -> Timing:
        return measure(fn, repeats=3, warmup=1, min_repetition_s=1e-3)

    def in_loop(self, step: Callable[[], Any], clock: Any, **kwargs: Any) -> Any:
        return measure_in_loop(step, clock, repeats=3, warmup=1, min_repetition_s=1e-3, sync=kwargs.get("sync"))


timer = QuickTimer()


@pytest.fixture(scope="module")
def dqn() -> TianshouWorkload:
    return make_workload("dqn", "CartPole-v1", batch_size=B, buffer_size=N, n_envs=ENVS)


def global_state() -> tuple[Any, ...]:
    """What a workload method must leave as it found it."""
    return (
        hetero_replay.num_threads(),
        torch.get_num_threads(),
        pickle.dumps(np.random.get_state()),
        torch.get_rng_state().numpy().tobytes(),
    )


def assert_timings(times: dict[str, Any], keys: tuple[str, ...]) -> None:
    assert set(times) == set(keys)
    for key in keys:
        timing = times[key]
        if timing is None:
            continue
        assert isinstance(timing, Timing), key
        assert 0 < timing.q1 <= timing.median <= timing.q3 and timing.n >= 3 and timing.calls >= 1, key


# -- the spec and the standard setups --------------------------------------------------------------


def test_spec_describes_the_standard_dqn_setup(dqn: TianshouWorkload) -> None:
    hp = STANDARD_HYPERPARAMS["dqn"]
    spec = dqn.spec
    assert (spec.lib, spec.algo, spec.env, spec.batch_size, spec.buffer_size, spec.n_envs) == (
        "tianshou", "dqn", "CartPole-v1", B, N, ENVS,
    )  # fmt: skip
    assert spec.collect_steps == hp.collect_per_env == 4
    assert spec.gradient_steps == round(hp.updates_per_step * hp.collect_per_env * ENVS) == 2
    assert spec.network == "Net [64, 64]"
    assert dqn.hyperparams.batch_size == B and dqn.hyperparams.buffer_size == N  # the sizes override the standard's
    assert isinstance(dqn, Workload)


def test_advisor_finds_the_workload_by_library_name() -> None:
    workload = advisor_workload.make_workload("tianshou", algo="sac", env="Pendulum-v1", batch_size=16,
                                              buffer_size=500, n_envs=3)  # fmt: skip
    assert isinstance(workload, TianshouWorkload)
    assert (workload.spec.collect_steps, workload.spec.gradient_steps) == (1, 3)  # one update per env step


def test_factory_algorithms_are_described_and_built_fresh() -> None:
    built: list[Any] = []
    template = standard_algorithm("dqn", gym.make("CartPole-v1"), STANDARD_HYPERPARAMS["dqn"])

    def factory() -> Any:
        built.append(copy.deepcopy(template))
        return built[-1]

    workload = make_workload("dqn", "CartPole-v1", B, N, n_envs=ENVS, algorithm_factory=factory)
    params = sum(p.numel() for p in template.parameters())
    assert workload.spec.network == f"DQN, {params:,} parameters"
    before = len(built)
    workload.run(Candidate(NATIVE), 16)
    assert len(built) > before and all(a is not b for a, b in zip(built, built[1:]))


def test_compare_runner_uses_the_same_standard_setups() -> None:
    from hetero_replay.apps.compare import tianshou_runs

    assert tianshou_runs.HYPERPARAMS is STANDARD_HYPERPARAMS
    assert tianshou_runs.make_algorithm is standard_algorithm
    assert tianshou_runs.Hyperparams is Hyperparams


# -- bad arguments ----------------------------------------------------------------------------------


def wrapped_dqn() -> PEROffPolicyWrapper:
    dqn = standard_algorithm("dqn", gym.make("CartPole-v1"), STANDARD_HYPERPARAMS["dqn"])
    return PEROffPolicyWrapper(wrapped_algorithm=dqn, beta=0.4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(algo="ppo"), ValueError, "algo must be one of"),
        (dict(env="NoSuchEnv-v9"), ValueError, "unknown environment"),
        (dict(env=gym.make("CartPole-v1")), TypeError, "env must be"),
        (dict(batch_size=0), ValueError, "batch_size must be >= 1"),
        (dict(batch_size=32.0), TypeError, "batch_size must be an integer"),
        (dict(buffer_size=True), TypeError, "buffer_size must be an integer"),
        (dict(n_envs=4, buffer_size=3), ValueError, "buffer_size must be >= n_envs"),
        (dict(hyperparams={"lr": 1e-3}), TypeError, "hyperparams must be a Hyperparams"),
        (dict(hyperparams=Hyperparams(updates_per_step=0.01)), ValueError, "at least one"),
        (dict(algorithm_factory="dqn"), TypeError, "algorithm_factory must be a callable"),
        (dict(algorithm_factory=wrapped_dqn), TypeError, "unwrapped"),
        (dict(algorithm_factory=lambda: torch.nn.Linear(2, 2)), TypeError, "OffPolicyAlgorithm"),
        (dict(algo="sac", algorithm_factory=lambda: wrapped_dqn().wrapped_algorithm), TypeError, "needs a SAC"),
        (dict(env="Pendulum-v1"), ValueError, "discrete action space"),
        (dict(algo="sac"), ValueError, "continuous"),
    ],
)
def test_make_workload_rejects_bad_arguments(kwargs: dict[str, Any], error: type, match: str) -> None:
    arguments = dict(algo="dqn", env="CartPole-v1", batch_size=B, buffer_size=N, n_envs=1) | kwargs
    with pytest.raises(error, match=match):
        make_workload(**arguments)


def test_methods_reject_bad_arguments(dqn: TianshouWorkload) -> None:
    with pytest.raises(ValueError, match="reference trains on 'cpu', not on learner='cuda:0'"):
        dqn.time_host("cuda:0", NATIVE, timer)
    with pytest.raises(ValueError, match="storage must be 'host'"):  # Tianshou keeps transitions in NumPy
        dqn.time_replay(ReplayConfig("native", 1, "cpu"), timer)
    for steps, error in ((0, ValueError), (10.5, TypeError)):
        with pytest.raises(error, match="env_steps"):
            dqn.run(Candidate(NATIVE), steps)


# -- timings ----------------------------------------------------------------------------------------


def test_time_host_times_every_host_step_and_restores_global_state(dqn: TianshouWorkload) -> None:
    before = global_state()
    times = dqn.time_host("cpu", ReplayConfig("native", 2, "host"), timer)
    assert global_state() == before
    assert_timings(times, HOST_STEPS)
    # Timed in the trainer's loop, 4 training steps a call: per vector step, per gradient step, per training step.
    f, g = dqn.spec.collect_steps, dqn.spec.gradient_steps
    assert (times["collect"].calls, times["learn"].calls, times["phase"].calls) == (4 * f, 4 * g, 4)


@pytest.mark.parametrize("tree", ["native", "numpy", "torch"])
def test_time_replay_times_the_primitives_without_a_worker_thread(dqn: TianshouWorkload, tree: str) -> None:
    before = global_state()
    times = dqn.time_replay(ReplayConfig(tree, 2 if tree == "native" else 1, "host"), timer)
    assert global_state() == before
    assert_timings(times, REPLAY_STEPS)
    assert times["phase_relaxed"] is None  # the wrapper's relaxed schedule runs on the learner's thread


# -- the filled buffer ------------------------------------------------------------------------------


@pytest.mark.parametrize("tree", ["native", "torch"])
def test_fill_writes_every_slot_with_random_priorities(dqn: TianshouWorkload, tree: str) -> None:
    buffer = dqn._filled_buffer(Placement(tree=tree))
    size = buffer.maxsize // ENVS
    assert len(buffer) == buffer.maxsize >= N
    priorities = buffer.weight[np.arange(buffer.maxsize)]
    assert np.all(priorities > 0) and np.unique(priorities).size > buffer.maxsize // 2  # non-uniform
    assert buffer.max_priority > 2  # |N(0, 1)| TD errors: the largest of 2000 exceeds 2
    # Real transitions, stored as the collector stores them; each sub-buffer's last slot ends an episode.
    assert buffer.obs.shape == (buffer.maxsize, 4) and buffer.obs.dtype == np.float32
    assert np.all(np.abs(buffer.obs[:, 2]) < 0.21)  # CartPole's pole angle stays within its limits
    last = buffer._offset + size - 1
    assert np.all(buffer.done[last]) and buffer.unfinished_index().size == 0
    running = np.flatnonzero(~buffer.done[: size - 1])
    assert np.array_equal(buffer.obs_next[running], buffer.obs[running + 1])  # consecutive steps of episodes
    # Sampling draws over the whole buffer, and the next add overwrites each sub-buffer's oldest slot.
    drawn = buffer.sample_indices(4096)
    assert drawn.min() < size // 4 and drawn.max() > buffer.maxsize - size // 4
    indices, *_ = buffer.add(buffer[last], buffer_ids=np.arange(ENVS))
    assert np.array_equal(indices, buffer._offset) and len(buffer) == buffer.maxsize


def test_fill_marks_a_time_limit_where_no_episode_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ts_workload, "SOURCE_ROWS", 3)  # CartPole never ends in 3 steps
    workload = make_workload("dqn", "CartPole-v1", B, 200, n_envs=ENVS)
    buffer = workload._filled_buffer(Placement())
    size = buffer.maxsize // ENVS
    assert np.all(buffer.truncated[buffer._offset + size - 1]) and not buffer.terminated.any()
    assert buffer.done.sum() == sum(len(range(size - 1, -1, -3)) for _ in range(ENVS))  # every third slot


# -- end-to-end runs --------------------------------------------------------------------------------


@pytest.mark.parametrize("staleness", [0, 1])
def test_run_trains_and_restores_global_state(dqn: TianshouWorkload, staleness: int) -> None:
    hetero_replay.set_num_threads(1)
    before = global_state()
    rate = dqn.run(Candidate(ReplayConfig("native", 2, "host"), staleness), 48)
    assert global_state() == before
    assert np.isfinite(rate) and rate > 0


def test_run_trains_continuous_control() -> None:
    workload = make_workload("td3", "Pendulum-v1", batch_size=16, buffer_size=400, n_envs=1)
    assert workload.run(Candidate(ReplayConfig("numpy", 1, "host")), 8) > 0
