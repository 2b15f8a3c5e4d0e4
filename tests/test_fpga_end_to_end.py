"""``tree="fpga"`` end to end: the engine, its checkpoints, and the Tianshou buffers, on the emulation.

Without a board, ``tree="fpga"`` runs the RMM's HLS source compiled with g++
(device ``"fpga:emu"``). SB3's ``PERDQN`` learning CartPole-v1 on it is the
native tree's own learning test, parametrised (``tests/test_sb3_learning.py``).
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hetero_replay import DEFAULT_EPS, PrioritizedReplay
from hetero_replay.fpga.fixed_point import SCALE
from hetero_replay.fpga.protocol import REG_ERRORS
from hetero_replay.trees.fpga_tree import FpgaSumTree
from tests.conftest import SCHEMA, make_batch
from tests.test_checkpoint import assert_continues_identically


@pytest.fixture(params=["float32", "float64"])
def buf(request: pytest.FixtureRequest) -> PrioritizedReplay:
    b = PrioritizedReplay(64, SCHEMA, alpha=0.7, beta=0.5, tree="fpga", priority_dtype=request.param, seed=9)
    b.add(make_batch(50))
    s = b.sample(16)
    b.update_priorities(s.indices, np.linspace(0.1, 3.0, 16))
    return b


def test_the_buffer_runs_on_the_emulation(buf):
    assert isinstance(buf.tree, FpgaSumTree) and buf.tree.device == "fpga:emu"
    assert buf.tree.port.read_register(REG_ERRORS) == 0  # the kernel never flagged a command


def test_add_sample_update(buf):
    alpha, eps = buf.alpha, buf.eps
    s = buf.sample(32)
    np.testing.assert_array_equal(s.data["action"], s.indices)
    assert s.weights.dtype == np.float32 and s.weights.shape == (32,) and np.all(s.weights <= 1)
    buf.update_priorities([3, 4], [2.0, 0.0])
    np.testing.assert_allclose(buf.tree.get([3, 4]), [(2.0 + eps) ** alpha, eps**alpha], atol=2.0**-23)
    assert buf.max_priority == pytest.approx(3.0 + eps)
    new = buf.add(make_batch(20, start=50))  # wraps around the end, at max_priority ** alpha
    np.testing.assert_array_equal(new, [*range(50, 64), *range(6)])
    np.testing.assert_allclose(buf.tree.get(new), (3.0 + eps) ** alpha, rtol=2e-6)
    assert buf.tree.total() == pytest.approx(float(buf.tree.leaves().astype(np.float64).sum()), rel=1e-6)
    # a TD error whose priority a 32-bit leaf cannot hold is refused, and nothing changes
    before = buf.tree.leaves_q()
    with pytest.raises(ValueError, match=r"TD error at position 1 is 10000000.0: .*FRAC_BITS = 22"):
        buf.update_priorities([1, 2], [1.0, 1e7])
    np.testing.assert_array_equal(buf.tree.leaves_q(), before)


def test_sampling_follows_the_priorities():
    b = PrioritizedReplay(40, SCHEMA, alpha=1.0, tree="fpga", seed=1)
    b.add(make_batch(40))
    td = np.linspace(0.0, 3.9, 40)
    b.update_priorities(np.arange(40), td)
    counts = np.bincount(np.concatenate([b.sample(256).indices for _ in range(200)]), minlength=40)
    expected = (td + DEFAULT_EPS) / (td + DEFAULT_EPS).sum() * counts.sum()
    from scipy import stats

    assert stats.chisquare(counts, expected).pvalue > 1e-3


def test_checkpoint_round_trips(buf, tmp_path):
    path = tmp_path / "replay.hrz"
    buf.save(path)
    loaded = PrioritizedReplay.load(path, tree="fpga")
    assert loaded.tree.dtype == buf.tree.dtype
    assert loaded.max_priority == buf.max_priority and isinstance(loaded.tree, FpgaSumTree)
    np.testing.assert_array_equal(loaded.tree.leaves_q(), buf.tree.leaves_q())
    assert_continues_identically(buf, loaded)
    other = PrioritizedReplay(64, SCHEMA, tree="fpga", priority_dtype=buf.tree.dtype.name)
    other.load_state_dict(buf.state_dict())
    assert_continues_identically(buf, other)
    assert_continues_identically(buf, pickle.loads(pickle.dumps(buf)))


def test_float64_checkpoints_keep_every_leaf_bit():
    """float32 holds a leaf q / 2**22 exactly below priority 4 (24 bits); float64 always."""
    b = PrioritizedReplay(32, SCHEMA, alpha=1.0, tree="fpga", priority_dtype="float64", seed=2)
    b.add(make_batch(32))
    b.update_priorities(np.arange(32), np.linspace(0.0, 1000.0, 32))
    copy = PrioritizedReplay.from_state_dict(b.state_dict(), tree="fpga")
    np.testing.assert_array_equal(copy.tree.leaves_q(), b.tree.leaves_q())
    assert copy.tree.total() == b.tree.total() == int(b.tree.leaves_q().sum(dtype=np.uint64)) / SCALE


# -- Tianshou -------------------------------------------------------------------------------------


def test_tianshou_buffers_on_the_fpga_tree():
    pytest.importorskip("tianshou")
    from tianshou.data import Batch

    from hetero_replay.adapters.tianshou import HeteroPrioritizedReplayBuffer, HeteroPrioritizedVectorReplayBuffer

    envs = 4
    vec = HeteroPrioritizedVectorReplayBuffer(80, envs, alpha=0.6, beta=0.5, backend="fpga", random_seed=0)
    single = HeteroPrioritizedReplayBuffer(40, alpha=0.6, beta=0.5, backend="fpga", random_seed=0)
    assert isinstance(vec.priority_tree, FpgaSumTree) and isinstance(single.priority_tree, FpgaSumTree)
    for step in range(10):
        k = 1000 * np.arange(envs) + step
        batch = Batch(obs=k[:, None].astype(np.float32), act=k % 2, rew=k.astype(np.float64),
                      terminated=np.zeros(envs, bool), truncated=np.zeros(envs, bool),
                      obs_next=k[:, None].astype(np.float32) + 0.5, info=Batch(k=k))  # fmt: skip
        vec.add(batch, buffer_ids=np.arange(envs))
        single.add(batch[:1], buffer_ids=np.arange(1))
    for buf in (vec, single):
        stored = np.sort(buf.sample_indices(0))
        td = np.linspace(1.0, 5.0, len(stored))
        td[0] = 0.01  # the smallest priority: the largest weight, 1
        buf.update_weight(stored, td)
        p = (td + DEFAULT_EPS) ** 0.6
        np.testing.assert_allclose(buf[stored].weight, (p.min() / p) ** 0.5, rtol=1e-5)
        batch, indices = buf.sample(16)
        np.testing.assert_array_equal(batch.rew, buf[indices].rew)
        np.testing.assert_allclose(batch.weight, (p.min() / p[np.searchsorted(stored, indices)]) ** 0.5, rtol=1e-5)
        draws = np.concatenate([buf.sample_indices(40) for _ in range(200)])
        counts = np.array([np.count_nonzero(draws == i) for i in stored])
        assert counts.sum() == draws.size  # only stored transitions
        from scipy import stats

        assert stats.chisquare(counts, p / p.sum() * draws.size).pvalue > 1e-3
        assert buf.priority_tree.port.read_register(REG_ERRORS) == 0
