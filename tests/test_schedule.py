"""The staleness schedule's rule, on its own: which held-back updates the batch of each step sees."""

from __future__ import annotations

import pytest

from hetero_replay.options import StalenessOptions
from hetero_replay.schedule import Schedule


def run(k: int, steps: int) -> dict[int, list[int]]:
    """Serve ``steps`` batches, each followed by its update; return the update steps applied before each draw."""
    schedule = Schedule(k)
    applied_before: dict[int, list[int]] = {}
    for step in range(steps):
        applied = []
        while (update := schedule.due(schedule.served)) is not None:
            applied.append(update.step)
        applied_before[step] = applied
        assert schedule.serve(epoch=100 + step) == step
        update = schedule.record(indices=[step], td_errors=[0.0])
        assert (update.step, update.epoch) == (step, 100 + step)
    return applied_before


@pytest.mark.parametrize("k", [0, 1, 2, 5])
def test_the_batch_of_step_t_sees_exactly_the_updates_of_steps_up_to_t_minus_k_minus_1(k: int) -> None:
    applied_before = run(k, 12)
    seen: list[int] = []
    for t, applied in applied_before.items():
        seen += applied
        assert seen == list(range(t - k)), f"step {t}"


def test_next_pops_in_order_whether_due_or_not_and_put_back_restores_the_front() -> None:
    schedule = Schedule(3)
    for step in range(3):
        schedule.serve(epoch=step)
        schedule.record([step], [0.0])
    assert len(schedule) == 3 and schedule.due(schedule.served) is None  # none due yet with k = 3
    first, second = schedule.next(), schedule.next()
    assert (first.step, second.step) == (0, 1)
    schedule.put_back([first, second])
    assert [schedule.next().step for _ in range(3)] == [0, 1, 2]
    assert schedule.next() is None and not schedule


def test_seen_by_next_is_the_rule_for_the_next_batch() -> None:
    schedule = Schedule(2)
    assert schedule.seen_by_next == -3
    schedule.serve(epoch=0)
    assert schedule.seen_by_next == -2 == schedule.last_seen(1)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (dict(staleness=-1), ValueError, "staleness"),
        (dict(staleness=True), TypeError, "staleness"),
        (dict(staleness=1, prefetch=0), ValueError, "prefetch"),
        (dict(staleness=1, prefetch=1.0), TypeError, "prefetch"),
        (dict(staleness=1, worker="process"), ValueError, "worker"),
    ],
)
def test_staleness_options_refuse_bad_values_naming_them(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        StalenessOptions(**kwargs)


def test_staleness_options_depth_is_what_can_be_drawn_ahead() -> None:
    assert StalenessOptions(2, prefetch=8).depth == 2
    assert StalenessOptions(8, prefetch=2).depth == 2
    assert StalenessOptions(0).depth == 0
