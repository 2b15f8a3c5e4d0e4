"""Argument checks, written once: integers, booleans, real numbers, seeds, batch sizes, staleness.

Every public entry point checks its arguments with these functions, once, and
inner layers trust what they receive. Each returns the value as a plain Python
``int``/``bool``/``float`` (so a NumPy scalar never travels further in), or
raises ``TypeError`` for a wrong type and ``ValueError`` for a value out of
range, naming the argument and the value received.

NumPy integers count as integers and ``np.bool_`` as a bool; a bool (Python's
or NumPy's) is never an integer or a number here, although Python says
``isinstance(True, int)``: ``capacity=True`` is a mistake, not 1.

This module is the bottom layer: it imports only NumPy and the standard library.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

#: Largest batch one ``sample`` call draws.
MAX_BATCH = 2**30

#: Largest staleness (learner steps a priority update may lag) any replay accepts: a bound far
#: past any useful value that keeps the queues of held-back updates small. A schedule that
#: supports less (the sharded replay's, at most 2) says so itself.
MAX_STALENESS = 1024

#: Bounds at least this large are written as powers of two in messages (``2**30``, not ``1073741824``).
_POWER_SHOWN = 2**16


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer: a Python ``int`` or NumPy integer, not a bool (``np.bool_`` included)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def is_real(value: Any) -> bool:
    """Whether ``value`` is a real number: an int, float or NumPy integer/float, not a bool."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def check_int(value: Any, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an ``int`` in ``[low, high]`` (a bound left ``None`` is open).

    Raises:
        TypeError: ``value`` is not an integer (bools are refused).
        ValueError: it lies outside ``[low, high]``.
    """
    if type(value) is not int and not is_int(value):  # (the common case first: checked on every sample)
        raise TypeError(f"{name} must be an integer, got {_described(value)}")
    _check_range(value, name, low, high)
    return int(value)


def check_bool(value: Any, name: str) -> bool:
    """``value`` as a ``bool``: only ``True``/``False`` (Python's or NumPy's), never a truthy object.

    Raises:
        TypeError: anything else, e.g. the string ``"False"`` (which ``if`` would count as true) or ``1``.
    """
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {_described(value)}")
    return bool(value)


def check_real(
    value: Any,
    name: str,
    low: float | None = None,
    high: float | None = None,
    *,
    positive: bool = False,
    finite: bool = True,
) -> float:
    """``value`` as a ``float`` in ``[low, high]``, and ``> 0`` with ``positive``.

    Args:
        value: the argument.
        name: its name, for messages.
        low, high: inclusive bounds; ``None`` leaves that side open.
        positive: also require ``value > 0`` (durations, timeouts).
        finite: refuse ``inf`` and ``nan`` (``nan`` is refused always).

    Raises:
        TypeError: ``value`` is not a real number (bools and strings are refused).
        ValueError: it is not finite (with ``finite``), not positive (with ``positive``), or out of range.
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a real number, got {_described(value)}")
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and not number > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    _check_range(number, name, low, high, shown=repr(value))
    return number


def check_seed(value: Any, name: str = "seed") -> int | None:
    """``value`` as a seed: ``None`` (fresh entropy) or an integer ``>= 0``.

    Raises:
        TypeError: ``value`` is neither ``None`` nor an integer.
        ValueError: it is negative.
    """
    if value is None:
        return None
    if not is_int(value):
        raise TypeError(f"{name} must be an integer or None, got {_described(value)}")
    _check_range(value, name, 0, None)
    return int(value)


def check_batch_size(value: Any, name: str = "batch_size") -> int:
    """``value`` as a batch size: an integer in ``[1, MAX_BATCH]``."""
    return check_int(value, name, 1, MAX_BATCH)


def check_staleness(value: Any, name: str = "staleness") -> int:
    """``value`` as a staleness: an integer in ``[0, MAX_STALENESS]``."""
    return check_int(value, name, 0, MAX_STALENESS)


def _check_range(value: Any, name: str, low: float | None, high: float | None, shown: str | None = None) -> None:
    """``ValueError`` naming ``name`` unless ``low <= value <= high`` (``None``: that side open)."""
    if (low is None or value >= low) and (high is None or value <= high):
        return
    got = shown if shown is not None else str(value)
    if low is not None and high is not None:
        raise ValueError(f"{name} must be in [{_bound(low)}, {_bound(high)}], got {got}")
    if low is not None:
        raise ValueError(f"{name} must be >= {_bound(low)}, got {got}")
    raise ValueError(f"{name} must be <= {_bound(high)}, got {got}")


def _bound(bound: float | None) -> str:
    """A range bound for a message: large powers of two as ``2**k``."""
    if isinstance(bound, int) and bound >= _POWER_SHOWN and bound & (bound - 1) == 0:
        return f"2**{bound.bit_length() - 1}"
    return str(bound)


def _described(value: Any) -> str:
    """``"<type> <repr>"`` of a refused value, for messages."""
    return f"{type(value).__name__} {value!r}"


__all__ = [
    "MAX_BATCH",
    "MAX_STALENESS",
    "check_batch_size",
    "check_bool",
    "check_int",
    "check_real",
    "check_seed",
    "check_staleness",
    "is_int",
    "is_real",
]
