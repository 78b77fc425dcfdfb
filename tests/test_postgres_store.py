"""PostgresCheckpointStore beyond the conformance suite (which it passes with the other
stores): secrets kept out of sight, an unreachable server said in one line, a write whose
answer is lost on a real connection, and the Spark sink's commit log kept in it."""
from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

import asyncpg
import pytest

from eventprocessor.emulators.fault_proxy import TcpFaultProxy
from eventprocessor.emulators.ports import free_ports
from eventprocessor.errors import CheckpointStoreError, ConfigurationError
from eventprocessor.stores import PostgresCheckpointStore
from eventprocessor.stores.records import Ownership

pytestmark = [pytest.mark.postgres]

SCOPE = ("ns.servicebus.windows.net", "hub", "$default")


@pytest.fixture
async def table(postgres):
    name = f"store_{uuid.uuid4().hex[:12]}"
    yield name
    connection = await asyncpg.connect(postgres.dsn)
    try:
        await connection.execute(f'DROP TABLE IF EXISTS "{name}"; DROP SEQUENCE IF EXISTS "{name}_version"')
    finally:
        await connection.close()


def test_the_password_never_shows_and_bad_settings_say_what_to_use():
    store = PostgresCheckpointStore(dsn="postgresql://app:s3cret@db.internal:6432/events?sslpassword=other")
    assert "s3cret" not in repr(store) and "other" not in repr(store)
    assert store.dsn == "postgresql://app@db.internal:6432/events"
    with pytest.raises(ConfigurationError, match="postgresql://") as raised:
        PostgresCheckpointStore(dsn="host=db password=s3cret")
    assert "s3cret" not in str(raised.value)
    with pytest.raises(ConfigurationError, match="identifier"):
        PostgresCheckpointStore(dsn="postgresql://db/x", table='records"; DROP TABLE x; --')
    with pytest.raises(ConfigurationError, match="not both"):
        PostgresCheckpointStore(dsn="postgresql://db/x", pool=object())


async def test_an_unreachable_server_fails_in_one_line_within_the_operation_timeout():
    [port] = free_ports(1)
    store = PostgresCheckpointStore(dsn=f"postgresql://app:s3cret@127.0.0.1:{port}/x", operation_timeout=5)
    started = time.monotonic()
    try:
        with pytest.raises(CheckpointStoreError) as raised:
            await store.check()
    finally:
        await store.close()
    message = str(raised.value)
    assert time.monotonic() - started < 5
    assert "cannot use it" in message and str(port) in message and "s3cret" not in message
    assert "\n" not in message


async def test_records_carry_the_servers_clock_and_a_version_that_never_repeats(postgres, table):
    async with PostgresCheckpointStore(dsn=postgres.dsn, table=table) as store:
        [first] = await store.claim_ownership([Ownership(*SCOPE, "0", "a", epoch=1)])
        [second] = await store.claim_ownership([first])
        listing = await store.list_ownership(*SCOPE)
        connection = await asyncpg.connect(postgres.dsn)
        try:
            server_now = await connection.fetchval("SELECT clock_timestamp()")
            row = await connection.fetchrow(f'SELECT version, modified, fields FROM "{table}" WHERE key = $1', "0")
        finally:
            await connection.close()
    assert int(second.etag) > int(first.etag) and str(row["version"]) == second.etag
    assert row["modified"] == second.last_modified_time <= listing.server_time <= server_now


async def test_a_claim_whose_answer_is_lost_on_the_wire_is_recognised_by_its_token(postgres, table):
    """The UPDATE reaches the server and is committed; its answer is dropped and the
    connection reset. The store reads the record back, finds its own write token, and
    reports the claim won with the record's real version."""
    port = int(postgres.dsn.rsplit(":", 1)[1].split("/")[0])
    async with TcpFaultProxy("127.0.0.1", port) as proxy:
        proxied = postgres.dsn.replace(f":{port}/", f":{proxy.port}/")
        async with PostgresCheckpointStore(dsn=proxied, table=table) as store, \
                PostgresCheckpointStore(dsn=postgres.dsn, table=table) as direct:
            [mine] = await store.claim_ownership([Ownership(*SCOPE, "0", "a", epoch=1)])
            # Once prepared, the UPDATE goes out in one message, with nothing to wait for
            # before the server runs it (a first use would wait for the statement's description).
            [mine] = await store.claim_ownership([mine])
            proxy.mute_answers()

            def restore() -> None:
                proxy.reset_all()
                proxy.pass_through()

            asyncio.get_running_loop().call_later(0.3, restore)
            [renewed] = await store.claim_ownership([replace(mine, epoch=2)])
            [stored] = (await direct.list_ownership(*SCOPE)).ownerships
    assert proxy.resets >= 1
    assert (stored.owner_id, stored.epoch, stored.etag) == ("a", 2, renewed.etag)


async def test_the_spark_sink_commit_log_lives_in_the_postgres_store(postgres, table):
    """A group on PostgreSQL alone keeps the Spark sink's commit log there too: fences,
    plans and commits as create-if-absent entries, read back by another process's log."""
    from eventprocessor.spark.commit_log import CommitLog, PartitionRange, StaleFenceError, StoreLogStorage

    scope = dict(fully_qualified_namespace=SCOPE[0], eventhub_name=SCOPE[1], consumer_group=SCOPE[2])
    async with PostgresCheckpointStore(dsn=postgres.dsn, table=table) as one, \
            PostgresCheckpointStore(dsn=postgres.dsn, table=table) as other:
        old = CommitLog(StoreLogStorage(one, "commits", **scope), **scope)
        await old.fence("0", owner_id="old", epoch=1)
        batch = await old.begin([PartitionRange("0", 0, 9, "9", 10, "old", 1)])
        await old.commit(batch)
        new = CommitLog(StoreLogStorage(other, "commits", **scope), **scope)
        assert (await new.fence("0", owner_id="new", epoch=2)).high_water_mark == 9
        with pytest.raises(StaleFenceError):
            await old.fence("0", owner_id="old", epoch=1)
