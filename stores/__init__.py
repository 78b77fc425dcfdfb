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


_EXTRA = {"BlobCheckpointStore": "blob", "TableCheckpointStore": "table"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name], __name__)
        except ModuleNotFoundError as error:
            from eventprocessor._install import install_command

            raise ModuleNotFoundError(f"{name} needs the [{_EXTRA[name]}] extra ({error.name!r} is not installed): "
                                      f"{install_command([_EXTRA[name]])}", name=error.name) from error
        return getattr(module, name)
    raise AttributeError(f"module 'stores' has no attribute {name!r}")
