"""``storage="shared"`` with compressed fields: actor processes append records to a shared record log.

Rows are real Atari transitions (Pong and Breakout, ``tests/data/atari_frames.npz``), each row's
``action`` its id, so every row served can be compared, bit for bit, with the row written. Writers
are processes (fork), one of them SIGKILLed mid-add; the log wraps round many times; a budget too
small evicts the oldest rows, which are never served.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay._native import compress_rows
from hetero_replay.pipeline import RelaxedReplay
from hetero_replay.storage import make_storage
from hetero_replay.storage.codec import ByteBudgetError
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES, Evictions
from hetero_replay.storage.ring import RingReader
from hetero_replay.storage.shared_compressed import CompressedSegment

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import SCHEMA, sample_transitions  # noqa: E402

from tests.processes import join_all, start, value_then_killed  # noqa: E402

DEAD_ID = 10_000  # ids a killed writer tried to add


@pytest.fixture(scope="module")
def transitions() -> dict[str, np.ndarray]:
    """Pong's and Breakout's transitions back to back; ``action`` is the row's id."""
    return sample_transitions()


def row_bytes(t: dict[str, np.ndarray], codec: str) -> np.ndarray:
    """Log bytes each transition takes (its two records and their headers)."""
    return sum(
        np.array([len(r) + RECORD_HEADER_BYTES for r in compress_rows(t[n].reshape(len(t[n]), -1), codec, 1)])
        for n in ("obs", "next_obs")
    )


def pick(t: dict[str, np.ndarray], ids) -> dict[str, np.ndarray]:
    return {k: v[ids] for k, v in t.items()}


def assert_rows_are_the_written_ones(t: dict[str, np.ndarray], data: dict[str, np.ndarray]) -> None:
    ids = data["action"]
    assert ((ids >= 0) & (ids < len(t["action"]))).all(), f"rows never written served: ids {ids}"
    for name, values in t.items():
        np.testing.assert_array_equal(data[name], values[ids], err_msg=f"field {name}")


def actor_adds(writer, ids: np.ndarray, t: dict[str, np.ndarray], seed: int, lapped_ok: bool = False) -> None:
    """Add rows ``ids`` in batches of 1 to 8. ``lapped_ok``: another writer may lap this one's tickets (a stall
    between its reservation and its write, under load), whose rows the ring then drops."""
    rng = np.random.default_rng(seed)
    lo = 0
    while lo < len(ids):
        n = len(ids[lo : lo + int(rng.integers(1, 9))])
        added = writer.add(pick(t, ids[lo : lo + n]))
        assert 0 <= added <= n if lapped_ok else added == n
        lo += n
    writer.close()


def die_mid_add(location: dict, t: dict[str, np.ndarray], stage: str, n: int, conn) -> None:
    """Run the write protocol by hand and SIGKILL this process at ``stage``; sends the first ticket before."""
    sink = CompressedSegment(**location)
    control = sink.control
    tag = control.register(os.getpid())
    rows = pick(t, np.arange(n))
    rows["action"] = np.arange(DEAD_ID, DEAD_ID + n)
    encoded = sink.encode(rows)
    first = control.reserve(n)
    taken, lapped = control.acquire(first, n, tag)
    assert taken.all() and lapped == 0
    if stage == "records":  # the records in the log, the rows' references and raw fields not yet
        sink.put_records((first + np.arange(n)) % control.capacity, first + np.arange(n) + 1, encoded, np.arange(n))
    else:  # "written": everything but the stamps
        sink.write_rows(first, encoded, None)
    conn.send(first)
    os.kill(os.getpid(), signal.SIGKILL)


