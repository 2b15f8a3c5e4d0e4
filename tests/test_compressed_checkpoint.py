"""Checkpoints of compressed buffers: records saved, restored and pickled as they are, converted where
the settings differ, damaged ones refused; files of format version 1 (rows decompressed) still load.

Frames are real (Pong and Breakout through ale-py, ``tests/data/atari_frames.npz``).
"""

from __future__ import annotations

import gzip
import json
import pickle
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, ReplayFileError
from hetero_replay.storage import checkpoint
from hetero_replay.storage.codec import DamagedRecordError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import SCHEMA, TEST_DATA, sample_transitions, stacks  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
#: A buffer saved by the code of commit 5945b37 (format version 1: compressed fields written
#: decompressed), gzipped: capacity 8, codec zstd with frames, Pong rows 0-10 added 5 + 6, seed 7.
V1_FILE = DATA / "replay_v1_compressed.replay.gz"
SETTINGS = {
    "lz4 rows": {"codec": "lz4"},
    "zstd rows": {"codec": "zstd"},
    "lz4 frames": {"codec": "lz4", "frames": True},
    "zstd frames": {"codec": "zstd", "frames": True},
}


@pytest.fixture(scope="module")
def transitions() -> dict[str, np.ndarray]:
    """Pong's and Breakout's transitions back to back; ``action`` is the row's id."""
    return sample_transitions()


def filled(transitions: dict[str, np.ndarray], options: dict | None, capacity: int = 64) -> PrioritizedReplay:
    """A buffer that wrapped (190 rows in uneven batches), with updated priorities and a used generator."""
    buf = PrioritizedReplay(capacity, SCHEMA, seed=5, storage_options=options)
    lo = 0
    for size in (7, 30, 1, 44, 13, 50, 45):
        buf.add({k: v[lo : lo + size] for k, v in transitions.items()})
        lo += size
    batch = buf.sample(32)
    buf.update_priorities(batch.indices, np.linspace(0.1, 4.0, 32))
    return buf


def assert_same_buffer(a: PrioritizedReplay, b: PrioritizedReplay) -> None:
    """Rows bit for bit, priorities, position, size, generator; then the same samples."""
    assert (a._pos, len(a), a.max_priority) == (b._pos, len(b), b.max_priority)
    assert a.rng.bit_generator.state == b.rng.bit_generator.state
    np.testing.assert_array_equal(a.tree.leaves(), b.tree.leaves())
    want, got = a.storage.export_rows(len(a)), b.storage.export_rows(len(b))
    for name in SCHEMA:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    sa, sb = a.sample(16), b.sample(16)
    np.testing.assert_array_equal(sa.indices, sb.indices)
    np.testing.assert_array_equal(sa.weights, sb.weights)


def held_records(buf: PrioritizedReplay) -> dict:
    """The compressed records a buffer holds: per field, per slot; the pool's frames by content."""
    compressed = buf.storage.compressed
    out = {name: list(records) for name, records in compressed._records.items()}
    if compressed.pool is not None:
        out["frames"] = sorted(r for r in compressed.pool._records if r is not None)
    return out


@pytest.mark.parametrize("options", SETTINGS.values(), ids=SETTINGS)
def test_save_load_round_trip_keeps_records_as_they_are(transitions, tmp_path, options):
    buf = filled(transitions, options)
    buf.save(tmp_path / "buf.replay")
    loaded = PrioritizedReplay.load(tmp_path / "buf.replay", storage_options=options)
    assert held_records(loaded) == held_records(buf)  # the same bytes: not recompressed
    assert loaded.storage.compressed.bytes_used == buf.storage.compressed.bytes_used
    assert_same_buffer(buf, loaded)
    header, arrays = checkpoint.read(tmp_path / "buf.replay")
    assert header["version"] == 2 and header["compressed"]["fields"]["obs"]["codec"] == options["codec"]
    assert "storage/obs" not in arrays and "storage/action" in arrays


