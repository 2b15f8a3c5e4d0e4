"""The rate limiter of a ShardedReplay: one :class:`~hetero_replay.rate_limiter.RateLimiter` in a named Ray actor.

Writers (:class:`~.writer.ShardWriter`, in any process) ask it before each add
and the learner before each sample, so the samples-per-insert ratio holds over
the whole replay, whichever process adds. The actor runs its calls on threads
(``max_concurrency``), so a waiting side blocks one of its threads, not the
actor: the other side's call that lets it go still runs. A wait that times out
raises :class:`~hetero_replay.rate_limiter.RateLimited` in the caller (Ray
re-raises the actor's exception as an instance of it).

The actor's counters go into the replay's durable points (``limiter.json`` in
``durable_dir``, written by :meth:`ShardedReplay.flush`) and a reopened replay continues them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from hetero_replay.distributed import cluster
from hetero_replay.rate_limiter import RateLimiter

#: Threads of the limiter actor: callers waiting at once (each waiting writer or learner holds one).
MAX_WAITERS = 256
#: The limiter's counters in a ``durable_dir``.
STATE_FILE = "limiter.json"


class LimiterActor:
    """The actor: a :class:`RateLimiter` built from ``settings`` (its ``state_dict`` and ``timeout``)."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.limiter = limiter_of(settings)

    def sample(self, n: int) -> None:
        self.limiter.sample(n)

    def insert(self, n: int) -> None:
        self.limiter.insert(n)

    def state_dict(self) -> dict[str, Any]:
        return self.limiter.state_dict()

    def close(self) -> None:
        self.limiter.close()


def settings_of(limiter: RateLimiter) -> dict[str, Any]:
    """What rebuilds ``limiter`` (settings, counters, timeout) in another process: plain values."""
    return {**limiter.state_dict(), "timeout": limiter.timeout}


def limiter_of(settings: Mapping[str, Any]) -> RateLimiter:
    limiter = RateLimiter(settings["samples_per_insert"], settings["error"], settings["min_size"], settings["timeout"])
    limiter.load_state_dict(settings)
    return limiter


def limiter_name(replay: str) -> str:
    return f"{replay}/limiter"


def start_limiter(replay: str, settings: Mapping[str, Any], detached: bool) -> Any:
    """Start the limiter actor of ``replay`` (or return the running one of that name)."""
    ray = cluster.ray_module()
    options = {
        "name": limiter_name(replay), "namespace": cluster.NAMESPACE, "get_if_exists": True, "num_cpus": 0,
        "max_concurrency": MAX_WAITERS, "lifetime": "detached" if detached else None,
    }  # fmt: skip
    handle = ray.remote(LimiterActor).options(**options).remote(dict(settings))
    ray.get(handle.state_dict.remote())  # started (a refused state raises here)
    return handle


def find_limiter(replay: str) -> Any | None:
    """The running limiter actor of ``replay``, or ``None`` (a replay without one)."""
    try:
        return cluster.ray_module().get_actor(limiter_name(replay), namespace=cluster.NAMESPACE)
    except ValueError:
        return None


def saved_state(durable_dir: str) -> dict[str, Any] | None:
    """The counters a durable point kept in ``durable_dir``, or ``None``."""
    try:
        with open(os.path.join(durable_dir, STATE_FILE)) as f:
            return dict(json.load(f))
    except FileNotFoundError:
        return None


def save_state(durable_dir: str, state: Mapping[str, Any]) -> None:
    """Write the counters atomically (a temporary file renamed over the last)."""
    path = os.path.join(durable_dir, STATE_FILE)
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(dict(state), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


__all__ = ["LimiterActor", "find_limiter", "limiter_name", "save_state", "saved_state", "start_limiter"]
