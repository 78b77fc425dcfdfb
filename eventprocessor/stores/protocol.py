"""The checkpoint-store protocol, written once over a small backend of record primitives.

Every store in this package is a :class:`ProtocolStore` over a :class:`RecordBackend`:
the backend knows the storage calls, the layout and the encoding of fields (blob
metadata, table properties, dicts in memory); the protocol knows claims, fences,
checkpoints, members and log entries. So the in-memory store runs exactly the protocol
the Blob and Table stores run, and the conformance suite tests one protocol three times.

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

Write tokens (ambiguous writes)
===============================
Every conditional write (claim, renewal, release, handoff request, fence, checkpoint,
log entry) carries a fresh random ``writetoken`` field. When a write's response is lost
and the transport retries it, the retry meets the first attempt's own record and gets
409/412. On 409/412 the protocol re-reads the record: if it carries this write's token,
the write landed, and it is reported as done with the record's real etag and time. The
same check follows a failure after which the request may have taken effect (a lost
response the transport did not retry, such as a Table create, which is a POST).

Fenced checkpoints
==================
* ``fence_checkpoint(claim)`` (a new owner, right after its claim): reads the ownership
  record (it must name ``(owner_id, epoch)``, else ``OwnershipLostError``), reads the
  checkpoint record and rewrites it with ``ownerid``/``epoch`` of the claim, keeping its
  position, If-Match the etag it read (or creates a placeholder, ``sequencenumber="-1"``,
  when there is none). It caches the new etag under ``(scope, partition, owner_id,
  epoch)`` and returns the checkpoint to resume from. A stored checkpoint of a later
  epoch (or of the same epoch by another owner) raises ``StaleEpochError`` when the
  ownership record still names the claim, ``OwnershipLostError`` otherwise.
* ``update_checkpoint``: with a cached etag, ONE request: replace If-Match that etag.
  Without one (this store instance did not fence), verify first: read the ownership
  record, read the checkpoint (refusing a later epoch's), then write. On 412 the
  checkpoint is re-read: a later epoch or another owner wrote it -> ``OwnershipLostError``
  (``StaleEpochError`` if the ownership record still names this owner); this very
  ``(owner_id, epoch)`` wrote it (another call of the same owner) -> retry with its etag;
  anything else -> verify again. At most three attempts.

Why a new owner's checkpoint is never lost: the new owner N fences before it reads
where to resume. The fence changes the checkpoint record's etag, so every write of an
earlier owner O, conditional on the etag O last saw (from its own fence or write, both
before N's fence), fails with 412; O then re-reads, sees N's epoch, and stops with
``OwnershipLostError``. A write of O that lands *before* N's fence is a checkpoint of
events O really processed, and N's fence keeps it as the position N resumes from.
After the fence, the record only changes through N's conditional writes.

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

import abc
import asyncio
import logging
import re
import sys
import uuid
from collections import Counter
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import unquote

from eventprocessor.errors import (
    CheckpointStoreError,
    ClaimOwnershipError,
    ConfigurationError,
    OwnershipLostError,
    StaleEpochError,
    StoreTimeoutError,
)
from eventprocessor.stores.contract import CALLER_DEADLINE, CheckpointStore
from eventprocessor.stores.records import (
    MAX_ENTRY_BYTES,
    MAX_EPOCH,
    MAX_SEQUENCE_NUMBER,
    Checkpoint,
    Member,
    MemberListing,
    Ownership,
    OwnershipListing,
    StateRef,
    UnreadableOwnership,
)

__all__ = ["ProtocolStore", "RecordBackend", "Kind", "StoredRecord", "RecordListing", "RecordConflict",
           "RecordExists", "EtagMismatch", "RecordMissing", "BackendFailure", "encode_name", "decode_name",
           "WRITE_TOKEN", "NO_CHECKPOINT", "NO_OFFSET"]

logger = logging.getLogger(__name__)

Scope = tuple[str, str, str]
Fields = dict[str, str | int]
_T = TypeVar("_T")
_Store = TypeVar("_Store", bound="ProtocolStore")

WRITE_TOKEN = "writetoken"
"""The field holding a write's random token; the official SDK ignores it."""

NO_CHECKPOINT = -1
"""The sequence number of a placeholder: a fenced partition that has no checkpoint yet.
Event Hubs sequence numbers start at 0, so no real checkpoint has it."""

NO_OFFSET = "-1"
"""What a checkpoint without an offset (and a placeholder) stores. The official
processor reads the offset as a string and starts *after* it; ``"-1"`` is Event Hubs'
start of stream, so it re-reads from the start instead of failing on an empty value
(which its blob reader would turn into ``"None"``). Read back as ``offset=None``."""

