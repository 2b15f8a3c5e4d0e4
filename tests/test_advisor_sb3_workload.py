"""The advisor's Stable-Baselines3 workload: its spec, its argument checks, its timings and its runs.

Everything runs real SB3 on real gymnasium environments with tiny sizes
(N = 2000, B = 32, small networks, three repetitions per timing). No assertion
depends on how long anything takes: only on what is returned and what is left
behind (threads, random generators, the user's environment).
"""

from __future__ import annotations

import random
import threading

import gymnasium as gym
import numpy as np
import pytest
import torch as th

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv  # noqa: E402

import hetero_replay  # noqa: E402
from hetero_replay.adapters.sb3 import PERDQN, PERSAC  # noqa: E402
from hetero_replay.adapters.sb3.workload import SB3Workload, make_workload  # noqa: E402
from hetero_replay.advisor.profile import (  # noqa: E402
    HOST_STEPS,
    OPTIONAL_REPLAY_STEPS,
    REPLAY_STEPS,
    Timer,
    Timing,
    measure,
    measure_in_loop,
)
from hetero_replay.advisor.workload import Candidate, ReplayConfig  # noqa: E402
from hetero_replay.pipeline import RelaxedReplay  # noqa: E402
from hetero_replay.placement import Placement  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py

N, B = 2000, 32
#: The worker thread of hetero_replay.pipeline (its name there).
PIPELINE_THREAD = "hetero-replay-pipeline"


class QuickTimer(Timer):
    """Three short repetitions: enough to check what comes back, not how fast."""

    def __call__(self, fn, **kwargs) -> Timing:
        return measure(fn, repeats=3, warmup=1, min_repetition_s=1e-3)

    def in_loop(self, step, clock, **kwargs):
        return measure_in_loop(step, clock, repeats=3, warmup=1, min_repetition_s=1e-3)


timer = QuickTimer()


def small_dqn(**kwargs) -> SB3Workload:
    return make_workload("dqn", "CartPole-v1", B, N, policy_kwargs=dict(net_arch=[16, 16]), **kwargs)


def small_sac(**kwargs) -> SB3Workload:
    return make_workload("sac", "Pendulum-v1", B, N, policy_kwargs=dict(net_arch=[16, 16]), **kwargs)


def assert_timings(times: dict, keys: tuple[str, ...]) -> None:
    assert set(times) == set(keys)
    for key, timing in times.items():
        assert isinstance(timing, Timing), key
        assert 0 < timing.q1 <= timing.median <= timing.q3, (key, timing)
        assert timing.n >= 1 and timing.calls >= 1, (key, timing)


def pipeline_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == PIPELINE_THREAD}


# -- the spec ---------------------------------------------------------------------------------------


def test_the_spec_holds_sb3s_defaults_and_the_network() -> None:
    spec = make_workload("dqn", "CartPole-v1", 256, 100_000).spec
    assert (spec.lib, spec.algo, spec.env, spec.batch_size, spec.buffer_size, spec.n_envs) == (
        "sb3", "dqn", "CartPole-v1", 256, 100_000, 1,
    )  # fmt: skip
    assert (spec.collect_steps, spec.gradient_steps) == (4, 1)  # DQN's train_freq=4, gradient_steps=1
    assert spec.network == "MlpPolicy [64, 64]"


def test_the_spec_reads_train_freq_and_resolves_gradient_steps_minus_one() -> None:
    spec = small_dqn(n_envs=2, train_freq=(8, "step"), gradient_steps=-1).spec
    # SB3's -1: one gradient step per env step collected, 8 collect steps of 2 envs.
    assert (spec.n_envs, spec.collect_steps, spec.gradient_steps) == (2, 8, 16)
    assert spec.gradient_steps_per_env_step == 1.0
    assert small_dqn(train_freq=3).spec.collect_steps == 3


def test_the_network_string_names_the_architecture() -> None:
    tanh = make_workload("dqn", "CartPole-v1", B, N, policy_kwargs=dict(net_arch=[32, 8], activation_fn=th.nn.Tanh))
    assert tanh.spec.network == "MlpPolicy [32, 8] Tanh"
    split = make_workload("sac", "Pendulum-v1", B, N, policy_kwargs=dict(net_arch=dict(pi=[16], qf=[32, 32])))
    assert split.spec.network == "MlpPolicy pi=[16] qf=[32, 32]"
    assert small_sac().spec.network == "MlpPolicy [16, 16]"


