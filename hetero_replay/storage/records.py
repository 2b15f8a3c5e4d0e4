"""Compressed records as arrays: how a state dict and a replay file carry them as they are.

A list of records (``bytes``, ``None`` for a row never written) travels as two
arrays: ``data``, the records back to back (uint8), and ``offsets`` (int64, one
more than the records), record ``i`` being ``data[offsets[i]:offsets[i + 1]]``
(empty for ``None``). :func:`split` trusts neither array, and :func:`damaged`
decompresses records to check them (CRC-32C, chunk structure, size), so that a
buffer restored from them serves every row it holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from hetero_replay._native import decompress_rows


class DamagedRecordError(ValueError):
    """A compressed record failed its CRC or its decompression: the row is not served."""


#: Bytes of rows :func:`damaged` decompresses at a time (its scratch memory).
CHECK_BYTES = 32 << 20


def join(records: Sequence[bytes | None]) -> tuple[np.ndarray, np.ndarray]:
    """``(data, offsets)`` of ``records`` (see the module's docstring)."""
    offsets = np.zeros(len(records) + 1, np.int64)
    np.cumsum([0 if r is None else len(r) for r in records], out=offsets[1:])
    return np.frombuffer(b"".join(r for r in records if r is not None), np.uint8), offsets


def split(data: Any, offsets: Any, count: int, what: str) -> list[bytes | None]:
    """The ``count`` records that ``data`` and ``offsets`` hold (empty ones are ``None``).

    Raises:
        ValueError: naming ``what``: an array of the wrong type or shape, offsets that do not start
            at 0, decrease, or do not end at the end of ``data``.
    """
    data = check_array(data, np.uint8, (None,), f"{what} records")
    offsets = check_array(offsets, np.int64, (count + 1,), f"{what} offsets")
    if offsets[0] != 0 or offsets[-1] != len(data):
        raise ValueError(
            f"{what} offsets: must run from 0 to {len(data)} (the records' bytes), got {offsets[0]} to {offsets[-1]}"
        )
    decreasing = np.flatnonzero(np.diff(offsets) < 0)
    if len(decreasing):
        i = int(decreasing[0])
        raise ValueError(f"{what} offsets: decrease at record {i} ({offsets[i]} then {offsets[i + 1]})")
    view = memoryview(data)
    bounds = offsets.tolist()
    return [view[a:b].tobytes() if b > a else None for a, b in zip(bounds, bounds[1:])]


def check_array(value: Any, dtype: Any, shape: tuple[int | None, ...], what: str) -> np.ndarray:
    """``value`` if it is a NumPy array of ``dtype`` and ``shape`` (``None``: any length); ``ValueError`` otherwise."""
    dtype = np.dtype(dtype)
    ok = (
        isinstance(value, np.ndarray)
        and value.dtype == dtype
        and value.ndim == len(shape)
        and all(want is None or got == want for got, want in zip(value.shape, shape))
    )
    if not ok:
        got = f"{value.dtype}{list(value.shape)}" if isinstance(value, np.ndarray) else type(value).__name__
        want = ", ".join("n" if s is None else str(s) for s in shape)
        raise ValueError(
            f"{what}: expected a {dtype} array of shape ({want}{',' if len(shape) == 1 else ''}), got {got}"
        )
    return value


def decoded(
    records: list[bytes | None], positions: np.ndarray, row_bytes: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The records at ``positions`` decompressed, :data:`CHECK_BYTES` at a time: ``(chunk, rows, bad)``,
    ``rows[k]`` being record ``chunk[k]`` and ``bad`` the indices ``k`` whose record is damaged (CRC-32C,
    chunk structure, or not ``row_bytes`` long). On the native threads, the GIL released; ``rows`` is
    reused by the next chunk. A ``None`` record decompresses to zeros (a row never written)."""
    step = max(1, CHECK_BYTES // max(row_bytes, 1))
    scratch = np.empty((min(step, len(positions)), row_bytes), np.uint8)
    for lo in range(0, len(positions), step):
        chunk = np.ascontiguousarray(positions[lo : lo + step], np.int64)
        rows = scratch[: len(chunk)]
        yield chunk, rows, np.asarray(decompress_rows(records, chunk, rows), np.int64)


def damaged(records: list[bytes | None], positions: np.ndarray, row_bytes: int) -> np.ndarray:
    """The positions (of ``records``) whose record is damaged, each record decompressed (:func:`decoded`)."""
    return np.concatenate([np.zeros(0, np.int64)] + [c[bad] for c, _, bad in decoded(records, positions, row_bytes)])


__all__ = ["CHECK_BYTES", "DamagedRecordError", "check_array", "damaged", "decoded", "join", "split"]
