"""Checkpoint store on Azure Table Storage (or the Cosmos DB Table API).

The protocol (claims, fences, checkpoints, write tokens, members, log entries,
timeouts) is :mod:`eventprocessor.stores.protocol`; this module is its Table backend.

Layout
======
One table; the entity layout of the official table checkpoint store draft
(``azure-eventhub-checkpointstoretable``) plus our own kinds::

    PartitionKey "{namespace} {eventhub} {consumer_group} Ownership", RowKey partition id
        ownerid (str), epoch (Int64), [requestedby (str)], writetoken (str)
    PartitionKey "{namespace} {eventhub} {consumer_group} Checkpoint", RowKey partition id
        sequencenumber (str), offset (str), ownerid (str), epoch (Int64), writetoken (str)
    PartitionKey "{namespace} {eventhub} {consumer_group} Member", RowKey encoded owner id
        the member's properties (str)
    PartitionKey "{namespace} {eventhub} {consumer_group} Log {encoded log}", RowKey encoded entry
        chunks (Int64), data0 ... data14 (Binary, at most 64 KiB each), writetoken (str)

Names are used as given (Table keys are case-sensitive); they may not contain
``/ \\ # ?``, control characters or whitespace (the service rejects the first ones,
whitespace would make the key ambiguous), which is checked before any request with a
``ConfigurationError``. Owner, log and entry names are encoded by
:func:`eventprocessor.stores.codec.encode_name`. A log entry's data is split across binary
properties of at most 64 KiB (the property limit); 15 of them keep the entity under the
service's 1 MiB, so an entry holds at most ``MAX_ENTRY_BYTES`` (983,040 bytes) here as
on every store.

Requests: as for :mod:`eventprocessor.stores.blob` (claim 1, fence 3, or 1 at a
partition's first claim, checkpoint after a fence 1). A write's ``last_modified_time``
is the response's ``Date`` (1-second resolution, so never later than the entity's
``Timestamp``); listings return the query's ``Date`` as ``server_time``, so a record
written in the last second can look up to 1 s younger than it is (never older). The
ownership and checkpoint entities have different PartitionKeys, so an entity group
transaction could not make a claim and a fence one request; the fence is what makes the
checkpoint write one request instead.

Example (Cosmos DB's Table API works the same way, with its own account URL)::

    store = TableCheckpointStore("https://acct.table.core.windows.net", "checkpoints",
                                 credential=DefaultAzureCredential(), operation_timeout=5)
    await EventProcessor(source, store, MyProcessor).run()
"""
from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError
from azure.data.tables import EdmType, EntityProperty, UpdateMode
from azure.data.tables.aio import TableClient

from eventprocessor.errors import ConfigurationError

from ._account import DEFAULT_OPERATION_TIMEOUT, RETRY_BACKOFF, RETRY_TOTAL, check_table_name, one_of
from ._azure_records import AzureCheckpointStore, AzureRecords, ServerClock
from .backend import MEMBER, OWNERSHIP, Fields, Kind, RecordListing, RecordMissing, Scope, StoredRecord

__all__ = ["TableCheckpointStore", "TableRecords"]

logger = logging.getLogger(__name__)

_CHUNK = 64 * 1024
_SYSTEM = ("PartitionKey", "RowKey", "Timestamp")
_SUFFIX = {"ownership": "Ownership", "checkpoint": "Checkpoint", "member": "Member"}


def _plain_datetime(value: Any) -> datetime | None:
    # The SDK hands out TablesEntityDatetime (a datetime subclass that also keeps the
    # service's string); records carry plain aware datetimes like the other stores.
    if not isinstance(value, datetime):
        return None
    return datetime(value.year, value.month, value.day, value.hour, value.minute, value.second,
                    value.microsecond, tzinfo=value.tzinfo or timezone.utc)


