"""``storage="disk"`` with compressed fields: records in a log-structured ring file, ``records.log``.

Rows are real Atari transitions (Pong and Breakout, ``tests/data/atari_frames.npz``), each row's
``action`` its id, so every row served is compared, bit for bit, with the row written. Writers are
processes (fork); the log wraps; a budget too small evicts the oldest rows, never served; the learner
is SIGKILLed and the buffer reopened; bytes of the files are damaged.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, ReplayFileError
from hetero_replay._native import compress_rows
from hetero_replay.pipeline import RelaxedReplay
from hetero_replay.storage import checkpoint
from hetero_replay.storage.codec import ByteBudgetError
from hetero_replay.storage.disk import CONTROL_FILE, LOG_FILE, ROW_FILE, STATE_FILE
from hetero_replay.storage.disk_records import REFS
from hetero_replay.storage.record_log import RECORD_HEADER_BYTES

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from atari_frames import SCHEMA, sample_transitions  # noqa: E402

JOIN_S = 60  # only against hangs


@pytest.fixture(scope="module")
def transitions() -> dict[str, np.ndarray]:
    """Pong's and Breakout's transitions back to back (190); ``action`` is the row's id."""
    return sample_transitions()


def disk(path: Path, capacity: int, codec="lz4", seed: int = 0, **options) -> PrioritizedReplay:
    return PrioritizedReplay(
        capacity, SCHEMA, seed=seed, storage="disk", storage_options={"path": str(path), "codec": codec, **options}
    )


def pick(t: dict[str, np.ndarray], ids) -> dict[str, np.ndarray]:
    return {k: v[np.asarray(ids) % len(t["action"])] for k, v in t.items()}


def add_all(buf: PrioritizedReplay, t: dict[str, np.ndarray], ids, seed: int = 0) -> None:
    """Add rows ``ids`` (modulo the transitions held) in batches of 1-15."""
    rng, lo = np.random.default_rng(seed), 0
    while lo < len(ids):
        n = int(rng.integers(1, 16))
        buf.add(pick(t, ids[lo : lo + n]))
        lo += n


def assert_rows_are_the_written_ones(t: dict[str, np.ndarray], data: dict[str, np.ndarray]) -> None:
    ids = data["action"]
    assert ((ids >= 0) & (ids < len(t["action"]))).all(), f"rows never written served: ids {ids}"
    for name, values in t.items():
        np.testing.assert_array_equal(data[name], values[ids], err_msg=f"field {name}")


def mean_row_bytes(t: dict[str, np.ndarray], codec: str) -> float:
    """Mean log bytes a transition takes (its two records and their headers)."""
    return float(
        sum(
            np.mean([len(r) + RECORD_HEADER_BYTES for r in compress_rows(t[n].reshape(len(t[n]), -1), codec, 1)])
            for n in ("obs", "next_obs")
        )
    )


def references(buf: PrioritizedReplay, slots) -> np.ndarray:
    """The records' (offset, length) per field of the rows at ``slots``, as rows.dat holds them."""
    storage = buf.storage
    return storage.format.unpack(storage._read(np.asarray(slots, np.int64)), [REFS])[REFS]


@pytest.mark.parametrize("codec", ["lz4", ("zstd", 3)])
def test_rows_served_are_the_rows_written_bit_for_bit(transitions, tmp_path, codec):
    buf = disk(tmp_path / "buf", 256, codec, byte_budget=1 << 20)
    add_all(buf, transitions, np.arange(190))
    for _ in range(4):
        assert_rows_are_the_written_ones(transitions, buf.sample(64).data)
    every = buf.storage.gather(np.arange(190))
    assert_rows_are_the_written_ones(transitions, every)
    assert sorted(every["action"].tolist()) == list(range(190))
    raw = 2 * 4 * 84 * 84
    assert buf.storage.bytes_per_row < raw / 8  # the records, not raw frames
    assert os.path.getsize(tmp_path / "buf" / LOG_FILE) == 1 << 20
    assert os.path.getsize(tmp_path / "buf" / ROW_FILE) < 256 * 200  # raw fields and references only
    buf.close()


