"""The Tianshou prioritized buffers: Tianshou's buffer contract, the PER rules, state, and bad input.

Transitions are written with values that encode which env and step they come
from (``k = 1000 * env + step``), so every sampled field can be checked
against the index the buffer reports for it.
"""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from scipy import stats

pytest.importorskip("tianshou")

import gymnasium as gym  # noqa: E402
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy  # noqa: E402
from tianshou.data import (  # noqa: E402
    Batch,
    Collector,
    PrioritizedReplayBuffer,
    PrioritizedVectorReplayBuffer,
    ReplayBuffer,
    ReplayBufferManager,
    VectorReplayBuffer,
)
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.utils.net.common import Net  # noqa: E402

from hetero_replay import DEFAULT_EPS, PEROptions  # noqa: E402
from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
)

BACKENDS = ["native", "numpy"]


def obs_of(k: np.ndarray) -> np.ndarray:
    return np.stack([k, k + 0.25, k + 0.5, k + 0.75], axis=-1).astype(np.float32)


def add_step(buf: ReplayBuffer, step: int, envs: int) -> np.ndarray:
    """One transition per env; transition (env, step) has ``k = 1000 * env + step``. Returns the indices."""
    k = 1000 * np.arange(envs) + step
    batch = Batch(obs=obs_of(k), act=k % 2, rew=k.astype(np.float64), terminated=k % 7 == 6,
                  truncated=np.zeros(envs, bool), obs_next=obs_of(k) + 0.5, info=Batch(k=k))  # fmt: skip
    ptr, *_ = buf.add(batch, buffer_ids=np.arange(envs))
    return ptr


def make_vector(size: int = 400, envs: int = 4, steps: int = 30, **kwargs) -> HeteroPrioritizedVectorReplayBuffer:
    buf = HeteroPrioritizedVectorReplayBuffer(size, envs, random_seed=0, **kwargs)
    for step in range(steps):
        add_step(buf, step, envs)
    return buf


