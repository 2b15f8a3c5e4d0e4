"""RateLimiter: a minimum size before sampling and a samples-per-insert ratio kept within a band.

When actors and the learner run at different speeds, the replay ratio (sampled
transitions per inserted one) drifts: a fast learner overfits a few rows, a fast
actor fleet fills the buffer with rows nobody trains on. A limiter keeps
``samples / inserts`` near a target by making whichever side is ahead wait.

The rule (in transitions, counted since the limiter started; Reverb's
``SampleToInsertRatio`` and ``MinSize`` say the same):

* ``diff = inserts * samples_per_insert - samples`` is the learner's credit:
  samples it may still take at the target ratio.
* A sample of ``n`` may go when at least ``min_size`` rows were inserted and
  ``diff - n >= -error`` (after it, the learner is at most ``error`` samples
  ahead of the ratio). ``n`` may be at most ``error`` (``ValueError`` otherwise).
* An insert of ``n`` may go while fewer than ``min_size`` rows were inserted,
  when ``diff + n * samples_per_insert <= error`` (after it, the writers are at
  most ``error`` samples' worth ahead), or when ``diff <= 0``.

So ``-error <= diff <= max(error, one insert's worth)`` once ``min_size`` rows
are in, whatever the writers' bursts and pauses: the achieved ratio
``samples / inserts`` tends to the target. **The two sides never wait on each
other at once**: a waiting sample means ``diff < n - error <= 0``, where inserts
go; a waiting insert means ``diff > 0 >= n - error``, where samples go. A side
waits for the other to *move*; if the other stops, it waits up to ``timeout``
seconds (``None``: until allowed; ``0``: not at all) and raises
:class:`RateLimited`. :meth:`close` wakes every waiter (they raise too).

Thread-safe (one lock and condition): a call is counted in the same hold of the lock that lets
it go, so calls let go at once see each other and never pass the band together. Its state (the
two counters) is part of a checkpoint through :meth:`state_dict` / :meth:`load_state_dict`.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hetero_replay.checks import check_int, check_real

#: ``timeout=`` left out: the limiter's own.
DEFAULT: Any = object()
#: How often a wait with ``poll=`` polls (a writer process's insert is seen within this).
POLL_SECONDS = 0.001


class RateLimited(TimeoutError):
    """A sample or insert was not allowed within its timeout (or the limiter was closed)."""


class RateLimiter:
    """Keeps ``sampled / inserted`` transitions within ``samples_per_insert ± error / inserted``.

    Args:
        samples_per_insert: the target replay ratio (sampled transitions per inserted one), > 0.
        error: how many samples either side may run ahead of the ratio; at least the largest
            batch sampled at once (see the module docstring).
        min_size: inserted transitions before any sample may go (>= 1).
        timeout: seconds a call waits by default before :class:`RateLimited`; ``None`` waits
            without end, ``0`` never waits.

    Example:
        >>> limiter = RateLimiter(samples_per_insert=4.0, min_size=1000, error=512)
        >>> limiter.insert(1000)            # the writers' side, before adding rows
        >>> limiter.sample(256)             # the learner's side, before sampling
    """

    def __init__(
        self, samples_per_insert: float, error: float, min_size: int = 1, timeout: float | None = None
    ) -> None:
        self.samples_per_insert = check_real(samples_per_insert, "samples_per_insert", positive=True)
        self.min_size = check_int(min_size, "min_size", 1)
        self.error = check_real(error, "error", 1.0)
        self.timeout = _check_timeout(timeout)
        self.inserted = 0
        self.sampled = 0
        self._closed = False
        self._cond = threading.Condition()

    # -- the rule -------------------------------------------------------------------------

    @property
    def diff(self) -> float:
        """``inserted * samples_per_insert - sampled``: the learner's credit at the target ratio."""
        return self.inserted * self.samples_per_insert - self.sampled

    def can_sample(self, n: int) -> bool:
        """Whether a sample of ``n`` transitions may go now."""
        return self.inserted >= self.min_size and self.diff - n >= -self.error

    def can_insert(self, n: int) -> bool:
        """Whether an insert of ``n`` transitions may go now."""
        diff = self.diff
        return self.inserted < self.min_size or diff + n * self.samples_per_insert <= self.error or diff <= 0

    # -- the two sides ----------------------------------------------------------------------

    def sample(
        self, n: int, timeout: float | None = DEFAULT, count: bool = True, poll: Callable[[], None] | None = None
    ) -> None:
        """Wait until a sample of ``n`` may go (see :meth:`can_sample`), then count it (unless ``not count``).

        ``poll``: called every :data:`POLL_SECONDS` while waiting, outside the limiter's lock, for owners
        that learn of inserts by polling (a ring that other processes write: its owner counts what a poll
        finds with :meth:`count`).

        Raises:
            ValueError: ``n`` is not in ``[1, error]`` (a larger batch could wait on writers that wait on it).
            RateLimited: not allowed within ``timeout`` (default :attr:`timeout`), or closed.
        """
        n = check_int(n, "n", 1)
        if n > self.error:
            raise ValueError(
                f"a sample of n={n} is more than error={self.error:g}: it could wait on writers waiting on it; "
                "raise error= to at least the batch size"
            )
        self._wait(lambda: self.can_sample(n), "sample", n, timeout, poll, count)

    def insert(self, n: int, timeout: float | None = DEFAULT, count: bool = True) -> None:
        """Wait until an insert of ``n`` may go (see :meth:`can_insert`), then count it (unless ``not count``).

        Raises:
            ValueError: ``n`` is not >= 1.
            RateLimited: not allowed within ``timeout`` (default :attr:`timeout`), or closed.
        """
        n = check_int(n, "n", 1)
        self._wait(lambda: self.can_insert(n), "insert", n, timeout, None, count)

    @contextlib.contextmanager
    def admitted(self, side: str, n: int, count: bool = True, poll: Callable[[], None] | None = None) -> Iterator[None]:
        """A buffer's front door: wait until an ``"insert"`` or ``"sample"`` of ``n`` may go, count it, run the body.

        The call is counted as it is let go (so calls let go at once see each other) and taken back
        when the body raises (the buffer refused it): a refused call counts nothing. ``count=False``:
        the owner counts what it learns by polling (``poll`` as in :meth:`sample`).

        Raises:
            ValueError: ``side`` is neither, or ``n`` as in :meth:`sample` / :meth:`insert`.
            RateLimited: as there.
        """
        if side == "sample":
            self.sample(n, count=count, poll=poll)
        elif side == "insert":
            self.insert(n, count=count)
        else:
            raise ValueError(f"side must be 'insert' or 'sample', got {side!r}")
        try:
            yield
        except BaseException:
            if count:
                self._add(side, -n)
            raise

    def count(self, inserted: int = 0, sampled: int = 0) -> None:
        """Count transitions inserted and sampled without waiting (what a call let through by a wait did)."""
        inserted, sampled = check_int(inserted, "inserted", 0), check_int(sampled, "sampled", 0)
        with self._cond:
            self._add("insert", inserted)
            self._add("sample", sampled)

    def _add(self, side: str, n: int) -> None:
        """Count ``n`` (negative: take back) on ``side``; holds the lock or takes it."""
        with self._cond:
            if side == "sample":
                self.sampled += n
            else:
                self.inserted += n
            self._cond.notify_all()

    def _wait(
        self, allowed: Any, what: str, n: int, timeout: float | None, poll: Callable[[], None] | None, count: bool
    ) -> None:
        """Wait until ``allowed()``, and count the call (``count``) under the same hold of the lock."""
        timeout = self.timeout if timeout is DEFAULT else _check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if poll is not None:
                poll()  # outside the lock: the poll takes its owner's lock, which counts under ours
            with self._cond:
                if allowed():
                    if count:
                        self._add(what, n)
                    return
                if self._closed:
                    raise RateLimited(f"the rate limiter was closed while a {what} of {n} waited")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise RateLimited(
                        f"a {what} of {n} was not allowed within {timeout:g} s: inserted {self.inserted}, "
                        f"sampled {self.sampled}, samples_per_insert {self.samples_per_insert:g} ± "
                        f"{self.error:g}, min_size {self.min_size}"
                    )
                if poll is not None:
                    left = POLL_SECONDS if left is None else min(left, POLL_SECONDS)
                self._cond.wait(left)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Wake every waiter (each raises :class:`RateLimited`); later calls that would wait raise at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- checkpoints ------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The settings and both counters."""
        with self._cond:
            return {
                "samples_per_insert": self.samples_per_insert, "min_size": self.min_size, "error": self.error,
                "inserted": self.inserted, "sampled": self.sampled,
            }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from :meth:`state_dict`'s counters; settings must match (``ValueError`` naming the one that differs)."""
        for key in ("samples_per_insert", "min_size", "error"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"the rate limiter state has {key}={state.get(key)!r}, this one {getattr(self, key)!r}"
                )
        inserted = check_int(state.get("inserted"), "inserted", 0)
        sampled = check_int(state.get("sampled"), "sampled", 0)
        with self._cond:
            self.inserted, self.sampled = inserted, sampled
            self._cond.notify_all()

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickled, deep-copied) has the same settings, counters and timeout, and a lock of its own."""
        return {**self.state_dict(), "timeout": self.timeout}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["samples_per_insert"], state["error"], state["min_size"], state["timeout"])  # type: ignore[misc]
        self.load_state_dict(state)

    def __repr__(self) -> str:
        return (
            f"RateLimiter(samples_per_insert={self.samples_per_insert:g}, min_size={self.min_size}, "
            f"error={self.error:g}, inserted={self.inserted}, sampled={self.sampled})"
        )


def _check_timeout(timeout: float | None) -> float | None:
    if timeout is None:
        return None
    t = check_real(timeout, "timeout", 0.0, finite=False)
    return None if math.isinf(t) else t


__all__ = ["RateLimited", "RateLimiter"]