_ATTEMPTS = 3
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_PRINTABLE = re.compile(r"^[\x20-\x7e]*$")
_PROPERTY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_MAX_TEXT = 1024
_MAX_KEY = 512
_MAX_PROPERTIES_SIZE = 4096


# --------------------------------------------------------------------------- outcomes


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


# --------------------------------------------------------------------------- records


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


# --------------------------------------------------------------------------- names and values


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyz0123456789-_.")


def encode_name(name: str) -> str:
    """Encode an owner id, log name or entry name as a key every backend accepts.

    Lower-case letters, digits, ``-``, ``_`` and ``.`` (except a leading ``.``, so that
    ``.`` and ``..`` never become path segments) stay; every other character becomes
    ``%xx`` per UTF-8 byte, in lower-case hex. The result is lower-case (blob names of
    this layout are lower-cased), distinct names stay distinct (``"A"`` is ``"%41"``,
    ``"a"`` is ``"a"``), and a prefix of a name encodes to a prefix of its encoding.
    """
    parts = []
    for index, char in enumerate(name):
        if char in _SAFE and not (index == 0 and char == "."):
            parts.append(char)
        else:
            parts.extend(f"%{byte:02x}" for byte in char.encode("utf-8"))
    return "".join(parts)


def decode_name(encoded: str) -> str:
    """The inverse of :func:`encode_name`; ``ValueError`` for a key it cannot have made."""
    name = unquote(encoded, errors="strict")
    if encode_name(name) != encoded:
        raise ValueError(f"{encoded!r} is not an encoded name")
    return name


def check_name_part(value: Any, what: str, *, forbidden: str) -> str:
    """Validate one component of a record key (namespace, hub, group, partition id)."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {type(value).__name__}")
    bad = sorted({c for c in value if c in forbidden})
    if bad:
        shown = " ".join(repr(c) for c in bad)
        raise ConfigurationError(f"{what} {value!r} contains characters this store cannot use: {shown}")
    if _CONTROL.search(value):
        raise ConfigurationError(f"{what} {value!r} contains control characters")
    if len(value) > _MAX_KEY:
        raise ConfigurationError(f"{what} is {len(value)} characters long; at most {_MAX_KEY} are allowed")
    return value


def check_scope(namespace: Any, eventhub: Any, consumer_group: Any, *, forbidden: str) -> Scope:
    """Validate the (namespace, event hub, consumer group) every record key starts with."""
    return (
        check_name_part(namespace, "fully_qualified_namespace", forbidden=forbidden),
        check_name_part(eventhub, "eventhub_name", forbidden=forbidden),
        check_name_part(consumer_group, "consumer_group", forbidden=forbidden),
    )


def _check_encoded(value: Any, what: str) -> str:
    """A name that goes through :func:`encode_name`; returns the encoding."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{what} must be a non-empty string, got {type(value).__name__}")
    try:
        encoded = encode_name(value)
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} {value!r} is not valid Unicode text") from None
    if len(encoded) > _MAX_KEY:
        raise ConfigurationError(f"{what} is too long: {len(encoded)} characters encoded, at most {_MAX_KEY}")
    return encoded


def check_text(value: Any, what: str, *, allow_empty: bool = True) -> str:
    """A value stored in a record field: printable ASCII (blob metadata travels in HTTP
    headers), no surrounding spaces (HTTP trims them), at most 1024 characters. The
    in-memory and Table stores apply the same rule, so code that works on one works on all."""
    if not isinstance(value, str):
        raise ConfigurationError(f"{what} must be a string, got {type(value).__name__}")
    if not value and not allow_empty:
        raise ConfigurationError(f"{what} must not be empty")
    if not _PRINTABLE.match(value) or value != value.strip() or len(value) > _MAX_TEXT:
        raise ConfigurationError(
            f"{what} {value[:80]!r} cannot be stored: use at most {_MAX_TEXT} printable ASCII characters, "
            "without leading or trailing spaces")
    return value


