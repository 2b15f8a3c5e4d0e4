"""``storage="shared"`` with ``frames``: each writer process stores each distinct frame once in the record log.

Each actor writes its own real Atari stream (frames of Pong or Breakout from ``tests/data/atari_frames.npz``,
4-frame stacks with random episode ends, ``next_obs`` the next stack), in batches of 1-8 rows, while the
learner samples; each row's ``action`` is its id, so every row served is compared bit for bit with the one
written. Writers are processes (fork); one is SIGKILLed mid-add. A small log evicts the oldest rows and
re-emits frames older than half of it.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay._native import compress_rows
from hetero_replay.storage import make_storage
from hetero_replay.storage.codec import ByteBudgetError
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES
from hetero_replay.storage.shared_compressed import CompressedSegment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import SCHEMA, TEST_DATA, stacks  # noqa: E402

from tests.processes import join_all, start, value_then_killed  # noqa: E402

DEAD_ID = 100_000  # ids a killed writer tried to add
# One stream per actor; the last two replay the first two's frames (each writer stores its own frames).
GAMES = ("Pong", "Breakout", "Pong", "Breakout")


def stream(game: str, seed: int, first_id: int, passes: int = 4) -> dict[str, np.ndarray]:
    """``passes`` laps of ``game``'s frames as one actor's transitions, episodes ending at random; ids from ``first_id``."""
    frames = np.load(TEST_DATA)[f"{game}/frames"]
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(passes):
        starts = rng.random(len(frames)) < 0.08
        starts[0] = True
        s = stacks(frames, starts)
        parts.append((s[:-1], s[1:]))
    obs = np.concatenate([p[0] for p in parts])
    n = len(obs)
    return {
        "obs": obs,
        "action": np.arange(first_id, first_id + n, dtype=np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": np.concatenate([p[1] for p in parts]),
        "done": (rng.random(n) < 0.08).astype(np.float32),
    }


@pytest.fixture(scope="module")
def streams() -> list[dict[str, np.ndarray]]:
    return [stream(game, k, 1000 * k) for k, game in enumerate(GAMES)]


@pytest.fixture(scope="module")
def table(streams) -> dict[str, np.ndarray]:
    """Every stream's rows, indexed by id (ids absent from every stream hold -1 actions)."""
    size = 1000 * len(streams)
    out = {name: np.zeros((size, *shape), dtype) for name, (shape, dtype) in SCHEMA.items()}
    out["action"][:] = -1
    for s in streams:
        for name, values in s.items():
            out[name][s["action"]] = values
    return out


def pick(t: dict[str, np.ndarray], ids) -> dict[str, np.ndarray]:
    return {k: v[ids] for k, v in t.items()}


def rows_mode_bytes(t: dict[str, np.ndarray], ids: np.ndarray) -> float:
    """Mean log bytes of rows ``ids`` stored one LZ4 record a field (no frames)."""
    return float(
        sum(
            np.mean([len(r) + RECORD_HEADER_BYTES for r in compress_rows(t[n][ids].reshape(len(ids), -1), "lz4", 1)])
            for n in ("obs", "next_obs")
        )
    )


def assert_written(table: dict[str, np.ndarray], data: dict[str, np.ndarray]) -> None:
    ids = data["action"]
    assert ((ids >= 0) & (ids < len(table["action"]))).all() and (table["action"][ids] == ids).all(), ids
    for name, values in table.items():
        np.testing.assert_array_equal(data[name], values[ids], err_msg=f"field {name}")


def actor_adds(writer, t: dict[str, np.ndarray], seed: int) -> None:
    rng = np.random.default_rng(seed)
    lo, n = 0, len(t["action"])
    while lo < n:
        k = int(rng.integers(1, 9))
        # Fewer rows only where other writers lapped the ring while this one was descheduled (its oldest go).
        assert 0 <= writer.add(pick(t, np.arange(lo, min(lo + k, n)))) <= min(k, n - lo)
        lo += k
    writer.close()


def make(capacity: int, tmp_path: Path, **options) -> PrioritizedReplay:
    options = {"dir": str(tmp_path), "codec": "lz4", "frames": True, **options}
    return PrioritizedReplay(capacity, SCHEMA, storage="shared", storage_options=options, seed=3)