def k_of(buf: HeteroPrioritizedVectorReplayBuffer, indices: np.ndarray) -> np.ndarray:
    """The ``k`` stored at global ``indices`` (sub-buffers of ``maxsize // buffer_num``, no wrap-around)."""
    size = buf.maxsize // buf.buffer_num
    return 1000 * (indices // size) + indices % size


def set_priorities(buf: HeteroPrioritizedVectorReplayBuffer, td: np.ndarray) -> np.ndarray:
    """Feed back ``td`` for every stored transition; returns their indices."""
    stored = np.sort(buf.sample_indices(0))
    buf.update_weight(stored, td)
    return stored


# -- Tianshou's contract -------------------------------------------------------------------


def test_vector_buffer_is_a_tianshou_prioritized_vector_buffer() -> None:
    buf = make_vector()
    assert isinstance(buf, PrioritizedVectorReplayBuffer)
    assert isinstance(buf, PrioritizedReplayBuffer) and isinstance(buf, ReplayBufferManager)
    assert buf.buffer_num == 4 and buf.maxsize == 400 and len(buf) == 120
    assert "weight" not in vars(buf)  # no throw-away SegmentTree was built (buf.weight is a view of the tree)
    assert all(
        isinstance(child, ReplayBuffer) and not isinstance(child, PrioritizedReplayBuffer) for child in buf.buffers
    )


def test_sample_returns_tianshou_fields_consistent_with_indices() -> None:
    buf = make_vector()
    batch, indices = buf.sample(64)
    assert indices.dtype.kind == "i" and indices.shape == (64,)
    assert set(batch.get_keys()) >= {
        "obs",
        "act",
        "rew",
        "terminated",
        "truncated",
        "done",
        "obs_next",
        "info",
        "weight",
    }
    k = k_of(buf, indices)
    np.testing.assert_array_equal(batch.obs, obs_of(k))
    np.testing.assert_array_equal(batch.obs_next, obs_of(k) + 0.5)
    np.testing.assert_array_equal(batch.act, k % 2)
    np.testing.assert_array_equal(batch.rew, k)
    np.testing.assert_array_equal(batch.done, k % 7 == 6)
    np.testing.assert_array_equal(batch.info.k, k)
    assert batch.weight.shape == (64,) and batch.weight.dtype == np.float32
    # __getitem__ gives the same rows and the same IS weights as sampling them
    again = buf[indices]
    np.testing.assert_array_equal(again.obs, batch.obs)
    np.testing.assert_allclose(again.weight, batch.weight, rtol=1e-6)


def test_sample_zero_slice_and_scalar_indexing() -> None:
    buf = make_vector(steps=5)
    everything, indices = buf.sample(0)
    assert len(everything) == 20 and sorted(k_of(buf, indices)) == sorted(k_of(buf, buf.sample_indices(0)))
    assert len(buf[:]) == 20 and np.all(buf[:].weight == 1.0)  # all priorities equal
    one = buf[int(indices[3])]
    assert one.rew == k_of(buf, indices[3]) and np.ndim(one.weight) == 0 and one.weight == 1.0


def test_add_gives_every_env_the_max_priority_in_one_call() -> None:
    buf = make_vector(steps=3)
    leaves = buf.priority_tree.leaves()
    stored = np.sort(buf.sample_indices(0))
    np.testing.assert_array_equal(leaves[stored], 1.0)
    assert np.count_nonzero(leaves) == 12
    buf.update_weight(stored[:2], np.array([3.0, -8.0]))  # signed TD errors: magnitudes count
    new = add_step(buf, 3, 4)
    np.testing.assert_allclose(buf.priority_tree.get(new), (8.0 + DEFAULT_EPS) ** 0.6, rtol=1e-6)
    assert buf.max_priority == pytest.approx(8.0 + DEFAULT_EPS)


def test_collector_fills_the_buffer_like_tianshous_own() -> None:
    """A greedy policy collects identical data (and episode stats) into both buffers."""
    env = gym.make("CartPole-v1")
    torch.manual_seed(0)
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[16]),
                                     action_space=env.action_space)  # fmt: skip
    results = []
    for buf in (
        PrioritizedVectorReplayBuffer(600, 3, alpha=0.6, beta=0.4),
        HeteroPrioritizedVectorReplayBuffer(600, 3),
    ):
        envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
        envs.seed(0)
        collector = Collector(policy, envs, buf)
        collector.reset()
        collect_stats = collector.collect(n_step=150)
        results.append((buf, collect_stats))
    (stock, stock_stats), (ours, our_stats) = results
    assert len(ours) == len(stock) == 150
    assert our_stats.n_collected_episodes == stock_stats.n_collected_episodes > 0
    np.testing.assert_array_equal(our_stats.returns, stock_stats.returns)
    for key in ("obs", "act", "rew", "done", "obs_next"):
        np.testing.assert_array_equal(ours._meta[key], stock._meta[key])
    np.testing.assert_array_equal(ours.unfinished_index(), stock.unfinished_index())
    # sampled rows are what Tianshou's own indexing returns for those indices
    batch, indices = ours.sample(32)
    del batch.weight
    assert batch == ReplayBuffer.__getitem__(stock, indices)
    # every stored transition, and nothing else, has the initial priority
    leaves = ours.priority_tree.leaves()
    np.testing.assert_array_equal(np.flatnonzero(leaves), np.sort(ours.sample_indices(0)))


def random_step(rng: np.random.Generator, ids: np.ndarray, reward_shape: tuple[int, ...] = ()) -> Batch:
    n = len(ids)
    return Batch(obs=rng.random((n, 3)), act=rng.integers(0, 4, n), rew=rng.random((n, *reward_shape)),
                 terminated=rng.random(n) < 0.15, truncated=rng.random(n) < 0.05, obs_next=rng.random((n, 3)),
                 info=Batch(env_id=ids.copy()))  # fmt: skip


def assert_same_bookkeeping(ours: HeteroPrioritizedVectorReplayBuffer, stock: ReplayBufferManager) -> None:
    np.testing.assert_array_equal(ours.last_index, stock.last_index)
    np.testing.assert_array_equal(ours._lengths, stock._lengths)
    for mine, theirs in zip(ours.buffers, stock.buffers):
        for name in ("_insertion_idx", "_size", "_ep_len", "_ep_start_idx", "last_index"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name), err_msg=name)
        np.testing.assert_allclose(mine._ep_return, theirs._ep_return, rtol=1e-12)
    np.testing.assert_array_equal(ours.unfinished_index(), stock.unfinished_index())
    stored = np.sort(stock.sample_indices(0))
    np.testing.assert_array_equal(np.sort(ours.sample_indices(0)), stored)
    np.testing.assert_array_equal(ours.next(stored), stock.next(stored))
    np.testing.assert_array_equal(ours.prev(stored), stock.prev(stored))


