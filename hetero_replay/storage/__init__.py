"""Where transitions live.

``HostStorage`` keeps them in NumPy arrays on the host; ``TorchStorage``
(imported lazily: it needs torch) keeps them in torch tensors on any device or
in pinned host memory. :func:`make_storage` picks one from a placement name.
"""

from __future__ import annotations

from typing import Any, Mapping

from hetero_replay.storage.base import Storage
from hetero_replay.storage.host import HostStorage
from hetero_replay.storage.schema import Field, Schema

#: Placement names besides torch device strings ("cpu", "cuda", "cuda:1", "meta", ...).
HOST, PINNED = "host", "pinned"


def make_storage(placement: str, capacity: int, schema: Schema | Mapping[str, Any]) -> Any:
    """Storage for ``capacity`` transitions of ``schema``, placed by name.

    Args:
        placement: ``"host"`` (NumPy arrays, :class:`HostStorage`), ``"pinned"``
            (page-locked host tensors for asynchronous copies to a GPU), or a
            torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...) for
            :class:`~hetero_replay.storage.torch_storage.TorchStorage` there.
    """
    if placement == HOST:
        return HostStorage(capacity, schema)
    try:
        from hetero_replay.storage.torch_storage import TorchStorage
    except ImportError as e:
        raise ImportError(f"storage {placement!r} needs torch; install it or use storage='host'") from e
    import torch

    if placement == PINNED:
        return TorchStorage(capacity, schema, "cpu", pin_memory=True)
    try:
        device = torch.device(placement)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"storage must be 'host', 'pinned' or a torch device, got {placement!r}") from e
    return TorchStorage(capacity, schema, device)


__all__ = ["HOST", "PINNED", "Field", "HostStorage", "Schema", "Storage", "make_storage"]
