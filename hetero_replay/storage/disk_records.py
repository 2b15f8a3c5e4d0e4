"""The compressed fields of a ``"disk"`` ring: a record log in a file, its head in the control block.

``storage="disk"`` with ``storage_options={"codec": ..., "byte_budget": ...}``
keeps the chosen fields as compressed records in ``<path>/records.log``, a file
of ``byte_budget`` bytes used as a circular byte log: the
:class:`~hetero_replay.storage.record_log.RecordLog` of the shared storage, its
data a file (``pwrite`` at ``offset % byte_budget``, ``pread`` on the disk
storage's read threads) instead of memory, and the same native code appending,
gathering and checking it. What the files hold:

* ``ring.ctl`` (every process maps it) holds, after the ring's control block,
  the log's header line (the head: bytes ever reserved, one atomic add per
  writer batch; the log's size; the length of the settings) and the codec
  settings (JSON, as checkpoints write them), so that writer processes and a
  reopening learner find the codecs in the buffer's own files;
* ``rows.dat`` holds each row's raw fields and, in the field :data:`REFS`, each
  compressed field's record reference (absolute log offset, length), all under
  the row's checksum;
* ``records.log`` holds the records, each after a 16-byte header (its row's
  stamp, its length): ``[stamp][length][CRC-32C][Blosc2 chunk]``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hetero_replay.storage.checkpoint import ReplayFileError
from hetero_replay.storage.codec import Codec, parse_settings, settings_json
from hetero_replay.storage.files import create_file, open_file
from hetero_replay.storage.record_log import LOG_HEADER_BYTES, RECORD_HEADER_BYTES, RecordLog
from hetero_replay.storage.ring import RingControl
from hetero_replay.storage.schema import Field, Schema
from hetero_replay.storage.shared_compressed import EncodedRows, copy_records, encode_rows

LOG_FILE = "records.log"
#: The row field holding the references of a row's records: ``(2, fields)`` int64, offsets then lengths.
REFS = "records/refs"
#: The most bytes of codec settings the control block holds (a few fields' names and codecs).
MAX_SETTINGS_BYTES = 1 << 16
_HEAD, _LOG_BYTES, _SETTINGS_BYTES = range(3)  # the words of the log's header line
_MAX_HEAD = 1 << 62  # a head beyond this is damage (bytes ever written, 4.6 EB)


def payload_bytes(codecs: Mapping[str, Codec], log_bytes: int) -> int:
    """Bytes the control block holds after the ring's: the log's header line and the settings."""
    return LOG_HEADER_BYTES + len(_settings_blob(codecs, log_bytes))


def _settings_blob(codecs: Mapping[str, Codec], log_bytes: int) -> bytes:
    return json.dumps(settings_json(codecs, [], log_bytes)).encode()


def row_schema(schema: Schema, codecs: Mapping[str, Codec]) -> Schema:
    """What ``rows.dat`` holds of a row: the raw fields and the references of its records (:data:`REFS`).

    Raises:
        ValueError: the schema has a field named :data:`REFS`.
    """
    if REFS in schema:
        raise ValueError(f"schema: the field name {REFS!r} is the disk storage's own when it compresses fields")
    raw: dict[str, Any] = {n: f for n, f in schema.items() if n not in codecs}
    raw[REFS] = Field((2, len(codecs)), np.dtype(np.int64))
    return Schema(raw)


def create_log(path: Path, control: RingControl, codecs: Mapping[str, Codec], log_bytes: int) -> Path:
    """Write the log's settings into a new control block (made with :func:`payload_bytes` after it) and create
    ``records.log`` (``log_bytes``, sparse); the file made (the caller removes it if a later step fails)."""
    blob = _settings_blob(codecs, log_bytes)
    payload = control.payload(payload_bytes(codecs, log_bytes))
    payload[LOG_HEADER_BYTES:] = np.frombuffer(blob, np.uint8)
    words = payload[:LOG_HEADER_BYTES].view(np.int64)
    words[_LOG_BYTES], words[_SETTINGS_BYTES] = log_bytes, len(blob)
    log = path / LOG_FILE
    fd = create_file(log)
    try:
        os.ftruncate(fd, log_bytes)
    finally:
        os.close(fd)
    return log


def stored_settings(control: RingControl) -> tuple[dict[str, Codec], int] | None:
    """``(codecs, log bytes)`` of the buffer whose control block this is; None if it compresses nothing.

    Raises:
        ReplayFileError: the log's header or settings are damaged (naming the control block).
    """
    size = control.payload_bytes
    if size == 0:
        return None

    def damaged(what: str) -> ReplayFileError:
        return ReplayFileError(f"{control.path}: damaged record log settings ({what})")

    if size < LOG_HEADER_BYTES:
        raise damaged(f"{size} bytes, the log's header takes {LOG_HEADER_BYTES}")
    payload = control.payload(size)
    words = payload[:LOG_HEADER_BYTES].view(np.int64)
    head, log_bytes, blob_bytes = (int(words[k]) for k in (_HEAD, _LOG_BYTES, _SETTINGS_BYTES))
    if not 0 <= head <= _MAX_HEAD:
        raise damaged(f"head {head}")
    if not 0 < blob_bytes <= min(size - LOG_HEADER_BYTES, MAX_SETTINGS_BYTES):
        raise damaged(f"settings of {blob_bytes} bytes in {size - LOG_HEADER_BYTES}")
    try:
        settings = json.loads(bytes(payload[LOG_HEADER_BYTES : LOG_HEADER_BYTES + blob_bytes]))
        codecs, pooled, budget = parse_settings(control.schema, settings)
    except ValueError as e:  # JSON, or settings naming fields or codecs wrongly
        raise damaged(str(e)) from None
    if pooled or budget != log_bytes or log_bytes < 1:
        raise damaged(f"frames {pooled}, byte budget {budget} for a log of {log_bytes} bytes")
    return codecs, log_bytes


class DiskRecords:
    """One process's view of a disk ring's compressed fields: their codecs, ``records.log`` and its head.

    Args:
        path: the buffer's directory.
        control: its control block, holding the log's header and settings (:func:`stored_settings`).

    Raises:
        ReplayFileError: the settings are damaged, or ``records.log`` is missing, not a regular file, or
            not the log's size (naming it).
    """

    def __init__(self, path: Path, control: RingControl) -> None:
        settings = stored_settings(control)
        if settings is None:
            raise ReplayFileError(f"{control.path}: this buffer keeps no compressed fields")
        self.codecs, log_bytes = settings
        self.fields: dict[str, Field] = dict(control.schema.items())
        self.path = path / LOG_FILE
        try:
            fd = open_file(self.path)
        except FileNotFoundError:
            raise ReplayFileError(f"{self.path}: the buffer's record log is missing") from None
        except OSError as e:
            raise ReplayFileError(f"{self.path}: the buffer's record log cannot be opened ({e.strerror})") from None
        try:
            held = os.fstat(fd).st_size
            if held != log_bytes:
                raise ReplayFileError(
                    f"{self.path}: the buffer's record log holds {held} bytes, its byte budget is {log_bytes} "
                    "(truncated, or not this buffer's)"
                )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        self.log = RecordLog.in_file(fd, control.payload(LOG_HEADER_BYTES).view(np.int64), log_bytes)

    @property
    def log_bytes(self) -> int:
        return self.log.log_bytes

    @property
    def reserved(self) -> int:
        """The head: bytes ever reserved in the log."""
        return self.log.reserved

    def encode(self, arrays: Mapping[str, np.ndarray]) -> EncodedRows:
        """The rows with their compressed fields compressed (``ByteBudgetError`` if they cannot fit the log)."""
        return encode_rows(self.codecs, arrays, self.log_bytes)

    def row_arrays(self, encoded: EncodedRows, stamps: np.ndarray, picked: np.ndarray) -> dict[str, np.ndarray]:
        """Append the records of rows ``picked`` (to be published with ``stamps``, one per picked row) and
        return every row's fields as ``rows.dat`` holds them: raw fields and references (zeros where not picked)."""
        refs = np.zeros((encoded.rows, 2, len(self.codecs)), np.int64)
        if encoded.names and len(picked):
            fields = len(encoded.names)
            records = (
                encoded.records
                if len(picked) * fields == len(encoded.records)
                else [encoded.records[k * fields + f] for k in picked.tolist() for f in range(fields)]
            )
            columns = [list(self.codecs).index(n) for n in encoded.names]
            offsets = self.log.append(records, stamps).reshape(len(picked), fields)
            lengths = np.fromiter(map(len, records), np.int64, len(records)).reshape(len(picked), fields)
            refs[picked[:, None], 0, columns] = offsets
            refs[picked[:, None], 1, columns] = lengths
        return {**encoded.raw, REFS: refs}

    def decode(
        self, refs: np.ndarray, stamps: np.ndarray, names: Sequence[str], threads: int
    ) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Compressed fields ``names`` of rows whose references are ``refs`` and stamps ``stamps``, read on
        ``threads`` threads; mask of the rows whose records were sound (the others read as zeros)."""
        n = len(stamps)
        out = {name: np.empty((n, *self.fields[name].shape), self.fields[name].dtype) for name in names}
        if not names or not n:
            return out, np.ones(n, bool)
        columns = [list(self.codecs).index(name) for name in names]
        sound = self.log.gather(
            np.ascontiguousarray(refs[:, 0, columns]),
            np.ascontiguousarray(refs[:, 1, columns]),
            np.ascontiguousarray(stamps, np.int64),
            [out[name].reshape(n, -1).view(np.uint8) for name in names],
            threads,
        )
        return out, sound

    def evicted(self, refs: np.ndarray) -> np.ndarray:
        """Mask of the rows (by their references) some of whose records the head has passed (overwritten)."""
        return refs[:, 0].min(axis=1, initial=_MAX_HEAD) < self.reserved - self.log_bytes

    def copy(self, refs: np.ndarray, stamps: np.ndarray) -> dict[str, list[bytes | None]]:
        """The records of rows (``refs``, ``stamps``) as they are: :func:`copy_records`."""
        return copy_records(self.log, self.fields, list(self.codecs), refs[:, 0], refs[:, 1], stamps)

    def row_log_bytes(self, refs: np.ndarray) -> np.ndarray:
        """Log bytes each row's records take (headers included)."""
        return refs[:, 1].sum(axis=1) + RECORD_HEADER_BYTES * len(self.codecs)

    def close(self) -> None:
        os.close(self.fd)


def check_head(state: Path, control: RingControl, durable_head: Any) -> int:
    """The log's head at a durable point, checked against the control block's: ``ReplayFileError`` if the
    control block's is behind it (the head only grows: it was reset or damaged) or it is not a count."""
    if not isinstance(durable_head, int) or isinstance(durable_head, bool) or not 0 <= durable_head <= _MAX_HEAD:
        raise ReplayFileError(f"{state}: damaged durable point (record log head {durable_head!r})")
    head = int(control.payload(LOG_HEADER_BYTES).view(np.int64)[_HEAD])
    if head < durable_head:
        raise ReplayFileError(
            f"{control.path}: the record log's head {head} is behind the durable point's {durable_head} "
            f"({state}); the head only grows: the control block was reset or damaged"
        )
    return durable_head


__all__ = [
    "LOG_FILE",
    "REFS",
    "DiskRecords",
    "check_head",
    "create_log",
    "payload_bytes",
    "row_schema",
    "stored_settings",
]
