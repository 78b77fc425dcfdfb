"""The backend interface: the record primitives a store's protocol runs on.

Every store in this package is a :class:`~eventprocessor.stores.protocol.ProtocolStore`
over a :class:`RecordBackend`: the backend knows the storage calls, the layout and the
encoding of fields (blob metadata, table properties, dicts in memory); the protocol knows
claims, fences, checkpoints, members and log entries. A new store is a new backend: this
module is all it implements, and the one conformance suite
(``tests/test_store_conformance.py``) then runs the whole protocol on it.

Records
=======
A record is a key under a :class:`Kind` (ownership, checkpoint, member, or an entry of a
named log) in a scope (namespace, event hub, consumer group). It has string or integer
fields, an etag and a last-modified time set by the service, and, for log entries, a
body. The backend primitives:

* ``read``: the record, or ``None``;
* ``create``: create-if-absent; :class:`RecordExists` (409) when it exists;
* ``replace``: If-Match ``etag``; :class:`EtagMismatch` (412) when stale,
  :class:`RecordMissing` (404) when gone;
* ``upsert``: create or overwrite, unconditionally (member heartbeats only);
* ``delete``: delete if present;
* ``list``: every record of a kind and scope (optionally by key prefix), plus the
  service's clock and the names of foreign objects under the prefix.

Any other failure is a :class:`BackendFailure` with a description that holds no secret.

Example::

    class MyRecords(RecordBackend):
        where = "table 'checkpoints' of my database"

        async def read(self, kind, scope, key, *, with_data=False): ...
        ...

    class MyCheckpointStore(ProtocolStore):
        def __init__(self) -> None:
            super().__init__(MyRecords(), operation_timeout=10.0)
"""
from __future__ import annotations

import abc
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["RecordBackend", "Kind", "StoredRecord", "RecordListing", "Scope", "Fields", "OWNERSHIP", "CHECKPOINT",
           "MEMBER", "RecordConflict", "RecordExists", "EtagMismatch", "RecordMissing", "BackendFailure"]

Scope = tuple[str, str, str]
"""(fully qualified namespace, event hub, consumer group): where a record lives."""
Fields = dict[str, str | int]
"""A record's fields as written."""


class RecordConflict(Exception):
    """A conditional write lost: the record exists (409), changed (412) or vanished (404)."""


class RecordExists(RecordConflict):
    """Create-if-absent found the record (HTTP 409)."""


class EtagMismatch(RecordConflict):
    """If-Match failed: the record changed since that etag (HTTP 412)."""


class RecordMissing(RecordConflict):
    """The record does not exist (HTTP 404)."""


class BackendFailure(Exception):
    """Anything else: network, timeouts of the transport, 5xx after retries, 403. The
    message is a description without secrets (type, status, service error code).
    ``maybe_written`` is True when the request may have reached the service and taken
    effect (a network failure after sending, a 5xx), False when the service refused it."""

    def __init__(self, description: str, *, maybe_written: bool = False) -> None:
        super().__init__(description)
        self.maybe_written = maybe_written


@dataclass(frozen=True)
class Kind:
    """What a record is: ``name`` is ownership, checkpoint, member or entry; ``log`` is
    the encoded log name of an entry (``""`` otherwise)."""

    name: str
    log: str = ""


OWNERSHIP = Kind("ownership")
CHECKPOINT = Kind("checkpoint")
MEMBER = Kind("member")


@dataclass(frozen=True)
class StoredRecord:
    """One record as the service returned it. ``name`` says where it lives, for logs."""

    key: str
    etag: str
    last_modified: datetime | None
    fields: Mapping[str, Any]
    name: str
    data: bytes = b""


@dataclass(frozen=True)
class RecordListing:
    records: list[StoredRecord]
    server_time: datetime | None
    foreign: list[tuple[str, str | None]] = field(default_factory=list)
    """(name, etag) of objects under the prefix that cannot be records (deeper paths)."""


class RecordBackend(abc.ABC):
    """The storage primitives a :class:`ProtocolStore` runs on.

    ``where`` names the container or table for messages; ``forbidden`` are the
    characters names may not contain; ``sequential`` makes batches of claims run one by
    one (the in-memory backend: with no I/O to overlap, running them at once would only
    let other callers interleave). ``request_counts`` counts requests by ``{op}_{kind}``.
    """

    where: str = "?"
    forbidden: str = "/\\"
    sequential: bool = False

    def __init__(self) -> None:
        self.request_counts: Counter = Counter()

    @abc.abstractmethod
    async def read(self, kind: Kind, scope: Scope, key: str, *, with_data: bool = False) -> StoredRecord | None:
        """The record, or ``None`` if it does not exist."""

    @abc.abstractmethod
    async def create(self, kind: Kind, scope: Scope, key: str, fields: Fields, data: bytes = b"") -> StoredRecord:
        """Create-if-absent; raises :class:`RecordExists`."""

    @abc.abstractmethod
    async def replace(self, kind: Kind, scope: Scope, key: str, fields: Fields, etag: str) -> StoredRecord:
        """Replace the fields If-Match ``etag``; raises :class:`EtagMismatch` or :class:`RecordMissing`."""

    @abc.abstractmethod
    async def upsert(self, kind: Kind, scope: Scope, key: str, fields: Fields) -> StoredRecord:
        """Create or overwrite, unconditionally."""

    @abc.abstractmethod
    async def delete(self, kind: Kind, scope: Scope, key: str) -> None:
        """Delete if present."""

    @abc.abstractmethod
    async def list(self, kind: Kind, scope: Scope, prefix: str = "") -> RecordListing:
        """Every record of ``kind`` in ``scope`` whose key starts with ``prefix``."""

    async def list_ownership_and_members(self, scope: Scope) -> tuple[RecordListing, RecordListing]:
        """Ownership and member records of ``scope``; backends that can list both in one
        request override this (a tick reads both)."""
        return await self.list(OWNERSHIP, scope), await self.list(MEMBER, scope)

    async def open(self) -> None:
        """Open network resources early (``async with``)."""

    async def check(self) -> None:
        """One real request that every other one depends on (see ``CheckpointStore.check``);
        raises :class:`BackendFailure`. Backends without a service to reach do nothing."""

    async def close(self) -> None:
        """Release network resources. Safe to call twice."""
