"""Frame de-duplication (``frames=``): rows rebuilt from shared frames equal the written rows bit for bit.

Streams of real Atari stacks (``tests/data/atari_frames.npz``) with random episode boundaries, several
environments writing interleaved in random batch sizes, a ring wrapping many times, and some rows rewritten
field by field: after every write the whole storage is compared with a raw one, and the pool holds exactly the
frames live rows reference (nothing leaks, nothing is freed early).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay
from hetero_replay.storage import HostStorage
from hetero_replay.storage.codec import ByteBudgetError, DamagedRecordError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from atari_frames import TEST_DATA, stacks  # noqa: E402

SCHEMA = {
    "obs": ((4, 84, 84), "uint8"),
    "action": ((), "int64"),
    "next_obs": ((4, 84, 84), "uint8"),
    "done": ((), "float32"),
}


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    data = np.load(TEST_DATA)
    return np.concatenate([data["Pong/frames"], data["Breakout/frames"]])


def stream(frames: np.ndarray, rng: np.random.Generator, steps: int) -> dict[str, np.ndarray]:
    """One environment's transitions: a random window of frames, episodes ending at random steps."""
    lo = int(rng.integers(0, len(frames) - steps - 1))
    window = frames[lo : lo + steps + 1]
    starts = rng.random(steps + 1) < 0.15
    starts[0] = True
    s = stacks(window, starts)
    done = np.append(starts[1:], False)[:steps]  # the step before a start ends an episode
    nxt = s[1:].copy()
    nxt[done] = np.stack([np.roll(s[i], -1, axis=0) for i in np.flatnonzero(done)]) if done.any() else nxt[done]
    return {"obs": s[:-1], "action": rng.integers(0, 6, steps), "next_obs": nxt, "done": done.astype(np.float32)}


def referenced(storage: HostStorage) -> set[int]:
    """Frame slots the rows reference (-1: a field of a row never written)."""
    pool = storage.compressed.pool
    return {int(s) for table in pool._slot_of_row.values() for s in table.ravel()} - {-1}


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_interleaved_envs_episode_ends_and_wrap_around(frames, seed):
    rng = np.random.default_rng(seed)
    n_envs, capacity = int(rng.integers(1, 4)), int(rng.integers(9, 30))
    streams = [stream(frames, rng, 60) for _ in range(n_envs)]
    raw = HostStorage(capacity, SCHEMA)
    packed = HostStorage(capacity, SCHEMA, codec=("zstd", 1), frames=True)
    pos, written, taken = 0, 0, [0] * n_envs
    while min(taken) < 60:
        env = int(rng.integers(n_envs))
        k = min(int(rng.integers(1, 6)), 60 - taken[env])
        batch = {n: a[taken[env] : taken[env] + k] for n, a in streams[env].items()}
        taken[env] += k
        if k == 0:
            continue
        if rng.random() < 0.15:  # a rewrite of one field of some rows
            batch = {"next_obs": batch["next_obs"]}
        for storage in (raw, packed):
            storage.write(pos, storage.validate_fields(batch)[1])
        pos, written = (pos + k) % capacity, written + k
        n = min(written, capacity)
        want, got = raw.gather(np.arange(n, dtype=np.int64)), packed.gather(np.arange(n, dtype=np.int64))
        for name in SCHEMA:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"{name} after {written} rows")
        one = int(rng.integers(n))  # a lone row: its frames mostly distinct, decompressed straight into the batch
        np.testing.assert_array_equal(packed.gather(np.array([one]))["obs"], want["obs"][[one]])
        pool = packed.compressed.pool
        held = {i for i, r in enumerate(pool._records) if r is not None}
        assert held == referenced(packed) and pool.frames == len(held)  # no dead frame kept, no live one freed
        assert packed.compressed.bytes_used == sum(len(r) for r in pool._records if r is not None)
    # the point: about one frame a row, not eight
    assert packed.compressed.pool.frames <= 2.5 * capacity


def test_sampled_batches_equal_the_raw_buffer(frames):
    rng = np.random.default_rng(5)
    data = stream(frames, rng, 150)
    raw = PrioritizedReplay(64, SCHEMA, seed=9)
    packed = PrioritizedReplay(64, SCHEMA, seed=9, storage_options={"codec": "lz4", "frames": ["obs", "next_obs"]})
    for lo in range(0, 150, 10):
        for buf in (raw, packed):
            buf.add({n: a[lo : lo + 10] for n, a in data.items()})
    a, b = raw.sample(256), packed.sample(256)
    for name in SCHEMA:
        np.testing.assert_array_equal(b.data[name], a.data[name])


