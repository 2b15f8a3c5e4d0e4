"""Ray, imported lazily: joining a cluster, starting and finding shard actors, waiting out a restart.

Shards are named actors ``"<replay name>/shard-<k>"`` in the namespace
:data:`NAMESPACE`, so writers in other processes and a restarted learner find
them by name. Ray restarts a shard whose process dies (``max_restarts=-1``);
calls made while it restarts fail with Ray's actor errors, which
:func:`wait_for` turns into a wait (bounded, then :class:`ShardLostError`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any, TypeVar

from hetero_replay.registry import install_hint

NAMESPACE = "hetero_replay"

T = TypeVar("T")


class ShardLostError(RuntimeError):
    """A shard stayed unreachable longer than the recovery timeout (its node gone, or restarts exhausted)."""


def ray_module() -> Any:
    """``import ray``, or an ``ImportError`` that names the extra to install."""
    try:
        import ray
    except ImportError as e:  # pragma: no cover - the message is the point
        raise ImportError(f"hetero_replay.distributed needs Ray (ray==2.60.0): {install_hint('ray')}") from e
    return ray


def connect(address: str | None, num_cpus: int | None = None) -> str:
    """Join the cluster at ``address``, or start a local Ray instance (``address=None``); returns its GCS address.

    An already initialised Ray is used as it is.
    """
    ray = ray_module()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"namespace": NAMESPACE, "include_dashboard": False, "log_to_driver": False}
        if address is None:  # "local": a new instance, even where `ray start` left a cluster running
            kwargs["num_cpus"] = num_cpus if num_cpus is not None else min(os.cpu_count() or 1, 8)
        ray.init(address=address or "local", **kwargs)
    return str(ray.get_runtime_context().gcs_address)


def session() -> str | None:
    """This process's Ray connection, or ``None`` without one: actor handles of another are void (``ray.shutdown``)."""
    ray = ray_module()
    return str(ray.get_runtime_context().get_node_id()) if ray.is_initialized() else None


def shard_name(replay: str, shard: int) -> str:
    return f"{replay}/shard-{shard}"


@cache
def _remote_shard() -> Any:
    from hetero_replay.distributed.shard import ReplayShard

    return ray_module().remote(ReplayShard)


def start_shard(replay: str, shard: int, config: Any, detached: bool, actor_options: Mapping[str, Any]) -> Any:
    """Start shard ``shard`` of ``replay`` (or return the running one of that name)."""
    options = {
        "name": shard_name(replay, shard),
        "namespace": NAMESPACE,
        "max_restarts": -1,
        "max_task_retries": 0,  # the learner and writers decide what a failed call means
        "lifetime": "detached" if detached else None,
        "get_if_exists": True,
        "num_cpus": 0,  # a shard waits on calls; it must not hold the CPUs Ray tasks need
        **actor_options,
    }
    return _remote_shard().options(**options).remote(shard, config)


def running_shards(replay: str) -> list[Any]:
    """The running (or restarting) shards of ``replay``, in order; empty if there are none."""
    ray = ray_module()
    handles: list[Any] = []
    while True:
        try:
            handles.append(ray.get_actor(shard_name(replay, len(handles)), namespace=NAMESPACE))
        except ValueError:
            return handles


def find_shards(replay: str) -> list[Any]:
    """The running shards of ``replay``, in order; ``ValueError`` if there are none."""
    handles = running_shards(replay)
    if not handles:
        raise ValueError(
            f"no shards of a sharded replay named {replay!r} run in this Ray cluster (namespace {NAMESPACE!r})"
        )
    return handles


def actor_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a call to a dead or restarting actor raises."""
    ex = ray_module().exceptions
    return (ex.RayActorError, ex.ActorUnavailableError)


def wait_for(call: Callable[[], T], shard: int, timeout: float, replay: str | None = None) -> T:
    """``call()`` (a ``ray.get`` of one shard's reply), retried while the shard restarts, up to ``timeout`` s.

    A shard that cannot come back fails at once, not after ``timeout``: one whose
    constructor raised (Ray does not restart it), or, given the ``replay``'s name,
    one that no longer exists (its replay was closed).
    """
    errors = actor_errors()
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        try:
            return call()
        except errors as e:
            if getattr(e, "actor_init_failed", False):
                # The message ends with the constructor's exception; the whole traceback stays in the chain.
                cause = str(e).rstrip().splitlines()[-1]
                raise ShardLostError(f"shard {shard} failed to start: {cause}") from e
            if replay is not None and not _exists(shard_name(replay, shard)):
                raise ShardLostError(
                    f"shard {shard} of the sharded replay {replay!r} is gone: the replay was closed"
                ) from e
            if time.monotonic() > deadline:
                raise ShardLostError(
                    f"shard {shard} has been unreachable for {timeout:.0f} s (its node gone, or Ray gave up "
                    f"restarting it; see `ray status`): {e}"
                ) from e
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _exists(actor: str) -> bool:
    """Whether the named actor is registered (alive or restarting; a killed one's name is freed)."""
    try:
        ray_module().get_actor(actor, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


__all__ = [
    "NAMESPACE",
    "ShardLostError",
    "actor_errors",
    "connect",
    "find_shards",
    "ray_module",
    "running_shards",
    "session",
    "start_shard",
    "wait_for",
]
