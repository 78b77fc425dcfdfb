"""Checkpoint store on PostgreSQL: ownership, checkpoints, members and log entries in one table.

The protocol (claims, fences, checkpoints, write tokens, members, log entries, timeouts)
is :mod:`eventprocessor.stores.protocol`; this module is its PostgreSQL backend, on
asyncpg (the ``[postgres]`` extra). A group of processors can run on PostgreSQL alone:
its ownership, its checkpoints, the state of stateful partitions and the Spark sink's
commit log all live here.

Layout
======
One table (default ``eventprocessor_records``, created on first use) and one sequence::

    namespace, eventhub, consumer_group, kind, log, key   the primary key
        kind: ownership, checkpoint, member or entry; log: the encoded log name of an
        entry ('' otherwise); key: the partition id, the encoded owner id of a member,
        the encoded entry name
    version   bigint       the record's etag: a new value of {table}_version on every write
    fields    jsonb        the record's fields (ownerid, epoch, sequencenumber, ...)
    data      bytea        a log entry's data
    modified  timestamptz  the server's clock_timestamp() at the write

Every conditional write is one statement whose condition is the version: a claim or a
checkpoint is ``UPDATE ... WHERE version = $etag`` (412 when it matched nothing although
the row is there, 404 when it is not), a create is ``INSERT ... ON CONFLICT DO NOTHING``
(409 when it inserted nothing). The versions come from one sequence, so an etag is never
reused, even by a record deleted and written again.

The store's clock is the server's: a record's ``last_modified_time`` is
``clock_timestamp()`` at its write, and a listing's ``server_time`` is
``clock_timestamp()`` during the listing's statement, so every record it returns was
written before it (with microsecond resolution). Expiry is judged on that clock, never on
a processor's.

Requests: claim 1 statement, fence 3 (read ownership, read checkpoint, conditional
write; 1 at a partition's first claim: create the placeholder if absent), checkpoint
after a fence 1, a tick's listing of ownership and members 1.

Connections come from an asyncpg pool (``pool_size`` connections at most, opened when
needed). A statement whose connection breaks may have been carried out: the protocol
then reads the record back and recognises its own write by its token. Nothing is
retried blindly; every call is bounded by ``operation_timeout``.

Example::

    store = PostgresCheckpointStore(dsn="postgresql://app@db.internal:5432/events")
    async with store:
        await EventProcessor(source, store, MyProcessor).run()
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from typing import Any, TypeVar

from eventprocessor.errors import ConfigurationError

from ._postgres import check_dsn, describe, outcome_unknown, quoted_name, require_asyncpg, safe_dsn
from .backend import (
    MEMBER,
    OWNERSHIP,
    BackendFailure,
    EtagMismatch,
    Fields,
    Kind,
    RecordBackend,
    RecordExists,
    RecordListing,
    RecordMissing,
    Scope,
    StoredRecord,
)
from .protocol import ProtocolStore

__all__ = ["PostgresCheckpointStore", "PostgresRecords", "DEFAULT_TABLE"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_TABLE = "eventprocessor_records"
DEFAULT_OPERATION_TIMEOUT = 10.0
_PK = "namespace = $1 AND eventhub = $2 AND consumer_group = $3 AND kind = $4 AND log = $5 AND key = $6"
_COLUMNS = "namespace, eventhub, consumer_group, kind, log, key"


class _Sql:
    """The statements of one table, written once."""

    def __init__(self, table: str, schema: str | None) -> None:
        name = quoted_name(table, "table")
        sequence = quoted_name(f"{table}_version", "table")
        if schema is not None:
            prefix = quoted_name(schema, "schema") + "."
            name, sequence = prefix + name, prefix + sequence
        self.table = name
        self.lock_key = f"eventprocessor records {schema or ''}.{table}"
        self.create = [
            f"CREATE SEQUENCE IF NOT EXISTS {sequence}",
            f"""CREATE TABLE IF NOT EXISTS {name} (
                namespace text NOT NULL, eventhub text NOT NULL, consumer_group text NOT NULL,
                kind text NOT NULL, log text NOT NULL, key text COLLATE "C" NOT NULL,
                version bigint NOT NULL, fields jsonb NOT NULL, data bytea, modified timestamptz NOT NULL,
                PRIMARY KEY ({_COLUMNS}))""",
        ]
        self.read = f"SELECT version, fields, modified FROM {name} WHERE {_PK}"
        self.read_data = f"SELECT version, fields, modified, data FROM {name} WHERE {_PK}"
        self.insert = (f"INSERT INTO {name} ({_COLUMNS}, version, fields, data, modified) "
                       f"VALUES ($1, $2, $3, $4, $5, $6, nextval('{sequence}'), $7::jsonb, $8, clock_timestamp())")
        self.create_record = f"{self.insert} ON CONFLICT DO NOTHING RETURNING version, modified"
        self.upsert = (f"{self.insert} ON CONFLICT ({_COLUMNS}) DO UPDATE SET version = EXCLUDED.version, "
                       "fields = EXCLUDED.fields, data = EXCLUDED.data, modified = EXCLUDED.modified "
                       "RETURNING version, modified")
        self.replace = (f"WITH written AS (UPDATE {name} SET version = nextval('{sequence}'), fields = $7::jsonb, "
                        f"modified = clock_timestamp() WHERE {_PK} AND version = $8 RETURNING version, modified) "
                        f"SELECT w.version, w.modified, EXISTS (SELECT 1 FROM {name} WHERE {_PK}) AS present "
                        "FROM (SELECT 1) AS one LEFT JOIN written AS w ON true")
        self.delete = f"DELETE FROM {name} WHERE {_PK}"
        # clock_timestamp() runs after the statement's snapshot: every row listed was written before it.
        self.list = (f"SELECT now.at, r.kind, r.key, r.version, r.fields, r.modified "
                     f"FROM (SELECT clock_timestamp() AS at) AS now LEFT JOIN {name} AS r "
                     "ON r.namespace = $1 AND r.eventhub = $2 AND r.consumer_group = $3 AND r.kind = ANY($4::text[]) "
                     "AND r.log = $5 AND starts_with(r.key, $6) ORDER BY r.key")
        self.check = f"SELECT count(*) FROM (SELECT 1 FROM {name} LIMIT 1) AS one"


def _etag(version: int) -> str:
    return str(version)


def _version(etag: str) -> int | None:
    try:
        return int(etag)
    except (TypeError, ValueError):
        return None


class PostgresRecords(RecordBackend):
    """The PostgreSQL backend: one row per record (see the module docstring). ``pool`` is
    the asyncpg pool (made on first use unless one was given)."""

    forbidden = ""  # any text: names with control characters are refused before this

    def __init__(self, dsn: str | None, sql: _Sql, *, pool: Any = None, pool_size: int = 10,
                 connect_options: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self._asyncpg = require_asyncpg("PostgresCheckpointStore")
        self._dsn = dsn
        self._sql = sql
        self.pool = pool
        self._own_pool = pool is None
        self._pool_size = pool_size
        self._connect_options = dict(connect_options or {})
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self._closed = False
        self.where = f"table {sql.table}" + (f" of {safe_dsn(dsn)}" if dsn else "")

    async def open(self) -> None:
        await self._ensure_ready()

    async def close(self) -> None:
        if not self._closed and self._own_pool and self.pool is not None:
            self._closed = True
            await self.pool.close()

    async def _ensure_ready(self) -> Any:
        """The pool, with the table and its sequence created (once, under an advisory lock,
        so that processors starting together do not race on ``CREATE``)."""
        if self._ready:
            return self.pool
        async with self._ready_lock:
            if self._ready:
                return self.pool
            if self.pool is None:
                self.pool = self._asyncpg.create_pool(self._dsn, min_size=0, max_size=self._pool_size,
                                                      **self._connect_options)
            try:
                await self.pool  # opens no connection with min_size=0; a given pool is ready already
                async with self.pool.acquire() as connection, connection.transaction():
                    await connection.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self._sql.lock_key)
                    for statement in self._sql.create:
                        await connection.execute(statement)
            except Exception as error:
                raise BackendFailure(f"cannot use it: {describe(error)}") from error
            self._ready = True
            return self.pool

    async def _send(self, operation: str, kind: Kind | None, call: Callable[[Any], Awaitable[_T]]) -> _T:
        """Count and run one statement on a pooled connection; failures become
        :class:`BackendFailure` (``maybe_written`` when the connection broke mid-statement)."""
        if kind is not None:
            self.request_counts[f"{operation}_{kind.name}"] += 1
        pool = await self._ensure_ready()
        try:
            connection = await pool.acquire()
        except Exception as error:
            raise BackendFailure(f"cannot connect: {describe(error)}") from error
        try:
            return await call(connection)
        except self._asyncpg.PostgresError as error:
            raise BackendFailure(describe(error), maybe_written=outcome_unknown(error)) from error
        except (OSError, asyncio.TimeoutError, self._asyncpg.InterfaceError) as error:
            raise BackendFailure(describe(error), maybe_written=True) from error
        finally:
            try:
                await pool.release(connection)
            except Exception:  # a broken connection: the pool opens another next time
                logger.debug("releasing a connection to %s failed", self.where, exc_info=True)

    def _record(self, kind: Kind, key: str, version: int, fields: Any, modified: datetime,
                data: bytes | None = None) -> StoredRecord:
        values = json.loads(fields) if isinstance(fields, str) else dict(fields)
        return StoredRecord(key, _etag(version), modified, values, f"{kind.name} record {key!r}", bytes(data or b""))

    @staticmethod
    def _key(kind: Kind, scope: Scope, key: str) -> tuple[str, ...]:
        return (*scope, kind.name, kind.log, key)

    async def read(self, kind: Kind, scope: Scope, key: str, *, with_data: bool = False) -> StoredRecord | None:
        statement = self._sql.read_data if with_data else self._sql.read
        row = await self._send("read", kind, lambda c: c.fetchrow(statement, *self._key(kind, scope, key)))
        if row is None:
            return None
        return self._record(kind, key, row["version"], row["fields"], row["modified"],
                            row["data"] if with_data else None)

    async def create(self, kind: Kind, scope: Scope, key: str, fields: Fields, data: bytes = b"") -> StoredRecord:
        row = await self._send("create", kind, lambda c: c.fetchrow(
            self._sql.create_record, *self._key(kind, scope, key), json.dumps(fields), data or None))
        if row is None:
            raise RecordExists(f"{kind.name} record {key!r} exists in {self.where}")
        return self._record(kind, key, row["version"], fields, row["modified"])

    async def replace(self, kind: Kind, scope: Scope, key: str, fields: Fields, etag: str) -> StoredRecord:
        version = _version(etag)
        if version is None:  # not an etag of this store: it can match nothing
            if await self.read(kind, scope, key) is None:
                raise RecordMissing(f"{kind.name} record {key!r} does not exist in {self.where}")
            raise EtagMismatch(f"{kind.name} record {key!r} in {self.where} has another version than {etag!r}")
        row = await self._send("replace", kind, lambda c: c.fetchrow(
            self._sql.replace, *self._key(kind, scope, key), json.dumps(fields), version))
        if row["version"] is not None:
            return self._record(kind, key, row["version"], fields, row["modified"])
        if row["present"]:
            raise EtagMismatch(f"{kind.name} record {key!r} in {self.where} changed since version {etag}")
        raise RecordMissing(f"{kind.name} record {key!r} does not exist in {self.where}")

    async def upsert(self, kind: Kind, scope: Scope, key: str, fields: Fields) -> StoredRecord:
        row = await self._send("upsert", kind, lambda c: c.fetchrow(
            self._sql.upsert, *self._key(kind, scope, key), json.dumps(fields), None))
        return self._record(kind, key, row["version"], fields, row["modified"])

    async def delete(self, kind: Kind, scope: Scope, key: str) -> None:
        await self._send("delete", kind, lambda c: c.execute(self._sql.delete, *self._key(kind, scope, key)))

    async def _list(self, kinds: list[Kind], scope: Scope, prefix: str) -> dict[str, RecordListing]:
        log = kinds[0].log
        rows = await self._send("list", kinds[0], lambda c: c.fetch(
            self._sql.list, *scope, [kind.name for kind in kinds], log, prefix))
        listings = {kind.name: RecordListing(records=[], server_time=rows[0]["at"]) for kind in kinds}
        by_name = {kind.name: kind for kind in kinds}
        for row in rows:
            if row["key"] is not None:
                kind = by_name[row["kind"]]
                listings[kind.name].records.append(
                    self._record(kind, row["key"], row["version"], row["fields"], row["modified"]))
        return listings

    async def list(self, kind: Kind, scope: Scope, prefix: str = "") -> RecordListing:
        return (await self._list([kind], scope, prefix))[kind.name]

    async def list_ownership_and_members(self, scope: Scope) -> tuple[RecordListing, RecordListing]:
        """One statement for both kinds (what a balancing tick reads)."""
        listings = await self._list([OWNERSHIP, MEMBER], scope, "")
        return listings[OWNERSHIP.name], listings[MEMBER.name]

    async def check(self) -> None:
        self.request_counts["check"] += 1
        await self._send("check", None, lambda c: c.fetchval(self._sql.check))


class PostgresCheckpointStore(ProtocolStore):
    """Checkpoint store on PostgreSQL (async, asyncpg; the ``[postgres]`` extra).

    * ``dsn``: a ``postgresql://user:password@host:port/database`` URI (its password is
      never shown: the repr, logs and errors use the URI without it); or ``pool``, an
      asyncpg pool of your own (not closed by the store).
    * ``table``, ``schema``: where the records live (created on first use; ``schema``
      default: the connection's ``search_path``).
    * ``operation_timeout``: seconds one call may take (default 10, ``None``: no deadline).
    * ``pool_size``: connections at most; ``connect_options``: more arguments of
      ``asyncpg.create_pool`` (``ssl=``, ``server_settings=``, ...).

    Example::

        async with PostgresCheckpointStore(dsn=os.environ["EVENTPROCESSOR_PG_DSN"]) as store:
            await EventProcessor(source, store, MyProcessor).run()
    """

    def __init__(self, dsn: str | None = None, *, pool: Any = None, table: str = DEFAULT_TABLE,
                 schema: str | None = None, operation_timeout: float | None = DEFAULT_OPERATION_TIMEOUT,
                 pool_size: int = 10, connect_options: Mapping[str, Any] | None = None) -> None:
        if pool is None:
            dsn = check_dsn(dsn, "PostgresCheckpointStore")
        elif dsn is not None:
            raise ConfigurationError("PostgresCheckpointStore takes dsn= or pool=, not both")
        if not isinstance(pool_size, int) or pool_size < 1:
            raise ConfigurationError(f"pool_size must be a positive int, got {pool_size!r}")
        if operation_timeout is not None and operation_timeout <= 0:
            raise ConfigurationError(f"operation_timeout must be positive or None, got {operation_timeout!r}")
        self._dsn = dsn
        self._table = table
        self._schema = schema
        backend = PostgresRecords(dsn, _Sql(table, schema), pool=pool, pool_size=pool_size,
                                  connect_options=connect_options)
        super().__init__(backend, operation_timeout=operation_timeout)

    @property
    def table(self) -> str:
        return self._table

    @property
    def dsn(self) -> str | None:
        """The server's URI without its password (``None`` with a pool of your own)."""
        return safe_dsn(self._dsn) if self._dsn else None

    def __repr__(self) -> str:
        where = f"dsn={self.dsn!r}" if self._dsn else "pool=<asyncpg pool>"
        schema = f", schema={self._schema!r}" if self._schema else ""
        return f"PostgresCheckpointStore({where}, table={self._table!r}{schema})"
