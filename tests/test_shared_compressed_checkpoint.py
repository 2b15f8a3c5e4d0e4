"""Checkpoints of a compressed shared buffer: its records copied out of the record log as they are.

The file format and rules are the host storage's (``tests/test_compressed_checkpoint.py``): records
saved as they are with the codec settings, adopted by a buffer compressing alike, converted
otherwise, damaged ones refused. What is the shared log's own: rows whose records the log no longer
holds (evicted) are saved without records and with priority 0. Frames are real (Pong and Breakout,
``tests/data/atari_frames.npz``); each row's ``action`` is its id.
"""

from __future__ import annotations

import gzip
import os
import pickle
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, ReplayFileError
from hetero_replay.storage import checkpoint
from hetero_replay.storage.codec import DamagedRecordError
from hetero_replay.storage.records import CHECK_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import SCHEMA, TEST_DATA, sample_transitions, stacks  # noqa: E402

V1_FILE = Path(__file__).resolve().parent / "data" / "replay_v1_compressed.replay.gz"


@pytest.fixture(scope="module")
def transitions() -> dict[str, np.ndarray]:
    """Pong's and Breakout's transitions back to back; ``action`` is the row's id."""
    return sample_transitions()


def shared(tmp_path: Path, codec: str = "lz4", **options) -> dict:
    return {"storage": "shared", "storage_options": {"dir": str(tmp_path), "codec": codec, **options}}


def filled(transitions: dict, capacity: int = 32, **placement) -> PrioritizedReplay:
    """A buffer that wrapped (60 rows in uneven batches), with updated priorities and a used generator."""
    buf = PrioritizedReplay(capacity, SCHEMA, seed=5, **placement)
    lo = 0
    for size in (7, 20, 1, 19, 13):
        buf.add({k: v[lo : lo + size] for k, v in transitions.items()})
        lo += size
    batch = buf.sample(16)
    buf.update_priorities(batch.indices, np.linspace(0.1, 4.0, 16))
    return buf


def records(buf: PrioritizedReplay) -> dict[str, np.ndarray]:
    """The compressed fields' records the buffer saves (per field, back to back, and their offsets)."""
    return buf.storage.export_state(len(buf))[1]["arrays"]


def snapshot(buf: PrioritizedReplay) -> dict[str, np.ndarray]:
    """Everything a restored buffer must match: rows, records, priorities, position, size, generator;
    then a sample of 16 (its indices, weights and rows)."""
    rng = buf.rng.bit_generator.state["state"]
    out = {"state": np.array([buf._pos, len(buf), buf.max_priority, rng["state"], rng["inc"]], object)}
    out["leaves"] = buf.tree.leaves()
    out.update({f"row {n}": a for n, a in buf.storage.gather(np.arange(len(buf))).items()})
    out.update({f"records {n}": a for n, a in records(buf).items()})  # the same bytes: not recompressed
    sample = buf.sample(16)
    out.update({"indices": sample.indices, "weights": sample.weights})
    out.update({f"sampled {n}": a for n, a in sample.data.items()})
    return out


def assert_same_buffer(a: PrioritizedReplay | dict, b: PrioritizedReplay) -> None:
    """``a`` (or its :func:`snapshot`) and ``b`` hold the same (each is sampled once)."""
    want, got = a if isinstance(a, dict) else snapshot(a), snapshot(b)
    assert want.keys() == got.keys()
    for name, array in want.items():
        np.testing.assert_array_equal(got[name], array, err_msg=name)


@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_save_load_round_trip_keeps_records_as_they_are(transitions, tmp_path, codec):
    buf = filled(transitions, **shared(tmp_path, codec, byte_budget=1 << 20))
    buf.save(tmp_path / "buf.replay")
    header, arrays = checkpoint.read(tmp_path / "buf.replay")
    assert header["version"] == 2 and header["compressed"]["fields"]["obs"] == {
        "codec": codec,
        "level": 1,
        "frames": False,
    }
    assert header["compressed"]["byte_budget"] == 1 << 20
    assert "storage/obs" not in arrays and "compressed/obs/records" in arrays and "storage/action" in arrays
    raw_bytes = 32 * 2 * 4 * 84 * 84
    assert len(arrays["compressed/obs/records"]) + len(arrays["compressed/next_obs/records"]) < raw_bytes / 10
    loaded = PrioritizedReplay.load(tmp_path / "buf.replay", **shared(tmp_path, codec, byte_budget=1 << 20))
    copies = [
        loaded,
        pickle.loads(pickle.dumps(buf)),
        PrioritizedReplay.from_state_dict(buf.state_dict(), **buf._placement),
    ]
    want = snapshot(buf)
    for copy in copies:
        assert copy.storage.path != buf.storage.path
        assert_same_buffer(want, copy)
        copy.close()
    buf.close()