def make(capacity: int, tmp_path: Path, **options) -> PrioritizedReplay:
    return PrioritizedReplay(capacity, SCHEMA, storage="shared", storage_options={"dir": str(tmp_path), **options})


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_actors_rows_come_back_bit_for_bit_as_the_log_wraps(transitions, tmp_path, codec):
    """Two actor processes add both games' rows while the learner samples; the log goes round several times."""
    cap = 48
    # Every row's records outlive it. Two writers may append out of ticket order: between the oldest live
    # row's records and the log's head lie, besides the live rows', those of at most one batch of the other
    # writer (up to 8 rows) that took its tickets first but was descheduled before it wrote them.
    budget = int((cap + 8) * row_bytes(transitions, codec).max() * 1.1)
    buf = make(cap, tmp_path, codec=codec, byte_budget=budget)
    n = len(transitions["action"])
    actors = [
        start(actor_adds, buf.writer(), ids, transitions, k, True)
        for k, ids in enumerate(np.array_split(np.arange(n), 2))
    ]
    rng = np.random.default_rng(1)
    while any(p.is_alive() for p in actors):
        if len(buf) and buf.tree.total() > 0:
            s = buf.sample(16)
            assert_rows_are_the_written_ones(transitions, s.data)
            buf.update_priorities(s.indices, rng.random(16) + 0.1)
    join_all(actors)
    storage = buf.storage
    assert len(buf) == cap and storage.committed == cap
    assert storage.segment.log.reserved > 2 * budget  # wrapped at least twice
    data = storage.gather(np.arange(cap))
    assert_rows_are_the_written_ones(transitions, data)
    assert len(set(data["action"])) == cap
    for _ in range(10):
        assert_rows_are_the_written_ones(transitions, buf.sample(64).data)
    assert storage.evicted_rows == 0
    assert 0 < storage.bytes_per_row <= budget / cap
    buf.close()
    assert os.listdir(tmp_path) == []


def test_a_budget_too_small_evicts_the_oldest_rows_which_are_never_served(transitions, tmp_path):
    cap, kept = 64, 16
    budget = int(kept * row_bytes(transitions, "lz4").max())
    buf = make(cap, tmp_path, codec="lz4", byte_budget=budget)
    actor = start(actor_adds, buf.writer(), np.arange(cap), transitions, 0)
    join_all([actor])
    storage = buf.storage
    assert len(buf) == cap
    _, sound = storage.read_intact(np.arange(cap))
    assert kept <= sound.sum() < 2 * kept + 8 and sound[-kept:].all() and not sound[: cap - 2 * kept - 8].any()
    rng = np.random.default_rng(2)
    for _ in range(30):
        s = buf.sample(32)
        assert_rows_are_the_written_ones(transitions, s.data)
        assert sound[s.indices].all()
        buf.update_priorities(s.indices, rng.random(32) + 0.1)
    assert storage.evicted_rows == cap - sound.sum()
    np.testing.assert_array_equal(buf.priorities.leaves()[~sound], 0)  # out of the draw until rewritten
    # Rewritten slots come back; the rows then evicted go.
    actor = start(actor_adds, buf.writer(), np.arange(cap, cap + 24), transitions, 1)
    join_all([actor])
    for _ in range(10):
        s = buf.sample(32)
        assert_rows_are_the_written_ones(transitions, s.data)
    assert (s.data["action"] >= cap + 24 - 2 * kept - 8).all()
    assert storage.evicted_rows > cap - sound.sum()
    buf.close()


def test_rows_a_stalled_writer_reserved_are_replaced_not_evicted(transitions, tmp_path):
    """A writer stalled between reserving its tickets and writing: the oldest rows, whose slots it reserved, lose
    their records to another writer's, but the ring was replacing them anyway: gone, not counted as evicted."""
    cap = 16
    buf = make(cap, tmp_path, codec="lz4", byte_budget=int(cap * row_bytes(transitions, "lz4").max()))
    writer = buf.writer()
    writer.add(pick(transitions, np.arange(cap)))
    assert len(buf) == cap and buf.storage.read_intact(np.arange(cap))[1].all()
    buf.storage.control.reserve(4)  # the stalled writer: the tickets of slots 0-3, nothing taken or written yet
    writer.add(pick(transitions, np.arange(cap, cap + 12)))  # slots 4-15
    assert len(buf) == cap
    storage = buf.storage
    _, sound = storage.read_intact(np.arange(4))
    assert not sound[0]  # the oldest row's records are gone (the log holds 16 rows of the largest)...
    assert storage.evicted_rows == 0  # ...but its slot is the stalled writer's
    np.testing.assert_array_equal(buf.priorities.leaves()[:4][~sound], 0)  # and it is never served
    s = buf.sample(64)
    assert_rows_are_the_written_ones(transitions, s.data)
    assert sound[s.indices[s.indices < 4]].all()
    writer.close()
    buf.close()


