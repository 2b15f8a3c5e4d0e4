"""Field codecs: fields whose rows are kept compressed, one record per row, within a byte budget.

A storage given ``codec=`` keeps the chosen fields out of its fixed-size rows
and in :class:`CompressedFields` instead: each row of such a field is one
record of C-Blosc2 (LZ4 or Zstd, linked into the native module, see
``csrc/codec.cpp``) with a CRC-32C, so rows differ in size. Rows are compressed
by the process that writes them, on ``write``, and decompressed in the gather
on the native thread pool with the GIL released. Why this library and these
defaults: ``docs/compression.md``.

``codec`` takes:

* ``None``: nothing compressed;
* a codec name (``"lz4"`` or ``"zstd"``) or ``(name, level)``: every *image
  field* (:func:`is_image_field`: uint8 with at least two dimensions per row);
* a mapping ``{field: None | name | (name, level)}``: exactly those fields.

With ``frames=``, the distinct frames of stacked image fields are stored once
and shared by the rows that hold them (:mod:`.frames`).

State dicts and saved files carry the records as they are (:meth:`CompressedFields.export`,
:meth:`CompressedFields.adopt`, arrays as :mod:`.records` lays them out), with the settings
(:func:`parse_settings`); a storage compressing the same fields alike takes them without
recompressing, any other converts them (:meth:`HostStorage.import_state
<hetero_replay.storage.host.HostStorage.import_state>`).

The byte budget bounds the records' bytes (all compressed fields together), as
the capacity bounds the rows. It is a hard limit: a write whose records would
take the storage over it is refused with :class:`ByteBudgetError` before
anything changes, so a buffer never holds fewer rows than its owner believes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero_replay._native import compress_rows, decompress_fields
from hetero_replay.checks import is_int
from hetero_replay.storage import records as record_arrays
from hetero_replay.storage.frames import FramePlan, FramePool, pooled_fields
from hetero_replay.storage.records import DamagedRecordError
from hetero_replay.storage.schema import Field

#: The codecs a field may have (both from C-Blosc2).
CODECS = ("lz4", "zstd")
#: Level of each codec unless one is given (Blosc2's 0-9 scale; 0 stores rows uncompressed). On MsPacman
#: frames (benchmarks/results/compression.md) LZ4's levels differ by ~10% in bytes; Zstd packs about twice
#: as tight as LZ4 and decodes slower; Blosc2's high Zstd levels compress slowly for little gain.
DEFAULT_LEVELS = {"lz4": 1, "zstd": 1}


class ByteBudgetError(ValueError):
    """A write would take the compressed records over the storage's byte budget (nothing was written)."""


@dataclass(frozen=True)
class Codec:
    """How one field's rows are compressed: ``name`` in :data:`CODECS`, ``level`` in 0-9."""

    name: str
    level: int

    @classmethod
    def parse(cls, spec: Any, what: str = "codec") -> Codec:
        """A codec from a name or ``(name, level)``; ``ValueError``/``TypeError`` naming ``what``."""
        name, level = (spec, None) if isinstance(spec, str) else _pair(spec, what)
        if name not in CODECS:
            raise ValueError(f"{what}: unknown codec {name!r}; expected one of {list(CODECS)} or None")
        if level is None:
            level = DEFAULT_LEVELS[name]
        if not is_int(level) or not 0 <= level <= 9:
            raise ValueError(f"{what}: level must be an integer in [0, 9], got {level!r}")
        return cls(name, int(level))


def is_image_field(field: Field) -> bool:
    """Whether a field gets the codec by default: uint8 rows of at least two dimensions (frames, stacks)."""
    return field.dtype == np.uint8 and len(field.shape) >= 2


def check_codec(codec: Any) -> Any:
    """``codec`` (an option value, see the module's docstring) if every codec name and level in it is known.

    What it can check without a schema; :func:`field_codecs` checks the fields it names.

    Raises:
        ValueError: an unknown codec or level.
        TypeError: ``codec`` is neither None, a name, a pair nor a mapping.
    """
    if isinstance(codec, Mapping):
        for name, spec in codec.items():
            if spec is not None:
                Codec.parse(spec, f"codec of field {name!r}")
    elif codec is not None:
        Codec.parse(codec)
    return codec