def test_the_log_wraps_and_evicted_rows_are_never_served(transitions, tmp_path):
    """A budget of ~40 rows' records under a 128-row ring, 600 adds (the log goes round ~15 times): rows whose
    records were overwritten leave the draw (priority 0, counted) and are never served."""
    budget = int(40 * mean_row_bytes(transitions, "lz4"))
    buf = disk(tmp_path / "buf", 128, byte_budget=budget)
    ids = np.arange(600)
    rng, lo = np.random.default_rng(1), 0
    while lo < len(ids):
        n = int(rng.integers(1, 9))
        buf.add(pick(transitions, ids[lo : lo + n]))
        lo += n
        batch = buf.sample(16)
        assert_rows_are_the_written_ones(transitions, batch.data)
        tickets = buf.storage.reader.seen[batch.indices] - 1
        assert (tickets >= lo - 80).all(), "a row older than the log holds was served"
    storage = buf.storage
    assert storage.evicted_rows > 400
    held = np.flatnonzero(buf.leaves() > 0)
    assert 20 <= len(held) <= 70
    assert not storage.records.evicted(references(buf, held)).any()  # the draw holds only rows with records
    buf.close()


def test_a_read_finds_rows_the_poll_has_not_evicted_yet(transitions, tmp_path):
    """Records overwritten by a writer since the learner's last poll: the read itself refuses those rows (a slot
    drawn twice counted once), serves the others bit for bit."""
    budget = int(40 * mean_row_bytes(transitions, "lz4"))
    buf = disk(tmp_path / "buf", 128, byte_budget=budget)
    add_all(buf, transitions, np.arange(30))
    writer = buf.writer()
    writer.add(pick(transitions, np.arange(30, 60)))  # the learner has not polled: rows 0.. still drawn
    storage = buf.storage
    slots = np.array([0, 0, 1, 29, 29])
    rows, ok = storage.read_intact(slots)
    np.testing.assert_array_equal(ok, [False, False, False, True, True])
    assert storage.evicted_rows == 2
    assert_rows_are_the_written_ones(transitions, {k: v[ok] for k, v in rows.items()})
    writer.close()
    buf.close()


def actor_adds(writer, ids: np.ndarray, t: dict[str, np.ndarray], seed: int) -> None:
    rng, lo = np.random.default_rng(seed), 0
    while lo < len(ids):
        n = int(rng.integers(1, 9))
        assert writer.add(pick(t, ids[lo : lo + n])) == len(ids[lo : lo + n])
        lo += n
    writer.close()


def test_writer_processes_interleave_their_records(transitions, tmp_path):
    """3 forked writers add interleaved batches while the learner samples: every row once, each bit for bit."""
    buf = disk(tmp_path / "buf", 256, byte_budget=1 << 20)
    writer = buf.writer()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=actor_adds, args=(writer, np.arange(k, 190, 3), transitions, k)) for k in range(3)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + JOIN_S
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if len(buf):
            assert_rows_are_the_written_ones(transitions, buf.sample(32).data)
    for p in procs:
        p.join(JOIN_S)
        assert p.exitcode == 0
    assert len(buf) == 190
    every = buf.storage.gather(np.arange(190))
    assert sorted(every["action"].tolist()) == list(range(190))
    assert_rows_are_the_written_ones(transitions, every)
    buf.close()