# -- arguments refused --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("ppo", "CartPole-v1", B, N), {}, ValueError, "algo must be one of"),
        ((3, "CartPole-v1", B, N), {}, TypeError, "algo must be a str"),
        (("dqn", "NoSuchEnv-v0", B, N), {}, ValueError, "env must be a registered gymnasium"),
        (("dqn", 7, B, N), {}, TypeError, "env must be an env id"),
        (("dqn", "Pendulum-v1", B, N), {}, ValueError, r"algo 'dqn' needs a discrete \(Discrete\) action space"),
        (("sac", "CartPole-v1", B, N), {}, ValueError, r"algo 'sac' needs a continuous \(Box\) action space"),
        (("td3", "CartPole-v1", B, N), {}, ValueError, "continuous"),
        (("dqn", "CartPole-v1", 0, N), {}, ValueError, "batch_size must be >= 1"),
        (("dqn", "CartPole-v1", 2.5, N), {}, TypeError, "batch_size must be an integer"),
        (("dqn", "CartPole-v1", B, True), {}, TypeError, "buffer_size must be an integer"),
        (("dqn", "CartPole-v1", B, 3), {"n_envs": 4}, ValueError, "buffer_size must hold one row of n_envs=4"),
        (("dqn", "CartPole-v1", B, N), {"n_envs": 0}, ValueError, "n_envs must be >= 1"),
        (("dqn", "CartPole-v1", B, N), {"device": "cpu"}, ValueError, r"may not set \['device'\]"),
        (("dqn", "CartPole-v1", B, N), {"seed": 1}, ValueError, r"may not set \['seed'\]"),
        (("dqn", "CartPole-v1", B, N), {"train_freq": (1, "episode")}, ValueError, "train_freq=.* counts episodes"),
        (("dqn", "CartPole-v1", B, N), {"gradient_steps": 0}, ValueError, "gradient_steps=0 never trains"),
    ],
)
def test_bad_arguments_are_refused_naming_them(args: tuple, kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make_workload(*args, **kwargs)


def test_an_unknown_algorithm_argument_reaches_sb3s_own_error() -> None:
    with pytest.raises(TypeError, match="no_such_option"):
        make_workload("dqn", "CartPole-v1", B, N, no_such_option=1)


def test_a_model_class_must_be_a_per_algorithm_and_its_env_must_have_an_id() -> None:
    with pytest.raises(TypeError, match="must be a PER algorithm"):
        make_workload(DQN, "CartPole-v1")

    class Unregistered(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (2,))
        action_space = gym.spaces.Discrete(2)

    with pytest.raises(ValueError, match="gymnasium id"):
        make_workload(PERDQN, Unregistered())
    with pytest.raises(TypeError, match="env must be an env id"):
        make_workload(PERDQN, 42)


def test_time_host_needs_a_reference_on_its_learner() -> None:
    with pytest.raises(ValueError, match="reference must train on the learner device 'cuda:0'"):
        small_dqn().time_host("cuda:0", ReplayConfig("native", 1, "host"), timer)


# -- the user's environment ---------------------------------------------------------------------------


def test_a_users_env_is_profiled_through_copies_and_never_stepped(counting_env) -> None:
    user_env = counting_env("CartPole-v1")
    workload = make_workload(PERDQN, user_env, B, N, policy_kwargs=dict(net_arch=[16]))
    assert (workload.spec.env, workload.spec.n_envs, workload.spec.buffer_size) == ("CartPole-v1", 1, N)
    assert workload.spec.network == "MlpPolicy [16]"
    workload.time_host("cpu", ReplayConfig("native", 1, "host"), timer)
    assert user_env.calls == 0


def test_a_vec_envs_number_of_envs_is_kept(counting_env) -> None:
    user_env = counting_env("CartPole-v1")
    venv = DummyVecEnv([lambda: user_env, lambda: gym.make("CartPole-v1")])
    workload = make_workload(PERDQN, venv, B, N)
    assert (workload.spec.env, workload.spec.n_envs) == ("CartPole-v1", 2)
    assert user_env.calls == 0
    with pytest.raises(ValueError, match="n_envs=3 contradicts env"):
        make_workload(PERDQN, venv, B, N, n_envs=3)


# -- filling --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_envs", [1, 2])
def test_fill_makes_the_buffer_full_with_n_rows_and_spread_priorities(n_envs: int) -> None:
    workload = small_dqn(n_envs=n_envs)
    model = workload.build(Placement())
    try:
        buffer = model.replay_buffer
        workload.fill(buffer)
        assert buffer.full and buffer.pos == 0 and buffer.size() * n_envs == N
        assert len(buffer.replay) == N
        priorities = buffer.priorities().reshape(-1)
        assert priorities.shape == (N,) and (priorities > 0).all()
        assert np.unique(priorities).size > N // 2  # random |TD errors|, not one initial value
        indices = np.concatenate([np.asarray(buffer.sample(512).indices) for _ in range(8)])
        assert indices.min() < N // 10 and indices.max() >= N - N // 10  # drawn over all N rows
        observations = buffer.observations.reshape(N, -1)
        assert np.abs(observations).sum(axis=1).min() > 0  # every row holds a real transition
        with pytest.raises(ValueError, match="fill needs an empty buffer"):
            workload.fill(buffer)
    finally:
        buffer.replay.close()
        model.env.close()


def test_fill_gives_a_relaxed_buffer_its_priorities_too() -> None:
    workload = small_dqn()
    model = workload.build(Placement(), staleness=1)
    try:
        assert isinstance(model.replay_buffer.replay, RelaxedReplay)
        workload.fill(model.replay_buffer)
        assert np.unique(model.replay_buffer.priorities()).size > N // 2  # not dropped or still queued
    finally:
        model.replay_buffer.replay.close()
        model.env.close()


# -- timings -------------------------------------------------------------------------------------------


def small_td3() -> SB3Workload:
    return make_workload("td3", "Pendulum-v1", B, N, policy_kwargs=dict(net_arch=[16, 16]))


@pytest.mark.parametrize("make", [small_dqn, small_sac, small_td3], ids=["dqn", "sac", "td3"])
def test_time_host_and_time_replay_return_every_step(make, capsys: pytest.CaptureFixture) -> None:
    workload = make()
    reference = ReplayConfig("native", 1, "host")
    assert_timings(workload.time_host("cpu", reference, timer), HOST_STEPS)
    for config in (reference, ReplayConfig("numpy", 1, "cpu")):
        times = workload.time_replay(config, timer)
        assert times.pop("worker") in ("thread", "inline")  # what the relaxed pipeline's worker="auto" decided
        assert_timings(times, (*REPLAY_STEPS, *OPTIONAL_REPLAY_STEPS))
    assert capsys.readouterr().out == ""  # SB3's logger prints nothing


def test_time_replay_settles_the_relaxed_pipelines_worker_and_stops_it() -> None:
    before = pipeline_threads()
    times = small_dqn().time_replay(ReplayConfig("native", 1, "host"), timer)
    assert times["worker"] in ("thread", "inline")  # what worker="auto" decided
    assert isinstance(times["phase_relaxed"], Timing)
    assert not any(t.is_alive() for t in pipeline_threads() - before)  # closed afterwards

    seen: list[set[threading.Thread]] = []

    class Watching(QuickTimer):
        def __call__(self, fn, **kwargs) -> Timing:
            timing = super().__call__(fn)
            seen.append(pipeline_threads() - before)
            return timing

    small_dqn().time_host("cpu", ReplayConfig("native", 1, "host"), Watching())
    assert all(threads == set() for threads in seen)  # the host steps never start a worker


def test_timings_leave_global_state_as_found() -> None:
    workload = small_dqn()
    threads = hetero_replay.num_threads()
    hetero_replay.set_num_threads(1)
    np.random.seed(123)
    random.seed(123)
    th.manual_seed(123)
    expected = (np.random.random(), random.random(), th.rand(1).item())
    np.random.seed(123)
    random.seed(123)
    th.manual_seed(123)
    torch_threads = th.get_num_threads()
    try:
        workload.time_host("cpu", ReplayConfig("native", 2, "host"), timer)
        workload.time_replay(ReplayConfig("native", 2, "host"), timer)
        assert (hetero_replay.num_threads(), th.get_num_threads()) == (1, torch_threads)
        assert (np.random.random(), random.random(), th.rand(1).item()) == expected
    finally:
        hetero_replay.set_num_threads(threads)


# -- end to end ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("staleness", [0, 1])
def test_run_trains_and_restores_the_threads(staleness: int) -> None:
    workload = small_dqn()
    threads, torch_threads = hetero_replay.num_threads(), th.get_num_threads()
    hetero_replay.set_num_threads(1)
    state = np.random.get_state()[1].copy()
    before = pipeline_threads()
    try:
        rate = workload.run(Candidate(ReplayConfig("native", 2, "host"), staleness), env_steps=64)
        assert rate > 0 and np.isfinite(rate)
        assert (hetero_replay.num_threads(), th.get_num_threads()) == (1, torch_threads)
        np.testing.assert_array_equal(np.random.get_state()[1], state)
        assert not any(t.is_alive() for t in pipeline_threads() - before)  # a relaxed buffer's worker is stopped
    finally:
        hetero_replay.set_num_threads(threads)


def test_run_of_a_continuous_algorithm() -> None:
    rate = small_sac(learning_starts=500).run(Candidate(ReplayConfig("numpy", 1, "cpu")), env_steps=16)
    assert rate > 0 and np.isfinite(rate)


def test_run_refuses_a_bad_number_of_steps() -> None:
    with pytest.raises(ValueError, match="env_steps must be >= 1"):
        small_dqn().run(Candidate(ReplayConfig("native", 1, "host")), env_steps=0)
    with pytest.raises(TypeError, match="env_steps must be an integer"):
        small_dqn().run(Candidate(ReplayConfig("native", 1, "host")), env_steps=10.0)


def test_the_algorithm_classes_are_the_per_ones() -> None:
    from hetero_replay.adapters.sb3 import PERDDPG, PERTD3
    from hetero_replay.adapters.sb3.workload import ALGORITHMS

    assert ALGORITHMS == {"dqn": PERDQN, "ddpg": PERDDPG, "td3": PERTD3, "sac": PERSAC}
