"""Bad input to the engine: refused with a precise error, and nothing changes.

Each case here was accepted (or crashed the process) before issue 10.
"""

from __future__ import annotations

import numpy as np
import pytest

from hetero_replay import PEROptions, Priorities, PrioritizedReplay, _native
from hetero_replay.storage import Field, Schema
from hetero_replay.trees import make_tree
from hetero_replay.trees.base import max_leaf
from tests.conftest import SCHEMA, make_batch
from tests.test_replay import assert_unchanged, snapshot

# -- priorities whose sums would overflow ----------------------------------------------


# 64 leaves of these overflow: the float32 sum past 3.4e38, the float64 one past 1.8e308.
@pytest.mark.parametrize("dtype, huge", [("float32", 1e38), ("float64", 1e307)])
def test_tree_refuses_priorities_whose_sums_overflow(backend, dtype, huge):
    tree = make_tree(backend, 64, 16, dtype)
    tree.update(np.arange(64), np.ones(64))
    before = tree.leaves()
    with pytest.raises(ValueError, match=r"priority at position 0 .* capacity 64"):
        tree.update(np.arange(8), np.full(8, huge))
    with pytest.raises(ValueError, match=r"TD error at position 0 .* exceeds the largest priority"):
        tree.update_td(np.arange(8), np.full(8, huge), 1.0, 0.0)
    with pytest.raises(ValueError, match="priorit"):
        tree.load_leaves(np.full(64, huge))
    np.testing.assert_array_equal(tree.leaves(), before)
    assert np.isfinite(tree.total())
    # the bound itself is accepted, and 64 leaves at the bound sum to a finite total
    tree.load_leaves(np.full(64, tree.max_leaf))
    assert tree.max_leaf == max_leaf(dtype, 64) and np.isfinite(tree.total())


def test_buffer_refuses_overflowing_td_errors_and_samples_stay_spread(backend):
    buf = PrioritizedReplay(64, SCHEMA, alpha=1.0, tree=backend, seed=0)
    buf.add(make_batch(64))
    before = snapshot(buf)
    with pytest.raises(ValueError, match="exceeds the largest priority"):
        buf.update_priorities(np.arange(8), np.full(8, 1e38))
    assert_unchanged(buf, before)
    assert len(np.unique(buf.sample(256).indices)) > 32  # not every draw on one index


def test_checkpoint_with_overflowing_priorities_is_refused(tmp_path):
    buf = PrioritizedReplay(64, SCHEMA, alpha=1.0, seed=0)
    buf.add(make_batch(64))
    state = buf.state_dict()
    state["priorities"] = np.full(64, 1e38, np.float32)
    with pytest.raises(ValueError, match="priorit"):
        PrioritizedReplay.from_state_dict(state)


@pytest.mark.parametrize("max_priority", [float("nan"), -1.0, 0.0, float("inf"), 1e300, "1"])
def test_checkpoint_with_a_bad_max_priority_is_refused(tmp_path, max_priority):
    buf = PrioritizedReplay(64, SCHEMA, seed=0)
    buf.add(make_batch(10))
    state = buf.state_dict()
    state["max_priority"] = max_priority
    with pytest.raises((ValueError, TypeError), match="max_priority|priority of new transitions"):
        PrioritizedReplay.from_state_dict(state)


def test_failed_add_after_raising_alpha_changes_nothing(backend):
    buf = PrioritizedReplay(64, SCHEMA, alpha=1.0, tree=backend, seed=0)
    buf.add(make_batch(10))
    buf.update_priorities([0], [1e30])  # max_priority 1e30: fine at alpha 1
    buf.alpha = 2.0  # 1e60 overflows float32: every new transition's priority would be inf
    before = snapshot(buf)
    with pytest.raises(ValueError, match="priority of new transitions"):
        buf.add(make_batch(5, start=10))
    assert_unchanged(buf, before)


def test_refused_sample_leaves_the_generator_as_it_was(backend):
    buf = PrioritizedReplay(16, SCHEMA, tree=backend, seed=3)
    buf.add(make_batch(4))
    buf.update_priorities(np.arange(4), np.zeros(4))
    buf.eps = 0.0  # priorities stay as they are; now set them all to 0
    buf.update_priorities(np.arange(4), np.zeros(4))
    before = buf.rng.bit_generator.state
    with pytest.raises(ValueError, match="no priority mass"):
        buf.sample(8)
    assert buf.rng.bit_generator.state == before


