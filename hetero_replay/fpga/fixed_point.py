"""The RMM's priority format: unsigned 32-bit fixed point with 22 fraction bits.

A priority ``p`` becomes the leaf ``q = floor(p * 2**22 + 0.5)`` (round to
nearest, computed in float64 on the host); the kernel only ever adds and
compares these integers, in 64-bit sums, so the tree itself is exact.

Why 22 fraction bits: PER's smallest priority with the defaults is
``(1e-6) ** 0.6 = 2.5e-4``, about 1000 steps of ``2**-22``, so rounding one leaf
moves it by at most ``2**-23 / p <= 4.7e-4`` relative; the remaining 10 integer
bits still hold priorities up to ``(2**32 - 1) / 2**22 ~ 1024``, i.e.
``|td| + eps`` up to about ``1.1e5`` at ``alpha = 0.6``. ``hls/README.md`` has
the whole error analysis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Fraction bits of a leaf: one step is ``2**-FRAC_BITS`` of priority.
FRAC_BITS = 22
#: Width of a leaf in bits (the kernel's ``ap_uint<32>``).
LEAF_BITS = 32
#: Scale between a priority and its leaf integer.
SCALE = float(2**FRAC_BITS)
#: Largest leaf integer.
MAX_Q = 2**LEAF_BITS - 1
#: Smallest positive priority a leaf holds (one step, ~2.38e-7).
MIN_PRIORITY = 1.0 / SCALE
#: Largest priority a leaf holds, ``(2**32 - 1) / 2**22`` (~1024.0; exact in float64).
MAX_PRIORITY = MAX_Q / SCALE


def describe_range() -> str:
    """The representable priorities as error messages state them."""
    return (
        f"0 or [2**-{FRAC_BITS} = {MIN_PRIORITY:.6g}, (2**{LEAF_BITS} - 1) / 2**{FRAC_BITS} = {MAX_PRIORITY!r}] "
        f"(unsigned {LEAF_BITS}-bit fixed point, FRAC_BITS = {FRAC_BITS})"
    )


def quantize(values: Any, name: str = "priorities") -> np.ndarray:
    """Priorities as leaf integers (``uint32``): ``floor(p * 2**FRAC_BITS + 0.5)``.

    Args:
        values: real numbers, any shape (taken as float64).
        name: how the error message names ``values``.

    Raises:
        TypeError: ``values`` are not real numbers.
        ValueError: naming ``name`` and the first bad position (in C order): a
            NaN, a negative value, one in ``(0, MIN_PRIORITY)`` or one above
            ``MAX_PRIORITY``. Nothing else happens.
    """
    arr = np.asarray(values)
    if arr.size and arr.dtype.kind not in "fiu":
        raise TypeError(f"{name} must be real numbers, got dtype {arr.dtype}")
    p = arr.astype(np.float64, copy=False)
    # Written as "not ok" so NaN (every comparison False) is refused too.
    ok = (p == 0) | ((p >= MIN_PRIORITY) & (p <= MAX_PRIORITY))
    if not ok.all():
        flat = np.flatnonzero(~ok.reshape(-1))
        i = int(flat[0])
        raise ValueError(
            f"{name}: the value at position {i} is {float(p.reshape(-1)[i])!r}, outside what the FPGA tree's "
            f"leaves represent: {describe_range()}"
        )
    return np.floor(p * SCALE + 0.5).astype(np.uint32)


def dequantize(q: Any, dtype: Any = np.float64) -> np.ndarray:
    """Leaf integers as priorities ``q / 2**FRAC_BITS`` in ``dtype`` (exact in float64, rounded once to float32)."""
    return (np.asarray(q).astype(np.float64) / SCALE).astype(dtype, copy=False)


def largest_priority(dtype: Any) -> float:
    """The largest ``dtype`` value not above :data:`MAX_PRIORITY` (float32 rounds MAX_PRIORITY up to 1024)."""
    dt = np.dtype(dtype)
    top = dt.type(MAX_PRIORITY)
    if float(top) > MAX_PRIORITY:
        top = np.nextafter(top, dt.type(0))
    return float(top)


__all__ = [
    "FRAC_BITS",
    "LEAF_BITS",
    "MAX_PRIORITY",
    "MAX_Q",
    "MIN_PRIORITY",
    "SCALE",
    "dequantize",
    "describe_range",
    "largest_priority",
    "quantize",
]
