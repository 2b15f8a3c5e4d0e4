"""The ``"disk"`` storage: the ring protocol over a row file, durable points, reopening after a crash.

The protocol checks of ``tests/test_shared_storage.py`` (actor processes,
writers SIGKILLed mid-add, refused batches) run here over the row file. Then
what only a disk buffer has: a learner SIGKILLed while adding, reopened at its
last durable point (nothing durable lost, nothing torn, adding goes on from
there); the rules of ``reopen`` (the method and the storage option); and its options. Every buffer lives
under ``tmp_path``; every test ends by checking that only the buffers' own
files (``ring.ctl``, ``rows.dat``, ``state.hrp``) are left.
"""

from __future__ import annotations

import multiprocessing as mp
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay.storage.checkpoint import ReplayFileError, read
from hetero_replay.storage.disk import CONTROL_FILE, ROW_FILE, STATE_FILE
from hetero_replay.storage.ring import RingClosedError, RingControl
from tests.test_shared_storage import (
    DISK_FILES,
    JOIN_S,
    SCHEMA,
    SMALL_SCHEMA,
    STRIDE,
    Store,
    actor_adds,
    actor_loops,
    actor_registers_and_waits,
    check_actors,
    check_bad_batches,
    check_dead_writer,
    check_random_kills,
    check_relaxed_pipeline,
    check_writer_after_close,
    join_all,
    rows_with_ids,
    torn,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def disk_store(tmp_path: Path):
    store = Store(tmp_path, "disk")
    yield store
    store.teardown()


def learner_until_killed(path: str, capacity: int, every: int) -> None:
    """A learner that only adds rows (id = ticket + 1), flushing every ``every`` adds and printing the tickets."""
    buf = PrioritizedReplay(
        capacity, SCHEMA, seed=1, storage="disk",
        storage_options={"path": path, "flush_every": 7, "flush_seconds": 1e6, "ram_bytes": 16 * (4 * 1024 + 32)},
    )  # fmt: skip
    rng = np.random.default_rng(0)
    next_id, adds = 1, 0
    while True:
        n = int(rng.integers(1, 6))
        buf.add(rows_with_ids(np.arange(next_id, next_id + n)))
        next_id, adds = next_id + n, adds + 1
        if adds % every == 0:
            buf.flush()
            print(buf.storage.tickets, flush=True)


# -- the ring protocol over the row file ----------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_actors_add_while_learner_samples_nothing_lost(disk_store, method):
    """3 actor processes add 360 rows to a big disk ring while the learner samples: nothing torn, every id once."""
    check_actors(disk_store, method, capacity=512, rows_each=120, pause=0.0005)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_actors_lap_a_small_ring(disk_store, method):
    """3 actors lap a 64-row disk ring 70 times: nothing torn sampled, the newest tickets committed in every slot."""
    check_actors(disk_store, method, capacity=64, rows_each=1500, pause=0.001)


@pytest.mark.parametrize("stage", ["reserve", "acquire", "half", "written"])
def test_writer_killed_mid_add(disk_store, stage):
    """A disk writer SIGKILLed at each protocol step: never sampled, committed rows intact, slots taken over."""
    check_dead_writer(disk_store, stage)


def test_writers_killed_at_random_moments(disk_store):
    """Looping disk actors SIGKILLed at random times never get a torn row sampled; the ring works after."""
    check_random_kills(disk_store)


def test_bad_batches_change_nothing(disk_store):
    """Refused batches leave the control block, ring.ctl and rows.dat bytes and the learner exactly as they were."""
    check_bad_batches(disk_store)


def test_writer_add_after_close_raises(disk_store):
    """A writer handle's add after the owner's close raises RingClosedError (the files stay)."""
    check_writer_after_close(disk_store)
    assert {p.name for p in disk_store.path.iterdir()} == DISK_FILES


def test_relaxed_pipeline_over_disk(disk_store):
    """RelaxedReplay(staleness=2, prefetch=2, thread) over a disk buffer an actor fills: whole samples."""
    check_relaxed_pipeline(disk_store)


# -- the learner killed ---------------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [64, 4096])
def test_learner_killed_reopens_at_its_last_durable_point(disk_store, capacity):
    """SIGKILL of an adding learner: reopen restores the durable point whole, loses nothing older, adds on."""
    path = disk_store.path
    code = (
        f"from tests.test_disk_storage import learner_until_killed; learner_until_killed({str(path)!r}, {capacity}, 5)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        printed = []
        while len(printed) < 12:
            line = proc.stdout.readline()
            assert line, f"the learner died before its kill (exit code {proc.poll()})"
            printed.append(int(line))
        time.sleep(float(np.random.default_rng().uniform(0, 0.02)))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(JOIN_S)
    printed += [int(x) for x in proc.stdout.read().split()]
    proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    last_printed = printed[-1]

    control = RingControl.attach(str(path / CONTROL_FILE))
    at_kill = control.tickets  # every ticket the learner reserved
    control.close()
    durable = int(read(path / STATE_FILE)[0]["tickets"])
    assert last_printed <= durable <= at_kill

    buf = PrioritizedReplay.reopen(path)
    disk_store.buffers.append(buf)
    assert buf.storage.tickets == durable
    assert buf.position == durable % capacity
    assert buf.filled == min(durable, capacity) >= min(last_printed, capacity)

    stamps = buf.storage.control.stamps.copy()
    present = np.flatnonzero(stamps > 0)
    assert len(buf) == present.size  # complete rows only
    data = buf.storage.gather(present)
    assert torn(data).size == 0
    ids = data["id"]
    np.testing.assert_array_equal(ids, stamps[present])  # the row of ticket t (id t + 1), in slot t % capacity
    np.testing.assert_array_equal((ids - 1) % capacity, present)
    assert (ids <= durable).all() and (ids > durable - capacity).all()
    # Nothing durable is lost but rows whose slots the learner rewrote after the durable point.
    must = np.arange(max(0, durable - capacity, at_kill - capacity), durable) + 1
    missing = np.setdiff1d(must, ids)
    assert missing.size == 0, f"durable rows lost: {missing}"
    leaves = buf.priorities.leaves()
    assert (leaves[present] > 0).all()
    assert (np.delete(leaves, present) == 0).all()

    s = buf.sample(128)
    assert torn(s.data).size == 0 and np.isin(s.indices, present).all()
    buf.update_priorities(s.indices, np.linspace(0.1, 2, 128))
    new = np.arange(durable + 1, durable + 4)
    np.testing.assert_array_equal(buf.add(rows_with_ids(new)), (durable + np.arange(3)) % capacity)
    assert buf.position == (durable + 3) % capacity and buf.storage.tickets == durable + 3
    np.testing.assert_array_equal(buf.read_rows("id", (durable + np.arange(3)) % capacity), new)
    method = "fork"
    actor = disk_store.start(method, actor_adds, buf.writer(), 1, 5, True)
    join_all([actor])
    assert buf.storage.tickets == durable + 8
    assert torn(buf.sample(64).data).size == 0
    buf.close()
    assert {p.name for p in path.iterdir()} == DISK_FILES  # a temporary of a killed durable write is gone


# -- reopening ------------------------------------------------------------------------------------


def test_clean_close_and_reopen_restore_everything(disk_store):
    """close() then reopen(): rows, priorities, max priority, random state, position and PER options are back."""
    buf = PrioritizedReplay(
        32, SCHEMA, alpha=0.7, beta=0.5, eps=1e-3, seed=5, storage="disk", storage_options=disk_store.options()
    )
    disk_store.buffers.append(buf)
    method = "fork"
    actor = disk_store.start(method, actor_adds, buf.writer(), 1, 30, True)
    join_all([actor])
    buf.add(rows_with_ids(np.arange(1, 11)))  # laps: 40 rows in 32 slots
    rng = np.random.default_rng(6)
    for _ in range(5):
        s = buf.sample(16)
        buf.update_priorities(s.indices, rng.random(16) * 4)
    before = {
        "len": len(buf),
        "position": buf.position,
        "leaves": buf.priorities.leaves().copy(),
        "max_priority": buf.max_priority,
        "rng": buf.rng.bit_generator.state,
        "ids": buf.read_rows("id", np.arange(32)),
    }
    buf.close()
    again = PrioritizedReplay.reopen(disk_store.path)
    disk_store.buffers.append(again)
    assert (again.alpha, again.beta, again.eps) == (0.7, 0.5, 1e-3)
    assert (len(again), again.position, again.max_priority) == (
        before["len"],
        before["position"],
        before["max_priority"],
    )
    assert again.rng.bit_generator.state == before["rng"]
    np.testing.assert_array_equal(again.priorities.leaves(), before["leaves"])
    np.testing.assert_array_equal(again.read_rows("id", np.arange(32)), before["ids"])
    assert torn(again.storage.gather(np.arange(32))).size == 0
    assert torn(again.sample(32).data).size == 0


def test_writers_add_after_clean_close_and_reopen(disk_store):
    """A buffer closed cleanly and reopened takes rows from writer handles again."""
    buf = disk_store.make(16)
    buf.add(rows_with_ids([1, 2]))
    buf.close()
    again = PrioritizedReplay.reopen(disk_store.path)
    disk_store.buffers.append(again)
    assert again.writer().add(rows_with_ids([3])) == 1
    assert len(again) == 3


def test_reopen_refuses_what_is_not_a_buffer(disk_store, tmp_path):
    """reopen of a missing directory, an empty one, or a buffer never made durable: ValueError."""
    with pytest.raises(ValueError, match="durable point"):
        PrioritizedReplay.reopen(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="durable point"):
        PrioritizedReplay.reopen(tmp_path / "empty")
    buf = disk_store.make(16, flush_seconds=1e6)
    buf.add(rows_with_ids([1, 2]))
    assert not (disk_store.path / STATE_FILE).exists()
    with pytest.raises(ValueError, match="durable point"):
        PrioritizedReplay.reopen(disk_store.path)
    buf.flush()
    assert (disk_store.path / STATE_FILE).exists()


def test_path_holding_a_buffer_needs_reopen(disk_store):
    """A new buffer at a path holding one: ValueError, the files untouched."""
    buf = disk_store.make(16)
    buf.add(rows_with_ids([1, 2]))
    buf.close()
    files = {name: (disk_store.path / name).read_bytes() for name in DISK_FILES}
    with pytest.raises(ValueError, match="holds a replay buffer already"):
        disk_store.make(16)
    with pytest.raises(ValueError, match="holds a replay buffer already"):
        disk_store.make(16, reopen=False)
    assert {name: (disk_store.path / name).read_bytes() for name in DISK_FILES} == files


@pytest.mark.parametrize("change", ["capacity", "schema"])
def test_reopen_flag_with_another_capacity_or_schema_is_refused(disk_store, change):
    """reopen=True with a capacity or schema not the buffer's: ValueError, the files untouched."""
    buf = disk_store.make(16)
    buf.add(rows_with_ids([1, 2]))
    buf.close()
    files = {name: (disk_store.path / name).read_bytes() for name in DISK_FILES}
    capacity, schema = (32, SCHEMA) if change == "capacity" else (16, SMALL_SCHEMA)
    with pytest.raises(ValueError, match="capacity"):
        disk_store.make(capacity, schema=schema, reopen=True)
    assert {name: (disk_store.path / name).read_bytes() for name in DISK_FILES} == files
    again = disk_store.make(16, reopen=True)
    assert len(again) == 2


def test_reopen_flag_without_a_buffer_is_refused(disk_store):
    """reopen=True at a path that holds no buffer: ValueError."""
    with pytest.raises(ValueError, match="holds no replay buffer"):
        disk_store.make(16, reopen=True)


def test_reopen_while_an_actor_is_attached_names_it(disk_store):
    """reopen while an actor process that wrote to the buffer still lives: ValueError naming its pid."""
    buf = disk_store.make(16)
    method = "fork"
    recv, send = mp.Pipe()
    actor = disk_store.start(method, actor_registers_and_waits, buf.writer(), send)
    try:
        assert recv.poll(JOIN_S)
        pid = recv.recv()
        buf.close()
        with pytest.raises(ValueError, match=str(pid)):
            PrioritizedReplay.reopen(disk_store.path)
    finally:
        recv.send("go")
        join_all([actor])
    again = PrioritizedReplay.reopen(disk_store.path)
    disk_store.buffers.append(again)
    assert len(again) == 1 and again.read_rows("id", [0])[0] == STRIDE + 1


@pytest.mark.parametrize("damage", ["truncated", "zeroed", "garbage"])
def test_corrupt_state_file_raises_replay_file_error(disk_store, damage):
    """reopen with a damaged state.hrp raises ReplayFileError."""
    buf = disk_store.make(16)
    buf.add(rows_with_ids(np.arange(1, 9)))
    buf.close()
    state = disk_store.path / STATE_FILE
    blob = bytearray(state.read_bytes())
    if damage == "truncated":
        blob = blob[: len(blob) // 2]
    elif damage == "zeroed":
        blob[len(blob) // 2 : len(blob) // 2 + 64] = bytes(64)
    else:
        blob = bytearray(b"not a replay file" * 10)
    state.write_bytes(bytes(blob))
    with pytest.raises(ReplayFileError):
        PrioritizedReplay.reopen(disk_store.path)


def test_killed_actor_leaves_only_the_buffers_files(disk_store):
    """A disk actor SIGKILLed mid-run adds no file; the buffer's directory holds ring.ctl, rows.dat, state.hrp."""
    buf = disk_store.make(32)
    method = "fork"
    actor = disk_store.start(method, actor_loops, buf.writer(), 1)
    while len(buf) < 8:
        time.sleep(0.005)
    actor.kill()
    join_all([actor], codes=(-signal.SIGKILL,))
    assert {p.name for p in disk_store.path.iterdir()} <= DISK_FILES
    buf.flush()
    assert {p.name for p in disk_store.path.iterdir()} == DISK_FILES


# -- options ---------------------------------------------------------------------------------------


def test_disk_needs_a_path(tmp_path):
    """storage='disk' without a path: ValueError naming it; a path that is no path: TypeError."""
    with pytest.raises(ValueError, match="path"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="disk")
    with pytest.raises(ValueError, match="path"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="disk", storage_options={"flush_every": 3})
    with pytest.raises(TypeError, match="path"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="disk", storage_options={"path": 3})
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("option", "value", "error"),
    [
        ("read_threads", -1, ValueError),
        ("read_threads", 0, ValueError),
        ("read_threads", 2.5, TypeError),
        ("flush_every", 0, ValueError),
        ("flush_every", True, TypeError),
        ("flush_seconds", float("nan"), ValueError),
        ("flush_seconds", 0, ValueError),
        ("flush_seconds", "5", TypeError),
        ("ram_bytes", -1, ValueError),
        ("reopen", "yes", TypeError),
        ("colour", "blue", TypeError),
    ],
)
def test_bad_disk_options_are_refused_naming_them(disk_store, option, value, error):
    """A bad storage option value (or an unknown one) raises TypeError/ValueError naming it, making no files."""
    with pytest.raises(error, match=option):
        disk_store.make(8, **{option: value})
    assert disk_store.files() == set()


@pytest.mark.parametrize("value", ["soon", float("nan"), -1.0])
def test_disk_refuses_bad_abandon_after(disk_store, value):
    """A bad abandon_after (not a number, NaN, negative) is refused up front, naming it."""
    with pytest.raises((TypeError, ValueError), match="abandon_after"):
        disk_store.make(8, abandon_after=value)


def test_device_with_disk_is_refused_and_leaves_no_buffer(disk_store):
    """device= with storage='disk': ValueError, and the path is free for a buffer afterwards."""
    with pytest.raises(ValueError, match="device"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="disk", device="cpu", storage_options=disk_store.options())
    disk_store.make(8, schema=SMALL_SCHEMA)


def test_flush_makes_a_durable_point_and_shared_has_none(disk_store, tmp_path):
    """flush() writes state.hrp for disk (its tickets the buffer's); on a shared buffer it is a no-op."""
    buf = disk_store.make(16, flush_seconds=1e6)
    buf.add(rows_with_ids(np.arange(1, 6)))
    assert buf.durable_rows == 0  # no point yet: a crash now keeps nothing
    buf.flush()
    assert int(read(disk_store.path / STATE_FILE)[0]["tickets"]) == 5
    assert buf.durable_rows == 5
    buf.add(rows_with_ids(np.arange(6, 8)))
    assert buf.durable_rows == 5
    buf.close()
    again = PrioritizedReplay.reopen(str(disk_store.path))
    assert again.durable_rows == len(again) == 7  # a clean close makes a last point
    again.close()
    shared_dir = tmp_path / "shared"
    shared_dir.mkdir()
    shared = PrioritizedReplay(8, SMALL_SCHEMA, storage="shared", storage_options={"dir": str(shared_dir)})
    shared.add(rows_with_ids([1], width=4))
    shared.flush()
    assert [p.suffix for p in shared_dir.iterdir()] == [".ring"]
    shared.close()
    assert list(shared_dir.iterdir()) == []


def test_spawned_writer_rows_land_in_the_files(disk_store):
    """A spawned actor's rows land in ring.ctl and rows.dat; a fresh handle's add after close raises."""
    buf = disk_store.make(16)
    w = buf.writer()
    method = "spawn"
    actor = disk_store.start(method, actor_adds, w, 2, 6, True)
    join_all([actor])
    control = RingControl.attach(str(disk_store.path / CONTROL_FILE))
    try:
        assert control.tickets == 6 and (control.stamps[:6] > 0).all()
    finally:
        control.close()
    assert (disk_store.path / ROW_FILE).stat().st_size == 16 * buf.storage.format.bytes
    np.testing.assert_array_equal(np.sort(buf.read_rows("id", np.arange(6))), 2 * STRIDE + np.arange(1, 7))
    buf.close()
    with pytest.raises(RingClosedError):
        w.add(rows_with_ids([1]))


def test_close_tells_writers_even_when_the_last_durable_point_fails(disk_store):
    """close() whose last durable point fails raises, and still tells writers the buffer is closed."""
    buf = disk_store.make(16, flush_seconds=1e6)
    writer = buf.writer()
    writer.add(rows_with_ids([1]))
    (disk_store.path / STATE_FILE).mkdir()  # the durable point cannot replace a directory
    try:
        with pytest.raises((RuntimeError, OSError)):
            buf.close()
        with pytest.raises(RingClosedError):
            writer.add(rows_with_ids([2]))
    finally:
        (disk_store.path / STATE_FILE).rmdir()


def test_check_options_is_the_storages_own_rule(tmp_path):
    """The side-effect-free option check covers every keyword of DiskStorage, and DiskStorage applies it."""
    import inspect

    from hetero_replay.storage.disk import MAX_READ_THREADS, DiskStorage, check_options

    keywords = set(inspect.signature(DiskStorage).parameters) - {"capacity", "schema"}
    every = {"path": "p", "ram_bytes": 0, "read_threads": 1, "flush_every": 1, "flush_seconds": 1.0}
    every |= {"reopen": False, "abandon_after": 1.0, "codec": None, "byte_budget": None, "frames": None}
    assert set(check_options(every)) == keywords  # every keyword taken, none left out
    assert check_options({"path": "rel", "reopen": np.bool_(True)}) == {"path": Path.cwd() / "rel", "reopen": True}
    # A value the old per-argument checks let through: too many read threads (each an OS thread).
    for options in ({"read_threads": MAX_READ_THREADS + 1}, {"abandon_after": -1.0}):
        with pytest.raises(ValueError, match=f"storage_options {next(iter(options))}"):
            check_options(options)
        with pytest.raises(ValueError, match=f"storage_options {next(iter(options))}"):
            PrioritizedReplay(
                8, {"x": ((), np.float32)}, storage="disk", storage_options={"path": tmp_path / "b", **options}
            )
        assert not (tmp_path / "b").exists()
    with pytest.raises(TypeError, match="ram_byte"):
        check_options({"ram_byte": 1})
