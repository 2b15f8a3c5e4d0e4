"""The SB3 prioritized buffers: SB3's buffer contract, the PER rules, and bad input.

Transitions are written with values that encode their flat index
``k = row * n_envs + env``, so every sampled field can be checked against the
index the buffer reports for it.
"""

from __future__ import annotations

import pickle
import warnings

import numpy as np
import pytest
import torch as th
from gymnasium import spaces

pytest.importorskip("stable_baselines3")

from stable_baselines3.common.type_aliases import ReplayBufferSamples  # noqa: E402
from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize  # noqa: E402

from hetero_replay import PEROptions  # noqa: E402
from hetero_replay.adapters.sb3 import DictPrioritizedReplayBuffer, PrioritizedReplayBuffer  # noqa: E402
from hetero_replay.adapters.sb3.buffers import WARN_AFTER_SAMPLES  # noqa: E402

OBS = spaces.Box(-np.inf, np.inf, (4,), np.float32)
ACT = spaces.Discrete(2)


def obs_of(k: np.ndarray) -> np.ndarray:
    return np.stack([k, k + 0.25, k + 0.5, k + 0.75], axis=-1).astype(np.float32)


def done_of(k: np.ndarray) -> np.ndarray:
    return k % 3 == 0


def timeout_of(k: np.ndarray) -> np.ndarray:
    return k % 5 == 0


def add_row(buf: PrioritizedReplayBuffer, row: int) -> None:
    """Row ``row`` of transitions k = row * n_envs + env (next obs = obs(k) + 1000)."""
    k = row * buf.n_envs + np.arange(buf.n_envs)
    infos = [{"TimeLimit.truncated": bool(t)} for t in timeout_of(k)]
    buf.add(obs_of(k), obs_of(k) + 1000, k % 2, k.astype(np.float32), done_of(k), infos)


def make(n_envs: int = 1, size: int = 64, **kwargs) -> PrioritizedReplayBuffer:
    return PrioritizedReplayBuffer(size, OBS, ACT, device="cpu", n_envs=n_envs, seed=0, **kwargs)


@pytest.mark.parametrize("n_envs", [1, 4])
def test_sample_has_sb3_fields_dtypes_and_consistent_rows(n_envs: int) -> None:
    buf = make(n_envs)
    for row in range(10):
        add_row(buf, row)
    s = buf.sample(32)
    assert s._fields[:6] == ReplayBufferSamples._fields
    assert s._fields[6:] == ("weights", "indices")
    assert buf.size() == 10 and s.discounts is None
    for t, dtype, shape in [
        (s.observations, th.float32, (32, 4)),
        (s.actions, th.int64, (32, 1)),
        (s.next_observations, th.float32, (32, 4)),
        (s.dones, th.float32, (32, 1)),
        (s.rewards, th.float32, (32, 1)),
        (s.weights, th.float32, (32, 1)),
    ]:
        assert t.dtype == dtype and tuple(t.shape) == shape and t.device == buf.device
    k = s.indices
    assert s.indices.dtype == np.int64 and k.min() >= 0 and k.max() < 10 * n_envs
    np.testing.assert_array_equal(s.observations.numpy(), obs_of(k))
    np.testing.assert_array_equal(s.next_observations.numpy(), obs_of(k) + 1000)
    np.testing.assert_array_equal(s.actions.numpy()[:, 0], k % 2)
    np.testing.assert_array_equal(s.rewards.numpy()[:, 0], k)
    # as in SB3: a time-limit truncation is not a termination
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], done_of(k) & ~timeout_of(k))
    np.testing.assert_array_equal(s.weights.numpy(), 1.0)  # all priorities equal


def test_sampling_reaches_every_row_and_env() -> None:
    buf = make(n_envs=4)
    for row in range(5):
        add_row(buf, row)
    seen = np.concatenate([buf.sample(64).indices for _ in range(20)])
    assert set(seen.tolist()) == set(range(20))


def test_without_timeout_handling_dones_are_raw() -> None:
    buf = make(handle_timeout_termination=False)
    for row in range(15):
        add_row(buf, row)
    s = buf.sample(64)
    np.testing.assert_array_equal(s.dones.numpy()[:, 0], done_of(s.indices))