# -- schemas ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [object, "U4", "S4", "V8", [("a", "f4"), ("b", "i4")], "datetime64[s]", None])
def test_schema_refuses_non_numeric_fields(dtype):
    with pytest.raises(TypeError, match="dtype"):
        Schema({"obs": ((3,), np.float32), "info": ((), dtype)})


@pytest.mark.parametrize("shape", [(4.5,), ("4",), (True,), 4.5])
def test_schema_refuses_non_integer_shapes(shape):
    with pytest.raises(TypeError, match="shape"):
        Field(shape, np.float32)


def test_schema_accepts_plain_numeric_and_bool():
    s = Schema({"a": ((2,), np.bool_), "b": (3, np.uint8), "c": ((), np.float16), "d": ((1,), np.complex64)})
    assert s["b"].shape == (3,)


# -- casts that would change values --------------------------------------------------------


def test_add_refuses_integers_that_do_not_fit_the_field():
    buf = PrioritizedReplay(8, {"a": ((), np.int32), "b": ((), np.uint8)})
    before = snapshot(buf)
    with pytest.raises(ValueError, match=r"field 'a': value 1099511627776 in row 1 does not fit int32"):
        buf.add({"a": np.array([1, 2**40], np.int64), "b": np.zeros(2, np.int64)})
    with pytest.raises(ValueError, match=r"field 'b': value 300 in row 1 does not fit uint8"):
        buf.add({"a": np.zeros(2, np.int64), "b": np.array([3, 300], np.uint16)})
    with pytest.raises(ValueError, match=r"field 'b': dtype int64 does not cast to uint8"):
        buf.add({"a": np.zeros(2, np.int64), "b": np.array([-1, 3])})
    assert_unchanged(buf, before)
    buf.add({"a": np.array([-(2**31), 2**31 - 1], np.int64), "b": np.array([0, 255], np.uint16)})
    np.testing.assert_array_equal(buf.storage.arrays["a"][:2], [-(2**31), 2**31 - 1])


def test_add_refuses_floats_that_overflow_the_field():
    buf = PrioritizedReplay(8, {"x": ((2,), np.float32)})
    with pytest.raises(ValueError, match=r"field 'x': value 1e\+300 in row 1 overflows float32"):
        buf.add({"x": np.array([[0.0, 1.0], [1e300, 2.0]])})
    assert len(buf) == 0
    buf.add({"x": np.array([[np.inf, np.nan]])})  # non-finite input stays what it was
    assert np.isinf(buf.storage.arrays["x"][0, 0])


# -- arguments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"alpha": "0.6"}, TypeError, "alpha must be a real number, got str"),
        ({"alpha": None}, TypeError, "alpha"),
        ({"eps": "1e-6"}, TypeError, "eps must be a real number"),
        ({"beta": None}, TypeError, "beta must be a real number, got NoneType"),
        ({"alpha": 8.0}, ValueError, r"eps \*\* alpha .* underflows to 0 in float32"),
        ({"stratified": "no"}, TypeError, "stratified must be True or False"),
        ({"priority_dtype": None}, TypeError, "priority dtype"),
        ({"priority_dtype": "int32"}, ValueError, "priority dtype must be float32 or float64"),
        ({"fanout": 16.0}, TypeError, "fanout must be an integer"),
        ({"fanout": 3}, ValueError, "fanout must be one of"),
        ({"seed": True}, TypeError, "seed must be an integer or None, got bool"),
        ({"seed": "0"}, TypeError, "seed"),
        ({"seed": -1}, ValueError, "seed must be >= 0"),
    ],
)
def test_bad_constructor_arguments(backend, kwargs, error, match):
    with pytest.raises(error, match=match):
        PrioritizedReplay(8, SCHEMA, tree=backend, **kwargs)


@pytest.mark.parametrize("capacity", [2**63 - 1, 2**62, 2**41])
def test_absurd_capacity_is_refused_at_once(backend, capacity):
    with pytest.raises(ValueError, match=r"capacity must be in \[1, 2\*\*40\]"):
        PrioritizedReplay(capacity, SCHEMA, tree=backend)
    with pytest.raises(ValueError, match="capacity"):
        make_tree(backend, capacity)


def test_setters_refuse_bad_values_and_keep_the_old_ones():
    buf = PrioritizedReplay(8, SCHEMA, alpha=0.6, eps=1e-6)
    with pytest.raises(ValueError, match="underflows"):
        buf.alpha = 8.0
    with pytest.raises(ValueError, match="underflows"):
        buf.eps = 1e-80
    with pytest.raises(TypeError, match="beta"):
        buf.beta = "1"
    assert (buf.alpha, buf.eps, buf.beta) == (0.6, 1e-6, 0.4)


