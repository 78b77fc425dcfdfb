"""PostgresSink on a real PostgreSQL (the session's server): what it writes, where a claim
resumes, and the faults of its transaction, each counted from the table it wrote.

The processes' side (SIGKILL, SIGSTOP, a group) is ``tests/test_postgres_processes.py``;
the scenarios here run in this process (``harness/postgres_scenarios.py``) with one seed
each. ``python -m harness.postgres_soak`` runs them over many seeds.
"""
from __future__ import annotations

import asyncio
import logging

import asyncpg
import pytest

from eventprocessor import EventProcessor
from eventprocessor.errors import ConfigurationError
from eventprocessor.policies import RetryPolicy
from eventprocessor.postgres import PositionBehindError, PostgresSink
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from harness.postgres_scenarios import cut_connection, lost_commit, move_under_load, restart, zombie
from tests.postgres_helpers import copy_into, create_events_table, drop_tables, expected_events, tally, wait_for

pytestmark = [pytest.mark.postgres]

NAMESPACE, HUB, GROUP = "memory.local", "hub", "$default"


def _processor(source, store, sink, owner_id: str = "a") -> EventProcessor:
    return EventProcessor(source, store, sink, owner_id=owner_id, load_balancing_interval=0.1,
                          partition_ownership_expiration_interval=1.0, max_batch_size=50)


def _filled(partitions: int, events: int) -> InMemoryEventSource:
    source = InMemoryEventSource(partitions)
    for i in range(events):
        for p in range(partitions):
            source.append(f"{p}:{i}", partition_id=str(p))
    return source


async def _positions_reach(sink: PostgresSink, partitions: int, last: int) -> bool:
    return await sink.positions(NAMESPACE, HUB, GROUP) == {str(p): last for p in range(partitions)}


async def _run_until_written(source, sink: PostgresSink, partitions: int, last: int, timeout: float, what: str,
                             store=None) -> None:
    """One processor over ``source`` into ``sink`` until every partition's position is ``last``."""
    processor = _processor(source, store or InMemoryCheckpointStore(), sink)
    await processor.start()
    try:
        await wait_for(lambda: _positions_reach(sink, partitions, last), timeout, what)
    finally:
        await processor.stop()


@pytest.fixture
async def tables(postgres):
    events = await create_events_table(postgres.dsn)
    positions = f"pos_{events}"
    yield events, positions
    await drop_tables(postgres.dsn, events, positions)


# ------------------------------------------------------------------ the happy path


async def test_every_event_is_written_once_in_batches_and_the_store_checkpoint_follows(postgres, tables):
    table, positions = tables
    source, store = _filled(4, 300), InMemoryCheckpointStore()
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions, max_events=64,
                            max_interval=0.1, checkpoint_interval=0.2) as sink:
        processor = _processor(source, store, sink)
        await processor.start()
        await wait_for(lambda: _positions_reach(sink, 4, 299), 30, "every event committed")
        await processor.stop()
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(4, 300)) is None
    assert sink.stats.events_committed == 1200
    assert sink.stats.transactions_committed >= 4 * 5, "at most max_events per transaction"
    checkpoints = {c.partition_id: c.sequence_number for c in await store.list_checkpoints(NAMESPACE, HUB, GROUP)}
    assert checkpoints == {str(p): 299 for p in range(4)}, "a stop checkpoints what was committed"


async def test_a_batch_smaller_than_max_events_is_committed_after_max_interval(postgres, tables):
    table, positions = tables
    source = _filled(1, 5)
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions, max_events=1000,
                            max_interval=0.2) as sink:
        await _run_until_written(source, sink, 1, 4, 10, "5 events committed without more arriving")
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(1, 5)) is None


