"""``Priorities.update_since``: the one rule for late priority updates, which every replay and adapter uses.

An update computed from a batch drawn at write epoch ``e`` drops the entries
whose slot was written after ``e``; with ``keep_undo`` it returns a snapshot
that ``restore`` undoes the update with exactly; a refused call changes nothing.
New transitions get ``max_priority ** alpha`` as those two are now.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetero_replay import PEROptions
from hetero_replay.priorities import Priorities

#: The rule runs in C++ on the native tree (the native executor's code) and in NumPy on the others:
#: every test of it runs on both, and on float64 leaves.
TREES = [("native", "float32"), ("native", "float64"), ("numpy", "float32")]


@pytest.fixture(params=TREES, ids=["-".join(t) for t in TREES])
def tree(request: pytest.FixtureRequest) -> tuple[str, str]:
    return request.param


def tracked(tree: tuple[str, str], capacity: int = 8, filled: int = 6) -> tuple[Priorities, int]:
    """Priorities with ``filled`` slots written, then slot 0 rewritten; returns them and the epoch in between."""
    backend, dtype = tree
    p = Priorities(capacity, PEROptions(alpha=1.0, eps=0.5, tree=backend, priority_dtype=dtype))
    p.track_writes()
    p.assign_new(np.arange(filled))
    epoch = p.write_epoch
    p.assign_new(np.array([0]))
    return p, epoch


def test_entries_of_rewritten_slots_are_dropped_the_rest_land(tree: tuple[str, str]) -> None:
    p, epoch = tracked(tree)
    dropped, snapshot = p.update_since(np.array([0, 1, 2]), np.array([5.0, 6.0, 7.0]), epoch)
    assert (dropped, snapshot) == (1, None)
    np.testing.assert_array_equal(p.leaves()[:3], [1.0, 6.5, 7.5])  # slot 0 keeps its new transition's priority
    assert p.max_priority == 7.5
    # drawn now: nothing was rewritten since, every entry lands
    assert p.update_since(np.array([0]), np.array([1.0]), p.write_epoch) == (0, None)
    assert p.leaves()[0] == 1.5


def test_one_epoch_per_entry(tree: tuple[str, str]) -> None:
    p, epoch = tracked(tree)
    # slot 0 as drawn before its rewrite, slot 0 as drawn after it, slot 1 as drawn before its first write
    epochs = np.array([epoch, p.write_epoch, 0])
    dropped, _ = p.update_since(np.array([0, 0, 1]), np.array([3.0, 4.0, 2.0]), epochs)
    assert dropped == 2
    np.testing.assert_array_equal(p.leaves()[:2], [4.5, 1.0])


def test_keep_undo_restores_exactly_what_the_update_changed(tree: tuple[str, str]) -> None:
    p, epoch = tracked(tree)
    p.update(np.array([3]), np.array([2.0]))
    before, max_before = p.leaves(), p.max_priority
    dropped, snapshot = p.update_since(np.array([0, 3, 4]), np.array([9.0, 8.0, 7.0]), epoch, keep_undo=True)
    assert dropped == 1 and snapshot is not None
    np.testing.assert_array_equal(snapshot.indices, [3, 4])  # the entries kept: the slots the update changed
    assert p.max_priority == 8.5
    p.restore(snapshot)
    np.testing.assert_array_equal(p.leaves(), before)
    assert p.max_priority == max_before


def test_torch_td_errors_are_selected_where_they_live(tree: tuple[str, str]) -> None:
    p, epoch = tracked(tree)
    dropped, _ = p.update_since(np.array([0, 2]), torch.tensor([3.0, 4.0]), epoch)
    assert dropped == 1 and p.leaves()[2] == 4.5


@pytest.mark.parametrize("stale", [True, False], ids=["stale-entries", "none-stale"])
def test_refused_calls_change_nothing(stale: bool, tree: tuple[str, str]) -> None:
    p, epoch = tracked(tree)
    at = epoch if stale else p.write_epoch
    before = p.leaves()
    with pytest.raises(ValueError, match="TD errors|priorities"):
        p.update_since(np.array([0, 1, 2]), np.array([1.0, 2.0]), at)
    with pytest.raises(ValueError):
        p.update_since(np.array([1, 2]), np.array([1.0, np.nan]), at)
    with pytest.raises(IndexError, match="position 1 is 7, which holds no stored transition"):
        p.update_since(np.array([1, 7]), np.array([1.0, 2.0]), at, filled_only=True)
    with pytest.raises(IndexError):
        p.update_since(np.array([1, 7]), np.array([1.0, 2.0]), at, limit=6)
    np.testing.assert_array_equal(p.leaves(), before)
    assert p.max_priority == 1.0


def test_needs_track_writes(tree: tuple[str, str]) -> None:
    p = Priorities(4, PEROptions(tree=tree[0], priority_dtype=tree[1]))
    with pytest.raises(RuntimeError, match="track_writes"):
        p.update_since(np.array([0]), np.array([1.0]), 0)


def test_the_native_and_numpy_rules_agree_on_random_writes_and_late_updates() -> None:
    """Random adds, clears and late updates (some refused) give both trees the same drops, leaves and max."""
    rng = np.random.default_rng(7)
    pair = [
        Priorities(32, PEROptions(alpha=0.7, eps=0.01, tree=b, priority_dtype="float64")) for b in ("native", "numpy")
    ]
    for p in pair:
        p.track_writes()
        p.assign_new(np.arange(20))
    epochs = [0]
    for step in range(300):
        kind = rng.integers(3)
        idx = rng.integers(0, 24, 8)
        if kind == 0:
            for p in pair:
                p.assign_new(idx[:2]) if step % 2 else p.clear(idx[:1])
            epochs.append(pair[0].write_epoch)
            continue
        td = rng.exponential(1.0, 8)
        if kind == 2 and step % 5 == 0:
            td[3] = np.nan  # refused by both, changing nothing
        epoch = int(rng.choice(epochs[-6:]))
        outcomes = []
        for p in pair:
            try:
                outcomes.append(p.update_since(idx, td, epoch, filled_only=kind == 2))
            except (ValueError, IndexError) as e:
                outcomes.append(type(e).__name__)
        assert outcomes[0] == outcomes[1], f"step {step}"
        np.testing.assert_array_equal(pair[0].leaves(), pair[1].leaves())
        assert pair[0].max_priority == pair[1].max_priority


def test_check_filled_names_the_first_empty_slot(tree: tuple[str, str]) -> None:
    p, _ = tracked(tree)
    p.check_filled(np.array([0, 5]))
    p.clear(np.array([5]))
    with pytest.raises(IndexError, match="position 1 is 5"):
        p.check_filled(np.array([0, 5]))


def test_new_transitions_get_max_priority_to_the_current_alpha_whatever_changed_it() -> None:
    # new_priority() keeps its last value while max_priority and alpha stay: every change must show.
    p = Priorities(8, PEROptions(alpha=0.5, eps=0.01))
    p.assign_new(np.arange(2))
    assert p.leaves()[1] == np.float32(1.0)
    p.update(np.array([0]), np.array([8.99]))  # max priority 9
    p.assign_new(np.array([2]))
    assert p.leaves()[2] == np.float32(3.0)
    p.alpha = 1.0
    p.assign_new(np.array([3]))
    assert p.leaves()[3] == np.float32(9.0)
    snapshot = p.snapshot(np.array([1]))
    p.update(np.array([1]), np.array([15.99]))  # max priority 16, then undone
    p.restore(snapshot)
    p.assign_new(np.array([4]))
    assert p.leaves()[4] == np.float32(9.0)
    p.load(p.leaves(), max_priority=4.0)
    p.assign_new(np.array([5]))
    assert p.leaves()[5] == np.float32(4.0)


@pytest.mark.parametrize(
    "written_at", [[0] * 8, np.zeros(8, np.int32), np.zeros(4, np.int64), np.zeros((8, 2), np.int64)[:, 0]]
)
def test_the_native_rule_refuses_write_epochs_it_cannot_read(written_at: object) -> None:
    p, _ = tracked(("native", "float32"))
    before = p.leaves()
    with pytest.raises(ValueError, match="written_at must be a C-contiguous int64 array of capacity entries"):
        p.tree.update_td_since(np.array([1]), np.array([1.0]), 1.0, 0.0, None, written_at, 0)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(p.leaves(), before)
