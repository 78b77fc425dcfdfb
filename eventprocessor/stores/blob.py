"""Checkpoint store on Azure Blob Storage, layout-compatible with the official
``azure-eventhub-checkpointstoreblob-aio``.

The protocol (claims, fences, checkpoints, write tokens, members, log entries,
timeouts) is :mod:`eventprocessor.stores.protocol`; this module is its Blob backend.

Layout
======
One container; blob names are lower-cased::

    {namespace}/{eventhub}/{consumer_group}/ownership/{partition_id}       (empty)
        metadata: ownerid, epoch, [requestedby], writetoken
    {namespace}/{eventhub}/{consumer_group}/checkpoint/{partition_id}      (empty)
        metadata: sequencenumber, offset, ownerid, epoch, writetoken
    {namespace}/{eventhub}/{consumer_group}/ownership-member/{encoded owner_id}  (empty)
        metadata: the member's properties
    {namespace}/{eventhub}/{consumer_group}/log/{encoded log}/{encoded entry}
        body: the entry's data; metadata: writetoken

``ownerid``, ``sequencenumber`` and ``offset`` are exactly what the official store
writes and reads, so a deployment can switch to this SDK and back and resume from the
same checkpoints. ``epoch``, ``requestedby``, ``writetoken`` and the checkpoint's
``ownerid`` are extra metadata the official store ignores (and drops when it rewrites a
blob: an ownership blob it wrote reads as epoch 0, a checkpoint as epoch ``None``). The
official store lists only ``ownership/`` and ``checkpoint/``, so it never sees members
or log entries. Member blobs sit beside ``ownership/`` on purpose: one listing of the
prefix ``.../ownership`` returns both, so a balancing tick costs one request. Owner, log and entry names are encoded by
:func:`eventprocessor.stores.codec.encode_name` (``[a-z0-9._-]`` kept, anything else ``%xx``).

A *placeholder* checkpoint (a partition fenced by a new owner before it ever had a
checkpoint) has ``sequencenumber="-1"`` and ``offset="-1"``. This store lists it as
"no checkpoint". The official store lists it as ``sequence_number=-1, offset="-1"``, and
an official processor that takes the partition over starts from ``"-1"``, the start of
the stream, instead of its configured initial position: it may re-read events, it never
skips any.

Requests
========
* claim: ``upload_blob(b"", if_none_match="*")`` when there is no record (a real
  create-if-absent: 409 when the blob exists; the official store uses
  ``set_blob_metadata(if_none_match="*")``, which *succeeds* on an existing blob), else
  ``set_blob_metadata`` If-Match the etag (412 when stale): 1 request;
* fence: HEAD ownership, HEAD checkpoint, conditional write: 3 requests; at a
  partition's first claim (epoch 1, created by this store instance), ``upload_blob``
  if-none-match the placeholder: 1 request (3 more when a checkpoint is there after all);
* checkpoint after a fence: ``set_blob_metadata`` If-Match the cached etag: 1 request
  (3 without a fence: HEAD ownership, HEAD checkpoint, write);
* listing: one request per 5000 blobs; ``server_time`` is the last page's ``Date``. The
  answer is read by :mod:`eventprocessor.stores._blob_listing` (the SDK's own request,
  pipeline and errors, without its model deserialization), or by ``list_blobs`` when the
  installed azure-storage-blob lacks what it needs.

Example::

    async with BlobCheckpointStore.from_connection_string(conn_str, "checkpoints") as store:
        processor = EventProcessor(source, store, MyProcessor)
        await processor.run()
"""
from __future__ import annotations

import asyncio
import builtins
import inspect
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from azure.core import MatchConditions
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import ResourceExistsError
from azure.storage.blob.aio import BlobClient, ContainerClient, LinearRetry

from eventprocessor.errors import ConfigurationError

from ._account import DEFAULT_OPERATION_TIMEOUT, RETRY_BACKOFF, RETRY_TOTAL, check_container_name, one_of
from ._azure_records import AzureCheckpointStore, AzureRecords, ServerClock
from ._blob_listing import lean_listing
from .backend import MEMBER, OWNERSHIP, Fields, Kind, RecordListing, RecordMissing, Scope, StoredRecord

__all__ = ["BlobCheckpointStore", "BlobRecords", "is_azure_eventhub_blob_store"]

logger = logging.getLogger(__name__)


_CACHED_BLOB_CLIENTS = 4096


def _quoted(etag: str | None) -> str:
    # Listing returns etags bare, every other call quoted; one form lets callers compare.
    if etag is None or etag.startswith('"') or etag.startswith("W/"):
        return etag or ""
    return f'"{etag}"'


