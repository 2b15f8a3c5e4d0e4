"""PrioritizedReplay: transitions in a storage, their priorities in a sum tree.

The buffer pairs a :class:`~hetero_replay.priorities.Priorities` (the PER
rules: alpha, beta, eps, the max priority, IS weights) with a storage (where
rows live, :mod:`hetero_replay.storage`) and keeps the ring's write position.

Placement: by default transitions live in NumPy arrays on the host and
batches come back as NumPy arrays. With ``storage=`` a torch device (or
``"pinned"``) and/or ``device=`` the learner's device, batches come back as
torch tensors already on that device (see
:class:`~hetero_replay.torch_batches.TorchBatches`); with a device tree
(``tree="torch"`` or ``"cupy"`` and ``tree_device=``), sampling and priority
updates run there too. :class:`hetero_replay.placement.Placement` builds these
arguments from a device per primitive.

Threads and processes: every public method may be called from several threads
at once. Each takes the buffer's lock, so an ``add`` is never seen half
written, no row is lost, and a sample never returns a slot that was not
written. Before ``fork`` every live buffer's lock is taken (operations in
flight finish first), so a child process gets a consistent, usable buffer.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from hetero_replay import _native
from hetero_replay.checks import check_batch_size, check_int, check_seed, is_int
from hetero_replay.forksafe import INNER, ForkSafeLock
from hetero_replay.options import DEFAULT_EPS, UNSET, PEROptions, check_beta
from hetero_replay.priorities import Priorities, PrioritySnapshot
from hetero_replay.protocol import Sample
from hetero_replay.rate_limiter import RateLimiter
from hetero_replay.storage import (
    DEFAULT_STORAGE,
    HOST,
    DeviceStorage,
    DurableStorage,
    HostStorage,
    RecordRing,
    RingStorage,
    Schema,
    Storage,
    checkpoint,
    durable_point,
    make_storage,
)
from hetero_replay.storage.codec import CompressedFields, absent_rows, parse_settings, storage_options_of
from hetero_replay.trees import SumTree
from hetero_replay.trees.base import MAX_CAPACITY
from hetero_replay.trees.numpy_tree import as_indices

#: A ring whose rows keep changing under :meth:`PrioritizedReplay.sample`: it gives up after this
#: many draws *and* this many seconds. The time bound is for a learner stalled a moment (a busy or
#: stolen core) while writers run on: they lap the ring within each draw, and the count alone ends
#: in microseconds what a pause of milliseconds caused.
_MAX_REDRAWS = 64
_REDRAW_PATIENCE_S = 2.0
#: What :meth:`PrioritizedReplay.rate_limited` gives when nothing waits (stateless, so one serves every call).
_LET_THROUGH = contextlib.nullcontext()


class PrioritizedReplay:
    """A prioritized replay buffer over a fixed schema of transition fields.

    Args:
        capacity: transitions kept, in ``[1, 2**40]``; the oldest is overwritten first.
        schema: ``{name: (shape, dtype)}``, a :class:`~hetero_replay.storage.Schema`,
            or ``Schema.from_spaces(env.observation_space, env.action_space)``.
        alpha, beta, eps, tree, fanout, priority_dtype, stratified: the PER
            options, documented once in :class:`~hetero_replay.options.PEROptions`
            (defaults 0.6, 0.4, 1e-6, ``"auto"``, 16, ``"float32"``, ``True``).
        seed: seed of the buffer's own ``numpy.random.Generator``; the same seed
            and the same calls give the same samples.
        options: a ready :class:`~hetero_replay.options.PEROptions`; keyword
            arguments given as well override its fields.
        tree_device: where a device tree lives (``tree="torch"``: any torch
            device; ``"cupy"``: a CUDA device); ``None`` for the CPU trees.
        storage: where transitions live: ``"host"`` (NumPy, the default), or
            another registered storage (``"pinned"``, a torch device such as
            ``"cpu"`` or ``"cuda"``; see :func:`hetero_replay.registry.storages`).
        device: the learner's torch device. When set, or when ``storage`` is
            a torch placement, :meth:`sample` returns torch tensors already on this
            device (default: the storage's device); :attr:`device` says which.
        storage_options: keyword arguments of the storage: ``"shared"`` takes
            ``dir`` (where its segment file goes); ``"disk"`` takes ``path`` (a
            directory, required), ``ram_bytes``, ``read_threads``,
            ``flush_every``, ``flush_seconds`` and ``reopen`` (see
            :class:`~hetero_replay.storage.disk.DiskStorage`).
        rate_limiter: a :class:`~hetero_replay.rate_limiter.RateLimiter` this buffer's front doors ask:
            :meth:`sample` waits while the learner is ahead of its samples-per-insert ratio (or fewer
            than ``min_size`` rows are in) and :meth:`add` while the writers are; either raises
            :class:`~hetero_replay.rate_limiter.RateLimited` after the limiter's ``timeout``. Rows that
            writer processes add (:meth:`writer`) are counted when this learner polls them (every call,
            and while a sample waits); those writers are not held back. Its counters are part of
            :meth:`state_dict`, :meth:`save` and durable points; :meth:`close` closes it (waiters wake).
            In one thread that both adds and samples, a wait can only end in ``RateLimited``.

    Storages other processes write (``"shared"``, ``"disk"``): :meth:`writer`
    gives actor processes a handle to add rows concurrently with this learner;
    their rows join the tree (with the max priority) at the learner's next call,
    and a row being rewritten is never served (:mod:`hetero_replay.storage.ring`).
    A ``"disk"`` buffer makes durable points and is reopened after a crash with
    :meth:`reopen`.

    Example:
        >>> buf = PrioritizedReplay(1000, {"obs": ((4,), "float32"), "reward": ((), "float32")}, seed=0)
        >>> idx = buf.add({"obs": np.zeros((8, 4)), "reward": np.ones(8)})
        >>> batch = buf.sample(4)
        >>> buf.update_priorities(batch.indices, np.abs(np.random.randn(4)))
    """

    def __init__(
        self,
        capacity: int,
        schema: Schema | Mapping[str, Any],
        alpha: float = UNSET,
        beta: float = UNSET,
        eps: float = UNSET,
        tree: str = UNSET,
        fanout: int = UNSET,
        priority_dtype: Any = UNSET,
        stratified: bool = UNSET,
        seed: int | None = None,
        *,
        options: PEROptions | None = None,
        tree_device: Any = None,
        storage: str = DEFAULT_STORAGE,
        device: Any = None,
        storage_options: Mapping[str, Any] | None = None,
        rate_limiter: RateLimiter | None = None,
    ) -> None:
        capacity = check_int(capacity, "capacity", 1, MAX_CAPACITY)
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter, got {type(rate_limiter).__name__}")
        self.options = PEROptions.of(
            options, alpha=alpha, beta=beta, eps=eps, tree=tree, fanout=fanout,
            priority_dtype=priority_dtype, stratified=stratified,
        )  # fmt: skip
        self.capacity = int(capacity)
        self.rng = np.random.default_rng(check_seed(seed))
        self.priorities = Priorities(self.capacity, self.options, tree_device=tree_device)
        self.storage: Storage = make_storage(storage, self.capacity, schema, storage_options, device=device)
        # How to rebuild this buffer elsewhere (load_state_dict, pickling).
        self._placement: dict[str, Any] = {
            "tree_device": None if tree_device is None else str(tree_device),
            "storage": str(storage),
            "device": None if device is None else str(device),
        }
        if storage_options:
            self._placement["storage_options"] = dict(storage_options)
        # Storages that writer processes add to decide where rows go (see _sync).
        self._ring: RingStorage | None = self.storage if isinstance(self.storage, RingStorage) else None
        # Storages that make durable points (see _sync, flush, close).
        self._durable: DurableStorage | None = self.storage if isinstance(self.storage, DurableStorage) else None
        self._batches = None
        if isinstance(self.storage, DeviceStorage) or device is not None:
            # Imported here: torch is needed only by buffers that serve torch learners.
            from hetero_replay.torch_batches import TorchBatches

            self._batches = TorchBatches(self.storage, self.priorities.tree, device)
        self._lock = ForkSafeLock(INNER)
        self._limiter = rate_limiter
        self._admitted = threading.local()  # .side: the front door this thread's outer call was let through
        self._pos = 0
        self._size = 0
        self._closed = False
        if self._durable is not None and self._durable.reopened_point is not None:
            header, leaves = self._durable.reopened_point  # the rows are the storage's
            self.priorities.load(leaves, header["max_priority"])
            self.rng.bit_generator.state = header["rng_state"]
            if rate_limiter is not None and "rate_limiter" in header:
                rate_limiter.load_state_dict(header["rate_limiter"])
            if self._ring is not None:
                self._sync()

    # -- hyper-parameters (the PER rules are the Priorities') ---------------------------

    @property
    def alpha(self) -> float:
        """Priority exponent. Changing it shapes only priorities written from now on."""
        return self.priorities.alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        with self._lock:
            self.priorities.alpha = value

    @property
    def eps(self) -> float:
        """Added to every ``|TD error|``; ``eps ** alpha`` is the smallest priority."""
        return self.priorities.eps

    @eps.setter
    def eps(self, value: float) -> None:
        with self._lock:
            self.priorities.eps = value

    @property
    def beta(self) -> float:
        """IS-weight exponent in ``[0, 1]`` used when :meth:`sample` is given none."""
        return self.priorities.beta

    @beta.setter
    def beta(self, value: float) -> None:
        self.priorities.beta = value

    @property
    def stratified(self) -> bool:
        return self.priorities.stratified

    @property
    def max_priority(self) -> float:
        """Largest ``|TD error| + eps`` seen so far (starts at 1)."""
        return self.priorities.max_priority

    @property
    def durable_rows(self) -> int:
        """Rows the last durable point on disk holds, what a crash now would keep (0 for storages without one)."""
        return 0 if self._durable is None else self._durable.durable_rows

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The :class:`~hetero_replay.rate_limiter.RateLimiter` :meth:`add` and :meth:`sample` ask, or ``None``."""
        return self._limiter

    def rate_limited(self, side: str, n: int) -> contextlib.AbstractContextManager[None]:
        """Wait until the rate limiter lets an ``"insert"`` or ``"sample"`` of ``n`` go; count it if the body returns.

        The front doors' gate (:meth:`add`, :meth:`sample`), for wrappers that must wait before taking
        their own locks (:class:`~hetero_replay.RelaxedReplay`): a call of the same side inside the
        body, on this thread, is let through without waiting or counting again. Nothing is counted
        when the body raises. Without a limiter, or for ``n == 0``, it does nothing. Inserts into a
        ring storage are counted by the poll that sees them committed, not here.

        Raises:
            RateLimited: not let through within the limiter's ``timeout``, or the limiter was closed.
        """
        limiter = self._limiter
        if limiter is None or n == 0 or getattr(self._admitted, "side", None) == side:
            return _LET_THROUGH  # no generator per call: every add and sample pass here
        return self._admit(limiter, side, n)

    @contextlib.contextmanager
    def _admit(self, limiter: RateLimiter, side: str, n: int) -> Iterator[None]:
        counted = side == "sample" or self._ring is None  # a ring's inserts: counted by the poll that sees them
        with limiter.admitted(side, n, counted, None if self._ring is None else self._poll):
            self._admitted.side = side
            try:
                yield
            finally:
                self._admitted.side = None

    @property
    def tree(self) -> SumTree:
        """The sum tree of priorities (read it; change priorities through this buffer)."""
        return self.priorities.tree

    @property
    def schema(self) -> Schema:
        return self.storage.schema

    @property
    def device(self) -> Any:
        """The torch device batches are delivered to, or ``None`` for NumPy batches."""
        return None if self._batches is None else self._batches.device

    @property
    def position(self) -> int:
        """Where the next added transition goes."""
        if self._ring is not None:
            with self._lock:
                self._sync()
        return self._pos

    @property
    def filled(self) -> int:
        """Slots written so far, at most ``capacity``: ``len`` plus, with writer processes, rows still being written."""
        if self._ring is not None:
            with self._lock:
                self._sync()
        return self._size

    @property
    def dropped_updates(self) -> int:
        """Always 0: this buffer applies every update when it is given (see :class:`~hetero_replay.RelaxedReplay`)."""
        return 0

    def leaves(self) -> np.ndarray:
        """The sampling priorities ``p^alpha`` of every slot, in slot order (a copy)."""
        with self._lock:
            if self._ring is not None:
                self._sync()
            return self.priorities.leaves()

    def __len__(self) -> int:
        """Transitions stored. With writer processes: complete rows, as the learner's last poll saw them."""
        if self._ring is not None:
            with self._lock:
                self._sync()
                return self._ring.committed
        return self._size

    def __repr__(self) -> str:
        o = self.options
        where = "" if self._batches is None else f", storage={self._placement['storage']}, device={self.device}"
        return (
            f"PrioritizedReplay(size={self._size}/{self.capacity}, alpha={self.alpha}, "
            f"beta={self.beta}, tree={type(self.tree).__name__}, fanout={o.fanout}, schema={self.schema!r}{where})"
        )

    # -- the three operations ------------------------------------------------------

    def add(self, batch: Mapping[str, Any]) -> np.ndarray:
        """Append a batch of transitions (``{field: array of shape (n, ...)}``).

        New transitions get the largest priority seen so far, so each is sampled
        at least once soon. Returns their indices. Nothing is written unless the
        whole batch is valid (fields, shapes, dtypes, values that survive the
        cast, and a new priority the tree can hold). With a rate limiter, a
        valid batch first waits for it (see :meth:`rate_limited`).
        """
        rows, arrays = self.storage.validate(batch)
        with self.rate_limited("insert", rows), self._lock:
            if self._ring is not None:
                self.priorities.new_priority()  # refused before anything is written, as below
                indices = self._ring.append(arrays) if rows else np.empty(0, np.int64)
                self._sync()
                return indices
            end = self._pos + rows
            indices = np.arange(self._pos, end, dtype=np.int64)
            if end > self.capacity:  # wraps (one NumPy call where it does not: this is every add's path)
                indices %= self.capacity
            if rows == 0:
                return indices
            priority = self.priorities.new_priority()
            self.storage.write(self._pos, arrays)
            self.priorities.assign_new(indices, priority)
            self._pos = (self._pos + rows) % self.capacity
            self._size = min(self._size + rows, self.capacity)
            return indices

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions with probability ``p_i^alpha / sum p^alpha``.

        Args:
            batch_size: number of draws (with replacement), in ``[1, 2**30]``.
            beta: IS exponent for this call; defaults to :attr:`beta`.

        With a torch learner (:attr:`device` set), ``data`` and ``weights`` are
        tensors on :attr:`device` and ``indices`` stay where the tree is, which
        is where :meth:`update_priorities` wants them. A refused call (bad
        arguments, empty buffer, the rate limiter's ``RateLimited``) leaves the
        random generator untouched. With a rate limiter, the call first waits
        for it (see :meth:`rate_limited`).
        """
        n = check_batch_size(batch_size)
        b = self.beta if beta is None else check_beta(beta)
        with self.rate_limited("sample", n):
            return self._draw(n, b)

    def draw(self, batch_size: int, beta: float | None = None) -> Sample:
        """:meth:`sample` without the rate limiter: for executors that draw batches ahead of the learner.

        :class:`~hetero_replay.RelaxedReplay` asks the limiter when the learner takes a batch, not when
        its worker draws one.
        """
        n = check_batch_size(batch_size)
        return self._draw(n, self.beta if beta is None else check_beta(beta))

    def _draw(self, n: int, b: float) -> Sample:
        with self._lock:
            if self._ring is not None:
                self._sync()
            if self._size == 0:
                raise ValueError("cannot sample from an empty buffer; add transitions first")
            if self._batches is not None:
                return Sample(*self._batches.draw(self.priorities, n, self.rng, b))
            if self._ring is not None:
                return self._draw_intact(n, b)
            indices, weights = self.priorities.draw(n, self.rng, b)
            return Sample(self.storage.gather(indices), indices, weights)

    def _draw_intact(self, n: int, beta: float) -> Sample:
        """Draw from a ring storage; entries whose row a writer began to replace are drawn again.

        Such a slot leaves the tree until a poll sees its new row committed. The
        entries drawn again are independent draws from the tree as it is then.
        """
        assert self._ring is not None
        indices: Any = None
        weights: Any = None
        data: dict[str, Any] = {}
        redo: np.ndarray | None = None  # positions of the batch still to draw
        give_up = time.monotonic() + _REDRAW_PATIENCE_S
        for attempt in itertools.count():  # (after the loop: the draws made)
            if attempt >= _MAX_REDRAWS and time.monotonic() > give_up:
                break
            if self.tree.total() == 0:
                # Every stored row is being rewritten this instant (a ring of a few rows): wait for a commit.
                time.sleep(1e-4 * 2 ** min(attempt, 9))  # at most ~50 ms
                self._sync()
                continue
            k = n if redo is None else len(redo)
            idx, w = self.priorities.draw(k, self.rng, beta)
            rows, intact = self._ring.read_intact(idx)
            if redo is None:
                indices, weights, data = idx, w, rows
                redo = np.arange(n)
            else:
                indices[redo], weights[redo] = idx, w
                for name, arr in rows.items():
                    data[name][redo] = arr
            if intact.all():
                return Sample(data, indices, weights)
            self.priorities.clear(np.unique(idx[~intact]))
            redo = redo[~intact]
            self._sync()
        if self.tree.total() == 0:
            raise ValueError("no complete row to sample: every stored row is being rewritten (or its writer died)")
        raise RuntimeError(
            f"no batch of intact rows in {attempt} draws over {_REDRAW_PATIENCE_S:g} s: writers rewrite the "
            "ring faster than the learner reads it (a larger capacity gives the learner more time)"
        )

    def _sync(self) -> None:
        """Take in what writer processes did since the last call (ring storages; holds the lock)."""
        assert self._ring is not None
        new, gone = self._ring.poll()
        if gone.size:
            self.priorities.clear(gone)
        if new.size:
            self.priorities.assign_new(new)
            if self._limiter is not None:
                self._limiter.count(inserted=int(new.size))
        tickets = self._ring.tickets
        self._pos, self._size = tickets % self.capacity, min(tickets, self.capacity)
        if self._durable is not None and self._durable.flush_due():
            self._durable_point(wait=False)

    def _poll(self) -> None:
        """Take in the writers' rows (a ring storage): what a sample waiting for the rate limiter polls."""
        with self._lock:
            self._sync()

    def _durable_point(self, wait: bool) -> None:
        """Hand the durable storage what it does not hold itself: the header and every slot's priority."""
        assert self._durable is not None
        self._durable.flush(self._state(copy=False, rows=False), self.priorities.leaves(), wait=wait)

    def flush(self) -> None:
        """Make a durable point now and wait for it (durable storages, e.g. ``"disk"``; others have none).

        A durable buffer also makes one by itself every ``flush_every`` adds or
        ``flush_seconds`` seconds (see :mod:`hetero_replay.storage.durable`).
        """
        if self._durable is not None:
            with self._lock:
                if self._ring is not None:
                    self._sync()
                self._durable_point(wait=True)

    def writer(self) -> Any:
        """A picklable handle that actor processes add rows with, concurrently with this learner.

        Only storages other processes write have one (``"shared"``, ``"disk"``);
        see :class:`~hetero_replay.storage.ring.RingWriter`.

        Raises:
            TypeError: this buffer's storage has no writer handles.
        """
        if self._ring is None:
            raise TypeError(
                f"storage={self._placement['storage']!r} lives in this process only; "
                "PrioritizedReplay(..., storage='shared') (or 'disk') gives writer handles"
            )
        return self._ring.writer()

    @classmethod
    def reopen(
        cls,
        path: str | os.PathLike[str],
        tree: str = "auto",
        rate_limiter: RateLimiter | None = None,
        **storage_options: Any,
    ) -> PrioritizedReplay:
        """The durable buffer at ``path`` (e.g. ``storage="disk"``) as its last durable point left it.

        Continues a buffer after its process died, ``kill -9`` included.
        Capacity, schema and PER options come from the durable point;
        ``storage_options`` (for ``"disk"``: ``ram_bytes``, ``read_threads``,
        ``flush_every``, ``flush_seconds``) apply from now on. See
        :mod:`hetero_replay.storage.durable`. ``rate_limiter``: as in the
        constructor; it continues the durable point's counters.

        Raises:
            ValueError: ``path`` holds no buffer, or processes of the previous run still write to it.
            BufferInUseError: another learner has it open (a ``ValueError``; see ``docs/storage.md``).
            ReplayFileError: the durable point is damaged.
        """
        storage_name, header = durable_point(path)
        cfg = header["config"]
        return cls(
            int(cfg["capacity"]),
            Schema.from_json(cfg["schema"]),
            options=PEROptions.from_config(cfg, tree),
            storage=storage_name,
            storage_options={**storage_options, "path": os.fspath(path), "reopen": True},
            rate_limiter=rate_limiter,
        )

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """Set the priorities of sampled transitions from their ``|TD error|``.

        The stored priority is ``(|td| + eps) ** alpha``. ``td_errors`` must be
        magnitudes: a NaN, infinite or negative entry, or one whose priority
        the tree cannot sum (see :attr:`SumTree.max_leaf`), raises
        ``ValueError`` naming its position; an index outside the filled part of
        the buffer raises ``IndexError``; either way no priority changes.
        Tensors on any device are accepted where the buffer serves torch.
        """
        with self._lock:
            self._update(indices, td_errors)

    def _update(self, indices: Any, td_errors: Any) -> None:
        limit = None if self._size == self.capacity else self._size
        if self._batches is not None:
            indices, td_errors = self._batches.tree_inputs(indices, td_errors)
        self.priorities.update(indices, td_errors, limit)

    # -- what the relaxed pipeline needs: late updates, dropped where slots were rewritten ---------

    def track_writes(self) -> int:
        """Record from now on which slots each write changes; returns the current :attr:`write_epoch`.

        See :meth:`~hetero_replay.priorities.Priorities.track_writes`.
        """
        with self._lock:
            self.priorities.track_writes()
            return self.priorities.write_epoch

    @property
    def write_epoch(self) -> int:
        """Writes so far (adds and cleared slots) since :meth:`track_writes`: a batch drawn now carries it."""
        return self.priorities.write_epoch

    def update_priorities_since(
        self, indices: Any, td_errors: Any, epoch: int | np.ndarray, keep_undo: bool = False
    ) -> tuple[int, PrioritySnapshot | None]:
        """:meth:`update_priorities` for a batch drawn at write ``epoch``, skipping rewritten slots.

        Entries whose slot was written after ``epoch`` (it holds another
        transition now) are dropped; ``epoch`` may be one per entry. With ``keep_undo``, returns a snapshot
        that :meth:`restore_priorities` undoes the update with. Returns
        ``(entries dropped, snapshot or None)``; errors as :meth:`update_priorities`
        (positions then count the entries not dropped), and nothing changes on error.
        """
        with self._lock:
            limit = None if self._size == self.capacity else self._size
            if self._batches is not None:
                indices, td_errors = self._batches.tree_inputs(indices, td_errors)
            return self.priorities.update_since(indices, td_errors, epoch, limit, keep_undo)

    def native_parts(self) -> tuple[Any, list[np.ndarray], np.ndarray | None] | None:
        """``(tree, field arrays, write epochs)`` for a native executor, or ``None`` where one cannot serve this buffer.

        A native executor (:class:`hetero_replay._native.Executor`) runs the
        relaxed pipeline's jobs with no Python: it needs the C++ tree, rows in
        host memory it may gather from directly (the fields' strided arrays,
        in schema order) and :attr:`Priorities.written_at`. ``None`` for other
        trees, for device storages, for ring and disk storages (their reads
        check stamps and CRCs, which are Python), and for compressed fields.
        Host rows delivered as tensors (``device=``) are served: the executor
        gathers into tensors' memory and the pipeline moves them to :attr:`device`.
        """
        if self._ring is not None or self._durable is not None:
            return None
        if not isinstance(self.tree, _native.SumTree) or not isinstance(self.storage, HostStorage):
            return None
        if self.storage.compressed is not None:  # rows to decompress, no arrays to gather from
            return None
        return self.tree, [self.storage.view(name) for name in self.schema], self.priorities.written_at

    def lift_max_priority(self, value: float) -> None:
        """Raise :attr:`max_priority` to at least ``value`` (see :meth:`Priorities.lift_max`); nothing changes on error."""
        with self._lock:
            self.priorities.lift_max(value)

    def gather_at(self, masses: Any) -> tuple[dict[str, Any] | None, np.ndarray, np.ndarray]:
        """The transitions at cumulative priority ``masses`` (each in ``[0, tree.total())``).

        The descent step of :meth:`sample` for callers that draw their own
        uniforms: a sharded replay draws over the global total and sends each
        shard its offsets. Returns ``(rows, indices, priorities)``, the
        priorities being the tree's leaves ``p ** alpha`` (IS weights are the
        caller's, who knows the global minimum). Host storages only; a mass
        outside ``[0, total)`` raises ``ValueError`` naming its position.

        With a ring storage, a row that a writer began to rewrite, or that is
        damaged, is never served: its slot leaves the tree (as in :meth:`sample`)
        and ``rows`` is ``None``, so the caller draws the batch again from the
        changed tree.
        """
        with self._lock:
            if self._batches is not None:
                raise TypeError("gather_at serves host batches; this buffer serves torch tensors")
            if self._ring is None:
                indices = np.asarray(self.tree.find(masses), dtype=np.int64)
                return self.storage.gather(indices), indices, np.asarray(self.tree.get(indices))
            self._sync()
            indices = np.asarray(self.tree.find(masses), dtype=np.int64)
            rows, intact = self._ring.read_intact(indices)
            priorities = np.asarray(self.tree.get(indices))
            if not intact.all():
                self.priorities.clear(np.unique(indices[~intact]))
                return None, indices, priorities
            return rows, indices, priorities

    def restore_priorities(self, snapshot: PrioritySnapshot) -> None:
        """Undo an update (see :meth:`update_priorities_since`) exactly; later updates of the same slots too."""
        with self._lock:
            self.priorities.restore(snapshot)

    # -- what adapters need besides the three operations ----------------------------------

    def write_rows(self, start: int, fields: Mapping[str, Any]) -> None:
        """Overwrite some fields of the rows at ring positions ``start, start + 1, ...``.

        For hosts that keep data in a row the buffer has not added yet (SB3's
        memory-optimised buffer stores a transition's next observation in the
        row after it). Validated like :meth:`add` (the fields given must be in
        the schema); priorities, position and size do not change.
        """
        with self._lock:
            if not is_int(start) or not 0 <= start < self.capacity:
                raise IndexError(f"start must be an integer in [0, {self.capacity}), got {start!r}")
            self.storage.write(start, self.storage.validate_fields(fields)[1])

    def read_rows(self, name: str, indices: Any) -> Any:
        """Rows ``indices`` of field ``name`` (any slot, filled or not), where batches go.

        NumPy for host batches; a tensor on :attr:`device` otherwise.
        """
        with self._lock:
            if self._batches is not None:
                return self._batches.read(name, indices)
            return self.storage.gather(as_indices(indices, self.capacity), fields=[name])[name]

    def view(self, name: str) -> Any:
        """A live view of field ``name`` over all ``capacity`` rows (NumPy or torch).

        Reads and writes through it bypass the buffer's lock and validation:
        it exists for host libraries whose API exposes their arrays (SB3's
        ``buffer.observations``). Storages that cannot give one raise
        ``NotImplementedError``.
        """
        return self.storage.view(name)

    def clear_priorities(self, indices: Any) -> None:
        """Priority 0 at ``indices``: those slots are not drawn until written or updated again."""
        with self._lock:
            self.priorities.clear(indices)

    # -- state -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this buffer is (copies).

        Compressed fields (``storage_options`` ``codec=``) are not in ``state["storage"]``: their
        records are in ``state["compressed"]``, as they are (not decompressed, see
        :meth:`~hetero_replay.storage.codec.CompressedFields.export`). A row of a shared or disk
        record log whose records could not be copied (evicted, or being rewritten by a writer) is
        in the state without records and with priority 0, and this buffer's priority for it
        becomes 0 too: it would not have been served either (docs/compression.md, checkpoints).
        """
        with self._lock:
            if self._ring is not None:
                self._sync()
            return self._state(copy=True)

    def _state(self, copy: bool, rows: bool = True) -> dict[str, Any]:
        o = self.options
        state = {
            "config": {
                "capacity": self.capacity,
                "alpha": self.alpha,
                "beta": self.beta,
                "eps": self.eps,
                "fanout": o.fanout,
                "priority_dtype": o.priority_dtype,
                "stratified": o.stratified,
                "schema": self.schema.to_json(),
            },
            "position": self._pos,
            "size": self._size,
            "max_priority": self.max_priority,
            "rng_state": self.rng.bit_generator.state,
        }
        if self._limiter is not None:
            state["rate_limiter"] = self._limiter.state_dict()
        if rows:
            if (isinstance(self.storage, HostStorage) and self.storage.compressed is not None) or isinstance(
                self.storage, RecordRing
            ):  # records as they are
                state["storage"], packed = self.storage.export_state(self._size, copy=copy)
                if packed is not None:
                    state["compressed"] = packed
                    self.priorities.clear(absent_rows(packed, self._size))  # rows a shared log lost: not drawn
            else:
                state["storage"] = self.storage.export_rows(self._size, copy=copy)
            state["priorities"] = self.priorities.leaves()[: self._size]
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict` of a buffer with the same capacity and schema.

        Everything is checked before anything changes; on error this buffer is
        left as it was. This buffer's rate limiter (if any) stays and continues
        the state's counters (a state saved without one leaves them as they are).
        """
        cfg = state["config"]
        if int(cfg["capacity"]) != self.capacity or Schema.from_json(cfg["schema"]) != self.schema:
            raise ValueError(
                "state is for a buffer of capacity "
                f"{cfg['capacity']} and schema {Schema.from_json(cfg['schema'])!r}; this one has "
                f"capacity {self.capacity} and schema {self.schema!r}. Use PrioritizedReplay.from_state_dict."
            )
        # This buffer's storage as it is: a compressed state into a raw buffer is decompressed.
        placement = {"storage_options": None, **self._placement}
        fresh = PrioritizedReplay.from_state_dict(state, tree=self.options.tree, **placement)
        with self._lock:
            if self._limiter is not None and "rate_limiter" in state:
                self._limiter.load_state_dict(state["rate_limiter"])  # checked before it changes anything
            self._become(fresh, keep=("_lock", "_limiter", "_admitted"))

    def _become(self, fresh: PrioritizedReplay, keep: tuple[str, ...] = ("_lock",)) -> None:
        """Take over ``fresh``'s state, keeping this buffer's ``keep`` (its lock: other threads may wait on it)."""
        state = {k: v for k, v in fresh.__dict__.items() if k not in keep}
        old = self.__dict__.get("storage")
        self.__dict__.update(state)
        if old is not None and old is not self.storage and isinstance(old, RingStorage):
            old.close()  # its writers are told the buffer is closed

    @classmethod
    def from_state_dict(
        cls, state: Mapping[str, Any], tree: str = "auto", rate_limiter: RateLimiter | None = None, **placement: Any
    ) -> PrioritizedReplay:
        """A new buffer restored from :meth:`state_dict` output.

        ``placement``: ``tree_device``, ``storage``, ``device`` and ``storage_options`` as in the
        constructor (the state itself holds no placement: it loads anywhere). A state of compressed
        fields loaded into the host storage without ``storage_options`` keeps them compressed as they
        were (its codec settings, its records as they are); ``storage_options=None`` asks for raw rows.
        A compressed shared storage (``storage="shared"`` with a ``codec``) appends the records to its log as
        they are where it compresses the fields alike, and converts them otherwise.
        ``rate_limiter``: as in the constructor; it continues the state's counters.
        """
        cfg = state["config"]
        packed = state.get("compressed")
        if (
            packed is not None
            and "storage_options" not in placement
            and placement.get("storage", DEFAULT_STORAGE) == HOST
        ):
            placement = {**placement, "storage_options": storage_options_of(Schema.from_json(cfg["schema"]), packed)}
        buf = cls(
            int(cfg["capacity"]),
            Schema.from_json(cfg["schema"]),
            options=PEROptions.from_config(cfg, tree),
            rate_limiter=rate_limiter,
            **placement,
        )
        size, pos = int(state["size"]), int(state["position"])
        if not (0 <= size <= buf.capacity and 0 <= pos < buf.capacity and (size == buf.capacity or pos == size)):
            raise ValueError(f"inconsistent position {pos} / size {size} for capacity {buf.capacity}")
        storage, priorities = state["storage"], np.asarray(state["priorities"])
        # A compressed state holds its compressed fields' rows as records (checked where they are read).
        if packed is not None and not isinstance(packed, Mapping):
            raise ValueError(f"compressed: expected a mapping of settings and arrays, got {type(packed).__name__}")
        compressed = {} if packed is None else parse_settings(buf.schema, packed.get("settings"))[0]
        raw = {n: f for n, f in buf.schema.items() if n not in compressed}
        if set(storage) != set(raw):
            raise ValueError(f"state holds fields {sorted(storage)}, expected {sorted(raw)}")
        for name, field in raw.items():
            arr = np.asarray(storage[name])
            if arr.shape != (size, *field.shape) or arr.dtype != field.dtype:
                raise ValueError(
                    f"field {name!r}: state holds {arr.dtype}{arr.shape}, expected {field.dtype}{(size, *field.shape)}"
                )
        if priorities.shape != (size,):
            raise ValueError(f"priorities: expected shape ({size},), got {priorities.shape}")
        leaves = np.zeros(buf.capacity, buf.tree.dtype)
        leaves[:size] = priorities
        buf.priorities.load(leaves, state["max_priority"])
        rows = {name: np.asarray(storage[name]) for name in raw}
        if packed is not None and isinstance(buf.storage, HostStorage) and buf._ring is None:
            buf.storage.import_state(rows, packed, size)  # records adopted as they are, or converted
        elif packed is not None and isinstance(buf.storage, RecordRing):
            buf.storage.adopt_state(pos, size, rows, packed)  # the same, appended to its record log
        else:
            if packed is not None:  # a storage without these codecs: the rows decompressed
                source = CompressedFields.restored(buf.schema, packed, size)
                rows.update(source.gather(np.arange(size, dtype=np.int64), list(compressed)))
            if buf._ring is not None:
                buf._ring.adopt(pos, size, rows)
            else:
                buf.storage.import_rows(rows)
        if rate_limiter is not None and "rate_limiter" in state:
            rate_limiter.load_state_dict(state["rate_limiter"])  # checked before it changes anything
        buf.rng.bit_generator.state = state["rng_state"]
        buf._pos, buf._size = pos, size
        return buf

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the whole buffer to one file at ``path``, atomically (see :mod:`hetero_replay.storage.checkpoint`).

        Holds the buffer's lock while writing: views, not copies, are saved, so
        a large buffer needs no second copy in memory. Compressed fields are saved as their
        records (loading into a buffer compressing them alike takes them as they are).
        """
        with self._lock:
            state = self._state(copy=False)
            arrays = {f"storage/{n}": a for n, a in state.pop("storage").items()}
            arrays["priorities"] = state.pop("priorities")
            if "compressed" in state:  # the settings in the header, the records as arrays
                packed = state.pop("compressed")
                state["compressed"] = packed["settings"]
                arrays.update({f"compressed/{n}": a for n, a in packed["arrays"].items()})
            checkpoint.write(path, state, arrays)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], tree: str = "auto", rate_limiter: RateLimiter | None = None, **placement: Any
    ) -> PrioritizedReplay:
        """Read a buffer written by :meth:`save`; a corrupt file raises ``ReplayFileError``.

        ``placement``: ``tree_device``, ``storage``, ``device`` and ``storage_options`` as in the
        constructor (compressed fields stay compressed as saved unless ``storage_options`` is given, see
        :meth:`from_state_dict`); ``rate_limiter`` as in the constructor (it continues the file's counters).
        """
        header, arrays = checkpoint.read(path)
        try:
            state = dict(header)
            state["storage"] = {n[len("storage/") :]: a for n, a in arrays.items() if n.startswith("storage/")}
            state["priorities"] = arrays["priorities"]
            if "compressed" in header:
                arrays_of = {n[len("compressed/") :]: a for n, a in arrays.items() if n.startswith("compressed/")}
                state["compressed"] = {"settings": header["compressed"], "arrays": arrays_of}
            return cls.from_state_dict(state, tree=tree, rate_limiter=rate_limiter, **placement)
        except (KeyError, TypeError, ValueError) as e:
            raise checkpoint.ReplayFileError(f"{path}: inconsistent replay file ({e})") from e
        except MemoryError as e:
            # read() checked the header against the format's bounds, but it may still
            # describe a buffer larger than this machine can allocate: refuse the file.
            raise checkpoint.ReplayFileError(
                f"{path}: describes a buffer of capacity {header['config']['capacity']}, "
                f"more than this machine can allocate ({e})"
            ) from e

    def close(self) -> None:
        """Release what the storage holds (files, shared memory); the buffer is unusable afterwards.

        Closing a closed buffer does nothing.

        A durable buffer (``"disk"``) makes a last durable point first (its files stay);
        a ``"shared"`` one removes its segment, and its writers' next ``add`` raises.
        The rate limiter is closed first: calls waiting for it raise ``RateLimited``.
        """
        if self._limiter is not None:
            self._limiter.close()  # before the lock: a waiting sample polls under it
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._durable is not None and not self._durable.closed:
                    if self._ring is not None:
                        self._sync()
                    self._durable_point(wait=True)
            finally:  # writers are told, and files closed, even when the last durable point fails
                self.storage.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (closing again does nothing)."""
        return self._closed

    def __getstate__(self) -> dict[str, Any]:
        # A copy gets a limiter of its own (RateLimiter pickles its settings, counters and timeout).
        return {
            "state": self.state_dict(), "tree": self.options.tree, "placement": self._placement,
            "rate_limiter": self._limiter,
        }  # fmt: skip

    def __setstate__(self, d: dict[str, Any]) -> None:
        fresh = PrioritizedReplay.from_state_dict(
            d["state"], tree=d["tree"], rate_limiter=d.get("rate_limiter"), **d.get("placement", {})
        )
        self._lock = ForkSafeLock(INNER)
        self._become(fresh)


__all__ = ["DEFAULT_EPS", "PrioritizedReplay", "Sample"]