class TableRecords(AzureRecords[TableClient]):
    """The Table backend: one entity per record, fields as properties (ints as Int64)."""

    forbidden = "/\\#? \t\r\n"
    gone_codes = frozenset({"TableNotFound"})


    async def _create_home(self) -> None:
        try:
            self.request_counts["create_table"] += 1
            await self.client.create_table()
            logger.info("created table %s in account %s for checkpoints", self.home_name, self.account_name)
        except ResourceExistsError:
            pass

    async def _list_one(self) -> None:
        async for page in self.client.list_entities(results_per_page=1).by_page():
            async for _entity in page:
                break
            break

    @staticmethod
    def partition_key(kind: Kind, scope: Scope) -> str:
        suffix = f"Log {kind.log}" if kind.name == "entry" else _SUFFIX[kind.name]
        return f"{scope[0]} {scope[1]} {scope[2]} {suffix}"

    def _entity(self, kind: Kind, scope: Scope, key: str, fields: Fields, data: bytes = b"") -> dict[str, Any]:
        entity: dict[str, Any] = {"PartitionKey": self.partition_key(kind, scope), "RowKey": key}
        for name, value in fields.items():
            entity[name] = EntityProperty(value, EdmType.INT64) if isinstance(value, int) else value
        if kind.name == "entry":
            chunks = [data[i:i + _CHUNK] for i in range(0, len(data), _CHUNK)]
            entity["chunks"] = EntityProperty(len(chunks), EdmType.INT64)
            entity.update({f"data{i}": chunk for i, chunk in enumerate(chunks)})
        return entity

    def _record(self, kind: Kind, entity: Any) -> StoredRecord:
        fields = {name: getattr(value, "value", value) for name, value in entity.items() if name not in _SYSTEM}
        data = b""
        if kind.name == "entry":
            count = fields.pop("chunks", 0)
            parts = [fields.pop(f"data{i}", b"") for i in range(count if isinstance(count, int) else 0)]
            data = b"".join(p for p in parts if isinstance(p, bytes))
        name = f"PartitionKey={entity.get('PartitionKey')!r} RowKey={entity.get('RowKey')!r}"
        return StoredRecord(entity["RowKey"], entity.metadata.get("etag"),
                            _plain_datetime(entity.metadata.get("timestamp")), fields, name, data)

    def _written(self, entity: dict[str, Any], fields: Fields, response: Any) -> StoredRecord:
        name = f"PartitionKey={entity['PartitionKey']!r} RowKey={entity['RowKey']!r}"
        return StoredRecord(entity["RowKey"], response["etag"], response.get("date"), dict(fields), name)

    async def read(self, kind: Kind, scope: Scope, key: str, *, with_data: bool = False) -> StoredRecord | None:
        try:
            entity = await self._send("read", kind,
                                      lambda: self.client.get_entity(self.partition_key(kind, scope), key))
        except RecordMissing:
            return None
        return self._record(kind, entity)

    async def create(self, kind: Kind, scope: Scope, key: str, fields: Fields, data: bytes = b"") -> StoredRecord:
        entity = self._entity(kind, scope, key, fields, data)
        created = await self._send("create", kind, lambda: self.client.create_entity(entity))
        return self._written(entity, fields, created)

    async def replace(self, kind: Kind, scope: Scope, key: str, fields: Fields, etag: str) -> StoredRecord:
        entity = self._entity(kind, scope, key, fields)
        response = await self._send("replace", kind, lambda: self.client.update_entity(
            entity, mode=UpdateMode.REPLACE, etag=etag, match_condition=MatchConditions.IfNotModified))
        return self._written(entity, fields, response)

    async def upsert(self, kind: Kind, scope: Scope, key: str, fields: Fields) -> StoredRecord:
        entity = self._entity(kind, scope, key, fields)
        response = await self._send("upsert", kind, lambda: self.client.upsert_entity(entity, mode=UpdateMode.REPLACE))
        return self._written(entity, fields, response)

    async def delete(self, kind: Kind, scope: Scope, key: str) -> None:
        try:
            await self._send("delete", kind, lambda: self.client.delete_entity(self.partition_key(kind, scope), key))
        except RecordMissing:
            pass

    async def list(self, kind: Kind, scope: Scope, prefix: str = "") -> RecordListing:
        clock = ServerClock()
        query = "PartitionKey eq @pk"
        parameters = {"pk": self.partition_key(kind, scope)}
        select: list[str] | None = None
        if prefix:
            # Encoded names use [a-z0-9%._-], all below "~": [prefix, prefix + "~") is the prefix range.
            query += " and RowKey ge @low and RowKey lt @high"
            parameters.update(low=prefix, high=prefix + "~")
        if kind.name == "entry":
            select = ["PartitionKey", "RowKey"]  # names only: entries carry up to ~1 MB of data

        def hook(response: Any) -> None:
            self.request_counts[f"list_{kind.name}"] += 1
            clock.hook(response)

        async def collect() -> list[Any]:
            return [entity async for entity in self.client.query_entities(
                query, parameters=parameters, select=select, raw_response_hook=hook)]

        entities = await self._send("list", kind, collect, count=False)  # the hook counts the pages
        return RecordListing(records=[self._record(kind, e) for e in entities], server_time=clock.latest)

    async def list_ownership_and_members(self, scope: Scope) -> tuple[RecordListing, RecordListing]:
        """One query for both PartitionKeys."""
        clock = ServerClock()
        keys = {OWNERSHIP: self.partition_key(OWNERSHIP, scope), MEMBER: self.partition_key(MEMBER, scope)}

        def hook(response: Any) -> None:
            self.request_counts["list_ownership"] += 1
            clock.hook(response)

        async def collect() -> list[Any]:
            return [entity async for entity in self.client.query_entities(
                "PartitionKey eq @owners or PartitionKey eq @members",
                parameters={"owners": keys[OWNERSHIP], "members": keys[MEMBER]}, raw_response_hook=hook)]

        entities = await self._send("list", OWNERSHIP, collect, count=False)
        listings = {kind: RecordListing(records=[], server_time=clock.latest) for kind in keys}
        for entity in entities:
            kind = MEMBER if entity.get("PartitionKey") == keys[MEMBER] else OWNERSHIP
            listings[kind].records.append(self._record(kind, entity))
        return listings[OWNERSHIP], listings[MEMBER]


