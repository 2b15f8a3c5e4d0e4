"""Hostile or damaged state is never trusted: a ring's files are checked before they are used.

``reopen`` of a disk buffer and a writer attaching to a ring read three kinds of
state written by earlier processes (or planted by someone else): the control
block ``ring.ctl`` (counters, sizes, the schema), the row file ``rows.dat`` and
the durable point ``state.hrp``. Each damage below must be refused with
:class:`ReplayFileError` naming the damaged part, before anything changes. A
row whose bytes changed on disk fails its checksum: it is never served, it is
counted and a warning names its slot.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from hetero_replay import PrioritizedReplay, ReplayFileError
from hetero_replay.storage import checkpoint
from hetero_replay.storage.disk import CONTROL_FILE, ROW_FILE, STATE_FILE
from hetero_replay.storage.ring import MAX_WRITERS, TICKET_MASK
from tests.test_shared_storage import SMALL_SCHEMA, rows_with_ids

CAPACITY = 16
_HEADER_WORDS = 16
_SCHEMA_AT = 8 * (_HEADER_WORDS + 2 * MAX_WRITERS)
# Header words of ring.ctl (storage/ring.py).
CAPACITY_WORD, ROW_BYTES_WORD, COUNTER_WORD, SCHEMA_BYTES_WORD, PAYLOAD_WORD = 1, 2, 3, 5, 6


def disk_buffer(path: Path, rows: int = 20) -> Path:
    """A disk buffer at ``path`` holding ``rows`` rows (ids 1..rows), made durable and closed."""
    buf = PrioritizedReplay(CAPACITY, SMALL_SCHEMA, seed=0, storage="disk", storage_options={"path": str(path)})
    for first in range(1, rows + 1, CAPACITY):
        buf.add(rows_with_ids(np.arange(first, min(first + CAPACITY, rows + 1)), width=4))
    buf.flush()
    buf.close()
    return path


def set_word(ctl: Path, word: int, value: int) -> None:
    with open(ctl, "r+b") as f:
        f.seek(8 * word)
        f.write(np.int64(value).tobytes())


def word(ctl: Path, word: int) -> int:
    with open(ctl, "rb") as f:
        f.seek(8 * word)
        return int(np.frombuffer(f.read(8), np.int64)[0])


def set_schema(ctl: Path, blob: bytes) -> None:
    """Replace the schema JSON of ``ctl`` by ``blob`` (no longer than the original)."""
    assert len(blob) <= word(ctl, SCHEMA_BYTES_WORD)
    with open(ctl, "r+b") as f:
        f.seek(_SCHEMA_AT)
        f.write(blob)
    set_word(ctl, SCHEMA_BYTES_WORD, len(blob))


def rewrite_state(path: Path, change) -> None:
    header, arrays = checkpoint.read(path / STATE_FILE)
    change(header, arrays)
    header.pop("format"), header.pop("version"), header.pop("arrays")
    checkpoint.write(path / STATE_FILE, header, arrays)


def files_of(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def refused(path: Path, match: str) -> None:
    """reopen of ``path`` raises ReplayFileError matching ``match``, and no file changes."""
    before = files_of(path)
    with pytest.raises(ReplayFileError, match=match):
        PrioritizedReplay.reopen(path)
    assert files_of(path) == before


# -- the durable point's counters ------------------------------------------------------------------


def test_ticket_counter_near_the_int64_limit_is_refused(tmp_path):
    """A valid state.hrp whose ticket counter is near 2**63: refused, not overflowed on the next add."""
    path = disk_buffer(tmp_path / "buf")
    rewrite_state(path, lambda h, a: h.update(tickets=2**63 - 5))
    refused(path, r"state\.hrp.*tickets")


def test_ticket_counter_beyond_the_ring_markers_is_refused(tmp_path):
    """Tickets a writer marker cannot hold (48 bits) are refused too."""
    path = disk_buffer(tmp_path / "buf")
    rewrite_state(path, lambda h, a: h.update(tickets=TICKET_MASK + 1))
    refused(path, r"state\.hrp.*tickets")


@pytest.mark.parametrize(
    "damage",
    ["stamp_of_another_slot", "stamp_beyond_the_tickets", "tickets_below_the_stamps", "negative_priority"],
)
def test_stamps_that_disagree_with_the_tickets_are_refused(tmp_path, damage):
    """Slot stamps (in state.hrp and ring.ctl alike) that no run of the ring can leave: refused, naming slots."""
    path = disk_buffer(tmp_path / "buf")  # 20 tickets: slots 0..3 hold tickets 16..19, slots 4..15 tickets 4..15
    header, arrays = checkpoint.read(path / STATE_FILE)
    stamps = arrays["stamps"].copy()
    tickets = header["tickets"]
    if damage == "stamp_of_another_slot":
        stamps[5] = 7  # ticket 6 lives in slot 6
    elif damage == "stamp_beyond_the_tickets":
        stamps[4] = CAPACITY + 5  # ticket 20 was never issued
    elif damage == "tickets_below_the_stamps":
        tickets = 8
    ctl = np.memmap(path / CONTROL_FILE, np.int64, "r+")
    start = (_SCHEMA_AT + word(path / CONTROL_FILE, SCHEMA_BYTES_WORD) + 7) // 8
    ctl[start : start + CAPACITY] = stamps
    ctl.flush()
    del ctl
    priorities = arrays["priorities"].copy()
    if damage == "negative_priority":
        priorities[6] = -1.0
    rewrite_state(path, lambda h, a: (h.update(tickets=tickets), a.update(stamps=stamps, priorities=priorities)))
    refused(path, r"state\.hrp.*slots \[\d")


# -- the control block -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage, part",
    [
        ("schema_a_list", "schema"),
        ("schema_field_without_dtype", "schema"),
        ("schema_field_a_number", "schema"),
        ("schema_not_json", "schema"),
        ("schema_bytes_beyond_the_file", "schema"),
        ("capacity_zero", "capacity"),
        ("capacity_huge", "capacity"),
        ("row_bytes_not_the_schema", "row size"),
        ("payload_offset_inside_the_stamps", "payload"),
        ("counter_negative", "ticket"),
        ("truncated", "ring.ctl"),
        ("bad_magic", "not a hetero-replay ring"),
    ],
)
def test_damaged_control_block_is_refused_naming_the_part(tmp_path, damage, part):
    """ring.ctl of the wrong shape: ReplayFileError naming it (was AttributeError/TypeError/KeyError...)."""
    path = disk_buffer(tmp_path / "buf")
    ctl = path / CONTROL_FILE
    if damage == "schema_a_list":
        set_schema(ctl, b"[1, 2]")
    elif damage == "schema_field_without_dtype":
        set_schema(ctl, json.dumps({"id": {"shape": []}}).encode())
    elif damage == "schema_field_a_number":
        set_schema(ctl, json.dumps({"id": 3}).encode())
    elif damage == "schema_not_json":
        set_schema(ctl, b"{not json")
    elif damage == "schema_bytes_beyond_the_file":
        set_word(ctl, SCHEMA_BYTES_WORD, 1 << 40)
    elif damage == "capacity_zero":
        set_word(ctl, CAPACITY_WORD, 0)
    elif damage == "capacity_huge":
        set_word(ctl, CAPACITY_WORD, 1 << 60)
    elif damage == "row_bytes_not_the_schema":
        set_word(ctl, ROW_BYTES_WORD, word(ctl, ROW_BYTES_WORD) - 8)
    elif damage == "payload_offset_inside_the_stamps":
        set_word(ctl, PAYLOAD_WORD, 8)
    elif damage == "counter_negative":
        set_word(ctl, COUNTER_WORD, -3)
    elif damage == "truncated":
        os.truncate(ctl, 100)
    else:
        set_word(ctl, 0, 0x1234)
    refused(path, part)


# -- the row file ----------------------------------------------------------------------------------


def test_missing_row_file_is_refused_at_reopen(tmp_path):
    path = disk_buffer(tmp_path / "buf")
    (path / ROW_FILE).unlink()
    refused(path, r"rows\.dat")


@pytest.mark.parametrize("size", [0, "short", "long"])
def test_row_file_of_the_wrong_size_is_refused_at_reopen(tmp_path, size):
    """A truncated (or extended) rows.dat is found by reopen, not at sample time."""
    path = disk_buffer(tmp_path / "buf")
    rows = path / ROW_FILE
    full = rows.stat().st_size
    os.truncate(rows, {0: 0, "short": full - 1, "long": full + 4096}[size])
    refused(path, r"rows\.dat")


def test_row_file_that_is_not_a_regular_file_is_refused(tmp_path):
    path = disk_buffer(tmp_path / "buf")
    (path / ROW_FILE).unlink()
    (path / ROW_FILE).mkdir()
    with pytest.raises(ReplayFileError, match=r"rows\.dat"):
        PrioritizedReplay.reopen(path)


# -- row checksums ---------------------------------------------------------------------------------


def flip_byte(path: Path, slot: int, record_bytes: int, at: int) -> None:
    """Flip one byte ``at`` bytes into slot ``slot``'s record of the row file."""
    with open(path / ROW_FILE, "r+b") as f:
        f.seek(slot * record_bytes + at)
        byte = f.read(1)
        f.seek(slot * record_bytes + at)
        f.write(bytes([byte[0] ^ 0x01]))


