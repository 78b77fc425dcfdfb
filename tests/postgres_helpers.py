"""What the PostgreSQL sink's tests share: a fresh table of events (no unique key: the
sink must not need one), the write function that fills it, and the counts that say
whether every event is there exactly once, read from the table itself."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import asyncpg

COLUMNS = ["partition_id", "sequence_number", "body"]


def table_name(prefix: str = "events") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:12]}"


async def create_events_table(dsn: str, name: str | None = None) -> str:
    """A table of events without any key or constraint, so duplicates would show."""
    name = name or table_name()
    connection = await asyncpg.connect(dsn)
    try:
        await connection.execute(f'CREATE TABLE "{name}" (partition_id text, sequence_number bigint, body bytea)')
    finally:
        await connection.close()
    return name


def copy_into(table: str) -> Callable[[list, Any], Awaitable[None]]:
    """The sink's write function: one COPY of the batch's rows."""
    async def write(events: list, connection: Any) -> None:
        await connection.copy_records_to_table(
            table, columns=COLUMNS, records=[(e.partition_id, e.sequence_number, e.body) for e in events])

    return write


@dataclass
class Tally:
    """How often each (partition, sequence number) is in the table, against what was sent."""

    counts: Counter

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.counts.values() if n > 1)

    def missing(self, expected: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        return sorted(key for key in expected if key not in self.counts)

    def extra(self, expected: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        wanted = set(expected)
        return sorted(key for key in self.counts if key not in wanted)

    def exactly_once(self, expected: Iterable[tuple[str, int]]) -> str | None:
        """None when every expected event is there once and nothing else is; else why not."""
        wanted = list(expected)
        duplicated = sorted(key for key, n in self.counts.items() if n > 1)
        missing, extra = self.missing(wanted), self.extra(wanted)
        if not duplicated and not missing and not extra:
            return None
        return (f"{len(duplicated)} events duplicated {duplicated[:5]}, {len(missing)} missing {missing[:5]}, "
                f"{len(extra)} unexpected {extra[:5]}")


async def tally(dsn: str, table: str) -> Tally:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(f'SELECT partition_id, sequence_number, count(*) AS n FROM "{table}" '
                                      "GROUP BY 1, 2")
    finally:
        await connection.close()
    return Tally(Counter({(row["partition_id"], row["sequence_number"]): row["n"] for row in rows}))


def expected_events(partitions: int, events: int) -> list[tuple[str, int]]:
    return [(str(p), i) for p in range(partitions) for i in range(events)]


async def wait_for(condition: Callable[[], Awaitable[bool]], timeout: float, what: str, step: float = 0.1) -> float:
    """Poll ``condition`` until it holds; the seconds it took. Fails naming ``what``."""
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(step)
    return time.monotonic() - start


async def drop_tables(dsn: str, *names: str) -> None:
    connection = await asyncpg.connect(dsn)
    try:
        for name in names:
            await connection.execute(f'DROP TABLE IF EXISTS "{name}"')
    finally:
        await connection.close()
