"""ShardedReplay: prioritized replay over shards on Ray actors, sampled exactly from the global distribution.

Each shard (:mod:`.shard`) is an engine buffer in a Ray actor, on this machine
or any node of a cluster. The learner keeps each shard's summary (total mass
``S_k``, smallest positive priority ``m_k``, size, incarnation and version),
refreshed from every reply. A batch of ``B``:

1. draws ``B`` uniforms over the global total ``T = sum_k S_k`` (stratified:
   one per ``[jT/B, (j+1)T/B)``, as one buffer does), with the learner's seeded
   generator;
2. routes each to the shard whose prefix range holds it, with its offset
   inside that shard; every shard gets one call (its offsets, possibly none,
   and the version the learner routed by), all in flight at once;
3. each shard descends its own tree at the offsets and returns rows, slots and
   priorities ``p_i`` (``p ** alpha``);
4. IS weights are ``(min_k m_k / p_i) ** beta``: the single-buffer formula
   ``(N P(i)) ** -beta / max_j (N P(j)) ** -beta`` with the global size ``N``
   and the global minimum (``N`` and ``T`` cancel).

Guarantee: a batch is accepted only if every shard served it at the
``(incarnation, version)`` the learner routed by. Every shard's last reply
came before the batch was issued and nothing changed it before it served, so
all shards were in those states at the instant the batch was issued: **the
batch is drawn exactly from ``p_i ** alpha / sum_all p ** alpha`` of the whole
replay as it was at that instant.**

Writers do not change a shard between the learner's calls: a shard queues
their rows and takes them in during the learner's next call to it (after
serving a draw, or with an update), and that call's reply carries the new
summary (:mod:`.shard`). So with writers adding at any rate, draws are not
redrawn; writers' rows become sampleable one learner call later. A shard
can still change unannounced: its queue overflows (``stage_rows``), it
restarts, or another learner uses it. Then its reply carries its new summary
instead of rows, and the learner redraws the whole batch with fresh uniforms.
Whether a redraw happens does not depend on the uniforms, so accepted batches
keep the exact law. After ``max_redraws`` redraws the last attempt is served
anyway, each changed shard rescaling its offsets to its current total: exact
within each shard, the split across shards one reply old. Such batches are
counted in :attr:`stats` (``inexact_batches``).

With ``batches_per_call=m`` (and staleness >= 1) one call per shard carries the
offsets of ``m`` batches, routed by the same summaries and served in one go: all
``m`` are drawn exactly from the one state the call was issued in, and the
learner hands them over one per :meth:`~ShardedReplay.sample` (IS weights made
then, with that call's ``beta``). The learner's Ray cost per batch drops about
``m``-fold; batch ``j`` of a call is ``m - 1 + j`` steps staler than ``k``. With
``m = c * num_shards`` the learner makes ``1 / c`` calls per step at any shard count.

Calls and replies carry only numbers, bools and bytes (arrays as the bytes of
one contiguous array each, :mod:`.wire`): what Ray moves without pickling.

Priority updates are checked on the learner, then sent, one call per shard,
without waiting: their replies are collected before the next sample needs the
summaries. With ``staleness`` 1 or 2 they ride on the next draw's calls instead
(and with 2 the next draw is sent before training): the relaxed pipeline's
schedule, each batch still exact for the state it was issued in. Each index carries
(shard, incarnation, slot, write epoch); a shard drops entries whose slot was
rewritten since the draw, or which were drawn before it restarted.

New transitions get the global max priority (``max(|td| + eps) ** alpha`` over
all shards, as one buffer gives them): the learner sends the max it knows with
every add and update (collecting the replies of updates still out first).
Writers send the largest they have seen in replies.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from hetero_replay import _native, forksafe
from hetero_replay.checks import check_batch_size, check_bool, check_int, check_real, check_seed
from hetero_replay.distributed import cluster, wire
from hetero_replay.distributed.limiter import find_limiter, save_state, saved_state, settings_of, start_limiter
from hetero_replay.distributed.shard import (
    SHARD_STORAGES,
    DrawRequest,
    ShardConfig,
    ShardDraw,
    ShardSummary,
    check_storage_options,
    validate_rows,
)
from hetero_replay.distributed.writer import ShardWriter
from hetero_replay.options import UNSET, PEROptions, StalenessOptions, check_beta
from hetero_replay.rate_limiter import RateLimiter
from hetero_replay.replay import Sample
from hetero_replay.schedule import Schedule
from hetero_replay.storage import HOST, Schema
from hetero_replay.storage.durable import check_path
from hetero_replay.storage.files import check_directory, check_parents, private_directory
from hetero_replay.trees.base import MAX_CAPACITY, max_leaf

#: One sampled transition's identity: its shard, the shard's incarnation, the slot, and the shard's write epoch.
INDEX_DTYPE = np.dtype([("shard", np.int32), ("incarnation", np.int32), ("slot", np.int64), ("epoch", np.int64)])


class ShardedReplay:
    """A prioritized replay whose transitions live in ``num_shards`` Ray actors.

    Args:
        num_shards: shards (Ray actors), at least 1.
        capacity_per_shard: transitions each shard keeps (its oldest is overwritten first).
        schema: ``{name: (shape, dtype)}`` or a :class:`~hetero_replay.storage.Schema`, as for
            :class:`~hetero_replay.PrioritizedReplay`.
        alpha, beta, eps, tree, fanout, priority_dtype, stratified: the PER options
            (:class:`~hetero_replay.PEROptions`); ``tree`` is each shard's backend.
        seed: seed of the learner's generator, which draws every uniform: with
            no writers adding concurrently, a seed fixes the samples.
        options: a ready :class:`~hetero_replay.PEROptions` (keywords override its fields).
        address: a Ray cluster to join (``"auto"``, ``"ray://..."``, ``"127.0.0.1:6379"``);
            ``None`` starts a local Ray instance (or uses the one this process has).
        storage: each shard's storage, ``"host"`` (the default) or ``"disk"``
            (ring files under ``durable_dir``, for shards larger than RAM).
        storage_options: the shard storage's keyword arguments (``"disk"``: ``ram_bytes``, ``read_threads``).
        durable_dir: where shards make their durable points (a directory every shard's node
            can write: local disk for one machine, a shared file system for a
            cluster). ``None``: none; a restarted shard starts empty. A directory that
            holds another run's shards is refused (``ValueError``) unless ``reopen``. Its
            shards' names are known in advance, so it is private as a disk buffer's
            directory is (made 0700; an existing one this user's, writable by nobody
            else; see :mod:`~hetero_replay.storage.files`), checked before Ray starts.
        reopen: continue the shards whose durable points ``durable_dir`` holds (the same
            number of shards, capacity and schema), as :meth:`PrioritizedReplay.reopen` does.
        flush_every, flush_seconds: a shard makes a durable point after this many
            added rows or this many seconds, whichever first (checked at each call).
            The loss window of a shard that dies is what it took in since.
        name: the shards' name prefix (named Ray actors); default a fresh unique name. Where shards
            of that name run, this learner joins them if they were built with the same arguments
            (``ValueError`` naming both schemas otherwise; nothing is started or killed).
        detached: keep the shards alive after this process exits (needs a running
            cluster, ``address``), so a restarted learner reattaches with :meth:`attach`.
        stage_rows: writers' rows a shard queues (until the learner's next call) before taking them
            in unasked; ``0`` takes every writer's add in at once (draws it overtakes are redrawn).
        staleness: the schedule of :mod:`hetero_replay.schedule` (an integer or a
            :class:`~hetero_replay.options.StalenessOptions`; this executor supports 0, 1 and 2).
            ``0``: exact PER, each batch sees every earlier update (two rounds of calls per step);
            ``1``: a priority update rides on the next draw's calls and is applied after that draw
            (one round per step; batch ``t`` sees the updates of steps ``<= t - 2``); ``2``: also
            the next batch is drawn while the learner trains on this one (no round trip exposed;
            batch ``t`` sees the updates of steps ``<= t - 3``). Deterministic for a seed.
        batches_per_call: ``m``, the batches each call to a shard draws at once (with ``staleness`` >= 1):
            the learner sends one call per shard every ``m`` batches instead of every batch. The ``m``
            batches are drawn from one state, exactly for it (see ``docs/distributed.md``), so they
            see ``m - 1`` fewer updates than ``staleness`` alone: batch ``j`` of a call (from 0) is
            ``k + m - 1 + j`` steps stale (the schedule of :mod:`hetero_replay.schedule` with
            ``k + m - 1`` for the call's first batch). ``1`` (the default): one call per batch.
        rate_limiter: a :class:`~hetero_replay.rate_limiter.RateLimiter` (its settings and counters) that the
            learner's samples and adds and every writer's adds go through, run in a Ray actor of this replay
            (:mod:`.limiter`): a call waits while its side is ahead of the ratio and raises
            :class:`~hetero_replay.rate_limiter.RateLimited` after the limiter's ``timeout``. Its counters
            go into ``durable_dir`` at :meth:`flush`, and ``reopen`` continues them.
        max_redraws: batch redraws when shards changed under a draw (see the module docstring).
        recovery_timeout: seconds to wait for a dead shard's restart before :class:`~.cluster.ShardLostError`.
        actor_options: extra Ray actor options of the shards (``resources``, ``scheduling_strategy``, ...):
            one dict for all, or a list of one dict per shard (to place shard ``k`` on a node of your choice).

    Example:
        >>> replay = ShardedReplay(2, 10_000, {"obs": ((4,), "float32"), "reward": ((), "float32")})  # doctest: +SKIP
        >>> replay.add({"obs": np.zeros((64, 4)), "reward": np.ones(64)})                          # doctest: +SKIP
        >>> batch = replay.sample(32)                                                            # doctest: +SKIP
        >>> replay.update_priorities(batch.indices, np.abs(np.random.randn(32)))                 # doctest: +SKIP
    """

    def __init__(
        self,
        num_shards: int,
        capacity_per_shard: int,
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
        address: str | None = None,
        storage: str = HOST,
        storage_options: Mapping[str, Any] | None = None,
        durable_dir: str | None = None,
        reopen: bool = False,
        flush_every: int = 10_000,
        flush_seconds: float = 60.0,
        name: str | None = None,
        detached: bool = False,
        stage_rows: int = 4096,
        staleness: int | StalenessOptions = 0,
        batches_per_call: int = 1,
        rate_limiter: RateLimiter | None = None,
        max_redraws: int = 8,
        recovery_timeout: float = 120.0,
        actor_options: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
    ) -> None:
        check_int(num_shards, "num_shards", 1, 2**15)
        check_int(capacity_per_shard, "capacity_per_shard", 1, MAX_CAPACITY)
        check_int(flush_every, "flush_every", 1, 2**62)
        check_int(max_redraws, "max_redraws", 0, 2**20)
        check_int(stage_rows, "stage_rows", 0, 2**40)
        staleness = _sharded_staleness(staleness)
        _check_batches_per_call(batches_per_call, staleness)
        if rate_limiter is not None and not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter, got {type(rate_limiter).__name__}")
        for arg, value in (("flush_seconds", flush_seconds), ("recovery_timeout", recovery_timeout)):
            check_real(value, arg, positive=True, finite=False)
        if storage not in SHARD_STORAGES:
            raise ValueError(f"storage must be one of {SHARD_STORAGES} for a shard, got {storage!r}")
        if storage != HOST and durable_dir is None:
            raise ValueError(f"storage={storage!r} shards need durable_dir= (their ring files go there)")
        storage_options = check_storage_options(storage, storage_options)
        check_bool(reopen, "reopen")
        if reopen and durable_dir is None:
            raise ValueError("reopen=True continues the durable points in durable_dir=: give it")
        if durable_dir is not None:
            durable_dir = str(check_path(durable_dir, "durable_dir"))
            if os.path.lexists(durable_dir):
                check_directory(Path(durable_dir), "durable_dir")  # (an existing one) ours, private
            else:
                check_parents(durable_dir, "durable_dir")
        if detached and address is None:
            raise ValueError(
                "detached=True keeps shards alive after this process: it needs a running cluster's address="
            )
        if name is not None and (not isinstance(name, str) or not name or "/" in name):
            raise ValueError(f"name must be a non-empty string without '/', got {name!r}")
        _per_shard_options(actor_options, num_shards)  # refused before Ray starts
        schema = schema if isinstance(schema, Schema) else Schema(schema)
        per = PEROptions.of(
            options, alpha=alpha, beta=beta, eps=eps, tree=tree, fanout=fanout,
            priority_dtype=priority_dtype, stratified=stratified,
        )  # fmt: skip
        config = ShardConfig(
            capacity=int(capacity_per_shard), schema=schema.to_json(), options=asdict(per), storage=storage,
            storage_options=storage_options or None,
            durable_dir=durable_dir,
            flush_every=int(flush_every), flush_seconds=float(flush_seconds),
            stage_rows=int(stage_rows),
        )  # fmt: skip
        self.address = cluster.connect(address)
        self.name = name or f"replay-{uuid.uuid4().hex[:8]}"
        self.detached = bool(detached)
        running = cluster.running_shards(self.name)
        if running:  # the shards of that name already run: this learner joins them if they are this replay's
            _check_same_replay(self.name, running, num_shards, config)
        elif config.durable_dir is not None:
            _check_durable_dir(config.durable_dir, reopen)
            private_directory(Path(config.durable_dir), "durable_dir")
        per_shard = _per_shard_options(actor_options, num_shards)
        strategy = {"scheduling_strategy": "SPREAD"}  # one shard per node where there are several
        handles = [
            cluster.start_shard(self.name, k, config, self.detached, {**strategy, **per_shard[k]})
            for k in range(num_shards)
        ]
        try:
            limiter = None
            if rate_limiter is not None:  # the counters a reopened replay's durable point kept, if any
                settings = settings_of(rate_limiter)
                if reopen and config.durable_dir is not None and (state := saved_state(config.durable_dir)):
                    settings |= {k: state[k] for k in ("inserted", "sampled")}
                limiter = start_limiter(self.name, settings, self.detached)
            self._setup(handles, config, seed, max_redraws, recovery_timeout, staleness, batches_per_call, limiter)
        except BaseException:
            if not running:  # shards this call started (one failed to start): none is left behind, none holds its files
                _stop(handles, limiter, recovery_timeout, durable_dir=None)
            raise

    @classmethod
    def attach(
        cls, name: str, address: str | None = None, seed: int | None = None, max_redraws: int = 8,
        recovery_timeout: float = 120.0, staleness: int | StalenessOptions = 0, batches_per_call: int = 1,
    ) -> ShardedReplay:  # fmt: skip
        """The learner side of running (detached) shards named ``name``: a restarted learner continues with them."""
        staleness = _sharded_staleness(staleness)
        _check_batches_per_call(batches_per_call, staleness)
        self = cls.__new__(cls)
        self.address = cluster.connect(address)
        handles = cluster.find_shards(name)
        self.name, self.detached = name, True
        config = cluster.ray_module().get(handles[0].__ray_call__.remote(lambda shard: shard.config))
        self._setup(
            handles, config, seed, max_redraws, recovery_timeout, staleness, batches_per_call, find_limiter(name)
        )
        return self

    def _setup(
        self, handles: list[Any], config: ShardConfig, seed: int | None, max_redraws: int, recovery_timeout: float,
        staleness: StalenessOptions, batches_per_call: int, limiter: Any | None,
    ) -> None:  # fmt: skip
        self._ray = cluster.ray_module()
        self._shards = handles
        self._limiter = limiter  # the rate limiter's actor (limiter.py), or None
        self.config = config
        self.options = config.per_options()
        self.schema = Schema.from_json(config.schema)
        self.capacity_per_shard = config.capacity
        self.rng = np.random.default_rng(check_seed(seed))
        self.max_redraws = max_redraws
        self.recovery_timeout = recovery_timeout
        self._beta = self.options.beta
        self._lock = threading.RLock()
        self._pending: list[tuple[int, Any]] = []  # (shard, reply of an update or add not yet collected)
        self._next_shard = 0
        self.schedule_options = staleness
        self.batches_per_call = batches_per_call
        # staleness >= 1: checked updates held back, to ride on the shards' draw calls when the schedule says.
        # A call draws m batches from one state: its first batch is k + m - 1 steps stale (see _send_draw).
        self._schedule = Schedule(staleness.staleness + batches_per_call - 1 if staleness.staleness else 0)
        self._prefetched: tuple[int, np.ndarray, list[Any]] | None = None  # staleness 2: (n, shard_of, replies)
        self._ready: deque[_Drawn] = deque()  # the batches of the last call not served yet
        self._max_leaf = max_leaf(np.dtype(self.options.priority_dtype), config.capacity)
        self._row_dtype = wire.row_dtype(self.schema)  # a draw reply's rows (see wire)
        self.stats = {"batches": 0, "redraws": 0, "inexact_batches": 0, "dropped_updates": 0, "recoveries": 0}
        self._summaries: list[ShardSummary] = [
            cluster.wait_for(functools.partial(self._reply, h.summary), k, recovery_timeout, self.name)
            for k, h in enumerate(handles)
        ]
        # A learner that exits without close() loses nothing: closed before Ray's exit handler ends the shards.
        self._close_at_exit = functools.partial(_close_at_exit, weakref.ref(self), os.getpid(), cluster.session())
        forksafe.at_exit(self._close_at_exit)

    # -- properties --------------------------------------------------------------------

    @property
    def num_shards(self) -> int:
        return len(self._shards)

    @property
    def capacity(self) -> int:
        """Transitions kept over all shards."""
        return self.num_shards * self.capacity_per_shard

    @property
    def alpha(self) -> float:
        return self.options.alpha

    @property
    def eps(self) -> float:
        return self.options.eps

    @property
    def beta(self) -> float:
        """IS exponent of the next :meth:`sample` (the learner's: shards never see it)."""
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        self._beta = check_beta(value)

    @property
    def device(self) -> None:
        """Batches come back as NumPy arrays on the host."""
        return None

    @property
    def summaries(self) -> list[ShardSummary]:
        """Each shard's state now (one round trip to every shard; writers' queued rows taken in first)."""
        self._check_open()
        with self._lock:
            self._deliver_held_back()
            self._collect()
            refs = [h.refresh.remote() for h in self._shards]
            for k, ref in enumerate(refs):
                try:
                    self._store(k, self._ray.get(ref))
                except cluster.actor_errors():
                    self._recover(k)
            return list(self._summaries)

    @property
    def filled(self) -> int:
        """Transitions stored over all shards."""
        return sum(s.size for s in self.summaries)

    @property
    def position(self) -> int:
        """Rows added so far modulo :attr:`capacity`, as the learner's summaries know them.

        The shards are rings of their own; this is where the next row would go if they were one ring.
        """
        return self.filled % self.capacity

    @property
    def dropped_updates(self) -> int:
        """Update entries the shards skipped because their slot was rewritten after the draw (``stats``)."""
        return int(self.stats["dropped_updates"])

    def __len__(self) -> int:
        return self.filled

    @property
    def max_priority(self) -> float:
        """Largest ``|td| + eps`` any shard has seen (starts at 1)."""
        return max(s.max_priority for s in self.summaries)

    def __repr__(self) -> str:
        return (
            f"ShardedReplay(name={self.name!r}, shards={self.num_shards}, capacity_per_shard={self.capacity_per_shard}, "
            f"alpha={self.alpha}, beta={self.beta}, schema={self.schema!r})"
        )

    # -- the three operations ------------------------------------------------------------

    def add(self, batch: Mapping[str, Any]) -> int:
        """Append transitions, split evenly over the shards (starting where the last add stopped).

        The whole batch is checked first (fields, shapes, dtypes, casts), so a
        refused batch reaches no shard. Returns the number of rows added.
        """
        self._check_open()
        rows, arrays = validate_rows(self.schema, self.capacity, batch)
        if rows == 0:
            return 0
        if self._limiter is not None:
            self._ray.get(self._limiter.insert.remote(rows))  # waits while the writers are ahead of the ratio
        with self._lock:
            self._collect()  # the updates' replies: the max priority new rows get is the global one
            # Chunk j goes to shard (next + j) % S: consecutive calls fill the shards evenly.
            bounds = np.linspace(0, rows, min(rows, self.num_shards) + 1).astype(np.int64)
            top = self.max_priority
            for j in range(len(bounds) - 1):
                k = (self._next_shard + j) % self.num_shards
                chunk = {n: a[bounds[j] : bounds[j + 1]] for n, a in arrays.items()}
                self._pending.append((k, self._shards[k].add.remote(chunk, top)))
            self._next_shard = (self._next_shard + len(bounds) - 1) % self.num_shards
            return rows

    def sample(self, batch_size: int, beta: float | None = None) -> Sample:
        """Draw ``batch_size`` transitions with probability ``p_i^alpha / sum over all shards``.

        Returns a :class:`~hetero_replay.Sample`: NumPy rows, ``indices`` of
        dtype :data:`INDEX_DTYPE` (for :meth:`update_priorities`) and IS
        weights normalised by the global maximum. A refused call (bad
        arguments, empty replay) leaves the generator untouched.
        """
        self._check_open()
        n = check_batch_size(batch_size)
        b = self._beta if beta is None else check_beta(beta)
        if self._limiter is not None:
            self._ray.get(self._limiter.sample.remote(n))  # waits while the learner is ahead of the ratio
        with self._lock:
            self._collect()
            batch = self._take_ready(n, b)
            if batch is None:
                batch = self._take_prefetched(n, b)
            if batch is None:
                batch = self._draw_now(n, b)
            # The next call goes out once this one's batches are all served (staleness 1 would need the
            # draw sent ahead to wait for its updates in a round of their own).
            if self.staleness == 2 and not self._ready:
                self._prefetch(n)
            return batch

    def _take_ready(self, n: int, beta: float) -> Sample | None:
        """The next batch the last call drew, if it has one of ``n`` transitions (others are dropped)."""
        if self._ready and len(self._ready[0].indices) != n:
            self._ready.clear()  # another batch size is asked for: the call's remaining batches are dropped
        return self._serve(self._ready.popleft(), beta) if self._ready else None

    def _draw_now(self, n: int, beta: float) -> Sample:
        """Draw a batch and wait for it, redrawing while shards changed under it (see the module docstring)."""
        for attempt in range(self.max_redraws + 1):
            totals = np.array([s.total for s in self._summaries], np.float64)
            if not totals.sum() > 0:  # empty as far as the learner knows: writers' queued rows may wait
                totals = np.array([s.total for s in self.summaries], np.float64)  # (takes them in)
            if not totals.sum() > 0:
                what = "empty" if all(s.size == 0 for s in self._summaries) else "all priorities are 0"
                raise ValueError(f"cannot sample from the sharded replay: {what}; add transitions first")
            shard_of, offsets = self._route(n, totals)
            draws = self._receive(self._send_draw(shard_of, offsets, totals, attempt == self.max_redraws))
            if draws is not None:
                return self._accept(n, shard_of, draws, beta)
            self.stats["redraws"] += 1
        raise ValueError("the sharded replay's priority mass vanished while drawing (all shards cleared)")

    def _prefetch(self, n: int) -> None:
        """Send the next batch's draw now (staleness 2): the shards serve it while the learner trains."""
        totals = np.array([s.total for s in self._summaries], np.float64)
        if totals.sum() > 0:
            shard_of, offsets = self._route(n, totals)
            self._prefetched = (n, shard_of, self._send_draw(shard_of, offsets, totals, False))

    def _take_prefetched(self, n: int, beta: float) -> Sample | None:
        """The prefetched batch, if there is one of ``n`` transitions that every shard served as routed."""
        if self._prefetched is None:
            return None
        (size, shard_of, replies), self._prefetched = self._prefetched, None
        draws = self._receive(replies)
        if draws is None:
            self.stats["redraws"] += 1
        if draws is None or size != n:  # (a batch of another size is asked for: this one is dropped)
            return None
        return self._accept(n, shard_of, draws, beta)

    def _accept(self, n: int, shard_of: np.ndarray, draws: list[ShardDraw], beta: float) -> Sample:
        """Serve the first of the call's batches (of ``n``); the others wait in :attr:`_ready`."""
        inexact = not all(d.current for d in draws)
        first, *rest = self._assemble(n, shard_of, draws, inexact)
        self._ready.extend(rest)
        return self._serve(first, beta)

    def _serve(self, drawn: _Drawn, beta: float) -> Sample:
        """A drawn batch goes to the learner: a step of the schedule, IS weights with ``beta`` now."""
        self._schedule.serve(0)  # (each index carries its own shard's write epoch)
        self.stats["batches"] += 1
        self.stats["inexact_batches"] += drawn.inexact
        return Sample(drawn.data, drawn.indices, _native.is_weights(drawn.priorities, drawn.global_min, beta))

    def update_priorities(self, indices: Any, td_errors: Any) -> None:
        """Set the priorities of sampled transitions from their ``|TD error|`` (``(|td| + eps) ** alpha``).

        Everything is checked here first, so no shard refuses: ``indices`` of
        :data:`INDEX_DTYPE` (``TypeError`` otherwise), 1-D, one TD error each;
        a shard or slot out of range raises ``IndexError``; a NaN, infinite or
        negative TD error, or one whose priority the trees cannot sum, raises
        ``ValueError`` naming its position. Nothing is sent on error. Then one
        call per shard goes out without waiting; entries whose slot was
        rewritten since the draw are dropped by their shard (counted in
        :attr:`stats`).
        """
        self._check_open()
        idx = np.asarray(indices)
        if idx.dtype != INDEX_DTYPE:
            raise TypeError(
                f"indices must be a ShardedReplay sample's indices (dtype {INDEX_DTYPE}), got dtype {idx.dtype}"
            )
        if hasattr(td_errors, "detach"):
            td_errors = td_errors.detach().cpu().numpy()
        td = np.asarray(td_errors, np.float64).reshape(-1) if np.size(td_errors) else np.empty(0)
        if idx.ndim != 1 or td.shape != idx.shape:
            raise ValueError(
                f"indices must be 1-D with one TD error each: got {idx.shape} indices and {td.shape} TD errors"
            )
        bad = np.flatnonzero((idx["shard"] < 0) | (idx["shard"] >= self.num_shards))
        if bad.size:
            raise IndexError(f"indices[{bad[0]}] names shard {idx['shard'][bad[0]]}; this replay has {self.num_shards}")
        bad = np.flatnonzero((idx["slot"] < 0) | (idx["slot"] >= self.capacity_per_shard))
        if bad.size:
            raise IndexError(
                f"indices[{bad[0]}] names slot {idx['slot'][bad[0]]}, outside [0, {self.capacity_per_shard})"
            )
        # A slot past its shard's size was never filled (sizes only grow within an incarnation, and the
        # learner's summaries are at least as new as the draw; other incarnations' entries are dropped there).
        sizes = np.array([s.size for s in self._summaries], np.int64)
        incarnations = np.array([s.incarnation for s in self._summaries], np.int64)
        shard_of = idx["shard"].astype(np.int64)
        bad = np.flatnonzero((idx["incarnation"] == incarnations[shard_of]) & (idx["slot"] >= sizes[shard_of]))
        if bad.size:
            k = shard_of[bad[0]]
            raise IndexError(
                f"indices[{bad[0]}] names slot {idx['slot'][bad[0]]} of shard {k}, which holds {sizes[k]} "
                "transitions: it was never filled (not an index a sample returned)"
            )
        bad = np.flatnonzero(~(np.isfinite(td) & (td >= 0)))
        if bad.size:
            raise ValueError(f"td_errors[{bad[0]}] is {td[bad[0]]}: TD errors must be finite magnitudes (>= 0)")
        raw = td + self.eps
        with np.errstate(over="ignore"):
            too_big = np.flatnonzero(raw**self.alpha > self._max_leaf)
        if too_big.size:
            raise ValueError(
                f"td_errors[{too_big[0]}] = {td[too_big[0]]} gives priority {raw[too_big[0]]}**{self.alpha}, "
                f"more than the trees can sum ({self._max_leaf:.3g})"
            )
        if idx.size == 0:
            return
        with self._lock:
            if self.staleness:
                self._schedule.record(idx, td)
            else:
                self._send_updates(idx, td)

    @property
    def staleness(self) -> int:
        """``k`` of the schedule (see :mod:`hetero_replay.schedule`)."""
        return self.schedule_options.staleness

    def _send_updates(self, idx: np.ndarray, td: np.ndarray) -> None:
        """One update call per shard (and incarnation) the entries name, without waiting for the replies."""
        # The max before this update: each shard raises its own from the entries it applies (not the dropped ones).
        top = max(s.max_priority for s in self._summaries)
        for k, entries in enumerate(self._updates_by_shard(idx, td)):
            if entries:
                self._pending.append((k, self._shards[k].update.remote(entries, top)))

    def _updates_by_shard(self, idx: np.ndarray, td: np.ndarray) -> list[bytes]:
        """Checked update entries as each shard takes them: one byte string of records per shard (see wire)."""
        return wire.updates_by_shard(idx["shard"], idx["slot"], idx["epoch"], idx["incarnation"], td, self.num_shards)

    # -- routing and assembling ------------------------------------------------------------

    def _route(self, n: int, totals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The draws of :attr:`batches_per_call` batches of ``n`` as (shard, offset inside it), batch after batch.

        Each batch is ``n`` global draws from the learner's generator (stratified per batch).
        """
        grand = float(totals.sum())
        u = self.rng.random(self.batches_per_call * n).reshape(self.batches_per_call, n)
        mass = (np.arange(n, dtype=np.float64) + u) * (grand / n) if self.options.stratified else u * grand
        mass = mass.reshape(-1)
        n = mass.size
        prefix = np.cumsum(totals)
        shard_of = np.searchsorted(prefix, mass, side="right")
        # A draw rounded onto the grand total, or onto a prefix that only empty shards follow, goes to the last shard with mass.
        last = int(np.flatnonzero(totals > 0)[-1])
        shard_of = np.minimum(shard_of, last)
        while (
            True
        ):  # (rare) a draw landing on an empty shard's zero-width range: move it to the previous shard with mass
            empty = totals[shard_of] <= 0
            if not empty.any():
                break
            shard_of[empty] -= 1
        offsets = mass - (prefix[shard_of] - totals[shard_of])
        offsets = np.clip(offsets, 0.0, np.nextafter(totals[shard_of], 0.0))
        return shard_of, offsets

    def _send_draw(
        self, shard_of: np.ndarray, offsets: np.ndarray, totals: np.ndarray, serve_changed: bool
    ) -> list[Any]:
        """One draw call per shard, all sent at once; their replies.

        The call draws the batches of the schedule's next ``m`` steps ``j .. j + m - 1``
        (``m`` = :attr:`batches_per_call`) from one state, the one batch ``j`` sees
        (the schedule runs with staleness ``k + m - 1``). Held-back updates that
        batch must see go out first, on their own (a shard runs one caller's calls
        in order); those the next call's first batch ``j + m`` must see ride on
        this call, applied after serving it.
        """
        j, m = self._schedule.served, self.batches_per_call
        while (update := self._schedule.due(j)) is not None:
            self._send_updates(update.indices, update.td_errors)
        carried = []
        while (update := self._schedule.due(j + m)) is not None:
            carried.append(update)
        if carried:
            idx, td = (np.concatenate(parts) for parts in zip(*((u.indices, u.td_errors) for u in carried)))
            carry = self._updates_by_shard(idx, td)
        else:
            carry = [b""] * self.num_shards
        _, offsets_of = wire.split_by_shard(shard_of, offsets, self.num_shards)
        top = float(max(s.max_priority for s in self._summaries))
        return [  # a plain tuple of numbers and bytes: what Ray sends cheapest (see DrawRequest)
            h.draw.remote(tuple(DrawRequest(offsets_of[k], s.incarnation, s.version, float(totals[k]), serve_changed,
                                            carry[k], top)))
            for k, (h, s) in enumerate(zip(self._shards, self._summaries, strict=True))
        ]  # fmt: skip

    def _receive(self, replies: list[Any]) -> list[ShardDraw] | None:
        """Wait for the draw replies; ``None`` if any shard had changed (or died: it is waited for)."""
        draws: list[ShardDraw] = []
        lost = False
        try:
            got = self._ray.get(replies)  # one wait for all (the common case)
        except cluster.actor_errors():
            got = None  # a shard died: each reply is waited for on its own below
        for k, ref in enumerate(replies):
            try:
                draw = ShardDraw.of(self._ray.get(ref) if got is None else got[k])
            except cluster.actor_errors():
                self._recover(k)
                lost = True
                continue
            self._store(k, draw.summary)
            self.stats["dropped_updates"] += draw.dropped
            draws.append(draw)
        if lost or any(d.rows is None for d in draws):
            return None
        return draws

    def _assemble(self, n: int, shard_of: np.ndarray, draws: list[ShardDraw], inexact: bool) -> list[_Drawn]:
        """The shards' replies put back in routed order (one pass over all of them), split into batches of ``n``."""
        # The shards' replies, joined, hold the draws grouped by shard (stable): `unsort` restores the routed order.
        unsort = np.empty(len(shard_of), np.int64)
        unsort[np.argsort(shard_of, kind="stable")] = np.arange(len(shard_of))
        counts = [len(d.slots) // 8 for d in draws]
        index = np.empty(len(shard_of), INDEX_DTYPE)
        index["shard"] = np.repeat([d.summary.shard for d in draws], counts)
        index["incarnation"] = np.repeat([d.summary.incarnation for d in draws], counts)
        index["slot"] = wire.join([d.slots for d in draws], np.int64)
        index["epoch"] = np.repeat([d.epoch for d in draws], counts)
        index = index[unsort]
        priorities = wire.join([d.priorities for d in draws], np.float64)[unsort]
        rows = wire.join([d.rows for d in draws if d.rows is not None], self._row_dtype)
        data = {name: rows[name][unsort] for name in self.schema}
        global_min = min(d.min for d in draws)  # each shard's, when it served: the state the batches were drawn from
        return [
            _Drawn(
                {k: v[i : i + n] for k, v in data.items()}, index[i : i + n], priorities[i : i + n], global_min, inexact
            )
            for i in range(0, len(index), n)
        ]

    # -- replies, failures, durable points -------------------------------------------------------

    def _collect(self) -> None:
        """Wait for the adds' and updates' replies still out; take in their summaries."""
        pending, self._pending = self._pending, []
        for k, ref in pending:
            try:
                reply = self._ray.get(ref)
            except cluster.actor_errors():
                self._recover(k)  # that call's work is in the shard's loss window
                continue
            if isinstance(reply, ShardSummary):
                self._store(k, reply)
            else:
                dropped, summary = reply
                self._store(k, summary)
                self.stats["dropped_updates"] += dropped

    def _deliver_held_back(self) -> None:
        """Send the updates the schedule still holds back (staleness >= 1) on their own."""
        while (update := self._schedule.next()) is not None:
            self._send_updates(update.indices, update.td_errors)

    def _store(self, k: int, summary: ShardSummary) -> None:
        """Take in a reply's summary of shard ``k``, unless a newer one of the same incarnation is known."""
        known = self._summaries[k]
        if summary.incarnation != known.incarnation or summary.version >= known.version:
            self._summaries[k] = summary

    def _reply(self, method: Any) -> Any:
        """Call a shard's ``method`` (no arguments) and wait for its reply."""
        return self._ray.get(method.remote())

    def _recover(self, k: int) -> None:
        """Wait for Ray to restart shard ``k`` (it reloads its last durable point); take in its new summary."""
        self._summaries[k] = cluster.wait_for(
            functools.partial(self._reply, self._shards[k].summary), k, self.recovery_timeout, self.name
        )
        self.stats["recoveries"] += 1

    def flush(self) -> None:
        """Apply the updates still carried (staleness >= 1), then a durable point of every shard now, and wait."""
        self._check_open()
        with self._lock:
            self._deliver_held_back()
            self._collect()
            refs = [h.flush.remote() for h in self._shards]
            for k, ref in enumerate(refs):
                self._summaries[k] = cluster.wait_for(
                    functools.partial(self._ray.get, ref), k, self.recovery_timeout, self.name
                )
            if self._limiter is not None and self.config.durable_dir is not None:
                save_state(self.config.durable_dir, self._ray.get(self._limiter.state_dict.remote()))

    # -- what only a replay in one process can offer: refused, saying why ------------------------------

    def view(self, name: str) -> Any:
        """Refused: the rows live on the shards, so there is no array to view (host adapters' array attributes)."""
        raise TypeError(
            f"field {name!r} of a ShardedReplay lives on its shards: there is no array view of it; "
            "read sampled rows from sample().data"
        )

    def read_rows(self, name: str, indices: Any) -> Any:
        """Refused: rows are read through :meth:`sample` (a slot names no row across shards)."""
        raise TypeError(f"a ShardedReplay's rows live on its shards: field {name!r} is read through sample().data")

    def write_rows(self, start: int, fields: Mapping[str, Any]) -> None:
        """Refused: rows are written through :meth:`add` or a :meth:`writer`."""
        raise TypeError("a ShardedReplay's rows live on its shards: write them with add() or a writer()")

    def clear_priorities(self, indices: Any) -> None:
        """Refused: a sharded replay's priorities change through :meth:`update_priorities` only."""
        raise TypeError("a ShardedReplay's priorities change through update_priorities() only")

    def leaves(self) -> np.ndarray:
        """Refused: the priorities live on the shards (:attr:`summaries` gives each shard's totals)."""
        raise TypeError("the priorities of a ShardedReplay live on its shards: see replay.summaries")

    def state_dict(self) -> dict[str, Any]:
        """Refused: shards make durable points themselves (``durable_dir=``, :meth:`flush`)."""
        raise TypeError(_NOT_IN_ONE_PROCESS)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Refused: shards reload their own durable points when Ray restarts them."""
        raise TypeError(_NOT_IN_ONE_PROCESS)

    def save(self, path: Any) -> None:
        """Refused: shards make durable points themselves (``durable_dir=``, :meth:`flush`)."""
        raise TypeError(_NOT_IN_ONE_PROCESS)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the shards are no longer this learner's)."""
        return not self._shards

    def _check_open(self) -> None:
        if not self._shards:
            raise RuntimeError(f"the sharded replay {self.name!r} is closed")

    def shard_pids(self) -> list[int]:
        """The process id of each shard (on its node)."""
        return [self._ray.get(h.pid.remote()) for h in self._shards]

    def writer(self, policy: str = "least_full") -> Any:
        """A picklable handle that actor processes and Ray tasks add transitions with.

        See :class:`~hetero_replay.distributed.writer.ShardWriter`; ``policy``
        is ``"least_full"`` or ``"round_robin"``.
        """
        self._check_open()
        return ShardWriter(
            self.name, self.num_shards, self.address, self.config, policy, self.recovery_timeout,
            limited=self._limiter is not None,
        )  # fmt: skip

    @property
    def rate_limiter(self) -> dict[str, Any] | None:
        """The rate limiter's settings and counters now (``RateLimiter.state_dict``), or ``None`` without one."""
        self._check_open()
        return None if self._limiter is None else dict(self._ray.get(self._limiter.state_dict.remote()))

    def close(self, destroy: bool | None = None) -> None:
        """Stop using the shards; close and kill them unless they are detached (``destroy`` overrides).

        A closed shard makes a last durable point (with ``durable_dir``, where the rate
        limiter's counters are saved too) and releases its files, so ``reopen=True``
        can continue them at once. A shard that does not answer within
        ``recovery_timeout`` is killed without.
        """
        atexit.unregister(self._close_at_exit)
        with self._lock:
            # A shard lost for good must not keep the others alive: its pending replies are given up.
            with contextlib.suppress(cluster.ShardLostError):
                self._deliver_held_back()
                self._collect()
            try:
                if destroy if destroy is not None else not self.detached:
                    _stop(self._shards, self._limiter, self.recovery_timeout, self.config.durable_dir)
            finally:
                self._shards = []

    def __getstate__(self) -> Any:
        raise TypeError(_NOT_IN_ONE_PROCESS)


_NOT_IN_ONE_PROCESS = (
    "a ShardedReplay's state is not in one process: its shards make durable points themselves (durable_dir=, flush()); "
    "other processes add through replay.writer(), and a restarted learner uses ShardedReplay.attach(name)"
)


def _close_at_exit(ref: weakref.ref[ShardedReplay], owner: int, session: str | None) -> None:
    """Close a replay its learner left open, at exit: in the learner's process only, while its Ray session runs."""
    replay = ref()
    if replay is not None and os.getpid() == owner and cluster.session() == session:
        replay.close()


def _stop(shards: list[Any], limiter: Any, timeout: float, durable_dir: str | None) -> None:
    """Close the ``shards`` (a last durable point, their files released), then kill them and the ``limiter``.

    The limiter is closed first, so its waiting writers wake (``RateLimited``).
    Shards that are dead, or do not answer within ``timeout`` s in all, are killed
    all the same; a shard's own error (its last durable point failed) is raised
    once every shard is closed and killed. With a ``durable_dir``, the limiter's
    counters are saved after the shards' last durable points.
    """
    ray = cluster.ray_module()
    gone = (*cluster.actor_errors(), ray.exceptions.GetTimeoutError)
    deadline = time.monotonic() + timeout
    failed: list[Exception] = []

    def wait(ref: Any) -> Any:
        try:
            return ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
        except gone:
            return None
        except Exception as e:  # raised below, once every actor is gone
            failed.append(e)
            return None

    try:
        if limiter is not None:
            wait(limiter.close.remote())
        for closing in [h.close.remote() for h in shards]:
            wait(closing)
        if limiter is not None and durable_dir is not None and (state := wait(limiter.state_dict.remote())):
            save_state(durable_dir, state)
    finally:
        for actor in shards if limiter is None else [*shards, limiter]:
            ray.kill(actor, no_restart=True)
    if failed:
        raise failed[0]


def _check_same_replay(name: str, running: list[Any], num_shards: int, config: ShardConfig) -> None:
    """Refuse to join running shards of ``name`` that another replay (other arguments) started."""
    theirs = cluster.ray_module().get(running[0].__ray_call__.remote(lambda shard: shard.config))
    if theirs.schema != config.schema:
        raise ValueError(
            f"name={name!r} is taken by a running sharded replay of schema {Schema.from_json(theirs.schema)!r}, "
            f"not this one's {Schema.from_json(config.schema)!r}: choose another name (or close that replay)"
        )
    differ = [f for f in vars(config) if getattr(theirs, f) != getattr(config, f)]
    if len(running) != num_shards:
        differ.insert(0, "num_shards")
    if differ:
        raise ValueError(
            f"name={name!r} is taken by a running sharded replay built with other {', '.join(differ)}: "
            "choose another name, or ShardedReplay.attach(name) to continue it"
        )


def _check_durable_dir(durable_dir: str, reopen: bool) -> None:
    """Refuse to start on another run's durable points unless ``reopen``; refuse ``reopen`` with none there."""
    try:
        found = sorted(e for e in os.listdir(durable_dir) if e.startswith("shard-"))
    except FileNotFoundError:
        found = []
    if found and not reopen:
        raise ValueError(
            f"durable_dir={durable_dir!r} holds the shards of another run ({', '.join(found[:4])}"
            f"{', ...' if len(found) > 4 else ''}): pass reopen=True to continue it, or choose another directory"
        )
    if reopen and not found:
        raise ValueError(f"reopen=True but durable_dir={durable_dir!r} holds no shard's durable point")


class _Drawn(NamedTuple):
    """A batch a call drew, not yet served: IS weights are made when it is (with the ``beta`` of that call)."""

    data: dict[str, np.ndarray]
    indices: np.ndarray
    priorities: np.ndarray  # p ** alpha of each transition when its shard served it
    global_min: float  # the smallest positive p ** alpha over all shards then
    inexact: bool  # some shard rescaled its offsets (served a newer state than routed)


def _check_batches_per_call(batches_per_call: int, staleness: StalenessOptions) -> None:
    """``batches_per_call`` above 1 draws several batches from one state: only a relaxed schedule allows it."""
    check_int(batches_per_call, "batches_per_call", 1, 1024)
    if batches_per_call > 1 and not staleness.staleness:
        raise ValueError(
            f"batches_per_call={batches_per_call} draws later batches before earlier updates apply: it needs "
            "staleness >= 1 (staleness=0 is exact PER, each batch seeing every earlier update)"
        )


def _sharded_staleness(staleness: int | StalenessOptions) -> StalenessOptions:
    """``staleness`` as options this executor runs: ``k`` 0, 1 or 2 (with 2, the next draw is sent ahead)."""
    if not isinstance(staleness, StalenessOptions):
        staleness = StalenessOptions(staleness)
    if staleness.staleness > 2:
        raise ValueError(f"staleness must be 0, 1 or 2 for a ShardedReplay, got {staleness.staleness}")
    return staleness


def _per_shard_options(options: Any, num_shards: int) -> list[dict[str, Any]]:
    """``actor_options`` as one dict per shard (a single mapping applies to all)."""
    if options is None or isinstance(options, Mapping):
        return [dict(options or {}) for _ in range(num_shards)]
    if (
        not isinstance(options, Sequence)
        or len(options) != num_shards
        or not all(isinstance(o, Mapping) for o in options)
    ):
        raise ValueError(
            f"actor_options must be a dict or a list of {num_shards} dicts (one per shard), got {options!r}"
        )
    return [dict(o) for o in options]


__all__ = ["INDEX_DTYPE", "ShardedReplay"]