def test_reads_and_polls_find_the_same_evicted_rows(transitions, tmp_path):
    """The read's own check (head re-read after the copy) and the poll's eviction pass agree."""
    cap, kept = 64, 8
    budget = int(kept * row_bytes(transitions, "lz4").max())
    storage = make_storage("shared", cap, SCHEMA, {"dir": str(tmp_path), "codec": "lz4", "byte_budget": budget})
    for lo in range(0, cap, 4):
        storage.append(pick(transitions, np.arange(lo, lo + 4)))
    storage.reader.poll()  # the ring's poll only: no eviction pass yet
    _, sound = storage.read_intact(np.arange(cap))
    assert kept <= sound.sum() < 2 * kept + 4 and sound[-kept:].all()
    assert storage.evicted_rows == cap - sound.sum()
    storage.reader = RingReader(storage.control)  # a fresh learner's view: every row new, then evicted
    storage.evictions = Evictions(cap)
    new, gone = storage.poll()
    assert len(new) == cap
    np.testing.assert_array_equal(gone, np.flatnonzero(~sound))
    assert storage.evicted_rows == cap - sound.sum()
    storage.close()


@pytest.mark.parametrize("stage", ["records", "written"])
def test_a_writer_killed_mid_add_loses_only_its_rows(transitions, tmp_path, stage):
    cap, n = 32, 4
    buf = make(cap, tmp_path, codec="lz4", byte_budget=cap * int(row_bytes(transitions, "lz4").max()) * 2)
    for lo in (0, 20):  # tickets 0..39: slot s holds the row of ticket s + 32 (s < 8) or s
        buf.add(pick(transitions, np.arange(lo, lo + 20)))
    writer = buf.writer()
    first = value_then_killed(die_mid_add, writer._location, transitions, stage, n)
    dead_slots = (first + np.arange(n)) % cap
    assert len(buf) == cap - n
    np.testing.assert_array_equal(buf.priorities.leaves()[dead_slots], 0)
    for _ in range(10):
        s = buf.sample(32)
        assert_rows_are_the_written_ones(transitions, s.data)
        assert not np.isin(s.indices, dead_slots).any()
    # Another actor laps the ring: it takes the dead writer's slots over, every row whole.
    actor = start(actor_adds, writer, np.arange(40, 40 + cap + 8), transitions, 3)
    join_all([actor])
    assert len(buf) == cap and (buf.priorities.leaves() > 0).all()
    data = buf.storage.gather(np.arange(cap))
    assert_rows_are_the_written_ones(transitions, data)
    assert set(data["action"]) == set(range(48, 48 + cap))
    assert buf.storage.evicted_rows == 0
    buf.close()
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"codec": "snappy"}, "unknown codec 'snappy'"),
        ({"codec": ("lz4", 12)}, "level must be an integer"),
        ({"codec": "lz4", "frames": ["reward"]}, "frames: field .reward. has no codec"),
        ({"codec": "lz4", "byte_budget": 0}, "byte_budget must be a positive integer"),
        ({"codec": "lz4", "byte_budget": -4096}, "byte_budget must be a positive integer"),
        ({"codec": "lz4", "byte_budget": 1.5e6}, "byte_budget must be a positive integer"),
        ({"codec": "lz4", "byte_budget": True}, "byte_budget must be a positive integer"),
        ({"byte_budget": 1 << 20}, "need a codec"),
        ({"codec": {"reward": "lz4", "nope": "lz4"}}, "not in the schema"),
        ({"codec": "lz4", "abandon_after": 0}, "abandon_after"),
    ],
)
def test_bad_options_are_refused_before_anything_is_created(tmp_path, options, match):
    shm = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    with pytest.raises(ValueError, match=match):
        make(8, tmp_path, **options)
    assert os.listdir(tmp_path) == []
    if os.path.isdir("/dev/shm"):
        assert {f for f in set(os.listdir("/dev/shm")) - shm if f.startswith(f"hetero-replay-{os.getpid()}-")} == set()