def _metadata(fields: Fields) -> dict[str, str]:
    return {name: str(value) for name, value in fields.items()}


def _fields(metadata: Mapping[str, str | None] | None) -> dict[str, str]:
    # A listing returns an empty value (a released owner) as None.
    return {k.lower(): v or "" for k, v in (metadata or {}).items()}


def _written(blob: BlobClient, key: str, fields: Fields, response: Mapping[str, Any]) -> StoredRecord:
    return StoredRecord(key, _quoted(response["etag"]), response["last_modified"], dict(fields), blob.blob_name)


class BlobRecords(AzureRecords[ContainerClient]):
    """The Blob backend: one zero-length blob per record, fields in its metadata."""

    forbidden = "/\\"
    gone_codes = frozenset({"ContainerNotFound"})
    page_size: int | None = None
    """Blobs per listing page; ``None`` lets the service decide (5000). Tests page by 2."""

    def __init__(self, home: str, home_name: str, client: ContainerClient, account_name: str | None) -> None:
        super().__init__(home, home_name, client, account_name)
        self._blobs: dict[str, BlobClient] = {}  # least recently used first
        # List Blobs sent through the client's pipeline and read without the SDK's models
        # (about a tenth of their client CPU, see _blob_listing); None (an SDK without the
        # pieces it needs): the SDK's list_blobs.
        self.lean = lean_listing(client)


    async def _create_home(self) -> None:
        self.request_counts["container_exists"] += 1
        if await self.client.exists():
            return
        try:
            self.request_counts["create_container"] += 1
            await self.client.create_container()
            logger.info("created blob container %s in account %s for checkpoints", self.home_name,
                        self.account_name)
        except ResourceExistsError:
            pass  # created by another processor meanwhile

    async def _list_one(self) -> None:
        async for page in self.client.list_blobs(results_per_page=1).by_page():
            async for _blob in page:
                break
            break

    @staticmethod
    def prefix(kind: Kind, scope: Scope) -> str:
        segment = f"log/{kind.log}" if kind.name == "entry" else _SEGMENTS.get(kind.name, kind.name)
        return f"{scope[0]}/{scope[1]}/{scope[2]}/{segment}/".lower()

    def _blob(self, kind: Kind, scope: Scope, key: str) -> BlobClient:
        # Building a BlobClient costs more client CPU than the request it sends (the
        # pipeline is rebuilt), so the hot ones are kept, as the official store does.
        name = self.prefix(kind, scope) + key.lower()
        blob = self._blobs.pop(name, None) or self.client.get_blob_client(name)
        self._blobs[name] = blob
        if len(self._blobs) > _CACHED_BLOB_CLIENTS:
            del self._blobs[next(iter(self._blobs))]
        return blob

    async def read(self, kind: Kind, scope: Scope, key: str, *, with_data: bool = False) -> StoredRecord | None:
        blob = self._blob(kind, scope, key)

        async def get() -> StoredRecord:
            data = b""
            if with_data:
                downloader = await blob.download_blob()
                data, props = await downloader.readall(), downloader.properties
            else:
                props = await blob.get_blob_properties()
            return StoredRecord(key, _quoted(props.etag), props.last_modified, _fields(props.metadata), blob.blob_name,
                                data)

        try:
            return await self._send("read", kind, get)
        except RecordMissing:
            return None

    async def create(self, kind: Kind, scope: Scope, key: str, fields: Fields, data: bytes = b"") -> StoredRecord:
        blob = self._blob(kind, scope, key)
        props = await self._send("create", kind, lambda: blob.upload_blob(
            data, overwrite=True, if_none_match="*", metadata=_metadata(fields)))
        return _written(blob, key, fields, props)

    async def replace(self, kind: Kind, scope: Scope, key: str, fields: Fields, etag: str) -> StoredRecord:
        blob = self._blob(kind, scope, key)
        props = await self._send("replace", kind, lambda: blob.set_blob_metadata(
            _metadata(fields), etag=etag, match_condition=MatchConditions.IfNotModified))
        return _written(blob, key, fields, props)

    async def upsert(self, kind: Kind, scope: Scope, key: str, fields: Fields) -> StoredRecord:
        blob = self._blob(kind, scope, key)
        props = await self._send("upsert", kind, lambda: blob.upload_blob(
            b"", overwrite=True, metadata=_metadata(fields)))
        return _written(blob, key, fields, props)

    async def delete(self, kind: Kind, scope: Scope, key: str) -> None:
        blob = self._blob(kind, scope, key)
        try:
            await self._send("delete", kind, blob.delete_blob)
        except RecordMissing:
            pass

    async def _list_blobs(self, kind: Kind, name_starts_with: str) -> tuple[builtins.list[Any], ServerClock]:
        clock = ServerClock()

        def hook(response: Any) -> None:
            self.request_counts[f"list_{kind.name}"] += 1
            clock.hook(response)

        async def collect() -> list[Any]:
            if self.lean is not None:
                return await self.lean.list(name_starts_with, hook=hook, page_size=self.page_size)
            return [blob async for blob in self.client.list_blobs(
                name_starts_with=name_starts_with, include=["metadata"], raw_response_hook=hook,
                results_per_page=self.page_size)]

        return await self._send("list", kind, collect, count=False), clock  # the hook counts the pages

    async def list(self, kind: Kind, scope: Scope, prefix: str = "") -> RecordListing:
        base = self.prefix(kind, scope)
        blobs, clock = await self._list_blobs(kind, base + prefix.lower())
        listing = RecordListing(records=[], server_time=clock.latest)
        for blob in blobs:
            _file(listing, blob, base)
        return listing

    async def list_ownership_and_members(self, scope: Scope) -> tuple[RecordListing, RecordListing]:
        """One listing of ``.../ownership`` returns ``ownership/`` and ``ownership-member/``."""
        bases = {OWNERSHIP: self.prefix(OWNERSHIP, scope), MEMBER: self.prefix(MEMBER, scope)}
        blobs, clock = await self._list_blobs(OWNERSHIP, bases[OWNERSHIP].rstrip("/"))
        listings = {kind: RecordListing(records=[], server_time=clock.latest) for kind in bases}
        for blob in blobs:
            kind = MEMBER if blob.name.startswith(bases[MEMBER]) else OWNERSHIP
            _file(listings[kind], blob, bases[kind])
        return listings[OWNERSHIP], listings[MEMBER]