@pytest.mark.parametrize("options", [SETTINGS["lz4 rows"], SETTINGS["zstd frames"]], ids=["rows", "frames"])
def test_state_dict_and_pickle_carry_the_records(transitions, options):
    buf = filled(transitions, options)
    state = buf.state_dict()
    assert set(state["storage"]) == {"action", "reward", "done"}  # the image fields travel as records
    assert state["compressed"]["settings"]["fields"]["next_obs"]["frames"] == bool(options.get("frames"))
    other = PrioritizedReplay(64, SCHEMA, storage_options=options)
    other.load_state_dict(state)
    assert held_records(other) == held_records(buf)
    copy = pickle.loads(pickle.dumps(buf))
    assert held_records(copy) == held_records(buf)
    assert_same_buffer(copy, PrioritizedReplay.from_state_dict(state, **buf._placement))
    assert_same_buffer(buf, other)


def test_file_size_is_about_the_memory_the_buffer_takes(transitions, tmp_path):
    buf = filled(transitions, SETTINGS["zstd frames"], capacity=190)
    buf.save(tmp_path / "buf.replay")
    size = (tmp_path / "buf.replay").stat().st_size
    compressed = buf.storage.compressed
    # In memory: the records, each row's frame references (int64) and the other fields' rows.
    memory = compressed.bytes_used + 190 * (2 * 4 * 8 + buf.storage._records.shape[1])
    raw = 190 * (2 * 4 * 84 * 84 + 16)
    assert memory * 0.8 < size < memory * 1.3 + 20_000  # + the ZIP's and .npy headers
    assert raw / size > 15


@pytest.mark.parametrize(
    ("saved", "target"),
    [
        ("zstd frames", "lz4 rows"),
        ("lz4 rows", "zstd frames"),
        ("zstd rows", "lz4 rows"),
        ("lz4 frames", "zstd frames"),
        ("zstd frames", None),
        (None, "lz4 frames"),
    ],
)
def test_load_converts_between_settings(transitions, tmp_path, saved, target):
    """Other codecs, raw <-> compressed: the records are decompressed (and recompressed), rows unchanged."""
    buf = filled(transitions, SETTINGS.get(saved))
    buf.save(tmp_path / "buf.replay")
    loaded = PrioritizedReplay.load(tmp_path / "buf.replay", storage_options=SETTINGS.get(target))
    assert_same_buffer(buf, loaded)
    if target is not None:
        assert loaded.storage.compressed.settings()["fields"]["obs"]["codec"] == SETTINGS[target]["codec"]
    level = PrioritizedReplay.load(tmp_path / "buf.replay", storage_options={"codec": ("zstd", 5), "frames": True})
    assert level.storage.compressed.pool.codec == ("zstd", 5)
    assert_same_buffer(filled(transitions, SETTINGS.get(saved)), level)  # the same buffer, built again


def test_load_keeps_the_saved_settings_unless_told_otherwise(transitions, tmp_path):
    options = {"codec": {"obs": ("zstd", 2), "next_obs": ("zstd", 2)}, "frames": True, "byte_budget": 10**7}
    buf = filled(transitions, options)
    buf.save(tmp_path / "buf.replay")
    as_saved = PrioritizedReplay.load(tmp_path / "buf.replay")  # no storage_options: compressed as it was
    assert as_saved.storage.compressed.settings() == buf.storage.compressed.settings()
    assert held_records(as_saved) == held_records(buf)
    assert pickle.loads(pickle.dumps(as_saved)).storage.compressed.settings() == buf.storage.compressed.settings()
    raw = PrioritizedReplay.load(tmp_path / "buf.replay", storage_options=None)  # asked for raw rows
    assert raw.storage.compressed is None
    assert_same_buffer(raw, as_saved)
    copy = PrioritizedReplay.from_state_dict(buf.state_dict())
    assert held_records(copy) == held_records(buf)
    into_raw = PrioritizedReplay(64, SCHEMA)
    into_raw.load_state_dict(buf.state_dict())  # this buffer's storage stays what it is
    assert into_raw.storage.compressed is None
    assert_same_buffer(into_raw, copy)