def test_relaxed_pipeline_serves_whole_rows_while_a_writer_wraps_the_log(transitions, tmp_path):
    """RelaxedReplay (thread worker) over a compressed disk buffer whose log a writer process laps: every row
    served is the row written, evicted rows never are."""
    budget = int(40 * mean_row_bytes(transitions, "lz4"))
    buf = disk(tmp_path / "buf", 64, byte_budget=budget)
    add_all(buf, transitions, np.arange(8))
    relaxed = RelaxedReplay(buf, staleness=2, prefetch=2, worker="thread")
    actor = mp.get_context("fork").Process(target=actor_adds, args=(buf.writer(), np.arange(400), transitions, 1))
    actor.start()
    rng, steps = np.random.default_rng(3), 0
    while actor.is_alive() or steps < 20:
        batch = relaxed.sample(16)
        assert_rows_are_the_written_ones(transitions, batch.data)
        relaxed.update_priorities(batch.indices, rng.random(16) + 0.01)
        steps += 1
    actor.join(JOIN_S)
    assert actor.exitcode == 0 and buf.storage.evicted_rows > 0
    relaxed.close()  # closes the buffer too


def learner_until_killed(path: str) -> None:
    """Adds rows (id = ticket, cycling through the transitions) to a 64-row buffer whose log holds ~40 rows,
    flushing every 4th add and printing the tickets after each durable point."""
    t = sample_transitions()
    budget = int(40 * mean_row_bytes(t, "lz4"))
    buf = disk(Path(path), 64, byte_budget=budget, flush_every=10**6, flush_seconds=1e6, seed=3)
    rng, ticket, adds = np.random.default_rng(0), 0, 0
    while True:
        n = int(rng.integers(1, 6))
        buf.add(pick(t, np.arange(ticket, ticket + n)))
        ticket, adds = ticket + n, adds + 1
        if adds % 4 == 0:
            buf.flush()
            print(buf.storage.tickets, flush=True)


def test_learner_killed_reopens_at_its_last_durable_point(transitions, tmp_path):
    """SIGKILL of an adding learner: reopen restores the durable point (its head checked), serves only rows whose
    records are whole, bit for bit, and adds on."""
    path = tmp_path / "buf"
    code = f"from tests.test_disk_compressed import learner_until_killed; learner_until_killed({str(path)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        printed = []
        while len(printed) < 30:  # the log has gone round several times
            line = proc.stdout.readline()
            assert line, f"the learner died before its kill (exit code {proc.poll()})"
            printed.append(int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(JOIN_S)
    printed += [int(x) for x in proc.stdout.read().split()]
    proc.stdout.close()
    header = checkpoint.read(path / STATE_FILE)[0]
    assert header["tickets"] == printed[-1] and header["record_log"]["head"] > 0
    buf = PrioritizedReplay.reopen(path)
    storage = buf.storage
    assert storage.codecs.keys() == {"obs", "next_obs"}  # from the buffer's own files
    held = np.flatnonzero(buf.leaves() > 0)
    assert 20 <= len(held) <= 64
    tickets = storage.reader.seen[held] - 1
    assert (tickets < printed[-1]).all() and (tickets >= printed[-1] - 64).all()
    rows = storage.gather(held)
    assert_rows_are_the_written_ones(transitions, rows)
    np.testing.assert_array_equal(rows["action"], tickets % 190)  # each slot holds its durable ticket's row
    for _ in range(3):
        assert_rows_are_the_written_ones(transitions, buf.sample(32).data)
    add_all(buf, transitions, np.arange(printed[-1], printed[-1] + 100))
    assert_rows_are_the_written_ones(transitions, buf.sample(32).data)
    buf.close()


def test_a_damaged_record_is_never_served(transitions, tmp_path):
    """A byte of one row's record flipped on the disk: sampling drops that row (priority 0, counted, warned);
    read_rows and save refuse it naming records.log."""
    buf = disk(tmp_path / "buf", 64, byte_budget=1 << 20)
    add_all(buf, transitions, np.arange(40))
    buf.flush()
    offset, length = references(buf, [7])[0, :, 1]  # slot 7's next_obs record
    log = tmp_path / "buf" / LOG_FILE
    fd = os.open(log, os.O_RDWR)
    at = int(offset) + RECORD_HEADER_BYTES + int(length) // 2
    os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x40]), at)
    os.close(fd)
    with pytest.warns(RuntimeWarning, match="slots \\[7\\]"):
        for _ in range(20):
            batch = buf.sample(32)
            assert 7 not in batch.indices.tolist()
            assert_rows_are_the_written_ones(transitions, batch.data)
    assert buf.storage.damaged_rows == 1 and buf.leaves()[7] == 0
    with pytest.raises(ReplayFileError, match=f"{LOG_FILE}: rows at slots \\[7\\]"):
        buf.read_rows("next_obs", [7])
    with pytest.raises(ReplayFileError, match=LOG_FILE):
        buf.save(tmp_path / "buf.replay")
    assert not (tmp_path / "buf.replay").exists()
    buf.close()


