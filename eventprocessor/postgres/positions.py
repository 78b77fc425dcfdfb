"""The positions table: per partition, how far the sink has written, and which claim may
write next.

One row per (namespace, event hub, consumer group, partition)::

    sequence_number  bigint  the last event written (committed) for the partition; -1: none
    offset           text    that event's offset
    owner_id, epoch          the claim that fenced the row last (the checkpoint store's epoch)
    claim_token      text    that claim, told apart from another claim of the same owner and epoch
    updated          timestamptz

Three statements, each one round trip:

* :meth:`Positions.fence` (a new claim): ``INSERT ... ON CONFLICT DO UPDATE`` that writes
  the claim's owner, epoch and token, keeping the position, only ``WHERE`` the row's epoch
  is lower (or the same epoch of the same owner). It returns the position to resume
  from, or nothing when a newer claim holds the row. (A batch holds the row only while
  the server runs its last message: a fence waits microseconds at most.)
* :meth:`Positions.advance_and_commit` (a batch's last message): ``DO $$ ... UPDATE ... SET
  sequence_number = last WHERE claim_token = mine AND sequence_number = where I was; IF
  NOT FOUND THEN RAISE ... $$; COMMIT`` as one simple-protocol message (values as escaped
  literals): the server moves the position and commits without waiting for the client in
  between, so no client, however frozen, ever holds the row; and a claim that no longer
  holds it gets SQLSTATE ``EPF01`` (:data:`NOT_HELD`), ``COMMIT`` is skipped and nothing
  of the transaction is committed.
* :meth:`Positions.settle` (a commit whose answer was lost): ``SELECT ... FOR UPDATE`` of
  the row, which waits for a transaction that is moving it, then reads what it left.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..stores._postgres import quoted_name

__all__ = ["Positions", "Position", "Holder", "AdvanceStatement", "DEFAULT_POSITIONS_TABLE", "NOT_HELD"]

logger = logging.getLogger(__name__)

DEFAULT_POSITIONS_TABLE = "eventprocessor_positions"

NOT_HELD = "EPF01"
"""The SQLSTATE of a batch whose claim no longer holds its partition's row."""

_PK = "namespace = $1 AND eventhub = $2 AND consumer_group = $3 AND partition_id = $4"
Key = tuple[str, str, str, str]


@dataclass(frozen=True)
class Position:
    """Where a partition's writes got to: the last event committed (-1: none)."""

    sequence_number: int
    offset: str | None


@dataclass(frozen=True)
class Holder:
    """Who fenced a partition's row last."""

    owner_id: str
    epoch: int
    claim_token: str
    position: Position


