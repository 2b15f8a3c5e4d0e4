"""Field codecs of the host storage: compressed rows come back bit for bit, bad input changes nothing.

Frames are real (Pong and Breakout through ale-py, ``tests/data/atari_frames.npz``, written by
``benchmarks/atari_frames.py``), stacked 4 by 4 as gymnasium's ``FrameStackObservation`` does.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay._native import compress_rows, crc32c, decompress_fields, decompress_rows
from hetero_replay.storage import HostStorage, make_storage
from hetero_replay.storage.codec import (
    ByteBudgetError,
    Codec,
    DamagedRecordError,
    field_codecs,
)
from hetero_replay.storage.schema import Schema

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import SCHEMA, sample_transitions  # noqa: E402


@pytest.fixture(scope="module")
def transitions() -> dict[str, np.ndarray]:
    """Pong's and Breakout's transitions back to back; ``action`` is the row's id."""
    return sample_transitions()


def rows(t: dict[str, np.ndarray], lo: int, hi: int) -> dict[str, np.ndarray]:
    return {k: v[lo:hi] for k, v in t.items()}


@pytest.mark.parametrize("codec", ["lz4", "zstd", ("zstd", 5), {"obs": ("lz4", 1), "next_obs": "zstd"}])
def test_rows_come_back_bit_for_bit_across_wrap_around(transitions, codec):
    capacity = 50  # 190 rows written in uneven batches: the ring wraps several times, batches straddle its end
    raw = PrioritizedReplay(capacity, SCHEMA, seed=3)
    packed = PrioritizedReplay(capacity, SCHEMA, seed=3, storage_options={"codec": codec})
    lo = 0
    for size in [7, 30, 1, 44, 13, 50, 45]:
        for buf in (raw, packed):
            buf.add(rows(transitions, lo, lo + size))
        lo += size
    want, got = raw.sample(64), packed.sample(64)
    np.testing.assert_array_equal(want.indices, got.indices)
    for name in SCHEMA:
        np.testing.assert_array_equal(got.data[name], want.data[name], err_msg=name)
    assert packed.storage.compressed.bytes_used < capacity * 2 * 4 * 84 * 84 / 10  # > 10x smaller on these games
    exported = packed.storage.export_rows(capacity)
    for name, arr in raw.storage.export_rows(capacity).items():
        np.testing.assert_array_equal(exported[name], arr)


def test_partial_writes_and_gather_of_some_fields(transitions):
    storage = HostStorage(8, SCHEMA, codec="lz4")
    _, arrays = storage.validate(rows(transitions, 0, 8))
    storage.write(0, arrays)
    storage.write(6, {"next_obs": transitions["obs"][:4], "reward": np.ones(4, np.float32)})  # wraps to 0, 1
    got = storage.gather(np.array([7, 0, 3]), fields=["next_obs", "reward"])
    assert list(got) == ["next_obs", "reward"]
    want = np.stack([transitions["obs"][1], transitions["obs"][2], transitions["next_obs"][3]])
    np.testing.assert_array_equal(got["next_obs"], want)
    np.testing.assert_array_equal(got["reward"], [1, 1, transitions["reward"][3]])
    np.testing.assert_array_equal(storage.gather(np.array([3]))["obs"], transitions["obs"][[3]])


def test_default_codec_goes_to_image_fields_only():
    schema = Schema({**SCHEMA, "pixels_f": ((84, 84), "float32"), "vector": ((16,), "uint8")})
    assert field_codecs(schema, "zstd") == {"obs": Codec("zstd", 1), "next_obs": Codec("zstd", 1)}
    assert field_codecs(schema, ("lz4", 3)) == {"obs": Codec("lz4", 3), "next_obs": Codec("lz4", 3)}
    assert field_codecs(schema, {"vector": "lz4", "obs": None}) == {"vector": Codec("lz4", 1)}
    assert field_codecs(schema, None) == {}
    assert HostStorage(4, SCHEMA).compressed is None


@pytest.mark.parametrize(
    ("codec", "error", "match"),
    [
        ("snappy", ValueError, r"codec: unknown codec 'snappy'; expected one of \['lz4', 'zstd'\]"),
        (("zstd", 12), ValueError, r"codec: level must be an integer in \[0, 9\], got 12"),
        (("zstd", 1.5), ValueError, r"level must be an integer"),
        ({"obs": "gzip"}, ValueError, r"codec of field 'obs': unknown codec 'gzip'"),
        ({"image": "lz4"}, ValueError, r"codec names fields not in the schema: \['image'\]"),
        (7, TypeError, r"codec must be None, a codec name, \(name, level\) or a mapping"),
    ],
)
def test_bad_codec_is_refused_naming_it(codec, error, match):
    with pytest.raises(error, match=match):
        make_storage("host", 4, SCHEMA, {"codec": codec})