@pytest.mark.parametrize("where", ["payload", "checksum"])
def test_a_flipped_byte_is_never_served_but_counted_and_reported(tmp_path, where):
    """One changed byte of a stored row: the row leaves sampling, is counted, and a warning names its slot."""
    buf = PrioritizedReplay(
        CAPACITY, SMALL_SCHEMA, seed=0, storage="disk", storage_options={"path": str(tmp_path / "buf")}
    )
    try:
        buf.add(rows_with_ids(np.arange(1, CAPACITY + 1), width=4))
        record = buf.storage.format.bytes
        # The record is [ticket+1][row][checksum][ticket+1]: a byte of "obs" (after id), or of the checksum.
        flip_byte(tmp_path / "buf", 3, record, 8 + 8 + 2 if where == "payload" else record - 9)
        with pytest.warns(RuntimeWarning, match=r"slot.*\b3\b.*checksum|checksum.*slot.*\b3\b"):
            for _ in range(40):
                batch = buf.sample(CAPACITY)
                ids = batch.data["id"]
                assert 3 not in batch.indices
                np.testing.assert_array_equal(batch.data["obs"], np.repeat(ids[:, None], 4, 1).astype(np.float32))
                np.testing.assert_array_equal(batch.data["tail"], -ids)
        assert buf.storage.damaged_rows == 1
        assert buf.tree.get(np.array([3]))[0] == 0
        # The slot's next row is whole again: it is sampled like any other.
        buf.add(rows_with_ids(np.arange(CAPACITY + 1, 2 * CAPACITY + 1), width=4))
        seen = np.concatenate([buf.sample(CAPACITY).indices for _ in range(20)])
        assert 3 in seen
        assert buf.storage.damaged_rows == 1
    finally:
        buf.close()


