"""RelaxedReplay: the next batches are drawn, and priority updates applied, behind the learner.

Strict PER runs a learner step as ``sample -> train -> update_priorities``, in
series. Relaxing the dependency between the update of step ``t`` and the
sample of step ``t + 1`` (Zhang, Meng, Prasanna, TPDS 2023) lets a worker
draw, gather and move the next batches, and write priorities, while the
learner trains: the step then costs ``max(T_replay, T_train)`` instead of
their sum.

**The schedule** is :mod:`hetero_replay.schedule`'s (staleness ``k``: the batch of
step ``t`` sees exactly the updates of steps ``<= t - k - 1``; late updates to
rewritten slots are dropped). It is a fixed order, not a race, so a seed
fixes every batch whatever the thread timing, and ``k = 0`` is strict PER (the
wrapped buffer is called directly). Serving the batch of step ``t`` releases
the draws of steps ``t + 1 .. t + d`` (``d = min(prefetch, k)``; the updates
they need are queued already).

**Which rows a batch drawn ahead holds.** A released batch is drawn from the
buffer as it is when the ``sample`` that released it returns, after the
updates it must see: rows written later (an :meth:`~RelaxedReplay.add`, SB3's
commit of staged rows) are not in it, and the write does not discard it.
They are in the batches released after the write. A write first completes the
released work (waiting for the worker, or doing it), so the order is fixed;
a slot the write rewrites keeps its old row in the batch already drawn, and
the update of that batch skips it (the epoch rule; counted in
:attr:`~RelaxedReplay.dropped_updates`). Batches drawn ahead are drawn again
only where the learner asks for it: another batch size, :meth:`~RelaxedReplay.flush`
(and what flushes: ``state_dict``, ``save``, pickling, the ``alpha`` and
``eps`` setters) and :attr:`~RelaxedReplay.rng`; then the generator is rewound
to where they began and the updates applied for them since the last write are
undone exactly.

**IS weights** of a relaxed batch are ``(p_min / p_i) ** beta`` of the
priorities it was drawn with, ``beta`` being the one of the ``sample`` call:
drawn at beta 1, raised in float32 as the C++ tree raises them (ahead, to the
buffer's beta, by whoever draws the batch; when served, where the call's beta differs).

**Errors** of a queued update (a NaN TD error, an index out of range) are
raised, naming the step, by the first ``sample`` whose batch the schedule
draws after that update (or by a :meth:`~RelaxedReplay.flush` that applies
it), whichever thread applied it; the bad update changes nothing and is
skipped, and the next call goes on. Anything else that stops the worker
thread (the wrapped buffer closed under it, a durable point failing in it) is
raised by the learner's next call, once.

**Executors** (``worker=``; the batches are the same in every one, bit for bit):

* ``"native"``: the released work runs as whole jobs on a C++ thread that
  never takes the GIL (:class:`hetero_replay._native.Executor`): apply the
  updates, draw from uniforms drawn here from the buffer's generator, raise the
  weights, gather the rows into a ring of ``2 * d + 1`` preallocated slots
  (registered with the executor once). The arrays of a
  served batch are the slot's: they stay valid until the learner has taken
  ``d + 1`` more batches (copy them to keep them longer; SB3 and Tianshou use
  a batch within its step). Update arrays are checked and copied when given
  (malformed ones are refused at once). It needs the C++ tree and host storage
  (:meth:`PrioritizedReplay.native_parts`); ring and disk storages check stamps
  and CRCs in Python, and device storages gather on the device, so they keep
  the Python executors. A buffer built with ``device=`` gets tensors: views of
  the slots on the CPU; on CUDA, copies of pinned slots made on the side stream
  (see :class:`_NativePipeline`).
* ``"thread"``: a Python worker thread; ``"inline"``: the learner's thread.
* ``"auto"`` (default): native where it applies. Where a core is idle for it,
  its jobs run on its thread, which, having run one in the last three intervals
  between samples (10-200 ms), looks for the next twice per interval: a steady
  learner loop wakes nobody, and finds its batch drawn. With every
  core busy the thread sleeps between jobs, and only jobs of
  ``NATIVE_HANDOVER_US`` of CPU time or more (median over ``AUTO_WINDOW`` jobs;
  CPU time, which a loaded machine's preemptions do not inflate) are worth
  its wake-up (~15 µs); smaller ones the learner runs when it collects them
  (in C++, without the GIL). Elsewhere inline until the replay work is
  ``AUTO_WORKER_SHARE`` of the learner's step, then the Python thread (there
  each GIL hand-over costs ~100 µs, which only a large share repays).

One worker per buffer, started when first needed, stopped by
:meth:`~RelaxedReplay.close`, by the context manager, when the buffer is
garbage collected, and at interpreter exit. After ``fork`` the child's buffer
is consistent (a native job in flight finishes before the fork) and starts
its own worker. **Devices**: with a CUDA learner the Python worker works on a
side CUDA stream and the learner's stream waits for a batch's copy before using it.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import check_batch_size
from hetero_replay.forksafe import PIPELINE, ForkSafeLock, holding_for_exit
from hetero_replay.options import PEROptions, StalenessOptions, check_beta
from hetero_replay.priorities import Priorities, PrioritySnapshot
from hetero_replay.replay import PrioritizedReplay, Sample
from hetero_replay.schedule import PendingUpdate, Schedule
from hetero_replay.storage import Schema
from hetero_replay.trees import SumTree

#: ``worker="auto"`` where the native executor cannot run (other trees, ring, disk or device storages): the
#: work moves to the Python thread once it is this share of the learner's step; below it, the GIL hand-overs
#: that thread costs (measured: ~0.2 ms a step on a 2-vCPU VM) outweigh the overlap.
AUTO_WORKER_SHARE = 0.25
#: Learner steps over which ``worker="auto"`` measures (medians, so rollout gaps do not count).
AUTO_WINDOW = 32
#: ``worker="auto"`` with the native executor: jobs that take at least this much CPU time (µs, median) are worth
#: waking its thread for; shorter ones go to it only while a core is idle for it (it then polls) and the learner
#: samples within the thread's polling span of its last sample, else the learner runs them (a futex wake-up of
#: another core costs the learner ~15 µs on a 2-vCPU VM).
NATIVE_HANDOVER_US = 25.0
#: The native executor copies the generator's state once per this many uniforms drawn (``_GeneratorMark``):
#: rewinding redraws at most about as many.
MARK_SPAN = 1 << 16


@dataclass(slots=True)
class _Drawn:
    """A batch drawn for learner ``step``, with what is needed to undo the draw."""

    step: int
    batch: Sample  # weights are p_min / p_i (beta 1), raised to the sample's beta when served
    batch_size: int
    # Where the generator was before the draw, in the executor's terms (``_rewind`` reads it): the state
    # itself for the Python executors, the uniforms drawn since the mark for the native one; None: kept nowhere.
    rewind_to: Any
    epoch: int
    ready_event: Any = None
    beta: float | None = None  # the beta ``weights`` are raised to, if any
    weights: Any = None
    job: _Job | None = None  # the native executor's job that draws it (``batch`` is set when collected)


@dataclass(slots=True)
class _Applied:
    """An update applied ahead of the next batch to serve, undone if that batch is redrawn."""

    update: PendingUpdate
    snapshot: PrioritySnapshot | None
    dropped: int


class _Wrapped:
    """A read-only attribute of the same name on the wrapped buffer (``self.replay``)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else getattr(obj.replay, self.name)

    def __set__(self, obj: Any, value: Any) -> None:
        raise AttributeError(f"{self.name} is the wrapped buffer's; RelaxedReplay does not change it")


