"""What one transition holds: named fields, each with a fixed shape and dtype."""

from __future__ import annotations

from collections.abc import ItemsView, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hetero_replay.checks import is_int

#: dtype kinds a field may have: bool, signed and unsigned integers, floats, complex.
#: Storage copies rows as raw bytes, so objects (pointers without references),
#: strings, void and structured records are refused.
PLAIN_KINDS = "biufc"


@dataclass(frozen=True)
class Field:
    """One field of a transition: its per-item ``shape`` and ``dtype``.

    ``shape`` is a tuple of non-negative integers; ``dtype`` a plain numeric or
    bool NumPy dtype (see :data:`PLAIN_KINDS`).
    """

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        shape = (self.shape,) if isinstance(self.shape, (int, np.integer)) else self.shape
        try:
            dims = tuple(shape)
        except TypeError:
            raise TypeError(f"field shape must be a tuple of integers, got {self.shape!r}") from None
        if not all(is_int(s) for s in dims):
            raise TypeError(f"field shape must be a tuple of integers, got {self.shape!r}")
        if any(s < 0 for s in dims):
            raise ValueError(f"field shape must be non-negative, got {self.shape!r}")
        if self.dtype is None:  # np.dtype(None) would silently mean float64
            raise TypeError("field dtype must be a numeric or bool dtype, got None")
        try:
            dtype = np.dtype(self.dtype)
        except TypeError as e:
            raise TypeError(f"field dtype {self.dtype!r} is not a NumPy dtype") from e
        if dtype.kind not in PLAIN_KINDS or dtype.fields is not None or dtype.subdtype is not None:
            raise TypeError(
                f"field dtype must be a plain numeric or bool dtype (bool, int, uint, float, complex), got {dtype}"
            )
        object.__setattr__(self, "shape", tuple(int(s) for s in dims))
        object.__setattr__(self, "dtype", dtype)

    @property
    def item_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def cast(self, name: str, arr: np.ndarray) -> np.ndarray:
        """``arr`` as this field's dtype, refusing any value the cast would change.

        Casts within a kind only (float64 -> float32 is fine, float -> int is
        not); an integer outside the field's range (it would wrap) or a finite
        float that overflows to inf raises ``ValueError`` naming the field, the
        row and the value.
        """
        src, dst = arr.dtype, self.dtype
        if src == dst:
            return arr
        if not np.can_cast(src, dst, casting="same_kind"):
            raise ValueError(f"field {name!r}: dtype {src} does not cast to {dst} (expected dtype {dst})")
        if np.can_cast(src, dst, casting="safe") or arr.size == 0:
            return arr.astype(dst)
        if dst.kind in "iu":
            info = np.iinfo(dst)
            low, high = arr.min(), arr.max()
            if low < info.min or high > info.max:
                bad = low if low < info.min else high
                row = int(np.argwhere(arr == bad)[0][0])
                raise ValueError(
                    f"field {name!r}: value {bad} in row {row} does not fit {dst} [{info.min}, {info.max}]"
                )
            return arr.astype(dst)
        with np.errstate(over="ignore"):
            out = arr.astype(dst)
        if dst.kind in "fc" and not np.isfinite(out).all():
            overflow = ~np.isfinite(out) & np.isfinite(arr)
            if overflow.any():
                where = np.argwhere(overflow)[0]
                raise ValueError(
                    f"field {name!r}: value {arr[tuple(where)]} in row {int(where[0])} overflows {dst} "
                    f"(largest {np.finfo(dst).max})"
                )
        return out


class Schema(Mapping[str, Field]):
    """An ordered, immutable mapping ``name -> Field``.

    Build it from ``{name: (shape, dtype)}`` or ``{name: Field}``, or from
    gymnasium spaces with :meth:`from_spaces`.
    """

    def __init__(self, fields: Mapping[str, Any]) -> None:
        if not fields:
            raise ValueError("a schema needs at least one field")
        self._fields: dict[str, Field] = {}
        for name, spec in fields.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"field names must be non-empty strings, got {name!r}")
            self._fields[name] = spec if isinstance(spec, Field) else Field(*spec)
        self.names = frozenset(self._fields)  # for one-comparison checks of a batch's keys

    @classmethod
    def from_spaces(cls, observation_space: Any, action_space: Any) -> Schema:
        """Fields ``obs, action, reward, next_obs, done`` for a gymnasium env.

        ``Dict`` observation spaces become one field per key (``obs/<key>`` and
        ``next_obs/<key>``). Spaces are read by duck typing (``shape``, ``dtype``,
        ``spaces``), so gymnasium need not be imported here.
        """
        obs = _space_fields(observation_space)
        (action,) = _space_fields(action_space).values()

        def obs_fields(prefix: str) -> dict[str, Field]:
            return {(f"{prefix}/{key}" if key else prefix): f for key, f in obs.items()}

        return cls(
            {
                **obs_fields("obs"),
                "action": action,
                "reward": Field((), np.dtype(np.float32)),
                **obs_fields("next_obs"),
                "done": Field((), np.dtype(np.float32)),
            }
        )

    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

    def items(self) -> ItemsView[str, Field]:
        return self._fields.items()  # the dict's own view: Mapping's generic one is slower per add

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self._fields == other._fields

    def __hash__(self) -> int:
        return hash(tuple(self._fields.items()))

    def __repr__(self) -> str:
        inner = ", ".join(f"{n}: {f.shape} {f.dtype}" for n, f in self._fields.items())
        return f"Schema({{{inner}}})"

    @property
    def item_bytes(self) -> int:
        """Bytes one transition takes."""
        return sum(f.item_bytes for f in self._fields.values())

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {n: {"shape": list(f.shape), "dtype": f.dtype.str} for n, f in self._fields.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> Schema:
        return cls({n: Field(tuple(d["shape"]), np.dtype(d["dtype"])) for n, d in data.items()})


def _space_fields(space: Any) -> dict[str, Field]:
    """``{"": Field}`` for a simple space, ``{key: Field}`` for a Dict space."""
    spaces = getattr(space, "spaces", None)
    if isinstance(spaces, Mapping):
        out: dict[str, Field] = {}
        for key, sub in spaces.items():
            (field,) = _space_fields(sub).values()
            out[str(key)] = field
        return out
    if getattr(space, "shape", None) is None or getattr(space, "dtype", None) is None:
        raise ValueError(f"cannot build a field from space {space!r}: it has no shape/dtype")
    return {"": Field(tuple(space.shape), np.dtype(space.dtype))}