async def test_consecutive_transactions_of_a_claim_run_on_one_connection_without_a_reset(postgres, tables):
    """A claim with a backlog commits batch after batch on the connection it holds: no
    pool acquire and reset in between (a session setting made by one batch is still
    there at the next), and the connection goes back to the pool when the backlog is
    written. Every event still lands once."""
    table, positions = tables
    copy = copy_into(table)
    carried: list[bool] = []

    async def write(events, connection):
        carried.append(await connection.fetchval("SELECT current_setting('application_name')") == "held")
        await connection.execute("SET application_name = 'held'")  # kept by the session, until a reset
        await copy(events, connection)

    source = _filled(1, 2000)
    pool = await asyncpg.create_pool(postgres.dsn, min_size=0, max_size=4)
    try:
        async with PostgresSink(write, pool=pool, positions_table=positions, max_events=100,
                                max_interval=0.1) as sink:
            await _run_until_written(source, sink, 1, 1999, 30, "every event committed")
            idle, size = pool.get_idle_size(), pool.get_size()
    finally:
        await pool.close()
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(1, 2000)) is None
    assert len(carried) >= 20 and not carried[0]
    assert sum(carried) >= len(carried) // 2, carried  # most batches followed another on the same connection
    assert idle == size, (idle, size)  # and once written, the connection went back to the pool


async def test_a_claim_resumes_after_the_database_position_and_the_store_checkpoint_catches_up(postgres, tables):
    """A crash between COMMIT and the checkpoint leaves the store's checkpoint behind the
    database. The next claim's receiver starts at the store's checkpoint; the sink skips
    what the database has and moves the store's checkpoint up to it."""
    table, positions = tables
    source, store = _filled(1, 100), InMemoryCheckpointStore()
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions, max_events=30) as sink:
        first = _processor(source, store, sink)
        await first.start()
        await wait_for(lambda: _positions_reach(sink, 1, 99), 20, "every event committed")
        await first.stop()
    # Where the store's checkpoint is after a crash right after an early commit.
    store.plant_record("checkpoint", NAMESPACE, HUB, GROUP, "0",
                       {"sequencenumber": "29", "offset": source.events("0")[29].offset, "ownerid": "a", "epoch": "1"})
    for i in range(100, 120):
        source.append(f"0:{i}", partition_id="0")
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions, max_events=30) as sink:
        second = _processor(source, store, sink, owner_id="b")
        await second.start()
        await wait_for(lambda: _positions_reach(sink, 1, 119), 20, "the new events committed")
        checkpoint = await store.list_checkpoints(NAMESPACE, HUB, GROUP)
        await second.stop()
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(1, 120)) is None
    assert sink.stats.events_committed == 20, "events 30 to 99 were skipped, not written again"
    assert checkpoint[0].sequence_number >= 99, "the store's checkpoint caught up with the database"


async def test_a_database_position_behind_the_store_checkpoint_parks_the_partition(postgres, tables, caplog):
    table, positions = tables
    source, store = _filled(1, 50), InMemoryCheckpointStore()
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions, max_events=10) as sink:
        first = _processor(source, store, sink)
        await first.start()
        await wait_for(lambda: _positions_reach(sink, 1, 49), 20, "every event committed")
        await first.stop()
    connection = await asyncpg.connect(postgres.dsn)  # the database restored from an older backup
    try:
        await connection.execute(f'UPDATE "{positions}" SET sequence_number = 19')
        await connection.execute(f'DELETE FROM "{table}" WHERE sequence_number > 19')
    finally:
        await connection.close()
    caplog.set_level(logging.ERROR)
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions) as sink:
        second = _processor(source, store, sink, owner_id="b")
        await second.start()
        await wait_for(lambda: _parked(sink), 20, "the partition parked")
        await second.stop()
    assert isinstance(sink.parked["0"], PositionBehindError)
    assert "behind the checkpoint store's (49)" in str(sink.parked["0"])
    assert any("parked" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(1, 20)) is None, "no gap written over"


async def _parked(sink: PostgresSink) -> bool:
    return bool(sink.parked)


# ------------------------------------------------------------------ stale claims