@pytest.mark.parametrize("reward_shape", [(), (2,)])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_add_matches_tianshous_add(seed: int, reward_shape: tuple[int, ...]) -> None:
    """Random subsets of envs, episode ends and wrap-around: same returns, rows and state as Tianshou's loop."""
    rng = np.random.default_rng(seed)
    ours, stock = HeteroPrioritizedVectorReplayBuffer(60, 5, random_seed=0), VectorReplayBuffer(60, 5)
    for step in range(80):
        ids = np.sort(rng.choice(5, size=int(rng.integers(1, 6)), replace=False))
        batch = random_step(rng, ids, reward_shape)
        got, want = ours.add(batch, buffer_ids=ids), stock.add(batch, buffer_ids=ids)
        for g, w, name in zip(got, want, ("indices", "returns", "lengths", "starts")):
            np.testing.assert_allclose(g, w, rtol=1e-12, err_msg=f"{name} at step {step}")
        if step % 20 == 19:
            assert_same_bookkeeping(ours, stock)
    for key in ("obs", "act", "rew", "terminated", "truncated", "done", "obs_next"):
        np.testing.assert_array_equal(ours._meta[key], stock._meta[key])
    np.testing.assert_array_equal(np.flatnonzero(ours.priority_tree.leaves()), np.sort(stock.sample_indices(0)))
    ours.reset(), stock.reset()
    assert_same_bookkeeping(ours, stock)
    ids = np.array([3, 1])  # unsorted ids
    batch = random_step(rng, ids, reward_shape)
    for g, w in zip(ours.add(batch, ids), stock.add(batch, ids)):
        np.testing.assert_allclose(g, w)
    assert_same_bookkeeping(ours, stock)


def test_add_with_an_env_twice_falls_back_to_tianshous_order() -> None:
    rng = np.random.default_rng(5)
    ours, stock = HeteroPrioritizedVectorReplayBuffer(40, 2, random_seed=0), VectorReplayBuffer(40, 2)
    for _ in range(6):
        batch = random_step(rng, np.array([0, 0, 1]))
        for g, w in zip(ours.add(batch, [0, 0, 1]), stock.add(batch, [0, 0, 1])):
            np.testing.assert_allclose(g, w)
    assert_same_bookkeeping(ours, stock)
    assert np.count_nonzero(ours.priority_tree.leaves()) == len(stock) == 18


def test_add_rejects_bad_buffer_ids_and_missing_keys_changing_nothing() -> None:
    buf = make_vector(steps=5)
    before = (buf.last_index.copy(), buf._lengths.copy(), buf._book.counters.copy(), buf.priority_tree.leaves())
    rows = buf._meta.obs.copy()
    step = random_step(np.random.default_rng(0), np.arange(4))
    step.obs, step.obs_next = obs_of(np.zeros(4)), obs_of(np.zeros(4))
    with pytest.raises(IndexError, match="buffer ids"):
        buf.add(step, buffer_ids=[0, 1, 2, 4])
    with pytest.raises(ValueError, match=r"3 buffer ids for a batch of shape \(4,\)"):
        buf.add(step, buffer_ids=[0, 1, 2])
    with pytest.raises(TypeError, match="integers"):
        buf.add(step, buffer_ids=[0.0, 1.0, 2.0, 3.0])
    del step.truncated
    with pytest.raises(ValueError, match="truncated"):
        buf.add(step)
    after = (buf.last_index, buf._lengths, buf._book.counters, buf.priority_tree.leaves())
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(buf._meta.obs, rows)


def test_frame_stacking_returns_stacked_observations() -> None:
    buf = make_vector(steps=10, stack_num=3)
    batch, indices = buf.sample(16)
    assert batch.obs.shape == (16, 3, 4)
    np.testing.assert_array_equal(batch.obs[:, -1], obs_of(k_of(buf, indices)))
    np.testing.assert_array_equal(batch.obs, ReplayBuffer.__getitem__(buf, indices).obs)


def test_collector_rejects_too_few_sub_buffers() -> None:
    env = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2), action_space=env.action_space)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    with pytest.raises(ValueError, match="buffers"):
        Collector(policy, envs, HeteroPrioritizedVectorReplayBuffer(100, 2))


