"""The ``"shared"`` storage, and the ring protocol both ring storages share, with real processes.

Actor processes (fork and spawn) add rows through a writer handle while the
learner samples and updates priorities. Every field of a row encodes one id
(``obs`` is 4 KB of it), so a torn row, fields of two rows, would show. Writers
are SIGKILLed at each step of the protocol (after reserving, after taking the
slots, halfway through a row, after writing but before publishing) and at
random moments: nothing of theirs may be sampled, nothing committed before may
be lost, and the other writers must take their slots over.

The ``check_*`` functions take the storage kind; ``tests/test_disk_storage.py``
runs them for ``"disk"``. Segment files go to ``tmp_path`` (one test checks
the default ``/dev/shm`` and cleans up); every test ends by checking that its
buffers left no file behind.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import pickle
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay import replay as rp
from hetero_replay.pipeline import RelaxedReplay
from hetero_replay.storage import ring
from hetero_replay.storage.disk import CONTROL_FILE, ROW_FILE, STATE_FILE, DiskRows
from hetero_replay.storage.files import LOCK_FILE
from hetero_replay.storage.ring import RingClosedError
from hetero_replay.storage.shared import SHM_DIR, SharedRows
from tests.processes import JOIN_S, join_all

OBS = 1024  # float32 values of a row's id: 4 KB, so a row written halfway shows
SCHEMA = {"id": ((), np.int64), "obs": ((OBS,), np.float32), "tail": ((), np.int64)}
SMALL_SCHEMA = {"id": ((), np.int64), "obs": ((4,), np.float32), "tail": ((), np.int64)}
STRIDE = 100_000  # actor r adds ids r * STRIDE + 1, r * STRIDE + 2, ...
DEAD_ID = 9_000_001  # ids a killed writer tried to add (exact in float32)
DISK_FILES = {CONTROL_FILE, ROW_FILE, STATE_FILE, LOCK_FILE}


def rows_with_ids(ids, width: int = OBS) -> dict[str, np.ndarray]:
    """Rows whose every field encodes their id (ids >= 1: an all-zero row was never written)."""
    ids = np.asarray(ids, np.int64)
    return {"id": ids, "obs": np.repeat(ids.astype(np.float32)[:, None], width, axis=1), "tail": -ids}


def torn(data: dict[str, np.ndarray]) -> np.ndarray:
    """Positions of rows whose fields disagree about their id, or that were never written."""
    ids = np.asarray(data["id"])
    ok = (ids >= 1) & (np.asarray(data["obs"]) == ids[:, None].astype(np.float32)).all(axis=1)
    ok &= np.asarray(data["tail"]) == -ids
    return np.flatnonzero(~ok)


def open_sink(kind: str, location: str) -> SharedRows | DiskRows:
    """A writer process's view of a ring storage, as a writer handle opens it."""
    return SharedRows(location) if kind == "shared" else DiskRows(location)


class Store:
    """Makes ring buffers in one test's directory, and checks at teardown that they left nothing behind."""

    def __init__(self, root: Path, kind: str) -> None:
        self.root, self.kind = root, kind
        self.buffers: list[PrioritizedReplay] = []
        self.procs: list = []

    def start(self, method: str, target, *args, name: str = "actor"):
        """Start a (daemon) process; teardown SIGKILLs it if a failed test left it running."""
        p = mp.get_context(method).Process(target=target, args=args, name=name, daemon=True)
        p.start()
        self.procs.append(p)
        return p

    @property
    def path(self) -> Path:
        """Where a disk buffer lives (shared segments go to ``root`` itself)."""
        return self.root / "buf"

    def options(self, **options) -> dict:
        return {"dir": str(self.root), **options} if self.kind == "shared" else {"path": str(self.path), **options}

    def make(self, capacity: int, schema=SCHEMA, seed: int = 0, **options) -> PrioritizedReplay:
        buf = PrioritizedReplay(capacity, schema, seed=seed, storage=self.kind, storage_options=self.options(**options))
        self.buffers.append(buf)
        return buf

    def location(self, buf: PrioritizedReplay) -> str:
        return str(buf.storage.path)

    def files(self) -> set[str]:
        """Every file under ``root``, relative to it."""
        return {str(p.relative_to(self.root)) for p in self.root.rglob("*") if p.is_file()}

    def assert_no_new_files(self, before: set[str]) -> None:
        """No file since ``before`` (a disk buffer may have made its state.hrp meanwhile)."""
        now = self.files()
        if self.kind == "disk":
            now -= {f"buf/{STATE_FILE}"}
            before = before - {f"buf/{STATE_FILE}"}
        assert now == before, f"new files: {now - before}"

    def snapshot(self, buf: PrioritizedReplay) -> dict:
        """Everything a refused add must leave unchanged: shared counter and stamps, file bytes, the learner."""
        st = buf.storage
        if self.kind == "shared":
            files = Path(st.path).read_bytes()
        else:
            files = (st.path / CONTROL_FILE).read_bytes() + (st.path / ROW_FILE).read_bytes()
        return {
            "tickets": st.control.tickets,
            "stamps": st.control.stamps.copy(),
            "files": files,
            "len": len(buf),
            "position": buf.position,
            "leaves": buf.priorities.leaves().copy(),
            "max_priority": buf.max_priority,
            "rng": buf.rng.bit_generator.state,
        }

    def teardown(self) -> None:
        for p in self.procs:
            if p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join(JOIN_S)
        for buf in self.buffers:
            buf.close()
        left = self.files()
        if self.kind == "shared":
            assert left == set(), f"segment files left behind: {left}"
        else:
            assert {Path(f).name for f in left} <= DISK_FILES, f"files besides the buffers' own: {left}"