class RelaxedReplay:
    """A :class:`~hetero_replay.replay.PrioritizedReplay` whose sampling and updates run behind the learner.

    Args:
        replay: the engine buffer to wrap (any tree backend, storage and
            device). From now on use it through this object only: adds made
            directly on it would bypass the schedule.
        staleness: ``k``, how many learner steps a priority update may lag:
            the batch of step ``t`` sees the updates of steps ``<= t - k - 1``.
            ``0`` is strict PER, exactly the wrapped buffer's samples. Or a
            ready :class:`~hetero_replay.options.StalenessOptions` (then
            ``prefetch`` and ``worker`` are its own).
        prefetch: how many batches the worker prepares ahead (at most ``k``
            can be: the updates later ones need are not given yet).
        worker: where the schedule's work runs: ``"native"``, a C++ thread
            without the GIL (C++ tree and host storage only: ``ValueError``
            elsewhere); ``"thread"``, a Python worker thread; ``"inline"``, the
            learner's thread (the same batches, no overlap); ``"auto"``
            (default), native where it applies, else inline until the replay
            work is at least ``AUTO_WORKER_SHARE`` of the learner's step
            (measured over ``AUTO_WINDOW`` steps), then the Python thread.
            Batches are the same in every mode: only the speed differs.

    The learner's loop is unchanged: ``sample`` -> train -> ``update_priorities``;
    ``sample`` returns a prepared batch and ``update_priorities`` returns at once.

    Example:
        >>> with RelaxedReplay(PrioritizedReplay(10_000, schema, seed=0), staleness=1) as buf:  # doctest: +SKIP
        ...     buf.add(rows)
        ...     batch = buf.sample(256)
        ...     buf.update_priorities(batch.indices, td_errors)
    """

    def __init__(
        self, replay: PrioritizedReplay, staleness: int | StalenessOptions = 1, prefetch: int = 1, worker: str = "auto"
    ) -> None:
        if not isinstance(replay, PrioritizedReplay):
            raise TypeError(f"replay must be a PrioritizedReplay, got {type(replay).__name__}")
        if not isinstance(staleness, StalenessOptions):
            staleness = StalenessOptions(staleness, prefetch, worker)
        #: The schedule's options (validated once, by :class:`~hetero_replay.options.StalenessOptions`).
        self.schedule_options = staleness
        native = staleness.worker in ("auto", "native") and replay.native_parts() is not None
        if staleness.worker == "native" and not native:
            raise ValueError(
                "worker='native' needs the C++ tree (tree='native') and host storage (storage='host'); "
                f"this buffer has {type(replay.tree).__name__} and {type(replay.storage).__name__}"
                f"{'' if replay.device is None else f' serving {replay.device}'}: use worker='auto'"
            )
        self.replay = replay
        core = _NativePipeline if native else _Pipeline
        self._core = core(replay, staleness) if staleness.staleness else None
        if self._core is not None:
            # The worker holds the core, never this object: collecting this object stops it.
            weakref.finalize(self, self._core.stop)

    # -- the learner's operations -------------------------------------------------------

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """The batch of the next learner step, as :meth:`PrioritizedReplay.sample` gives it.

        Raises what the wrapped buffer raises (nothing changes then), or the
        error of a queued update this batch needed (naming its step; the
        update is skipped, and the next call draws the batch). The wrapped
        buffer's rate limiter counts the batches the learner takes, not those
        drawn ahead.
        """
        if self._core is None:
            return self.replay.sample(batch_size, beta)
        n = check_batch_size(batch_size)
        b = self.replay.beta if beta is None else check_beta(beta)
        if self.replay.rate_limiter is None:
            return self._core.sample(n, b)
        with self.replay.rate_limited("sample", n):  # waits holding none of the schedule's locks
            return self._core.sample(n, b)

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """Queue new priorities ``(|td| + eps) ** alpha`` for the batch of the latest step; returns at once.

        The update is applied when the schedule says (see the module
        docstring), and skipped for slots written since the batch was drawn.
        Its errors (as :meth:`PrioritizedReplay.update_priorities`) are raised
        by the first :meth:`sample` that needs it applied, or by :meth:`flush`
        (lengths that differ: at once). The arrays are copied.
        """
        if self._core is None:
            self.replay.update_priorities(indices, td_errors)
            return
        self._core.update(indices, td_errors)

    def add(self, batch: Any) -> np.ndarray:
        """Append transitions (:meth:`PrioritizedReplay.add`); batches released after it see them.

        Batches drawn ahead stay as drawn (see the module docstring). With a rate
        limiter, it waits before the schedule's lock, which the learner's
        sample that lets it go needs.
        """
        if self._core is None:
            return self.replay.add(batch)
        if self.replay.rate_limiter is None:
            return self._core.write(self.replay.add, batch)
        rows = self.replay.storage.validate(batch)[0]  # refused before it waits
        with self.replay.rate_limited("insert", rows):
            return self._core.write(self.replay.add, batch)

    def write_rows(self, start: int, fields: Any) -> None:
        """:meth:`PrioritizedReplay.write_rows`, ordered with samples like :meth:`add`."""
        if self._core is None:
            self.replay.write_rows(start, fields)
        else:
            self._core.write(self.replay.write_rows, start, fields)

    def clear_priorities(self, indices: Any) -> None:
        """:meth:`PrioritizedReplay.clear_priorities`, ordered with samples like :meth:`add`."""
        if self._core is None:
            self.replay.clear_priorities(indices)
        else:
            self._core.write(self.replay.clear_priorities, indices)

    def leaves(self) -> np.ndarray:
        """:meth:`PrioritizedReplay.leaves`, every queued update applied first."""
        self._apply_queued()
        return self.replay.leaves()

    def writer(self) -> Any:
        """:meth:`PrioritizedReplay.writer`: writers' rows join at the learner's next call, as they would unwrapped."""
        return self.replay.writer()

    def read_rows(self, name: str, indices: Any) -> Any:
        """:meth:`PrioritizedReplay.read_rows` (rows change only in the learner's own writes)."""
        return self.replay.read_rows(name, indices)

    def view(self, name: str) -> Any:
        """:meth:`PrioritizedReplay.view`: a live view that bypasses locks and schedule."""
        return self.replay.view(name)

    def flush(self) -> None:
        """Apply every queued update now (a point of the schedule: batches after it see them all).

        Then :meth:`PrioritizedReplay.flush`: a durable point, where the storage makes them.
        """
        self._apply_queued()
        self.replay.flush()

    def _apply_queued(self) -> None:
        if self._core is not None:
            self._core.flush()

    # -- state ----------------------------------------------------------------------------

    @property
    def on_worker_thread(self) -> bool:
        """Whether the work runs on the worker thread now (``worker="auto"`` decides within its first steps).

        With the native executor: whether every job is handed to its thread; smaller ones go to it
        only while a core is idle for it.
        """
        return self._core is not None and self._core.on_worker()

    @property
    def dropped_updates(self) -> int:
        """Update entries skipped so far because their slot was rewritten after the batch was drawn."""
        return 0 if self._core is None else self._core.dropped

    @property
    def rng(self) -> np.random.Generator:
        """The wrapped buffer's generator, rewound to the schedule's state (batches drawn ahead are discarded)."""
        if self._core is not None:
            self._core.sync()
        return self.replay.rng

    def state_dict(self) -> dict[str, Any]:
        """:meth:`PrioritizedReplay.state_dict`, every queued update applied first."""
        self._apply_queued()
        return self.replay.state_dict()

    def load_state_dict(self, state: Any) -> None:
        """:meth:`PrioritizedReplay.load_state_dict`; queued updates are discarded (every slot is rewritten)."""
        if self._core is None:
            self.replay.load_state_dict(state)
        else:
            self._core.write(self.replay.load_state_dict, state, discard_updates=True)

    def save(self, path: Any) -> None:
        """:meth:`PrioritizedReplay.save`, every queued update applied first."""
        self._apply_queued()
        self.replay.save(path)

    @classmethod
    def load(cls, path: Any, staleness: int = 1, prefetch: int = 1, **kwargs: Any) -> RelaxedReplay:
        """A relaxed buffer over :meth:`PrioritizedReplay.load` (``kwargs`` go there)."""
        return cls(PrioritizedReplay.load(path, **kwargs), staleness, prefetch)

    def close(self) -> None:
        """Stop the worker (queued updates are discarded) and close the wrapped buffer."""
        if self._core is not None:
            self._core.stop()
        self.replay.close()

    def __enter__(self) -> RelaxedReplay:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        self._apply_queued()
        return {"replay": self.replay, "schedule": self.schedule_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["replay"], state["schedule"])  # type: ignore[misc]

    # -- the wrapped buffer's settings ----------------------------------------------------

    @property
    def alpha(self) -> float:
        return self.replay.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        self._apply_queued()  # queued updates are shaped by the alpha they were given under
        self.replay.alpha = value

    @property
    def eps(self) -> float:
        return self.replay.eps

    @eps.setter
    def eps(self, value: float) -> None:
        self._apply_queued()
        self.replay.eps = value

    @property
    def beta(self) -> float:
        return self.replay.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.replay.beta = value  # applied when a batch is served: nothing to flush

    # Read from the wrapped buffer as they are (nothing of the schedule changes them).
    max_priority: float = _Wrapped()  # type: ignore[assignment]
    capacity: int = _Wrapped()  # type: ignore[assignment]
    schema: Schema = _Wrapped()  # type: ignore[assignment]
    device: Any = _Wrapped()
    options: PEROptions = _Wrapped()  # type: ignore[assignment]
    priorities: Priorities = _Wrapped()  # type: ignore[assignment]
    tree: SumTree = _Wrapped()  # type: ignore[assignment]
    position: int = _Wrapped()  # type: ignore[assignment]
    filled: int = _Wrapped()  # type: ignore[assignment]
    closed: bool = _Wrapped()  # type: ignore[assignment]

    @property
    def staleness(self) -> int:
        return self.schedule_options.staleness

    @property
    def prefetch(self) -> int:
        return self.schedule_options.prefetch

    @property
    def worker(self) -> str:
        return self.schedule_options.worker

    def __len__(self) -> int:
        return len(self.replay)

    def __repr__(self) -> str:
        o = self.schedule_options
        return f"RelaxedReplay({self.replay!r}, staleness={o.staleness}, prefetch={o.prefetch}, worker={o.worker!r})"


