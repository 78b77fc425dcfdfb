"""Checkpoint stores, one module each.

``InMemoryCheckpointStore`` needs nothing extra. ``BlobCheckpointStore`` needs the
``[blob]`` extra and ``TableCheckpointStore`` the ``[table]`` extra; they are imported
lazily so that ``import stores`` never pulls in the Azure SDKs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .memory import InMemoryCheckpointStore

if TYPE_CHECKING:  # pragma: no cover
    from .blob import BlobCheckpointStore
    from .table import TableCheckpointStore

__all__ = ["InMemoryCheckpointStore", "BlobCheckpointStore", "TableCheckpointStore"]

_LAZY = {"BlobCheckpointStore": ".blob", "TableCheckpointStore": ".table"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'stores' has no attribute {name!r}")
