"""save/load, state_dict and pickle round trips; corrupt files refused; atomic saves."""

from __future__ import annotations

import gc
import json
import pickle
import zipfile

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, ReplayFileError
from hetero_replay.storage import checkpoint
from tests.conftest import SCHEMA, make_batch
from tests.test_replay import assert_unchanged, snapshot


@pytest.fixture
def buf(backend: str) -> PrioritizedReplay:
    b = PrioritizedReplay(64, SCHEMA, alpha=0.7, beta=0.5, tree=backend, seed=9)
    b.add(make_batch(50))
    s = b.sample(16)
    b.update_priorities(s.indices, np.linspace(0.1, 3.0, 16))
    return b


def assert_continues_identically(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    for _ in range(3):
        sa, sb = a.sample(8), b.sample(8)
        np.testing.assert_array_equal(sa.indices, sb.indices)
        np.testing.assert_array_equal(sa.weights, sb.weights)
        for name in sa.data:
            np.testing.assert_array_equal(sa.data[name], sb.data[name])
        a.update_priorities(sa.indices, np.ones(8))
        b.update_priorities(sb.indices, np.ones(8))
    a.add(make_batch(10, 100))
    b.add(make_batch(10, 100))
    np.testing.assert_array_equal(a.tree.leaves(), b.tree.leaves())


def test_save_load_round_trip(buf, tmp_path, backend):
    path = tmp_path / "replay.hrz"
    buf.save(path)
    loaded = PrioritizedReplay.load(path, tree=backend)
    assert (loaded.alpha, loaded.beta, loaded.eps, len(loaded)) == (0.7, 0.5, buf.eps, 50)
    assert loaded.max_priority == buf.max_priority
    assert_continues_identically(buf, loaded)


def test_state_dict_round_trip(buf, backend):
    other = PrioritizedReplay(64, SCHEMA, tree=backend)
    other.load_state_dict(buf.state_dict())
    assert_continues_identically(buf, other)


def test_load_state_dict_refuses_other_shape(buf, backend):
    other = PrioritizedReplay(32, SCHEMA, tree=backend)
    before = snapshot(other)
    with pytest.raises(ValueError, match="capacity 64"):
        other.load_state_dict(buf.state_dict())
    assert_unchanged(other, before)


def test_pickle_round_trip(buf):
    assert_continues_identically(buf, pickle.loads(pickle.dumps(buf)))


def test_full_buffer_round_trip(backend, tmp_path):
    b = PrioritizedReplay(16, SCHEMA, tree=backend, seed=1)
    b.add(make_batch(12))
    b.add(make_batch(9, 12))  # wrapped: position 5, size 16
    b.save(tmp_path / "full")
    assert_continues_identically(b, PrioritizedReplay.load(tmp_path / "full", tree=backend))


def test_truncated_file_refused(buf, tmp_path):
    path = tmp_path / "replay.hrz"
    buf.save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ReplayFileError, match="truncated or corrupt"):
        PrioritizedReplay.load(path)


def test_corrupted_bytes_refused(buf, tmp_path):
    path = tmp_path / "replay.hrz"
    buf.save(path)
    data = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo("arrays/storage/obs.npy")
    data[info.header_offset + 200] ^= 0xFF  # inside the array's bytes
    path.write_bytes(bytes(data))
    with pytest.raises(ReplayFileError):
        PrioritizedReplay.load(path)


def _rewrite_header(path, change):
    with zipfile.ZipFile(path) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    header = json.loads(members["header.json"])
    change(header)
    members["header.json"] = json.dumps(header).encode()
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in members.items():
            zf.writestr(n, d)


@pytest.mark.parametrize(
    "change, match",
    [
        (lambda h: h.update(version=99), "format version 99"),
        (lambda h: h.update(format="other"), "not a hetero-replay file"),
        (lambda h: h["arrays"]["priorities"].update(shape=[7]), "the header says"),
        (lambda h: h.update(size=51), "inconsistent"),
        (lambda h: h["config"].pop("alpha"), "inconsistent"),
    ],
)
def test_inconsistent_header_refused(buf, tmp_path, change, match):
    path = tmp_path / "replay.hrz"
    buf.save(path)
    _rewrite_header(path, change)
    with pytest.raises(ReplayFileError, match=match):
        PrioritizedReplay.load(path)


def test_not_a_replay_file(tmp_path):
    path = tmp_path / "junk"
    path.write_bytes(b"definitely not a zip file")
    with pytest.raises(ReplayFileError):
        PrioritizedReplay.load(path)


def test_crash_mid_save_keeps_previous_file(buf, tmp_path, monkeypatch):
    path = tmp_path / "replay.hrz"
    buf.save(path)
    good = path.read_bytes()
    buf.add(make_batch(5, 500))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    # NumPy's writer is patched for the whole process: buffers earlier tests left to the garbage collector
    # must write their last durable points now, not while it raises.
    gc.collect()
    monkeypatch.setattr(checkpoint.np.lib.format, "write_array", crash)
    with pytest.raises(OSError, match="disk full"):
        buf.save(path)
    assert path.read_bytes() == good
    assert [p.name for p in tmp_path.iterdir()] == ["replay.hrz"]  # no temp file left