def test_a_version_1_file_loads(tmp_path):
    """A file written by the previous format (compressed fields saved as decompressed rows)."""
    path = tmp_path / "v1.replay"
    path.write_bytes(gzip.decompress(V1_FILE.read_bytes()))
    header, arrays = checkpoint.read(path)
    assert header["version"] == 1 and "compressed" not in header
    stacked = stacks(np.load(TEST_DATA)["Pong/frames"], np.load(TEST_DATA)["Pong/starts"])
    rows = [8, 9, 10, 3, 4, 5, 6, 7]  # slot -> row added: 11 rows into 8 slots
    for options in (None, SETTINGS["zstd frames"], SETTINGS["lz4 rows"]):
        buf = PrioritizedReplay.load(path, storage_options=options)
        assert (buf._pos, len(buf)) == (3, 8)
        got = buf.storage.export_rows(8)
        np.testing.assert_array_equal(got["obs"], stacked[rows])
        np.testing.assert_array_equal(got["next_obs"], stacked[np.add(rows, 1)])
        np.testing.assert_array_equal(buf.tree.leaves(), arrays["priorities"])
        buf.save(tmp_path / "again.replay")
        assert_same_buffer(buf, PrioritizedReplay.load(tmp_path / "again.replay", storage_options=options))
    raw = PrioritizedReplay(8, SCHEMA)
    raw.add({k: np.zeros((1, *s), d) for k, (s, d) in SCHEMA.items()})
    raw.save(tmp_path / "raw.replay")
    assert checkpoint.read(tmp_path / "raw.replay")[0]["version"] == 1  # no compressed fields: still version 1


def rewritten(src: Path, dst: Path, change) -> Path:
    """``src`` read, its header and arrays changed by ``change(header, arrays)``, written (a sound ZIP) to ``dst``."""
    header, arrays = checkpoint.read(src)
    header = {k: v for k, v in header.items() if k not in ("format", "version", "arrays")}
    arrays = {k: v.copy() for k, v in arrays.items()}
    change(header, arrays)
    checkpoint.write(dst, header, arrays)
    return dst


def flip(name: str, at: float = 0.5):
    def change(header, arrays):
        arrays[name][int(len(arrays[name]) * at)] ^= 0x10

    return change


def shift_offset(name: str, by: int):
    def change(header, arrays):
        arrays[name][3] += by

    return change


def set_reference(name: str, value: int):
    def change(header, arrays):
        arrays[name][2, 1] = value

    return change


def extra_frame(header, arrays):
    records, offsets = arrays["compressed/frame_records"], arrays["compressed/frame_offsets"]
    first = records[offsets[0] : offsets[1]]
    arrays["compressed/frame_records"] = np.concatenate([records, first])
    arrays["compressed/frame_offsets"] = np.append(offsets, offsets[-1] + len(first))


def header_setting(key: str, value):
    def change(header, arrays):
        header["compressed"]["fields"]["obs"][key] = value

    return change


