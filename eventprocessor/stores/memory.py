"""An in-process checkpoint store that runs the real protocol.

``InMemoryCheckpointStore`` is :class:`~eventprocessor.stores.protocol.ProtocolStore` (the claim,
fence, checkpoint, member and log-entry protocol the Blob and Table stores run) over
:class:`InMemoryRecords`, a backend with the service's semantics: every write gets a
new random etag and the injected clock's time, create-if-absent fails on an existing
record, a stale etag fails, records are copied in and out. Used by unit tests, the demo
and simulations; its calls never suspend, so each one is a single step to whoever runs
beside it (nothing can interleave with a claim half-way).
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from .backend import (
    MEMBER,
    OWNERSHIP,
    EtagMismatch,
    Kind,
    RecordBackend,
    RecordExists,
    RecordListing,
    RecordMissing,
    StoredRecord,
)
from .protocol import ProtocolStore

if TYPE_CHECKING:  # in annotations only
    from .backend import Fields, Scope

__all__ = ["InMemoryCheckpointStore", "InMemoryRecords"]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class InMemoryRecords(RecordBackend):
    """Records in dicts, with the semantics of a storage service (see module docstring).

    Keys containing ``/`` (planted by tests) list as foreign objects, as blobs at deeper
    paths do.
    """

    where = "the in-memory store"
    sequential = True

    def __init__(self, clock: Callable[[], datetime]) -> None:
        super().__init__()
        self._clock = clock
        self._tables: dict[tuple[Kind, Scope], dict[str, StoredRecord]] = {}

    def _table(self, kind: Kind, scope: Scope) -> dict[str, StoredRecord]:
        return self._tables.setdefault((kind, scope), {})

    def _store(self, kind: Kind, scope: Scope, key: str, fields: Mapping[str, Any], data: bytes) -> StoredRecord:
        record = StoredRecord(key=key, etag=f'"{uuid.uuid4().hex}"', last_modified=self._clock(), fields=dict(fields),
                              name=f"{kind.name} record {key!r}", data=bytes(data))
        self._table(kind, scope)[key] = record
        return replace(record, fields=dict(record.fields))

    def _count(self, operation: str, kind: Kind) -> None:
        self.request_counts[f"{operation}_{kind.name}"] += 1

    async def read(self, kind: Kind, scope: Scope, key: str, *, with_data: bool = False) -> StoredRecord | None:
        self._count("read", kind)
        record = self._table(kind, scope).get(key)
        if record is None:
            return None
        return replace(record, fields=dict(record.fields), data=record.data if with_data else b"")

    async def create(self, kind: Kind, scope: Scope, key: str, fields: Fields, data: bytes = b"") -> StoredRecord:
        self._count("create", kind)
        if key in self._table(kind, scope):
            raise RecordExists(f"{kind.name} record {key!r} exists")
        return self._store(kind, scope, key, fields, data)

    async def replace(self, kind: Kind, scope: Scope, key: str, fields: Fields, etag: str) -> StoredRecord:
        self._count("replace", kind)
        current = self._table(kind, scope).get(key)
        if current is None:
            raise RecordMissing(f"{kind.name} record {key!r} does not exist")
        if current.etag != etag:
            raise EtagMismatch(f"{kind.name} record {key!r} changed")
        return self._store(kind, scope, key, fields, current.data)

    async def upsert(self, kind: Kind, scope: Scope, key: str, fields: Fields) -> StoredRecord:
        self._count("upsert", kind)
        return self._store(kind, scope, key, fields, b"")

    async def delete(self, kind: Kind, scope: Scope, key: str) -> None:
        self._count("delete", kind)
        self._table(kind, scope).pop(key, None)

    async def list(self, kind: Kind, scope: Scope, prefix: str = "") -> RecordListing:
        self._count("list", kind)
        return self._listing(kind, scope, prefix)

    async def list_ownership_and_members(self, scope: Scope) -> tuple[RecordListing, RecordListing]:
        """One request, as the Blob and Table backends make it."""
        self._count("list", OWNERSHIP)
        return self._listing(OWNERSHIP, scope, ""), self._listing(MEMBER, scope, "")

    def _listing(self, kind: Kind, scope: Scope, prefix: str) -> RecordListing:
        listing = RecordListing(records=[], server_time=self._clock())
        for key, record in self._table(kind, scope).items():
            if not key.startswith(prefix):
                continue
            if "/" in key:
                listing.foreign.append((record.name, record.etag))
            else:
                listing.records.append(replace(record, fields=dict(record.fields), data=b""))
        return listing

    def plant(self, kind: Kind, scope: Scope, key: str, fields: Mapping[str, Any], data: bytes = b"") -> None:
        """Write a raw record unconditionally and unchecked, as a foreign program or a
        corruption would (for tests)."""
        self._store(kind, scope, key, fields, data)


class InMemoryCheckpointStore(ProtocolStore):
    """Checkpoint store held in this process, running the real store protocol.

    ``clock`` returns the store's "server" time as an aware datetime; inject one to
    simulate time or clock skew. ``request_counts`` counts requests by kind, one per
    record read, written or listed, the way a remote store would bill them.

    Example::

        store = InMemoryCheckpointStore()
        processor = EventProcessor(source, store, MyProcessor)
    """

    def __init__(self, *, clock: Callable[[], datetime] | None = None,
                 _records: InMemoryRecords | None = None) -> None:
        self._clock = clock or _utcnow
        self._records = _records or InMemoryRecords(self._clock)
        super().__init__(self._records, operation_timeout=None)

    def new_client(self) -> InMemoryCheckpointStore:
        """Another client of the same records, with its own fence cache, as a second
        process would have (``request_counts`` are shared: they count the "service").

        Example::

            store = InMemoryCheckpointStore()
            processors = [EventProcessor(source, store.new_client(), MyProcessor) for _ in range(4)]
        """
        return InMemoryCheckpointStore(clock=self._clock, _records=self._records)

    def __repr__(self) -> str:
        return "InMemoryCheckpointStore()"

    def now(self) -> datetime:
        """The store's clock."""
        return self._clock()

    def wipe(self) -> None:
        """Drop every record of every client of this storage, as a storage account
        restored empty or an emulator restarted without persistence would; for tests
        of store data loss."""
        self._records._tables.clear()

    def plant_record(self, kind: str, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                     key: str, fields: Mapping[str, Any]) -> None:
        """Write a raw ``ownership``/``checkpoint``/``member`` record behind the protocol's
        back, as corruption or a foreign program would; for tests of bad records.
        ``key`` is the partition id (the encoded owner id for members).

        Example::

            store.plant_record("ownership", "ns", "hub", "$default", "7", {"epoch": "1"})  # no ownerid
        """
        scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        self._records.plant(Kind(kind), scope, key, fields)
