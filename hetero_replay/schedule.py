"""The staleness schedule, written once: which priority updates each batch sees.

Strict PER runs a learner step as ``sample -> train -> update_priorities``, in
series. Relaxing the dependency between the update of step ``t`` and the
sample of step ``t + 1`` (Zhang, Meng, Prasanna, TPDS 2023) lets replay work
overlap training. This module states the order that relaxation keeps, so that
every replay relaxes it the same way and a seed still fixes every batch:

* **Steps.** Learner step ``t`` is the ``t``-th batch served (counting from 0);
  an update belongs to the step of the latest batch served before it.
* **The rule (staleness k).** The batch of step ``t`` is drawn after exactly the
  updates of steps ``<= t - k - 1`` have been applied, and before any later
  one. ``k = 0`` is strict PER.
* **Late updates to rewritten slots are dropped.** Each batch carries the write
  epoch it was drawn at, and so does its update; an update entry whose slot was
  written after that epoch would land on another transition, so it is skipped
  and counted (:meth:`hetero_replay.priorities.Priorities.update_since`).
* **Exact undo.** An update applied early for a batch drawn ahead is undone
  exactly when a write discards that batch (a sum tree depends only on its
  leaves: :class:`~hetero_replay.priorities.PrioritySnapshot`).

:class:`Schedule` holds the step counter, the held-back updates and the rule;
the executors decide only *where* the work runs, never *which* updates a batch
sees:

* inline and thread: :class:`hetero_replay.pipeline.RelaxedReplay` (the learner's
  thread, or a worker thread while the learner trains), and the Tianshou
  wrapper (the learner's thread);
* sharded: :class:`hetero_replay.distributed.ShardedReplay`, where the updates a
  batch must not see yet ride on the shards' draw calls, applied after serving.

Its options are :class:`~hetero_replay.options.StalenessOptions`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class PendingUpdate:
    """A priority update waiting for its turn: learner ``step``, its batch's write ``epoch``.

    ``ready_event``: a CUDA event the TD errors' producer recorded (``None`` on the CPU).
    """

    step: int
    indices: Any
    td_errors: Any
    epoch: int
    ready_event: Any = None


class Schedule:
    """The staleness schedule's state: batches served, updates held back, and the rule.

    Not thread-safe by itself: each executor calls it under its own lock.

    Args:
        staleness: ``k`` (see the module docstring), already checked
            (:class:`~hetero_replay.options.StalenessOptions`).
    """

    def __init__(self, staleness: int) -> None:
        self.staleness = staleness
        #: Batches served so far: the step of the next batch.
        self.served = 0
        #: The write epoch of the latest batch served: its update carries it.
        self.epoch = 0
        self._queue: deque[PendingUpdate] = deque()

    def last_seen(self, step: int) -> int:
        """The last step whose updates the batch of ``step`` sees: ``step - k - 1``."""
        return step - self.staleness - 1

    @property
    def seen_by_next(self) -> int:
        """The last step whose updates the next batch to serve sees."""
        return self.last_seen(self.served)

    def serve(self, epoch: int) -> int:
        """Record that the batch of the next step, drawn at write ``epoch``, goes to the learner; return its step."""
        step = self.served
        self.served += 1
        self.epoch = epoch
        return step

    def record(self, indices: Any, td_errors: Any, ready_event: Any = None) -> PendingUpdate:
        """Hold back the update of the latest batch served (its step and epoch are the schedule's)."""
        update = PendingUpdate(self.served - 1, indices, td_errors, self.epoch, ready_event)
        self._queue.append(update)
        return update

    def due(self, step: int) -> PendingUpdate | None:
        """Pop the oldest held-back update if the batch of ``step`` must see it, else ``None``."""
        if self._queue and self._queue[0].step <= self.last_seen(step):
            return self._queue.popleft()
        return None

    def next(self) -> PendingUpdate | None:
        """Pop the oldest held-back update, whether due or not (a flush applies them all)."""
        return self._queue.popleft() if self._queue else None

    def put_back(self, updates: Iterable[PendingUpdate]) -> None:
        """Return ``updates`` (in step order) to the front, ahead of those still held back (undone ones)."""
        self._queue.extendleft(reversed(list(updates)))

    def clear(self) -> None:
        """Forget every held-back update (every slot was rewritten: none could apply)."""
        self._queue.clear()

    def __len__(self) -> int:
        """Updates held back."""
        return len(self._queue)


__all__ = ["PendingUpdate", "Schedule"]