def test_reopen_refuses_a_truncated_log_or_a_head_behind_the_durable_point(transitions, tmp_path):
    path = tmp_path / "buf"
    buf = disk(path, 64, byte_budget=1 << 20)
    add_all(buf, transitions, np.arange(40))
    buf.close()  # its last durable point
    log, ctl = path / LOG_FILE, path / CONTROL_FILE
    before = {name: (path / name).read_bytes() for name in (CONTROL_FILE, ROW_FILE, STATE_FILE)}
    os.truncate(log, (1 << 20) - 1)
    with pytest.raises(ReplayFileError, match=f"{LOG_FILE}: the buffer's record log holds {(1 << 20) - 1} bytes"):
        PrioritizedReplay.reopen(path)
    os.truncate(log, 1 << 20)
    # The head (the first word after the ring's control block) set back to 0: the control block was reset.
    data = bytearray(before[CONTROL_FILE])
    payload_at = int(np.frombuffer(bytes(data[:56]), np.int64)[6])  # the header's payload offset
    data[payload_at : payload_at + 8] = bytes(8)
    ctl.write_bytes(bytes(data))
    with pytest.raises(ReplayFileError, match="head 0 is behind the durable point's"):
        PrioritizedReplay.reopen(path)
    for name, content in before.items():  # nothing changed by the refusals (the control block as planted)
        if name != CONTROL_FILE:
            assert (path / name).read_bytes() == content
    ctl.write_bytes(before[CONTROL_FILE])
    again = PrioritizedReplay.reopen(path)
    assert len(again) == 40
    assert_rows_are_the_written_ones(transitions, again.sample(16).data)
    again.close()


def test_reopen_drops_a_row_whose_references_are_damaged(transitions, tmp_path):
    """A byte of slot 3's row record (its record references) flipped while the buffer was closed: reopen drops
    that row as damaged (priority 0, counted), the others are served bit for bit."""
    path = tmp_path / "buf"
    buf = disk(path, 64, byte_budget=1 << 20)
    add_all(buf, transitions, np.arange(40))
    row_bytes = buf.storage.format.bytes
    buf.close()
    fd = os.open(path / ROW_FILE, os.O_RDWR)
    at = 3 * row_bytes + row_bytes - 24 - 8  # inside the references, the field before the checksum
    os.pwrite(fd, bytes([os.pread(fd, 1, at)[0] ^ 0x01]), at)
    os.close(fd)
    again = PrioritizedReplay.reopen(path)
    assert again.storage.damaged_rows == 1 and again.leaves()[3] == 0
    held = np.flatnonzero(again.leaves() > 0)
    assert len(held) == 39 and 3 not in held.tolist()
    for _ in range(5):
        batch = again.sample(32)
        assert 3 not in batch.indices.tolist()
        assert_rows_are_the_written_ones(transitions, batch.data)
    again.close()