def test_gather_at_never_serves_a_damaged_row_and_the_shard_caller_draws_again(tmp_path):
    """The sharded replay's descent (``gather_at``) refuses a damaged row as ``sample`` does: no rows, slot cleared."""
    buf = PrioritizedReplay(
        CAPACITY, SMALL_SCHEMA, seed=0, storage="disk", storage_options={"path": str(tmp_path / "buf")}
    )
    try:
        buf.add(rows_with_ids(np.arange(1, CAPACITY + 1), width=4))
        flip_byte(tmp_path / "buf", 3, buf.storage.format.bytes, 8 + 8 + 2)
        mass = float(np.cumsum(buf.tree.leaves())[2]) + 0.5 * float(buf.tree.get(np.array([3]))[0])  # inside slot 3
        with pytest.warns(RuntimeWarning, match="checksum"):
            rows, slots, _ = buf.gather_at(np.array([mass]))
        assert rows is None and slots.tolist() == [3]
        assert buf.tree.get(np.array([3]))[0] == 0  # it left the tree: the next descent lands elsewhere
        rows, slots, _ = buf.gather_at(np.array([mass]))
        assert rows is not None and slots[0] != 3
        np.testing.assert_array_equal(rows["tail"], -rows["id"])
    finally:
        buf.close()