def test_single_buffer_contract() -> None:
    buf = HeteroPrioritizedReplayBuffer(50, alpha=0.5, beta=0.4, random_seed=0)
    assert isinstance(buf, PrioritizedReplayBuffer) and not isinstance(buf, ReplayBufferManager)
    for step in range(60):  # wraps around
        add_step(buf, step, 1)
    assert len(buf) == 50 and np.count_nonzero(buf.priority_tree.leaves()) == 50
    batch, indices = buf.sample(16)
    np.testing.assert_array_equal(batch.rew, np.where(indices < 10, indices + 50, indices))
    buf.update_weight(indices, np.full(16, 3.0))
    np.testing.assert_allclose(buf.priority_tree.get(indices), (3.0 + DEFAULT_EPS) ** 0.5, rtol=1e-6)
    # ReplayBuffer.update (copy another buffer in) gives the copies the max priority too
    target = HeteroPrioritizedReplayBuffer(100, alpha=0.5)
    copied = target.update(buf)
    assert len(copied) == 50 and len(target) == 50
    np.testing.assert_array_equal(target.priority_tree.get(copied), 1.0)  # the target's own max priority, 1


def test_single_buffer_with_a_one_env_collector() -> None:
    env = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2), action_space=env.action_space)
    buf = HeteroPrioritizedReplayBuffer(100, random_seed=0)
    collector = Collector(policy, DummyVectorEnv([lambda: gym.make("CartPole-v1")]), buf)
    collector.reset()
    collector.collect(n_step=30, random=True)
    assert len(buf) == 30 and np.count_nonzero(buf.priority_tree.leaves()) == 30
    batch, indices = buf.sample(8)
    np.testing.assert_array_equal(batch.obs, buf._meta.obs[indices])


# -- the PER rules -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("stratified", [True, False])
def test_sampling_frequencies_follow_p_alpha(backend: str, stratified: bool) -> None:
    buf = make_vector(size=80, envs=4, steps=10, alpha=0.7, backend=backend, stratified=stratified)
    td = np.linspace(0.05, 4.0, 40)
    stored = set_priorities(buf, td)
    expected = (td + DEFAULT_EPS) ** 0.7
    expected /= expected.sum()
    draws = np.concatenate([buf.sample_indices(50) for _ in range(400)])
    counts = np.array([np.count_nonzero(draws == i) for i in stored])
    assert counts.sum() == draws.size  # nothing outside the stored transitions
    assert stats.chisquare(counts, expected * draws.size).pvalue > 1e-3


@pytest.mark.parametrize("backend", BACKENDS)
def test_is_weights_are_normalised_by_the_global_maximum(backend: str) -> None:
    buf = make_vector(size=80, envs=4, steps=10, alpha=0.6, beta=0.5, backend=backend)
    td = np.linspace(1.0, 5.0, 40)
    td[0] = 0.01  # the smallest priority, hence the largest weight
    stored = set_priorities(buf, td)
    p = (td + DEFAULT_EPS) ** 0.6
    expected = (p.min() / p) ** 0.5
    np.testing.assert_allclose(buf[stored].weight, expected, rtol=1e-5)
    batch, indices = buf.sample(8)
    while stored[0] in indices:  # rare: the largest-weight transition has the smallest priority
        batch, indices = buf.sample(8)
    np.testing.assert_allclose(batch.weight, expected[np.searchsorted(stored, indices)], rtol=1e-5)
    # Tianshou's own buffer divides by the batch maximum, which makes it 1 in every batch
    assert batch.weight.max() < 0.9


def test_set_beta_reaches_sampling() -> None:
    buf = make_vector(beta=0.4)
    set_priorities(buf, np.linspace(0.1, 3.0, 120))
    buf.set_beta(0.0)
    np.testing.assert_array_equal(buf.sample(32)[0].weight, 1.0)
    buf.set_beta(1.0)
    weights = buf.sample(32)[0].weight
    assert buf.beta == 1.0 and weights.min() < 0.5
    with pytest.raises(ValueError, match="beta"):
        buf.set_beta(1.5)
    assert buf.beta == 1.0


def test_reset_clears_priorities() -> None:
    buf = make_vector(steps=5)
    buf.update_weight(np.sort(buf.sample_indices(0))[:3], np.full(3, 9.0))
    buf.reset()
    assert len(buf) == 0 and buf.priority_tree.total() == 0.0 and buf.max_priority == 1.0
    new = add_step(buf, 0, 4)
    np.testing.assert_array_equal(np.flatnonzero(buf.priority_tree.leaves()), np.sort(new))