def test_continuous_actions_and_discrete_observations() -> None:
    act = spaces.Box(-1, 1, (2,), np.float64)  # SB3 stores float64 actions as float32
    buf = PrioritizedReplayBuffer(16, spaces.Discrete(5), act, device="cpu", n_envs=2, seed=0)
    for row in range(3):
        buf.add(
            np.array([row, 4 - row]),
            np.array([row + 1, 3 - row]),
            np.full((2, 2), row / 4),
            np.ones(2),
            np.zeros(2),
            [{}, {}],
        )
    s = buf.sample(16)
    assert s.observations.shape == (16, 1) and s.observations.dtype == th.int64
    assert s.actions.shape == (16, 2) and s.actions.dtype == th.float32
    row, env = s.indices // 2, s.indices % 2
    np.testing.assert_array_equal(s.observations.numpy()[:, 0], np.where(env == 0, row, 4 - row))
    np.testing.assert_allclose(s.actions.numpy(), np.repeat((row / 4)[:, None], 2, axis=1))


def test_arrays_are_views_into_the_core_storage_and_writes_go_through() -> None:
    buf = make(n_envs=2)
    for row in range(3):
        add_row(buf, row)  # still staged: reading a view hands them to the core first
    assert not any(name in vars(buf) for name in ("observations", "next_observations", "actions", "rewards"))
    assert buf.observations.shape == (32, 2, 4) and buf.dones.shape == (32, 2)
    np.testing.assert_array_equal(buf.rewards[:3], [[0, 1], [2, 3], [4, 5]])
    # what SB3's _setup_learn does to cut the last episode of an optimized buffer
    buf.dones[2, 0] = True  # transition k = 4: not done, not a timeout when added
    buf.update_priorities(np.arange(6), np.array([0, 0, 0, 0, 100.0, 0]))  # make it dominate
    s = buf.sample(64)
    assert np.sum(s.indices == 4) > 50 and np.all(s.dones.numpy()[s.indices == 4] == 1.0)


def test_update_priorities_sets_exact_priorities_and_is_weights() -> None:
    buf = make(alpha=0.5, beta=1.0, eps=0.0)
    for row in range(4):
        add_row(buf, row)
    buf.update_priorities(np.arange(4), th.tensor([[0.25], [-1.0], [4.0], [9.0]]))  # signed, as a tensor
    np.testing.assert_allclose(buf.priorities()[:4, 0], [0.5, 1.0, 2.0, 3.0])
    assert buf.max_priority == pytest.approx(9.0)
    s = buf.sample(6000)
    freq = np.bincount(s.indices, minlength=4) / 6000
    np.testing.assert_allclose(freq, np.array([0.5, 1, 2, 3]) / 6.5, atol=0.01)
    # w_i = (N P(i))^-beta / max_j w_j = (p_min / p_i)^beta
    np.testing.assert_allclose(s.weights.numpy()[:, 0], 0.5 / np.array([0.5, 1, 2, 3])[s.indices], rtol=1e-6)
    add_row(buf, 4)  # new transitions get the largest priority seen so far
    assert buf.priorities()[4, 0] == pytest.approx(3.0)
    # integers and booleans too; the magnitude of the most negative int64 does not wrap
    buf.update_priorities(np.arange(3), np.array([np.iinfo(np.int64).min, -4, 1]))
    np.testing.assert_allclose(buf.priorities()[:3, 0], [2.0**31.5, 2.0, 1.0])
    buf.update_priorities(np.arange(2), np.array([True, False]))
    np.testing.assert_allclose(buf.priorities()[:2, 0], [1.0, 0.0])


def test_beta_controls_the_weights() -> None:
    buf = make(alpha=1.0, eps=0.0)
    for row in range(2):
        add_row(buf, row)
    buf.update_priorities(np.arange(2), np.array([1.0, 4.0]))
    buf.beta = 0.5
    s = buf.sample(64)
    np.testing.assert_allclose(s.weights.numpy()[:, 0], np.where(s.indices == 0, 1.0, 0.5), rtol=1e-6)