def test_a_batch_larger_than_the_log_is_refused_and_changes_nothing(transitions, tmp_path):
    buf = make(16, tmp_path, codec="lz4", byte_budget=4 * int(row_bytes(transitions, "lz4").max()))
    buf.add(pick(transitions, np.arange(4)))
    stamps, head = buf.storage.control.stamps.copy(), buf.storage.segment.log.reserved
    writer = buf.writer()
    for add in (buf.add, writer.add):
        with pytest.raises(ByteBudgetError, match="byte_budget"):
            add(pick(transitions, np.arange(4, 16)))
    assert buf.storage.tickets == 4 and buf.storage.segment.log.reserved == head
    np.testing.assert_array_equal(buf.storage.control.stamps, stamps)
    assert_rows_are_the_written_ones(transitions, buf.sample(8).data)
    writer.close()
    buf.close()
    tiny = make(16, tmp_path, codec="lz4", byte_budget=256)  # less than one row's records
    with pytest.raises(ByteBudgetError, match="a row's records take"):
        tiny.add(pick(transitions, [0]))
    assert tiny.storage.tickets == 0 and tiny.storage.segment.log.reserved == 0
    tiny.close()


def small_frames(ids: np.ndarray) -> np.ndarray:
    return ((ids[:, None, None] * 7 + np.arange(64).reshape(8, 8)) % 256).astype(np.uint8)


def _add_small(writer, n: int) -> None:
    ids = np.arange(n)
    writer.add({"id": ids, "frame": small_frames(ids)})
    writer.close()


def test_sampling_distribution_and_weights_through_a_compressed_ring(tmp_path):
    """Rows a writer process added are drawn with P(i) = p_i / sum p (chi-square) and weights (p_min/p_i)^beta."""
    from scipy import stats

    cap = 64
    schema = {"id": ((), np.int64), "frame": ((8, 8), np.uint8)}
    buf = PrioritizedReplay(
        cap, schema, storage="shared", storage_options={"dir": str(tmp_path), "codec": "lz4", "byte_budget": 1 << 16}
    )
    join_all([start(_add_small, buf.writer(), cap)])
    assert len(buf) == cap
    rng = np.random.default_rng(4)
    buf.update_priorities(np.arange(cap), rng.uniform(0.05, 3.0, cap))
    leaves = buf.priorities.leaves().astype(np.float64)
    counts = np.zeros(cap, np.int64)
    beta = 0.7
    for _ in range(4):
        s = buf.sample(100_000, beta=beta)
        np.testing.assert_array_equal(s.data["id"], s.indices)
        np.testing.assert_array_equal(s.data["frame"], small_frames(s.indices))
        np.testing.assert_allclose(s.weights, (leaves.min() / leaves[s.indices]) ** beta, rtol=1e-5)
        counts += np.bincount(s.indices, minlength=cap)
    expected = counts.sum() * leaves / leaves.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    buf.close()