def test_actors_streams_come_back_bit_for_bit_as_the_log_wraps(streams, table, tmp_path):
    """Four actors, each its own stream, interleaved; the learner samples meanwhile; the log wraps."""
    cap = 48
    budget = cap * 2400  # rows outlive half the log (frames older than that are written again)
    buf = make(cap, tmp_path, byte_budget=budget)
    actors = [start(actor_adds, buf.writer(), s, k) for k, s in enumerate(streams)]
    rng = np.random.default_rng(1)
    draws = 0
    while any(p.is_alive() for p in actors):
        if len(buf) and buf.tree.total() > 0:
            s = buf.sample(16)
            assert_written(table, s.data)
            buf.update_priorities(s.indices, rng.random(16) + 0.1)
            draws += 1
    join_all(actors)
    storage = buf.storage
    assert len(buf) == cap and storage.committed == cap
    # Wrapped: the writers' distinct frames alone take 1.4 logs (163 kB), however they interleave (a frame is
    # written again once half a log behind the head, which moves with the others' writes: more, interleaved).
    assert storage.segment.log.reserved > budget
    data = storage.gather(np.arange(cap))
    assert_written(table, data)
    assert len(set(data["action"])) == cap
    for _ in range(10):
        assert_written(table, buf.sample(64).data)
    # A writer descheduled between reading the head (encode) and reserving may reference frames older
    # than half the log: its rows live less. Rare on a loaded machine, never served when evicted.
    assert storage.evicted_rows <= 0.02 * storage.tickets
    # Frames stored once: well under the rows-mode records of the same rows.
    assert 0 < storage.bytes_per_row < 0.6 * rows_mode_bytes(table, data["action"])
    assert storage.segment.tags is not None and (storage.segment.tags > 0).all()
    buf.close()
    assert os.listdir(tmp_path) == []


def die_mid_add(location: dict, t: dict[str, np.ndarray], stage: str, n: int, conn) -> None:
    """Write one batch (its frames new or held by this writer) by hand; SIGKILL this process at ``stage``."""
    sink = CompressedSegment(**location)
    control = sink.control
    tag = control.register(os.getpid())
    for lo in range(0, 2 * n, n):
        rows = pick(t, np.arange(lo, lo + n))
        rows["action"] = np.arange(DEAD_ID + lo, DEAD_ID + lo + n)
        encoded = sink.encode(rows)
        first = control.reserve(n)
        taken, lapped = control.acquire(first, n, tag)
        assert taken.all() and lapped == 0
        if lo == 0:  # a first batch committed: the next one references its frames
            sink.write_rows(first, encoded, None)
            control.commit(first, taken, tag)
            continue
        if stage == "records":  # the new frames in the log, the rows' references and raw fields not yet
            sink.frames.write(encoded, np.arange(n), first + np.arange(n) + 1)
        else:  # "written": everything but the stamps
            sink.write_rows(first, encoded, None)
    conn.send(first)
    os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.parametrize("stage", ["records", "written"])
def test_a_writer_killed_mid_add_loses_only_its_rows(streams, table, tmp_path, stage):
    cap, n = 32, 4
    buf = make(cap, tmp_path, byte_budget=cap * 4000)
    ours, theirs = streams[0], streams[1]
    buf.add(pick(ours, np.arange(0, 20)))
    writer = buf.writer()
    first = value_then_killed(die_mid_add, writer._location, theirs, stage, n)
    dead_slots = (first + np.arange(n)) % cap
    assert len(buf) == 20 + n  # its committed first batch stays, the killed one is lost
    np.testing.assert_array_equal(buf.priorities.leaves()[dead_slots], 0)
    for _ in range(10):
        s = buf.sample(32)
        assert not np.isin(s.indices, dead_slots).any()
        mine = s.data["action"] < DEAD_ID
        assert_written(table, pick(s.data, mine))
        dead = np.flatnonzero(~mine)
        np.testing.assert_array_equal(s.data["obs"][dead], theirs["obs"][s.data["action"][dead] - DEAD_ID])
    # Our writer goes on (its frames are its own), then laps the ring over the dead writer's slots.
    actor = start(actor_adds, writer, pick(ours, np.arange(20, 20 + cap + 8)), 3)
    join_all([actor])
    assert len(buf) == cap and (buf.priorities.leaves() > 0).all()
    data = buf.storage.gather(np.arange(cap))
    assert_written(table, data)
    buf.close()