def _check_int(value: Any, what: str, low: int, high: int, partition_id: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigurationError(
            f"{what} of partition {partition_id!r} must be an int, got {type(value).__name__}")
    if not low <= value <= high:
        raise ConfigurationError(
            f"{what} of partition {partition_id!r} is {value}: it must be between {low} and {high} "
            "(Event Hubs keeps it as a signed 64-bit integer)")
    return value


def check_epoch(value: Any, partition_id: Any) -> int:
    """0 to ``MAX_EPOCH - 1``: a record at ``MAX_EPOCH`` could never be claimed above."""
    return _check_int(value, "epoch", 0, MAX_EPOCH - 1, partition_id)


def parse_int(value: Any) -> int | None:
    """An int from a field written by us or another SDK; ``None`` if it is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\s*-?\d{1,30}\s*", value):
        return int(value)
    return None


def _ranged(fields: Mapping[str, Any], name: str, low: int, high: int) -> tuple[int, str | None]:
    value = fields.get(name)
    number = parse_int(value)
    if number is None:
        return 0, f"its {name} {str(value)[:40]!r} is not an integer"
    if not low <= number <= high:
        return 0, f"its {name} {number} is out of range ({low} to {high})"
    return number, None


def parse_ownership(record: StoredRecord, scope: Scope) -> Ownership | str:
    """The ownership record, or why it cannot be read."""
    fields = record.fields
    owner = fields.get("ownerid")
    if owner is None:
        return "it has no ownerid"
    if not isinstance(owner, str):
        return f"its ownerid is a {type(owner).__name__}, not a string"
    epoch, problem = _ranged({"epoch": fields.get("epoch", 0)}, "epoch", 0, MAX_EPOCH - 1)
    if problem:
        return problem
    requested = fields.get("requestedby", "")
    if not isinstance(requested, str):
        return f"its requestedby is a {type(requested).__name__}, not a string"
    return Ownership(*scope, record.key, owner, last_modified_time=record.last_modified, etag=record.etag,
                     epoch=epoch, requested_by=requested)


def parse_checkpoint(record: StoredRecord, scope: Scope) -> Checkpoint | str:
    """The checkpoint record (a placeholder has ``sequence_number == NO_CHECKPOINT``), or
    why it cannot be read."""
    fields = record.fields
    if "sequencenumber" not in fields:
        return "it has no sequencenumber"
    sequence_number, problem = _ranged(fields, "sequencenumber", NO_CHECKPOINT, MAX_SEQUENCE_NUMBER)
    if problem:
        return problem
    epoch: int | None = None
    if "epoch" in fields:
        epoch, problem = _ranged(fields, "epoch", 0, MAX_EPOCH - 1)
        if problem:
            return problem
    offset = fields.get("offset")
    owner = fields.get("ownerid")
    state: StateRef | None = None
    if fields.get("state"):
        try:
            state = StateRef.parse(str(fields["state"]))
        except ValueError as error:
            return f"its state reference is unreadable ({error})"
    return Checkpoint(
        *scope, record.key, sequence_number,
        offset=str(offset) if offset not in (None, "", NO_OFFSET) else None,
        owner_id=owner if isinstance(owner, str) and owner else None,
        epoch=epoch, state=state,
    )


def _later_than(stored: Checkpoint, owner_id: str, epoch: int) -> bool:
    """Written by a later owner: a higher epoch, or the same epoch by someone else."""
    return stored.epoch is not None and (stored.epoch > epoch
                                         or (stored.epoch == epoch and stored.owner_id != owner_id))


class WarnOnce:
    """Warn about a bad record once per version; later sightings go to debug.

    The balancer lists every few seconds, so without this one foreign blob would fill
    the log.
    """

    def __init__(self, log: logging.Logger, limit: int = 10_000) -> None:
        self._log = log
        self._seen: set = set()
        self._limit = limit

    def __call__(self, key: tuple[str, str | None], message: str, *args: Any) -> None:
        if key in self._seen:
            self._log.debug(message, *args)
            return
        if len(self._seen) < self._limit:
            self._seen.add(key)
        self._log.warning(message, *args)


# --------------------------------------------------------------------------- the protocol


class ProtocolStore(CheckpointStore):
    """A checkpoint store: the protocol of this module over one :class:`RecordBackend`.

    ``operation_timeout`` (seconds, or ``None`` for none) bounds every call, retries
    included; see the module docstring.

    Example::

        class MyStore(ProtocolStore):
            def __init__(self) -> None:
                super().__init__(MyRecords(), operation_timeout=10.0)
    """

    def __init__(self, backend: RecordBackend, *, operation_timeout: float | None) -> None:
        self._backend = backend
        self._operation_timeout = operation_timeout
        # (namespace, hub, group, partition) -> {(owner_id, epoch): checkpoint etag}
        self._fences: dict[tuple[str, str, str, str], dict[tuple[str, int], str]] = {}
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

    async def __aenter__(self: _Store) -> _Store:
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

    # ------------------------------------------------------------------ plumbing

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

    # ------------------------------------------------------------------ ownership

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        """Every ownership record of the consumer group, the unreadable ones apart, and
        the service's clock.

        Example::

            listing = await store.list_ownership("ns.servicebus.windows.net", "hub", "$default")
            ages = {o.partition_id: listing.server_time - o.last_modified_time
                    for o in listing.ownerships}
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        listing = await self._bounded("listing ownership", self._backend.list(OWNERSHIP, scope))
        return self._ownership_listing(scope, listing)

    async def list_ownership_and_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> tuple[OwnershipListing, MemberListing | None]:
        """Ownership and member records in one request (what a balancing tick reads).

        Example::

            ownership, members = await store.list_ownership_and_members("ns", "hub", "$default")
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        ownership, members = await self._bounded("listing ownership and members",
                                                 self._backend.list_ownership_and_members(scope))
        return self._ownership_listing(scope, ownership), self._member_listing(scope, members)

    def _ownership_listing(self, scope: Scope, listing: RecordListing) -> OwnershipListing:
        self._warn_foreign(listing, "ownership")
        owned: list[Ownership] = []
        unreadable: list[UnreadableOwnership] = []
        for record in listing.records:
            parsed = parse_ownership(record, scope)
            if isinstance(parsed, Ownership):
                owned.append(parsed)
                continue
            self._warn((record.name, record.etag),
                       "ownership record %s in %s is unreadable (%s): partition %s counts as owned by an unknown "
                       "processor until the record expires, then it is claimed over it", record.name,
                       self._backend.where, parsed, record.key)
            unreadable.append(UnreadableOwnership(record.key, record.etag, record.last_modified, parsed))
        return OwnershipListing(ownerships=tuple(owned), server_time=self._server_time(listing, "listing ownership"),
                                unreadable=tuple(unreadable))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        """Conditionally write each claim (create-if-absent when its etag is None, else
        If-Match); return the ones won, with their new etag and time. Claims run
        concurrently; lost races are left out; other failures raise
        ``ClaimOwnershipError``, which carries the claims won.

        Example::

            won = await store.claim_ownership([replace(record, owner_id=me, epoch=record.epoch + 1)])
        """
        claims = list(ownerships)
        scopes = [self._check_claim(claim) for claim in claims]
        if not claims:
            return []
        attempts = [self._claim_or_failure(claim, scope) for claim, scope in zip(claims, scopes, strict=False)]
        if self._backend.sequential:
            results = [await attempt for attempt in attempts]
        else:
            results = list(await asyncio.gather(*attempts))
        won = [result for result in results if isinstance(result, Ownership)]
        failures = {claim.partition_id: result for claim, result in zip(claims, results, strict=False)
                    if isinstance(result, CheckpointStoreError)}
        if failures:
            detail = ", ".join(f"{pid}: {error}" for pid, error in sorted(failures.items()))
            raise ClaimOwnershipError(f"{len(failures)} of {len(claims)} claims in {self._backend.where} failed "
                                      f"({detail})", claimed=won, failures=failures)
        return won

    def _check_claim(self, claim: Any) -> Scope:
        """Refuse a claim no store could write, before any request is sent."""
        if not isinstance(claim, Ownership):
            raise ConfigurationError(f"claims must be Ownership records, got {type(claim).__name__}")
        scope = self._scope(claim.fully_qualified_namespace, claim.eventhub_name, claim.consumer_group)
        self._partition(claim.partition_id)
        check_text(claim.owner_id, "owner_id")
        check_text(claim.requested_by, "requested_by")
        check_epoch(claim.epoch, claim.partition_id)
        if claim.etag is not None and not isinstance(claim.etag, str):
            raise ConfigurationError(f"etag of partition {claim.partition_id!r} must be a string or None")
        return scope

    async def _claim_or_failure(self, claim: Ownership, scope: Scope) -> Ownership | None | CheckpointStoreError:
        try:
            return await self._bounded(f"claim of partition {claim.partition_id}", self._claim_one(claim, scope))
        except CheckpointStoreError as failure:  # an unknown error is never a won claim
            logger.warning("processor %s: claim of partition %s (hub %s, consumer group %s) failed: %s",
                           claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name,
                           claim.consumer_group, failure)
            return failure

    async def _claim_one(self, claim: Ownership, scope: Scope) -> Ownership | None:
        fields: Fields = {"ownerid": claim.owner_id, "epoch": claim.epoch}
        if claim.requested_by:
            fields["requestedby"] = claim.requested_by
        try:
            record = await self._write(OWNERSHIP, scope, claim.partition_id, fields, claim.etag)
        except RecordConflict as lost:
            logger.debug("processor %s lost the claim of partition %s (hub %s, consumer group %s): %s",
                         claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name,
                         claim.consumer_group, type(lost).__name__)
            return None
        self._keep_only_fence(scope, claim.partition_id, claim.owner_id, claim.epoch)
        logger.debug("processor %s claimed partition %s (hub %s, consumer group %s, epoch %s)",
                     claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name, claim.consumer_group,
                     claim.epoch)
        return replace(claim, etag=record.etag, last_modified_time=record.last_modified)

    async def release_ownership(self, ownership: Ownership) -> bool:
        """Clear the owner of ``ownership`` (and any handoff request) if its etag is
        still current; the epoch is kept. Returns True when released.

        Example::

            await store.release_ownership(record)
        """
        won = await self.claim_ownership([replace(ownership, owner_id="", requested_by="")])
        if won and isinstance(ownership.owner_id, str):
            scope = (ownership.fully_qualified_namespace, ownership.eventhub_name, ownership.consumer_group)
            self._fences.get((*scope, ownership.partition_id), {}).pop((ownership.owner_id, ownership.epoch), None)
        return bool(won)

    # ------------------------------------------------------------------ fence cache

    def _fence_etag(self, scope: Scope, partition_id: str, owner_id: str, epoch: int) -> str | None:
        return self._fences.get((*scope, partition_id), {}).get((owner_id, epoch))

    def _remember_fence(self, scope: Scope, partition_id: str, owner_id: str, epoch: int, etag: str) -> None:
        self._fences.setdefault((*scope, partition_id), {})[(owner_id, epoch)] = etag

    def _keep_only_fence(self, scope: Scope, partition_id: str, owner_id: str, epoch: int) -> None:
        """A won claim says who owns the partition now: every other etag cached for it
        belongs to an owner that no longer holds it."""
        cached = self._fences.get((*scope, partition_id))
        if cached:
            for other in [k for k in cached if k != (owner_id, epoch)]:
                del cached[other]

    # ------------------------------------------------------------------ checkpoints

    def _check_writer(self, owner_id: Any, epoch: Any, partition_id: Any) -> None:
        check_text(owner_id, "owner_id", allow_empty=False)
        check_epoch(epoch, partition_id)

    async def _require_owner(self, scope: Scope, partition_id: str, owner_id: str, epoch: int, doing: str) -> None:
        """Read the ownership record; raise ``OwnershipLostError`` unless it names ``(owner_id, epoch)``."""
        record = await self._backend.read(OWNERSHIP, scope, partition_id)
        if record is None:
            holder = "there is no ownership record"
        else:
            parsed = parse_ownership(record, scope)
            if isinstance(parsed, str):
                holder = f"its ownership record is unreadable ({parsed})"
            elif (parsed.owner_id, parsed.epoch) == (owner_id, epoch):
                return
            else:
                holder = f"{parsed.owner_id or 'nobody'} does (epoch {parsed.epoch})"
        raise OwnershipLostError(f"{doing} of partition {partition_id} refused: {owner_id} (epoch {epoch}) does "
                                 f"not own it, {holder}", partition_id=partition_id)

    async def _refuse_later(self, scope: Scope, partition_id: str, owner_id: str, epoch: int, stored: Checkpoint,
                            doing: str) -> None:
        """The checkpoint was written by a later owner. If the ownership record still
        names this owner, the record lost its epoch (``StaleEpochError``); if not, the
        partition was taken (``OwnershipLostError``)."""
        await self._require_owner(scope, partition_id, owner_id, epoch, doing)
        raise StaleEpochError(
            f"{doing} of partition {partition_id} refused: its checkpoint was written by "
            f"{stored.owner_id or 'another processor'} with epoch {stored.epoch}, not below {owner_id}'s epoch "
            f"{epoch}, although the ownership record names {owner_id}: claim it again above epoch {stored.epoch}",
            partition_id=partition_id, stored_epoch=stored.epoch or 0)

    def _checkpoint_or_warn(self, record: StoredRecord, scope: Scope) -> Checkpoint | None:
        parsed = parse_checkpoint(record, scope)
        if isinstance(parsed, Checkpoint):
            return parsed
        self._warn((record.name, record.etag), "skipping checkpoint record %s in %s: %s", record.name,
                   self._backend.where, parsed)
        return None

    async def fence_checkpoint(self, ownership: Ownership) -> Checkpoint | None:
        """Make ``ownership`` (a claim just won) the only writer of its partition's
        checkpoint; return the checkpoint to resume from (``None`` if there is none).

        Costs three requests (read ownership, read checkpoint, conditional write).
        Raises ``OwnershipLostError`` if the ownership record does not name
        ``(owner_id, epoch)``, ``StaleEpochError`` if the stored checkpoint was written
        by a later epoch (or the same epoch by another owner) while it does.

        Example::

            [won] = await store.claim_ownership([claim])
            resume_from = await store.fence_checkpoint(won)
        """
        if not isinstance(ownership, Ownership):
            raise ConfigurationError(f"expected an Ownership record, got {type(ownership).__name__}")
        scope = self._scope(ownership.fully_qualified_namespace, ownership.eventhub_name, ownership.consumer_group)
        self._partition(ownership.partition_id)
        self._check_writer(ownership.owner_id, ownership.epoch, ownership.partition_id)
        return await self._bounded(f"fence of partition {ownership.partition_id}", self._fence(scope, ownership))

    async def _fence(self, scope: Scope, ownership: Ownership) -> Checkpoint | None:
        pid, owner, epoch = ownership.partition_id, ownership.owner_id, ownership.epoch
        for attempt in range(1, _ATTEMPTS + 1):
            await self._require_owner(scope, pid, owner, epoch, "fence")
            current = await self._backend.read(CHECKPOINT, scope, pid)
            stored = None if current is None else self._checkpoint_or_warn(current, scope)
            if stored is not None and _later_than(stored, owner, epoch):
                await self._refuse_later(scope, pid, owner, epoch, stored, "fence")
            fields: Fields = {
                "sequencenumber": str(NO_CHECKPOINT if stored is None else stored.sequence_number),
                "offset": NO_OFFSET if stored is None or stored.offset is None else stored.offset,
                "ownerid": owner,
                "epoch": epoch,
            }
            if stored is not None and stored.state is not None:
                fields["state"] = str(stored.state)  # the state goes with the position it keeps
            try:
                record = await self._write(CHECKPOINT, scope, pid, fields, None if current is None else current.etag)
            except RecordConflict as conflict:
                logger.info("processor %s: checkpoint of partition %s (hub %s, consumer group %s) changed while "
                            "fencing it (%s, attempt %d)", owner, pid, scope[1], scope[2], type(conflict).__name__,
                            attempt)
                continue
            self._keep_only_fence(scope, pid, owner, epoch)
            self._remember_fence(scope, pid, owner, epoch, record.etag)
            logger.debug("processor %s fenced the checkpoint of partition %s (hub %s, consumer group %s, epoch %s)",
                         owner, pid, scope[1], scope[2], epoch)
            return None if stored is None or stored.sequence_number == NO_CHECKPOINT else stored
        raise CheckpointStoreError(f"fence of partition {pid} by {owner} (epoch {epoch}): the checkpoint record "
                                   f"changed under it {_ATTEMPTS} times; not fenced")

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` as ``(owner_id, epoch)``: one conditional request after
        :meth:`fence_checkpoint`, verify-then-write otherwise (module docstring).

        Raises ``OwnershipLostError`` (checkpoint not written) once a later owner has
        fenced the partition, or, without a fence, when the ownership record does not
        name ``(owner_id, epoch)``.

        Example::

            await store.update_checkpoint(
                Checkpoint("ns", "hub", "$default", "0", sequence_number=41, offset="8192"),
                owner_id=me, epoch=3)
        """
        if not isinstance(checkpoint, Checkpoint):
            raise ConfigurationError(f"expected a Checkpoint, got {type(checkpoint).__name__}")
        scope = self._scope(checkpoint.fully_qualified_namespace, checkpoint.eventhub_name, checkpoint.consumer_group)
        pid = self._partition(checkpoint.partition_id)
        _check_int(checkpoint.sequence_number, "sequence_number", 0, MAX_SEQUENCE_NUMBER, pid)
        if checkpoint.offset is not None:
            check_text(checkpoint.offset, f"offset of partition {pid!r}", allow_empty=False)
        self._check_writer(owner_id, epoch, pid)
        fields: Fields = {
            "sequencenumber": str(checkpoint.sequence_number),
            "offset": NO_OFFSET if checkpoint.offset is None else checkpoint.offset,
            "ownerid": owner_id,
            "epoch": epoch,
        }
        if checkpoint.state is not None:
            fields["state"] = str(checkpoint.state)
        await self._bounded(f"checkpoint of partition {pid}", self._update(scope, pid, fields, owner_id, epoch))
        logger.debug("processor %s checkpointed partition %s (hub %s, consumer group %s) at sequence number %s",
                     owner_id, pid, scope[1], scope[2], checkpoint.sequence_number)

    async def _update(self, scope: Scope, pid: str, fields: Fields, owner_id: str, epoch: int) -> None:
        etag = self._fence_etag(scope, pid, owner_id, epoch)
        trusted = etag is not None
        for attempt in range(1, _ATTEMPTS + 1):
            if not trusted:
                etag = await self._verified_checkpoint_etag(scope, pid, owner_id, epoch)
            try:
                record = await self._write(CHECKPOINT, scope, pid, fields, etag)
            except RecordConflict as conflict:
                self._fences.get((*scope, pid), {}).pop((owner_id, epoch), None)
                logger.info("processor %s: checkpoint of partition %s (hub %s, consumer group %s) changed under it "
                            "(%s, attempt %d)", owner_id, pid, scope[1], scope[2], type(conflict).__name__, attempt)
                trusted, etag = await self._after_conflict(scope, pid, owner_id, epoch)
                continue
            self._remember_fence(scope, pid, owner_id, epoch, record.etag)
            return
        raise CheckpointStoreError(f"checkpoint of partition {pid} by {owner_id} (epoch {epoch}) was changed by "
                                   f"another writer {_ATTEMPTS} times while it owned the partition; not written")

    async def _verified_checkpoint_etag(self, scope: Scope, pid: str, owner_id: str, epoch: int) -> str | None:
        """Without a fence: check ownership, then the etag to write over (``None``: create)."""
        await self._require_owner(scope, pid, owner_id, epoch, "checkpoint")
        current = await self._backend.read(CHECKPOINT, scope, pid)
        if current is None:
            return None
        stored = self._checkpoint_or_warn(current, scope)
        if stored is not None and _later_than(stored, owner_id, epoch):
            await self._refuse_later(scope, pid, owner_id, epoch, stored, "checkpoint")
        return current.etag

    async def _after_conflict(self, scope: Scope, pid: str, owner_id: str, epoch: int) -> tuple[bool, str | None]:
        """Who changed the checkpoint under us: a later owner (raise), this very owner
        (trust its etag), anybody else (verify ownership again)."""
        current = await self._backend.read(CHECKPOINT, scope, pid)
        stored = None if current is None else parse_checkpoint(current, scope)
        if current is None or not isinstance(stored, Checkpoint):
            return False, None
        if _later_than(stored, owner_id, epoch):
            await self._refuse_later(scope, pid, owner_id, epoch, stored, "checkpoint")
        if (stored.owner_id, stored.epoch) == (owner_id, epoch):
            return True, current.etag
        return False, None

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> list[Checkpoint]:
        """Every checkpoint of the consumer group. Placeholders (fenced partitions
        without a checkpoint) are left out; bad records are skipped with a warning.

        Example::

            positions = {c.partition_id: c.sequence_number
                         for c in await store.list_checkpoints("ns", "hub", "$default")}
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        listing = await self._bounded("listing checkpoints", self._backend.list(CHECKPOINT, scope))
        self._warn_foreign(listing, "checkpoint")
        checkpoints = (self._checkpoint_or_warn(record, scope) for record in listing.records)
        return [c for c in checkpoints if c is not None and c.sequence_number != NO_CHECKPOINT]

    # ------------------------------------------------------------------ members

    def _member_key(self, member: Any) -> tuple[Scope, str]:
        if not isinstance(member, Member):
            raise ConfigurationError(f"expected a Member record, got {type(member).__name__}")
        scope = self._scope(member.fully_qualified_namespace, member.eventhub_name, member.consumer_group)
        check_text(member.owner_id, "owner_id", allow_empty=False)
        return scope, _check_encoded(member.owner_id, "owner_id")

    async def list_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> MemberListing:
        """The member (heartbeat) records of the consumer group and the service's clock.

        Example::

            listing = await store.list_members("ns.servicebus.windows.net", "hub", "$default")
            alive = [m.owner_id for m in listing.members
                     if listing.server_time - m.last_modified_time < timedelta(seconds=60)]
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        listing = await self._bounded("listing members", self._backend.list(MEMBER, scope))
        return self._member_listing(scope, listing)

    def _member_listing(self, scope: Scope, listing: RecordListing) -> MemberListing:
        self._warn_foreign(listing, "member")
        members = []
        for record in listing.records:
            try:
                owner_id = decode_name(record.key)
            except ValueError:
                self._warn((record.name, record.etag), "skipping member record %s in %s: its name is not an "
                           "encoded owner id", record.name, self._backend.where)
                continue
            properties = {k: v for k, v in record.fields.items() if k != WRITE_TOKEN and isinstance(v, str)}
            members.append(Member(*scope, owner_id, record.last_modified, record.etag, properties))
        return MemberListing(members=tuple(members), server_time=self._server_time(listing, "listing members"))

    async def write_member(self, member: Member) -> Member:
        """Create or overwrite ``member``'s heartbeat record; return it as stored.

        ``properties`` names are lower-case identifiers (``[a-z][a-z0-9_]*``, at most 64
        characters), values printable ASCII; 4096 characters in all.

        Example::

            me = await store.write_member(Member("ns", "hub", "$default", owner_id,
                                                 properties={"strategy": "balanced"}))
        """
        scope, key = self._member_key(member)
        properties = dict(member.properties)
        for name, value in properties.items():
            if not isinstance(name, str) or not _PROPERTY_NAME.match(name) or name == WRITE_TOKEN:
                raise ConfigurationError(f"member property name {name!r} is invalid: use a lower-case identifier "
                                         "of at most 64 characters (not 'writetoken')")
            check_text(value, f"member property {name!r}")
        if sum(len(k) + len(v) for k, v in properties.items()) > _MAX_PROPERTIES_SIZE:
            raise ConfigurationError(
                f"member properties of {member.owner_id!r} exceed {_MAX_PROPERTIES_SIZE} characters")
        record = await self._bounded(f"heartbeat of member {member.owner_id}",
                                     self._backend.upsert(MEMBER, scope, key, dict(properties)))
        return replace(member, etag=record.etag, last_modified_time=record.last_modified, properties=properties)

    async def delete_member(self, member: Member) -> None:
        """Delete ``member``'s heartbeat record if it exists.

        Example::

            await store.delete_member(me)
        """
        scope, key = self._member_key(member)
        await self._bounded(f"deleting member {member.owner_id}", self._backend.delete(MEMBER, scope, key))

    # ------------------------------------------------------------------ log entries

    def _log(self, namespace: Any, eventhub: Any, consumer_group: Any, log_name: Any) -> tuple[Scope, Kind]:
        scope = self._scope(namespace, eventhub, consumer_group)
        return scope, Kind("entry", _check_encoded(log_name, "log_name"))

    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        """Create entry ``entry_name`` of log ``log_name`` holding ``data``, only if it
        does not exist; False (nothing changed) when it does. At most
        ``MAX_ENTRY_BYTES`` of data.

        Example::

            if not await store.create_entry("ns", "hub", "$default", "commits", "000000000042", payload):
                ...  # another writer committed version 42 first
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        key = _check_encoded(entry_name, "entry_name")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigurationError(f"data of entry {entry_name!r} must be bytes, got {type(data).__name__}")
        body = bytes(data)
        if len(body) > MAX_ENTRY_BYTES:
            raise ConfigurationError(f"entry {entry_name!r} of log {log_name!r} holds {len(body)} bytes; entries "
                                     f"hold at most {MAX_ENTRY_BYTES}")

        async def create() -> bool:
            try:
                await self._write(kind, scope, key, {}, None, body)
            except RecordExists:
                return False
            return True

        return await self._bounded(f"creating entry {entry_name!r} of log {log_name!r}", create())

    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> bytes | None:
        """The data of an entry, or ``None`` if it does not exist.

        Example::

            payload = await store.read_entry("ns", "hub", "$default", "commits", "000000000042")
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        key = _check_encoded(entry_name, "entry_name")
        record = await self._bounded(f"reading entry {entry_name!r} of log {log_name!r}",
                                     self._backend.read(kind, scope, key, with_data=True))
        return None if record is None else record.data

    async def list_entries(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, prefix: str = "") -> list[str]:
        """The names of the log's entries that start with ``prefix``, sorted.

        Example::

            versions = await store.list_entries("ns", "hub", "$default", "commits")
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        if not isinstance(prefix, str):
            raise ConfigurationError(f"prefix must be a string, got {type(prefix).__name__}")
        listing = await self._bounded(f"listing log {log_name!r}", self._backend.list(kind, scope, encode_name(prefix)))
        self._warn_foreign(listing, "log entry")
        names = []
        for record in listing.records:
            try:
                names.append(decode_name(record.key))
            except ValueError:
                self._warn((record.name, record.etag), "skipping %s in %s: not an entry of log %r", record.name,
                           self._backend.where, log_name)
        return sorted(names)

    async def delete_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str) -> None:
        """Delete an entry if it exists (compaction).

        Example::

            await store.delete_entry("ns", "hub", "$default", "commits", "000000000001")
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        key = _check_encoded(entry_name, "entry_name")
        await self._bounded(f"deleting entry {entry_name!r} of log {log_name!r}",
                            self._backend.delete(kind, scope, key))
