"""Checkpoint stores, one module each.

``InMemoryCheckpointStore`` needs nothing extra. ``BlobCheckpointStore`` needs the
``[blob]`` extra, ``TableCheckpointStore`` the ``[table]`` extra and
``PostgresCheckpointStore`` the ``[postgres]`` extra; they are imported lazily so that
``import eventprocessor.stores`` never pulls in the Azure SDKs or asyncpg.

:func:`describe_error` says what an Azure storage error means (type, HTTP status, error
code, the service's first line with anything that could be a credential removed, the
likely cause and its fix): the stores' own messages use it, and so may yours.
``DEFAULT_OPERATION_TIMEOUT`` is the Blob and Table stores' default bound on one call
(seconds): what a timing plan for many processors has to fit a listing into.

Example::

    from eventprocessor.stores import DEFAULT_OPERATION_TIMEOUT, describe_error

    assert DEFAULT_OPERATION_TIMEOUT == 10.0
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._account import DEFAULT_OPERATION_TIMEOUT, describe_error
from .memory import InMemoryCheckpointStore

if TYPE_CHECKING:  # pragma: no cover
    from .blob import BlobCheckpointStore
    from .postgres import PostgresCheckpointStore
    from .table import TableCheckpointStore

__all__ = ["InMemoryCheckpointStore", "BlobCheckpointStore", "TableCheckpointStore", "PostgresCheckpointStore",
           "describe_error", "DEFAULT_OPERATION_TIMEOUT"]

_LAZY = {"BlobCheckpointStore": ".blob", "TableCheckpointStore": ".table", "PostgresCheckpointStore": ".postgres"}


_EXTRA = {"BlobCheckpointStore": "blob", "TableCheckpointStore": "table", "PostgresCheckpointStore": "postgres"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        try:
            module = importlib.import_module(_LAZY[name], __name__)
        except ModuleNotFoundError as error:
            from eventprocessor.extras import install_command

            raise ModuleNotFoundError(f"{name} needs the [{_EXTRA[name]}] extra ({error.name!r} is not installed): "
                                      f"{install_command([_EXTRA[name]])}", name=error.name) from error
        return getattr(module, name)
    raise AttributeError(f"module 'eventprocessor.stores' has no attribute {name!r}")