def test_writer_processes_rows_carry_checksums(tmp_path):
    """Rows a writer handle adds verify on the learner's side (the checksum is the writer's)."""
    buf = PrioritizedReplay(
        CAPACITY, SMALL_SCHEMA, seed=0, storage="disk", storage_options={"path": str(tmp_path / "buf")}
    )
    try:
        with buf.writer() as w:
            w.add(rows_with_ids(np.arange(1, 11), width=4))
        buf.write_rows(0, {"tail": -np.arange(1, 3)})  # patched rows get a new checksum
        for _ in range(10):
            buf.sample(8)
        assert buf.storage.damaged_rows == 0
    finally:
        buf.close()


# -- a shared ring's control block, as a writer process attaches to it ----------------------------


def test_writer_attaching_to_a_damaged_shared_ring_is_refused(tmp_path):
    buf = PrioritizedReplay(CAPACITY, SMALL_SCHEMA, seed=0, storage="shared", storage_options={"dir": str(tmp_path)})
    try:
        writer = buf.writer()
        ctl = Path(buf.storage.path)
        good = word(ctl, SCHEMA_BYTES_WORD)
        set_word(ctl, SCHEMA_BYTES_WORD, 1 << 40)
        with pytest.raises(ReplayFileError, match="schema"):
            writer.add(rows_with_ids(np.arange(1, 3), width=4))
        set_word(ctl, SCHEMA_BYTES_WORD, good)
        set_word(ctl, CAPACITY_WORD, CAPACITY * 4)  # rows beyond the segment's end
        with pytest.raises(ReplayFileError, match="ring"):
            writer.add(rows_with_ids(np.arange(1, 3), width=4))
        set_word(ctl, CAPACITY_WORD, CAPACITY)
        assert writer.add(rows_with_ids(np.arange(1, 3), width=4)) == 2
        writer.close()
    finally:
        buf.close()


def test_a_damaged_row_is_never_returned_by_read_rows_state_dict_or_save(tmp_path):
    """The read paths that return exactly the rows asked for raise ReplayFileError naming the slot, and count it."""
    buf = PrioritizedReplay(
        CAPACITY, SMALL_SCHEMA, seed=0, storage="disk", storage_options={"path": str(tmp_path / "buf")}
    )
    try:
        buf.add(rows_with_ids(np.arange(1, CAPACITY), width=4))  # the last slot stays unwritten
        flip_byte(tmp_path / "buf", 3, buf.storage.format.bytes, 8 + 8 + 2)
        # A slot never written is no row: read as stored (zeros), no error.
        assert buf.read_rows("id", [CAPACITY - 1]).tolist() == [0]
        with pytest.raises(ReplayFileError, match=r"rows\.dat.*slots \[3\].*checksum"):
            buf.read_rows("obs", [2, 3])
        np.testing.assert_array_equal(buf.read_rows("id", [2, 4]), [3, 5])  # the others are served
        with pytest.raises(ReplayFileError, match=r"slots \[3\]"):
            buf.state_dict()
        with pytest.raises(ReplayFileError, match=r"slots \[3\]"):
            buf.save(tmp_path / "saved.hrp")
        assert not (tmp_path / "saved.hrp").exists()
        assert buf.storage.damaged_rows == 3
    finally:
        buf.close()


def test_a_row_damaged_while_closed_is_found_after_reopen_on_every_read_path(tmp_path):
    path = disk_buffer(tmp_path / "buf", rows=CAPACITY)
    record = PrioritizedReplay.reopen(path)
    size = record.storage.format.bytes
    record.close()
    flip_byte(path, 5, size, 8 + 8 + 1)
    buf = PrioritizedReplay.reopen(path)  # the structure is whole: reopen accepts it
    try:
        with pytest.warns(RuntimeWarning, match="checksum"):
            seen = np.concatenate([buf.sample(CAPACITY).indices for _ in range(20)])
        assert 5 not in seen[-CAPACITY:]
        assert buf.tree.get(np.array([5]))[0] == 0
        with pytest.raises(ReplayFileError, match=r"slots \[5\]"):
            buf.read_rows("id", [5])
    finally:
        buf.close()