def test_optimize_memory_usage_reads_next_obs_from_the_next_row() -> None:
    buf = make(n_envs=2, size=8, optimize_memory_usage=True, handle_timeout_termination=False)  # 4 rows
    row_obs = lambda row, env: obs_of(row * 10 + env)  # noqa: E731
    for row in range(6):  # wraps: rows 4, 5 overwrite rows 0, 1
        envs = np.arange(2)
        action, reward = np.zeros(2, np.int64), np.full(2, row, np.float32)
        buf.add(row_obs(row, envs), row_obs(row + 1, envs), action, reward, np.zeros(2), [{}, {}])
    assert buf.full and buf.pos == 2
    s = buf.sample(256)
    added_as = s.rewards.numpy()[:, 0].astype(int)  # the row number the transition was added as
    env = s.indices % 2
    assert set((s.indices // 2).tolist()) == {0, 1, 3} and set(added_as.tolist()) == {3, 4, 5}
    np.testing.assert_array_equal(s.observations.numpy(), row_obs(added_as, env))
    np.testing.assert_array_equal(s.next_observations.numpy(), row_obs(added_as + 1, env))


def test_optimize_memory_usage_never_samples_the_slot_without_a_next_obs() -> None:
    buf = make(n_envs=2, size=8, optimize_memory_usage=True, handle_timeout_termination=False)
    for row in range(5):
        add_row(buf, row)
    pos = buf.pos  # its observations are the newest next obs; its transitions are stale
    assert buf.full and pos == 1
    prios = buf.priorities()
    np.testing.assert_array_equal(prios[pos], 0.0)
    assert np.all(np.delete(prios, pos, axis=0) > 0)
    assert not np.any(np.concatenate([buf.sample(128).indices for _ in range(10)]) // 2 == pos)
    # indices sampled before the row became invalid: their update must not revive it
    stale = np.array([2 * (pos + 1), 2 * (pos + 1) + 1, 0])
    add_row(buf, 5)
    assert buf.pos == pos + 1
    buf.update_priorities(stale, np.array([5.0, 5.0, 5.0]))
    np.testing.assert_array_equal(buf.priorities()[pos + 1], 0.0)
    assert buf.priorities()[0, 0] == pytest.approx((5.0 + 1e-6) ** 0.6)
    assert not np.any(np.concatenate([buf.sample(128).indices for _ in range(10)]) // 2 == pos + 1)


def test_dict_observations() -> None:
    obs_space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "cell": spaces.Discrete(5)})
    buf = DictPrioritizedReplayBuffer(32, obs_space, spaces.Discrete(3), device="cpu", n_envs=2, seed=0)
    for row in range(4):
        k = row * 2 + np.arange(2)
        obs = {"pos": np.stack([k, -k], 1) / 10, "cell": k % 5}
        nxt = {"pos": np.stack([k, -k], 1) / 10 + 0.05, "cell": (k + 1) % 5}
        buf.add(obs, nxt, k % 3, k.astype(np.float32), np.zeros(2), [{}, {}])
    s = buf.sample(32)
    k = s.indices
    assert set(s.observations) == {"pos", "cell"} and set(s.next_observations) == {"pos", "cell"}
    assert s.observations["pos"].dtype == th.float32 and s.observations["cell"].dtype == th.int64
    assert s.observations["cell"].shape == (32, 1)
    np.testing.assert_allclose(s.observations["pos"].numpy(), np.stack([k, -k], 1) / 10, rtol=1e-6)
    np.testing.assert_array_equal(s.next_observations["cell"].numpy()[:, 0], (k + 1) % 5)
    np.testing.assert_array_equal(s.actions.numpy()[:, 0], k % 3)
    assert buf.observations["pos"].shape == (16, 2, 2)


def test_vec_normalize_is_applied_to_sampled_observations_and_rewards() -> None:
    import gymnasium as gym

    venv = VecNormalize(DummyVecEnv([lambda: gym.make("CartPole-v1")]), gamma=0.9)
    venv.obs_rms.mean[:] = 1.0
    venv.ret_rms.var = np.float64(4.0)
    buf = make()
    for row in range(3):
        add_row(buf, row)
    s = buf.sample(8, env=venv)
    k = s.indices
    np.testing.assert_allclose(s.observations.numpy(), (obs_of(k) - 1.0) / np.sqrt(1 + 1e-8), rtol=1e-5)
    np.testing.assert_allclose(s.rewards.numpy()[:, 0], k / np.sqrt(4.0 + 1e-8), rtol=1e-5)


def test_pickle_round_trip_keeps_data_priorities_and_random_state() -> None:
    buf = make(n_envs=2)
    for row in range(6):
        add_row(buf, row)
    buf.update_priorities(np.arange(12), np.linspace(0.1, 3.0, 12))
    add_row(buf, 6)  # staged when pickled
    copy = pickle.loads(pickle.dumps(buf))
    np.testing.assert_array_equal(copy.priorities(), buf.priorities())
    np.testing.assert_array_equal(copy.observations, buf.observations)
    assert copy.max_priority == buf.max_priority and copy.pos == buf.pos == 7
    a, b = buf.sample(16), copy.sample(16)
    np.testing.assert_array_equal(a.indices, b.indices)
    np.testing.assert_array_equal(a.weights.numpy(), b.weights.numpy())
    add_row(copy, 7)
    assert copy.sample(64).indices.max() <= 15


def test_reset_empties_the_buffer() -> None:
    buf = make()
    for row in range(3):
        add_row(buf, row)
    buf.update_priorities(np.arange(3), np.array([5.0, 1.0, 1.0]))
    buf.reset()
    assert buf.size() == 0 and buf.max_priority == 1.0
    with pytest.raises(ValueError, match="empty"):
        buf.sample(4)
    add_row(buf, 0)
    assert buf.sample(4).indices.tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(alpha=-0.1), "alpha"),
        (dict(beta=1.5), "beta"),
        (dict(beta=-0.1), "beta"),
        (dict(eps=-1.0), "eps"),
        (dict(tree="no-such-backend"), "unknown tree backend"),
        (dict(fanout=3), "fanout"),
        (dict(optimize_memory_usage=True), "handle_timeout_termination"),
        (dict(weight_norm="max"), "weight_norm must be 'global' or 'batch', got 'max'"),
        (dict(weight_norm=True), "weight_norm must be 'global' or 'batch', got True"),
    ],
)
def test_bad_arguments_raise_clear_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make(**kwargs)