_SEGMENTS = {"member": "ownership-member"}


def _file(listing: RecordListing, blob: Any, base: str) -> None:
    """Put a listed blob in ``listing``: a record directly under ``base``, else foreign."""
    rest = blob.name[len(base):] if blob.name.startswith(base) else ""
    if not rest or "/" in rest:
        listing.foreign.append((blob.name, blob.etag))
        return
    listing.records.append(StoredRecord(rest, _quoted(blob.etag), blob.last_modified, _fields(blob.metadata),
                                        blob.name))


class BlobCheckpointStore(AzureCheckpointStore):
    """Checkpoint store on Azure Blob Storage (async, aiohttp transport).

    ``credential`` may be an async TokenCredential (``azure.identity.aio``), a SAS token
    string, an account key string, ``AzureNamedKeyCredential``/``AzureSasCredential``,
    a dict ``{"account_name", "account_key"}``, or ``None`` when ``account_url`` carries
    a SAS token. ``operation_timeout`` (seconds, default 10, ``None`` for no deadline)
    bounds every call, retries included: see docs/howto/checkpoint-stores.md, "Timeouts". Other keyword arguments
    go to ``azure.storage.blob.aio.ContainerClient`` (for example ``api_version``,
    ``retry_policy``, ``retry_total``, ``transport``, ``connection_timeout``,
    ``read_timeout``). The container is created on first use when missing.

    The official store's argument names work too: ``blob_account_url`` for
    ``account_url``, and ``container_name`` (ours as well) positionally or by keyword.
    :meth:`from_azure_eventhub` builds this store on an azure-eventhub
    ``BlobCheckpointStore``'s container and credential.

    Example::

        from azure.identity.aio import DefaultAzureCredential
        store = BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints",
                                    credential=DefaultAzureCredential())
        async with store:
            listing = await store.list_ownership("ns.servicebus.windows.net", "hub", "$default")
    """

    _check_name = staticmethod(check_container_name)
    _service = "blob"
    _home = "container"
    _name_keyword = "container_name"
    _sas_as_string = True

    def __init__(self, account_url: str | None = None, container_name: str | None = None, *,
                 credential: Any = None, operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
                 blob_account_url: str | None = None, **kwargs: Any) -> None:
        url = one_of("account_url", account_url, "blob_account_url", blob_account_url)
        if url is None:
            raise ConfigurationError("BlobCheckpointStore needs the storage account's blob URL: "
                                     "BlobCheckpointStore(account_url, container_name, credential=...)")
        super().__init__(url, container_name, credential=credential,  # type: ignore[arg-type]
                         operation_timeout=operation_timeout, client_options=kwargs)

    @classmethod
    def from_azure_eventhub(cls, store: Any, **kwargs: Any) -> BlobCheckpointStore:
        """This store on the container, account and credential of azure-eventhub's
        ``BlobCheckpointStore`` (``azure.eventhub.extensions.checkpointstoreblobaio``,
        or the sync ``...checkpointstoreblob``): the same blobs, with this store's
        fencing (conditional claims, epoch-fenced checkpoints), so the official consumers
        and this SDK's share checkpoints and ownership.

        The official store's API version is kept; its other client settings (transport,
        retries, headers, the secondary host) are not: this store's timeouts and retries
        apply (``operation_timeout`` and ``ContainerClient`` options as keyword arguments).
        A synchronous token credential (from the sync store) is called in a worker thread.
        ``EventHubConsumerClient`` does this by itself when given the official store.

        Example::

            from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore as Official
            official = Official.from_connection_string(storage_conn_str, container_name="checkpoints")
            store = BlobCheckpointStore.from_azure_eventhub(official)
        """
        account_url, container_name, credential, api_version = _official_container(store)
        if api_version is not None:
            kwargs.setdefault("api_version", api_version)
        return cls(account_url, container_name, credential=credential, **kwargs)

    def _backend_for(self, credential: Any, options: dict[str, Any]) -> BlobRecords:
        retry_total = options.pop("retry_total", RETRY_TOTAL)
        options.setdefault(
            # The SDK annotates these as int but computes with floats; sub-second values work.
            "retry_policy", LinearRetry(backoff=RETRY_BACKOFF, random_jitter_range=RETRY_BACKOFF / 2,  # type: ignore[arg-type]
                                        retry_total=retry_total)
        )
        container = ContainerClient(self._account_url, self._home_name, credential=credential, **options)
        return BlobRecords("container", self._home_name, container, self._account_name)

    @property
    def container_name(self) -> str:
        return self._home_name


