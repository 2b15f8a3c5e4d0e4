"""PrioritizedReplay: the PER rules, reproducibility, and bad input that changes nothing."""

from __future__ import annotations

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, Schema
from tests.conftest import SCHEMA, make_batch


def snapshot(buf: PrioritizedReplay) -> dict:
    """Everything observable about a buffer, to compare before/after an error."""
    state = buf.state_dict()
    state["leaves"] = buf.tree.leaves()
    state["all_storage"] = {n: a.copy() for n, a in buf.storage.arrays.items()}
    return state


def assert_unchanged(buf: PrioritizedReplay, before: dict) -> None:
    after = snapshot(buf)
    for key in ("position", "size", "max_priority", "rng_state"):
        assert after[key] == before[key], key
    np.testing.assert_array_equal(after["leaves"], before["leaves"])
    for name in before["all_storage"]:
        np.testing.assert_array_equal(after["all_storage"][name], before["all_storage"][name])


@pytest.fixture
def buf(backend: str) -> PrioritizedReplay:
    b = PrioritizedReplay(100, SCHEMA, alpha=0.6, beta=0.4, tree=backend, seed=0)
    b.add(make_batch(40))
    return b


def test_add_returns_ring_indices_and_wraps(backend):
    b = PrioritizedReplay(10, SCHEMA, tree=backend)
    np.testing.assert_array_equal(b.add(make_batch(7)), np.arange(7))
    np.testing.assert_array_equal(b.add(make_batch(5, start=7)), [7, 8, 9, 0, 1])
    assert len(b) == 10
    # oldest rows were overwritten: slot 0 holds transition 10
    assert b.storage.arrays["action"][0] == 10 and b.storage.arrays["action"][2] == 2


def test_strided_and_fortran_ordered_arrays_are_stored_like_contiguous_ones(backend):
    want = PrioritizedReplay(16, SCHEMA, tree=backend)
    want.add(make_batch(12))
    got = PrioritizedReplay(16, SCHEMA, tree=backend)
    odd = {name: np.repeat(a, 2, axis=0)[::2] for name, a in make_batch(12).items()}  # every other row
    odd["obs"] = np.asfortranarray(make_batch(12)["obs"])
    assert not odd["action"].flags.c_contiguous and not odd["obs"].flags.c_contiguous
    got.add(odd)
    for name in SCHEMA:
        np.testing.assert_array_equal(got.storage.arrays[name], want.storage.arrays[name])


def test_sample_gathers_the_rows_of_its_indices(buf):
    s = buf.sample(32)
    np.testing.assert_array_equal(s.data["action"], s.indices)
    np.testing.assert_array_equal(s.data["obs"][:, 0], s.indices.astype(np.float32))
    assert s.data["obs"].shape == (32, 3) and s.weights.shape == (32,)
    assert s.data["obs"].dtype == np.float32 and s.data["action"].dtype == np.int64


def test_new_items_get_max_priority_and_updates_follow_td(buf):
    alpha, eps = buf.alpha, buf.eps
    np.testing.assert_allclose(buf.tree.get([0, 39]), [1.0, 1.0])  # initial max priority 1
    buf.update_priorities([3, 4], [2.0, 0.0])
    np.testing.assert_allclose(buf.tree.get([3, 4]), [(2.0 + eps) ** alpha, eps**alpha], rtol=1e-6)
    assert buf.max_priority == pytest.approx(2.0 + eps)
    idx = buf.add(make_batch(1, start=40))
    np.testing.assert_allclose(buf.tree.get(idx), [(2.0 + eps) ** alpha], rtol=1e-6)


def test_weights_normalised_by_buffer_max_not_batch_max(buf):
    rng = np.random.default_rng(1)
    td = rng.random(40) * 5
    buf.update_priorities(np.arange(40), td)
    p = (td + buf.eps) ** buf.alpha
    s = buf.sample(16, beta=0.7)
    n = len(buf)
    full = (n * p / p.sum()) ** -0.7
    np.testing.assert_allclose(s.weights, full[s.indices] / full.max(), rtol=1e-5)


def test_alpha_zero_is_uniform(backend):
    b = PrioritizedReplay(50, SCHEMA, alpha=0.0, tree=backend, seed=3)
    b.add(make_batch(50))
    b.update_priorities(np.arange(50), np.linspace(0, 100, 50))
    np.testing.assert_allclose(b.tree.get(np.arange(50)), 1.0)
    assert np.all(b.sample(64, beta=1.0).weights == 1.0)


def test_same_seed_same_samples(backend):
    runs = []
    for _ in range(2):
        b = PrioritizedReplay(100, SCHEMA, tree=backend, seed=123)
        b.add(make_batch(100))
        out = []
        for step in range(5):
            s = b.sample(8)
            b.update_priorities(s.indices, np.full(8, step + 0.5))
            out.append(s.indices)
        runs.append(np.concatenate(out))
    np.testing.assert_array_equal(runs[0], runs[1])