def test_default_budget_is_a_quarter_of_the_raw_image_bytes_plus_record_overheads(transitions, tmp_path):
    buf = make(32, tmp_path, codec="lz4")
    assert buf.storage.byte_budget == 32 * 2 * (4 * 84 * 84 // 4 + 52)
    assert buf.storage.nbytes < 32 * 2 * 4 * 84 * 84 / 3  # the segment: rows, references, log
    buf.add(pick(transitions, np.arange(32)))
    assert_rows_are_the_written_ones(transitions, buf.sample(32).data)
    buf.close()


def test_a_pickled_or_restored_buffer_holds_the_same_rows(transitions, tmp_path):
    """pickle and state_dict carry the records: a copy compressing alike appends them to its log, another converts."""
    buf = make(32, tmp_path, codec="zstd", byte_budget=1 << 20)
    buf.add(pick(transitions, np.arange(40)[-32:]))
    buf.update_priorities(np.arange(32), np.linspace(0.1, 2.0, 32))
    copy = pickle.loads(pickle.dumps(buf))
    restored = PrioritizedReplay.from_state_dict(
        buf.state_dict(), storage="shared", storage_options={"dir": str(tmp_path), "codec": "lz4"}
    )
    for other in (copy, restored):
        assert other.storage.path != buf.storage.path and len(other) == 32
        np.testing.assert_array_equal(other.priorities.leaves(), buf.priorities.leaves())
        assert_rows_are_the_written_ones(transitions, other.storage.gather(np.arange(32)))
        assert_rows_are_the_written_ones(transitions, other.sample(16).data)
        other.close()
    # Restored into a log that holds 8 rows: the newest are kept, the others evicted, nothing refused.
    per_row = int(row_bytes(transitions, "lz4").max())
    small = PrioritizedReplay.from_state_dict(
        buf.state_dict(),
        storage="shared",
        storage_options={"dir": str(tmp_path), "codec": "lz4", "byte_budget": 8 * per_row},
    )
    for _ in range(5):
        assert (small.sample(16).data["action"] >= 40 - 16).all()
    assert 32 - 16 <= small.storage.evicted_rows <= 32 - 8
    small.close()
    buf.close()
    assert os.listdir(tmp_path) == []


def test_relaxed_pipeline_while_a_spawned_actor_laps_a_small_log(transitions, tmp_path):
    """Rows are evicted and rewritten while the pipeline's worker reads them: every row served is whole."""
    cap = 64
    budget = int(24 * row_bytes(transitions, "lz4").max())
    buf = make(cap, tmp_path, codec="lz4", byte_budget=budget)
    buf.add(pick(transitions, np.arange(8)))
    relaxed = RelaxedReplay(buf, staleness=2, prefetch=2, worker="thread")
    n = len(transitions["action"])
    actor = start(actor_adds, buf.writer(), np.arange(8, n), transitions, 5, method="spawn")
    rng = np.random.default_rng(3)
    steps = 0
    while actor.is_alive() or steps < 20:
        s = relaxed.sample(16)
        assert_rows_are_the_written_ones(transitions, s.data)
        relaxed.update_priorities(s.indices, rng.random(16) + 0.01)
        steps += 1
    join_all([actor])
    assert buf.storage.evicted_rows > 0
    relaxed.close()  # closes the buffer too
    assert os.listdir(tmp_path) == []


def test_a_record_overwritten_in_place_is_never_served(transitions, tmp_path):
    """What a writer that reserved long ago and copies only now would do: bytes of a live record changed.

    The head check cannot see it; the record's header (stamp, length) or its CRC does.
    """
    buf = make(16, tmp_path, codec="lz4", byte_budget=1 << 20)
    buf.add(pick(transitions, np.arange(16)))
    storage = buf.storage
    log = storage.segment.log
    header_at = int(storage.segment.offsets[3, 0]) % log.log_bytes
    log.data[header_at : header_at + 8] = 0xFF  # row 3's first record: its header's stamp
    body_at = int(storage.segment.offsets[5, 1]) % log.log_bytes + RECORD_HEADER_BYTES + 40
    log.data[body_at : body_at + 4] ^= 0x5A  # row 5's second record: bytes inside the chunk
    _, sound = storage.read_intact(np.arange(16))
    np.testing.assert_array_equal(np.flatnonzero(~sound), [3, 5])
    for _ in range(10):
        s = buf.sample(32)
        assert_rows_are_the_written_ones(transitions, s.data)
        assert not np.isin(s.indices, [3, 5]).any()
    np.testing.assert_array_equal(buf.priorities.leaves()[[3, 5]], 0)
    buf.close()