def test_a_host_file_into_a_shared_buffer_and_back(transitions, tmp_path):
    """Host LZ4 rows -> shared LZ4 (adopted as they are) -> host again: the same records throughout;
    host Zstd frames -> shared LZ4 (converted): the same rows."""
    host = filled(transitions, storage_options={"codec": "lz4"})
    host.save(tmp_path / "host.replay")
    into_shared = PrioritizedReplay.load(tmp_path / "host.replay", **shared(tmp_path, "lz4"))
    assert_same_buffer(host, into_shared)
    into_shared.save(tmp_path / "shared.replay")
    back = PrioritizedReplay.load(tmp_path / "shared.replay")  # no placement: host, compressed as saved
    assert back.storage.compressed.codecs == host.storage.compressed.codecs
    assert_same_buffer(host, back)
    into_shared.close()
    frames = filled(transitions, storage_options={"codec": "zstd", "frames": True})
    frames.save(tmp_path / "frames.replay")
    converted = PrioritizedReplay.load(tmp_path / "frames.replay", **shared(tmp_path, "lz4"))
    want, got = frames.storage.export_rows(32), converted.storage.gather(np.arange(32))
    for name in SCHEMA:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_array_equal(converted.tree.leaves(), frames.tree.leaves())
    converted.close()


@pytest.mark.parametrize("storage", ["shared", "disk"])
def test_a_conversion_never_holds_all_the_rows_decompressed(transitions, tmp_path, storage):
    """Loading records into another codec decompresses them a chunk at a time: the load's peak stays well
    below the rows' raw bytes (a million Atari rows would be 56 GB)."""
    cap = 1200
    buf = PrioritizedReplay(cap, SCHEMA, seed=5, storage_options={"codec": "zstd"})
    n = len(transitions["action"])
    for lo in range(0, cap, n):
        buf.add({k: v[: min(n, cap - lo)] for k, v in transitions.items()})
    buf.save(tmp_path / "buf.replay")
    raw = cap * 2 * int(np.prod(SCHEMA["obs"][0]))
    where = {"dir": str(tmp_path)} if storage == "shared" else {"path": str(tmp_path / "disk")}
    placement = {"storage": storage, "storage_options": {"codec": "lz4", **where}}
    tracemalloc.start()
    loaded = PrioritizedReplay.load(tmp_path / "buf.replay", **placement)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # What a load may hold besides a chunk of rows: the records' check scratch (a fixed size).
    assert peak < CHECK_BYTES + raw / 4, f"the load peaked at {peak} bytes, the rows take {raw} raw"
    got, want = loaded.storage.gather(np.arange(cap)), buf.storage.export_rows(cap)
    for name in SCHEMA:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    loaded.close()


def test_a_version_1_file_loads_into_a_shared_buffer(tmp_path):
    path = tmp_path / "v1.replay"
    path.write_bytes(gzip.decompress(V1_FILE.read_bytes()))
    buf = PrioritizedReplay.load(path, **shared(tmp_path, "zstd"))
    stacked = stacks(np.load(TEST_DATA)["Pong/frames"], np.load(TEST_DATA)["Pong/starts"])
    rows = [8, 9, 10, 3, 4, 5, 6, 7]  # slot -> row added: 11 rows into 8 slots
    assert (buf._pos, len(buf)) == (3, 8)
    np.testing.assert_array_equal(buf.storage.gather(np.arange(8))["next_obs"], stacked[np.add(rows, 1)])
    buf.close()