def test_schema_from_spaces():
    gym = pytest.importorskip("gymnasium")
    obs = gym.spaces.Box(-1, 1, (4,), np.float32)
    schema = Schema.from_spaces(obs, gym.spaces.Discrete(2))
    assert list(schema) == ["obs", "action", "reward", "next_obs", "done"]
    assert schema["obs"].shape == (4,) and schema["action"].dtype == np.int64
    dict_schema = Schema.from_spaces(gym.spaces.Dict({"a": obs, "b": gym.spaces.Discrete(3)}), obs)
    assert list(dict_schema) == ["obs/a", "obs/b", "action", "reward", "next_obs/a", "next_obs/b", "done"]


# -- bad input: a precise error, and the buffer exactly as before ---------------------


@pytest.mark.parametrize(
    "td, error, match",
    [
        ([1.0, np.nan, 1.0], ValueError, "position 1"),
        ([np.inf, 1.0, 1.0], ValueError, "position 0"),
        ([1.0, 1.0, -0.1], ValueError, "position 2"),
        ([1.0, 1.0], ValueError, "3 indices but 2 TD errors"),
    ],
)
def test_bad_td_errors(buf, td, error, match):
    before = snapshot(buf)
    with pytest.raises(error, match=match):
        buf.update_priorities([1, 2, 3], td)
    assert_unchanged(buf, before)


@pytest.mark.parametrize(
    "idx, match", [([1, 40, 2], "position 1"), ([1, -1, 2], "position 1"), ([0, 1, 100], "position 2")]
)
def test_bad_indices(buf, idx, match):
    before = snapshot(buf)
    with pytest.raises(IndexError, match=match):
        buf.update_priorities(idx, [1.0, 1.0, 1.0])
    assert_unchanged(buf, before)


def test_float_indices_rejected(buf):
    before = snapshot(buf)
    with pytest.raises(TypeError, match="integers"):
        buf.update_priorities([1.5, 2.0], [1.0, 1.0])
    assert_unchanged(buf, before)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b.pop("reward"), r"missing \['reward'\]"),
        (lambda b: b.update(extra=np.zeros(4)), r"unknown \['extra'\]"),
        (lambda b: b.update(obs=np.zeros((4, 5), np.float32)), r"field 'obs': expected shape \(n, 3\), got \(4, 5\)"),
        (lambda b: b.update(reward=np.zeros((4, 1), np.float32)), r"field 'reward': expected shape \(n,\)"),
        (lambda b: b.update(action=np.zeros(4, np.float32)), r"field 'action': dtype float32 does not cast to int64"),
        (lambda b: b.update(done=np.zeros(3, np.float32)), "field 'done' has 3 rows but 'obs' has 4"),
    ],
)
def test_bad_batches(buf, mutate, match):
    batch = make_batch(4)
    mutate(batch)
    before = snapshot(buf)
    with pytest.raises(ValueError, match=match):
        buf.add(batch)
    assert_unchanged(buf, before)


def test_batch_larger_than_capacity(buf):
    before = snapshot(buf)
    with pytest.raises(ValueError, match="does not fit a capacity of 100"):
        buf.add(make_batch(101))
    assert_unchanged(buf, before)


def test_bad_sample_calls(backend):
    b = PrioritizedReplay(10, SCHEMA, tree=backend)
    with pytest.raises(ValueError, match="empty buffer"):
        b.sample(4)
    b.add(make_batch(3))
    before = snapshot(b)
    for bad in (0, -3, 2**63):
        with pytest.raises(ValueError, match="batch_size"):
            b.sample(bad)
    for bad in (2.5, True, "4", None):
        with pytest.raises(TypeError, match="batch_size"):
            b.sample(bad)
    with pytest.raises(ValueError, match="beta"):
        b.sample(4, beta=1.5)
    assert_unchanged(b, before)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(alpha=-0.1), "alpha"),
        (dict(beta=-0.1), "beta"),
        (dict(beta=1.1), "beta"),
        (dict(eps=float("nan")), "eps"),
        (dict(capacity=0), "capacity"),
        (dict(tree="quantum"), "unknown tree backend"),
        (dict(fanout=5), "fanout"),
    ],
)
def test_bad_construction(kwargs, match):
    args = dict(capacity=10, schema=SCHEMA) | kwargs
    with pytest.raises(ValueError, match=match):
        PrioritizedReplay(**args)


# -- what a sharded replay's shards need of the engine ------------------------------------------------


def test_gather_at_descends_at_the_given_masses_and_refuses_masses_outside_the_total() -> None:
    buf = PrioritizedReplay(16, SCHEMA, alpha=1.0, eps=0.0, seed=0)
    buf.add(make_batch(8))
    buf.update_priorities(np.arange(8), np.arange(1, 9, dtype=np.float64))  # total 36
    rows, idx, prio = buf.gather_at(np.array([0.0, 0.99, 1.0, 35.9]))
    np.testing.assert_array_equal(idx, [0, 0, 1, 7])
    np.testing.assert_array_equal(prio, [1, 1, 2, 8])
    np.testing.assert_array_equal(rows["action"], [0, 0, 1, 7])
    state = str(buf.rng.bit_generator.state), buf.priorities.leaves().tobytes()
    for bad in ([36.0], [-1.0], [np.nan]):
        with pytest.raises(ValueError, match="mass at position 0"):
            buf.gather_at(np.array(bad))
    assert (str(buf.rng.bit_generator.state), buf.priorities.leaves().tobytes()) == state


