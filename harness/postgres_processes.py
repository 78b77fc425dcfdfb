"""Processes writing into PostgreSQL, seen from their parent: the SIGKILL chain, the
SIGSTOP zombie and the group that balances, hands over and fails over, each counted from
the table the workers wrote (:mod:`harness.postgres_worker` is the worker).

Every scenario makes its own tables (rows, positions, the checkpoint store's records),
so scenarios can share one server; it returns what the table holds and what it should.

Example::

    result = await kill_chain(dsn, log_dir, steps=["after_begin", "after_write"], seed=3)
    assert result.tally.exactly_once(result.expected) is None
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

from .postgres_worker import DSN_ENV
from .worker import WorkerHandle

__all__ = ["Tables", "Outcome", "spawn", "kill_chain", "zombie", "group", "stopped", "count_rows"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclass
class Tables:
    """One scenario's tables: the rows (no key), the sink's positions, the store's records."""

    events: str
    positions: str
    records: str

    @classmethod
    async def create(cls, dsn: str) -> Tables:
        suffix = uuid.uuid4().hex[:10]
        tables = cls(f"rows_{suffix}", f"pos_{suffix}", f"rec_{suffix}")
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(f'CREATE TABLE "{tables.events}" (partition_id text, sequence_number bigint, '
                                     "body bytea)")
        finally:
            await connection.close()
        return tables

    async def drop(self, dsn: str) -> None:
        connection = await asyncpg.connect(dsn)
        try:
            for name in (self.events, self.positions, self.records):
                await connection.execute(f'DROP TABLE IF EXISTS "{name}"')
            await connection.execute(f'DROP SEQUENCE IF EXISTS "{self.records}_version"')
        finally:
            await connection.close()


@dataclass
class Outcome:
    """What the table holds: how often each (partition, sequence number) is there."""

    counts: dict[tuple[str, int], int]
    expected: list[tuple[str, int]]
    notes: dict[str, float] = field(default_factory=dict)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.counts.values() if n > 1)

    @property
    def missing(self) -> int:
        return sum(1 for key in self.expected if key not in self.counts)

    def exactly_once(self) -> str | None:
        """None when every expected event is there once and nothing else is; else why not."""
        extra = [key for key in self.counts if key not in set(self.expected)]
        if not self.duplicates and not self.missing and not extra:
            return None
        doubled = sorted(key for key, n in self.counts.items() if n > 1)[:5]
        return f"{self.duplicates} duplicates {doubled}, {self.missing} missing, {len(extra)} unexpected"


async def count_rows(dsn: str, table: str) -> dict[tuple[str, int], int]:
    connection = await asyncpg.connect(dsn)
    try:
        rows = await connection.fetch(f'SELECT partition_id, sequence_number, count(*) AS n FROM "{table}" '
                                      "GROUP BY 1, 2")
    finally:
        await connection.close()
    return {(row["partition_id"], row["sequence_number"]): row["n"] for row in rows}


async def spawn(owner_id: str, dsn: str, tables: Tables, log_dir: str, *, partitions: int, events: int,
                extra: Sequence[str] = ()) -> WorkerHandle:
    """Start ``python -m harness.postgres_worker`` (the DSN in its environment); its stderr
    goes to ``log_dir``."""
    env = dict(os.environ)
    env[DSN_ENV] = dsn
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "harness.postgres_worker", "--owner-id", owner_id, "--table", tables.events,
            "--positions-table", tables.positions, "--records-table", tables.records,
            "--partitions", str(partitions), "--events", str(events), *extra,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, cwd=_ROOT)
    handle = WorkerHandle(owner_id, process, stderr_path)
    handle.reader = asyncio.create_task(handle.read())
    return handle


def stopped(handle: WorkerHandle) -> bool:
    """Is the process stopped by a signal (SIGSTOP), per ``/proc``?"""
    try:
        with open(f"/proc/{handle.process.pid}/status") as status:
            return any(line.startswith("State:") and "T" in line.split()[1] for line in status)
    except OSError:
        return False


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str,
                 workers: Sequence[WorkerHandle]) -> float:
    start = time.monotonic()
    while not await condition():
        if time.monotonic() - start > timeout:
            detail = "\n".join(w.diagnostics() for w in workers)
            raise AssertionError(f"{what}: not within {timeout:g} s\n{detail}")
        await asyncio.sleep(0.1)
    return time.monotonic() - start


def _complete(dsn: str, tables: Tables, expected: list[tuple[str, int]]) -> Callable[[], Awaitable[bool]]:
    wanted = set(expected)

    async def done() -> bool:
        return wanted <= set(await count_rows(dsn, tables.events))

    return done


