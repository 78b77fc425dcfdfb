"""The checkpoint-store protocol, written once over a small backend of record primitives.

Every store in this package is a :class:`ProtocolStore` over a
:class:`~eventprocessor.stores.backend.RecordBackend`:
the backend knows the storage calls, the layout and the encoding of fields (blob
metadata, table properties, dicts in memory); the protocol knows claims, fences,
checkpoints, members and log entries. So the in-memory store runs exactly the protocol
the Blob and Table stores run, and the conformance suite tests one protocol three times.

The protocol is split along its contracts, one module each:

* :mod:`~eventprocessor.stores.backend`: the backend interface, the primitives a new
  store implements (read, create, replace, upsert, delete, list);
* :mod:`~eventprocessor.stores.codec`: what fields may hold, and how records read back;
* :mod:`~eventprocessor.stores.calls`: every request bounded by ``operation_timeout``,
  and conditional writes that recognise themselves (write tokens);
* :mod:`~eventprocessor.stores.ownership`: claims, renewals, releases, handoff requests;
* :mod:`~eventprocessor.stores.checkpoints`: fenced checkpoints and the fence cache;
* :mod:`~eventprocessor.stores.members` and :mod:`~eventprocessor.stores.entries`:
  heartbeat records and log entries.

:class:`ProtocolStore` puts them together over one backend.
"""
from __future__ import annotations

from .contract import CheckpointStore
from .entries import EntryProtocol
from .ownership import OwnershipProtocol

__all__ = ["ProtocolStore"]


class ProtocolStore(OwnershipProtocol, EntryProtocol, CheckpointStore):
    """A checkpoint store: the protocol of this package over one
    :class:`~eventprocessor.stores.backend.RecordBackend`.

    ``operation_timeout`` (seconds, or ``None`` for none) bounds every call, retries
    included; see :mod:`~eventprocessor.stores.calls`.

    Example::

        class MyStore(ProtocolStore):
            def __init__(self) -> None:
                super().__init__(MyRecords(), operation_timeout=10.0)
    """
