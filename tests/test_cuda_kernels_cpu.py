"""The CUDA kernels' code on the CPU: the shared __host__ __device__ per-item functions
(through hetero_replay._native.kernels) and the cupy backend's launch sequence run by
its CPU executor (make_tree("cupy", device="cpu")), checked against the NumPy reference."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetero_replay._native import kernels
from hetero_replay.trees import FANOUTS, _cupy_usable, backends, make_tree
from hetero_replay.trees.cupy_tree import CudaUnavailableError, CupySumTree
from tests.test_trees import assert_same_tree, operation


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=30, deadline=None)
@given(
    capacity=st.integers(1, 3000),
    fanout=st.sampled_from(FANOUTS),
    ops=st.lists(operation, min_size=1, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_kernels_match_reference(dtype, capacity, fanout, ops, seed):
    ref = make_tree("numpy", capacity, fanout, dtype)
    tree = make_tree("cupy", capacity, fanout, dtype, device="cpu")
    for raw_idx, raw_val in ops:
        idx = np.asarray(raw_idx) % capacity
        val = np.asarray(raw_val[: len(idx)])
        ref.update(idx, val)
        tree.update(idx, val)
        assert_same_tree(ref, tree, seed)


def test_large_batches_and_rebuild_match_reference():
    rng = np.random.default_rng(0)
    ref, tree = make_tree("numpy", 200_003), make_tree("cupy", 200_003, device="cpu")
    for _ in range(3):
        idx = rng.integers(0, 200_003, 5000)
        val = rng.random(5000) * rng.choice([0.0, 1.0, 1e3], 5000)
        ref.update(idx, val)
        tree.update(idx, val)
    assert_same_tree(ref, tree, 1)
    leaves = rng.random(200_003).astype(np.float32)
    ref.load_leaves(leaves)
    tree.load_leaves(leaves)
    assert_same_tree(ref, tree, 2)
    td = rng.random(4096) * 3
    idx = rng.integers(0, 200_003, 4096)
    assert tree.update_td(idx, td, 0.6, 1e-6) == ref.update_td(idx, td, 0.6, 1e-6)
    assert_same_tree(ref, tree, 3)


# -- the device-side validation path (what device-resident input takes on a GPU) -------


@pytest.mark.parametrize(
    "idx, values, td, error, match",
    [
        ([0, 9, 12, 3], [1.0, 1.0, 1.0, 1.0], None, IndexError, r"position 2 is 12, outside \[0, 10\)"),
        ([0, -1, 2, 3], [1.0, np.nan, 1.0, 1.0], None, IndexError, "position 1 is -1"),
        ([0, 1, 2, 3], [1.0, 1.0, np.inf, -1.0], None, ValueError, "priority at position 2 is inf"),
        ([0, 1, 2, 3], None, [0.5, -2.0, np.nan, 1.0], ValueError, r"TD error at position 1 is -2\.0"),
    ],
)
def test_device_validation_masks_the_update(idx, values, td, error, match):
    """The check kernel flags the first bad entry and every later kernel writes nothing."""
    tree = CupySumTree(10, 4, device="cpu")
    tree.update(np.arange(10), np.arange(10) + 1.0)
    before, total, minimum = tree.leaves(), tree.total(), tree.min()
    idx = np.asarray(idx, np.int64)
    vals = None if values is None else np.asarray(values, np.float32)
    tds = None if td is None else np.asarray(td, np.float64)
    with pytest.raises(error, match=match):
        tree._run_update(idx, vals, tds, 10, 0.6, 1e-6)  # the path device input takes, past the host checks
    np.testing.assert_array_equal(tree.leaves(), before)
    assert (tree.total(), tree.min()) == (total, minimum)


def test_check_kernels_record_first_bad_positions_and_max_raw():
    n = 6
    idx = np.array([0, 7, 1, 9, 2, 1], np.int64)
    td = np.array([0.5, 1.0, np.nan, 4.0, 2.5, -1.0])
    keys, priorities, status = np.empty(n, np.int64), np.empty(n, np.float32), np.zeros(5, np.uint64)
    kernels.check_td(n, idx, td, 8, 0.5, 0.25, 1e30, keys, priorities, status)
    assert status[0] == n - 3  # index 9 at position 3 is the first out of [0, 8)
    assert status[1] == n - 2  # the NaN at position 2 is the first bad TD error
    assert status[2:3].view(np.float64)[0] == 4.0 + 0.25  # max over the valid entries
    np.testing.assert_array_equal(keys[[0, 2, 4]], idx[[0, 2, 4]] * n + [0, 2, 4])
    np.testing.assert_array_equal(priorities[[0, 4]], np.power(np.float32([0.75, 2.75]), np.float32(0.5)))


def test_write_kernel_lets_the_last_write_win_and_skips_after_a_failure():
    n = 5
    idx = np.array([4, 2, 4, 2, 4], np.int64)
    keys = np.sort(idx * n + np.arange(n))
    values = np.array([1, 2, 3, 4, 5], np.float64)
    leaves, status = np.zeros(8), np.zeros(5, np.uint64)
    kernels.write_leaves(n, keys, values, leaves, status)
    assert leaves[4] == 5.0 and leaves[2] == 4.0
    status[1] = 1  # an earlier check failed
    kernels.write_leaves(n, keys, values * 0, leaves, status)
    assert leaves[4] == 5.0


def test_refresh_kernel_recomputes_each_parent_once_from_its_children():
    """Level 1 of a fanout-4 tree: parents hold the float64 sum rounded once and the positive minimum."""
    leaves = np.array([1e8, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0], np.float32)
    values, mins = np.zeros(4, np.float32), np.full(4, np.inf, np.float32)
    keys = np.sort(np.array([0, 1, 3], np.int64) * 3 + np.arange(3))
    kernels.refresh_level(4, 3, keys, 4, leaves, None, None, values, mins, np.zeros(5, np.uint64))
    assert values[0] == np.float32(1e8 + 2.0) and mins[0] == 1.0
    assert values[1] == 0.0 and mins[1] == np.inf  # untouched: not a parent of any key


# -- the fused sample + gather ---------------------------------------------------------


def test_fused_sample_rows_equal_separate_sample_and_gather():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    cap = 500
    tree = CupySumTree(cap, 16, device="cpu")
    tree.update(np.arange(cap), rng.random(cap) * (rng.random(cap) > 0.2))
    sources = {
        "obs": torch.from_numpy(rng.random((cap, 5)).astype(np.float32)),  # 20-byte rows: word copies
        "tag": torch.from_numpy(rng.integers(0, 100, (cap, 3)).astype(np.int8)),  # 3-byte rows: byte copies
        "step": torch.arange(cap, dtype=torch.int64),
    }
    idx, weights, rows = tree.sample_rows(300, np.random.default_rng(7), 0.4, sources)  # 3 blocks of 128
    ref = make_tree("numpy", cap, 16)
    ref.load_leaves(tree.leaves())
    ref_idx, ref_w = ref.sample(300, np.random.default_rng(7), 0.4)
    np.testing.assert_array_equal(idx.numpy(), ref_idx)
    np.testing.assert_allclose(weights.numpy(), ref_w, rtol=1e-6)
    for name, src in sources.items():
        assert torch.equal(rows[name], src[idx]), name
    with pytest.raises(ValueError, match="contiguous tensors"):
        tree.sample_rows(4, np.random.default_rng(0), 0.4, {"obs": sources["obs"][:, ::2]})


# -- availability ------------------------------------------------------------------------


def test_missing_cupy_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # as if CuPy were not installed
    with pytest.raises(CudaUnavailableError, match=r"pip install '\.\[cuda\]'"):
        make_tree("cupy", 10)
    _cupy_usable.cache_clear()  # backends() asks once; ask again without CuPy
    try:
        assert "cupy" not in backends()
    finally:
        monkeypatch.undo()
        _cupy_usable.cache_clear()


def test_no_cuda_device_is_a_clear_error():
    from hetero_replay.trees.cupy_tree import cuda_available

    if cuda_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(ImportError, match="CUDA device|CuPy"):
        make_tree("cupy", 10, device="cuda")
    assert "cupy" not in backends()