@pytest.mark.parametrize("staleness", [0, 1])
def test_weight_norm_batch_divides_by_the_batch_maximum(staleness: int) -> None:
    """``weight_norm="batch"``: each batch's largest weight is 1, the ratios are the global rule's, and the draws
    are the same (the same seed samples the same transitions); also through the relaxed pipeline."""
    buffers = {norm: make(weight_norm=norm, staleness=staleness) for norm in ("global", "batch")}
    for buf in buffers.values():
        for row in range(40):
            add_row(buf, row)
        buf.update_priorities(np.arange(40), np.linspace(0.01, 4.0, 40))
    assert buffers["batch"].weight_norm == "batch" and make().weight_norm == "global"
    batch_means, glob_maxima = [], []
    for _ in range(6):
        glob, batch = (buffers[norm].sample(16) for norm in ("global", "batch"))
        np.testing.assert_array_equal(glob.indices, batch.indices)
        assert batch.weights.max().item() == 1.0
        glob_maxima.append(glob.weights.max().item())
        np.testing.assert_allclose(batch.weights.numpy(), (glob.weights / glob.weights.max()).numpy(), rtol=1e-6)
        batch_means.append(batch.weights.mean().item())
        for buf, s in zip(buffers.values(), (glob, batch)):
            buf.update_priorities(s.indices, np.linspace(0.01, 4.0, 16))
    assert min(glob_maxima) < 0.5  # the global rule's largest weight (the rarest slot's) was not drawn: they differ
    # The logged mean weight is of the weights the learner got.
    assert buffers["batch"].take_mean_weight() == pytest.approx(np.mean(batch_means), rel=1e-6)


@pytest.mark.filterwarnings("ignore:.*without update_priorities")  # 500 samples, no update: on purpose
def test_the_logged_mean_weight_is_one_running_float64_sum() -> None:
    buf = make()
    for row in range(40):
        add_row(buf, row)
    buf.update_priorities(np.arange(40), np.linspace(0.01, 4.0, 40))
    # small batches are summed as lists (exactly), large ones by NumPy: the same running sum
    weights = [buf.sample(16 if i % 50 else 2048).weights.numpy() for i in range(500)]
    assert np.ndim(buf._weight_sum) == 0  # one number however many batches: SB3 reads it only at log dumps
    assert buf.take_mean_weight() == pytest.approx(np.concatenate(weights).astype(np.float64).mean(), rel=1e-12)
    assert np.isnan(buf.take_mean_weight())  # nothing sampled since