async def test_a_claim_with_an_older_epoch_than_the_row_is_refused_and_ends(postgres, tables, caplog):
    """The positions table remembers the highest epoch that fenced each partition: a claim
    from a checkpoint store whose epochs started again is refused loudly and ends."""
    table, positions = tables
    source = _filled(1, 20)
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions) as sink:
        processor = _processor(source, InMemoryCheckpointStore(), sink)
        await processor.start()
        await wait_for(lambda: _positions_reach(sink, 1, 19), 20, "every event committed")
        await processor.stop()
    connection = await asyncpg.connect(postgres.dsn)
    try:
        await connection.execute(f'UPDATE "{positions}" SET epoch = 50')
    finally:
        await connection.close()
    for i in range(20, 30):
        source.append(f"0:{i}", partition_id="0")
    caplog.set_level(logging.WARNING)
    async with PostgresSink(copy_into(table), dsn=postgres.dsn, positions_table=positions) as sink:
        processor = _processor(source, InMemoryCheckpointStore(), sink)  # a new store: epochs start at 1 again
        await processor.start()

        async def refused() -> bool:  # the claim comes after the group's join delay
            return any("fence of partition 0" in r.getMessage() for r in caplog.records)

        await wait_for(refused, 20, "the claim refused")
        await asyncio.sleep(0.5)  # it would commit now if it were let through
        await processor.stop()
    assert sink.stats.events_committed == 0
    assert any("fence of partition 0" in r.getMessage() and "epoch 50" in r.getMessage() for r in caplog.records)
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(1, 20)) is None


@pytest.mark.parametrize("step", ["before_begin", "after_begin", "after_write", "after_commit"])
async def test_a_frozen_owner_whose_lease_ran_out_commits_nothing_after_the_new_owner_fenced(postgres, step):
    """The zombie in one process: frozen at each step of a batch while its lease runs out,
    then let go once the new owner wrote everything: its UPDATE matches nothing and its
    rows are rolled back (frozen after COMMIT, it had committed before the new owner came)."""
    outcome = await zombie(postgres.dsn, step=step, seed=7)
    assert outcome.exactly_once() is None, outcome.exactly_once()
    refused = 0 if step == "after_commit" else 1
    assert outcome.notes["stale_rollbacks"] == refused, outcome.notes


async def test_a_frozen_owner_whose_session_the_server_ended_learns_from_the_row_that_it_lost(postgres):
    outcome = await zombie(postgres.dsn, step="after_write", seed=3, session_ended=True)
    assert outcome.exactly_once() is None, outcome.exactly_once()
    assert outcome.notes["unknown_commits"] == 1, outcome.notes


async def test_a_planned_move_under_load_writes_every_event_once(postgres):
    outcome = await move_under_load(postgres.dsn, seed=5)
    assert outcome.exactly_once() is None, outcome.exactly_once()
    assert outcome.notes["moved"] == 2


# ------------------------------------------------------------------ the transaction's faults


@pytest.mark.parametrize("committed", [True, False], ids=["carried-out", "never-arrived"])
async def test_a_commit_whose_answer_is_lost_is_settled_by_asking_the_server(postgres, committed):
    outcome = await lost_commit(postgres.dsn, committed=committed, seed=2)
    assert outcome.exactly_once() is None, outcome.exactly_once()
    assert outcome.notes["unknown_commits"] >= 1, "the lost answer was noticed and settled"


@pytest.mark.parametrize("step", ["before_begin", "after_begin", "after_write"])
async def test_a_connection_cut_mid_transaction_commits_nothing_and_the_batch_is_written_again(postgres, step):
    outcome = await cut_connection(postgres.dsn, step=step, seed=11)
    assert outcome.exactly_once() is None, outcome.exactly_once()
    assert outcome.notes["resets"] >= 2


async def test_the_database_restarted_mid_transaction_loses_and_repeats_nothing(tmp_path):
    from eventprocessor.emulators.postgres import PostgresUnavailable, start_postgres
    from tests.conftest import POSTGRES_TEST_SETTINGS, unavailable

    try:
        server = start_postgres(settings=POSTGRES_TEST_SETTINGS)  # its own: the session's must not restart
    except PostgresUnavailable as error:
        unavailable(f"PostgreSQL could not start: {error}")
        return
    try:
        outcome = await restart(server, seed=1)
    finally:
        server.stop()
    assert outcome.exactly_once() is None, outcome.exactly_once()
    assert outcome.notes["restarts"] == 2