def field_codecs(schema: Mapping[str, Field], codec: Any) -> dict[str, Codec]:
    """The codec of each compressed field of ``schema`` (see the module's docstring for ``codec``).

    Raises:
        ValueError: an unknown codec or level, or a mapping naming a field not in ``schema``.
        TypeError: ``codec`` is neither None, a name, a pair nor a mapping.
    """
    if codec is None:
        return {}
    if isinstance(codec, Mapping):
        unknown = [n for n in codec if n not in schema]
        if unknown:
            raise ValueError(f"codec names fields not in the schema: {unknown}; fields are {list(schema)}")
        parsed = {n: Codec.parse(c, f"codec of field {n!r}") for n, c in codec.items() if c is not None}
        return {n: parsed[n] for n in schema if n in parsed}  # schema order
    one = Codec.parse(codec)
    return {n: one for n, f in schema.items() if is_image_field(f)}


def _pair(spec: Any, what: str) -> tuple[Any, Any]:
    if isinstance(spec, Sequence) and len(spec) == 2:
        return spec[0], spec[1]
    raise TypeError(f"{what} must be None, a codec name, (name, level) or a mapping of field -> codec, got {spec!r}")


def parse_settings(schema: Mapping[str, Field], settings: Any) -> tuple[dict[str, Codec], list[str], int | None]:
    """``(codecs, pooled fields, byte budget)`` from settings as :meth:`CompressedFields.settings` writes them.

    Checks everything (they come from a state dict or a file) and allocates nothing.

    Raises:
        ValueError: naming what is wrong: not that form, an unknown codec or level, a field not in
            ``schema``, pooled fields of different codecs or without frames, a bad byte budget.
    """
    fields = settings.get("fields") if isinstance(settings, Mapping) else None
    if not isinstance(fields, Mapping) or not fields:
        raise ValueError(
            f"compressed settings: no fields (expected {{'fields': {{name: {{...}}}}, ...}}, got {settings!r})"
        )
    specs = {}
    for name, spec in fields.items():
        if (
            not isinstance(spec, Mapping)
            or set(spec) != {"codec", "level", "frames"}
            or type(spec["frames"]) is not bool
        ):
            raise ValueError(f"compressed settings of field {name!r}: expected codec, level and frames, got {spec!r}")
        specs[name] = (spec["codec"], spec["level"])
    try:
        codecs = field_codecs(schema, specs)
    except TypeError as e:
        raise ValueError(str(e)) from e
    pooled = pooled_fields(schema, [n for n in codecs if fields[n]["frames"]], list(codecs))
    if len({codecs[n] for n in pooled}) > 1:
        raise ValueError(f"frames: the pooled fields share their frames, so one codec: got {codecs}")
    budget = settings.get("byte_budget")
    if budget is not None and (not is_int(budget) or budget < 1):
        raise ValueError(f"byte_budget must be a positive integer or None, got {budget!r}")
    return codecs, pooled, budget


def settings_json(codecs: Mapping[str, Codec], pooled: Sequence[str], byte_budget: int | None) -> dict[str, Any]:
    """Compressed fields' settings as state dicts and files hold them (what :func:`parse_settings` reads):
    ``{"fields": {name: {"codec", "level", "frames"}}, "byte_budget"}``."""
    fields = {n: {"codec": c.name, "level": c.level, "frames": n in pooled} for n, c in codecs.items()}
    return {"fields": fields, "byte_budget": byte_budget}