def test_byte_budget_needs_a_codec_and_a_positive_size():
    with pytest.raises(ValueError, match="byte_budget bounds compressed records: it needs a codec="):
        make_storage("host", 4, SCHEMA, {"byte_budget": 1000})
    with pytest.raises(ValueError, match="byte_budget must be a positive integer or None, got 0"):
        make_storage("host", 4, SCHEMA, {"codec": "lz4", "byte_budget": 0})


def test_a_write_over_the_byte_budget_changes_nothing(transitions):
    probe = HostStorage(16, SCHEMA, codec="zstd")
    probe.write(0, probe.validate(rows(transitions, 100, 108))[1])
    budget = probe.compressed.bytes_used  # room for about 8 of these rows, not 16
    buf = PrioritizedReplay(16, SCHEMA, seed=0, storage_options={"codec": "zstd", "byte_budget": budget})
    buf.add(rows(transitions, 100, 104))
    used = buf.storage.compressed.bytes_used
    before = (len(buf), used, buf.leaves().copy(), buf.storage.gather(np.arange(4)))
    with pytest.raises(ByteBudgetError, match=rf"over the budget of {budget} bytes; nothing was written"):
        buf.add(rows(transitions, 104, 116))
    assert (len(buf), buf.storage.compressed.bytes_used) == before[:2]
    np.testing.assert_array_equal(buf.leaves(), before[2])
    after = buf.storage.gather(np.arange(4))
    for name in SCHEMA:
        np.testing.assert_array_equal(after[name], before[3][name])
    buf.add(rows(transitions, 104, 106))  # what fits is still taken
    assert len(buf) == 6


def test_a_row_larger_than_the_whole_budget_is_refused(transitions):
    buf = PrioritizedReplay(16, SCHEMA, storage_options={"codec": "lz4", "byte_budget": 100})
    with pytest.raises(ByteBudgetError, match=r"largest record \d+, 0 held now\), over the budget of 100 bytes"):
        buf.add(rows(transitions, 0, 1))
    assert len(buf) == 0 and buf.storage.compressed.bytes_used == 0


def test_rewritten_slots_give_their_bytes_back(transitions):
    storage = HostStorage(4, SCHEMA, codec="zstd", byte_budget=10**6)
    for lo in range(0, 40, 4):
        _, arrays = storage.validate(rows(transitions, lo, lo + 4))
        storage.write(0, arrays)
    _, last = storage.validate(rows(transitions, 36, 40))
    fresh = HostStorage(4, SCHEMA, codec="zstd")
    fresh.write(0, last)
    assert storage.compressed.bytes_used == fresh.compressed.bytes_used


def test_a_damaged_record_is_never_served(transitions):
    storage = HostStorage(8, SCHEMA, codec="zstd")
    storage.write(0, storage.validate(rows(transitions, 0, 8))[1])
    records = storage.compressed._records["obs"]
    rec = bytearray(records[5])
    rec[len(rec) // 2] ^= 0x10  # one bit in the chunk's payload: it may still decompress, the CRC says no
    records[5] = bytes(rec)
    with pytest.raises(DamagedRecordError, match=r"field 'obs': the compressed records of slots \[5\] are damaged"):
        storage.gather(np.array([1, 5, 5]))
    records[5] = records[5][:20]  # truncated
    with pytest.raises(DamagedRecordError, match=r"slots \[5\]"):
        storage.gather(np.array([5]))
    np.testing.assert_array_equal(storage.gather(np.array([4]))["obs"], transitions["obs"][[4]])


def crc32c_reference(data: bytes) -> int:
    """CRC-32C bit by bit (Castagnoli, reflected): its definition, to check the native computations against."""
    c = 0xFFFFFFFF
    for byte in data:
        c ^= byte
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF


def test_crc32c_instruction_and_tables_agree_with_the_definition():
    assert crc32c_reference(b"123456789") == 0xE3069283  # the standard check value
    data = np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8).tobytes()
    for size in [*range(20), 299, 300]:  # every tail length the 8-byte steps leave
        expected = crc32c_reference(data[:size])
        assert crc32c(data[:size]) == expected and crc32c(data[:size], tables=True) == expected


def test_record_format_is_crc32c_then_a_blosc2_chunk(transitions):
    frames = transitions["obs"][:3].reshape(3, -1)
    for codec in ("lz4", "zstd"):
        records = compress_rows(frames, codec, 1)
        for rec in records:
            assert int.from_bytes(rec[:4], "little") == crc32c_reference(rec[4:])
        out = np.empty_like(frames)
        assert decompress_rows(records, np.array([2, 0, 1]), out) == []
        np.testing.assert_array_equal(out, frames[[2, 0, 1]])