@pytest.mark.parametrize(
    ("options", "change", "match"),
    [
        (
            "lz4 rows",
            flip("compressed/obs/records"),
            r"field 'obs': the compressed records of rows \[\d+\] are damaged",
        ),
        ("zstd frames", flip("compressed/frame_records"), r"frame_records: frames \[\d+\] are damaged \(held by field"),
        ("lz4 rows", shift_offset("compressed/next_obs/offsets", -(10**6)), r"field 'next_obs' offsets: decrease at"),
        ("lz4 rows", shift_offset("compressed/obs/offsets", 10**9), r"field 'obs' offsets: decrease at record 3"),
        ("zstd rows", lambda h, a: a["compressed/obs/offsets"].__setitem__(-1, 7), r"field 'obs' offsets: must run"),
        ("zstd frames", set_reference("compressed/next_obs/frames", 10**6), r"field 'next_obs': frame references"),
        ("zstd frames", set_reference("compressed/obs/frames", -2), r"field 'obs': frame references must be in \[-1"),
        ("zstd frames", extra_frame, r"frame_records: frames \[\d+\] are empty or referenced by no row"),
        ("zstd frames", header_setting("codec", "brotli"), r"codec of field 'obs': unknown codec 'brotli'"),
        ("lz4 rows", header_setting("level", 12), r"codec of field 'obs': level must be an integer in \[0, 9\]"),
        ("lz4 rows", header_setting("frames", "yes"), r"compressed settings of field 'obs'"),
        ("lz4 rows", lambda h, a: a.pop("compressed/obs/offsets"), r"arrays .* the schema needs"),
    ],
)
def test_damaged_files_are_refused_naming_the_field(transitions, tmp_path, options, change, match):
    buf = filled(transitions, SETTINGS[options])
    buf.save(tmp_path / "buf.replay")
    bad = rewritten(tmp_path / "buf.replay", tmp_path / "bad.replay", change)
    for target in (SETTINGS[options], None):  # adopted as they are, or converted: checked either way
        with pytest.raises(ReplayFileError, match=match):
            PrioritizedReplay.load(bad, storage_options=target)


