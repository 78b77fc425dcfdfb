"""In-process fault scenarios of the PostgreSQL sink on a real server: a zombie frozen at
each step of the transaction, a commit whose answer is lost (committed, and not), a
connection cut mid-transaction, the database restarted mid-transaction, and a planned
move under load. Each returns what the table holds (:class:`~harness.postgres_processes.Outcome`).

A *zombie* here is a processor whose sink is frozen inside a batch (the step hook awaits)
while its checkpoint store is cut off, so its lease runs out and a second processor takes
the partition, as a SIGSTOPped process's would; then it is let go. The processors share an
in-memory checkpoint store and one ``InMemoryEventSource``; the sink writes to the real
server. ``seed`` varies which transaction is hit and the timings.

Example::

    outcome = await zombie(dsn, step="after_write", seed=4)
    assert outcome.exactly_once() is None
"""
from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from eventprocessor import EventProcessor
from eventprocessor.postgres import PostgresSink
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import FaultyStore

from .postgres_processes import Outcome, count_rows

__all__ = ["zombie", "lost_commit", "cut_connection", "restart", "move_under_load", "Scene"]

INTERVAL = 0.1
EXPIRY = 1.0


class Scene:
    """One scenario's tables, source and store, and the processors and sinks it made."""

    def __init__(self, dsn: str, partitions: int, events: int) -> None:
        suffix = uuid.uuid4().hex[:10]
        self.dsn, self.partitions, self.events = dsn, partitions, events
        self.table, self.positions_table = f"rows_{suffix}", f"pos_{suffix}"
        self.source = InMemoryEventSource(partitions)
        self.store = InMemoryCheckpointStore()
        self.processors: list[EventProcessor] = []
        self.sinks: list[PostgresSink] = []

    async def __aenter__(self) -> Scene:
        connection = await asyncpg.connect(self.dsn)
        try:
            await connection.execute(f'CREATE TABLE "{self.table}" (partition_id text, sequence_number bigint, '
                                     "body bytea)")
        finally:
            await connection.close()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for processor in self.processors:
            await processor.stop()
        for sink in self.sinks:
            await sink.close()
        connection = await asyncpg.connect(self.dsn)
        try:
            await connection.execute(f'DROP TABLE IF EXISTS "{self.table}", "{self.positions_table}"')
        finally:
            await connection.close()

    def produce(self, count: int | None = None) -> None:
        have = self.source.last_sequence_number("0") + 1
        for i in range(have, min(self.events, have + (count or self.events))):
            for p in range(self.partitions):
                self.source.append(f"{p}:{i}", partition_id=str(p))

    def sink(self, dsn: str | None = None, **options: Any) -> PostgresSink:
        table = self.table

        async def write(events: list, connection: Any) -> None:
            await connection.copy_records_to_table(
                table, columns=["partition_id", "sequence_number", "body"],
                records=[(e.partition_id, e.sequence_number, e.body) for e in events])

        options.setdefault("max_events", 20)
        options.setdefault("max_interval", 0.05)
        sink = PostgresSink(write, dsn=dsn or self.dsn, positions_table=self.positions_table, **options)
        self.sinks.append(sink)
        return sink

    def processor(self, owner_id: str, sink: PostgresSink, store: Any = None) -> EventProcessor:
        processor = EventProcessor(self.source, store or self.store.new_client(), sink, owner_id=owner_id,
                                   load_balancing_interval=INTERVAL, partition_ownership_expiration_interval=EXPIRY,
                                   max_batch_size=20, shutdown_timeout=5.0)
        self.processors.append(processor)
        return processor

    async def positions(self) -> dict[str, int]:
        """Each partition's committed position ({} while the server cannot be reached:
        a scenario may be restarting it)."""
        try:
            connection = await asyncpg.connect(self.dsn)
            try:
                rows = await connection.fetch(f'SELECT partition_id, sequence_number FROM "{self.positions_table}"')
            finally:
                connection.terminate()
        # Restarting, or no table yet. A server that shuts down between the handshake and
        # the query leaves asyncpg's protocol consuming its FATAL: the query then raises
        # InternalClientError ("cannot switch to state 12; another operation (2) is in progress").
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.exceptions._base.InternalClientError):
            return {}
        return {row[0]: row[1] for row in rows}

    async def written(self, timeout: float = 30.0) -> None:
        """Wait until every partition's position is its last event."""
        want = {str(p): self.events - 1 for p in range(self.partitions)}
        await _until(lambda: self._positions_are(want), timeout, "every event committed")

    async def _positions_are(self, want: dict[str, int]) -> bool:
        return await self.positions() == want

    async def outcome(self, **notes: float) -> Outcome:
        expected = [(str(p), i) for p in range(self.partitions) for i in range(self.events)]
        return Outcome(await count_rows(self.dsn, self.table), expected, dict(notes))