def test_float64_tree_allows_the_smaller_floor():
    buf = PrioritizedReplay(8, SCHEMA, alpha=8.0, priority_dtype="float64")
    buf.add(make_batch(2))
    buf.update_priorities([0, 1], [0.0, 0.0])
    assert buf.tree.min() > 0


def test_native_error_messages_print_values_exactly():
    tree = make_tree("native", 8)
    with pytest.raises(ValueError, match=r"TD error at position 1 is -1e-09;"):
        tree.update_td([0, 1], [0.5, -1e-9], 0.6, 1e-6)
    with pytest.raises(ValueError, match=r"priority at position 0 is -2.5e-07;"):
        tree.update([0], [-2.5e-7])


# -- the thread pool ----------------------------------------------------------------------


@pytest.mark.parametrize("failing_item", [0, 1, 17, 63])
def test_an_exception_on_a_pool_thread_reaches_the_caller(failing_item):
    # Items are claimed by the caller and the workers in whatever order they
    # run, so over these repeats the failing item runs on a worker too.
    for _ in range(50):
        with pytest.raises(RuntimeError, match=f"item {failing_item} failed"):
            _native.run_parallel_for_test(64, 4, failing_item)
    _native.run_parallel_for_test(64, 4, -1)  # the pool still works afterwards


# -- the methods adapters use: refused calls change nothing --------------------------------


def test_refused_write_rows_changes_nothing(backend):
    buf = PrioritizedReplay(16, SCHEMA, tree=backend, seed=0)
    buf.add(make_batch(10))
    before = snapshot(buf)
    good_obs = np.ones((2, 3), np.float32)
    bad_calls = [
        (IndexError, "start", dict(start=16, fields={"obs": good_obs})),
        (IndexError, "start", dict(start=-1, fields={"obs": good_obs})),
        (IndexError, "start", dict(start=2.0, fields={"obs": good_obs})),
        (ValueError, "unknown", dict(start=0, fields={"nope": good_obs})),
        (ValueError, "some of", dict(start=0, fields={})),
        (ValueError, "field 'obs': expected shape", dict(start=0, fields={"obs": np.ones((2, 4))})),
        (ValueError, "overflows float32", dict(start=0, fields={"obs": np.full((2, 3), 1e300)})),
        (ValueError, "rows but", dict(start=0, fields={"obs": good_obs, "reward": np.ones(3)})),
    ]
    for error, match, kwargs in bad_calls:
        with pytest.raises(error, match=match):
            buf.write_rows(**kwargs)
    assert_unchanged(buf, before)
    buf.write_rows(15, {"obs": good_obs})  # wraps: rows 15 and 0
    np.testing.assert_array_equal(buf.storage.arrays["obs"][[15, 0]], good_obs)


def test_refused_read_rows_and_clear_priorities_change_nothing(backend):
    buf = PrioritizedReplay(16, SCHEMA, tree=backend, seed=0)
    buf.add(make_batch(10))
    before = snapshot(buf)
    for bad in ([-1], [16], [3, 99]):
        with pytest.raises(IndexError, match="outside"):
            buf.read_rows("obs", bad)
        with pytest.raises(IndexError, match="outside"):
            buf.clear_priorities(bad)
    with pytest.raises(TypeError, match="integers"):
        buf.read_rows("obs", [1.5])
    assert_unchanged(buf, before)
    np.testing.assert_array_equal(buf.read_rows("action", [2, 12]), [2, 0])  # any slot, filled or not
    buf.clear_priorities([4])
    assert buf.tree.get([4])[0] == 0 and 4 not in buf.sample(512).indices


def test_refused_priorities_load_keeps_leaves_and_max_priority(backend):
    p = Priorities(8, PEROptions(tree=backend))
    p.assign_new(np.arange(8))
    p.update([0], [3.0])
    leaves, max_priority = p.leaves(), p.max_priority
    for bad_leaves, bad_max in (
        (np.ones(8), float("nan")),
        (np.ones(8), "2"),
        (np.full(8, np.nan), 2.0),
        (np.ones(5), 2.0),
        (np.full(8, 1e38), 2.0),
    ):
        with pytest.raises((TypeError, ValueError)):
            p.load(bad_leaves, bad_max)
        np.testing.assert_array_equal(p.leaves(), leaves)
        assert p.max_priority == max_priority