def absent_rows(packed: Mapping[str, Any], rows: int) -> np.ndarray:
    """Rows (of ``rows`` exported) without a record in some field of ``packed`` (:meth:`CompressedFields.export`'s
    form, checked): rows a shared record log no longer held when saved, which are never served."""
    absent = np.zeros(rows, bool)
    for name, array in packed["arrays"].items():
        if name.endswith("/offsets"):  # a field of one record a row (the frames' is "frame_offsets")
            absent |= np.diff(array) == 0
    return np.flatnonzero(absent)


def storage_options_of(schema: Mapping[str, Field], packed: Any) -> dict[str, Any]:
    """The host storage's options that compress fields as :meth:`CompressedFields.export`'s ``packed`` says.

    Raises:
        ValueError: the settings are wrong (see :func:`parse_settings`).
    """
    settings = packed.get("settings") if isinstance(packed, Mapping) else None
    codecs, pooled, budget = parse_settings(schema, settings)
    return {"codec": {n: (c.name, c.level) for n, c in codecs.items()}, "frames": pooled or None, "byte_budget": budget}


def packed_layout(
    schema: Mapping[str, Field], codecs: Mapping[str, Codec], pooled: Sequence[str], rows: int
) -> dict[str, tuple[np.dtype, tuple[int | None, ...]]]:
    """The arrays :meth:`CompressedFields.export` gives for ``rows`` rows: name -> (dtype, shape; ``None``: any length).

    Per field, its records and their offsets (:mod:`.records`), or with ``frames`` its rows' frame
    positions; with ``frames``, the frames' records and offsets. A field's names end in ``/records``,
    ``/offsets`` or ``/frames``; the frames' have no ``/``: no two names are alike.
    """
    u8, i8 = np.dtype(np.uint8), np.dtype(np.int64)
    out: dict[str, tuple[np.dtype, tuple[int | None, ...]]] = {}
    for name in codecs:
        if name in pooled:
            out[f"{name}/frames"] = (i8, (rows, math.prod(schema[name].shape[:-2])))
        else:
            out[f"{name}/records"], out[f"{name}/offsets"] = (u8, (None,)), (i8, (rows + 1,))
    if pooled:
        out["frame_records"], out["frame_offsets"] = (u8, (None,)), (i8, (None,))
    return out


