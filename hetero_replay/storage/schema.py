"""What one transition holds: named fields, each with a fixed shape and dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

import numpy as np


@dataclass(frozen=True)
class Field:
    """One field of a transition: its per-item ``shape`` and ``dtype``."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))
        if any(s < 0 for s in self.shape):
            raise ValueError(f"field shape must be non-negative, got {self.shape}")

    @property
    def item_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


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

    @classmethod
    def from_spaces(cls, observation_space: Any, action_space: Any) -> "Schema":
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
                "reward": Field((), np.float32),
                **obs_fields("next_obs"),
                "done": Field((), np.float32),
            }
        )

    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

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
    def from_json(cls, data: Mapping[str, Mapping[str, Any]]) -> "Schema":
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
