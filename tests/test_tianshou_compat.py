"""Our buffers where Tianshou's code and tests use its own prioritized buffers.

The behaviours Tianshou's ``test/base/test_buffer.py`` and ``test_collector.py``
rely on, checked side by side with Tianshou's ``PrioritizedReplayBuffer`` /
``PrioritizedVectorReplayBuffer`` fed the same data: ``buf.weight[i]`` (the
priorities ``p_i ** alpha``), ``weight_norm=True`` (IS weights divided by the
batch maximum), ``update_weight`` semantics, the vector buffer's layout,
single-transition adds, HDF5 round trips and Tianshou's own update loop.
``eps`` is set to Tianshou's (float32 epsilon) where priorities are compared.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

pytest.importorskip("tianshou")

import gymnasium as gym  # noqa: E402
from tianshou.algorithm import DQN  # noqa: E402
from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy  # noqa: E402
from tianshou.algorithm.optim import AdamOptimizerFactory  # noqa: E402
from tianshou.data import Batch, Collector, PrioritizedReplayBuffer, PrioritizedVectorReplayBuffer  # noqa: E402
from tianshou.env import DummyVectorEnv  # noqa: E402
from tianshou.utils.net.common import Net  # noqa: E402
from tianshou.utils.torch_utils import policy_within_training_step  # noqa: E402

from hetero_replay.adapters.tianshou import (  # noqa: E402
    HeteroPrioritizedReplayBuffer,
    HeteroPrioritizedVectorReplayBuffer,
)

TIANSHOU_EPS = float(np.finfo(np.float32).eps)


def step(i: int, envs: int = 1) -> Batch:
    """One transition per env, stacked; its values derive from ``i`` and the env."""
    k = i + 100 * np.arange(envs)
    return Batch(obs=np.stack([k, -k], axis=1), act=k % 2, rew=(k % 3).astype(float), terminated=k % 4 == 3,
                 truncated=np.zeros(envs, bool), obs_next=np.stack([k + 1, -k - 1], axis=1),
                 info=Batch(key=np.ones(envs, int)))  # fmt: skip


def pair(size: int = 15, envs: int = 0, **ours_kwargs) -> tuple:
    """Ours and Tianshou's buffer (single if ``envs == 0``) with the same alpha, beta and eps."""
    if envs:
        return (HeteroPrioritizedVectorReplayBuffer(size, envs, 0.5, 0.5, eps=TIANSHOU_EPS, **ours_kwargs),
                PrioritizedVectorReplayBuffer(size, envs, alpha=0.5, beta=0.5))  # fmt: skip
    return HeteroPrioritizedReplayBuffer(size, 0.5, 0.5, eps=TIANSHOU_EPS, **ours_kwargs), PrioritizedReplayBuffer(
        size, 0.5, 0.5
    )


def fill(buffers: tuple, steps: int, envs: int = 1) -> None:
    for i in range(steps):
        for buf in buffers:
            buf.add(step(i, envs), buffer_ids=np.arange(envs))


@pytest.mark.parametrize("envs", [0, 3])
def test_weight_reads_priorities_like_tianshous_segment_tree(envs: int) -> None:
    ours, stock = pair(envs=envs)
    fill((ours, stock), 25, max(envs, 1))
    np.testing.assert_allclose(ours.weight[np.arange(15)], stock.weight[np.arange(15)])  # all 1 = max priority ** alpha
    indices = np.array([0, 3, 7, 12])
    td = np.array([-0.5, 2.0, 0.0, 9.0])  # signed TD errors: their magnitudes count
    for buf in (ours, stock):
        buf.update_weight(indices, td)
    np.testing.assert_allclose(ours.weight[indices], (np.abs(td) + TIANSHOU_EPS) ** 0.5, rtol=1e-6)
    np.testing.assert_allclose(ours.weight[indices], stock.weight[indices], rtol=1e-6)
    one = ours.weight[3]  # an int index gives a float, as SegmentTree
    assert isinstance(one, float) and one == pytest.approx(stock.weight[3], rel=1e-6)
    assert len(ours.weight) == len(stock.weight) == 15
    assert ours.weight.reduce() == pytest.approx(stock.weight.reduce(), rel=1e-6)
    assert ours.weight.reduce(2, 9) == pytest.approx(stock.weight.reduce(2, 9), rel=1e-6)
    # new transitions get the largest priority so far, in both
    for buf in (ours, stock):
        buf.add(step(99, max(envs, 1)), buffer_ids=np.arange(max(envs, 1)))
    new = ours.last_index if envs else ours.last_index[:1]
    np.testing.assert_allclose(ours.weight[new], stock.weight[new], rtol=1e-6)