def test_lift_max_priority_only_raises_and_refuses_bad_values() -> None:
    buf = PrioritizedReplay(16, SCHEMA, alpha=1.0, seed=0)
    buf.lift_max_priority(5.0)
    buf.lift_max_priority(2.0)
    assert buf.max_priority == 5.0
    for bad, error in ((np.nan, ValueError), (np.inf, ValueError), ("3", TypeError), (1e300, ValueError)):
        with pytest.raises(error, match="max_priority|priority"):
            buf.lift_max_priority(bad)  # type: ignore[arg-type]
    assert buf.max_priority == 5.0
    buf.add(make_batch(2))
    np.testing.assert_array_equal(buf.priorities.leaves()[:2], [5.0, 5.0])


def test_update_priorities_since_takes_one_epoch_per_entry() -> None:
    buf = PrioritizedReplay(4, SCHEMA, alpha=1.0, eps=0.0, seed=0)
    epoch0 = buf.track_writes()
    buf.add(make_batch(4))
    epoch1 = buf.write_epoch
    buf.add(make_batch(1, start=10))  # rewrites slot 0
    dropped, _ = buf.update_priorities_since(
        np.array([0, 1, 0]), np.array([7.0, 8.0, 9.0]), np.array([epoch1, epoch1, buf.write_epoch])
    )
    assert dropped == 1  # slot 0 as drawn at epoch1 held another row; at the current epoch it is the same row
    np.testing.assert_array_equal(buf.priorities.leaves()[:2], [9.0, 8.0])
    assert epoch0 == 0


def test_checked_rows_of_its_schema_are_taken_unchecked_and_others_are_checked(buf):
    """An adapter's staged rows (CheckedRows of the replay's own schema) skip the batch checks; rows vouched for
    another schema object, even an equal one, are checked as any batch."""
    from hetero_replay.extend import CheckedRows
    from hetero_replay.storage.base import check_host_batch

    storage = buf.storage
    rows = CheckedRows(storage.schema, make_batch(4, start=40))
    assert check_host_batch(storage.schema, storage.capacity, rows) == (4, rows)
    assert check_host_batch(storage.schema, storage.capacity, rows)[1] is rows
    np.testing.assert_array_equal(buf.add(rows), np.arange(40, 44))
    np.testing.assert_array_equal(buf.storage.gather(np.arange(40, 44))["action"], np.arange(40, 44))
    bad = make_batch(4, start=44)
    bad["action"] = bad["action"].astype(np.float32)
    before = snapshot(buf)
    with pytest.raises(ValueError, match="field 'action': dtype float32 does not cast to int64"):
        buf.add(CheckedRows(Schema(SCHEMA), bad))  # an equal schema, not the replay's: checked
    with pytest.raises(ValueError, match="does not fit a capacity of 100"):
        buf.add(CheckedRows(storage.schema, make_batch(101)))
    assert_unchanged(buf, before)


def test_checked_rows_that_break_their_promise_are_refused_by_the_row_write_changing_nothing() -> None:
    """The host storage's C++ row write still refuses an array of another dtype, or arrays of differing row
    counts, before writing anything."""
    from hetero_replay.extend import CheckedRows

    buf = PrioritizedReplay(100, SCHEMA, seed=0)
    buf.add(make_batch(40))
    bad = make_batch(4, start=40)
    bad["action"] = bad["action"].astype(np.float32)
    before = snapshot(buf)
    with pytest.raises(ValueError, match="must have the field's dtype"):
        buf.add(CheckedRows(buf.storage.schema, bad))
    assert_unchanged(buf, before)
    short = make_batch(4, start=40)
    short["done"] = short["done"][:3]
    with pytest.raises(ValueError, match="arrays differ in rows"):
        buf.add(CheckedRows(buf.storage.schema, short))
    assert_unchanged(buf, before)


def test_new_rows_get_the_max_priority_of_the_moment_whatever_the_batch_lengths_before(backend):
    """assign_new reuses its array of new priorities: it must follow max_priority, alpha and the batch length."""
    buf = PrioritizedReplay(64, SCHEMA, alpha=0.5, tree=backend, seed=0)
    buf.add(make_batch(4))
    buf.add(make_batch(4, start=4))
    buf.update_priorities(np.arange(2), np.array([3.0, 0.5]))  # max priority 3 + eps
    buf.add(make_batch(4, start=8))
    buf.add(make_batch(3, start=12))
    buf.alpha = 1.0
    buf.add(make_batch(3, start=15))
    leaves = buf.tree.leaves()[:18]
    high = buf.max_priority
    np.testing.assert_allclose(leaves[2:8], 1.0, rtol=1e-6)
    np.testing.assert_allclose(leaves[8:15], high**0.5, rtol=1e-6)
    np.testing.assert_allclose(leaves[15:18], high, rtol=1e-6)