async def _until(condition: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g} s")
        await asyncio.sleep(0.05)


class Freeze:
    """A step hook that freezes the ``nth`` batch reaching ``step`` until :meth:`release`,
    and cuts its processor's store off meanwhile (its lease runs out)."""

    def __init__(self, step: str, nth: int, store: FaultyStore) -> None:
        self.step, self.nth, self.store = step, nth, store
        self.seen = 0
        self.frozen = asyncio.Event()
        self._released = asyncio.Event()

    async def __call__(self, step: str, context: Any) -> None:
        if step != self.step:
            return
        self.seen += 1
        if self.seen == self.nth:
            self.store.down = True
            self.frozen.set()
            await self._released.wait()

    def release(self) -> None:
        self._released.set()


async def zombie(dsn: str, *, step: str, seed: int, session_ended: bool = False, events: int = 100) -> Outcome:
    """Processor A freezes at ``step`` of a batch and loses its lease; B takes the
    partition and writes every event; then A goes on: its UPDATE is refused, or (with
    ``session_ended``: the server ended A's idle session meanwhile) its last message fails
    and the row tells it that the partition is B's."""
    rng = random.Random(seed)
    async with Scene(dsn, 1, events) as scene:
        scene.produce()
        a_store = FaultyStore(scene.store.new_client())
        freeze = Freeze(step, rng.randint(1, 3), a_store)
        a = scene.processor("a", scene.sink(step_hook=freeze, transaction_idle_timeout=1.0 if session_ended else 30.0),
                            a_store)
        await a.start()
        await asyncio.wait_for(freeze.frozen.wait(), 30)
        b = scene.processor("b", scene.sink())
        try:
            await b.start()
            await scene.written()
            await asyncio.sleep(rng.uniform(0, 0.3))
        finally:
            freeze.release()
        await asyncio.sleep(0.5)  # A acts on what it was doing
        return await scene.outcome(stale_rollbacks=scene.sinks[0].stats.stale_rollbacks,
                                   unknown_commits=scene.sinks[0].stats.unknown_commits)


async def lost_commit(dsn: str, *, committed: bool, seed: int, events: int = 60) -> Outcome:
    """The answer to a COMMIT is lost: the server carried the COMMIT out (``committed``) or
    never got it; the connection is then reset. The sink asks the server what became of
    the transaction and goes on: it never writes the batch twice, and never drops it."""
    from eventprocessor.emulators.fault_proxy import TcpFaultProxy

    rng = random.Random(seed)
    host_port = dsn.rsplit("@", 1)[1].split("/", 1)[0]
    port = int(host_port.rsplit(":", 1)[1])
    async with TcpFaultProxy("127.0.0.1", port) as proxy, Scene(dsn, 1, events) as scene:
        scene.produce()
        nth, seen = rng.randint(1, 2), [0]
        loop = asyncio.get_running_loop()

        def restore() -> None:
            proxy.reset_all()
            proxy.pass_through()

        def before_commit(step: str, context: Any) -> None:
            if step == "after_write":
                seen[0] += 1
                if seen[0] == nth:
                    proxy.mute_answers() if committed else proxy.black_hole()
                    loop.call_later(0.3, restore)

        sink = scene.sink(dsn=dsn.replace(host_port, f"127.0.0.1:{proxy.port}"), step_hook=before_commit)
        await scene.processor("a", sink).start()
        await scene.written()
        return await scene.outcome(unknown_commits=sink.stats.unknown_commits)