def test_weight_writes_set_priorities_of_stored_transitions() -> None:
    buf = HeteroPrioritizedVectorReplayBuffer(40, 4, random_seed=0)
    for i in range(5):
        buf.add(step(i, 4))
    stored = np.sort(buf.sample_indices(0))
    buf.weight[stored[3]] = 1e6  # SegmentTree semantics: the value is p ** alpha itself
    assert buf.weight[stored[3]] == pytest.approx(1e6)
    assert np.mean(buf.sample_indices(1000) == stored[3]) > 0.99
    buf.weight[stored[:2]] = np.array([2.0, 3.0])
    np.testing.assert_allclose(buf.weight[stored[:2]], [2.0, 3.0])
    before = buf.priority_tree.leaves()
    empty = int(np.flatnonzero(before == 0)[0])
    for index, value, error in [(empty, 1.0, IndexError), (stored[0], 0.0, ValueError), (stored[0], -1.0, ValueError),
                                (stored[0], np.nan, ValueError), (stored[0], 1e300, ValueError),
                                (stored[0], True, TypeError), (stored[0], "2", TypeError),
                                (stored[:2], np.ones(3), ValueError), (1.5, 1.0, TypeError)]:  # fmt: skip
        with pytest.raises(error):
            buf.weight[index] = value
        np.testing.assert_array_equal(buf.priority_tree.leaves(), before)
    with pytest.raises(AttributeError):
        buf.weight = None  # type: ignore[misc]


def test_weight_norm_true_divides_by_the_batch_maximum_as_tianshou() -> None:
    ours, stock = pair(size=30, envs=3, weight_norm=True)
    fill((ours, stock), 10, 3)
    indices = np.sort(ours.sample_indices(0))
    td = np.linspace(0.1, 3.0, len(indices))
    for buf in (ours, stock):
        buf.update_weight(indices, td)
    some = indices[::3]
    np.testing.assert_allclose(ours[some].weight, stock[some].weight, rtol=1e-5)
    assert ours[some].weight.max() == 1.0
    batch, drawn = ours.sample(16)
    p = np.abs(td[np.searchsorted(indices, drawn)]) ** 0.5
    np.testing.assert_allclose(batch.weight, (p.min() / p) ** 0.5, rtol=1e-5)  # w_i / max_batch w


def test_weight_norm_false_is_the_global_normalisation() -> None:
    a = HeteroPrioritizedVectorReplayBuffer(40, 4, random_seed=0)
    b = HeteroPrioritizedVectorReplayBuffer(40, 4, random_seed=0, weight_norm=False)
    for buf in (a, b):
        for i in range(6):
            buf.add(step(i, 4))
        buf.update_weight(np.arange(6), np.arange(6.0))
    np.testing.assert_array_equal(a.sample(8)[0].weight, b.sample(8)[0].weight)


def test_vector_layout_and_weights_match_tianshou() -> None:
    """Tianshou's test_prioritized_replaybuffer, checked against its own buffer: 3 envs, 15 slots, wrapping."""
    ours, stock = pair(size=15, envs=3, weight_norm=True)
    fill((ours, stock), 25, 3)
    assert len(ours) == len(stock) == 15
    np.testing.assert_array_equal(ours._offset, stock._offset)
    np.testing.assert_array_equal(ours.subbuffer_edges, stock.subbuffer_edges)
    every = np.arange(15)
    mine, theirs = ours[every], stock[every]
    for key in ("obs", "act", "rew", "done", "obs_next"):
        np.testing.assert_array_equal(mine[key], theirs[key])
    np.testing.assert_array_equal(mine.info.key, theirs.info.key)
    np.testing.assert_array_equal(ours.prev(every), stock.prev(every))
    np.testing.assert_array_equal(ours.next(every), stock.next(every))
    np.testing.assert_array_equal(ours.unfinished_index(), stock.unfinished_index())
    _, indices = ours.sample(10)
    for buf in (ours, stock):
        buf.update_weight(indices, np.zeros(10))
    np.testing.assert_allclose(ours[every].weight, stock[every].weight, rtol=1e-5)
    weight = ours[every].weight
    selected = np.isin(every, indices)
    assert np.all(weight[selected] == weight[selected][0]) and np.all(weight[~selected] == weight[~selected][0])
    assert weight[~selected][0] < weight[selected][0] <= 1


def test_single_transition_adds_match_tianshou() -> None:
    """Unstacked adds (no ``buffer_ids``), as in Tianshou's test_pickle and test_hdf5: same rows, dtypes and returns."""
    ours, stock = pair(size=10)
    for i in range(13):
        kwargs = dict(obs=Batch(index=np.array([i])), act=2, rew=np.array([1, 2]), terminated=i % 3 == 2, truncated=0,
                      info={"number": {"n": i, "t": torch.tensor([1.0])}, "extra": None, "x": np.random.rand()})  # fmt: skip
        got, want = ours.add(Batch(kwargs)), stock.add(Batch(kwargs))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert ours._meta == stock._meta
    for key in ("rew", "done", "terminated", "truncated"):
        assert ours._meta[key].dtype == stock._meta[key].dtype
    assert isinstance(ours.info.number.t, torch.Tensor) and isinstance(ours.get(0, "info"), Batch)
    np.testing.assert_allclose(ours._ep_return, stock._ep_return)


