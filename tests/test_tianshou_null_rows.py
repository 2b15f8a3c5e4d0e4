"""``NullRows``: which stored rows hold a NaN or None, checked as rows are written (Tianshou's ``hasnull``)."""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

pytest.importorskip("tianshou")

from tianshou.data import Batch  # noqa: E402

from hetero_replay.adapters.tianshou.null_rows import NullRows, leaf_arrays, null_rows  # noqa: E402


def storage(n: int = 8) -> Batch:
    """Arrays of every kind a Tianshou ``Batch`` stores, with no null."""
    return Batch(
        obs=np.zeros((n, 2), np.float32),
        act=np.zeros(n, np.int64),
        done=np.zeros(n, bool),
        z=np.zeros(n, np.complex64),
        info=Batch(name=np.array(["a"] * n, dtype=object), t=torch.zeros(n, 3)),
    )


@pytest.mark.parametrize(
    "where",
    [("obs", (5, 1), np.nan), ("z", 5, complex(np.nan, 0)), ("info.name", 5, None), ("info.t", (5, 2), float("nan"))],
)
def test_null_rows_finds_a_null_of_each_kind(where) -> None:
    """NaN in float, complex and tensor arrays, None in object arrays, in nested ``Batch``es; rows by slice or index."""
    key, index, value = where
    batch = storage()
    target = batch
    *parents, leaf = key.split(".")
    for parent in parents:
        target = target[parent]
    target[leaf][index] = value
    arrays = tuple(leaf_arrays(batch))
    np.testing.assert_array_equal(null_rows(arrays, slice(0, 8), 8), np.arange(8) == 5)
    np.testing.assert_array_equal(null_rows(arrays, np.array([5, 1, 5]), 3), [True, False, True])


def test_integers_and_booleans_never_count() -> None:
    batch = storage()
    batch.act[:] = np.iinfo(np.int64).min
    batch.done[:] = True
    assert not NullRows(8).any(batch, [(0, 8)])


def test_counts_only_stored_rows_and_follows_writes() -> None:
    batch, nulls = storage(), NullRows(8)
    batch.obs[6, 0] = np.nan
    assert not nulls.any(batch, [(0, 4)])  # row 6 is not stored
    batch.obs[2, 0] = np.nan
    nulls.wrote(np.array([2, 3]))
    assert nulls.any(batch, [(0, 4)])
    batch.obs[2, 0] = 0.0
    nulls.wrote(np.array([2]))
    assert not nulls.any(batch, [(0, 4)])
    batch.obs[3, 0] = np.nan  # not reported as written: not seen
    assert not nulls.any(batch, [(0, 4)])
    nulls.forget()
    assert nulls.any(batch, [(0, 4)])


def test_replaced_or_added_arrays_are_checked_whole() -> None:
    batch, nulls = storage(), NullRows(8)
    assert not nulls.any(batch, [(0, 8)])
    batch.obs = np.full((8, 2), np.nan, np.float32)  # a new array: set_batch, a restore
    assert nulls.any(batch, [(0, 8)])
    batch.obs = np.zeros((8, 2), np.float32)
    assert not nulls.any(batch, [(0, 8)])
    batch.extra = np.array([None] * 8, dtype=object)  # a key added later: its old rows hold None
    assert nulls.any(batch, [(0, 8)])


def test_many_writes_between_checks_fall_back_to_a_whole_check() -> None:
    batch, nulls = storage(), NullRows(8)
    assert not nulls.any(batch, [(0, 8)])
    batch.obs[4, 1] = np.nan
    for _ in range(5):  # 10 rows reported, more than the 8 the storage holds: the next check is a whole one,
        nulls.wrote(np.array([0, 1]))  # which sees row 4 although no write reported it
    assert nulls.any(batch, [(0, 8)])


def test_a_replaced_array_is_not_kept_alive() -> None:
    """What was checked is remembered by weak references: a storage replaced (``set_batch``) frees its arrays."""
    batch, nulls = storage(), NullRows(8)
    assert not nulls.any(batch, [(0, 8)])
    old = weakref.ref(batch.obs)
    batch.obs = np.zeros((8, 2), np.float32)
    gc.collect()
    assert old() is None
    assert not nulls.any(batch, [(0, 8)])