def test_evicted_rows_are_saved_without_records_and_never_drawn(transitions, tmp_path):
    """A log holding 20 to 32 rows of 32: the rows it lost are saved empty with priority 0, wherever loaded."""
    per_row = 2 * (16 + max(len(r) for r in _records_of(transitions["obs"][:61])))
    buf = filled(transitions, **shared(tmp_path, "lz4", byte_budget=20 * per_row))
    state = buf.state_dict()
    offsets = state["compressed"]["arrays"]["obs/offsets"]
    lost = np.flatnonzero(np.diff(offsets) == 0)
    assert 1 <= len(lost) <= 32 - 20  # the oldest rows' records were overwritten
    np.testing.assert_array_equal(state["priorities"][lost], 0)
    np.testing.assert_array_equal(buf.priorities.leaves()[lost], 0)  # out of the live buffer's draw too
    kept = np.setdiff1d(np.arange(32), lost)
    for placement in (shared(tmp_path, "lz4", byte_budget=1 << 20), {}):
        other = PrioritizedReplay.from_state_dict(state, **placement)
        np.testing.assert_array_equal(other.tree.leaves(), buf.tree.leaves())
        for _ in range(5):
            assert np.isin(other.sample(32).indices, kept).all()
        rows = other.storage.gather(kept)
        ids = rows["action"]
        np.testing.assert_array_equal(rows["obs"], transitions["obs"][ids])
        np.testing.assert_array_equal(rows["next_obs"], transitions["next_obs"][ids])
        if placement:
            assert not other.storage.read_intact(lost)[1].any()  # restored unserved, as evicted
            other.close()
    buf.close()


def _records_of(rows: np.ndarray) -> list[bytes]:
    from hetero_replay._native import compress_rows

    return compress_rows(rows.reshape(len(rows), -1), "lz4", 1)


def damaged_copy(src: Path, dst: Path) -> Path:
    """``src`` with one byte of a record of ``obs`` flipped (a sound ZIP: only the record is wrong)."""
    header, arrays = checkpoint.read(src)
    data = arrays["compressed/obs/records"].copy()
    data[len(data) // 2] ^= 0x10
    arrays["compressed/obs/records"] = data
    checkpoint.write(dst, {k: v for k, v in header.items() if k not in ("format", "version", "arrays")}, arrays)
    return dst


def test_a_damaged_record_is_refused_and_the_target_unchanged(transitions, tmp_path):
    buf = filled(transitions, **shared(tmp_path, "zstd"))
    buf.save(tmp_path / "buf.replay")
    bad = damaged_copy(tmp_path / "buf.replay", tmp_path / "bad.replay")
    for placement in (shared(tmp_path, "zstd"), shared(tmp_path, "lz4"), {}):  # adopted, converted, host
        with pytest.raises(ReplayFileError, match=r"field 'obs'.* damaged"):
            PrioritizedReplay.load(bad, **placement)
    target = filled(transitions, **shared(tmp_path, "zstd"))
    target.add({k: v[:3] for k, v in transitions.items()})
    before = target.state_dict()
    state = buf.state_dict()
    damaged = state["compressed"]["arrays"]["obs/records"].copy()
    damaged[100] ^= 0x10
    state["compressed"]["arrays"]["obs/records"] = damaged
    with pytest.raises(DamagedRecordError, match=r"field 'obs'"):
        target.load_state_dict(state)
    after = target.state_dict()
    assert (after["position"], after["size"], after["rng_state"]) == (
        before["position"],
        before["size"],
        before["rng_state"],
    )
    np.testing.assert_array_equal(after["priorities"], before["priorities"])
    for name, array in before["compressed"]["arrays"].items():
        np.testing.assert_array_equal(after["compressed"]["arrays"][name], array, err_msg=name)
    assert sorted(tmp_path.glob("*.ring")) == sorted({Path(buf.storage.path), Path(target.storage.path)})
    target.close()
    buf.close()


def test_rows_a_writer_is_rewriting_are_saved_without_records(transitions, tmp_path):
    """A writer holds three slots mid-row while the buffer is saved: those rows are saved empty, priority 0."""
    buf = filled(transitions, **shared(tmp_path, "lz4"))
    control = buf.storage.control
    first = control.reserve(3)
    taken, _ = control.acquire(first, 3, control.register(os.getpid()))
    assert taken.all()
    busy = (first + np.arange(3)) % 32
    buf.save(tmp_path / "buf.replay")
    header, arrays = checkpoint.read(tmp_path / "buf.replay")
    np.testing.assert_array_equal(np.flatnonzero(np.diff(arrays["compressed/obs/offsets"]) == 0), np.sort(busy))
    np.testing.assert_array_equal(arrays["priorities"][busy], 0)
    loaded = PrioritizedReplay.load(tmp_path / "buf.replay", **shared(tmp_path, "lz4"))
    for _ in range(5):
        s = loaded.sample(32)
        assert not np.isin(s.indices, busy).any()
        np.testing.assert_array_equal(s.data["obs"], transitions["obs"][s.data["action"]])
    loaded.close()
    buf.close()