def test_hdf5_round_trip_with_nested_info_and_tensors(tmp_path) -> None:
    buf = HeteroPrioritizedReplayBuffer(100, 0.6, 0.4, random_seed=1)
    for i in range(4):
        buf.add(Batch(obs=Batch(index=np.array([i])), act=i, rew=np.array([1, 2]), terminated=i % 3 == 2,
                      truncated=False, info={"number": {"n": i, "t": torch.tensor([1.0])}, "extra": None}))  # fmt: skip
    buf.update_weight(np.arange(4), np.arange(4.0))
    path = str(tmp_path / "buffer.hdf5")
    buf.save_hdf5(path)
    loaded = HeteroPrioritizedReplayBuffer.load_hdf5(path)
    assert len(loaded) == 4 and loaded._insertion_idx == buf._insertion_idx and loaded.maxsize == 100
    np.testing.assert_array_equal(loaded.act, buf.act)
    np.testing.assert_array_equal(loaded.weight[np.arange(4)], buf.weight[np.arange(4)])
    assert isinstance(loaded.get(0, "info"), Batch) and loaded[np.arange(4)].info.number.n.tolist() == [0, 1, 2, 3]
    np.testing.assert_array_equal(loaded.sample_indices(16), buf.sample_indices(16))  # the generator state too


def test_sampling_frequencies_agree_with_tianshous() -> None:
    """Both buffers draw transition i with probability p_i ** alpha / sum: same expected counts."""
    ours, stock = pair(size=30, envs=3)
    fill((ours, stock), 10, 3)
    indices = np.sort(ours.sample_indices(0))
    td = np.linspace(0.05, 4.0, len(indices))
    for buf in (ours, stock):
        buf.update_weight(indices, td)
    expected = (td + TIANSHOU_EPS) ** 0.5
    expected /= expected.sum()
    np.random.seed(0)  # Tianshou's sampling draws from the global generator
    for buf in (ours, stock):
        draws = np.concatenate([buf.sample_indices(64) for _ in range(300)])
        counts = np.array([np.count_nonzero(draws == i) for i in indices])
        assert counts.sum() == draws.size
        assert stats.chisquare(counts, expected * draws.size).pvalue > 1e-3


def test_tianshous_own_dqn_update_with_weight_norm_feeds_td_errors_back() -> None:
    """The Rainbow example's setup: a stock DQN (no wrapper), ``weight_norm=True``, a Collector."""
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    policy = DiscreteQLearningPolicy(model=Net(state_shape=(4,), action_shape=2, hidden_sizes=[16]),
                                     action_space=env.action_space)  # fmt: skip
    algorithm = DQN(policy=policy, optim=AdamOptimizerFactory(lr=1e-3), target_update_freq=10)
    buf = HeteroPrioritizedVectorReplayBuffer(1000, 2, alpha=0.6, beta=0.4, weight_norm=True, random_seed=0)
    envs = DummyVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(2)])
    envs.seed(0)
    collector = Collector(algorithm, envs, buf)
    collector.reset()
    collector.collect(n_step=100, random=True)
    assert np.all(buf.weight[np.sort(buf.sample_indices(0))] == 1.0)
    with policy_within_training_step(algorithm.policy):
        algorithm.update(buffer=buf, sample_size=32)
    changed = np.flatnonzero((buf.priority_tree.leaves() != 1.0) & (buf.priority_tree.leaves() > 0))
    assert len(changed) > 0 and buf.max_priority > 0


@pytest.mark.parametrize("envs", [0, 3])
def test_attributes_tianshous_init_sets_are_live_views_of_ours(envs: int) -> None:
    """``_alpha``, ``_beta``, ``_max_prio``, ``_min_prio``, ``__eps``, ``options``: what Tianshou's own tests read."""
    ours, stock = pair(size=30, envs=envs)
    fill((ours, stock), 10, max(envs, 1))
    for buf in (ours, stock):
        assert (buf._alpha, buf._beta) == (0.5, 0.5)
        assert (buf.options["alpha"], buf.options["beta"]) == (0.5, 0.5)
        assert buf._max_prio == buf._min_prio == 1.0  # nothing fed back yet
    assert ours._PrioritizedReplayBuffer__eps == ours.eps == TIANSHOU_EPS
    indices = np.sort(ours.sample_indices(0))[:6]
    td = np.array([0.5, 3.0, 0.25, 1.0, 2.0, 0.75])
    for buf in (ours, stock):
        buf.update_weight(indices, td)
        buf.set_beta(0.3)
    assert ours._beta == ours.beta == 0.3  # Tianshou's vector set_beta reaches its sub-buffers' _beta only
    assert ours._max_prio == pytest.approx(stock._max_prio) == pytest.approx(3.0 + TIANSHOU_EPS)
    assert ours._max_prio == ours.max_priority
    # Tianshou's IS-weight formula over ours gives ours: _min_prio is the normaliser, the smallest p ** alpha
    assert ours._min_prio == pytest.approx((0.25 + TIANSHOU_EPS) ** 0.5, rel=1e-6)
    np.testing.assert_allclose(
        (ours.weight[indices] / ours._min_prio) ** -ours._beta, ours.get_weight(indices), rtol=1e-6
    )
    with pytest.raises(AttributeError):
        ours._alpha = 0.7  # read-only: alpha is set once, through the constructor
    ours.reset()
    assert ours._min_prio == 1.0