class CompressedFields:
    """The rows of some fields as compressed records (``bytes``), within a byte budget.

    Each row of a field is one record, except in the fields named by ``frames``
    (:func:`~hetero_replay.storage.frames.pooled_fields`), whose distinct frames
    are records shared by the rows that hold them (a :class:`FramePool`).
    """

    def __init__(
        self,
        capacity: int,
        fields: Mapping[str, Field],
        codecs: Mapping[str, Codec],
        byte_budget: int | None,
        frames: Any = None,
    ) -> None:
        if byte_budget is not None and (not is_int(byte_budget) or byte_budget < 1):
            raise ValueError(f"byte_budget must be a positive integer or None, got {byte_budget!r}")
        pooled = pooled_fields(fields, frames, list(codecs))
        if len({codecs[n] for n in pooled}) > 1:
            raise ValueError(f"frames: the pooled fields share their frames, so one codec: got {codecs}")
        self.capacity = capacity
        self.codecs = dict(codecs)
        self.byte_budget = None if byte_budget is None else int(byte_budget)
        self._fields = {n: fields[n] for n in codecs}
        self._records: dict[str, list[bytes | None]] = {n: [None] * capacity for n in codecs if n not in pooled}
        #: The fields of one record a row, grouped by shape and dtype: a group decompresses in one native call.
        self._alike: dict[Field, list[str]] = {}
        for name in self._records:
            self._alike.setdefault(self._fields[name], []).append(name)
        pool_codec = self.codecs[pooled[0]] if pooled else None
        #: The pooled fields' frames (None unless ``frames`` names some).
        self.pool = (
            FramePool(capacity, {n: fields[n] for n in pooled}, (pool_codec.name, pool_codec.level))
            if pool_codec is not None
            else None
        )
        #: Bytes the records hold now, the frame pool's included (what the byte budget bounds).
        self.bytes_used = 0

    def encode(self, start: int, arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, Any], int]:
        """Records of the compressed fields among ``arrays`` for slots ``start, ...``, and the bytes they add.

        Changes nothing. Raises :class:`ByteBudgetError` if the storage would go over its budget.
        """
        encoded: dict[str, Any] = {}
        added = 0
        if self.pool is not None:
            plan = self.pool.plan(start, arrays)
            if plan.ids:
                encoded[""] = plan
                added += plan.added
        for name, codec in self.codecs.items():
            if name not in arrays or name not in self._records:
                continue
            rows = np.ascontiguousarray(arrays[name]).reshape(len(arrays[name]), -1).view(np.uint8)
            records = compress_rows(rows, codec.name, codec.level)
            old = self._records[name]
            added += sum(map(len, records)) - sum(len(old[s] or b"") for s in self._slots(start, len(records)))
            encoded[name] = records
        if self.byte_budget is not None and self.bytes_used + added > self.byte_budget:
            largest = max(
                (len(r) for rs in encoded.values() for r in (rs.new.values() if isinstance(rs, FramePlan) else rs)),
                default=0,
            )
            raise ByteBudgetError(
                f"byte_budget: these rows' compressed records need {self.bytes_used + added} bytes in all "
                f"(largest record {largest}, {self.bytes_used} held now), over the budget of {self.byte_budget} "
                "bytes; nothing was written (raise byte_budget or lower capacity, see docs/compression.md)"
            )
        return encoded, added

    def commit(self, start: int, encoded: Mapping[str, Any], added: int) -> None:
        """Store what :meth:`encode` returned (cannot fail)."""
        for name, records in encoded.items():
            if isinstance(records, FramePlan):
                self.pool.commit(records)  # type: ignore[union-attr]
                continue
            held = self._records[name]
            for slot, record in zip(self._slots(start, len(records)), records):
                held[slot] = record
        self.bytes_used += added

    def gather(self, indices: np.ndarray, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Rows at ``indices`` of the compressed fields ``names``, decompressed.

        Raises:
            DamagedRecordError: a record fails its CRC or its decompression (naming field and slots).
        """
        out, damaged = {}, {}
        pooled = [name for name in names if name not in self._records]
        if pooled:
            out, damaged = self.pool.gather(indices, pooled)  # type: ignore[union-attr]
        n, wanted = len(indices), set(names)
        for like, alike in self._alike.items():
            group = [name for name in alike if name in wanted]
            if not group:
                continue
            block = np.empty((len(group), n, *like.shape), like.dtype)  # each field a C-contiguous view
            sources = [self._records[name] for name in group]
            bad = decompress_fields(sources, indices, block.reshape(len(group) * n, -1).view(np.uint8))
            out.update(zip(group, block))
            for k, name in enumerate(group):
                damaged[name] = sorted({int(indices[p % n]) for p in bad if p // n == k})
        for name in names:
            if damaged[name]:
                raise DamagedRecordError(f"field {name!r}: the compressed records of slots {damaged[name]} are damaged")
        return out

    @classmethod
    def restored(cls, schema: Mapping[str, Field], packed: Mapping[str, Any], rows: int) -> CompressedFields:
        """The compressed fields that :meth:`export` gave as ``packed``, holding ``rows`` rows (to read them from).

        Raises:
            ValueError: see :func:`parse_settings` and :meth:`adopt`.
        """
        codecs, pooled, budget = parse_settings(schema, packed.get("settings"))
        fields = cls(max(rows, 1), schema, codecs, budget, pooled)
        fields.adopt(rows, packed)
        return fields

    @property
    def pooled(self) -> list[str]:
        """The fields whose frames are stored once (in :attr:`pool`)."""
        return [n for n in self.codecs if n not in self._records]

    def settings(self) -> dict[str, Any]:
        """How the fields are compressed, as JSON: ``{"fields": {name: {"codec", "level", "frames"}}, "byte_budget"}``."""
        return settings_json(self.codecs, self.pooled, self.byte_budget)

    def records(self, name: str) -> list[bytes | None]:
        """The records of field ``name`` (not pooled), one per slot (``None``: no row written there)."""
        return self._records[name]

    def export(self, rows: int) -> dict[str, Any]:
        """The records of rows ``0 .. rows - 1`` as they are: ``{"settings": ..., "arrays": {name: array}}``
        (:meth:`settings`; :func:`packed_layout` names the arrays). Copies."""
        arrays: dict[str, np.ndarray] = {}
        for name, records in self._records.items():
            arrays[f"{name}/records"], arrays[f"{name}/offsets"] = record_arrays.join(records[:rows])
        if self.pool is not None:
            arrays.update(self.pool.export(rows))
        return {"settings": self.settings(), "arrays": arrays}

    def adopt(self, rows: int, packed: Mapping[str, Any]) -> None:
        """Hold the records of ``packed`` (:meth:`export` of fields compressed alike) as rows ``0 .. rows - 1``.

        For a new storage: what it held is replaced. The records are kept as they are (not
        recompressed); every one is decompressed once to check it. Nothing changes unless all is well.

        Raises:
            ValueError: the settings differ from these fields', arrays are missing or of the wrong
                type or shape, offsets or frame references are wrong (naming the field).
            DamagedRecordError: a record is damaged (naming the field and rows).
            ByteBudgetError: the records take more than the byte budget.
        """
        codecs, pooled, _ = parse_settings(self._fields, packed.get("settings"))
        if codecs != self.codecs or pooled != self.pooled:
            raise ValueError(f"compressed fields {self.settings()['fields']}, the records are of {packed['settings']}")
        arrays = packed.get("arrays")
        layout = packed_layout(self._fields, codecs, pooled, rows)
        if not isinstance(arrays, Mapping) or set(arrays) != set(layout):
            got = sorted(arrays) if isinstance(arrays, Mapping) else type(arrays).__name__
            raise ValueError(f"compressed arrays {got}, expected {sorted(layout)}")
        for name, (dtype, shape) in layout.items():
            record_arrays.check_array(arrays[name], dtype, shape, name)
        held: dict[str, list[bytes | None]] = {}
        for name in self._records:
            records = record_arrays.split(arrays[f"{name}/records"], arrays[f"{name}/offsets"], rows, f"field {name!r}")
            bad = record_arrays.damaged(records, np.arange(rows, dtype=np.int64), self._fields[name].item_bytes)
            if len(bad):
                raise DamagedRecordError(
                    f"field {name!r}: the compressed records of rows {bad[:5].tolist()} are damaged"
                )
            held[name] = records + [None] * (self.capacity - rows)
        pool = None
        if self.pool is not None:
            frames = record_arrays.check_array(arrays["frame_offsets"], np.int64, (None,), "frame_offsets")
            pool = FramePool(self.capacity, {n: self._fields[n] for n in pooled}, self.pool.codec)
            pool.restore(
                record_arrays.split(arrays["frame_records"], frames, max(len(frames) - 1, 0), "frame"),
                {n: arrays[f"{n}/frames"] for n in pooled},
            )
        used = sum(len(r) for records in held.values() for r in records if r is not None)
        used += 0 if pool is None else pool.bytes_used
        if self.byte_budget is not None and used > self.byte_budget:
            raise ByteBudgetError(
                f"byte_budget: the records take {used} bytes, over the budget of {self.byte_budget} bytes"
            )
        self._records, self.pool, self.bytes_used = held, pool, used

    def _slots(self, start: int, rows: int) -> range | list[int]:
        end = start + rows
        return range(start, end) if end <= self.capacity else [s % self.capacity for s in range(start, end)]


__all__ = [
    "CODECS",
    "absent_rows",
    "packed_layout",
    "parse_settings",
    "settings_json",
    "storage_options_of",
    "DEFAULT_LEVELS",
    "ByteBudgetError",
    "Codec",
    "CompressedFields",
    "DamagedRecordError",
    "field_codecs",
    "is_image_field",
]