@pytest.fixture
def shared_store(tmp_path: Path):
    store = Store(tmp_path, "shared")
    yield store
    store.teardown()


# -- what the actor processes run (module level, so that spawn can import them) ---------------


def actor_adds(writer, rank: int, rows: int, exact: bool, pause: float = 0.0) -> None:
    """Add ids ``rank * STRIDE + 1 ..`` in batches of 1-8 (``pause`` s apart); with ``exact`` all must be committed."""
    rng = np.random.default_rng(rank)
    next_id, end = rank * STRIDE + 1, rank * STRIDE + 1 + rows
    while next_id < end:
        n = min(int(rng.integers(1, 9)), end - next_id)
        got = writer.add(rows_with_ids(np.arange(next_id, next_id + n)))
        assert not exact or got == n, f"{got} of {n} rows committed"
        next_id += n
        if pause:
            time.sleep(pause)
    writer.close()


def actor_loops(writer, rank: int) -> None:
    """Add ids ``rank * STRIDE + 1 ..`` until killed."""
    rng = np.random.default_rng(rank)
    next_id = rank * STRIDE + 1
    while True:
        n = int(rng.integers(1, 9))
        writer.add(rows_with_ids(np.arange(next_id, next_id + n)))
        next_id += n


def actor_registers_and_waits(writer, conn) -> None:
    """Add one row, say so, and stay attached until told to go."""
    writer.add(rows_with_ids([STRIDE + 1]))
    conn.send(os.getpid())
    conn.recv()
    writer.close()