OFFICIAL_MODULES = ("azure.eventhub.extensions.checkpointstoreblobaio", "azure.eventhub.extensions.checkpointstoreblob")
"""Where azure-eventhub's blob checkpoint stores live (async, then sync)."""


def is_azure_eventhub_blob_store(store: Any) -> bool:
    """Whether ``store`` is (a subclass of) azure-eventhub's ``BlobCheckpointStore``."""
    return any(cls.__name__ == "BlobCheckpointStore" and cls.__module__.split("._")[0] in OFFICIAL_MODULES
               for cls in type(store).__mro__)


def _official_container(store: Any) -> tuple[str, str, Any, str | None]:
    """``(account_url, container_name, credential, api_version)`` of an azure-eventhub
    ``BlobCheckpointStore``, read from the public attributes of its (vendored
    azure-storage-blob) container client."""
    if not is_azure_eventhub_blob_store(store):
        raise ConfigurationError(f"from_azure_eventhub takes azure-eventhub's BlobCheckpointStore, got "
                                 f"{type(store).__module__}.{type(store).__name__}")
    container: Any = getattr(store, "_container_client", None)
    scheme: Any = getattr(container, "scheme", None)
    host: Any = getattr(container, "primary_hostname", None)
    name: Any = getattr(container, "container_name", None)
    url: Any = getattr(container, "url", None)
    if not all(isinstance(value, str) and value for value in (scheme, host, name, url)):
        raise ConfigurationError(
            f"this version of azure-eventhub's BlobCheckpointStore ({type(store).__module__}) has no container client "
            "this SDK can read; build the store yourself: stores.BlobCheckpointStore.from_connection_string("
            "<the same connection string>, container_name=<the same container>)")
    query = urlsplit(url).query  # a SAS token given in the URL or the connection string
    account_url = f"{scheme}://{host}" + (f"?{query}" if query else "")
    credential: Any = getattr(container, "credential", None)
    if isinstance(getattr(credential, "account_name", None), str) and isinstance(
            getattr(credential, "account_key", None), str):
        # The client keeps an account key as its signing policy; the key is what we need.
        credential = AzureNamedKeyCredential(credential.account_name, credential.account_key)
    elif hasattr(credential, "get_token") and not inspect.iscoroutinefunction(credential.get_token):
        credential = ThreadedTokenCredential(credential)
    api_version = getattr(container, "api_version", None)
    return account_url, name, credential, api_version if isinstance(api_version, str) else None


class ThreadedTokenCredential:
    """A synchronous ``TokenCredential`` as an async one: ``get_token`` runs in a worker
    thread. The wrapped credential stays the caller's: :meth:`close` leaves it open."""

    def __init__(self, credential: Any) -> None:
        self._credential = credential

    async def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self._credential.get_token, *scopes, **kwargs)

    async def close(self) -> None:
        pass

    async def __aenter__(self) -> ThreadedTokenCredential:
        return self

    async def __aexit__(self, *args: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"ThreadedTokenCredential({type(self._credential).__name__})"