class TableCheckpointStore(AzureCheckpointStore):
    """Checkpoint store on Azure Table Storage (async).

    ``credential`` may be an async TokenCredential, a SAS token string, an account key
    string, ``AzureNamedKeyCredential`` or ``AzureSasCredential``. ``operation_timeout``
    (seconds, default 10, ``None`` for no deadline) bounds every call, retries included.
    Other keyword arguments go to ``azure.data.tables.aio.TableClient`` (``api_version``
    among them). The table is created on first use when missing. The names of the official
    table store (``azure-eventhub-checkpointstoretable``) work too: ``table_account_url``
    for ``account_url``, ``table_name`` positionally or by keyword.

    Example::

        store = TableCheckpointStore("https://acct.table.core.windows.net", "checkpoints",
                                     credential=AzureNamedKeyCredential("acct", key))
    """

    _check_name = staticmethod(check_table_name)
    _service = "table"
    _home = "table"
    _name_keyword = "table_name"

    def __init__(self, account_url: str | None = None, table_name: str | None = None, *, credential: Any = None,
                 operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
                 table_account_url: str | None = None, **kwargs: Any) -> None:
        url = one_of("account_url", account_url, "table_account_url", table_account_url)
        if url is None:
            raise ConfigurationError("TableCheckpointStore needs the storage account's table URL: "
                                     "TableCheckpointStore(account_url, table_name, credential=...)")
        super().__init__(url, table_name, credential=credential,  # type: ignore[arg-type]
                         operation_timeout=operation_timeout, client_options=kwargs)

    def _backend_for(self, credential: Any, options: dict[str, Any]) -> TableRecords:
        # azure-core's RetryPolicy: a few quick retries of 408/429/5xx and connection errors.
        options.setdefault("retry_total", RETRY_TOTAL)
        options.setdefault("retry_backoff_factor", RETRY_BACKOFF / 2)
        options.setdefault("retry_backoff_max", 2 * RETRY_BACKOFF)
        table = TableClient(self._account_url, self._home_name, credential=credential, **options)
        return TableRecords("table", self._home_name, table, self._account_name)

    @property
    def table_name(self) -> str:
        return self._home_name
