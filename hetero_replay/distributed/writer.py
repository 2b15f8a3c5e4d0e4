"""ShardWriter: how actor processes and Ray tasks add transitions to a sharded replay.

A writer is a small picklable value (the replay's name, its shard count, the
cluster's address, the schema), so it goes to ``multiprocessing`` children
(spawn), ``SubprocVecEnv`` workers and Ray tasks alike. In a process without
Ray it joins the cluster on first use; it finds the shards by name.

Each :meth:`ShardWriter.add` is checked against the schema first, then sent
whole to one shard: the least full one (by the sizes the writer last heard
of) or the next in turn. Adds from many writers and the learner's samples
proceed concurrently. The shard queues a writer's rows and takes them into its
tree during the learner's next call to it, so writers never make a learner's
draw stale; the rows become sampleable one learner call later (see :mod:`.shard`). A shard that dies
under an add is waited for (Ray restarts it) and the rows are sent again: the
rows it had not made durable are its loss window. A writer of a closed replay
fails at once (:class:`~.cluster.ShardLostError`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from hetero_replay.distributed import cluster
from hetero_replay.distributed.limiter import find_limiter
from hetero_replay.distributed.shard import ShardConfig, validate_rows
from hetero_replay.storage import Schema

POLICIES = ("least_full", "round_robin")


class ShardWriter:
    """Adds transitions to the shards of :class:`~hetero_replay.distributed.ShardedReplay` ``name``.

    Get one from :meth:`ShardedReplay.writer`; pass it to actor processes or Ray tasks.

    Args:
        name: the sharded replay's name.
        num_shards: its shard count.
        address: the Ray cluster's GCS address (used where this process has no Ray yet).
        config: the shards' :class:`~hetero_replay.distributed.shard.ShardConfig` (schema, capacity).
        policy: ``"least_full"`` (default) or ``"round_robin"``.
        recovery_timeout: seconds to wait for a restarting shard.
        limited: the replay has a rate limiter (:mod:`.limiter`): every add waits for it first.
    """

    def __init__(
        self, name: str, num_shards: int, address: str, config: ShardConfig, policy: str = "least_full",
        recovery_timeout: float = 120.0, limited: bool = False,
    ) -> None:  # fmt: skip
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.name, self.num_shards, self.address, self.config = name, num_shards, address, config
        self.policy, self.recovery_timeout = policy, recovery_timeout
        self.limited = limited
        self._handles: list[Any] | None = None
        self._limiter: Any | None = None
        self._sizes = np.zeros(num_shards, np.int64)
        self._max_priority = 1.0
        self._turn = 0
        self.rows_added = 0

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"] = state["_limiter"] = None  # looked up again in the receiving process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._sizes = np.array(self._sizes)  # Ray hands arrays over read-only

    @property
    def schema(self) -> Schema:
        return Schema.from_json(self.config.schema)

    def _shards(self) -> list[Any]:
        if self._handles is None:
            cluster.connect(self.address)
            self._handles = cluster.find_shards(self.name)[: self.num_shards]
            self._limiter = find_limiter(self.name) if self.limited else None
            if self.limited and self._limiter is None:
                raise cluster.ShardLostError(f"the rate limiter of the sharded replay {self.name!r} is gone (closed?)")
        return self._handles

    def add(self, batch: Mapping[str, Any]) -> int:
        """Append ``batch`` (``{field: (n, ...) array}``) to one shard; returns the rows added.

        The batch is checked first (as :meth:`PrioritizedReplay.add` checks
        it): a refused batch reaches no shard. At most ``capacity_per_shard`` rows per call.
        """
        rows, arrays = validate_rows(self.schema, self.config.capacity, batch)
        if rows == 0:
            return 0
        shards = self._shards()
        if self._limiter is not None:  # waits while the writers are ahead of the ratio (RateLimited after its timeout)
            try:
                cluster.ray_module().get(self._limiter.insert.remote(rows))
            except cluster.actor_errors() as e:
                raise cluster.ShardLostError(
                    f"the rate limiter of the sharded replay {self.name!r} is gone: {e}"
                ) from e
        if self.policy == "least_full":
            k = int(np.argmin(np.roll(self._sizes, -self._turn))) + self._turn
            k %= self.num_shards
        else:
            k = self._turn
        self._turn = (k + 1) % self.num_shards
        ray = cluster.ray_module()
        summary = cluster.wait_for(
            lambda: ray.get(shards[k].stage.remote(arrays, self._max_priority)), k, self.recovery_timeout, self.name
        )
        self._sizes[k] = summary.size + summary.staged
        self._max_priority = max(self._max_priority, summary.max_priority)
        self.rows_added += rows
        return rows

    def __repr__(self) -> str:
        return f"ShardWriter(name={self.name!r}, shards={self.num_shards}, policy={self.policy!r})"


__all__ = ["POLICIES", "ShardWriter"]
