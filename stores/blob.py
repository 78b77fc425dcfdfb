"""Checkpoint store on Azure Blob Storage, layout-compatible with the official
``azure-eventhub-checkpointstoreblob-aio``.

Layout
======
One container; zero-length blobs whose names are lower-cased::

    {namespace}/{eventhub}/{consumer_group}/ownership/{partition_id}
        metadata: ownerid, epoch
    {namespace}/{eventhub}/{consumer_group}/checkpoint/{partition_id}
        metadata: sequencenumber, offset, ownerid, epoch

``ownerid``, ``sequencenumber`` and ``offset`` are exactly what the official store
writes and reads, so a deployment can switch to this SDK and back and resume from the
same checkpoints. ``epoch`` (ownership and checkpoint) and ``ownerid`` (checkpoint)
are extra metadata the official store ignores. An ownership blob without ``epoch``
(written by the official store) has epoch 0; a checkpoint without it has epoch
``None``. A checkpoint without an offset is written with ``offset="-1"`` (Event Hubs'
start of stream): the official processor then re-reads the partition from the start
rather than failing, and this store reads it back as ``offset=None``.

Claims
======
* ``etag=None``: ``upload_blob(b"", overwrite=True, if_none_match="*")``, a real
  create-if-absent (409 when the blob exists). The official store uses
  ``set_blob_metadata(if_none_match="*")``, which *succeeds* on an existing blob, so two
  of its processors can both "create" the same partition; this store never does that.
* with an etag: ``set_blob_metadata(etag=..., match_condition=IfNotModified)`` (412 when
  stale).
* 409/412 (and 404 for a record that vanished) mean the race was lost: the claim is left
  out of the result. Anything else is an error: it raises ``ClaimOwnershipError``
  carrying the claims won in the same call. All claims of a call run concurrently.

Server time
===========
``list_ownership`` returns the ``Date`` header of the listing response (the last page
when paged) as ``server_time``. The balancer judges expiry as ``server_time -
last_modified``; both come from the storage service, so a processor whose own clock is
minutes off neither steals live partitions nor keeps expired ones. Both have 1-second
resolution.

Fenced checkpoints
==================
``update_checkpoint(checkpoint, owner_id=..., epoch=...)`` does, in order:

1. **Ownership check** (1 request, HEAD): read the ownership blob's properties and
   require ``ownerid == owner_id`` and ``epoch == epoch``; otherwise raise
   ``OwnershipLostError``.
2. **Conditional write** (1 request): write the checkpoint blob's metadata
   ``If-Match`` the checkpoint etag this store got from its own last write for
   ``(owner_id, partition)``. With no cached etag it first reads the checkpoint blob
   (1 more HEAD) and refuses with ``OwnershipLostError`` if the stored checkpoint
   carries a higher epoch than ours; if the blob does not exist it creates it with
   ``If-None-Match: *``.
3. On 409/412 (somebody else wrote the checkpoint since): back to 1 (ownership check,
   re-read, write) once; a second conflict raises ``CheckpointStoreError``.

Cost: **2 requests** per checkpoint in the steady state (3 for the first checkpoint
an owner writes for a partition through this store instance, 5 after a conflict),
against 1 unconditional write for the official store.

Measured on loopback Azurite (2-core machine, one client, sequential calls):
8.5 ms per fenced checkpoint against 2.9 ms for the official store's unfenced write;
``python -m benchmarks.store_bench`` gives the throughput ratio under concurrency.

Why the new owner's checkpoint cannot be lost. Let the old owner O hold epoch *e* and
the new owner N steal the partition with epoch *e+1*. Step 1 and step 2 of O are two
requests one round trip apart (about 3 ms on loopback Azurite, the latency of one
storage request in general), so the steal can fall between them (the window):

* If N has already written a checkpoint when O's write arrives, the checkpoint etag O
  conditions on is older than N's write (it came from O's own write or read, both
  before N's write, or O would have seen epoch *e+1* and refused). The write fails with
  412, O re-checks ownership, finds N, and raises ``OwnershipLostError``. N's checkpoint
  stays.
* If N has not written yet, O's write in the window lands. It records an event O really
  processed, and N's first write replaces it: N reads the etag (or gets 412 on a stale
  one, re-checks that it still owns the partition, re-reads and writes). Nothing of N's
  is lost; at worst N re-processes events O had already processed, the at-least-once
  guarantee every Event Hubs consumer has anyway.
* Any later write by O fails at step 1, because the ownership blob names N.

So after a steal, only an old-owner write that had already passed step 1 can still
land (one per call in flight, normally one), only in that window and only before the
new owner's first checkpoint; the old owner's writes never overwrite the new owner's
checkpoint.

Bad records
===========
Blobs under the prefix that are not ours (deeper paths, missing ``ownerid`` or
``sequencenumber``, non-integer numbers, a bad epoch) are skipped with a warning that
names the blob (once per blob version), and listing goes on. A corrupted ownership blob
therefore keeps its partition unclaimable until someone deletes it.

Example::

    async with BlobCheckpointStore.from_connection_string(conn_str, "checkpoints") as store:
        processor = EventProcessor(source, store, MyProcessor)
        await processor.run()
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Any, Dict, Iterable, List, Optional, Tuple

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError
from azure.storage.blob.aio import ContainerClient, LinearRetry

from eventprocessor.checkpoint_store import CheckpointStore
from eventprocessor.errors import CheckpointStoreError
from eventprocessor.records import Checkpoint, Ownership, OwnershipListing

from ._azure import (
    NO_OFFSET,
    RETRY_BACKOFF,
    RETRY_TOTAL,
    ServerClock,
    WarnOnce,
    account_name_from_url,
    check_account_url,
    check_checkpoint,
    check_claim,
    check_container_name,
    check_name_part,
    check_scope,
    claim_concurrently,
    claim_conditionally,
    client_options,
    describe_error,
    parse_connection_string,
    parse_int,
    read_checkpoint_record,
    read_ownership_record,
    refuse_later_epoch,
    require_owner,
    resolve_credential,
    safe_url,
    write_fenced,
)

__all__ = ["BlobCheckpointStore"]

logger = logging.getLogger(__name__)

_EMPTY = b""
_Scope = Tuple[str, str, str]


def _quoted(etag: Optional[str]) -> Optional[str]:
    # Listing returns etags bare, every other call quoted; one form lets callers compare.
    if etag is None or etag.startswith('"') or etag.startswith("W/"):
        return etag
    return f'"{etag}"'


def _scope_parts(namespace: str, eventhub: str, consumer_group: str) -> _Scope:
    return check_scope(namespace, eventhub, consumer_group, forbidden="/\\")


def _prefix(scope: _Scope, kind: str) -> str:
    return f"{scope[0]}/{scope[1]}/{scope[2]}/{kind}/".lower()


def _blob_name(scope: _Scope, kind: str, partition_id: str) -> str:
    check_name_part(partition_id, "partition_id", forbidden="/\\")
    return _prefix(scope, kind) + partition_id.lower()


def _lower_keys(metadata: Optional[Dict[str, str]]) -> Dict[str, str]:
    return {k.lower(): v for k, v in (metadata or {}).items()}


class BlobCheckpointStore(CheckpointStore):
    """Checkpoint store on Azure Blob Storage (async, aiohttp transport).

    ``credential`` may be an async TokenCredential (``azure.identity.aio``), a SAS token
    string, an account key string, ``AzureNamedKeyCredential``/``AzureSasCredential``,
    or ``None`` when ``account_url`` carries a SAS token. Other keyword arguments go to
    ``azure.storage.blob.aio.ContainerClient`` (for example ``retry_policy`` or
    ``transport``). The container is created on first use when missing.

    Example::

        from azure.identity.aio import DefaultAzureCredential
        store = BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints",
                                    credential=DefaultAzureCredential())
        async with store:
            listing = await store.list_ownership("ns.servicebus.windows.net", "hub", "$default")
    """

    def __init__(self, account_url: str, container_name: str, *, credential: Any = None, **kwargs: Any) -> None:
        self._account_url = check_account_url(account_url)
        self._container_name = check_container_name(container_name)
        self._account_name = account_name_from_url(self._account_url)
        resolved = resolve_credential(credential, self._account_url, sas_as_string=True)
        options = client_options(kwargs)
        # The storage default waits 15 s and more between retries; a balancing tick is
        # ~10 s, so retry quickly and let the next tick try again.
        retry_total = options.pop("retry_total", RETRY_TOTAL)
        options.setdefault(
            # The SDK annotates these as int but computes with floats; sub-second values work.
            "retry_policy", LinearRetry(backoff=RETRY_BACKOFF, random_jitter_range=RETRY_BACKOFF / 2,  # type: ignore[arg-type]
                                        retry_total=retry_total)
        )
        self._container = ContainerClient(self._account_url, self._container_name, credential=resolved, **options)
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._closed = False
        self._checkpoint_etags: Dict[Tuple[str, str, str, str, str], str] = {}
        self._warn = WarnOnce(logger)
        self.request_counts: Counter = Counter()
        """Requests sent, by kind (listing pages count one each)."""

    @classmethod
    def from_connection_string(cls, conn_str: str, container_name: str, **kwargs: Any) -> "BlobCheckpointStore":
        """Create a store from an Azure Storage connection string.

        ``UseDevelopmentStorage=true`` means Azurite on its default ports. A malformed
        string raises ``ConfigurationError`` naming the part that is wrong, never its
        value.

        Example::

            store = BlobCheckpointStore.from_connection_string(
                "UseDevelopmentStorage=true", "checkpoints")
        """
        account = parse_connection_string(conn_str, "blob")
        return cls(account.endpoint, container_name, credential=account.credential, **kwargs)

    def __repr__(self) -> str:
        return (
            f"BlobCheckpointStore(account={self._account_name!r}, endpoint={safe_url(self._account_url)!r}, "
            f"container={self._container_name!r})"
        )

    @property
    def container_name(self) -> str:
        return self._container_name

    async def __aenter__(self) -> "BlobCheckpointStore":
        await self._container.__aenter__()
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._container.close()

    # ------------------------------------------------------------------ plumbing

    async def _ensure_container(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            try:
                self.request_counts["container_exists"] += 1
                exists = await self._container.exists()
                if not exists:
                    try:
                        self.request_counts["create_container"] += 1
                        await self._container.create_container()
                        logger.info("created blob container %s in account %s for checkpoints",
                                    self._container_name, self._account_name)
                    except ResourceExistsError:
                        pass  # created by another processor meanwhile
            except AzureError as error:
                if getattr(error, "status_code", None) != 403:
                    raise CheckpointStoreError(
                        f"cannot use blob container {self._container_name}: {describe_error(error)}"
                    ) from error
                # A SAS scoped to the container may list and write blobs but not read
                # the container's properties; the first real request tells if it is missing.
                logger.debug("no permission to check container %s; assuming it exists", self._container_name)
            self._ready = True

    def _forget_container_if_gone(self, error: BaseException) -> None:
        code = getattr(error, "error_code", None)
        if str(getattr(code, "value", code)) == "ContainerNotFound":
            self._ready = False

    async def _list(self, prefix: str, clock: Optional[ServerClock] = None) -> List[Any]:
        await self._ensure_container()
        clock = clock or ServerClock()

        def hook(response: Any) -> None:
            self.request_counts["list"] += 1
            clock.hook(response)

        try:
            return [blob async for blob in self._container.list_blobs(
                name_starts_with=prefix, include=["metadata"], raw_response_hook=hook)]
        except AzureError as error:
            self._forget_container_if_gone(error)
            raise CheckpointStoreError(
                f"listing {prefix!r} in container {self._container_name} failed: {describe_error(error)}"
            ) from error

    def _partition_of(self, name: str, prefix: str) -> Optional[str]:
        rest = name[len(prefix):]
        if not rest or "/" in rest:
            return None
        return rest

    # ------------------------------------------------------------------ ownership

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        """All ownership records of the consumer group and the service's current time.

        Example::

            listing = await store.list_ownership("ns.servicebus.windows.net", "hub", "$default")
            ages = {o.partition_id: listing.server_time - o.last_modified_time
                    for o in listing.ownerships}
        """
        scope = _scope_parts(fully_qualified_namespace, eventhub_name, consumer_group)
        prefix = _prefix(scope, "ownership")
        clock = ServerClock()
        blobs = await self._list(prefix, clock)
        records: List[Ownership] = []
        for blob in blobs:
            record = self._ownership_from_blob(blob, prefix, scope)
            if record is not None:
                records.append(record)
        if clock.latest is None:
            raise CheckpointStoreError(
                f"listing ownership in container {self._container_name} returned no Date header"
            )
        return OwnershipListing(ownerships=tuple(records), server_time=clock.latest)

    def _ownership_from_blob(self, blob: Any, prefix: str, scope: _Scope) -> Optional[Ownership]:
        partition_id = self._partition_of(blob.name, prefix)
        key = (blob.name, blob.etag)
        if partition_id is None:
            self._warn(key, "skipping foreign blob %r in container %s: not an ownership record",
                       blob.name, self._container_name)
            return None
        metadata = _lower_keys(blob.metadata)
        if "ownerid" not in metadata:
            self._warn(key, "skipping ownership blob %r in container %s: no ownerid metadata",
                       blob.name, self._container_name)
            return None
        # A listing returns an empty value (a released record) as None.
        owner_id = metadata["ownerid"] or ""
        epoch = parse_int(metadata.get("epoch", "0"))
        if epoch is None or epoch < 0:
            self._warn(key, "skipping ownership blob %r in container %s: epoch is not a non-negative integer",
                       blob.name, self._container_name)
            return None
        return Ownership(
            fully_qualified_namespace=scope[0],
            eventhub_name=scope[1],
            consumer_group=scope[2],
            partition_id=partition_id,
            owner_id=owner_id,
            last_modified_time=blob.last_modified,
            etag=_quoted(blob.etag),
            epoch=epoch,
        )

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> List[Ownership]:
        """Conditionally write each claim, concurrently; return the ones won.

        Example::

            won = await store.claim_ownership([replace(record, owner_id=me, epoch=record.epoch + 1)])
        """
        claims = list(ownerships)
        if not claims:
            return []
        names = [self._check_claim(claim) for claim in claims]
        await self._ensure_container()
        return await claim_concurrently(claims, names, self._claim_one, f"container {self._container_name}")

    @staticmethod
    def _check_claim(claim: Ownership) -> str:
        check_claim(claim)
        scope = _scope_parts(claim.fully_qualified_namespace, claim.eventhub_name, claim.consumer_group)
        return _blob_name(scope, "ownership", claim.partition_id)

    async def _claim_one(self, claim: Ownership, name: str) -> Optional[Ownership]:
        blob = self._container.get_blob_client(name)
        metadata = {"ownerid": claim.owner_id, "epoch": str(claim.epoch)}

        async def write() -> Tuple[Optional[str], Any]:
            if claim.etag is None:
                self.request_counts["create_ownership"] += 1
                props = await blob.upload_blob(_EMPTY, overwrite=True, if_none_match="*", metadata=metadata)
            else:
                self.request_counts["update_ownership"] += 1
                props = await blob.set_blob_metadata(
                    metadata, etag=claim.etag, match_condition=MatchConditions.IfNotModified)
            return _quoted(props["etag"]), props["last_modified"]

        return await claim_conditionally(claim, write, self._forget_container_if_gone, logger)

    # ----------------------------------------------------------------- checkpoints

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` if ``(owner_id, epoch)`` still owns the partition.

        See the module docstring for the mechanism and its cost. Raises
        ``OwnershipLostError`` (checkpoint not written) when the partition was taken.

        Example::

            await store.update_checkpoint(
                Checkpoint("ns", "hub", "$default", "0", sequence_number=41, offset="8192"),
                owner_id=me, epoch=3)
        """
        check_checkpoint(checkpoint, owner_id, epoch)
        scope = _scope_parts(checkpoint.fully_qualified_namespace, checkpoint.eventhub_name, checkpoint.consumer_group)
        ownership_blob = self._container.get_blob_client(_blob_name(scope, "ownership", checkpoint.partition_id))
        checkpoint_blob = self._container.get_blob_client(_blob_name(scope, "checkpoint", checkpoint.partition_id))
        cache_key = (*scope, checkpoint.partition_id, owner_id)
        metadata = {
            "sequencenumber": str(checkpoint.sequence_number),
            "offset": NO_OFFSET if checkpoint.offset is None else str(checkpoint.offset),
            "ownerid": owner_id,
            "epoch": str(epoch),
        }

        async def write(etag: Optional[str]) -> str:
            if etag is None:
                self.request_counts["create_checkpoint"] += 1
                props = await checkpoint_blob.upload_blob(
                    _EMPTY, overwrite=True, if_none_match="*", metadata=metadata)
            else:
                self.request_counts["update_checkpoint"] += 1
                props = await checkpoint_blob.set_blob_metadata(
                    metadata, etag=etag, match_condition=MatchConditions.IfNotModified)
            return str(_quoted(props["etag"]))

        await self._ensure_container()
        await write_fenced(
            checkpoint, owner_id, epoch,
            verify_owner=lambda: self._verify_owner(ownership_blob, checkpoint, owner_id, epoch),
            read_etag=lambda: self._read_checkpoint_etag(checkpoint_blob, checkpoint, owner_id, epoch),
            write=write, etags=self._checkpoint_etags, cache_key=cache_key, log=logger,
        )

    async def _verify_owner(self, blob: Any, checkpoint: Checkpoint, owner_id: str, epoch: int) -> None:
        self.request_counts["read_ownership"] += 1
        props = await read_ownership_record(
            checkpoint, owner_id, epoch, blob.get_blob_properties, self._forget_container_if_gone)
        metadata = _lower_keys(props.metadata)
        stored = metadata.get("epoch", "0")
        require_owner(checkpoint, owner_id, epoch, metadata.get("ownerid"), parse_int(stored), stored)

    async def _read_checkpoint_etag(
        self, blob: Any, checkpoint: Checkpoint, owner_id: str, epoch: int
    ) -> Optional[str]:
        """The stored checkpoint's etag (None when absent); refuses a later owner's checkpoint."""
        self.request_counts["read_checkpoint"] += 1
        props = await read_checkpoint_record(checkpoint, blob.get_blob_properties)
        if props is None:
            return None
        refuse_later_epoch(checkpoint, owner_id, epoch, parse_int(_lower_keys(props.metadata).get("epoch")))
        return _quoted(props.etag)

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> List[Checkpoint]:
        """All checkpoints of the consumer group; bad records are skipped with a warning.

        Example::

            positions = {c.partition_id: c.sequence_number
                         for c in await store.list_checkpoints("ns", "hub", "$default")}
        """
        scope = _scope_parts(fully_qualified_namespace, eventhub_name, consumer_group)
        prefix = _prefix(scope, "checkpoint")
        result: List[Checkpoint] = []
        for blob in await self._list(prefix):
            record = self._checkpoint_from_blob(blob, prefix, scope)
            if record is not None:
                result.append(record)
        return result

    def _checkpoint_from_blob(self, blob: Any, prefix: str, scope: _Scope) -> Optional[Checkpoint]:
        partition_id = self._partition_of(blob.name, prefix)
        key = (blob.name, blob.etag)
        if partition_id is None:
            self._warn(key, "skipping foreign blob %r in container %s: not a checkpoint record",
                       blob.name, self._container_name)
            return None
        metadata = _lower_keys(blob.metadata)
        if "sequencenumber" not in metadata:
            self._warn(key, "skipping checkpoint blob %r in container %s: no sequencenumber metadata",
                       blob.name, self._container_name)
            return None
        sequence_number = parse_int(metadata["sequencenumber"])
        if sequence_number is None:
            self._warn(key, "skipping checkpoint blob %r in container %s: sequencenumber is not an integer",
                       blob.name, self._container_name)
            return None
        epoch: Optional[int] = None
        if "epoch" in metadata:
            epoch = parse_int(metadata["epoch"])
            if epoch is None or epoch < 0:
                self._warn(key, "skipping checkpoint blob %r in container %s: epoch is not a non-negative integer",
                           blob.name, self._container_name)
                return None
        offset = metadata.get("offset")
        return Checkpoint(
            fully_qualified_namespace=scope[0],
            eventhub_name=scope[1],
            consumer_group=scope[2],
            partition_id=partition_id,
            sequence_number=sequence_number,
            offset=offset if offset and offset != NO_OFFSET else None,
            owner_id=metadata.get("ownerid") or None,
            epoch=epoch,
        )
