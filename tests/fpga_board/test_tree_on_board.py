"""``FpgaSumTree`` and ``PrioritizedReplay(tree="fpga")`` over the board driver, on the fake board.

The tree over :class:`~hetero_replay.fpga.board.BoardRmm` (the emulation behind
the fake board's DMA) must be bit for bit the tree over
:class:`~hetero_replay.fpga.reference.ReferenceRmm` (NumPy, no DMA): same
leaves, totals, minima, lookups, samples and IS weights.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay.fpga.board import BoardRmm
from hetero_replay.fpga.protocol import REG_ERRORS
from hetero_replay.fpga.reference import ReferenceRmm
from hetero_replay.trees import make_tree
from hetero_replay.trees.fpga_tree import FpgaSumTree

SCHEMA = {"obs": ((3,), np.float32), "action": ((), np.int64), "reward": ((), np.float32)}


def batch(n: int, start: int = 0) -> dict[str, np.ndarray]:
    k = np.arange(start, start + n)
    return {"obs": np.stack([k, k + 0.5, k + 1.0], axis=1).astype(np.float32), "action": k, "reward": k * 0.5}


def assert_same_state(a: FpgaSumTree, b: FpgaSumTree) -> None:
    np.testing.assert_array_equal(a.leaves_q(), b.leaves_q())
    assert (a.total(), a.min(), a.max_q) == (b.total(), b.min(), b.max_q)


@pytest.mark.parametrize(
    ("capacity", "fanout", "dtype"), [(1000, 16, "float32"), (77, 4, "float64"), (5, 16, "float32")]
)
def test_random_operations_match_the_reference_bit_for_bit(make_board, capacity, fanout, dtype):
    make_board(fanout=fanout)
    board = FpgaSumTree(capacity, fanout, dtype, port=BoardRmm(capacity, fanout))
    ref = FpgaSumTree(capacity, fanout, dtype, port=ReferenceRmm(capacity, fanout))
    assert board.device == "fpga:0" and ref.device == "fpga:ref"
    rng = np.random.default_rng(capacity)
    rng_a, rng_b = np.random.default_rng(1), np.random.default_rng(1)
    for step in range(150):
        op = rng.integers(0, 7)
        n = int(rng.integers(1, 2 * capacity))
        idx = rng.integers(0, capacity, n)
        if op == 0:
            p = rng.uniform(0, 50, n) * (rng.random(n) > 0.1)  # some zeros
            board.update(idx, p)
            ref.update(idx, p)
        elif op == 1:
            td = rng.exponential(1.0, n)
            assert board.update_td(idx, td, 0.6, 1e-6) == ref.update_td(idx, td, 0.6, 1e-6)
        elif op == 2:
            start = int(rng.integers(0, capacity))
            slots = (start + np.arange(min(n, capacity))) % capacity
            new = np.full(len(slots), board.max_q / 2**22)  # a run at the running max: one INSERT
            board.update(slots, new)
            ref.update(slots, new)
        elif op == 3 and ref.total() > 0:
            for stratified in (True, False):
                got_i, got_w = board.sample(int(rng.integers(1, 300)), rng_a, 0.4, stratified)
                want_i, want_w = ref.sample(len(got_i), rng_b, 0.4, stratified)
                np.testing.assert_array_equal(got_i, want_i)
                np.testing.assert_array_equal(got_w, want_w)
        elif op == 4 and ref.total() > 0:
            mass = rng.uniform(0, ref.total(), n)
            np.testing.assert_array_equal(board.find(mass), ref.find(mass))
        elif op == 5:
            np.testing.assert_array_equal(board.get(idx), ref.get(idx))
        elif op == 6 and step % 20 == 0:
            leaves = rng.uniform(0, 5, capacity)
            board.load_leaves(leaves)
            ref.load_leaves(leaves)
        assert_same_state(board, ref)
    np.testing.assert_array_equal(board.leaves(), ref.leaves())
    assert board.port.read_register(REG_ERRORS) == 0  # the kernel never flagged a command the host sent


def test_bad_input_is_refused_before_any_dma(board):
    tree = FpgaSumTree(100, 16, port=BoardRmm(100, 16))
    tree.update(np.arange(10), np.ones(10))
    before = board.transfers()
    with pytest.raises(ValueError, match="position 1"):
        tree.update([1, 2], [1.0, np.nan])
    with pytest.raises(ValueError, match="position 0"):
        tree.update([1], [5000.0])  # above the largest leaf
    with pytest.raises(IndexError, match="outside"):
        tree.update([100], [1.0])
    with pytest.raises(ValueError, match="position 0"):
        tree.find([1e9])
    assert board.transfers() == before
    np.testing.assert_array_equal(tree.get(np.arange(12)), [1.0] * 10 + [0.0] * 2)


def test_make_tree_on_the_board(board):
    tree = make_tree("fpga", capacity=300, fanout=16, device="fpga:0")
    assert isinstance(tree, FpgaSumTree) and isinstance(tree.port, BoardRmm) and tree.device == "fpga:0"
    tree.update(np.arange(300), np.linspace(0.5, 2.0, 300))
    idx, w = tree.sample(64, np.random.default_rng(0), 0.5)
    assert idx.shape == (64,) and w.max() <= 1.0
    assert board.downloads == 1
    # Pickling keeps the leaves and opens a fresh port on the same device (the overlay is loaded again).
    copy = pickle.loads(pickle.dumps(tree))
    assert isinstance(copy.port, BoardRmm) and board.downloads == 2
    np.testing.assert_array_equal(copy.leaves_q(), tree.leaves_q())


def test_prioritized_replay_on_the_board(board):
    """A short PER run on the board gives the same samples as on the emulation without the DMA."""
    runs = {}
    for device in ("fpga:0", "fpga:emu"):
        buf = PrioritizedReplay(64, SCHEMA, alpha=0.6, beta=0.4, tree="fpga", tree_device=device, seed=3)
        drawn = []
        for step in range(12):
            buf.add(batch(9, start=9 * step))
            s = buf.sample(16)
            np.testing.assert_array_equal(s.data["action"] % 64, s.indices)  # the rows sampled are the rows stored
            drawn.append((s.indices, s.weights))
            buf.update_priorities(s.indices, np.abs(np.sin(s.indices + step)) * 3)
        runs[device] = (drawn, buf.tree.leaves_q())
        assert buf.tree.device == device
    for (i, w), (j, v) in zip(runs["fpga:0"][0], runs["fpga:emu"][0]):
        np.testing.assert_array_equal(i, j)
        np.testing.assert_array_equal(w, v)
    np.testing.assert_array_equal(runs["fpga:0"][1], runs["fpga:emu"][1])
