"""Checkpoint store on Azure Table Storage (or the Cosmos DB Table API).

Layout
======
Entity layout of the official table checkpoint store draft
(``azure-eventhub-checkpointstoretable``), in one table::

    PartitionKey "{namespace} {eventhub} {consumer_group} Ownership", RowKey partition id
        ownerid (str), epoch (Int64)
    PartitionKey "{namespace} {eventhub} {consumer_group} Checkpoint", RowKey partition id
        sequencenumber (str), offset (str), ownerid (str), epoch (Int64)

``epoch`` and the checkpoint's ``ownerid`` are ours; records without them read as
epoch 0 (ownership) and ``None`` (checkpoint). A checkpoint without an offset stores
``"-1"`` (Event Hubs' start of stream), as in :mod:`stores.blob`. Names are used as given (Table keys are
case-sensitive); they may not contain ``/ \\ # ?``, control characters or whitespace
(the service rejects the first ones, whitespace would make the key ambiguous), which
is checked before any request with a ``ConfigurationError``.

Semantics are those of :mod:`stores.blob`:

* claims: ``etag=None`` is ``create_entity`` (409 when the entity exists); with an etag
  it is ``update_entity(mode=REPLACE, etag=..., match_condition=IfNotModified)`` (412
  when stale, 404 when the entity is gone). Those are lost races, left out of the
  result; anything else raises ``ClaimOwnershipError`` with the claims won. A claim's
  ``last_modified_time`` is the response's ``Date`` (second resolution, so never later
  than the entity's ``Timestamp``).
* ``list_ownership`` returns the ``Date`` header of the query response as
  ``server_time``; expiry is ``server_time - Timestamp``, both the service's clock.
  ``Date`` has 1-second resolution and ``Timestamp`` 100 ns, so a record written in the
  last second can look up to 1 s younger than it is (never older).
* fenced checkpoints: read the ownership entity and require ``(ownerid, epoch)``
  (1 request), then replace the checkpoint entity ``If-Match`` its last etag known to
  this store (1 request; a first write reads it, or creates it when absent, and refuses
  a checkpoint from a later epoch); on 409/412 check ownership, re-read and retry once.
  2 requests per checkpoint in the steady state against 1 for an unfenced store. The
  ownership and checkpoint entities have different PartitionKeys, so an entity group
  transaction cannot make the two one atomic request. Why the new owner's checkpoint
  cannot be lost is argued in :mod:`stores.blob`; the argument only needs conditional
  writes, so it holds here unchanged.
* entities that are not ours or are corrupted (no ``ownerid``/``sequencenumber``, a
  non-integer number, a bad epoch) are skipped with a warning naming the table and keys.

Example::

    async with TableCheckpointStore.from_connection_string(conn_str, "checkpoints") as store:
        processor = EventProcessor(source, store, MyProcessor)
        await processor.run()
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from datetime import datetime, timezone
from typing import Any, Dict, Iterable, List, Optional, Tuple

from azure.core import MatchConditions
from azure.core.exceptions import AzureError, ResourceExistsError
from azure.data.tables import EdmType, EntityProperty, UpdateMode
from azure.data.tables.aio import TableClient

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
    check_name_part,
    check_scope,
    check_table_name,
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

__all__ = ["TableCheckpointStore"]

logger = logging.getLogger(__name__)

_FORBIDDEN = "/\\#? \t\r\n"
_Scope = Tuple[str, str, str]


def _scope_parts(namespace: str, eventhub: str, consumer_group: str) -> _Scope:
    return check_scope(namespace, eventhub, consumer_group, forbidden=_FORBIDDEN)


def _partition_key(scope: _Scope, kind: str) -> str:
    return f"{scope[0]} {scope[1]} {scope[2]} {kind}"


def _row_key(partition_id: str) -> str:
    return check_name_part(partition_id, "partition_id", forbidden=_FORBIDDEN)


def _plain_datetime(value: Any) -> Optional[datetime]:
    # The SDK hands out TablesEntityDatetime (a datetime subclass that also keeps the
    # service's string); records carry plain aware datetimes like the other stores.
    if not isinstance(value, datetime):
        return None
    return datetime(value.year, value.month, value.day, value.hour, value.minute, value.second,
                    value.microsecond, tzinfo=value.tzinfo or timezone.utc)


def _int64(value: int) -> EntityProperty:
    return EntityProperty(value, EdmType.INT64)


class TableCheckpointStore(CheckpointStore):
    """Checkpoint store on Azure Table Storage (async).

    ``credential`` may be an async TokenCredential, a SAS token string, an account key
    string, ``AzureNamedKeyCredential`` or ``AzureSasCredential``. Other keyword
    arguments go to ``azure.data.tables.aio.TableClient``. The table is created on first
    use when missing.

    Example::

        store = TableCheckpointStore("https://acct.table.core.windows.net", "checkpoints",
                                     credential=AzureNamedKeyCredential("acct", key))
    """

    def __init__(self, account_url: str, table_name: str, *, credential: Any = None, **kwargs: Any) -> None:
        self._account_url = check_account_url(account_url)
        self._table_name = check_table_name(table_name)
        self._account_name = account_name_from_url(self._account_url)
        resolved = resolve_credential(credential, self._account_url, sas_as_string=False)
        options = client_options(kwargs)
        # azure-core's RetryPolicy: a few quick retries of 408/429/5xx and connection
        # errors, bounded well inside one balancing tick.
        options.setdefault("retry_total", RETRY_TOTAL)
        options.setdefault("retry_backoff_factor", RETRY_BACKOFF / 2)
        options.setdefault("retry_backoff_max", 4)
        self._table = TableClient(self._account_url, self._table_name, credential=resolved, **options)
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._closed = False
        self._checkpoint_etags: Dict[Tuple[str, str, str, str, str], str] = {}
        self._warn = WarnOnce(logger)
        self.request_counts: Counter = Counter()
        """Requests sent, by kind (query pages count one each)."""

    @classmethod
    def from_connection_string(cls, conn_str: str, table_name: str, **kwargs: Any) -> "TableCheckpointStore":
        """Create a store from an Azure Storage connection string.

        ``UseDevelopmentStorage=true`` means Azurite on its default ports. A malformed
        string raises ``ConfigurationError`` naming the part that is wrong, never its value.

        Example::

            store = TableCheckpointStore.from_connection_string("UseDevelopmentStorage=true", "checkpoints")
        """
        account = parse_connection_string(conn_str, "table")
        return cls(account.endpoint, table_name, credential=account.credential, **kwargs)

    def __repr__(self) -> str:
        return (
            f"TableCheckpointStore(account={self._account_name!r}, endpoint={safe_url(self._account_url)!r}, "
            f"table={self._table_name!r})"
        )

    @property
    def table_name(self) -> str:
        return self._table_name

    async def __aenter__(self) -> "TableCheckpointStore":
        await self._table.__aenter__()
        return self

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._table.close()

    # ------------------------------------------------------------------ plumbing

    async def _ensure_table(self) -> None:
        if self._ready:
            return
        async with self._ready_lock:
            if self._ready:
                return
            try:
                self.request_counts["create_table"] += 1
                await self._table.create_table()
                logger.info("created table %s in account %s for checkpoints", self._table_name, self._account_name)
            except ResourceExistsError:
                pass
            except AzureError as error:
                if getattr(error, "status_code", None) != 403:
                    raise CheckpointStoreError(
                        f"cannot use table {self._table_name}: {describe_error(error)}") from error
                # A SAS scoped to the table may not create tables; the table is then
                # expected to exist, and the first real request says so if it does not.
                logger.debug("no permission to create table %s; assuming it exists", self._table_name)
            self._ready = True

    def _forget_table_if_gone(self, error: BaseException) -> None:
        code = getattr(error, "error_code", None)
        if str(getattr(code, "value", code)) == "TableNotFound":
            self._ready = False

    async def _query(self, partition_key: str, clock: Optional[ServerClock] = None) -> List[Any]:
        await self._ensure_table()
        clock = clock or ServerClock()

        def hook(response: Any) -> None:
            self.request_counts["query"] += 1
            clock.hook(response)

        try:
            return [e async for e in self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": partition_key}, raw_response_hook=hook)]
        except AzureError as error:
            self._forget_table_if_gone(error)
            raise CheckpointStoreError(
                f"querying {partition_key!r} in table {self._table_name} failed: {describe_error(error)}"
            ) from error

    def _name(self, entity: Any) -> str:
        return f"table {self._table_name} PartitionKey={entity.get('PartitionKey')!r} RowKey={entity.get('RowKey')!r}"

    # ------------------------------------------------------------------ ownership

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        """All ownership records of the consumer group and the service's current time.

        Example::

            listing = await store.list_ownership("ns.servicebus.windows.net", "hub", "$default")
        """
        scope = _scope_parts(fully_qualified_namespace, eventhub_name, consumer_group)
        clock = ServerClock()
        entities = await self._query(_partition_key(scope, "Ownership"), clock)
        records = [r for r in (self._ownership_from_entity(e, scope) for e in entities) if r is not None]
        if clock.latest is None:
            raise CheckpointStoreError(f"query of table {self._table_name} returned no Date header")
        return OwnershipListing(ownerships=tuple(records), server_time=clock.latest)

    def _ownership_from_entity(self, entity: Any, scope: _Scope) -> Optional[Ownership]:
        key = (self._name(entity), entity.metadata.get("etag"))
        owner_id = entity.get("ownerid")
        if not isinstance(owner_id, str):
            self._warn(key, "skipping ownership entity (%s): no string ownerid", self._name(entity))
            return None
        epoch = parse_int(entity.get("epoch", 0))
        if epoch is None or epoch < 0:
            self._warn(key, "skipping ownership entity (%s): epoch is not a non-negative integer", self._name(entity))
            return None
        return Ownership(
            fully_qualified_namespace=scope[0],
            eventhub_name=scope[1],
            consumer_group=scope[2],
            partition_id=entity["RowKey"],
            owner_id=owner_id,
            last_modified_time=_plain_datetime(entity.metadata.get("timestamp")),
            etag=entity.metadata.get("etag"),
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
        entities = [self._ownership_entity(claim) for claim in claims]
        await self._ensure_table()
        return await claim_concurrently(claims, entities, self._claim_one, f"table {self._table_name}")

    @staticmethod
    def _ownership_entity(claim: Ownership) -> Dict[str, Any]:
        check_claim(claim)
        scope = _scope_parts(claim.fully_qualified_namespace, claim.eventhub_name, claim.consumer_group)
        return {
            "PartitionKey": _partition_key(scope, "Ownership"),
            "RowKey": _row_key(claim.partition_id),
            "ownerid": claim.owner_id,
            "epoch": _int64(claim.epoch),
        }

    async def _claim_one(self, claim: Ownership, entity: Dict[str, Any]) -> Optional[Ownership]:
        async def write() -> Tuple[Optional[str], Optional[datetime]]:
            if claim.etag is None:
                self.request_counts["create_ownership"] += 1
                response = await self._table.create_entity(entity)
            else:
                self.request_counts["update_ownership"] += 1
                response = await self._table.update_entity(
                    entity, mode=UpdateMode.REPLACE, etag=claim.etag, match_condition=MatchConditions.IfNotModified)
            return response["etag"], response.get("date")

        return await claim_conditionally(claim, write, self._forget_table_if_gone, logger)

    # ----------------------------------------------------------------- checkpoints

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        """Write ``checkpoint`` if ``(owner_id, epoch)`` still owns the partition.

        Raises ``OwnershipLostError`` (checkpoint not written) when it does not.

        Example::

            await store.update_checkpoint(
                Checkpoint("ns", "hub", "$default", "0", sequence_number=41, offset="8192"),
                owner_id=me, epoch=3)
        """
        check_checkpoint(checkpoint, owner_id, epoch)
        scope = _scope_parts(checkpoint.fully_qualified_namespace, checkpoint.eventhub_name, checkpoint.consumer_group)
        row = _row_key(checkpoint.partition_id)
        entity = {
            "PartitionKey": _partition_key(scope, "Checkpoint"),
            "RowKey": row,
            "sequencenumber": str(checkpoint.sequence_number),
            "offset": NO_OFFSET if checkpoint.offset is None else str(checkpoint.offset),
            "ownerid": owner_id,
            "epoch": _int64(epoch),
        }
        cache_key = (*scope, row, owner_id)

        async def write(etag: Optional[str]) -> str:
            if etag is None:
                self.request_counts["create_checkpoint"] += 1
                response = await self._table.create_entity(entity)
            else:
                self.request_counts["update_checkpoint"] += 1
                response = await self._table.update_entity(
                    entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified)
            return response["etag"]

        await self._ensure_table()
        await write_fenced(
            checkpoint, owner_id, epoch,
            verify_owner=lambda: self._verify_owner(_partition_key(scope, "Ownership"), checkpoint, owner_id, epoch),
            read_etag=lambda: self._read_checkpoint_etag(str(entity["PartitionKey"]), checkpoint, owner_id, epoch),
            write=write, etags=self._checkpoint_etags, cache_key=cache_key, log=logger,
        )

    async def _verify_owner(self, partition_key: str, checkpoint: Checkpoint, owner_id: str, epoch: int) -> None:
        self.request_counts["read_ownership"] += 1
        entity = await read_ownership_record(
            checkpoint, owner_id, epoch, lambda: self._table.get_entity(partition_key, checkpoint.partition_id),
            self._forget_table_if_gone)
        held_epoch = parse_int(entity.get("epoch", 0))
        require_owner(checkpoint, owner_id, epoch, entity.get("ownerid"), held_epoch, held_epoch)

    async def _read_checkpoint_etag(
        self, partition_key: str, checkpoint: Checkpoint, owner_id: str, epoch: int
    ) -> Optional[str]:
        self.request_counts["read_checkpoint"] += 1
        entity = await read_checkpoint_record(
            checkpoint, lambda: self._table.get_entity(partition_key, checkpoint.partition_id))
        if entity is None:
            return None
        refuse_later_epoch(checkpoint, owner_id, epoch, parse_int(entity.get("epoch")))
        return entity.metadata["etag"]

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> List[Checkpoint]:
        """All checkpoints of the consumer group; bad records are skipped with a warning.

        Example::

            positions = {c.partition_id: c.sequence_number
                         for c in await store.list_checkpoints("ns", "hub", "$default")}
        """
        scope = _scope_parts(fully_qualified_namespace, eventhub_name, consumer_group)
        entities = await self._query(_partition_key(scope, "Checkpoint"))
        return [c for c in (self._checkpoint_from_entity(e, scope) for e in entities) if c is not None]

    def _checkpoint_from_entity(self, entity: Any, scope: _Scope) -> Optional[Checkpoint]:
        key = (self._name(entity), entity.metadata.get("etag"))
        if "sequencenumber" not in entity:
            self._warn(key, "skipping checkpoint entity (%s): no sequencenumber", self._name(entity))
            return None
        sequence_number = parse_int(entity["sequencenumber"])
        if sequence_number is None:
            self._warn(key, "skipping checkpoint entity (%s): sequencenumber is not an integer", self._name(entity))
            return None
        epoch: Optional[int] = None
        if "epoch" in entity:
            epoch = parse_int(entity["epoch"])
            if epoch is None or epoch < 0:
                self._warn(key, "skipping checkpoint entity (%s): epoch is not a non-negative integer",
                           self._name(entity))
                return None
        offset = entity.get("offset")
        owner = entity.get("ownerid")
        return Checkpoint(
            fully_qualified_namespace=scope[0],
            eventhub_name=scope[1],
            consumer_group=scope[2],
            partition_id=entity["RowKey"],
            sequence_number=sequence_number,
            offset=str(offset) if offset not in (None, "", NO_OFFSET) else None,
            owner_id=owner if isinstance(owner, str) and owner else None,
            epoch=epoch,
        )