async def _finish(dsn: str, tables: Tables, expected: list[tuple[str, int]],
                  workers: Sequence[WorkerHandle]) -> Outcome:
    for worker in workers:
        if stopped(worker):
            os.kill(worker.process.pid, signal.SIGCONT)
    await asyncio.gather(*(w.stop() for w in workers))
    return Outcome(await count_rows(dsn, tables.events), expected)


def _expected(partitions: int, events: int) -> list[tuple[str, int]]:
    return [(str(p), i) for p in range(partitions) for i in range(events)]


async def kill_chain(dsn: str, log_dir: str, *, steps: Sequence[str], mode: str = "sink", partitions: int = 4,
                     events: int = 300, seed: int = 0, timeout: float = 60.0) -> Outcome:
    """One worker after another, each SIGKILLed the ``n``-th time it reaches its step (``n``
    from ``seed``); the next one starts as the previous dies and takes over once its
    leases expire; a last worker without a fault finishes the stream."""
    rng = random.Random(seed)
    tables = await Tables.create(dsn)
    workers: list[WorkerHandle] = []
    # A checkpoint after every commit: every step comes round in every transaction, so each
    # worker reaches its step within its first few transactions, long before the stream ends.
    common = ["--mode", mode, "--max-events", "25", "--batch", "25", "--checkpoint-interval", "0.001"]
    try:
        for index, step in enumerate(steps):
            worker = await spawn(f"{mode}-{index}-{step}", dsn, tables, log_dir, partitions=partitions,
                                 events=events, extra=[*common, "--fault", "kill", "--at", step,
                                                       "--nth", str(rng.randint(1, 3))])
            workers.append(worker)
            await _until(_dead(worker), timeout, f"worker killed at {step}", workers)
        last = await spawn(f"{mode}-last", dsn, tables, log_dir, partitions=partitions, events=events, extra=common)
        workers.append(last)
        expected = _expected(partitions, events)
        await _until(_complete(dsn, tables, expected), timeout, "every event written", workers)
        return await _finish(dsn, tables, expected, workers)
    finally:
        for worker in workers:
            worker.kill()
        await tables.drop(dsn)


def _dead(worker: WorkerHandle) -> Callable[[], Awaitable[bool]]:
    async def dead() -> bool:
        return worker.process.returncode is not None

    return dead


async def zombie(dsn: str, log_dir: str, *, step: str, mode: str = "sink", partitions: int = 2, events: int = 200,
                 nth: int = 2, idle_timeout: float = 3.0, timeout: float = 60.0) -> Outcome:
    """A worker SIGSTOPs itself at ``step`` (its ``nth`` time there); a second one takes
    its partitions once its leases expire and writes every event; then the first is
    resumed (SIGCONT) and given time to act on what it was doing."""
    tables = await Tables.create(dsn)
    common = ["--mode", mode, "--max-events", "20", "--batch", "20", "--idle-timeout", str(idle_timeout)]
    workers: list[WorkerHandle] = []
    try:
        frozen = await spawn(f"{mode}-zombie", dsn, tables, log_dir, partitions=partitions, events=events,
                             extra=[*common, "--fault", "stop", "--at", step, "--nth", str(nth)])
        workers.append(frozen)

        async def is_stopped() -> bool:
            return stopped(frozen)

        await _until(is_stopped, timeout, f"the zombie stopped at {step}", workers)
        stopped_at = time.monotonic()
        successor = await spawn(f"{mode}-successor", dsn, tables, log_dir, partitions=partitions, events=events,
                                extra=common)
        workers.append(successor)
        expected = _expected(partitions, events)
        await _until(_complete(dsn, tables, expected), timeout, "the successor wrote every event", workers)
        taken_after = time.monotonic() - stopped_at
        os.kill(frozen.process.pid, signal.SIGCONT)
        await asyncio.sleep(2.0)  # the zombie wakes: it finishes what it was doing, or fails to
        outcome = await _finish(dsn, tables, expected, workers)
        outcome.notes["successor_done_after_stop_s"] = taken_after
        return outcome
    finally:
        for worker in workers:
            if stopped(worker):
                os.kill(worker.process.pid, signal.SIGCONT)
            worker.kill()
        await tables.drop(dsn)


@dataclass(frozen=True)
class _Record:
    """One owned record, on the store's (the server's) clock: its owner, when it was
    written, and its owner's last proof of life (the later of that write and the owner's
    heartbeat, when the owner's member record says ``lease=member``: its heartbeat keeps
    all its partitions, docs/concepts/leases.md)."""

    owner: str
    written: datetime
    alive: datetime