def test_bad_options_are_refused_before_any_file(transitions, tmp_path):
    path = tmp_path / "buf"
    cases = [
        ({"codec": "lz4", "frames": True}, "storage='disk' does not store frames once"),
        ({"codec": "gzip"}, "unknown codec 'gzip'"),
        ({"codec": ("zstd", 12)}, "level must be an integer in \\[0, 9\\]"),
        ({"codec": "lz4", "byte_budget": 0}, "byte_budget must be a positive integer"),
        ({"byte_budget": 1 << 20}, "need a codec"),
        ({"codec": {"pixels": "lz4"}}, "codec names fields not in the schema: \\['pixels'\\]"),
    ]
    for options, match in cases:
        with pytest.raises(ValueError, match=match):
            PrioritizedReplay(8, SCHEMA, storage="disk", storage_options={"path": str(path), **options})
        assert not path.exists()
    with pytest.raises(ValueError, match="compresses no field"):
        PrioritizedReplay(8, {"x": ((3,), "float32")}, storage="disk", storage_options={"path": path, "codec": "lz4"})
    assert not path.exists()
    # A batch whose records cannot fit the log: ByteBudgetError, and nothing changed.
    buf = disk(path, 16, byte_budget=3000)
    buf.add(pick(transitions, [0]))
    files = {name: (path / name).read_bytes() for name in (CONTROL_FILE, ROW_FILE, LOG_FILE)}
    with pytest.raises(ByteBudgetError, match="byte_budget"):
        buf.add(pick(transitions, np.arange(1, 9)))
    assert len(buf) == 1 and buf.storage.tickets == 1
    for name, content in files.items():
        assert (path / name).read_bytes() == content, name
    buf.close()
    with pytest.raises(ValueError, match="not codecs"):  # reopened with other codecs: refused, unchanged
        PrioritizedReplay.reopen(path, codec="zstd")
    again = PrioritizedReplay.reopen(path)
    assert_rows_are_the_written_ones(transitions, again.sample(4).data)
    again.close()


def test_checkpoints_keep_the_records_as_they_are(transitions, tmp_path):
    """save -> host (compressed as saved) and -> another compressed disk buffer (records appended as they are);
    a state dict into a raw disk buffer (records decompressed): the same rows, priorities and generator."""
    buf = disk(tmp_path / "buf", 64, byte_budget=1 << 20, seed=5)
    add_all(buf, transitions, np.arange(100))
    batch = buf.sample(16)
    buf.update_priorities(batch.indices, np.linspace(0.1, 4.0, 16))
    buf.save(tmp_path / "buf.replay")
    header, arrays = checkpoint.read(tmp_path / "buf.replay")
    assert header["compressed"]["fields"]["obs"] == {"codec": "lz4", "level": 1, "frames": False}
    saved = buf.storage.export_state(64)[1]["arrays"]
    np.testing.assert_array_equal(arrays["compressed/obs/records"], saved["obs/records"])
    want = buf.storage.gather(np.arange(64))
    copies = [
        PrioritizedReplay.load(tmp_path / "buf.replay"),
        PrioritizedReplay.load(
            tmp_path / "buf.replay",
            storage="disk",
            storage_options={"path": str(tmp_path / "copy"), "codec": "lz4", "byte_budget": 1 << 20},
        ),
        PrioritizedReplay.from_state_dict(
            buf.state_dict(), storage="disk", storage_options={"path": str(tmp_path / "raw")}
        ),
    ]
    rng = buf.rng.bit_generator.state
    for copy in copies:
        got = copy.storage.gather(np.arange(64))
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        np.testing.assert_array_equal(copy.leaves(), buf.leaves())
        buf.rng.bit_generator.state = rng
        np.testing.assert_array_equal(copy.sample(16).indices, buf.sample(16).indices)
    assert copies[1].storage.export_state(64)[1]["arrays"]["obs/records"].tobytes() == saved["obs/records"].tobytes()
    assert copies[2].storage.codecs == {}
    for copy in copies:
        copy.close()
    buf.close()


def test_durable_points_drop_old_log_bytes_from_the_page_cache(transitions, tmp_path):
    """With little RAM the durable point's trim reaches the record log too (its window moves with the head)."""
    buf = disk(tmp_path / "buf", 64, byte_budget=1 << 16, ram_bytes=64 * 200)
    add_all(buf, transitions, np.arange(150))
    buf.flush()
    storage = buf.storage
    assert storage._log_trimmed_to == storage.records.reserved - storage.cache_log_bytes > 0
    buf.close()