class _Pipeline:
    """The schedule's state and its Python executor: the learner's thread, or a worker thread.

    Everything runs under one lock: the worker holds it for one job at a time
    (apply one update, or draw one batch), the learner for each call. The
    learner never waits on the worker otherwise: if the batch it asks for is
    not drawn yet, it draws it itself.

    **Released work.** Serving the batch of step ``t`` releases the draws of
    steps up to ``t + depth``, each after the held-back updates it must see.
    That work is defined by the state right after the serve: a learner call
    that changes the state (a write, a flush) first completes it, on its own
    thread if the worker has not (``_complete_released``).
    """

    _live: weakref.WeakSet[_Pipeline] = weakref.WeakSet()

    def __init__(self, replay: PrioritizedReplay, options: StalenessOptions) -> None:
        self.replay = replay
        self.depth = options.depth
        self.mode = options.worker
        self.threaded = self.mode == "thread"
        self.last_start: float | None = None  # of the previous sample (worker="auto" measures)
        self.intervals: list[float] = []
        self.works: list[float] = []
        self.lock = ForkSafeLock(PIPELINE)
        self.cond = threading.Condition(self.lock)  # type: ignore[arg-type]
        self.schedule = Schedule(options.staleness)
        self.batch_size: int | None = None  # of the latest sample: what the released draws draw
        self.hold = True  # nothing released until the learner samples (again, after a flush or a failed draw)
        self.ready: deque[_Drawn] = deque()
        # The worker draws (and reads rows) without holding `lock`, so a learner whose batch is ready
        # never waits behind a slow read; what changes the buffer's state waits for the draw instead.
        self.drawing = False
        self.drawing_from: dict[str, Any] = {}  # the generator's state before the draw under way
        self.undo: list[_Applied] = []
        self.schedule.epoch = replay.track_writes()
        self.dropped = 0
        self.errors: list[tuple[int, Exception]] = []  # (step, error) of updates that failed, in step order
        self.worker_error: Exception | None = None  # what stopped the worker thread, for the learner's next call
        self.stopping = False
        self.thread: threading.Thread | None = None
        self.streams = _Streams.for_device(replay.device)
        _Pipeline._live.add(self)

    # -- learner side -----------------------------------------------------------------------

    def sample(self, n: int, beta: float) -> Sample:
        start = time.perf_counter()
        with self.lock:
            self._raise_worker_error()
            if not (self.ready and self.ready[0].batch_size == n):
                self._quiesce()  # the batch may be the one being drawn, or the state is about to change
            drawn = self._next_ready()
            if drawn is not None and drawn.batch_size != n:
                self._rollback()  # another batch size: the batches drawn ahead are drawn again
                drawn = None
            self._raise_error(self.schedule.seen_by_next)  # an update this batch needs failed
            if drawn is None:
                self._catch_up()
                self._raise_error(self.schedule.seen_by_next)
                drawn = _Drawn(self.schedule.served, self._draw_here(n), n, None, self.replay.write_epoch)
            else:
                self.ready.popleft()
            self._serve(drawn, n)
            if self.mode == "auto" and not self.threaded:
                self._measure(start)
            self._release()
        batch = self.streams.receive(drawn)
        weights = drawn.weights if beta == drawn.beta else _raised(batch.weights, beta)  # raised already?
        return Sample(batch.data, batch.indices, weights)

    def _serve(self, drawn: _Drawn, n: int) -> None:
        """Give ``drawn`` (a batch of ``n`` rows) to the learner: the schedule's step moves on."""
        self.schedule.serve(drawn.epoch)
        self.batch_size, self.hold = n, False
        if self.undo:
            seen = self.schedule.seen_by_next
            while self.undo and self.undo[0].update.step <= seen:
                self.undo.pop(0)  # needed by the batch of the next step: no longer ahead of the schedule

    def update(self, indices: Any, td_errors: Any) -> None:
        idx, td = _copy(indices), _copy(td_errors)
        n_idx, n_td = _length(idx), _length(td)
        if n_idx is not None and n_td is not None and n_idx != n_td:
            raise ValueError(f"update_priorities: {n_idx} indices but {n_td} TD errors")
        event = self.streams.mark(td)
        with self.lock:
            self._raise_worker_error()
            # No wake-up: the update is applied with the draw that needs it, which a later sample releases.
            self.schedule.record(idx, td, event)

    def write(self, fn: Any, *args: Any, discard_updates: bool = False) -> Any:
        """Run a write of the wrapped buffer after the work the schedule released (batches drawn ahead stay)."""
        with self.lock:
            self._complete_released()
            if discard_updates:
                self._rollback()
                self.schedule.clear()
                self.errors.clear()
                self.hold = True
            else:
                self.undo.clear()  # applied before this write: a later redraw does not undo them
            result = fn(*args)
            if discard_updates:
                # Every slot now holds another transition: an update of a batch drawn before is dropped.
                self.replay.track_writes()  # (a fresh Priorities)
                self.schedule.epoch = -1
                self._rebuilt()
            return result

    def flush(self) -> None:
        with self.lock:
            self._complete_released()
            self._catch_up()
            while (update := self.schedule.next()) is not None:
                self._apply(update, ahead=False)
            self.hold = True  # nothing is drawn ahead until the next sample (state_dict, save copy after this)
            self._raise_error(self.schedule.served)

    def sync(self) -> None:
        with self.lock:
            self._complete_released()
            self._catch_up()
            self.hold = True

    def _measure(self, start: float) -> None:
        """``worker="auto"`` without a native executor: time the replay work done on the learner's thread.

        Handing work to a Python thread costs each step a few GIL hand-overs
        (tens of microseconds); it pays once the replay work it takes off the
        learner is a sizeable share of the learner's step.
        """
        now = time.perf_counter()
        if self.last_start is not None:
            self.intervals.append(start - self.last_start)
            self.works.append(now - start)
        self.last_start = start
        if len(self.intervals) == AUTO_WINDOW:
            share = float(np.median(self.works)) / max(float(np.median(self.intervals)), 1e-9)
            self.threaded = share >= AUTO_WORKER_SHARE
            self.intervals.clear()
            self.works.clear()

    def stop(self) -> None:
        if holding_for_exit():
            # The interpreter is exiting and this thread holds every buffer's lock (forksafe): the worker
            # cannot finish a draw or see `stopping`, and, a daemon, it ends with the process.
            self.stopping = True
            return
        with self.lock:
            self._quiesce()
            self.stopping = True
            self.cond.notify_all()
            thread = self.thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    # -- the executor: where released work runs (the native executor overrides these) ---------------

    def on_worker(self) -> bool:
        """Whether released work runs on a worker thread now."""
        return self.threaded

    def _next_ready(self) -> _Drawn | None:
        """The next batch drawn ahead, if any (left in ``ready``)."""
        return self.ready[0] if self.ready else None

    def _release(self) -> None:
        """After a serve: let the worker draw the released batches (inline: the next call completes them)."""
        if self.threaded:
            self._start_worker()
            self.cond.notify()

    def _complete_released(self) -> None:
        """Finish the work the schedule released (on this thread where the worker has not done it)."""
        self._quiesce()
        while (job := self._next_job()) is not None:
            job()

    def _rebuilt(self) -> None:
        """The wrapped buffer's state was replaced (load_state_dict)."""

    # -- the schedule ------------------------------------------------------------------------

    def _quiesce(self) -> None:
        """Wait (holding ``lock`` between waits) until no draw is under way on the worker."""
        while self.drawing:
            self.cond.wait()

    def _catch_up(self) -> None:
        """Bring the buffer to the state the schedule defines for the next step's draw."""
        self._rollback()
        while (update := self.schedule.due(self.schedule.served)) is not None:
            self._apply(update, ahead=False)

    def _rollback(self) -> None:
        """Discard batches drawn ahead, and undo the updates applied for them since the last write (newest first)."""
        for applied in reversed(self.undo):
            if applied.snapshot is not None:
                self.replay.restore_priorities(applied.snapshot)
            self.dropped -= applied.dropped
        if self.undo:
            self.schedule.put_back(applied.update for applied in self.undo)
            self.undo.clear()
        if self.ready:
            self._rewind(self.ready[0])
            self.ready.clear()

    def _rewind(self, drawn: _Drawn) -> None:
        """Put the generator back where it was before ``drawn`` was drawn (the learner's own draws keep nothing)."""
        if drawn.rewind_to is not None:
            self.replay.rng.bit_generator.state = drawn.rewind_to

    def _draw_here(self, n: int) -> Sample:
        """The learner draws the batch it asks for itself (nothing was drawn ahead for it)."""
        return self.replay.draw(n, 1.0)

    def _apply(self, update: PendingUpdate, ahead: bool) -> None:
        """Apply one update; ``ahead``: it precedes a batch drawn ahead, so keep what undoes it."""
        try:
            with self.streams.worker():
                self.streams.wait(update.ready_event)
                dropped, snapshot = self.replay.update_priorities_since(
                    update.indices, update.td_errors, update.epoch, keep_undo=ahead
                )
        except Exception as e:  # raised when the schedule needs this update; the engine changed nothing
            self.errors.append((update.step, e))
            return
        self.dropped += dropped
        if ahead:
            self.undo.append(_Applied(update, snapshot, dropped))

    def _released_steps(self) -> range:
        """The steps of the released batches still to draw, in order (empty while held or empty)."""
        if self.hold or self.batch_size is None or len(self.replay) == 0:
            return range(0)
        served = self.schedule.served
        return range(served + len(self.ready), served + self.depth)

    def _next_job(self) -> Any:
        """The next job of the released work, in schedule order, or ``None`` when there is none."""
        if self.drawing or not (steps := self._released_steps()):
            return None
        j = steps[0]
        update = self.schedule.due(j)
        if update is not None:
            return lambda: self._apply(update, ahead=update.step > self.schedule.seen_by_next)
        return lambda: self._draw(j)

    def _draw(self, step: int) -> None:
        """Draw the batch of ``step``. Called holding ``lock``; releases it while the buffer samples."""
        assert self.batch_size is not None
        n = self.batch_size
        state = dict(self.replay.rng.bit_generator.state)
        epoch = self.replay.write_epoch
        self.drawing, self.drawing_from = True, state
        self.lock.release()
        try:
            with self.streams.worker():
                batch = self.replay.draw(n, 1.0)
                beta = self.replay.beta  # most likely the next sample's: raise the weights here, off the learner
                weights = _raised(batch.weights, beta)
                event = self.streams.record()
        except Exception:  # the engine left the generator as it was; the learner's own draw will raise it
            batch = None
        finally:
            self.lock.acquire()
            self.drawing = False
            self.cond.notify_all()
        if batch is None:
            self.hold = True
            return
        self.ready.append(_Drawn(step, batch, n, state, epoch, event, beta, weights))

    def _raise_error(self, through: int) -> None:
        """Raise the error of a failed update of a step ``<= through``: where the schedule needs it.

        Whether the worker or the learner applied it, the same call raises, so runs do not
        depend on the timing (the failed update is skipped: the next call goes on).
        """
        self._raise_worker_error()
        if not self.errors or self.errors[0][0] > through:
            return
        step, e = self.errors.pop(0)
        _relay(e, f"priority update or draw of learner step {step} failed on the pipeline's worker: {e}")

    def _raise_worker_error(self) -> None:
        """Raise what stopped the worker thread (once: the next sample starts a new worker)."""
        if self.worker_error is not None:
            e, self.worker_error = self.worker_error, None
            _relay(e, f"the pipeline's worker thread stopped: {type(e).__name__}: {e}")

    # -- the worker thread -------------------------------------------------------------------

    def _start_worker(self) -> None:
        if self.thread is None and not self.stopping:
            self.thread = threading.Thread(target=self._run, name="hetero-replay-pipeline", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                try:
                    job = self._next_job()
                    while not self.stopping and job is None:
                        self.cond.wait()
                        job = self._next_job()
                    if self.stopping or job is None:
                        return
                    job()
                except Exception as e:  # the wrapped buffer closed, a durable point failed in it, ...
                    # Failed updates and draws are handled in the jobs; anything else ends this worker, and the
                    # learner's next call raises it (it must not vanish with the thread).
                    self.worker_error = e
                    self.hold = True
                    self.thread = None
                    self.cond.notify_all()
                    return

    def _after_fork_in_child(self) -> None:
        # The lock is fresh (ForkSafeLock) and no job was under way (the fork waited for it);
        # the worker thread does not exist here: the next sample starts one.
        self.cond = threading.Condition(self.lock)  # type: ignore[arg-type]
        self.thread = None
        if self.drawing:  # forked mid-draw: the batch stays in the parent, so its draw is undone here
            self.replay.rng.bit_generator.state = self.drawing_from
            self.drawing = False


class _GeneratorMark:
    """Where the native executor's draws began in the buffer's generator, without a copy of its state per draw.

    A copy of a generator's state is a dict built anew (~12 µs of a learner step, whose caches are cold).
    One is taken at most once per ``MARK_SPAN`` uniforms, at a draw no batch drawn ahead precedes, and each
    batch drawn ahead records how many uniforms were drawn since: rewinding to it restores the copy and draws
    that many again (the same stream). A draw of the generator elsewhere (the learner's own) ends the count
    (:meth:`forget`): the next draw takes a fresh copy.
    """

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        self.state: Mapping[str, Any] | None = None
        self.drawn = 0  # uniforms drawn since the copy was taken

    def before_draw(self, first: bool) -> int:
        """Before the executor draws: how many uniforms it drew since the copy. ``first``: no batch drawn ahead
        precedes this one (only then may the copy move)."""
        if self.state is None or (first and self.drawn >= MARK_SPAN):
            assert first, "a batch drawn ahead would lose its place in the stream"
            self.state, self.drawn = self.rng.bit_generator.state, 0
        return self.drawn

    def drew(self, n: int) -> None:
        """The executor drew ``n`` uniforms."""
        self.drawn += n

    def rewind(self, at: int) -> None:
        """Put the generator where :meth:`before_draw` returned ``at``."""
        assert self.state is not None
        self.rng.bit_generator.state = self.state
        left = at
        while left:
            left -= len(self.rng.random(min(left, MARK_SPAN)))
        self.drawn = at

    def forget(self) -> None:
        """The generator moved outside the count."""
        self.state = None


@dataclass(slots=True)
class _Slot:
    """One output slot of the native executor's ring."""

    arrays: list[np.ndarray]  # what the executor writes: indices, weights at beta 1 and raised, one array per field
    tensors: list[Any] | None = None  # the same memory as CPU tensors (torch batches; pinned for a CUDA learner)
    copied: Any = None  # CUDA event after the copies out of the slot: waited for before it is rewritten
    data: dict[str, np.ndarray] = field(default_factory=dict)  # the fields' arrays by name


@dataclass(slots=True)
class _Job:
    """A released batch handed to the native executor: the updates it applies first, and its output slot."""

    updates: list[tuple[PendingUpdate, np.ndarray | None, np.ndarray | None]]  # (update, undo indices, undo leaves)
    slot: _Slot
    done: bool = False  # collected


class _NativePipeline(_Pipeline):
    """The schedule run by the native executor (:class:`hetero_replay._native.Executor`): no Python, no GIL.

    Serving a batch releases the next ones as whole jobs (the updates they
    must see, uniforms drawn here from the buffer's generator, an output slot);
    the executor's thread runs them in order while the learner trains, and the
    learner collects each when it needs it. Batches are those of the Python
    executor bit for bit: the same updates in the same order, the same
    uniforms, the same tree and gather code.

    **Slots.** A ring of ``2 * depth + 1`` preallocated arrays per field: the
    arrays of a served batch are rewritten by the draw the learner's
    ``depth + 1``-th next sample releases, so they stay valid until then.

    **Torch learners** (a buffer built with ``device=``): the slots are CPU
    tensors the executor writes through NumPy views. A CPU learner gets those
    tensors (no copy). A CUDA learner's slots are pinned: a done job's rows
    and weights are copied to the device on the side stream, and the
    learner's stream waits for that copy's event (``_Streams.receive``); the
    learner starts the copy of the next batch as soon as its job is done (at
    its ``update_priorities``), so it overlaps training. A slot is rewritten
    only after its copy completed. TD errors on the device are copied back on
    the side stream into pinned memory, after an event on the learner's
    stream; the job that applies them waits for that copy first (by then it
    has long completed: the update is applied one step later at the earliest).
    """

    def __init__(self, replay: PrioritizedReplay, options: StalenessOptions) -> None:
        super().__init__(replay, options)
        self.threaded = True
        # "auto" measures its jobs first: until then they go to the thread only where a core is idle for it.
        self.wake = self.mode == "native"
        self.run_ns: list[int] = []
        self.slots: list[_Slot | None] = [None] * (2 * self.depth + 1)
        self.next_slot = 0
        self._rebuilt()

    def _rebuilt(self) -> None:
        parts = self.replay.native_parts()
        assert parts is not None
        tree, fields, written_at = parts
        self.device = self.replay.device  # None: NumPy batches
        old = getattr(self, "executor", None)
        if old is not None:
            old.stop()
        self.executor = _native.Executor(tree, fields, written_at)
        self.leaf_dtype = self.replay.tree.dtype  # of the undo leaves a job keeps
        self.fields = [(name, f.shape, f.dtype) for name, f in self.replay.schema.items()]
        self.names = [name for name, _, _ in self.fields]
        self.slots = [None] * len(self.slots)
        self.mark = _GeneratorMark(self.replay.rng)  # (load_state_dict set the generator's state)

    def sample(self, n: int, beta: float) -> Sample:
        """The steady state's short way: the next batch was released at this size and nothing failed.

        Its job is collected, the batch served and the next draws released, as
        :meth:`_Pipeline.sample` does them; anything else (another size, an
        error, nothing drawn ahead, a CUDA learner) takes that general way.
        The learner's thread runs this every step: each Python operation here
        costs it ~0.1-0.3 µs, a B = 64 job's whole work ~5 µs.
        """
        with self.lock:
            ready = self.ready
            if self.streams.stream is not None or not ready or ready[0].batch_size != n:
                return super().sample(n, beta)
            drawn = ready[0]
            job = drawn.job
            if job is not None and not job.done:
                self._collect(0)
            if self.errors or self.worker_error is not None or not ready or ready[0] is not drawn:
                return super().sample(n, beta)  # raises what failed where the schedule needs it
            ready.popleft()
            self._serve(drawn, n)
            self._release()
        batch = drawn.batch
        return Sample(batch.data, batch.indices, drawn.weights if beta == drawn.beta else _raised(batch.weights, beta))

    def update(self, indices: Any, td_errors: Any) -> None:
        copied = None
        if self.streams.stream is not None and getattr(td_errors, "is_cuda", False):
            # Checked from its metadata (no device sync), then copied off the device behind the learner's work.
            if td_errors.ndim != 1:
                raise ValueError(f"update_priorities: td_errors must be 1-D, got {td_errors.ndim}-D")
            idx, _ = _host_update(indices, np.empty(len(td_errors), _td_kind(td_errors)))
            td, copied = self.streams.to_host(td_errors.detach(), np.float64)
        else:
            idx, td = _host_update(indices, td_errors)
        with self.lock:
            self.schedule.record(idx, td, copied)
            if self.streams.stream is not None:
                self._collect_finished()  # the next batch's copy to the device overlaps the rest of this step

    def _collect_finished(self) -> None:
        """Collect the jobs done so far, in order, without waiting for one."""
        for i, drawn in enumerate(self.ready):
            if drawn.job is None or drawn.job.done:
                continue
            if self.executor.finished == 0:
                return
            self._collect(i)
            if i >= len(self.ready) or self.ready[i] is not drawn:  # a failed draw dropped the rest
                return

    def on_worker(self) -> bool:
        return self.wake

    def _next_ready(self) -> _Drawn | None:
        while self.ready and self.ready[0].job is not None and not self.ready[0].job.done:
            self._collect(0)  # a failed draw leaves ready shorter
        return self.ready[0] if self.ready else None

    def _release(self) -> None:
        for step in self._released_steps():
            self._submit(step)

    def _complete_released(self) -> None:
        i = 0
        while i < len(self.ready):
            job = self.ready[i].job
            if job is not None and not job.done:
                self._collect(i)
            i += 1

    def _quiesce(self) -> None:
        self._complete_released()

    def _submit(self, step: int) -> None:
        """Hand the draw of ``step`` and the updates due for it to the executor."""
        assert self.batch_size is not None
        n = self.batch_size
        updates: list[tuple[PendingUpdate, np.ndarray | None, np.ndarray | None]] = []
        seen = self.schedule.seen_by_next
        while (update := self.schedule.due(step)) is not None:
            if update.ready_event is not None:
                update.ready_event.synchronize()  # its TD errors' copy off the device (long done by now)
            if update.step > seen:  # ahead of the batch served next: keep its undo
                k = len(update.indices)
                updates.append((update, np.empty(k, np.int64), np.empty(k, self.leaf_dtype)))
            else:
                updates.append((update, None, None))
        i, slot = self._slot(n)
        at = self.mark.before_draw(first=not self.ready)
        priorities = self.replay.priorities
        # The weights are raised to the buffer's beta in the job too (most likely the next sample's), as the Python
        # executors raise them; tensor batches raise theirs with torch when served, as those executors do.
        raise_to = priorities.beta if slot.tensors is None else None
        self.executor.submit(
            [(u.indices, u.td_errors, u.epoch, ui, ul) for u, ui, ul in updates],
            self.replay.rng,
            n,
            i,
            raise_to,
            priorities.stratified,
            priorities.alpha,
            priorities.eps,
            self.replay.filled,
            self.wake,
        )
        self.mark.drew(n)
        self.ready.append(_Drawn(step, None, n, at, priorities.write_epoch, beta=raise_to, job=_Job(updates, slot)))  # type: ignore[arg-type]

    def _rewind(self, drawn: _Drawn) -> None:
        self.mark.rewind(drawn.rewind_to)

    def _draw_here(self, n: int) -> Sample:
        self.mark.forget()  # the generator moves outside the executor's count
        return super()._draw_here(n)

    def _slot(self, n: int) -> tuple[int, _Slot]:
        """The next slot of the ring and its index, holding ``n`` rows (once the copies out of it are done)."""
        i = self.next_slot
        self.next_slot = (i + 1) % len(self.slots)
        slot = self.slots[i]
        if slot is not None and slot.copied is not None:
            slot.copied.synchronize()
            slot.copied = None
        if slot is None or len(slot.arrays[0]) != n:
            arrays: list[np.ndarray] = [np.empty(n, np.int64), np.empty(n, np.float32), np.empty(n, np.float32)]
            arrays += [np.empty((n, *shape), dtype) for _, shape, dtype in self.fields]
            slot = (
                _Slot(arrays) if self.device is None else _tensor_slot(arrays, pinned=self.streams.stream is not None)
            )
            slot.data = dict(zip(self.names, slot.arrays[3:]))
            self.executor.set_slot(i, slot.arrays, n)
            self.slots[i] = slot
        return i, slot

    def _deliver(self, drawn: _Drawn) -> Sample:
        """A done job's batch: its slot's arrays, or tensors of them, or (CUDA) their copies on the device."""
        assert drawn.job is not None
        slot = drawn.job.slot
        if slot.tensors is None:
            return Sample(dict(slot.data), slot.arrays[0], slot.arrays[1])
        t_idx, t_weights, _, *t_fields = slot.tensors  # indices stay where the (host) tree is, as the engine gives them
        if self.streams.stream is not None:
            with self.streams.worker():
                t_weights = t_weights.to(self.device, non_blocking=True)
                t_fields = [f.to(self.device, non_blocking=True) for f in t_fields]
            slot.copied = drawn.ready_event = self.streams.record()
        return Sample(dict(zip(self.names, t_fields)), t_idx, t_weights)

    def _collect(self, i: int) -> None:
        """Wait for the job of ``ready[i]`` (all before it are collected) and take in its results."""
        drawn = self.ready[i]
        job = drawn.job
        assert job is not None
        results, draw_error, run_ns = self.executor.collect()
        job.done = True
        if self.mode == "auto":
            self._measure_job(run_ns)
        priorities = self.replay.priorities
        for (update, undo_idx, undo_leaves), (dropped, kept, max_raw, error) in zip(job.updates, results):
            if error is not None:
                self.errors.append((update.step, _native_error(error)))
                continue
            snapshot = None
            if undo_idx is not None and undo_leaves is not None:
                snapshot = PrioritySnapshot(undo_idx[:kept], undo_leaves[:kept], priorities.max_priority)
            priorities.note_update(max_raw)
            self.dropped += dropped
            if undo_idx is not None:
                self.undo.append(_Applied(update, snapshot, dropped))
        if draw_error is not None:  # as the Python executor: nothing is drawn after a failed draw
            self._abandon_after(i)
            return
        drawn.batch = self._deliver(drawn)
        if drawn.beta is None:  # tensors: raised when served
            drawn.weights, drawn.beta = drawn.batch.weights, 1.0
        else:
            drawn.weights = job.slot.arrays[2]  # raised by the job

    def _measure_job(self, run_ns: int) -> None:
        """``worker="auto"``: wake the executor's thread for the next jobs (with every core busy too) only if they
        are worth a wake-up."""
        self.run_ns.append(run_ns)
        if len(self.run_ns) == AUTO_WINDOW:
            self.wake = float(np.median(self.run_ns)) >= NATIVE_HANDOVER_US * 1e3
            self.run_ns.clear()

    def _abandon_after(self, i: int) -> None:
        """``ready[i]``'s draw failed: drop it, and undo the jobs after it as if they had never run.

        (The Python executor draws nothing after a failed draw; the learner's own draw raises.)
        """
        for later in list(self.ready)[i + 1 :]:
            if later.job is not None and not later.job.done:
                self._collect(self.ready.index(later))
        later_jobs = [d.job for d in list(self.ready)[i + 1 :] if d.job is not None]
        took = [update for job in later_jobs for update, _, _ in job.updates]
        ids, steps = {id(u) for u in took}, {u.step for u in took}
        for applied in reversed(self.undo):
            if id(applied.update) in ids:
                assert applied.snapshot is not None
                self.replay.restore_priorities(applied.snapshot)
                self.dropped -= applied.dropped
        self.undo = [a for a in self.undo if id(a.update) not in ids]
        self.errors = [(step, e) for step, e in self.errors if step not in steps]
        self.schedule.put_back(took)
        self._rewind(self.ready[i])
        while len(self.ready) > i:
            self.ready.pop()
        self.hold = True

    def stop(self) -> None:
        self.executor.stop()
        super().stop()


def _relay(e: Exception, message: str) -> NoReturn:
    """Raise ``message`` from the worker's error ``e``: as its own type where callers catch that, else RuntimeError."""
    if isinstance(e, OSError):  # a full disk, a lost device: the errno and the file stay
        raise (OSError(message) if e.errno is None else OSError(e.errno, message, e.filename)) from e
    if isinstance(e, (ValueError, TypeError, IndexError)):
        raise type(e)(message) from e
    raise RuntimeError(message) from e


def _after_fork_in_child() -> None:
    for pipeline in list(_Pipeline._live):
        pipeline._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _native_error(error: tuple[int, str]) -> Exception:
    """The exception a native job's ``(kind, message)`` stands for: what the engine would have raised."""
    kind, message = error
    return ValueError(message) if kind == 1 else IndexError(message) if kind == 2 else RuntimeError(message)


def _raised(weights: Any, beta: float) -> Any:
    """IS weights at ``beta`` from those at beta 1: for NumPy weights, in float32 as the C++ tree raises them
    (the native executor raises them so too); tensors with torch's ``pow``."""
    if beta == 1.0:
        return weights
    if type(weights) is np.ndarray:
        return _native.raised_weights(weights, beta)
    return weights**beta


def _tensor_slot(arrays: list[np.ndarray], pinned: bool) -> _Slot:
    """A slot whose memory is CPU tensors (page-locked if ``pinned``), the executor writing their NumPy views."""
    import torch

    tensors = [torch.from_numpy(a) for a in arrays]
    if pinned:
        tensors = [t.pin_memory() for t in tensors]
    return _Slot([t.numpy() for t in tensors], tensors)


def _td_kind(td_errors: Any) -> Any:
    """The NumPy dtype standing for a tensor's dtype in :func:`_host_update`'s checks."""
    dtype = td_errors.dtype
    if dtype.is_floating_point:
        return np.float64
    if dtype.is_complex:
        return np.complex128
    return np.bool_ if str(dtype) == "torch.bool" else np.int64


def _host_update(indices: Any, td_errors: Any) -> tuple[np.ndarray, np.ndarray]:
    """Copies of an update's arrays as the native executor reads them: 1-D int64 indices, float64 TD errors.

    Arrays that cannot be (not 1-D, not integers / real numbers, lengths
    that differ) are refused here, naming the argument, before anything is queued.
    """
    return _native.update_copies(_on_host(indices), _on_host(td_errors))


def _on_host(x: Any) -> Any:
    """``x`` as it is, or for a tensor its NumPy view on the host (a copy, off a device)."""
    if type(x) is np.ndarray or not hasattr(x, "detach"):
        return x
    return x.detach().cpu().numpy()


def _copy(x: Any) -> Any:
    """The learner's array, copied (the caller may reuse it); tensors detached."""
    if hasattr(x, "detach"):
        return x.detach().clone()
    return np.array(x, copy=True)


def _length(x: Any) -> int | None:
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    return math.prod(shape)  # not np.prod: ~20x slower on a tuple, and this runs every step


class _Streams:
    """Where the worker's device work goes: nowhere special on the CPU, a side stream with CUDA."""

    def __init__(self, stream: Any = None) -> None:
        self.stream = stream

    @classmethod
    def for_device(cls, device: Any) -> _Streams:
        if device is None or getattr(device, "type", str(device).split(":")[0]) != "cuda":
            return cls()
        import torch

        return cls(torch.cuda.Stream(device=device))

    def worker(self) -> Any:
        """Context for the worker's jobs: the side stream, if any."""
        if self.stream is None:
            return contextlib.nullcontext()
        import torch

        return torch.cuda.stream(self.stream)

    def record(self) -> Any:
        """An event after the work queued so far on the side stream."""
        if self.stream is None:
            return None
        import torch

        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def mark(self, x: Any) -> Any:
        """An event on the learner's stream after ``x`` (a CUDA tensor) is computed."""
        if self.stream is None or not getattr(x, "is_cuda", False):
            return None
        import torch

        event = torch.cuda.Event()
        event.record()
        return event

    def wait(self, event: Any) -> None:
        """Make the worker's stream wait for a learner's event."""
        if event is not None and self.stream is not None:
            self.stream.wait_event(event)

    def to_host(self, x: Any, dtype: Any) -> tuple[np.ndarray, Any]:
        """``x`` (a CUDA tensor) copied into page-locked host memory as ``dtype`` on the side stream, after
        what the learner's stream has queued so far; returns ``(array, event after the copy)``."""
        import torch

        produced = torch.cuda.Event()
        produced.record()
        host = torch.empty(x.shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, pin_memory=True)
        with torch.cuda.stream(self.stream):
            self.stream.wait_event(produced)
            host.copy_(x, non_blocking=True)
            x.record_stream(self.stream)  # the allocator must not reuse x before the copy read it
        copied = torch.cuda.Event()
        copied.record(self.stream)
        return host.numpy(), copied

    def receive(self, drawn: _Drawn) -> Sample:
        """The batch, safe to use on the learner's stream."""
        if drawn.ready_event is None:
            return drawn.batch
        import torch

        current = torch.cuda.current_stream()
        current.wait_event(drawn.ready_event)
        for t in [*drawn.batch.data.values(), drawn.batch.indices, drawn.batch.weights]:
            if isinstance(t, torch.Tensor) and t.is_cuda:
                t.record_stream(current)  # the allocator must not reuse it while the learner's stream reads it
        return drawn.batch


__all__ = ["AUTO_WINDOW", "AUTO_WORKER_SHARE", "NATIVE_HANDOVER_US", "RelaxedReplay"]