async def _records(dsn: str, tables: Tables) -> tuple[dict[str, _Record], datetime]:
    """Every owned record, and the server's time, on the store's (the server's) clock."""
    from eventprocessor.stores import PostgresCheckpointStore

    async with PostgresCheckpointStore(dsn=dsn, table=tables.records) as store:
        listing, members = await store.list_ownership_and_members("memory.local", "hub", "$default")
    beats = {m.owner_id: m.last_modified_time for m in (members.members if members else ())
             if m.last_modified_time is not None and m.properties.get("lease") == "member"}
    return {o.partition_id: _Record(o.owner_id, o.last_modified_time,
                                    max(o.last_modified_time, beats.get(o.owner_id, o.last_modified_time)))
            for o in listing.ownerships if o.owner_id and o.last_modified_time}, listing.server_time


def _live(records: dict[str, _Record], now: datetime, expiry: float) -> dict[str, str]:
    return {p: r.owner for p, r in records.items() if (now - r.alive).total_seconds() < expiry}


class _Failover:
    """What the store's records show of a killed worker's partitions, on the server's
    clock: the dead worker's last proof of life (its last write or heartbeat), and the
    write of the first record of its taker seen."""

    def __init__(self, victim: str, records: dict[str, _Record]) -> None:
        self.victim = victim
        self.partitions = {p for p, r in records.items() if r.owner == victim}
        self.last_alive: datetime | None = None
        self.taken: dict[str, datetime] = {}
        self.see(records)

    def see(self, records: dict[str, _Record]) -> None:
        for partition, record in records.items():
            if record.owner == self.victim:
                self.last_alive = record.alive if self.last_alive is None else max(self.last_alive, record.alive)
            elif partition in self.partitions:
                self.taken.setdefault(partition, record.written)

    def earliest_lease_age(self) -> float:
        """Seconds from the dead worker's last proof of life to the earliest takeover seen
        (a poll may see a takeover late, never early)."""
        assert self.last_alive is not None and self.taken, "no takeover seen"
        return min((stamp - self.last_alive).total_seconds() for stamp in self.taken.values())


async def group(dsn: str, log_dir: str, *, partitions: int = 12, events: int = 300, rate: float = 50.0,
                timeout: float = 60.0) -> Outcome:
    """Two workers balance a stream (6/6), a third joins and partitions are handed over
    to it while events flow (4/4/4), then one is SIGKILLed and the two others take its
    partitions once its leases expire; the group runs on PostgreSQL alone. The notes say,
    from the store's records on the server's clock, whether the survivors kept what they
    owned and how long after the dead worker's last write its first partition was taken."""
    expiry = 2.0
    tables = await Tables.create(dsn)
    start = time.time() + 3.0
    common = ["--rate", str(rate), "--start", str(start), "--expiry", str(expiry), "--max-events", "50"]
    workers: list[WorkerHandle] = []
    notes: dict[str, float] = {}

    def split(owners: dict[str, str]) -> list[int]:
        return sorted(sum(1 for owner in owners.values() if owner == w.owner_id) for w in workers if w.alive)

    async def balanced(shares: list[int], failover: _Failover | None = None) -> bool:
        records, now = await _records(dsn, tables)
        if failover is not None:
            failover.see(records)
        owners = _live(records, now, expiry)
        return len(owners) == partitions and split(owners) == shares and all(
            set(w.owned) == {p for p, o in owners.items() if o == w.owner_id} for w in workers if w.alive)

    try:
        for name in ("g0", "g1"):
            workers.append(await spawn(name, dsn, tables, log_dir, partitions=partitions, events=events,
                                       extra=common))
        half = partitions // 2
        notes["balanced_2_s"] = await _until(lambda: balanced([half, half]), timeout, "two workers balanced",
                                             workers)
        workers.append(await spawn("g2", dsn, tables, log_dir, partitions=partitions, events=events, extra=common))
        third = partitions // 3
        notes["handed_over_s"] = await _until(lambda: balanced([third] * 3), timeout, "three workers balanced",
                                              workers)
        before, _now = await _records(dsn, tables)
        failover = _Failover(workers[0].owner_id, before)
        workers[0].kill()
        await workers[0].process.wait()
        notes["failed_over_s"] = await _until(lambda: balanced([half, half], failover), timeout,
                                              "the survivors took the killed worker's partitions", workers)
        after, _now = await _records(dsn, tables)
        notes["survivors_kept_their_partitions"] = float(all(
            after[p].owner == record.owner for p, record in before.items() if record.owner != failover.victim))
        notes["earliest_takeover_lease_age_s"] = failover.earliest_lease_age()
        notes["expiry_s"] = expiry
        expected = _expected(partitions, events)
        await _until(_complete(dsn, tables, expected), timeout, "every event written", workers)
        outcome = await _finish(dsn, tables, expected, workers)
        outcome.notes.update(notes)
        return outcome
    finally:
        for worker in workers:
            worker.kill()
        await tables.drop(dsn)
