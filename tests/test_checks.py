"""hetero_replay.checks: the one set of argument checks (types, ranges, messages)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hetero_replay.checks import (
    MAX_BATCH,
    MAX_STALENESS,
    check_batch_size,
    check_bool,
    check_int,
    check_real,
    check_seed,
    check_staleness,
    is_int,
    is_real,
)


@pytest.mark.parametrize("value", [0, 7, -3, np.int64(5), np.uint8(3), np.int32(-1), 2**70])
def test_integers_are_integers(value):
    assert is_int(value)
    out = check_int(value, "n")
    assert out == value and type(out) is int


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False), 1.0, np.float64(2), "3", None, [1]])
def test_bools_floats_and_text_are_not_integers(value):
    assert not is_int(value)
    with pytest.raises(TypeError, match=rf"^n must be an integer, got {type(value).__name__} "):
        check_int(value, "n")


def test_int_range_messages():
    assert check_int(3, "n", 3, 3) == 3
    with pytest.raises(ValueError, match=r"^n must be in \[1, 4\], got 0$"):
        check_int(0, "n", 1, 4)
    with pytest.raises(ValueError, match=r"^n must be >= 1, got 0$"):
        check_int(np.int64(0), "n", low=1)
    with pytest.raises(ValueError, match=r"^n must be <= 4, got 5$"):
        check_int(5, "n", high=4)
    with pytest.raises(ValueError, match=r"^capacity must be in \[1, 2\*\*40\], got 0$"):
        check_int(0, "capacity", 1, 2**40)
    with pytest.raises(ValueError, match=r"^n must be in \[0, 1000\], got 1001$"):  # not a power of two
        check_int(1001, "n", 0, 1000)


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_bools(value):
    out = check_bool(value, "flag")
    assert out == bool(value) and type(out) is bool


@pytest.mark.parametrize("value", ["False", "True", 0, 1, np.int64(1), 1.0, None])
def test_truthy_objects_are_not_bools(value):
    with pytest.raises(TypeError, match=rf"^flag must be True or False, got {type(value).__name__} "):
        check_bool(value, "flag")


@pytest.mark.parametrize("value", [0, 0.5, -2, np.float32(0.25), np.float64(1e300), np.int64(3)])
def test_real_numbers(value):
    assert is_real(value)
    out = check_real(value, "x")
    assert out == float(value) and type(out) is float


@pytest.mark.parametrize("value", [True, np.bool_(False), "0.5", None, 1j, [0.5]])
def test_bools_and_text_are_not_real_numbers(value):
    assert not is_real(value)
    with pytest.raises(TypeError, match=rf"^x must be a real number, got {type(value).__name__} "):
        check_real(value, "x")


def test_real_ranges_and_finiteness():
    assert check_real(1.0, "beta", 0, 1) == 1.0
    with pytest.raises(ValueError, match=r"^beta must be in \[0, 1\], got 1\.5$"):
        check_real(1.5, "beta", 0, 1)
    with pytest.raises(ValueError, match=r"^alpha must be >= 0, got -0\.1$"):
        check_real(-0.1, "alpha", low=0)
    with pytest.raises(ValueError, match="^x must be finite, got nan$"):
        check_real(math.nan, "x")
    with pytest.raises(ValueError, match="^x must be finite, got inf$"):
        check_real(math.inf, "x")
    with pytest.raises(ValueError, match="^x must be finite"):
        check_real(np.float64("nan"), "x", finite=False)  # nan is never a number to compare
    assert check_real(math.inf, "timeout", positive=True, finite=False) == math.inf
    with pytest.raises(ValueError, match=r"^timeout must be > 0, got 0$"):
        check_real(0, "timeout", positive=True)
    with pytest.raises(ValueError, match=r"^timeout must be > 0, got -1\.0$"):
        check_real(-1.0, "timeout", positive=True, finite=False)


def test_seed():
    assert check_seed(None) is None
    assert check_seed(np.int64(7)) == 7 and type(check_seed(np.int64(7))) is int
    with pytest.raises(TypeError, match="^seed must be an integer or None, got bool True$"):
        check_seed(True)
    with pytest.raises(TypeError, match="^random_seed must be an integer or None, got float 1.5$"):
        check_seed(1.5, "random_seed")
    with pytest.raises(ValueError, match="^seed must be >= 0, got -1$"):
        check_seed(-1)


def test_batch_size():
    assert check_batch_size(np.int64(64)) == 64
    assert check_batch_size(MAX_BATCH) == MAX_BATCH
    with pytest.raises(ValueError, match=r"^batch_size must be in \[1, 2\*\*30\], got 0$"):
        check_batch_size(0)
    with pytest.raises(ValueError, match=r"batch_size must be in \[1, 2\*\*30\]"):
        check_batch_size(MAX_BATCH + 1)
    with pytest.raises(TypeError, match="^batch_size must be an integer, got bool"):
        check_batch_size(np.bool_(True))
    with pytest.raises(TypeError, match="^batch_size must be an integer, got float 32.0$"):
        check_batch_size(32.0)


def test_staleness():
    assert check_staleness(0) == 0
    assert check_staleness(np.int64(MAX_STALENESS)) == MAX_STALENESS
    with pytest.raises(ValueError, match=rf"^staleness must be in \[0, {MAX_STALENESS}\], got -1$"):
        check_staleness(-1)
    with pytest.raises(ValueError, match=rf"^k must be in \[0, {MAX_STALENESS}\], got {MAX_STALENESS + 1}$"):
        check_staleness(MAX_STALENESS + 1, "k")
    with pytest.raises(TypeError, match="^staleness must be an integer, got bool False$"):
        check_staleness(False)
    with pytest.raises(TypeError, match="^staleness must be an integer, got str '1'$"):
        check_staleness("1")