def test_a_damaged_state_leaves_the_buffer_unchanged(transitions):
    options = SETTINGS["zstd frames"]
    buf = filled(transitions, options)
    state = buf.state_dict()
    records = state["compressed"]["arrays"]["frame_records"].copy()
    records[len(records) // 2] ^= 0x01
    state["compressed"]["arrays"]["frame_records"] = records
    target = filled(transitions, options)
    target.add({k: v[:3] for k, v in transitions.items()})
    before = (target.state_dict(), held_records(target))
    with pytest.raises(DamagedRecordError, match=r"frame_records: frames \[\d+\] are damaged"):
        target.load_state_dict(state)
    after = (target.state_dict(), held_records(target))
    assert after[1] == before[1]
    assert (after[0]["position"], after[0]["rng_state"]) == (before[0]["position"], before[0]["rng_state"])
    np.testing.assert_array_equal(after[0]["priorities"], before[0]["priorities"])


def test_a_flipped_byte_in_the_file_is_refused(transitions, tmp_path):
    """Bytes changed in the file itself: the ZIP's CRC-32 of the member refuses them before any record is read."""
    buf = filled(transitions, SETTINGS["zstd frames"])
    buf.save(tmp_path / "buf.replay")
    with zipfile.ZipFile(tmp_path / "buf.replay") as zf:
        info = zf.getinfo("arrays/compressed/frame_records.npy")
    blob = bytearray((tmp_path / "buf.replay").read_bytes())
    blob[info.header_offset + 30 + len(info.filename) + len(info.extra) + 200] ^= 0x04
    (tmp_path / "buf.replay").write_bytes(bytes(blob))
    with pytest.raises(ReplayFileError):
        PrioritizedReplay.load(tmp_path / "buf.replay", storage_options=SETTINGS["zstd frames"])


def test_the_header_records_every_setting(transitions, tmp_path):
    buf = PrioritizedReplay(
        16, SCHEMA, storage_options={"codec": {"obs": ("zstd", 3), "next_obs": "lz4"}, "byte_budget": 10**6}
    )
    buf.add({k: v[:5] for k, v in transitions.items()})
    buf.save(tmp_path / "buf.replay")
    with zipfile.ZipFile(tmp_path / "buf.replay") as zf:
        header = json.loads(zf.read("header.json"))
    assert header["compressed"] == {
        "fields": {
            "obs": {"codec": "zstd", "level": 3, "frames": False},
            "next_obs": {"codec": "lz4", "level": 1, "frames": False},
        },
        "byte_budget": 10**6,
    }


def test_a_budget_the_records_do_not_fit_is_refused(transitions, tmp_path):
    buf = filled(transitions, SETTINGS["lz4 rows"])
    buf.save(tmp_path / "buf.replay")
    small = {**SETTINGS["lz4 rows"], "byte_budget": buf.storage.compressed.bytes_used // 2}
    with pytest.raises(ReplayFileError, match="byte_budget: the records take"):
        PrioritizedReplay.load(tmp_path / "buf.replay", storage_options=small)


def test_sb3_save_and_load_replay_buffer_with_compress(tmp_path):
    pytest.importorskip("stable_baselines3")
    pytest.importorskip("ale_py")
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    from hetero_replay.adapters.sb3 import PERDQN

    env = VecFrameStack(make_atari_env("ALE/Pong-v5", n_envs=2, seed=0), 4)
    kwargs = dict(buffer_size=64, learning_starts=10**6, replay_buffer_kwargs=dict(compress="zstd"), device="cpu")
    model = PERDQN("CnnPolicy", env, seed=0, **kwargs)
    model.learn(96)  # 96 rows into 64: wrapped
    model.save_replay_buffer(tmp_path / "buffer.pkl")
    other = PERDQN("CnnPolicy", env, seed=1, **kwargs)
    other.load_replay_buffer(tmp_path / "buffer.pkl")
    a, b = model.replay_buffer._replay, other.replay_buffer._replay
    assert held_records(b) == held_records(a)
    assert_same_buffer(a, b)
    env.close()


def refused_or_intact(path: Path, original: PrioritizedReplay) -> str:
    """Loading ``path`` raises ``ReplayFileError`` (nothing else) or gives back ``original``'s rows."""
    try:
        loaded = PrioritizedReplay.load(path)
    except ReplayFileError:
        return "refused"
    want, got = original.storage.export_rows(len(original)), loaded.storage.export_rows(len(loaded))
    for name in SCHEMA:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    return "intact"


@pytest.fixture
def small_saved(transitions, tmp_path) -> tuple[Path, PrioritizedReplay]:
    buf = PrioritizedReplay(8, SCHEMA, seed=1, storage_options={"codec": "zstd", "frames": True, "byte_budget": 10**6})
    buf.add({k: v[:8] for k, v in transitions.items()})
    buf.save(tmp_path / "small.replay")
    return tmp_path / "small.replay", buf


HOSTILE = [None, True, -1, 0, 10, 2**70, 1.5, "zstd", "lz4", "", [], {}, ["zstd", 1], {"codec": "lz4"}]


def test_hostile_codec_settings_are_refused_or_harmless(small_saved, tmp_path):
    path, original = small_saved
    settings = checkpoint.read(path)[0]["compressed"]
    places = [("fields",), ("byte_budget",), ("fields", "obs")]
    places += [("fields", f, k) for f in settings["fields"] for k in ("codec", "level", "frames")]
    seen = {"refused": 0, "intact": 0}
    for place in places:
        for value in [*HOSTILE, KeyError]:  # KeyError: the key removed

            def change(header, arrays, place=place, value=value):
                *up, last = place
                section = header["compressed"]
                for key in up:
                    section = section[key]
                if value is KeyError:
                    del section[last]
                else:
                    section[last] = value

            seen[refused_or_intact(rewritten(path, tmp_path / "bad.replay", change), original)] += 1
    assert seen["refused"] > seen["intact"] > 0  # e.g. another level, or no byte budget, loads the same rows


def test_flipped_bytes_anywhere_are_refused_or_harmless(small_saved, tmp_path):
    path, original = small_saved
    good = path.read_bytes()
    rng = np.random.default_rng(3)
    seen = {"refused": 0, "intact": 0}
    for pos in rng.choice(len(good), 300, replace=False).tolist():
        bad = bytearray(good)
        bad[pos] ^= 1 << int(rng.integers(8))
        (tmp_path / "bad.replay").write_bytes(bytes(bad))
        seen[refused_or_intact(tmp_path / "bad.replay", original)] += 1
    assert seen["refused"] > 150