def test_frames_bad_input(frames):
    with pytest.raises(ValueError, match=r"frames: field 'obs' has no codec"):
        HostStorage(4, SCHEMA, codec={"next_obs": "zstd"}, frames=["obs"])
    with pytest.raises(ValueError, match=r"frames: field 'done' has no codec"):
        HostStorage(4, SCHEMA, codec="zstd", frames=["done"])
    with pytest.raises(ValueError, match=r"frames: the pooled fields share their frames, so one codec"):
        HostStorage(4, SCHEMA, codec={"obs": "zstd", "next_obs": "lz4"}, frames=True)
    with pytest.raises(ValueError, match=r"frames= de-duplicates compressed records: it needs a codec="):
        HostStorage(4, SCHEMA, frames=True)


def test_budget_and_damage_with_frames(frames):
    data = stream(frames, np.random.default_rng(3), 20)
    storage = HostStorage(8, SCHEMA, codec="zstd", frames=True, byte_budget=200)
    with pytest.raises(ByteBudgetError, match=r"over the budget of 200 bytes; nothing was written"):
        storage.write(0, storage.validate({n: a[:8] for n, a in data.items()})[1])
    assert storage.compressed.bytes_used == 0 and storage.compressed.pool.frames == 0
    storage = HostStorage(8, SCHEMA, codec="zstd", frames=True)
    storage.write(0, storage.validate({n: a[:8] for n, a in data.items()})[1])
    pool = storage.compressed.pool
    slot = int(pool._slot_of_row["next_obs"][6, 3])  # row 6's newest frame
    rec = bytearray(pool._records[slot])
    rec[-3] ^= 0xFF
    pool._records[slot] = bytes(rec)
    for rows in ([6, 6], [6]):  # frames shared in the batch, and not
        with pytest.raises(DamagedRecordError, match=r"field 'next_obs': the compressed records of slots \[6\] are"):
            storage.gather(np.array(rows), fields=["next_obs"])
    clean = [r for r in range(8) if slot not in pool._slot_of_row["next_obs"][r]]
    np.testing.assert_array_equal(
        storage.gather(np.array(clean), fields=["next_obs"])["next_obs"], data["next_obs"][clean]
    )


def test_fields_of_different_shapes_share_one_pool(frames):
    schema = {**SCHEMA, "goal": ((84, 84), "uint8")}
    data = stream(frames, np.random.default_rng(7), 30)
    data["goal"] = data["next_obs"][:, -1].copy()  # frames the stacks hold too
    storage = HostStorage(32, schema, codec="lz4", frames=True)
    storage.write(0, storage.validate(data)[1])
    indices = np.random.default_rng(8).integers(0, 30, 64)
    got = storage.gather(indices)
    for name in schema:
        np.testing.assert_array_equal(got[name], data[name][indices])
    pool = storage.compressed.pool
    slot = int(pool._slot_of_row["goal"][5, 0])
    rec = bytearray(pool._records[slot])
    rec[-2] ^= 0x40
    pool._records[slot] = bytes(rec)
    rows = np.arange(30)
    for name in ("goal", "next_obs"):
        holding = [int(r) for r in rows if slot in pool._slot_of_row[name][r]]
        assert 5 in holding
        with pytest.raises(
            DamagedRecordError, match=re.escape(f"field '{name}': the compressed records of slots {holding} are")
        ):
            storage.gather(rows, fields=[name, "obs"])


def test_a_frame_moving_to_another_field_on_a_rewrite_is_kept():
    schema = {"obs": ((4, 84, 84), "uint8"), "next_obs": ((4, 84, 84), "uint8")}
    a, b, c = (np.full((1, 4, 84, 84), value, np.uint8) for value in (1, 2, 3))
    storage = HostStorage(1, schema, codec="lz4", frames=True)
    storage.write(0, {"obs": a, "next_obs": b})
    storage.write(0, {"obs": c, "next_obs": a})  # frame a: held only by the overwritten obs, now by next_obs
    got = storage.gather(np.array([0]))
    np.testing.assert_array_equal(got["obs"], c)
    np.testing.assert_array_equal(got["next_obs"], a)
    pool = storage.compressed.pool
    assert pool.frames == 2 and referenced(storage) == set(pool._slot.values())  # b freed, a and c held