async def test_serialization_failures_are_run_again(postgres, tables):
    """Under SERIALIZABLE, four partitions' transactions all update one counter row: they
    conflict, are run again, and the counter ends at the number of events."""
    table, positions = tables
    connection = await asyncpg.connect(postgres.dsn)
    counter = f"{table}_counter"
    await connection.execute(f'CREATE TABLE "{counter}" (n bigint); INSERT INTO "{counter}" VALUES (0)')
    copy = copy_into(table)

    async def write(events, conn):
        await copy(events, conn)
        total = await conn.fetchval(f'SELECT n FROM "{counter}"')
        await asyncio.sleep(0.01)  # widen the window in which the others read the same value
        await conn.execute(f'UPDATE "{counter}" SET n = $1', total + len(events))

    try:
        async with PostgresSink(write, dsn=postgres.dsn, positions_table=positions, isolation="serializable",
                                max_events=10, serialization_retries=50) as sink:
            processor = _processor(_filled(4, 60), InMemoryCheckpointStore(), sink)
            await processor.start()
            await wait_for(lambda: _positions_reach(sink, 4, 59), 60, "every event committed")
            await processor.stop()
        assert await connection.fetchval(f'SELECT n FROM "{counter}"') == 240
    finally:
        await connection.execute(f'DROP TABLE "{counter}"')
        await connection.close()
    assert sink.stats.serialization_retries > 0, "the transactions did conflict"
    assert (await tally(postgres.dsn, table)).exactly_once(expected_events(4, 60)) is None


async def test_a_failing_write_is_retried_then_the_partition_parks(postgres, tables):
    table, positions = tables
    copy = copy_into(table)
    failures = {"left": 2}

    async def flaky(events, connection):
        await copy(events, connection)  # rolled back with the transaction when it fails
        if events[0].partition_id == "0" and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("the user's write failed")
        if events[0].partition_id == "1" and events[-1].sequence_number >= 19:
            raise ValueError("poison")

    policy = RetryPolicy(max_delivery_attempts=3, retry_backoff=0.01, max_retry_backoff=0.02)
    async with PostgresSink(flaky, dsn=postgres.dsn, positions_table=positions, max_events=10,
                            retry_policy=policy) as sink:
        processor = _processor(_filled(2, 30), InMemoryCheckpointStore(), sink)
        await processor.start()
        await wait_for(lambda: _parked(sink), 20, "partition 1 parked")
        await wait_for(lambda: _at(sink, "0", 29), 20, "partition 0 written after its retries")
        await processor.stop()
    assert set(sink.parked) == {"1"} and "poison" in str(sink.parked["1"].__cause__)
    counts = (await tally(postgres.dsn, table)).counts
    assert all(n == 1 for n in counts.values())
    assert {key for key in counts if key[0] == "1"} == {("1", i) for i in range(10)}, "nothing past the poison"


async def _at(sink: PostgresSink, pid: str, last: int) -> bool:
    return (await sink.positions(NAMESPACE, HUB, GROUP)).get(pid) == last


# ------------------------------------------------------------------ configuration


async def test_bad_configuration_is_refused_with_the_fix_and_no_secret(postgres):
    async def write(events, connection):
        pass

    def not_async(events, connection):
        pass

    with pytest.raises(ConfigurationError, match="async def write"):
        PostgresSink(not_async, dsn=postgres.dsn)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="dsn= .* or pool="):
        PostgresSink(write)
    with pytest.raises(ConfigurationError, match="postgresql://") as raised:
        PostgresSink(write, dsn="host=db password=hunter2")
    assert "hunter2" not in str(raised.value)
    with pytest.raises(ConfigurationError, match="isolation"):
        PostgresSink(write, dsn=postgres.dsn, isolation="chaos")
    with pytest.raises(ConfigurationError, match="positions_table"):
        PostgresSink(write, dsn=postgres.dsn, positions_table="x; DROP TABLE y")
    sink = PostgresSink(write, dsn="postgresql://app:hunter2@db.internal:5432/events?sslpassword=hunter3")
    assert "hunter" not in repr(sink) and "db.internal:5432/events" in repr(sink)