def test_a_small_log_evicts_the_oldest_rows_and_re_emits_old_frames(streams, table, tmp_path):
    """A frame every row holds (a still background) is written again past half the log, so rows stay
    within half a log of their write; with a log of ~16 rows, older rows are evicted and never served."""
    cap, kept = 64, 16
    t = pick(streams[1], np.arange(150))
    still = t["obs"][0, 0].copy()
    t["obs"][:, 0] = still  # every row's oldest frame the same (obs and next_obs)
    t["next_obs"][:, 0] = still
    storage = make_storage(
        "shared", cap, SCHEMA, {"dir": str(tmp_path), "codec": "lz4", "frames": True, "byte_budget": kept * 1200}
    )
    log = storage.segment.log
    still_records = set()
    for lo in range(0, 150, 3):
        head = log.reserved
        slots = storage.append(pick(t, np.arange(lo, lo + 3)))
        # Every row's records lie within half a log of the head its writer read before reserving.
        assert (storage.segment.offsets[slots].min(axis=1) >= head - log.log_bytes // 2).all()
        still_records.update(storage.segment.offsets[slots, 0].tolist())  # obs's oldest frame: the still one
    assert log.reserved > 4 * log.log_bytes
    assert len(still_records) >= 8  # written again at least each half log
    storage.close()

    buf = make(cap, tmp_path, byte_budget=kept * 1200)
    writer = buf.writer()
    actor = start(actor_adds, writer, t, 0)
    join_all([actor])
    storage = buf.storage
    assert len(buf) == cap
    _, sound = storage.read_intact(np.arange(cap))
    ids = storage.gather(np.arange(cap))["action"]
    newest = np.argsort(ids)[-kept // 2 :]
    assert sound[newest].all() and not sound.all()  # the newest rows held, the oldest evicted
    table_t = {k: v.copy() for k, v in table.items()}
    for name in ("obs", "next_obs"):
        table_t[name][t["action"]] = t[name]
    rng = np.random.default_rng(2)
    for _ in range(20):
        s = buf.sample(32)
        assert sound[s.indices].all()
        assert_written(table_t, s.data)
        buf.update_priorities(s.indices, rng.random(32) + 0.1)
    assert storage.evicted_rows == cap - sound.sum()
    np.testing.assert_array_equal(buf.priorities.leaves()[~sound], 0)  # out of the draw until rewritten
    buf.close()


def test_rows_rewritten_in_place_reference_their_new_frames(streams, tmp_path):
    """The owner's write_rows (stamps kept): a field rewritten gets new references, the others keep theirs;
    the row is tracked by the oldest of all, so it is evicted once its unchanged field's frames are gone."""
    cap = 16
    buf = make(cap, tmp_path, byte_budget=24_000)
    a, b = streams[0], streams[1]
    buf.add(pick(a, np.arange(cap)))
    buf.sample(4)
    buf.write_rows(0, {"obs": b["obs"][:8]})  # obs from another stream, next_obs kept
    buf.write_rows(8, {"obs": b["obs"][40:48], "next_obs": b["next_obs"][40:48]})
    held = buf.storage.gather(np.arange(cap))
    np.testing.assert_array_equal(held["obs"], np.concatenate([b["obs"][:8], b["obs"][40:48]]))
    np.testing.assert_array_equal(held["next_obs"], np.concatenate([a["next_obs"][:8], b["next_obs"][40:48]]))
    np.testing.assert_array_equal(held["action"], a["action"][:cap])
    buf.sample(4)
    assert buf.storage.evicted_rows == 0 and (buf.leaves() > 0).all()
    # Slots 8-15 rewritten with rows further on until the log has passed the next_obs frames of slots 0-7.
    log, oldest = buf.storage.segment.log, buf.storage.segment.offsets[:8].min(axis=1).max()
    lo = 48
    while log.reserved - log.log_bytes <= oldest:
        lo += 8
        buf.write_rows(8, {"obs": b["obs"][lo : lo + 8], "next_obs": b["next_obs"][lo : lo + 8]})
    for _ in range(10):
        s = buf.sample(16)
        assert (s.indices >= 8).all()
        np.testing.assert_array_equal(s.data["obs"], b["obs"][lo + s.indices - 8])
    assert buf.storage.evicted_rows == 8
    np.testing.assert_array_equal(np.flatnonzero(buf.leaves() == 0), np.arange(8))
    buf.close()


def test_checkpoints_round_trip_bit_for_bit_between_host_and_shared(streams, table, tmp_path):
    """shared frames -> file -> host and shared frames; host frames -> file -> shared frames: the same rows,
    priorities and draws. A row whose records the log no longer held is saved without records, priority 0."""
    cap = 40
    shared = make(cap, tmp_path, byte_budget=cap * 3000)
    for lo in range(0, 100, 7):
        shared.add(pick(streams[0], np.arange(lo, min(lo + 7, 100))))
    batch = shared.sample(16)
    shared.update_priorities(batch.indices, np.linspace(0.1, 4.0, 16))
    shared.save(tmp_path / "shared.replay")
    want = shared.storage.gather(np.arange(cap))
    assert_written(table, want)
    options = {"dir": str(tmp_path), "codec": "lz4", "frames": True}
    for placement in ({}, {"storage": "shared", "storage_options": options}):
        loaded = PrioritizedReplay.load(tmp_path / "shared.replay", **placement)
        got = loaded.storage.gather(np.arange(cap))
        for name in SCHEMA:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(loaded.tree.leaves(), shared.tree.leaves())
        a, b = loaded.sample(16), PrioritizedReplay.load(tmp_path / "shared.replay").sample(16)
        np.testing.assert_array_equal(a.indices, b.indices)
        loaded.close()
    shared.close()

    host = PrioritizedReplay(cap, SCHEMA, storage_options={"codec": "lz4", "frames": True}, seed=3)
    for lo in range(0, 100, 9):
        host.add(pick(streams[1], np.arange(lo, min(lo + 9, 100))))
    host.update_priorities(np.arange(10), np.linspace(0.5, 2.0, 10))
    host.save(tmp_path / "host.replay")
    into = PrioritizedReplay.load(tmp_path / "host.replay", storage="shared", storage_options=options)
    assert into.storage.pooled == ["obs", "next_obs"]
    want, got = host.storage.gather(np.arange(cap)), into.storage.gather(np.arange(cap))
    for name in SCHEMA:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_array_equal(into.tree.leaves(), host.tree.leaves())
    for _ in range(5):
        assert_written(table, into.sample(32).data)
    into.close()

    # Rows the log no longer holds: saved without records and with priority 0, never served after a load.
    small = make(cap, tmp_path, byte_budget=8 * 1500)
    for lo in range(0, 80, 4):
        small.add(pick(streams[0], np.arange(lo, lo + 4)))
    assert len(small) == cap
    _, sound = small.storage.read_intact(np.arange(cap))
    assert not sound.all() and sound.any()
    small.save(tmp_path / "small.replay")
    back = PrioritizedReplay.load(tmp_path / "small.replay")
    np.testing.assert_array_equal(back.tree.leaves()[~sound], 0)
    assert (back.tree.leaves()[sound] > 0).all()
    for _ in range(5):
        s = back.sample(16)
        assert sound[s.indices].all()
        assert_written(table, s.data)
    back.close()
    small.close()


def test_bad_frames_options_are_refused_before_anything_is_created(tmp_path):
    with pytest.raises(ValueError, match="storage='disk' does not store frames once"):
        PrioritizedReplay(
            8, SCHEMA, storage="disk", storage_options={"path": str(tmp_path / "d"), "codec": "lz4", "frames": True}
        )
    assert not (tmp_path / "d").exists()
    for frames, match in (
        (["reward"], "frames: field 'reward' has no codec"),
        (["action"], "frames: field 'action' has no codec"),
    ):
        with pytest.raises(ValueError, match=match):
            make(8, tmp_path, frames=frames)
    with pytest.raises(ValueError, match="frames: field 'reward' of shape"):
        make(8, tmp_path, codec={"obs": "lz4", "reward": "lz4"}, frames=["obs", "reward"])
    assert os.listdir(tmp_path) == []


def test_a_batch_whose_new_frames_exceed_the_log_is_refused_and_changes_nothing(streams, table, tmp_path):
    buf = make(16, tmp_path, byte_budget=6_000)
    buf.add(pick(streams[0], np.arange(4)))
    storage, rng_state = buf.storage, buf.rng.bit_generator.state
    before = (
        storage.tickets,
        storage.segment.log.reserved,
        storage.control.stamps.copy(),
        storage.segment.offsets.copy(),
        storage.segment.tags.copy(),
        buf.priorities.leaves().copy(),
        storage.segment.frames.remembered,
    )
    writer = buf.writer()
    for add in (buf.add, writer.add):
        with pytest.raises(ByteBudgetError, match="byte_budget"):
            add(pick(streams[1], np.arange(16)))  # Breakout's frames: none held yet, more than 6 KB
    after = (
        storage.tickets,
        storage.segment.log.reserved,
        storage.control.stamps,
        storage.segment.offsets,
        storage.segment.tags,
        buf.priorities.leaves(),
        storage.segment.frames.remembered,
    )
    for was, now in zip(before, after):
        np.testing.assert_array_equal(now, was)
    assert buf.rng.bit_generator.state == rng_state
    assert_written(table, buf.sample(8).data)
    writer.close()
    buf.close()
