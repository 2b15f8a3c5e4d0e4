"""Where transitions live.

``HostStorage`` keeps them in NumPy arrays on the host; ``TorchStorage``
(imported lazily: it needs torch) keeps them in torch tensors on any device or
in pinned host memory. :func:`make_storage` picks one from a placement name,
through the storages registered in :mod:`hetero_replay.registry`:

=========  ================  =============================================
placement  rows live on      storage
=========  ================  =============================================
host       cpu               :class:`HostStorage`, NumPy arrays
shared     cpu               ``SharedStorage``: a file mapping actor processes add to
disk       cpu               ``DiskStorage``: a ring file, parallel reads, durable points
pinned     cpu               ``TorchStorage`` in page-locked host memory
a device   any torch device  ``TorchStorage`` there (``"cpu"``, ``"cuda:1"``, ``"meta"``);
                             registered as ``"torch"``, chosen by the device name
=========  ================  =============================================

Other packages add storages with :func:`hetero_replay.registry.register_storage`
(see ``docs/backends.md``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from typing import Any

from hetero_replay import registry
from hetero_replay.registry import ANY_TORCH_DEVICE, register_storage
from hetero_replay.storage.base import Storage
from hetero_replay.storage.host import HostStorage
from hetero_replay.storage.schema import Field, Schema

#: Placement names besides device names ("cpu", "cuda", "cuda:1", "meta", ...).
HOST, PINNED, SHARED, DISK = "host", "pinned", "shared", "disk"


def _torch_check() -> str | None:
    """Found without importing torch."""
    return None if importlib.util.find_spec("torch") is not None else "torch is not installed"


def _host(capacity: int, schema: Schema | Mapping[str, Any], placement: Any) -> Storage:
    return HostStorage(capacity, schema)


def _pinned(capacity: int, schema: Schema | Mapping[str, Any], placement: Any) -> Storage:
    from hetero_replay.storage.torch_storage import TorchStorage

    return TorchStorage(capacity, schema, "cpu", pin_memory=True)


def _torch(capacity: int, schema: Schema | Mapping[str, Any], placement: Any) -> Storage:
    import torch

    from hetero_replay.storage.torch_storage import TorchStorage

    return TorchStorage(capacity, schema, torch.device(placement))


register_storage(
    HOST,
    _host,
    devices=("cpu",),
    threaded=True,  # large gathers run on the native thread pool
    description="NumPy arrays in host memory",
)
register_storage(
    PINNED,
    _pinned,
    devices=("cpu",),
    check=_torch_check,
    description="page-locked host tensors, async copies to a GPU (needs CUDA)",
)
register_storage(
    "torch",
    _torch,
    devices=(ANY_TORCH_DEVICE,),
    check=_torch_check,
    device_placement=True,
    description="torch tensors on the named device ('cpu', 'cuda:1', ...)",
)


def _shared(capacity: int, schema: Schema | Mapping[str, Any], placement: Any, **options: Any) -> Storage:
    from hetero_replay.storage.shared import SharedStorage

    return SharedStorage(capacity, schema, **options)


def _disk(capacity: int, schema: Schema | Mapping[str, Any], placement: Any, **options: Any) -> Storage:
    from hetero_replay.storage.disk import DiskStorage

    if "path" not in options:
        raise ValueError("storage='disk' needs storage_options={'path': <a directory for the buffer's files>}")
    return DiskStorage(capacity, schema, **options)


register_storage(
    SHARED,
    _shared,
    devices=("cpu",),
    threaded=True,
    description="a file mapping actor processes add rows to (writer()); /dev/shm by default",
)
register_storage(
    DISK,
    _disk,
    devices=("cpu",),
    description="a ring file on local disk, parallel reads, the newest rows in RAM, durable points",
)


def make_storage(
    placement: str, capacity: int, schema: Schema | Mapping[str, Any], options: Mapping[str, Any] | None = None
) -> Any:
    """Storage for ``capacity`` transitions of ``schema``, placed by name.

    Args:
        placement: the name of a registered storage (``"host"``: NumPy arrays,
            :class:`HostStorage`; ``"pinned"``: page-locked host tensors for
            asynchronous copies to a GPU), or a device name, which goes to the
            storage registered for that device (``"cpu"``, ``"cuda"``,
            ``"cuda:1"``, ...: :class:`~hetero_replay.storage.torch_storage.TorchStorage` there).

    Raises:
        ValueError: no registered storage takes ``placement``.
        ImportError: the storage is not usable here (e.g. torch is not installed).
    """
    spec = registry.storage_for(placement)
    spec.require(f"storage {placement!r}")
    if not options:
        return spec.factory(capacity, schema, placement)
    if not isinstance(options, Mapping):
        raise TypeError(f"storage_options must be a mapping, got {type(options).__name__}")
    try:
        return spec.factory(capacity, schema, placement, **options)
    except TypeError as e:
        if "unexpected keyword" in str(e) or "positional argument" in str(e):
            raise TypeError(f"storage {placement!r} does not take storage_options {dict(options)!r}: {e}") from e
        raise


__all__ = ["DISK", "HOST", "PINNED", "SHARED", "Field", "HostStorage", "Schema", "Storage", "make_storage"]
