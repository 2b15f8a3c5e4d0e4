"""The SB3 buffers where SB3's own buffer tests look: what SB3 stores, our buffers store alike.

These are the behaviours SB3's ``tests/test_buffers.py`` and off-policy
``test_save_load.py`` check, written for our buffers (SB3's tests themselves
run against them outside this repository, see the report of issue 10):
the inputs SB3 and its tests pass, the dtypes it keeps, and what survives
``save_replay_buffer`` / ``load_replay_buffer`` (a pickle round trip).
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch as th
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from stable_baselines3 import DQN  # noqa: E402
from stable_baselines3.common.buffers import ReplayBuffer  # noqa: E402

from hetero_replay.adapters.sb3 import DictPrioritizedReplayBuffer, PrioritizedReplayBuffer  # noqa: E402

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)


def chain(buf: PrioritizedReplayBuffer, rows: int) -> None:
    """Add ``rows`` steps of one trajectory per env: obs of step t is t (+ env/4), next obs t + 1."""
    n = buf.n_envs
    for t in range(rows):
        obs = np.repeat((t + np.arange(n) / 4)[:, None], 4, axis=1).astype(np.float32)
        buf.add(obs, obs + 1, np.zeros(n, np.int64), np.full(n, t), np.zeros(n), [{}] * n)


@pytest.mark.parametrize("n_envs", [1, 3])
def test_a_pickle_round_trip_with_optimize_memory_usage_keeps_the_newest_next_observation(n_envs: int) -> None:
    # Stock SB3 pickles its whole arrays, the row holding the newest next observations included.
    buf = PrioritizedReplayBuffer(
        64 * n_envs, OBS, spaces.Discrete(2), device="cpu", n_envs=n_envs, optimize_memory_usage=True,
        handle_timeout_termination=False, seed=0,
    )  # fmt: skip
    chain(buf, 10)
    assert not buf.full
    loaded = pickle.loads(pickle.dumps(buf))
    np.testing.assert_array_equal(loaded.observations[: buf.pos + 1], buf.observations[: buf.pos + 1])
    np.testing.assert_array_equal(loaded.observations[buf.pos, :, 0], 10 + np.arange(n_envs) / 4)
    # once the next step is added, the last step's next observations are sampled from that row
    for b in (buf, loaded):
        b.add(b.observations[b.pos], b.observations[b.pos] + 1, np.zeros(n_envs, np.int64), np.full(n_envs, 10),
              np.zeros(n_envs), [{}] * n_envs)  # fmt: skip
        step_10_only = np.r_[np.zeros(10 * n_envs), np.ones(n_envs)]
        b.update_priorities(np.arange(11 * n_envs), step_10_only)
    a, b = buf.sample(32), loaded.sample(32)
    np.testing.assert_array_equal(a.indices, b.indices)
    assert th.equal(a.next_observations, b.next_observations)
    np.testing.assert_array_equal(b.next_observations.numpy()[:, 0], 11 + b.indices % n_envs / 4)


def test_save_and_load_replay_buffer_of_a_stock_algorithm_with_optimize_memory_usage(tmp_path) -> None:
    model = DQN(
        "MlpPolicy", "CartPole-v1", buffer_size=500, learning_starts=1000, optimize_memory_usage=True,
        replay_buffer_class=PrioritizedReplayBuffer, replay_buffer_kwargs=dict(handle_timeout_termination=False),
        policy_kwargs=dict(net_arch=[8]), device="cpu", seed=0,
    )  # fmt: skip
    model.learn(120)
    buf = model.replay_buffer
    model.save_replay_buffer(tmp_path / "buffer")
    model.load_replay_buffer(tmp_path / "buffer")
    assert model.replay_buffer is not buf
    np.testing.assert_array_equal(model.replay_buffer.observations, buf.observations)
    assert model.replay_buffer.observations[buf.pos].any()  # the newest next observation, not zeros


@pytest.mark.parametrize(
    ("action_space", "action"),
    [
        (spaces.Box(1, 5, (1,), np.float32), np.array([3.0], np.float32)),  # action_space.sample(), one env
        (spaces.Box(1, 5, (10, 7), np.float32), np.full((10, 7), 2.0, np.float32)),
        (spaces.Discrete(10), np.int64(7)),
        (spaces.Discrete(10), np.array([7])),
        (spaces.MultiDiscrete([3, 4]), np.array([2, 3])),
    ],
)
def test_one_env_takes_actions_without_the_env_axis_as_sb3_reshapes_them(action_space, action) -> None:
    buf = PrioritizedReplayBuffer(16, OBS, action_space, device="cpu", seed=0)
    buf.add(np.ones((1, 4)), np.ones((1, 4)), action, np.ones(1), np.zeros(1), [{}])
    np.testing.assert_array_equal(buf.actions[0, 0], np.reshape(action, -1))
    assert buf.actions.shape == (16, 1, buf.action_dim)


def test_discrete_observations_as_a_vec_env_gives_them() -> None:
    buf = PrioritizedReplayBuffer(16, spaces.Discrete(5), spaces.Discrete(2), device="cpu", n_envs=3, seed=0)
    buf.add(np.array([0, 3, 4]), np.array([[1], [4], [0]]), np.array([0, 1, 1]), np.ones(3), np.zeros(3), [{}] * 3)
    np.testing.assert_array_equal(buf.observations[0, :, 0], [0, 3, 4])
    np.testing.assert_array_equal(buf.next_observations[0, :, 0], [1, 4, 0])


def test_extend_with_the_flags_sb3_tests_pass() -> None:
    # SB3's test_save_load_replay_buffer extends a buffer with its own arrays, row by row,
    # with infos whose TimeLimit.truncated are one-element arrays.
    buf = PrioritizedReplayBuffer(16, OBS, spaces.Discrete(2), device="cpu", seed=0)
    rows = np.arange(4, dtype=np.float32)
    obs = np.repeat(rows[:, None, None], 4, axis=2)  # (rows, n_envs=1, 4)
    timeouts = np.array([[0.0], [1.0], [0.0], [1.0]])
    infos = [[{"TimeLimit.truncated": flag}] for flag in timeouts]
    buf.extend(obs, obs + 1, np.zeros((4, 1, 1), np.int64), rows[:, None], np.ones((4, 1)), infos)
    assert buf.size() == 4
    np.testing.assert_array_equal(buf.timeouts[:4], timeouts)
    np.testing.assert_array_equal(buf.observations[:4], obs)


OBS_DTYPES = [np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64, np.int64, np.float16,
              np.float32, np.float64]  # fmt: skip
ACTION_SPACES = [
    spaces.Discrete(10),
    spaces.Box(low=-1.0, high=1.0, dtype=np.float32),
    spaces.Box(low=-1.0, high=1.0, dtype=np.float64),
]


@pytest.mark.parametrize("obs_dtype", OBS_DTYPES, ids=[np.dtype(d).name for d in OBS_DTYPES])
@pytest.mark.parametrize("use_dict", [False, True], ids=["plain", "dict"])
@pytest.mark.parametrize("action_space", ACTION_SPACES, ids=["discrete", "box32", "box64"])
def test_stored_and_sampled_dtypes_are_sb3s(obs_dtype, use_dict: bool, action_space: spaces.Space) -> None:
    obs_space = spaces.Box(0, 100, dtype=obs_dtype)
    action_dtype = ReplayBuffer._maybe_cast_dtype(action_space.dtype)  # float64 actions are stored as float32
    obs = np.full((1, 1), 7, obs_dtype)  # one env, space shape (1,)
    action = action_space.sample()
    if use_dict:
        obs_space = spaces.Dict({"obs": obs_space, "obs_2": spaces.Box(0, 100, dtype=np.uint8)})
        buf = DictPrioritizedReplayBuffer(4, obs_space, action_space, device="cpu", seed=0)
        obs = {"obs": obs, "obs_2": np.full((1, 1), 9, np.uint8)}
    else:
        buf = PrioritizedReplayBuffer(4, obs_space, action_space, device="cpu", seed=0)
    buf.add(obs, obs, action, np.ones(1), np.zeros(1), [{}])
    stored, sampled = buf.observations, buf.sample(8)
    assert buf.actions.dtype == action_dtype and sampled.actions.numpy().dtype == action_dtype
    if use_dict:
        assert stored["obs"].dtype == obs_dtype and stored["obs_2"].dtype == np.uint8
        assert sampled.observations["obs"].numpy().dtype == obs_dtype
        assert sampled.observations["obs_2"].numpy().dtype == np.uint8
        assert (sampled.observations["obs"] == 7).all() and (sampled.next_observations["obs_2"] == 9).all()
    else:
        assert stored.dtype == obs_dtype and sampled.observations.numpy().dtype == obs_dtype
        assert (sampled.observations == 7).all()


def test_setting_full_by_hand_never_makes_unwritten_slots_sampleable() -> None:
    # SB3's test_buffer_dtypes samples an empty buffer after `buffer.full = True` (getting
    # zeros); ours samples only what was written, so it refuses.
    buf = PrioritizedReplayBuffer(4, OBS, spaces.Discrete(2), device="cpu", seed=0)
    buf.full = True
    with pytest.raises(ValueError, match="empty buffer"):
        buf.sample(8)
    buf.full = False
    chain(buf, 1)
    buf.full = True
    assert (buf.sample(64).indices == 0).all()


def test_deepcopy_is_an_independent_buffer() -> None:
    # SB3's test_save_load_replay_buffer compares the loaded buffer with a deepcopy taken before saving.
    buf = PrioritizedReplayBuffer(32, OBS, spaces.Discrete(2), device="cpu", n_envs=2, seed=0)
    chain(buf, 5)
    twin = copy.deepcopy(buf)
    chain(buf, 2)
    assert twin.size() == 5 and buf.size() == 7
    np.testing.assert_array_equal(twin.observations[:5], buf.observations[:5])
    twin_of_twin = copy.deepcopy(twin)  # the random state is copied too
    np.testing.assert_array_equal(twin.sample(16).indices, twin_of_twin.sample(16).indices)
