"""How the protocol sends its requests: bounded in time, failures named, and writes that
recognise themselves.

:class:`ProtocolCalls` is the base every part of the protocol builds on (ownership,
checkpoints, members, log entries): it holds the :class:`~eventprocessor.stores.backend.
RecordBackend`, checks scopes and partition ids, runs each operation under the store's
``operation_timeout`` (:meth:`ProtocolCalls._bounded`) and writes conditionally
(:meth:`ProtocolCalls._write`).

Write tokens (ambiguous writes)
===============================
Every conditional write (claim, renewal, release, handoff request, fence, checkpoint,
log entry) carries a fresh random ``writetoken`` field. When a write's response is lost
and the transport retries it, the retry meets the first attempt's own record and gets
409/412. On 409/412 the protocol re-reads the record: if it carries this write's token,
the write landed, and it is reported as done with the record's real etag and time. The
same check follows a failure after which the request may have taken effect (a lost
response the transport did not retry, such as a Table create, which is a POST).

Timeouts
========
With ``operation_timeout`` set (the Azure stores: 10 s by default), every call, retries
included, is cut at that many seconds and raises ``StoreTimeoutError``; for a claim
batch the deadline applies to each claim, so the claims that were won are still
reported (``ClaimOwnershipError.claimed``). A caller that bounds its calls itself (the
processor's ``BoundedStore``, at ``store_timeout``) sets
:data:`~eventprocessor.stores.contract.CALLER_DEADLINE`, and the store then applies no
deadline of its own: each call has exactly one.
"""
from __future__ import annotations

import asyncio
import logging
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar

from ..errors import CheckpointStoreError, StoreTimeoutError
from .backend import (
    BackendFailure,
    EtagMismatch,
    Fields,
    Kind,
    RecordBackend,
    RecordConflict,
    RecordExists,
    RecordListing,
    Scope,
    StoredRecord,
)
from .codec import WRITE_TOKEN, WarnOnce, check_name_part, check_scope
from .contract import CALLER_DEADLINE

__all__ = ["ProtocolCalls"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_Self = TypeVar("_Self", bound="ProtocolCalls")


class ProtocolCalls:
    """The protocol's requests over one :class:`RecordBackend` (see the module docstring).

    ``operation_timeout`` (seconds, or ``None`` for none) bounds every call, retries
    included.
    """

    def __init__(self, backend: RecordBackend, *, operation_timeout: float | None) -> None:
        self._backend = backend
        self._operation_timeout = operation_timeout
        self._warn = WarnOnce(logger)

    @property
    def backend(self) -> RecordBackend:
        """The record primitives this store runs the protocol over (for a Blob store,
        :class:`~eventprocessor.stores.blob.BlobRecords` with its ``ContainerClient`` as ``client``).
        Read it to see where records go; wrap or replace its methods in a test to put a
        fault between the protocol and the service."""
        return self._backend

    @property
    def request_counts(self) -> Counter:
        """Requests sent, by ``{operation}_{kind}`` (a listing page counts one)."""
        return self._backend.request_counts

    @property
    def operation_timeout(self) -> float | None:
        """Seconds one call may take, retries included (``None``: no deadline)."""
        return self._operation_timeout

    async def __aenter__(self: _Self) -> _Self:
        await self._backend.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        await self._backend.close()

    async def check(self) -> None:
        """Make sure the store can be used (its container or table is there or can be
        created, the credential is accepted, records can be listed), within
        ``operation_timeout``; raises ``CheckpointStoreError`` naming the cause and the fix.

        Example::

            store = BlobCheckpointStore.from_connection_string("UseDevelopmentStorage=true", "checkpoints")
            await store.check()   # an Azurite without --skipApiVersionCheck fails here, saying so
        """
        await self._bounded("checking the store", self._backend.check())

    def _scope(self, namespace: Any, eventhub: Any, consumer_group: Any) -> Scope:
        return check_scope(namespace, eventhub, consumer_group, forbidden=self._backend.forbidden)

    def _partition(self, partition_id: Any) -> str:
        return check_name_part(partition_id, "partition_id", forbidden=self._backend.forbidden)

    async def _bounded(self, what: str, operation: Awaitable[_T]) -> _T:
        """Run one store operation under ``operation_timeout``; a backend failure
        becomes ``CheckpointStoreError`` naming ``what`` and the container or table."""
        try:
            if self._operation_timeout is None or CALLER_DEADLINE.get():
                return await operation
            if sys.version_info >= (3, 11):  # no extra task per call, unlike wait_for
                async with asyncio.timeout(self._operation_timeout):
                    return await operation
            return await asyncio.wait_for(operation, self._operation_timeout)
        except asyncio.TimeoutError:
            raise StoreTimeoutError(
                f"{what} in {self._backend.where} did not finish within the store's operation_timeout of "
                f"{self._operation_timeout:g} s; whether it took effect is unknown") from None
        except BackendFailure as failure:
            raise CheckpointStoreError(f"{what} in {self._backend.where} failed: {failure}") from failure.__cause__
        except RecordConflict as conflict:  # an answer the protocol did not expect here (a 404 on a listing)
            raise CheckpointStoreError(f"{what} in {self._backend.where} failed: {type(conflict).__name__} "
                                       f"({conflict})") from conflict.__cause__

    async def _write(self, kind: Kind, scope: Scope, key: str, fields: Fields, etag: str | None,
                     data: bytes = b"") -> StoredRecord:
        """A conditional write (create-if-absent when ``etag`` is None) that recognises
        itself: on 409/412 it re-reads the record, and if the record carries this
        write's token, the write landed and its response was lost."""
        token = uuid.uuid4().hex
        fields = {**fields, WRITE_TOKEN: token}
        try:
            if etag is None:
                return await self._backend.create(kind, scope, key, fields, data)
            return await self._backend.replace(kind, scope, key, fields, etag)
        except (RecordExists, EtagMismatch) as conflict:
            current = await self._backend.read(kind, scope, key)
            if current is None or current.fields.get(WRITE_TOKEN) != token:
                raise
            logger.info("%s in %s: the service answered %s, but the record carries this write's token: the "
                        "first attempt landed, its response was lost and the transport retried; counted as "
                        "written", current.name, self._backend.where, type(conflict).__name__)
            return current
        except BackendFailure as failure:
            # The response was lost and the transport did not retry (a POST): the write
            # may have landed all the same.
            if not failure.maybe_written:
                raise
            try:
                current = await self._backend.read(kind, scope, key)
            except BackendFailure:
                raise failure from None
            if current is None or current.fields.get(WRITE_TOKEN) != token:
                raise
            logger.info("%s in %s: the write failed (%s) but the record carries its token: it landed and its "
                        "response was lost; counted as written", current.name, self._backend.where, failure)
            return current

    def _warn_foreign(self, listing: RecordListing, what: str) -> None:
        for name, etag in listing.foreign:
            self._warn((name, etag), "skipping %r in %s: not a %s record", name, self._backend.where, what)

    def _server_time(self, listing: RecordListing, what: str) -> datetime:
        if listing.server_time is None:
            raise CheckpointStoreError(f"{what} in {self._backend.where} returned no server time (Date header)")
        return listing.server_time