def test_same_seed_same_samples_different_seed_different() -> None:
    a, b = make_vector(), make_vector()
    c = HeteroPrioritizedVectorReplayBuffer(400, 4, random_seed=1)
    for step in range(30):
        add_step(c, step, 4)
    for _ in range(3):
        ia, ib, ic = a.sample_indices(32), b.sample_indices(32), c.sample_indices(32)
        np.testing.assert_array_equal(ia, ib)
    assert not np.array_equal(ia, ic)


def add_step_with_nan(buf: ReplayBuffer, step: int, envs: int, nan_env: int) -> np.ndarray:
    """:func:`add_step` with a NaN in env ``nan_env``'s observation."""
    k = 1000 * np.arange(envs) + step
    obs = obs_of(k)
    obs[nan_env, 1] = np.nan
    batch = Batch(obs=obs, act=k % 2, rew=k.astype(np.float64), terminated=np.zeros(envs, bool),
                  truncated=np.zeros(envs, bool), obs_next=obs + 0.5, info=Batch(k=k))  # fmt: skip
    ptr, *_ = buf.add(batch, buffer_ids=np.arange(envs))
    return ptr


def test_hasnull_matches_tianshou_as_transitions_come_and_go() -> None:
    """A NaN stored by an add is reported until a later add overwrites its slot, as Tianshou reports it."""
    ours = HeteroPrioritizedVectorReplayBuffer(40, 4, random_seed=0)  # 10 slots per env
    stock = PrioritizedVectorReplayBuffer(40, 4, alpha=0.6, beta=0.4)
    answers = []
    for step in range(25):
        for buf in (ours, stock):
            if step == 3:
                add_step_with_nan(buf, step, 4, nan_env=2)
            else:
                add_step(buf, step, 4)
        answers.append((ours.hasnull(), bool(stock.hasnull())))
    # stored at step 3, overwritten by step 13 (each env's ring holds 10 steps)
    assert answers == [(3 <= step < 13,) * 2 for step in range(25)]


def test_hasnull_between_sparse_checks() -> None:
    """Asked rarely (more rows written than the buffer holds in between), the answer stays right."""
    ours = HeteroPrioritizedVectorReplayBuffer(40, 4, random_seed=0)
    for step in range(30):
        add_step(ours, step, 4)
    add_step_with_nan(ours, 30, 4, nan_env=0)
    assert ours.hasnull() is True
    for step in range(31, 45):  # 56 rows written, more than the 40 slots: the next check is a whole one
        add_step(ours, step, 4)
    assert ours.hasnull() is False


def test_hasnull_when_one_env_laps_its_ring_between_checks() -> None:
    """Rows written twice between checks (one env's ring wraps) are counted once: an overwritten NaN goes away."""
    ours = make_vector(size=400, envs=4, steps=100)  # every env's 100 slots stored
    assert ours.hasnull() is False
    add_step_with_nan(ours, 100, 1, nan_env=0)  # env 0 only (buffer_ids [0]), 150 rows < 400 stored
    for step in range(101, 250):
        add_step(ours, step, 1)
    assert ours.hasnull() is False
    add_step_with_nan(ours, 250, 1, nan_env=0)
    add_step_with_nan(ours, 251, 1, nan_env=0)
    assert ours.hasnull() is True
    for step in range(252, 452):  # the two NaN slots are written twice before the next check
        add_step(ours, step, 1)
    assert ours.hasnull() is False
    add_step_with_nan(ours, 452, 1, nan_env=0)
    assert ours.hasnull() is True


def test_hasnull_single_buffer_add_and_update() -> None:
    """The single buffer: rows stored by ``add`` and by ``update`` (another buffer copied in) are checked."""
    ours, stock = HeteroPrioritizedReplayBuffer(8), PrioritizedReplayBuffer(8, alpha=0.6, beta=0.4)
    source = ReplayBuffer(4)
    for step in range(3):
        add_step(source, step, 1)
    add_step_with_nan(source, 3, 1, nan_env=0)
    for buf in (ours, stock):
        add_step(buf, 0, 1)
    assert ours.hasnull() is False and not stock.hasnull()
    for buf in (ours, stock):
        buf.update(source)
    assert ours.hasnull() is True and stock.hasnull()
    for step in range(1, 9):  # the ring of 8 overwrites every row copied in
        for buf in (ours, stock):
            add_step(buf, step, 1)
    assert ours.hasnull() is False and not stock.hasnull()