async def cut_connection(dsn: str, *, step: str, seed: int, events: int = 60) -> Outcome:
    """The sink's connection is reset at ``step`` of a batch (before COMMIT): nothing of
    the batch is committed, and it is written again on another connection."""
    from eventprocessor.emulators.fault_proxy import TcpFaultProxy

    rng = random.Random(seed)
    host_port = dsn.rsplit("@", 1)[1].split("/", 1)[0]
    port = int(host_port.rsplit(":", 1)[1])
    async with TcpFaultProxy("127.0.0.1", port) as proxy, Scene(dsn, 2, events) as scene:
        scene.produce()
        cuts = {rng.randint(1, 4), rng.randint(5, 8)}
        seen = [0]

        def cut(reached: str, context: Any) -> None:
            if reached == step:
                seen[0] += 1
                if seen[0] in cuts:
                    proxy.reset_all()

        sink = scene.sink(dsn=dsn.replace(host_port, f"127.0.0.1:{proxy.port}"), step_hook=cut)
        await scene.processor("a", sink).start()
        await scene.written()
        return await scene.outcome(resets=proxy.resets)


async def restart(server: Any, *, seed: int, events: int = 80) -> Outcome:
    """The database restarts mid-run twice: a crash (``immediate``) while a batch is
    written and not committed, and a fast shutdown while another has just begun.
    Open transactions roll back, committed ones stay; the sink reconnects and goes on."""
    rng = random.Random(seed)
    async with Scene(server.dsn, 2, events) as scene:
        scene.produce()
        plan = {("after_write", rng.randint(1, 3)): "immediate", ("after_begin", rng.randint(4, 6)): "fast"}
        seen: dict[str, int] = {}
        one_at_a_time = asyncio.Lock()  # two partitions' steps may ask for the two restarts at once

        async def restart_at(step: str, context: Any) -> None:
            seen[step] = seen.get(step, 0) + 1
            mode = plan.pop((step, seen[step]), None)
            if mode is not None:
                async with one_at_a_time:
                    await asyncio.to_thread(server.restart, mode=mode)

        sink = scene.sink(step_hook=restart_at)
        await scene.processor("a", sink).start()
        await scene.written(timeout=60)
        return await scene.outcome(unknown_commits=sink.stats.unknown_commits, restarts=2 - len(plan))


async def move_under_load(dsn: str, *, seed: int, partitions: int = 4, events: int = 400) -> Outcome:
    """A second processor joins while events flow: partitions are handed over (each
    owner commits what it buffered and hands over), and every event is written once."""
    rng = random.Random(seed)
    async with Scene(dsn, partitions, events) as scene:
        a = scene.processor("a", scene.sink())
        await a.start()
        producing = asyncio.create_task(_produce(scene, rng))
        await asyncio.sleep(rng.uniform(0.2, 0.6))
        b = scene.processor("b", scene.sink())
        await b.start()
        await _until(lambda: _split(a, b, partitions), 30, "the partitions split between A and B")
        await producing
        await scene.written()
        moved = sum(1 for pid in b.owned_partitions)
        return await scene.outcome(moved=moved)


async def _produce(scene: Scene, rng: random.Random) -> None:
    while scene.source.last_sequence_number("0") + 1 < scene.events:
        scene.produce(rng.randint(5, 15))
        await asyncio.sleep(0.02)


async def _split(a: EventProcessor, b: EventProcessor, partitions: int) -> bool:
    owned_a, owned_b = set(a.owned_partitions), set(b.owned_partitions)
    return len(owned_a) == len(owned_b) == partitions // 2 and not owned_a & owned_b