def die_mid_add(kind: str, location: str, stage: str, n: int, conn) -> None:
    """Run the write protocol by hand and SIGKILL this process at ``stage``; sends ``first`` ticket before."""
    sink = open_sink(kind, location)
    control = sink.control
    tag = control.register(os.getpid())
    first = control.reserve(n)
    rows = rows_with_ids(np.arange(DEAD_ID, DEAD_ID + n))
    if stage != "reserve":
        take, lapped = control.acquire(first, n, tag)
        assert take.all() and lapped == 0
        if stage == "half":  # row 0 whole, row 1 half written
            sink.write_rows(first, rows, np.array([1] + [0] * (n - 1), np.int8))
            slot = (first + 1) % control.capacity
            if kind == "shared":
                sink.rows._records[slot, : control.row_bytes // 2] = 0xAB
            else:
                os.pwrite(sink.fd, b"\xab" * (sink.format.bytes // 2), slot * sink.format.bytes)
        elif stage == "written":
            sink.write_rows(first, rows, take)
    conn.send(first)
    os.kill(os.getpid(), signal.SIGKILL)


def sampleable(buf: PrioritizedReplay) -> bool:
    """Whether a committed row is in (``len`` counts reserved rows, committed or not)."""
    return len(buf) > 0 and buf.tree.total() > 0


def sample_checked(buf: PrioritizedReplay, n: int, rng: np.random.Generator, update: bool = True):
    """A sample whose rows must all be whole; its priorities updated at random."""
    s = buf.sample(n)
    bad = torn(s.data)
    assert bad.size == 0, f"torn rows sampled: ids {s.data['id'][bad]} at slots {s.indices[bad]}"
    if update:
        buf.update_priorities(s.indices, rng.random(n) + 0.01)
    return s


# -- the checks, for either ring storage -------------------------------------------------------


def check_actors(store: Store, method: str, capacity: int, rows_each: int, actors: int = 3, pause: float = 0.0) -> None:
    """Actors add while the learner samples and updates: nothing torn; all rows kept (or the newest).

    ``pause``: between an actor's adds. Unthrottled actors lap a ring of tens of
    rows faster than the learner reads a batch (``sample`` then gives up with
    RuntimeError, which is no torn row but ends the test).
    """
    buf = store.make(capacity)
    writer = buf.writer()
    total = actors * rows_each
    exact = capacity >= total
    procs = [
        store.start(method, actor_adds, writer, r, rows_each, exact, pause, name=f"actor{r}")
        for r in range(1, actors + 1)
    ]
    rng = np.random.default_rng(0)
    deadline, draws = time.monotonic() + JOIN_S, 0
    while any(p.is_alive() for p in procs) or draws < 5:
        assert time.monotonic() < deadline, "the learner saw no rows"
        if not sampleable(buf):
            time.sleep(0.001)
            continue
        ids = sample_checked(buf, 32, rng).data["id"]
        rank, k = ids // STRIDE, ids % STRIDE
        assert ((rank >= 1) & (rank <= actors) & (k >= 1) & (k <= rows_each)).all(), ids
        draws += 1
    join_all(procs)

    tickets = buf.storage.tickets
    assert tickets == total
    assert len(buf) == min(total, capacity)
    data = buf.storage.gather(np.arange(len(buf)))
    assert torn(data).size == 0
    stamps = buf.storage.control.stamps[: len(buf)].copy()
    # Every slot holds the newest ticket that maps to it, committed.
    np.testing.assert_array_equal(np.sort(stamps), np.arange(tickets - len(buf), tickets) + 1)
    if exact:
        expected = np.concatenate([r * STRIDE + np.arange(1, rows_each + 1) for r in range(1, actors + 1)])
        np.testing.assert_array_equal(np.sort(data["id"]), np.sort(expected))
    else:
        order = np.argsort(stamps)
        ids = data["id"][order]
        assert np.unique(ids).size == ids.size
        for r in range(1, actors + 1):  # an actor's later rows have later tickets
            mine = ids[ids // STRIDE == r]
            assert (np.diff(mine) > 0).all()
        assert ids[-1] % STRIDE == rows_each  # the last ticket is the last row of the last batch reserved
    s = sample_checked(buf, 256, rng)
    assert (buf.priorities.leaves()[s.indices] > 0).all()


def check_dead_writer(store: Store, stage: str) -> None:
    """A writer SIGKILLed at ``stage`` of an add: its rows are never served, the others go on and take its slots."""
    method = "fork"
    cap, n = 32, 4
    abandon_after = 0.3
    buf = store.make(cap, abandon_after=abandon_after)
    for lo in (1, 21):  # tickets 0..39, ids 1..40: slot s holds the row of the newest ticket = s (mod 32)
        buf.add(rows_with_ids(np.arange(lo, lo + 20)))
    files_before = store.files()
    rng = np.random.default_rng(1)

    recv, send = mp.Pipe(duplex=False)
    dying = store.start(method, die_mid_add, store.kind, store.location(buf), stage, n, send, name="dying")
    deadline = time.monotonic() + JOIN_S
    while not recv.poll(0.05):
        assert dying.is_alive() and time.monotonic() < deadline, "the dying writer failed before its kill"
    first = recv.recv()
    join_all([dying], codes=(-signal.SIGKILL,))
    assert first == 40
    dead_slots = (first + np.arange(n)) % cap  # 8..11, which held ids 9..12

    assert buf.filled == cap and buf.storage.tickets == first + n
    assert len(buf) == (cap if stage == "reserve" else cap - n)  # complete rows only
    leaves = buf.priorities.leaves()
    if stage == "reserve":  # slots not taken: their old rows are still whole and served
        assert (leaves[dead_slots] > 0).all()
        assert len(buf.storage.reader._pending) == n  # waiting for a writer that will never come
    else:  # slots being rewritten: out of the draw
        np.testing.assert_array_equal(leaves[dead_slots], 0)
    for _ in range(20):
        s = sample_checked(buf, 64, rng)
        assert (s.data["id"] < DEAD_ID).all()
        if stage != "reserve":
            assert not np.isin(s.indices, dead_slots).any()
    # Every row committed before, but those being rewritten, is intact.
    keep = np.setdiff1d(np.arange(cap), [] if stage == "reserve" else dead_slots)
    data = buf.storage.gather(keep)
    assert torn(data).size == 0
    np.testing.assert_array_equal(data["id"], np.where(keep < 8, keep + 33, keep + 1))
    if stage == "reserve":
        time.sleep(abandon_after + 0.2)
        len(buf)
        assert len(buf.storage.reader._pending) == 0  # given up after abandon_after

    # Another actor laps the ring: it takes the dead writer's slots over and commits every row.
    live = store.start(method, actor_adds, buf.writer(), 1, cap + 8, True, name="live")
    join_all([live])
    tickets = first + n + cap + 8
    assert buf.storage.tickets == tickets and len(buf) == cap
    np.testing.assert_array_equal(np.sort(buf.storage.control.stamps), np.arange(tickets - cap, tickets) + 1)
    data = buf.storage.gather(np.arange(cap))
    assert torn(data).size == 0
    slots = (first + n + np.arange(cap + 8)) % cap  # ticket first + n + k holds the live actor's row k
    np.testing.assert_array_equal(data["id"][slots[8:]], STRIDE + 9 + np.arange(cap))
    assert (buf.priorities.leaves() > 0).all()
    for _ in range(5):
        assert (sample_checked(buf, 64, rng).data["id"] < DEAD_ID).all()
    store.assert_no_new_files(files_before)  # the dead writer left no file


def check_random_kills(store: Store, rounds: int = 4) -> None:
    """Looping actors SIGKILLed at random moments: nothing torn is ever sampled, and the buffer keeps working."""
    method = "fork"
    # An unthrottled actor laps a small ring faster than a learner reads a batch (sample then
    # gives up with RuntimeError): a ring of 512 rows, batches of 4 while an actor runs.
    cap = 512
    buf = store.make(cap)
    writer = buf.writer()
    files_before = store.files()
    rng = np.random.default_rng(2)
    for r in range(1, rounds + 1):
        actor = store.start(method, actor_loops, writer, r, name=f"looping{r}")
        until = time.monotonic() + float(rng.uniform(0.05, 0.4))
        while time.monotonic() < until or not sampleable(buf):
            if sampleable(buf):
                sample_checked(buf, 4, rng)
        os.kill(actor.pid, signal.SIGKILL)
        join_all([actor], codes=(-signal.SIGKILL,))
        for _ in range(10):
            sample_checked(buf, 16, rng)
    final = store.start(method, actor_adds, writer, rounds + 1, cap, True, name="final")
    join_all([final])
    tickets = buf.storage.tickets
    np.testing.assert_array_equal(np.sort(buf.storage.control.stamps), np.arange(tickets - cap, tickets) + 1)
    data = buf.storage.gather(np.arange(cap))
    assert torn(data).size == 0
    np.testing.assert_array_equal(np.sort(data["id"]), (rounds + 1) * STRIDE + np.arange(1, cap + 1))
    sample_checked(buf, 64, rng)
    store.assert_no_new_files(files_before)


def check_bad_batches(store: Store) -> None:
    """A refused batch, through a writer handle or the learner, changes nothing anywhere."""
    cap = 16
    buf = store.make(cap)
    writer = buf.writer()
    assert writer.add(rows_with_ids(np.arange(1, 6))) == 5
    s = buf.sample(4)
    buf.update_priorities(s.indices, np.array([0.5, 2.0, 1.0, 3.0]))
    good = rows_with_ids([100, 101])
    bad = {
        "missing field": {k: v for k, v in good.items() if k != "tail"},
        "unknown field": {**good, "extra": good["id"]},
        "obs shape": {**good, "obs": good["obs"][:, :-1]},
        "obs rank": {**good, "obs": good["obs"][0]},
        "row counts differ": {**good, "tail": good["tail"][:1]},
        "fractional ids": {**good, "id": good["id"] + 0.5},
        "obs overflows float32": {**good, "obs": np.full((2, OBS), 1e300)},
        "id wraps in int64": {**good, "id": np.array([2**63, 1], np.uint64)},
        "more rows than capacity": rows_with_ids(np.arange(1, cap + 2)),
        "a list": [good],
        "None": None,
    }
    before = store.snapshot(buf)
    for what, batch in bad.items():
        for add in (writer.add, buf.add):
            with pytest.raises((TypeError, ValueError)):
                add(batch)
            after = store.snapshot(buf)
            for key, value in before.items():
                if isinstance(value, np.ndarray):
                    np.testing.assert_array_equal(after[key], value, err_msg=f"{what}: {key}")
                else:
                    assert after[key] == value, f"{what}: {key} changed"
    assert writer.add(good) == 2  # and the handle still works


def check_writer_after_close(store: Store) -> None:
    """After the owner closes the buffer, a writer handle's add raises RingClosedError."""
    buf = store.make(8)
    used = buf.writer()
    used.add(rows_with_ids([1]))
    buf.close()
    with pytest.raises(RingClosedError):
        used.add(rows_with_ids([2]))
    used.close()


def check_relaxed_pipeline(store: Store) -> None:
    """RelaxedReplay over a ring storage an actor adds to: whole samples, updates accepted, clean close."""
    method = "fork"
    buf = store.make(64)
    buf.add(rows_with_ids(np.arange(1, 9)))  # the learner's own, so that there is something to sample
    relaxed = RelaxedReplay(buf, staleness=2, prefetch=2, worker="thread")
    actor = store.start(method, actor_adds, buf.writer(), 1, 200, False, 0.0005)
    rng = np.random.default_rng(3)
    steps = 0
    while actor.is_alive() or steps < 20:
        s = relaxed.sample(16)
        assert torn(s.data).size == 0
        relaxed.update_priorities(s.indices, rng.random(16) + 0.01)
        steps += 1
    join_all([actor])
    for _ in range(4):  # the actor's last rows are in
        s = relaxed.sample(16)
        assert torn(s.data).size == 0
        relaxed.update_priorities(s.indices, rng.random(16) + 0.01)
    assert len(buf) == 64
    relaxed.close()  # closes the buffer too
    store.buffers.remove(buf)
    assert store.files() <= ({f"buf/{f}" for f in DISK_FILES} if store.kind == "disk" else set())


# -- "shared" -----------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_actors_add_while_learner_samples_nothing_lost(shared_store, method):
    """3 actor processes add 360 rows to a big ring while the learner samples: nothing torn, every id once."""
    check_actors(shared_store, method, capacity=512, rows_each=120, pause=0.0005)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_actors_lap_a_small_ring(shared_store, method):
    """3 actors lap a 64-row ring 70 times: nothing torn sampled, the newest tickets committed in every slot."""
    check_actors(shared_store, method, capacity=64, rows_each=1500, pause=0.001)


@pytest.mark.parametrize("stage", ["reserve", "acquire", "half", "written"])
def test_writer_killed_mid_add(shared_store, stage):
    """A writer SIGKILLed at each protocol step: never sampled, committed rows intact, slots taken over."""
    check_dead_writer(shared_store, stage)


def test_writers_killed_at_random_moments(shared_store):
    """Looping actors SIGKILLed at random times never get a torn row sampled; the ring works after."""
    check_random_kills(shared_store)


def test_rows_rewritten_past_the_redraw_count_are_waited_out_then_refused(shared_store, monkeypatch):
    """A learner stalled while a writer laps the ring finds 100 draws in a row rewritten: it waits them out.

    Between the learner's poll and its read of the rows drawn, a writer in this process laps the
    whole ring (what a writer on another core does while the learner's core is taken), for the
    first 100 reads. Rows rewritten for longer than the time bound end in RuntimeError, never in
    a row served for another's priority.
    """
    cap = 64
    buf = shared_store.make(cap, schema=SMALL_SCHEMA)
    buf.add(rows_with_ids(np.arange(1, cap + 1), width=4))
    writer, read = buf.writer(), buf.storage.read_intact
    reads, next_id = 0, cap + 1

    def lapped_first(indices, laps=100):
        nonlocal reads, next_id
        reads += 1
        if reads <= laps:
            writer.add(rows_with_ids(np.arange(next_id, next_id + cap), width=4))
            next_id += cap
        return read(indices)

    monkeypatch.setattr(buf.storage, "read_intact", lapped_first)
    s = buf.sample(4)
    assert reads == 101 and torn(s.data).size == 0
    np.testing.assert_array_equal(s.data["id"], next_id - cap + s.indices)  # the last lap's rows
    assert len(buf) == cap and (buf.priorities.leaves() > 0).all()

    monkeypatch.setattr(rp, "_REDRAW_PATIENCE_S", 0.2)
    monkeypatch.setattr(buf.storage, "read_intact", functools.partial(lapped_first, laps=10**9))
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"no batch of intact rows in \d+ draws over 0.2 s"):
        buf.sample(4)
    assert time.monotonic() - start >= 0.2
    writer.close()


def test_bad_batches_change_nothing(shared_store):
    """Refused batches (fields, shapes, value-changing casts, too many rows, not a mapping) leave all as it was."""
    check_bad_batches(shared_store)


def test_writer_add_after_close_raises(shared_store):
    """A used writer handle's add after the owner's close raises RingClosedError (the segment is gone)."""
    check_writer_after_close(shared_store)


def test_fresh_writer_add_after_close_raises_ring_closed(shared_store):
    """A writer handle first used after the owner's close raises RingClosedError, as documented."""
    buf = shared_store.make(8)
    fresh = buf.writer()
    buf.close()
    with pytest.raises(RingClosedError):
        fresh.add(rows_with_ids([1]))


def test_relaxed_pipeline_over_shared(shared_store):
    """RelaxedReplay(staleness=2, prefetch=2, thread) over a shared buffer an actor fills: whole samples."""
    check_relaxed_pipeline(shared_store)


def test_sampling_distribution_and_weights_through_the_ring(shared_store):
    """Rows added by a writer process are drawn with P(i) = p_i / sum p (chi-square) and weights (p_min/p_i)^beta."""
    method = "fork"
    cap = 64
    buf = shared_store.make(cap, schema=SMALL_SCHEMA)
    writer = buf.writer()
    actor = shared_store.start(method, _add_small, writer, cap)
    join_all([actor])
    assert len(buf) == cap
    rng = np.random.default_rng(4)
    buf.update_priorities(np.arange(cap), rng.uniform(0.05, 3.0, cap))
    leaves = buf.priorities.leaves().astype(np.float64)
    assert (leaves > 0).all()
    counts = np.zeros(cap, np.int64)
    beta = 0.7
    for _ in range(4):
        s = buf.sample(100_000, beta=beta)
        assert torn(s.data).size == 0
        np.testing.assert_array_equal(s.data["id"], s.indices + 1)
        np.testing.assert_allclose(s.weights, (leaves.min() / leaves[s.indices]) ** beta, rtol=1e-5)
        counts += np.bincount(s.indices, minlength=cap)
    from scipy import stats

    expected = counts.sum() * leaves / leaves.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-4


def _add_small(writer, n: int) -> None:
    assert writer.add(rows_with_ids(np.arange(1, n + 1), width=4)) == n
    writer.close()


def test_single_process_shared_equals_host(shared_store):
    """A seeded shared buffer the learner alone adds to gives exactly the host buffer's samples."""
    shared = shared_store.make(40, schema=SMALL_SCHEMA, seed=7)
    host = PrioritizedReplay(40, SMALL_SCHEMA, seed=7)
    rng = np.random.default_rng(5)
    next_id = 1
    for step in range(60):
        n = int(rng.integers(1, 12))
        batch = rows_with_ids(np.arange(next_id, next_id + n), width=4)
        next_id += n
        np.testing.assert_array_equal(shared.add(batch), host.add(batch))
        assert (len(shared), shared.position) == (len(host), host.position)
        a, b = shared.sample(16), host.sample(16)
        np.testing.assert_array_equal(a.indices, b.indices)
        np.testing.assert_array_equal(a.weights, b.weights)
        for name in SMALL_SCHEMA:
            np.testing.assert_array_equal(a.data[name], b.data[name])
        td = rng.random(16) * step
        shared.update_priorities(a.indices, td)
        host.update_priorities(b.indices, td)
    np.testing.assert_array_equal(shared.priorities.leaves(), host.priorities.leaves())


def test_writer_handle_pickles(shared_store):
    """A writer handle (used or not) round-trips through pickle and adds from another process."""
    buf = shared_store.make(16)
    writer = buf.writer()
    copy = pickle.loads(pickle.dumps(writer))
    assert repr(copy) == repr(writer) and copy.schema == writer.schema and copy.capacity == 16
    method = "spawn"
    p = shared_store.start(method, actor_adds, copy, 1, 10, True)
    join_all([p])
    assert sorted(buf.read_rows("id", np.arange(len(buf)))) == list(STRIDE + np.arange(1, 11))


def test_pickled_buffer_is_an_independent_copy(shared_store):
    """pickle of a shared buffer gives a copy with its own segment, removed on its close; the original stays."""
    buf = shared_store.make(16, seed=3)
    buf.add(rows_with_ids(np.arange(1, 11)))
    copy = pickle.loads(pickle.dumps(buf))
    shared_store.buffers.append(copy)
    assert copy.storage.path != buf.storage.path
    assert Path(copy.storage.path).parent == Path(buf.storage.path).parent
    assert len(copy) == 10 and copy.position == 10
    np.testing.assert_array_equal(copy.read_rows("id", np.arange(10)), np.arange(1, 11))
    copy.add(rows_with_ids([50, 51]))
    assert len(copy) == 12 and len(buf) == 10
    np.testing.assert_array_equal(buf.read_rows("id", np.arange(12)), [*range(1, 11), 0, 0])
    copy.close()
    assert not os.path.exists(copy.storage.path)
    assert os.path.exists(buf.storage.path)
    assert torn(buf.sample(8).data).size == 0


def test_default_dir_is_dev_shm(shared_store):
    """Without a dir the segment goes to /dev/shm (it has room here), and close removes it."""
    if not os.path.isdir(SHM_DIR):
        pytest.skip("no /dev/shm")
    buf = PrioritizedReplay(8, SMALL_SCHEMA, storage="shared")
    path = buf.storage.path
    try:
        assert os.path.dirname(path) == SHM_DIR and os.path.exists(path)
        buf.add(rows_with_ids([1, 2], width=4))
        assert len(buf) == 2
    finally:
        buf.close()
    assert not os.path.exists(path)


def test_closed_shared_buffer_leaves_nothing_and_killed_actor_no_file(shared_store):
    """close() removes the segment; a SIGKILLed actor leaves no file of its own."""
    buf = shared_store.make(16)
    path = buf.storage.path
    assert shared_store.files() == {os.path.basename(path)}
    method = "fork"
    actor = shared_store.start(method, actor_loops, buf.writer(), 1)
    while len(buf) < 8:
        time.sleep(0.005)
    os.kill(actor.pid, signal.SIGKILL)
    join_all([actor], codes=(-signal.SIGKILL,))
    assert shared_store.files() == {os.path.basename(path)}
    buf.close()
    assert shared_store.files() == set()


def test_host_storage_has_no_writer():
    """A host buffer gives no writer handle: TypeError."""
    with pytest.raises(TypeError, match="writer handles"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="host").writer()


def test_shared_refuses_device_and_bad_options(shared_store, tmp_path):
    """device= with shared storage, an unknown option or a missing dir: errors naming them, no file left."""
    with pytest.raises(ValueError, match="device"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="shared", device="cpu", storage_options={"dir": str(tmp_path)})
    with pytest.raises(TypeError, match="colour"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="shared", storage_options={"dir": str(tmp_path), "colour": 1})
    with pytest.raises(ValueError, match="dir"):
        PrioritizedReplay(8, SMALL_SCHEMA, storage="shared", storage_options={"dir": str(tmp_path / "none")})
    assert shared_store.files() == set()


@pytest.mark.parametrize("value", ["soon", float("nan"), -1.0])
def test_shared_refuses_bad_abandon_after(shared_store, value):
    """A bad abandon_after (not a number, NaN, negative) is refused up front, naming it."""
    with pytest.raises((TypeError, ValueError), match="abandon_after"):
        shared_store.make(8, abandon_after=value)


def test_writer_closed_in_learner_process_keeps_learner_registered(shared_store):
    """A writer handle used and closed in the learner's own process leaves the learner's rows protected."""
    buf = shared_store.make(16)
    writer = buf.writer()
    writer.add(rows_with_ids([1]))
    writer.close()
    st = buf.storage
    # A marker the learner leaves while writing a row must not read as a dead writer's.
    assert not st.control.marker_is_dead(ring._marker(st._tag, st.tickets))