def test_hasnull_checks_every_row_after_reset_set_batch_and_copies() -> None:
    """Where the storage changes other than by adding, every stored row is checked (an empty slot never counts)."""
    ours, stock = make_vector(steps=10), PrioritizedVectorReplayBuffer(400, 4, alpha=0.6, beta=0.4)
    for step in range(10):
        add_step(stock, step, 4)
    assert ours.hasnull() is False and not stock.hasnull()
    for buf in (ours, stock):  # behind the buffers' backs: replaced through set_batch, then seen
        meta = copy.deepcopy(buf._meta)
        meta.obs[buf._offset[2] + 3, 1] = np.nan
        buf.set_batch(meta)
    assert ours.hasnull() is True and stock.hasnull()
    for buf in (ours, stock):
        meta = copy.deepcopy(buf._meta)
        meta.obs[buf._offset[2] + 3, 1] = 0.0
        meta.obs[buf._offset[2] + 50, 1] = np.nan  # an empty slot does not count
        buf.set_batch(meta)
    assert ours.hasnull() is False and not stock.hasnull()
    ours._meta.obs[ours._offset[1], 0] = np.nan  # written behind its back: a copy checks its rows afresh
    assert pickle.loads(pickle.dumps(ours)).hasnull() is True
    assert copy.deepcopy(ours).hasnull() is True
    add_step_with_nan(ours, 10, 4, nan_env=1)
    assert ours.hasnull() is True
    ours.reset()
    assert ours.hasnull() is False
    add_step(ours, 0, 4)
    assert ours.hasnull() is False


# -- bad input ---------------------------------------------------------------------------------


def test_update_weight_rejects_bad_input_and_changes_nothing() -> None:
    buf = make_vector()
    stored = np.sort(buf.sample_indices(0))
    before, max_before = buf.priority_tree.leaves(), buf.max_priority
    with pytest.raises(ValueError, match="position 1"):
        buf.update_weight(stored[:3], np.array([1.0, np.nan, 2.0]))
    with pytest.raises(ValueError, match="position 0"):
        buf.update_weight(stored[:1], np.array([np.inf]))
    with pytest.raises(IndexError, match="no stored transition"):
        buf.update_weight(np.array([stored[0], 50]), np.array([1.0, 1.0]))  # slot 50 is empty
    with pytest.raises(IndexError):
        buf.update_weight(np.array([400]), np.array([1.0]))
    with pytest.raises(TypeError, match="integer"):
        buf.update_weight(np.array([0.5]), np.array([1.0]))
    with pytest.raises(ValueError, match="TD errors"):
        buf.update_weight(stored[:3], np.array([1.0, 2.0]))
    np.testing.assert_array_equal(buf.priority_tree.leaves(), before)
    assert buf.max_priority == max_before