class Positions:
    """The statements of one positions table (``schema.table``, created on first use)."""

    def __init__(self, table: str = DEFAULT_POSITIONS_TABLE, schema: str | None = None) -> None:
        name = quoted_name(table, "positions_table")
        if schema is not None:
            name = f"{quoted_name(schema, 'schema')}.{name}"
        self.table = name
        self._lock_key = f"eventprocessor positions {schema or ''}.{table}"
        self._create = f"""CREATE TABLE IF NOT EXISTS {name} (
            namespace text NOT NULL, eventhub text NOT NULL, consumer_group text NOT NULL,
            partition_id text NOT NULL, sequence_number bigint NOT NULL, "offset" text,
            owner_id text NOT NULL, epoch bigint NOT NULL, claim_token text NOT NULL,
            updated timestamptz NOT NULL,
            PRIMARY KEY (namespace, eventhub, consumer_group, partition_id))"""
        self._fence = f"""INSERT INTO {name} AS p (namespace, eventhub, consumer_group, partition_id,
                sequence_number, "offset", owner_id, epoch, claim_token, updated)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, clock_timestamp())
            ON CONFLICT (namespace, eventhub, consumer_group, partition_id) DO UPDATE
            SET owner_id = EXCLUDED.owner_id, epoch = EXCLUDED.epoch, claim_token = EXCLUDED.claim_token,
                updated = EXCLUDED.updated
            WHERE p.epoch < EXCLUDED.epoch OR (p.epoch = EXCLUDED.epoch AND p.owner_id = EXCLUDED.owner_id)
            RETURNING p.sequence_number, p."offset\""""
        self._read = f'SELECT owner_id, epoch, claim_token, sequence_number, "offset" FROM {name} WHERE {_PK}'
        self._read_all = (f'SELECT partition_id, owner_id, epoch, claim_token, sequence_number, "offset" FROM {name} '
                          "WHERE namespace = $1 AND eventhub = $2 AND consumer_group = $3")

    async def create(self, connection: Any) -> None:
        """Create the table if it is not there (under an advisory lock: processors that
        start together do not race on ``CREATE``)."""
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock(hashtext($1))", self._lock_key)
            await connection.execute(self._create)

    async def fence(self, connection: Any, key: Key, *, owner_id: str, epoch: int, claim_token: str,
                    start: Position, timeout: float | None = None) -> Position | None:
        """Make the claim the only writer of the partition's row; the position to resume
        from, or None when a newer claim fenced the row (this claim is stale). ``start``
        is the position of a row created now (the checkpoint store's)."""
        row = await connection.fetchrow(self._fence, *key, start.sequence_number, start.offset, owner_id, epoch,
                                        claim_token, timeout=timeout)
        return None if row is None else Position(row[0], row[1])

    def advance_statement(self, key: Key, *, claim_token: str) -> AdvanceStatement:
        """The claim's ``DO ... UPDATE ...; COMMIT``: every value but the positions is fixed
        for the claim, escaped here once."""
        namespace, eventhub, consumer_group, partition_id = (_literal(v) for v in key)
        tag = f"$ep_{claim_token}$"  # a dollar quote no value of this statement can contain
        where = (f"namespace = {namespace} AND eventhub = {eventhub} AND consumer_group = {consumer_group} AND "
                 f"partition_id = {partition_id} AND claim_token = {_literal(claim_token)}")
        if any(tag in value for value in key):
            raise ValueError("a name contains the statement's quote tag")
        return AdvanceStatement(
            f'DO {tag} BEGIN UPDATE {self.table} SET sequence_number = ',
            ', "offset" = ',
            f", updated = clock_timestamp() WHERE {where} AND sequence_number = ",
            f"; IF NOT FOUND THEN RAISE EXCEPTION 'the position of partition % is not this claim''s to move', "
            f"{partition_id} USING ERRCODE = '{NOT_HELD}'; END IF; END {tag}; COMMIT")

    @staticmethod
    async def advance_and_commit(connection: Any, statement: AdvanceStatement, *, expected: int,
                                 to: Position) -> str:
        """In the batch's open transaction: move the position from ``expected`` to ``to``
        and commit, in one message. Returns COMMIT's status (``ROLLBACK`` when the
        transaction had failed); raises SQLSTATE :data:`NOT_HELD` (nothing committed) when
        the row is not this claim's or not at ``expected``."""
        return await connection.execute(statement.render(to, expected))

    async def settle(self, connection: Any, key: Key, timeout: float | None = None) -> Holder | None:
        """The row once no transaction holds it (``FOR UPDATE`` waits for the one that
        does to commit or roll back): what a transaction whose answer was lost left."""
        async with connection.transaction():
            row = await connection.fetchrow(self._read + " FOR UPDATE", *key, timeout=timeout)
        if row is None:
            return None
        return Holder(row["owner_id"], row["epoch"], row["claim_token"], Position(row["sequence_number"],
                                                                                   row["offset"]))

    async def holder(self, connection: Any, key: Key) -> Holder | None:
        row = await connection.fetchrow(self._read, *key)
        if row is None:
            return None
        return Holder(row["owner_id"], row["epoch"], row["claim_token"], Position(row["sequence_number"],
                                                                                   row["offset"]))

    async def read_all(self, connection: Any, scope: tuple[str, str, str]) -> dict[str, Holder]:
        rows = await connection.fetch(self._read_all, *scope)
        return {row["partition_id"]: Holder(row["owner_id"], row["epoch"], row["claim_token"],
                                            Position(row["sequence_number"], row["offset"])) for row in rows}



@dataclass(frozen=True)
class AdvanceStatement:
    """``DO ... UPDATE ...; COMMIT`` of one claim, with the positions still to put in."""

    head: str
    middle: str
    condition: str
    tail: str

    def render(self, to: Position, expected: int) -> str:
        return (f"{self.head}{int(to.sequence_number)}{self.middle}{_literal(to.offset)}{self.condition}"
                f"{int(expected)}{self.tail}")


def _literal(value: str | None) -> str:
    """An SQL string literal (``E'...'``: the same whatever ``standard_conforming_strings``
    says), or ``NULL``."""
    if value is None:
        return "NULL"
    if "\x00" in value:
        raise ValueError("PostgreSQL text cannot hold NUL characters")
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
