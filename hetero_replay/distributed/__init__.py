"""Distributed prioritized replay on Ray: :class:`ShardedReplay`, its writers and its shards.

Needs the ``ray`` extra (``pip install '.[ray]'`` in a checkout); Ray is imported
when a sharded replay is built, not when this package is. See
:mod:`hetero_replay.distributed.sharded` for how sampling stays exact across
shards, and docs/distributed.md for the guarantees, fault tolerance and numbers.
"""

from hetero_replay.distributed.cluster import ShardLostError
from hetero_replay.distributed.shard import ReplayShard, ShardSummary
from hetero_replay.distributed.sharded import INDEX_DTYPE, ShardedReplay
from hetero_replay.distributed.writer import ShardWriter

__all__ = ["INDEX_DTYPE", "ReplayShard", "ShardLostError", "ShardSummary", "ShardWriter", "ShardedReplay"]