def test_repeated_indices_are_served_once_and_every_position_of_a_damaged_record_is_reported(transitions):
    flat = transitions["obs"].reshape(-1)
    for size in (1, 7, 9, 1003):  # the CRC takes 8 bytes a step: every tail length, and none
        rows = flat[: 5 * size].reshape(5, size)
        records = compress_rows(rows, "lz4", 1)
        assert all(int.from_bytes(rec[:4], "little") == crc32c(rec[4:]) for rec in records)
        records[3] = None  # a row never written
        rec = bytearray(records[2])
        rec[-1] ^= 0x01
        records[2] = bytes(rec)
        indices = np.array([2, 0, 2, -1, 3, 2, 0, 1, 4, 4])
        out = np.full((len(indices), size), 7, np.uint8)
        assert decompress_rows(records, indices, out) == [0, 2, 5]
        for i, index in enumerate(indices):
            if index in (0, 1, 4):
                np.testing.assert_array_equal(out[i], rows[index])
            elif index in (-1, 3):
                assert not out[i].any()


def test_records_of_a_row_size_do_not_depend_on_the_sizes_compressed_before(transitions):
    """A compression context keeps the block size it chose first: one per row size, or stacks pack ~2x larger
    once the thread has compressed frames (a frame pool's)."""
    stacks = transitions["obs"][:40].reshape(40, -1)
    frames = transitions["obs"][:40].reshape(-1, 84 * 84)
    for codec in ("lz4", "zstd"):
        first = [len(r) for r in compress_rows(stacks, codec, 1)]
        compress_rows(frames, codec, 1)
        assert [len(r) for r in compress_rows(stacks, codec, 1)] == first


def test_several_fields_decompress_in_one_call_and_report_damage_per_field(transitions):
    """``decompress_fields``: each source's rows at the same indices, field f's row i at f * n + i."""
    obs, nxt = transitions["obs"][:6].reshape(6, -1), transitions["next_obs"][:6].reshape(6, -1)
    sources = [compress_rows(obs, "lz4", 1), compress_rows(nxt, "zstd", 1)]
    damaged = bytearray(sources[1][4])
    damaged[-1] ^= 0x01
    sources[1][4] = bytes(damaged)
    sources[0][5] = None
    indices = np.array([4, 1, 5, 4, 0])
    out = np.empty((2 * len(indices), obs.shape[1]), np.uint8)
    assert decompress_fields(sources, indices, out) == [5, 8]  # next_obs of row 4, at positions 0 and 3
    np.testing.assert_array_equal(out[[0, 1, 3, 4]], obs[[4, 1, 4, 0]])
    assert not out[2].any()  # a record never written
    np.testing.assert_array_equal(out[[6, 7, 9]], nxt[[1, 5, 0]])
    with pytest.raises(ValueError, match="out must be"):
        decompress_fields(sources, indices, out[:5])
    with pytest.raises(IndexError, match="out of range"):
        decompress_fields(sources, np.array([6]), out[:2])


def test_compressed_fields_have_no_live_view_and_no_native_executor(transitions):
    buf = PrioritizedReplay(8, SCHEMA, storage_options={"codec": {"obs": "lz4"}})
    with pytest.raises(NotImplementedError, match=r"field 'obs' is compressed"):
        buf.view("obs")
    assert buf.view("next_obs").shape == (8, 4, 84, 84)
    assert buf.native_parts() is None


def test_state_dict_round_trip(transitions):
    buf = PrioritizedReplay(8, SCHEMA, seed=1, storage_options={"codec": "zstd"})
    buf.add(rows(transitions, 0, 5))
    buf.add(rows(transitions, 5, 11))  # wrapped: the state holds rows in slot order
    copy = PrioritizedReplay(8, SCHEMA, seed=1, storage_options={"codec": "zstd"})
    copy.load_state_dict(buf.state_dict())
    a, b = buf.sample(16), copy.sample(16)
    for name in SCHEMA:
        np.testing.assert_array_equal(a.data[name], b.data[name])


def test_the_relaxed_pipeline_serves_compressed_rows(transitions):
    from hetero_replay import RelaxedReplay

    buf = PrioritizedReplay(64, SCHEMA, seed=2, storage_options={"codec": "lz4", "frames": True})
    buf.add(rows(transitions, 0, 64))
    replay = RelaxedReplay(buf, staleness=1, prefetch=1)
    try:
        for _ in range(3):
            batch = replay.sample(16)
            np.testing.assert_array_equal(batch.data["obs"], transitions["obs"][batch.indices])
            np.testing.assert_array_equal(batch.data["next_obs"], transitions["next_obs"][batch.indices])
            replay.update_priorities(batch.indices, np.ones(16))
    finally:
        replay.close()