def test_update_weight_takes_torch_td_errors_with_grad() -> None:
    buf = make_vector()
    stored = np.sort(buf.sample_indices(0))[:4]
    td = torch.tensor([0.5, -1.0, 2.0, -4.0], requires_grad=True) * 1.0
    buf.update_weight(stored, td)
    np.testing.assert_allclose(
        buf.priority_tree.get(stored), (np.array([0.5, 1, 2, 4]) + DEFAULT_EPS) ** 0.6, rtol=1e-6
    )


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(buffer_num=0), ValueError, "buffer_num"),
        (dict(total_size=3), ValueError, "total_size"),
        (dict(alpha=-0.1), ValueError, "alpha"),
        (dict(beta=1.5), ValueError, "beta"),
        (dict(eps=0.0), ValueError, "eps"),
        (dict(alpha=50.0), ValueError, "underflows"),
        (dict(backend="abacus"), ValueError, "backend"),
        (dict(fanout=3), ValueError, "fanout"),
        (dict(weight_norm="yes"), TypeError, "weight_norm"),
        (dict(sample_avail=True), ValueError, "sample_avail"),
        (dict(stak_num=2), TypeError, "stak_num"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    args = dict(total_size=100, buffer_num=4) | kwargs
    with pytest.raises(error, match=match):
        HeteroPrioritizedVectorReplayBuffer(**args)


def test_single_buffer_rejects_bad_size() -> None:
    with pytest.raises(ValueError, match="size"):
        HeteroPrioritizedReplayBuffer(0)


@pytest.mark.parametrize("cls", [HeteroPrioritizedReplayBuffer, HeteroPrioritizedVectorReplayBuffer])
def test_per_options_come_from_peroptions(cls: type) -> None:
    """Defaults are PEROptions'; ``options=`` sets them at once; keyword arguments given override its fields."""
    args = (100,) if cls is HeteroPrioritizedReplayBuffer else (100, 4)
    default = cls(*args)
    assert default.priorities.options == PEROptions()
    assert (default.alpha, default.beta, default.eps) == (PEROptions().alpha, PEROptions().beta, DEFAULT_EPS)
    options = PEROptions(
        alpha=0.3, beta=0.9, eps=1e-3, tree="numpy", fanout=4, priority_dtype="float64", stratified=False
    )
    buf = cls(*args, options=options)
    assert buf.priorities.options == options and (buf.alpha, buf.beta, buf.eps) == (0.3, 0.9, 1e-3)
    assert buf.priority_tree.dtype == np.float64 and type(buf.priority_tree).__name__ == "NumpySumTree"
    mixed = cls(*args, alpha=0.5, backend="native", options=options)
    assert mixed.priorities.options == options.replace(alpha=0.5, tree="native")
    with pytest.raises(TypeError, match="options must be a PEROptions"):
        cls(*args, options=dict(alpha=0.5))
    with pytest.raises(ValueError, match="eps must be > 0"):  # Tianshou's stored slots are the positive ones
        cls(*args, options=PEROptions(eps=0.0))


# -- state -------------------------------------------------------------------------------------


def assert_same_buffer(a: HeteroPrioritizedVectorReplayBuffer, b: HeteroPrioritizedVectorReplayBuffer) -> None:
    assert len(a) == len(b) and a.beta == b.beta and a.max_priority == b.max_priority
    np.testing.assert_array_equal(a.priority_tree.leaves(), b.priority_tree.leaves())
    for _ in range(2):  # the same generator state: the same next samples
        (ba, ia), (bb, ib) = a.sample(16), b.sample(16)
        np.testing.assert_array_equal(ia, ib)
        np.testing.assert_array_equal(ba.obs, bb.obs)
        np.testing.assert_array_equal(ba.weight, bb.weight)
    # the restored children still share the manager's storage: later adds agree
    for buf in (a, b):
        add_step(buf, 30, 4)
    np.testing.assert_array_equal(a.unfinished_index(), b.unfinished_index())
    np.testing.assert_array_equal(a.next(np.sort(a.sample_indices(0))), b.next(np.sort(b.sample_indices(0))))
    # ... and still share the manager's episode book
    assert all(child._book is buf._book for buf in (a, b) for child in buf.buffers)
    assert [len(child) for child in a.buffers] == [len(child) for child in b.buffers] == list(a._lengths)


def trained_buffer() -> HeteroPrioritizedVectorReplayBuffer:
    buf = make_vector(beta=0.3)
    set_priorities(buf, np.linspace(0.1, 2.0, 120))
    buf.set_beta(0.7)
    buf.sample(8)  # advance the generator
    return buf


def test_pickle_round_trip() -> None:
    buf = trained_buffer()
    assert_same_buffer(pickle.loads(pickle.dumps(buf)), copy.deepcopy(buf))


def test_hdf5_round_trip(tmp_path) -> None:
    buf = trained_buffer()
    path = str(tmp_path / "buffer.hdf5")
    buf.save_hdf5(path)
    loaded = HeteroPrioritizedVectorReplayBuffer.load_hdf5(path)
    assert isinstance(loaded, HeteroPrioritizedVectorReplayBuffer)
    assert_same_buffer(loaded, copy.deepcopy(buf))


def test_single_buffer_pickle_round_trip() -> None:
    buf = HeteroPrioritizedReplayBuffer(20, random_seed=3)
    for step in range(12):
        add_step(buf, step, 1)
    buf.update_weight(np.arange(12), np.arange(12.0))
    loaded = pickle.loads(pickle.dumps(buf))
    np.testing.assert_array_equal(loaded.priority_tree.leaves(), buf.priority_tree.leaves())
    np.testing.assert_array_equal(loaded.sample_indices(8), buf.sample_indices(8))
