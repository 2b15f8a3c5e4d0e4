"""Every tree backend against the NumPy reference, the sampling law, drift, bad input."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from hetero_replay import _native
from hetero_replay.trees import FANOUTS, make_tree
from tests.conftest import CPU_BACKENDS

OTHER_BACKENDS = [b for b in CPU_BACKENDS if b != "numpy"]


def assert_same_tree(ref, tree, rng_seed: int) -> None:
    np.testing.assert_array_equal(tree.leaves(), ref.leaves())
    assert tree.total() == ref.total()
    assert tree.min() == ref.min()
    if ref.total() > 0:
        mass = np.random.default_rng(rng_seed).random(257) * ref.total()
        np.testing.assert_array_equal(tree.find(mass), ref.find(mass))
        for stratified in (True, False):
            i_ref, w_ref = ref.sample(97, np.random.default_rng(rng_seed), 0.4, stratified)
            i_tree, w_tree = tree.sample(97, np.random.default_rng(rng_seed), 0.4, stratified)
            np.testing.assert_array_equal(i_tree, i_ref)
            np.testing.assert_allclose(w_tree, w_ref, rtol=1e-6)


# Priorities of very different magnitudes, zeros and repeated indices included.
priority = st.one_of(
    st.just(0.0),
    st.floats(min_value=1e-6, max_value=1e6, allow_nan=False, allow_infinity=False),
)
operation = st.tuples(
    st.lists(st.integers(0, 10_000), min_size=1, max_size=64), st.lists(priority, min_size=64, max_size=64)
)


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@settings(max_examples=40, deadline=None)
@given(
    capacity=st.integers(1, 3000),
    fanout=st.sampled_from(FANOUTS),
    ops=st.lists(operation, min_size=1, max_size=8),
    seed=st.integers(0, 2**16),
)
def test_backend_matches_reference(backend, dtype, capacity, fanout, ops, seed):
    ref = make_tree("numpy", capacity, fanout, dtype)
    tree = make_tree(backend, capacity, fanout, dtype)
    for raw_idx, raw_val in ops:
        idx = np.asarray(raw_idx) % capacity
        val = np.asarray(raw_val[: len(idx)])
        ref.update(idx, val)
        tree.update(idx, val)
        assert_same_tree(ref, tree, seed)


@pytest.mark.parametrize("backend", OTHER_BACKENDS)
def test_large_batches_match_reference(backend):
    """Batches big enough for the parallel paths, on a tree several levels deep."""
    rng = np.random.default_rng(0)
    ref, tree = make_tree("numpy", 200_003), make_tree(backend, 200_003)
    for _ in range(4):
        idx = rng.integers(0, 200_003, 5000)
        val = rng.random(5000) * rng.choice([0.0, 1.0, 1e3], 5000)
        ref.update(idx, val)
        tree.update(idx, val)
        assert_same_tree(ref, tree, 1)
    leaves = rng.random(200_003).astype(np.float32)
    ref.load_leaves(leaves)
    tree.load_leaves(leaves)
    assert_same_tree(ref, tree, 2)


def test_last_write_wins(backend):
    tree = make_tree(backend, 100)
    tree.update([5, 7, 5, 5, 7], [1.0, 2.0, 3.0, 4.0, 0.5])
    np.testing.assert_array_equal(tree.get([5, 7]), [4.0, 0.5])
    assert tree.total() == 4.5


@pytest.mark.parametrize("stratified", [False, True])
def test_sampling_distribution(backend, stratified):
    """Counts over many draws follow p_i / sum p (chi-square), zeros never drawn."""
    rng = np.random.default_rng(42)
    p = rng.random(60) ** 3
    p[[3, 17, 41]] = 0.0
    tree = make_tree(backend, 60, fanout=4)
    tree.update(np.arange(60), p)
    counts = np.zeros(60)
    draws = np.random.default_rng(7)
    for _ in range(200):
        idx, _ = tree.sample(1000, draws, 0.0, stratified)
        counts += np.bincount(idx, minlength=60)
    assert counts[[3, 17, 41]].sum() == 0
    expected = p / p.sum() * counts.sum()
    keep = p > 0
    pvalue = stats.chisquare(counts[keep], expected[keep]).pvalue
    assert pvalue > 1e-3, pvalue


def test_stratified_draw_i_lies_in_slice_i(backend):
    """Draw i of a stratified batch comes from the leaf covering mass slice i."""
    rng = np.random.default_rng(3)
    p = rng.random(500).astype(np.float32)
    tree = make_tree(backend, 500)
    tree.update(np.arange(500), p)
    bounds = np.concatenate([[0.0], np.cumsum(p.astype(np.float64))])
    batch = 64
    idx, _ = tree.sample(batch, rng, 0.0, True)
    slice_lo = np.arange(batch) * tree.total() / batch
    slice_hi = slice_lo + tree.total() / batch
    # the chosen leaf's interval [bounds[i], bounds[i+1]) overlaps its slice
    assert np.all(bounds[idx] < slice_hi + 1e-3) and np.all(bounds[idx + 1] > slice_lo - 1e-3)


def test_is_weights_follow_formula(backend):
    rng = np.random.default_rng(5)
    p = (rng.random(300) + 0.01).astype(np.float32)
    tree = make_tree(backend, 1000)
    tree.update(np.arange(300), p)
    for beta in (0.0, 0.4, 1.0):
        idx, w = tree.sample(256, rng, beta)
        n = 300
        prob = p.astype(np.float64) / p.astype(np.float64).sum()
        full = (n * prob) ** -beta
        expected = full[idx] / full.max()  # normalised by the buffer's max weight
        np.testing.assert_allclose(w, expected, rtol=2e-6)
        assert w.dtype == np.float32 and idx.dtype == np.int64


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.4, 1.0])
def test_weights_raised_from_beta_one_are_the_trees_own(beta):
    # The relaxed pipeline draws at beta 1 and raises the weights later (_native.raised_weights, or in the
    # native executor's job): the same bits as a draw at beta.
    rng = np.random.default_rng(7)
    tree = make_tree("native", 1000)
    tree.update(np.arange(300), (rng.random(300) + 0.01).astype(np.float32))
    idx, ratios = tree.sample(256, np.random.default_rng(1), 1.0)
    same_idx, weights = tree.sample(256, np.random.default_rng(1), beta)
    np.testing.assert_array_equal(idx, same_idx)
    raised = _native.raised_weights(ratios, beta)
    assert raised.dtype == np.float32 and np.array_equal(raised, weights)


def test_min_ignores_zeros_and_tracks_removals(backend):
    tree = make_tree(backend, 50)
    assert tree.min() == np.inf
    tree.update([1, 2, 3], [0.5, 0.25, 0.0])
    assert tree.min() == 0.25
    tree.update([2], [0.0])
    assert tree.min() == 0.5


def test_no_drift_after_ten_million_updates():
    """Parents are recomputed from children, so 1e7 updates leave exactly the tree
    that a fresh build from the same leaves gives, and the float64 total stays
    within float32 rounding of the exact sum."""
    rng = np.random.default_rng(0)
    n = 100_000
    tree = make_tree("native", n)
    for _ in range(10_000_000 // 4096 + 1):
        tree.update(rng.integers(0, n, 4096), rng.random(4096, dtype=np.float32) * 10)
    fresh = make_tree("native", n)
    fresh.load_leaves(tree.leaves())
    assert tree.total() == fresh.total()
    assert tree.min() == fresh.min()
    exact = np.sum(tree.leaves().astype(np.float64))
    assert abs(tree.total() - exact) <= 1e-6 * exact


# -- bad input: precise errors, nothing applied -----------------------------------------


@pytest.mark.parametrize(
    "bad_val, position",
    [([1.0, np.nan, 2.0], 1), ([np.inf, 1.0, 1.0], 0), ([1.0, 2.0, -0.5], 2), ([1.0, 1.0, -np.inf], 2)],
)
def test_bad_priorities_rejected_atomically(backend, bad_val, position):
    tree = make_tree(backend, 10)
    tree.update([0, 1, 2], [1.0, 2.0, 3.0])
    before = tree.leaves()
    with pytest.raises(ValueError, match=f"position {position}"):
        tree.update([4, 5, 6], bad_val)
    np.testing.assert_array_equal(tree.leaves(), before)
    assert tree.total() == 6.0


@pytest.mark.parametrize("bad_idx, position", [([0, 10, 1], 1), ([-1, 0, 1], 0), ([0, 1, 2**40], 2)])
def test_out_of_range_indices_rejected_atomically(backend, bad_idx, position):
    tree = make_tree(backend, 10)
    tree.update([0], [1.0])
    with pytest.raises(IndexError, match=f"position {position}"):
        tree.update(bad_idx, [5.0, 5.0, 5.0])
    assert tree.total() == 1.0
    with pytest.raises(IndexError):
        tree.get([3, 11])


def test_malformed_arguments(backend):
    tree = make_tree(backend, 10)
    with pytest.raises(TypeError, match="integers"):
        tree.update([0.5, 1.0], [1.0, 1.0])
    with pytest.raises(ValueError, match="2 indices but 3 priorities"):
        tree.update([0, 1], [1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="1-D"):
        tree.update([[0, 1]], [[1.0, 1.0]])
    with pytest.raises(ValueError, match="no priority mass"):
        tree.sample(4, np.random.default_rng(0), 0.4)
    tree.update([0], [2.0])
    with pytest.raises(ValueError, match="outside"):
        tree.find([2.0])
    assert tree.total() == 2.0


@pytest.mark.parametrize("kwargs", [dict(fanout=3), dict(fanout=128), dict(dtype="int32"), dict(capacity=0)])
def test_bad_construction(backend, kwargs):
    args = dict(capacity=10, fanout=16, dtype="float32") | kwargs
    with pytest.raises(ValueError):
        make_tree(backend, **args)


def test_unknown_backend():
    with pytest.raises(ValueError, match="unknown tree backend 'gpu-magic'"):
        make_tree("gpu-magic", 10)


def test_trees_pickle(backend):
    import pickle

    tree = make_tree(backend, 33, fanout=4)
    tree.update([1, 5, 32], [0.5, 2.0, 1.0])
    clone = pickle.loads(pickle.dumps(tree))
    assert_same_tree(tree, clone, 0)


def test_update_td_matches_reference_and_respects_limit(backend):
    ref, tree = make_tree("numpy", 50), make_tree(backend, 50)
    td = np.array([0.0, 0.5, 2.0, 7.5])
    for t in (ref, tree):
        assert t.update_td([1, 2, 3, 2], td, 0.6, 1e-6) == pytest.approx(7.5 + 1e-6)
    np.testing.assert_allclose(tree.leaves(), ref.leaves(), rtol=1e-6)
    np.testing.assert_allclose(tree.get([1, 2]), [1e-6**0.6, (7.5 + 1e-6) ** 0.6], rtol=1e-6)
    before = tree.leaves()
    with pytest.raises(IndexError, match=r"position 1 is 10, outside \[0, 10\)"):
        tree.update_td([3, 10], [1.0, 1.0], 0.6, 1e-6, limit=10)
    with pytest.raises(ValueError, match="TD error at position 0 is -1"):
        tree.update_td([3, 4], [-1.0, 1.0], 0.6, 1e-6)
    np.testing.assert_array_equal(tree.leaves(), before)
