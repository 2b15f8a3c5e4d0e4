"""ShardedReplay's errors arrive at once and where the user called, and one run never takes another's data.

Real Ray actors, real SIGKILL. Each test would otherwise wait out ``recovery_timeout``
(120 s) or go on silently with the wrong shards or rows.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")

from hetero_replay import PrioritizedReplay  # noqa: E402
from hetero_replay.distributed import (
    ShardedReplay,  # noqa: E402
    cluster,  # noqa: E402
)

SCHEMA = {"id": ((), np.int64), "obs": ((3,), np.float32)}

pytestmark = pytest.mark.usefixtures("ray_local")


def rows(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"id": ids.astype(np.int64), "obs": np.repeat(ids[:, None], 3, axis=1).astype(np.float32)}


def unique(name: str) -> str:
    return f"{name}-{os.getpid()}-{np.random.default_rng().integers(1 << 30)}"


def test_a_typo_in_disk_storage_options_is_a_type_error_before_any_shard_starts(tmp_path) -> None:
    name = unique("typo")
    with pytest.raises(TypeError, match="ram_byte"):
        ShardedReplay(
            2, 64, SCHEMA, storage="disk", durable_dir=str(tmp_path), storage_options={"ram_byte": 1}, name=name
        )
    with pytest.raises(ValueError, match="durable_dir"):
        ShardedReplay(
            2, 64, SCHEMA, storage="disk", durable_dir=str(tmp_path), storage_options={"path": "x"}, name=name
        )
    assert cluster.running_shards(name) == []
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("abandon_after", -1, ValueError),
        ("abandon_after", float("nan"), ValueError),
        ("read_threads", 0, ValueError),
        ("ram_bytes", "x", TypeError),
        ("ram_bytes", True, TypeError),
    ],
)
def test_a_bad_disk_storage_option_value_is_refused_at_once_before_any_shard_starts(
    tmp_path, option, value, error
) -> None:
    # Before, the learner checked names only: the shards' constructors raised, reported as ShardLostError.
    name = unique("badvalue")
    durable = tmp_path / "durable"
    with pytest.raises(error, match=f"storage_options {option}"):
        ShardedReplay(
            2, 64, SCHEMA, storage="disk", durable_dir=str(durable), storage_options={option: value}, name=name
        )
    assert cluster.running_shards(name) == []
    assert not durable.exists()


def test_a_durable_dir_others_could_change_is_refused_at_once_before_any_shard_starts(tmp_path) -> None:
    """Shards' files have names known in advance (shard-0, ...): durable_dir is private as a disk buffer's
    directory is, and no directory above it is writable by others without the sticky bit."""
    name = unique("opendir")
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    for durable, what in ((open_dir / "durable", "above it is writable by other"), (open_dir, "writable by other")):
        for storage in ("host", "disk"):
            with pytest.raises(ValueError, match=f"durable_dir=.*{what}"):
                ShardedReplay(2, 64, SCHEMA, storage=storage, durable_dir=str(durable), name=name)
            assert cluster.running_shards(name) == []
            assert os.listdir(open_dir) == []
    replay = ShardedReplay(2, 64, SCHEMA, durable_dir=str(tmp_path / "a" / "durable"), name=name)
    try:
        assert oct((tmp_path / "a" / "durable").stat().st_mode & 0o777) == oct(0o700)
        assert oct((tmp_path / "a").stat().st_mode & 0o777) == oct(0o700)
    finally:
        replay.close()


def test_a_shard_that_fails_to_start_is_reported_at_once_and_none_is_left_running(small_tmpfs) -> None:
    name = unique("nostart")
    # A real full disk: each shard's ring control block (8 bytes a slot) does not fit in 1 MiB.
    with pytest.raises(cluster.ShardLostError, match="failed to start"):
        ShardedReplay(2, 1 << 18, SCHEMA, storage="disk", durable_dir=str(small_tmpfs / "durable"), name=name)
    assert cluster.running_shards(name) == []


def test_an_update_naming_a_never_filled_slot_is_refused_and_sampling_goes_on() -> None:
    replay = ShardedReplay(2, 64, SCHEMA, seed=0)
    try:
        replay.add(rows(np.arange(8)))  # 4 rows on each shard
        batch = replay.sample(8)
        forged = batch.indices.copy()
        forged["slot"][3] = 40  # inside the capacity, never written
        with pytest.raises(IndexError, match=r"indices\[3\].*slot 40.*never filled"):
            replay.update_priorities(forged, np.ones(8))
        replay.update_priorities(batch.indices, np.ones(8))
        again = replay.sample(64)
        assert set(again.data["id"]) <= set(range(8))
    finally:
        replay.close()


def test_a_closed_replay_and_its_writers_fail_at_once_saying_so() -> None:
    replay = ShardedReplay(2, 64, SCHEMA, seed=0, recovery_timeout=3600)
    writer = replay.writer()
    assert writer.recovery_timeout == 3600  # the replay's own
    writer.add(rows(np.arange(4)))  # the writer has found the shards
    replay.close()
    # Before: the writer waited recovery_timeout for shards that were killed for good.
    with pytest.raises(cluster.ShardLostError, match="closed"):
        writer.add(rows(np.arange(4)))
    for call in (lambda: replay.sample(4), lambda: replay.add(rows(np.arange(2))), replay.flush, replay.writer):
        with pytest.raises(RuntimeError, match="closed"):
            call()


def test_a_name_reused_with_another_schema_is_refused_and_the_first_replays_shards_live_on() -> None:
    name = unique("taken")
    first = ShardedReplay(2, 64, SCHEMA, seed=0, name=name)
    try:
        first.add(rows(np.arange(10)))
        other = {"id": ((), np.int64), "obs": ((5,), np.float32)}
        with pytest.raises(ValueError, match=rf"{name}.*\(3,\).*\(5,\)"):
            ShardedReplay(2, 64, other, name=name)
        with pytest.raises(ValueError, match="capacity"):
            ShardedReplay(2, 32, SCHEMA, name=name)
        assert len(first) == 10  # still there: the refused replay killed nothing
        assert len(cluster.running_shards(name)) == 2
    finally:
        first.close()


def test_an_old_durable_dir_is_refused_unless_reopen_and_reopen_continues_its_rows(tmp_path) -> None:
    for storage in ("host", "disk"):
        where = str(tmp_path / storage)
        old = ShardedReplay(2, 64, SCHEMA, seed=0, storage=storage, durable_dir=where)
        old.add(rows(np.arange(20)))
        old.flush()
        old.close()
        with pytest.raises(ValueError, match="reopen=True"):
            ShardedReplay(2, 64, SCHEMA, seed=0, storage=storage, durable_dir=where)
        again = ShardedReplay(2, 64, SCHEMA, seed=0, storage=storage, durable_dir=where, reopen=True)
        try:
            assert len(again) == 20
        finally:
            again.close()
    with pytest.raises(ValueError, match="holds no shard"):
        ShardedReplay(2, 64, SCHEMA, durable_dir=str(tmp_path / "empty"), reopen=True)


@pytest.mark.parametrize("storage", ["host", "disk"])
def test_close_makes_a_last_durable_point_and_releases_the_files_for_an_immediate_reopen(tmp_path, storage) -> None:
    where = str(tmp_path)
    never = {"flush_every": 10**9, "flush_seconds": 3600}  # no durable point but close's own
    for attempt in range(3):  # before: the killed shard still held its lock when the next one opened it
        replay = ShardedReplay(2, 64, SCHEMA, seed=0, storage=storage, durable_dir=where, reopen=attempt > 0, **never)
        try:
            assert len(replay) == 12 * attempt
            replay.add(rows(np.arange(12 * attempt, 12 * attempt + 10)))
            replay.writer().add(rows(np.arange(12 * attempt + 10, 12 * attempt + 12)))  # queued in its shard
        finally:
            replay.close()


def test_shards_started_before_one_failed_release_their_files_for_an_immediate_retry(tmp_path) -> None:
    def disk(shard: int, reopen: bool) -> PrioritizedReplay:
        options = {"path": os.path.join(tmp_path, f"shard-{shard}"), "reopen": reopen}
        return PrioritizedReplay(64, SCHEMA, storage="disk", storage_options=options)

    holder = disk(1, reopen=False)
    with pytest.raises(cluster.ShardLostError, match="shard 1 .*owned by another learner"):
        ShardedReplay(2, 64, SCHEMA, seed=0, storage="disk", durable_dir=str(tmp_path), reopen=True)
    disk(0, reopen=True).close()  # before: shard 0, started by the failed call and killed, could still hold it
    holder.close()
    replay = ShardedReplay(2, 64, SCHEMA, seed=0, storage="disk", durable_dir=str(tmp_path), reopen=True)
    try:
        assert len(replay) == 0
    finally:
        replay.close()


def test_a_shard_whose_last_durable_point_fails_raises_from_close_after_the_others_are_saved(tmp_path) -> None:
    never = {"flush_every": 10**9, "flush_seconds": 3600}
    replay = ShardedReplay(2, 64, SCHEMA, seed=0, durable_dir=str(tmp_path), **never)
    replay.add(rows(np.arange(10)))
    pids = replay.shard_pids()
    (tmp_path / "shard-0.hrp" / "in-the-way").mkdir(parents=True)  # shard 0 cannot save over a directory
    with pytest.raises(IsADirectoryError, match="shard-0.hrp"):
        replay.close()
    assert replay.closed
    assert (tmp_path / "shard-1.hrp").is_file()  # shard 1 made its last durable point all the same
    _wait_gone(pids)


def test_close_kills_a_shard_that_does_not_answer_within_recovery_timeout() -> None:
    replay = ShardedReplay(2, 64, SCHEMA, seed=0, recovery_timeout=1.0)
    pids = replay.shard_pids()
    replay._shards[1].__ray_call__.remote(lambda shard: time.sleep(3600))  # busy: its close() waits behind this
    start = time.monotonic()
    replay.close()
    assert replay.closed
    assert time.monotonic() - start < 60  # a bound on a hang, not a speed: close waits 1 s for the busy shard
    _wait_gone(pids)


def _wait_gone(pids: list[int]) -> None:
    deadline = time.monotonic() + 60
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in pids)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_disk_shard_killed_before_its_first_durable_point_restarts_empty(tmp_path) -> None:
    replay = ShardedReplay(
        2, 64, SCHEMA, seed=0, storage="disk", durable_dir=str(tmp_path), flush_every=10**9, flush_seconds=3600
    )
    try:
        replay.add(rows(np.arange(16)))
        assert [s.size for s in replay.summaries] == [8, 8]
        os.kill(replay.shard_pids()[1], signal.SIGKILL)
        batch = replay.sample(8)  # waits for the restart (before: the restarted shard refused its own files)
        assert replay.stats["recoveries"] >= 1
        assert [s.size for s in replay.summaries] == [8, 0]  # nothing of shard 1 was durable
        assert (batch.indices["shard"] == 0).all()
        replay.add(rows(np.arange(100, 104)))
        replay.flush()
        assert [s.size for s in replay.summaries] == [10, 2]
    finally:
        replay.close()