def test_a_buffer_pickled_with_a_list_of_weight_sums_loads() -> None:
    """SB3's ``save_replay_buffer`` files of the version that kept each batch's IS-weight sum in a list."""
    buf = make()
    for row in range(8):
        add_row(buf, row)
    state = buf.__getstate__()
    state["_weight_sums"], state["_weights_sampled"] = [np.float32(1.5), np.float32(2.5)], 4
    del state["_weight_sum"]
    old = PrioritizedReplayBuffer.__new__(PrioritizedReplayBuffer)
    old.__setstate__(state)
    assert old.take_mean_weight() == 1.0
    old.sample(4)
    assert 0 < old.take_mean_weight() <= 1


def test_a_refused_weight_norm_builds_nothing() -> None:
    """The check runs before anything is built or drawn: NumPy's global generator (the seed source) is untouched."""
    np.random.seed(5)
    with pytest.raises(ValueError, match="weight_norm"):
        PrioritizedReplayBuffer(8, OBS, ACT, device="cpu", weight_norm="Batch")
    assert np.random.randint(2**31 - 1) == np.random.RandomState(5).randint(2**31 - 1)


def test_per_options_come_from_peroptions() -> None:
    """Defaults are PEROptions'; ``options=`` sets them at once; keyword arguments given override its fields."""
    assert make().replay.options == PEROptions()
    options = PEROptions(
        alpha=0.3, beta=0.9, eps=1e-3, tree="numpy", fanout=4, priority_dtype="float64", stratified=False
    )
    buf = make(options=options)
    assert buf.replay.options == options and (buf.alpha, buf.beta) == (0.3, 0.9)
    assert make(alpha=0.5, options=options).replay.options == options.replace(alpha=0.5)
    dict_buf = DictPrioritizedReplayBuffer(8, spaces.Dict({"x": OBS}), ACT, device="cpu", options=options, beta=0.1)
    assert dict_buf.replay.options == options.replace(beta=0.1)
    with pytest.raises(TypeError, match="options must be a PEROptions"):
        make(options=dict(alpha=0.5))


def test_dict_buffer_rejects_what_it_cannot_store() -> None:
    with pytest.raises(ValueError, match="Dict observation space"):
        DictPrioritizedReplayBuffer(8, OBS, ACT)
    dict_space = spaces.Dict({"x": OBS})
    with pytest.raises(ValueError, match="stores array observations.*use DictPrioritizedReplayBuffer"):
        PrioritizedReplayBuffer(8, dict_space, ACT)
    with pytest.raises(ValueError, match="optimize_memory_usage"):
        DictPrioritizedReplayBuffer(8, dict_space, ACT, optimize_memory_usage=True, handle_timeout_termination=False)


def test_bad_updates_raise_and_change_nothing() -> None:
    buf = make()
    for row in range(4):
        add_row(buf, row)
    buf.update_priorities(np.arange(4), np.array([1.0, 2.0, 3.0, 4.0]))
    before, beta = buf.priorities().copy(), buf.beta
    with pytest.raises(ValueError, match="2"):  # names the position of the NaN
        buf.update_priorities(np.arange(4), np.array([1.0, 1.0, np.nan, 1.0]))
    with pytest.raises(IndexError):
        buf.update_priorities(np.array([0, 4]), np.array([1.0, 1.0]))  # 4 is not filled yet
    with pytest.raises(ValueError):
        buf.update_priorities(np.arange(4), np.ones(3))
    with pytest.raises(ValueError, match="beta"):
        buf.beta = 1.01
    np.testing.assert_array_equal(buf.priorities(), before)
    assert buf.beta == beta


def test_warns_once_when_priorities_are_never_updated() -> None:
    buf = make()
    add_row(buf, 0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(WARN_AFTER_SAMPLES - 1):
            buf.sample(2)
        assert not caught
        buf.sample(2)
        assert len(caught) == 1 and "update_priorities" in str(caught[0].message)
        for _ in range(WARN_AFTER_SAMPLES + 1):
            buf.sample(2)
        assert len(caught) == 1
