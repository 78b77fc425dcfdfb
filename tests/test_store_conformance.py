"""One contract, four stores: the same tests against InMemory, Blob-on-Azurite,
Table-on-Azurite and PostgreSQL (``eventprocessor/stores/contract.py`` states the contract,
``eventprocessor/stores/protocol.py`` and the modules it names the protocol all four run).

Every test gets a fresh container / table and a fresh consumer group. Races are real:
the two contenders are two store clients with their own fence caches (on Azurite, with
their own HTTP sessions; on PostgreSQL, their own connection pools). Interleavings that
real time cannot force are forced deterministically by hooking a client's record reads
(the storage itself is never mocked: every write goes to the real store).
"""
from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from eventprocessor._ownership.balancer import decide
from eventprocessor.errors import (
    CheckpointStoreError,
    ClaimOwnershipError,
    ConfigurationError,
    OwnershipLostError,
    StaleEpochError,
)
from eventprocessor.policies import LoadBalancingStrategy
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.backend import CHECKPOINT, OWNERSHIP, EtagMismatch, Kind, RecordExists
from eventprocessor.stores.contract import CheckpointStore
from eventprocessor.stores.records import (
    MAX_DONE_TEXT,
    MAX_ENTRY_BYTES,
    MAX_EPOCH,
    Checkpoint,
    DoneBeyond,
    Member,
    Ownership,
)

NAMESPACE = "conformance.servicebus.windows.net"
HUB = "hub"


class SkewableServerClock:
    """The in-memory store's "server" clock: real time plus an offset we can move."""

    def __init__(self, offset: timedelta = timedelta(0)) -> None:
        self.offset = offset

    def __call__(self) -> datetime:
        return datetime.now(timezone.utc) + self.offset


@dataclass
class Backend:
    name: str
    store: CheckpointStore
    peer: CheckpointStore  # a second client of the same storage, with its own fence cache
    consumer_group: str
    # plants a malformed record; returns the name the store's warning must mention, or
    # None when this store cannot hold such a record
    plant: Callable[[str, str], Awaitable[str | None]]
    server_clock: SkewableServerClock | None = None
    # another client of the same storage whose requests about partition "3" fail as a
    # reset connection would (None in memory, which has no such failure)
    failing_client: Callable[[], CheckpointStore] | None = None

    @property
    def scope(self) -> tuple[str, str, str]:
        return NAMESPACE, HUB, self.consumer_group

    def ownership(self, pid: str, owner: str, *, etag: str | None = None, epoch: int = 1) -> Ownership:
        return Ownership(NAMESPACE, HUB, self.consumer_group, pid, owner, etag=etag, epoch=epoch)

    def checkpoint(self, pid: str, seq: int) -> Checkpoint:
        return Checkpoint(NAMESPACE, HUB, self.consumer_group, pid, sequence_number=seq, offset=str(seq * 100))

    def member(self, owner: str, **properties: str) -> Member:
        return Member(NAMESPACE, HUB, self.consumer_group, owner, properties=properties)

    async def listing(self, store: CheckpointStore | None = None):
        return await (store or self.store).list_ownership(*self.scope)

    async def records(self, store: CheckpointStore | None = None) -> dict:
        return {r.partition_id: r for r in (await self.listing(store)).ownerships}

    async def checkpoints(self) -> dict:
        return {c.partition_id: c for c in await self.store.list_checkpoints(*self.scope)}

    async def claim(self, store: CheckpointStore, pid: str, owner: str) -> Ownership:
        """Claim ``pid`` for ``owner`` one epoch above whatever is there, as a processor does."""
        current = (await self.records(store)).get(pid)
        claim = (self.ownership(pid, owner) if current is None
                 else replace(current, owner_id=owner, epoch=current.epoch + 1, requested_by=""))
        [won] = await store.claim_ownership([claim])
        return won


def hook_reads(store: Any, kind: Kind, after_read: Callable[[Any], Awaitable[None]]) -> None:
    """Run ``after_read(record)`` once, right after ``store``'s next real read of a
    ``kind`` record: whatever it does happens between that read and the write that follows."""
    backend = store.backend
    real_read = backend.read
    pending = [True]

    async def read(kind_: Kind, *args: Any, **kwargs: Any) -> Any:
        record = await real_read(kind_, *args, **kwargs)
        if kind_ == kind and pending:
            pending.clear()
            await after_read(record)
        return record

    backend.read = read


# ------------------------------------------------------------------ corruption planters

# kind -> (record kind, fields) of a malformed record, for stores that keep fields as strings
# (blob metadata); the Table and memory planters adapt.
_PLANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ownership-no-owner": ("ownership", {"epoch": "1"}),
    "ownership-bad-epoch": ("ownership", {"ownerid": "someone", "epoch": "abc"}),
    "ownership-epoch-too-big": ("ownership", {"ownerid": "someone", "epoch": str(MAX_EPOCH)}),
    "ownership-foreign": ("ownership", {"note": "not ours"}),
    "checkpoint-bad-sequence": ("checkpoint", {"sequencenumber": "abc", "offset": "1"}),
    "checkpoint-bad-epoch": ("checkpoint", {"sequencenumber": "5", "offset": "1", "epoch": "-1"}),
    "checkpoint-sequence-too-big": ("checkpoint", {"sequencenumber": str(2**63), "offset": "1"}),
    "foreign-checkpoint": ("checkpoint", {}),
}


def _memory_planter(store: InMemoryCheckpointStore, consumer_group: str) -> Callable[[str, str], Awaitable[str | None]]:
    async def plant(kind: str, pid: str) -> str | None:
        if kind == "foreign-deeper":
            store.plant_record("ownership", NAMESPACE, HUB, consumer_group, f"{pid}/notes.txt", {"ownerid": "x"})
            return f"ownership record '{pid}/notes.txt'"
        if kind == "ownership-owner-not-string":
            store.plant_record("ownership", NAMESPACE, HUB, consumer_group, pid, {"ownerid": 42})
            return f"ownership record '{pid}'"
        record_kind, fields = _PLANTS[kind]
        store.plant_record(record_kind, NAMESPACE, HUB, consumer_group, pid, fields)
        return f"{record_kind} record '{pid}'"

    return plant


def _blob_planter(container: Any, consumer_group: str) -> Callable[[str, str], Awaitable[str | None]]:
    base = f"{NAMESPACE}/{HUB}/{consumer_group}".lower()

    async def plant(kind: str, pid: str) -> str | None:
        if kind == "ownership-owner-not-string":
            return None  # blob metadata is always text
        if kind == "foreign-deeper":
            name, metadata, data = f"{base}/ownership/{pid}/notes.txt", {"ownerid": "x"}, b"hello"
        else:
            record_kind, metadata = _PLANTS[kind]
            name, data = f"{base}/{record_kind}/{pid}", (b"" if metadata else b"not a record")
        await container.get_blob_client(name).upload_blob(data, overwrite=True, metadata=metadata)
        return name

    return plant


def _table_planter(table: Any, consumer_group: str) -> Callable[[str, str], Awaitable[str | None]]:
    prefix = f"{NAMESPACE} {HUB} {consumer_group}"

    async def plant(kind: str, pid: str) -> str | None:
        if kind == "foreign-deeper":
            return None  # a table has no deeper paths
        if kind == "ownership-owner-not-string":
            record_kind, fields = "ownership", {"ownerid": 42}
        else:
            record_kind, fields = _PLANTS[kind]
        if record_kind == "checkpoint" and "epoch" in fields:
            fields = dict(fields, epoch=int(fields["epoch"]))  # the Table store writes Int64 epochs
        await table.upsert_entity({"PartitionKey": f"{prefix} {record_kind.capitalize()}", "RowKey": pid, **fields})
        return f"RowKey={pid!r}"

    return plant


def _postgres_planter(dsn: str, table: str, consumer_group: str) -> Callable[[str, str], Awaitable[str | None]]:
    import asyncpg

    async def plant(kind: str, pid: str) -> str | None:
        if kind == "foreign-deeper":
            return None  # a table has no deeper paths
        if kind == "ownership-owner-not-string":
            record_kind, fields = "ownership", {"ownerid": 42}
        else:
            record_kind, fields = _PLANTS[kind]
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(
                f'''INSERT INTO "{table}" (namespace, eventhub, consumer_group, kind, log, key, version, fields,
                modified) VALUES ($1, $2, $3, $4, '', $5, nextval('"{table}_version"'), $6::jsonb, clock_timestamp())
                ON CONFLICT (namespace, eventhub, consumer_group, kind, log, key) DO UPDATE
                SET version = EXCLUDED.version, fields = EXCLUDED.fields, modified = EXCLUDED.modified''',
                NAMESPACE, HUB, consumer_group, record_kind, pid, json.dumps(fields))
        finally:
            await connection.close()
        return f"{record_kind} record '{pid}'"

    return plant


def _failing_postgres_connection() -> type:
    """An asyncpg connection whose statements about partition "3" fail before they are
    sent, as on a reset connection (a fault on the wire; the database is not mocked)."""
    import asyncpg

    class FailingOnPartition3(asyncpg.Connection):
        def _fails(self, args: tuple) -> bool:
            return len(args) >= 6 and args[3] in ("ownership", "checkpoint") and args[5] == "3"

        async def fetchrow(self, query: str, *args: Any, **kwargs: Any) -> Any:
            if self._fails(args):
                raise ConnectionResetError("injected: connection reset by peer")
            return await super().fetchrow(query, *args, **kwargs)

    return FailingOnPartition3


async def _postgres_backend(dsn: str, consumer_group: str) -> AsyncIterator[Backend]:
    import asyncpg

    from eventprocessor.stores import PostgresCheckpointStore

    table = f"conf_{uuid.uuid4().hex[:12]}"
    store = PostgresCheckpointStore(dsn=dsn, table=table)
    peer = PostgresCheckpointStore(dsn=dsn, table=table)
    try:
        await store.list_ownership(NAMESPACE, HUB, consumer_group)  # creates the table
        yield Backend("postgres", store, peer, consumer_group, _postgres_planter(dsn, table, consumer_group),
                      failing_client=lambda: PostgresCheckpointStore(
                          dsn=dsn, table=table, connect_options={"connection_class": _failing_postgres_connection()}))
    finally:
        await store.close()
        await peer.close()
        connection = await asyncpg.connect(dsn)
        try:
            await connection.execute(f'DROP TABLE IF EXISTS "{table}"; DROP SEQUENCE IF EXISTS "{table}_version"')
        finally:
            await connection.close()


# --------------------------------------------------------------------------- fixture


@pytest.fixture(params=["memory", "blob", "table", "postgres"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    consumer_group = f"cg-{uuid.uuid4().hex[:8]}"
    if request.param == "memory":
        clock = SkewableServerClock()
        store = InMemoryCheckpointStore(clock=clock)
        yield Backend("memory", store, store.new_client(), consumer_group, _memory_planter(store, consumer_group),
                      clock)
        return
    if request.param == "postgres":
        async for backend in _postgres_backend(request.getfixturevalue("postgres").dsn, consumer_group):
            yield backend
        return

    azurite = request.getfixturevalue("azurite")
    if request.param == "blob":
        from azure.storage.blob.aio import ContainerClient

        from eventprocessor.stores import BlobCheckpointStore

        container = f"conf-{uuid.uuid4().hex[:12]}"
        store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
        peer = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
        raw = ContainerClient.from_connection_string(azurite.connection_string, container)
        try:
            await store.list_ownership(NAMESPACE, HUB, consumer_group)  # creates the container
            yield Backend("blob", store, peer, consumer_group, _blob_planter(raw, consumer_group),
                          failing_client=lambda: BlobCheckpointStore.from_connection_string(
                              azurite.connection_string, container, transport=_failing_transport(_is_partition_3),
                              retry_total=0))
        finally:
            await raw.delete_container()
            await raw.close()
            await store.close()
            await peer.close()
        return

    from azure.data.tables.aio import TableClient

    from eventprocessor.stores import TableCheckpointStore

    table_name = f"conf{uuid.uuid4().hex[:12]}"
    store = TableCheckpointStore.from_connection_string(azurite.connection_string, table_name)
    peer = TableCheckpointStore.from_connection_string(azurite.connection_string, table_name)
    raw = TableClient.from_connection_string(azurite.connection_string, table_name)
    try:
        await store.list_ownership(NAMESPACE, HUB, consumer_group)  # creates the table
        yield Backend("table", store, peer, consumer_group, _table_planter(raw, consumer_group),
                      failing_client=lambda: TableCheckpointStore.from_connection_string(
                          azurite.connection_string, table_name, transport=_failing_transport(_is_partition_3),
                          retry_total=0))
    finally:
        await raw.delete_table()
        await raw.close()
        await store.close()
        await peer.close()


# ---------------------------------------------------------------------------- claims


async def test_two_concurrent_claims_on_the_same_etag_exactly_one_wins(backend: Backend) -> None:
    pids = [str(i) for i in range(8)]
    created = await backend.store.claim_ownership([backend.ownership(p, "a") for p in pids])
    assert {r.partition_id for r in created} == set(pids)

    b_claims = [replace(r, owner_id="b", epoch=2) for r in created]
    c_claims = [replace(r, owner_id="c", epoch=2) for r in created]
    won_b, won_c = await asyncio.gather(backend.store.claim_ownership(b_claims),
                                        backend.peer.claim_ownership(c_claims))

    winners = {r.partition_id: r for r in won_b + won_c}
    assert len(won_b) + len(won_c) == len(pids), "every partition has exactly one winner"
    assert set(winners) == set(pids)
    stored = await backend.records()
    for pid, winner in winners.items():
        assert stored[pid].owner_id == winner.owner_id
        assert stored[pid].etag == winner.etag
        assert stored[pid].epoch == 2
        assert winner.etag != created[int(pid)].etag


async def test_two_concurrent_creates_exactly_one_wins(backend: Backend) -> None:
    pids = [str(i) for i in range(8)]
    won_b, won_c = await asyncio.gather(
        backend.store.claim_ownership([backend.ownership(p, "b") for p in pids]),
        backend.peer.claim_ownership([backend.ownership(p, "c") for p in pids]),
    )
    assert len(won_b) + len(won_c) == len(pids)
    assert {r.partition_id for r in won_b}.isdisjoint({r.partition_id for r in won_c})
    stored = await backend.records()
    for record in won_b + won_c:
        assert stored[record.partition_id].owner_id == record.owner_id
        assert stored[record.partition_id].etag == record.etag


async def test_create_of_an_existing_record_loses_without_error(backend: Backend) -> None:
    [first] = await backend.store.claim_ownership([backend.ownership("0", "a")])
    assert await backend.peer.claim_ownership([backend.ownership("0", "b")]) == []
    assert (await backend.records())["0"].owner_id == "a"
    assert (await backend.records())["0"].etag == first.etag


async def test_stale_etag_loses(backend: Backend) -> None:
    [mine] = await backend.store.claim_ownership([backend.ownership("0", "a")])
    [stolen] = await backend.peer.claim_ownership([replace(mine, owner_id="b", epoch=2)])
    assert stolen.etag != mine.etag

    assert await backend.store.claim_ownership([mine]) == []  # a's renewal with its old etag
    record = (await backend.records())["0"]
    assert (record.owner_id, record.epoch, record.etag) == ("b", 2, stolen.etag)


async def test_claim_results_carry_the_new_etag_and_time(backend: Backend) -> None:
    [first] = await backend.store.claim_ownership([backend.ownership("0", "a")])
    [renewed] = await backend.store.claim_ownership([first])
    assert first.etag and renewed.etag and renewed.etag != first.etag
    assert renewed.last_modified_time is not None and renewed.last_modified_time >= first.last_modified_time
    listing = await backend.listing()
    [listed] = listing.ownerships
    assert listed.etag == renewed.etag
    assert listed.last_modified_time <= listing.server_time + timedelta(seconds=1)


async def test_release_then_claim_by_another_owner(backend: Backend) -> None:
    [mine] = await backend.store.claim_ownership([backend.ownership("0", "a", epoch=3)])
    assert await backend.store.release_ownership(mine) is True

    released = (await backend.records(backend.peer))["0"]
    assert released.is_released and released.owner_id == ""
    assert released.epoch == 3, "release keeps the epoch so the next owner's is higher"
    assert await backend.store.release_ownership(mine) is False, "a stale release is refused"

    [taken] = await backend.peer.claim_ownership([replace(released, owner_id="b", epoch=released.epoch + 1)])
    record = (await backend.records())["0"]
    assert (record.owner_id, record.epoch, record.etag) == ("b", 4, taken.etag)


# ----------------------------------------------------------------------- checkpoints


async def _fenced_owner(backend: Backend, pid: str = "0", seq: int | None = 10) -> Ownership:
    """"old" claims ``pid`` on ``backend.store``, fences it and checkpoints ``seq``."""
    old = await backend.claim(backend.store, pid, "old")
    assert await backend.store.fence_checkpoint(old) is None
    if seq is not None:
        await backend.store.update_checkpoint(backend.checkpoint(pid, seq), owner_id="old", epoch=old.epoch)
    return old


async def test_fence_returns_the_position_to_resume_from_and_hides_placeholders(backend: Backend) -> None:
    old = await _fenced_owner(backend, "0", seq=10)
    await _fenced_owner(backend, "1", seq=None)  # fenced, never checkpointed: a placeholder
    assert set(await backend.checkpoints()) == {"0"}, "a placeholder is not a checkpoint"

    new = await backend.claim(backend.peer, "0", "new")
    resume = await backend.peer.fence_checkpoint(new)
    assert resume is not None
    assert (resume.sequence_number, resume.offset, resume.owner_id, resume.epoch) == (10, "1000", "old", old.epoch)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.offset, stored.owner_id, stored.epoch) == (10, "1000", "new", 2), \
        "the fence keeps the position and names the new owner"

    other = await backend.claim(backend.peer, "1", "new")
    assert await backend.peer.fence_checkpoint(other) is None, "a placeholder resumes nowhere"


async def test_the_events_done_beyond_a_checkpoint_fit_every_store_and_a_fence_keeps_them(backend: Backend) -> None:
    """A checkpoint with many events in flight records the events done beyond it in one
    field: at its largest (1,000 characters) every store keeps it, reads it back as
    written, and a new owner's fence keeps it with the position it goes with."""
    old = await _fenced_owner(backend, "0", seq=None)
    ranges, previous = [], 10
    for step in range(400):
        first = previous + 2 + step % 40
        ranges.append((first, first + step % 7))
        previous = first + step % 7
    done = DoneBeyond(tuple(ranges))
    text = done.encode(10)
    assert MAX_DONE_TEXT - 10 < len(text) <= MAX_DONE_TEXT
    kept = DoneBeyond.decode(text, 10)
    await backend.store.update_checkpoint(replace(backend.checkpoint("0", 10), done_beyond=done), owner_id="old",
                                          epoch=old.epoch)
    assert (await backend.checkpoints())["0"].done_beyond == kept
    new = await backend.claim(backend.peer, "0", "new")
    resume = await backend.peer.fence_checkpoint(new)
    assert resume is not None and resume.sequence_number == 10 and resume.done_beyond == kept
    stored = (await backend.checkpoints())["0"]
    assert (stored.owner_id, stored.done_beyond) == ("new", kept)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 12), owner_id="new", epoch=new.epoch)
    assert not (await backend.checkpoints())["0"].done_beyond.ranges, "a later checkpoint says what it holds"


async def test_after_b_claims_and_fences_a_checkpoint_write_fails_and_b_stays(backend: Backend) -> None:
    old = await _fenced_owner(backend)
    new = await backend.claim(backend.peer, "0", "new")
    await backend.peer.fence_checkpoint(new)

    with pytest.raises(OwnershipLostError) as raised:
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=old.epoch)
    assert raised.value.partition_id == "0"
    assert not isinstance(raised.value, StaleEpochError), "the partition was taken, not its epoch lost"
    await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 25), owner_id="old", epoch=old.epoch)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (20, "new", 2)


async def test_a_first_ever_write_after_b_fenced_fails(backend: Backend) -> None:
    """A has claimed, never fenced and never checkpointed. It verifies its ownership and
    finds no checkpoint; before its create-if-absent arrives, B claims and fences
    (creating the placeholder). A's create gets 409 and A stops; B's record stays."""
    old = await backend.claim(backend.store, "0", "old")
    fenced: list[Ownership] = []

    async def b_claims_and_fences(record: Any) -> None:
        assert record is None, "A saw no checkpoint"
        new = await backend.claim(backend.peer, "0", "new")
        await backend.peer.fence_checkpoint(new)
        fenced.append(new)

    hook_reads(backend.store, CHECKPOINT, b_claims_and_fences)
    before = Counter(backend.store.request_counts)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=old.epoch)
    assert fenced and (Counter(backend.store.request_counts) - before)["create_checkpoint"] >= 1, \
        "A's create reached the store"
    assert await backend.checkpoints() == {}, "only B's placeholder is there"
    await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=fenced[0].epoch)
    assert (await backend.checkpoints())["0"].sequence_number == 20


async def test_a_verified_write_racing_a_steal_never_overwrites_the_new_owner(backend: Backend) -> None:
    """A, without a fence of its own, verifies that it owns the partition and reads the
    checkpoint etag; then B claims, fences and checkpoints; then A's write arrives. It
    fails (412), A re-reads, sees B's epoch, and stops."""
    old = await backend.claim(backend.store, "0", "old")
    await backend.peer.update_checkpoint(backend.checkpoint("0", 10), owner_id="old", epoch=old.epoch)

    async def b_steals(record: Any) -> None:
        new = await backend.claim(backend.peer, "0", "new")
        await backend.peer.fence_checkpoint(new)
        await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)

    hook_reads(backend.store, CHECKPOINT, b_steals)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=old.epoch)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (20, "new", 2)


async def test_an_old_owner_write_before_the_fence_is_where_the_new_owner_resumes(backend: Backend) -> None:
    """The old owner checkpoints after the new owner's claim but before its fence: the
    write lands (the old owner really processed those events), the fence keeps it as
    the position to resume from, and every later write of the old owner fails."""
    old = await _fenced_owner(backend)
    new = await backend.claim(backend.peer, "0", "new")
    await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=old.epoch)
    resume = await backend.peer.fence_checkpoint(new)
    assert resume is not None and (resume.sequence_number, resume.owner_id) == (15, "old")
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 16), owner_id="old", epoch=old.epoch)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)
    assert (await backend.checkpoints())["0"].sequence_number == 20


async def test_one_request_per_checkpoint_after_the_fence(backend: Backend) -> None:
    won = await backend.claim(backend.store, "0", "a")
    counts = backend.store.request_counts  # type: ignore[attr-defined]
    before = Counter(counts)
    assert await backend.store.fence_checkpoint(won) is None
    assert Counter(counts) - before == Counter(create_checkpoint=1), \
        "a partition's first claim, created by this store, fences with one create-if-absent"

    before = Counter(counts)
    for seq in range(10):
        await backend.store.update_checkpoint(backend.checkpoint("0", seq), owner_id="a", epoch=won.epoch)
    assert Counter(counts) - before == Counter(replace_checkpoint=10), "one conditional write per checkpoint"
    [renewed] = await backend.store.claim_ownership([won])  # a renewal keeps the fence
    before = Counter(counts)
    await backend.store.update_checkpoint(backend.checkpoint("0", 10), owner_id="a", epoch=renewed.epoch)
    assert Counter(counts) - before == Counter(replace_checkpoint=1)
    assert (await backend.checkpoints())["0"].sequence_number == 10


async def test_without_a_fence_a_checkpoint_verifies_ownership_first(backend: Backend) -> None:
    won = await backend.claim(backend.store, "0", "a")
    counts = backend.store.request_counts  # type: ignore[attr-defined]
    before = Counter(counts)
    await backend.store.update_checkpoint(backend.checkpoint("0", 1), owner_id="a", epoch=won.epoch)
    assert Counter(counts) - before == Counter(read_ownership=1, read_checkpoint=1, create_checkpoint=1)
    before = Counter(counts)
    await backend.store.update_checkpoint(backend.checkpoint("0", 2), owner_id="a", epoch=won.epoch)
    assert Counter(counts) - before == Counter(replace_checkpoint=1), "its own write is as good as a fence"


async def test_a_fence_reads_ownership_and_checkpoint_unless_this_store_created_the_first_claim(
        backend: Backend) -> None:
    """Three requests for every other fence: a steal (epoch 2), and a first claim that
    another store instance created (it did not see the create's answer)."""
    await _fenced_owner(backend, "0", seq=10)
    new = await backend.claim(backend.peer, "0", "new")
    counts = backend.peer.request_counts  # type: ignore[attr-defined]
    before = Counter(counts)
    await backend.peer.fence_checkpoint(new)
    assert Counter(counts) - before == Counter(read_ownership=1, read_checkpoint=1, replace_checkpoint=1)

    first = await backend.claim(backend.store, "1", "b")
    before = Counter(counts)
    assert await backend.peer.fence_checkpoint(first) is None
    assert Counter(counts) - before == Counter(read_ownership=1, read_checkpoint=1, create_checkpoint=1)


async def test_a_first_claim_over_a_checkpoint_left_without_its_ownership_record_resumes_from_it(
        backend: Backend) -> None:
    """The ownership records were deleted (a wiped prefix, a new deployment) but a
    checkpoint is left: the next first claim's create-if-absent finds it, the full fence
    reads it and refuses an epoch not above its own (``StaleEpochError``, as the
    processor's claimer expects), and the claim one epoch above it resumes from it."""
    await _fenced_owner(backend, "0", seq=10)
    await backend.store.backend.delete(OWNERSHIP, backend.scope, "0")  # type: ignore[attr-defined]
    again = await backend.claim(backend.peer, "0", "new")
    assert again.epoch == 1
    with pytest.raises(StaleEpochError) as raised:
        await backend.peer.fence_checkpoint(again)
    assert raised.value.stored_epoch == 1
    [above] = await backend.peer.claim_ownership([replace(again, epoch=2)])
    resume = await backend.peer.fence_checkpoint(above)
    assert resume is not None and (resume.sequence_number, resume.owner_id) == (10, "old")
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 11), owner_id="old", epoch=1)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 12), owner_id="new", epoch=2)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (12, "new", 2)


async def test_a_first_claim_stolen_and_fenced_before_its_own_fence_is_refused(backend: Backend) -> None:
    first = await backend.claim(backend.store, "0", "a")
    stolen = await backend.claim(backend.peer, "0", "b")
    await backend.peer.fence_checkpoint(stolen)
    with pytest.raises(OwnershipLostError) as raised:
        await backend.store.fence_checkpoint(first)
    assert not isinstance(raised.value, StaleEpochError)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 5), owner_id="b", epoch=stolen.epoch)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (5, "b", 2)


async def test_a_first_claim_fenced_then_stolen_and_fenced_cannot_write_again(backend: Backend) -> None:
    first = await backend.claim(backend.store, "0", "a")
    stolen = await backend.claim(backend.peer, "0", "b")
    assert await backend.store.fence_checkpoint(first) is None  # before b's fence: one create
    await backend.store.update_checkpoint(backend.checkpoint("0", 3), owner_id="a", epoch=first.epoch)
    resume = await backend.peer.fence_checkpoint(stolen)
    assert resume is not None and (resume.sequence_number, resume.owner_id) == (3, "a"), \
        "a's write before b's fence is where b resumes"
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 4), owner_id="a", epoch=first.epoch)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (3, "b", 2)


async def test_the_fence_cache_is_per_epoch(backend: Backend) -> None:
    """A processor re-claims its own partition at a new epoch (its lease had run out)
    and fences again; a pump of its first claim, still running, must not write with the
    new fence's etag (a cache keyed by owner alone would let it)."""
    first = await _fenced_owner(backend, seq=10)
    again = await backend.claim(backend.store, "0", "old")
    assert again.epoch == first.epoch + 1
    await backend.store.fence_checkpoint(again)
    await backend.store.update_checkpoint(backend.checkpoint("0", 20), owner_id="old", epoch=again.epoch)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=first.epoch)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.epoch) == (20, again.epoch)


async def test_another_client_of_the_same_owner_is_not_a_conflict(backend: Backend) -> None:
    """The same (owner, epoch) wrote through another client: the cached etag is stale,
    the write gets 412, the re-read shows this very owner, and it retries with that etag."""
    won = await _fenced_owner(backend, seq=10)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 12), owner_id="old", epoch=won.epoch)
    await backend.store.update_checkpoint(backend.checkpoint("0", 13), owner_id="old", epoch=won.epoch)
    assert (await backend.checkpoints())["0"].sequence_number == 13


async def test_checkpoint_without_ownership_or_after_release_is_refused(backend: Backend) -> None:
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 1), owner_id="a", epoch=1)
    [mine] = await backend.store.claim_ownership([backend.ownership("0", "a", epoch=1)])
    await backend.store.fence_checkpoint(mine)
    await backend.store.update_checkpoint(backend.checkpoint("0", 2), owner_id="a", epoch=1)
    with pytest.raises(OwnershipLostError):  # same owner, wrong epoch
        await backend.store.update_checkpoint(backend.checkpoint("0", 3), owner_id="a", epoch=2)
    assert await backend.store.release_ownership(mine)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 4), owner_id="a", epoch=1)
    with pytest.raises(OwnershipLostError):
        await backend.store.fence_checkpoint(mine)
    assert (await backend.checkpoints())["0"].sequence_number == 2


async def test_checkpoint_of_a_later_epoch_is_never_overwritten(backend: Backend) -> None:
    # A partition back with "a" at epoch 3 while the checkpoint says epoch 5 (the
    # ownership record lost its epoch): "a" must not roll it back, and is told to
    # claim above 5.
    [b] = await backend.store.claim_ownership([backend.ownership("0", "b", epoch=5)])
    await backend.store.fence_checkpoint(b)
    await backend.store.update_checkpoint(backend.checkpoint("0", 50), owner_id="b", epoch=5)
    listed = (await backend.records())["0"]
    [a] = await backend.store.claim_ownership([replace(listed, owner_id="a", epoch=3)])
    with pytest.raises(StaleEpochError) as raised:
        await backend.peer.update_checkpoint(backend.checkpoint("0", 40), owner_id="a", epoch=3)
    assert raised.value.stored_epoch == 5
    with pytest.raises(StaleEpochError) as raised:
        await backend.peer.fence_checkpoint(a)
    assert raised.value.stored_epoch == 5 and raised.value.partition_id == "0"
    assert (await backend.checkpoints())["0"].sequence_number == 50

    [again] = await backend.store.claim_ownership([replace(a, owner_id="a", epoch=6)])
    resume = await backend.peer.fence_checkpoint(again)
    assert resume is not None and resume.sequence_number == 50


async def test_fence_by_a_processor_that_does_not_own_the_partition_is_refused(backend: Backend) -> None:
    won = await backend.claim(backend.store, "0", "a")
    with pytest.raises(OwnershipLostError) as raised:
        await backend.store.fence_checkpoint(replace(won, owner_id="b"))
    assert not isinstance(raised.value, StaleEpochError)
    with pytest.raises(OwnershipLostError):
        await backend.store.fence_checkpoint(backend.ownership("9", "a"))  # no record at all
    assert await backend.checkpoints() == {}


async def test_list_after_many_writes(backend: Backend) -> None:
    pids = [str(i) for i in range(16)]
    records = {r.partition_id: r for r in await backend.store.claim_ownership(
        [backend.ownership(p, "a") for p in pids])}
    for round_ in range(1, 4):
        renewed = await backend.store.claim_ownership(list(records.values()))
        assert len(renewed) == len(pids)
        records = {r.partition_id: r for r in renewed}
        await asyncio.gather(*(backend.store.update_checkpoint(
            backend.checkpoint(p, round_ * 1000 + int(p)), owner_id="a", epoch=1) for p in pids))

    stored = await backend.records(backend.peer)
    assert set(stored) == set(pids)
    for pid in pids:
        assert (stored[pid].owner_id, stored[pid].epoch, stored[pid].etag) == ("a", 1, records[pid].etag)
    checkpoints = await backend.checkpoints()
    assert {p: c.sequence_number for p, c in checkpoints.items()} == {p: 3000 + int(p) for p in pids}
    assert {c.offset for c in checkpoints.values()} == {str((3000 + int(p)) * 100) for p in pids}
    assert all((c.owner_id, c.epoch) == ("a", 1) for c in checkpoints.values())


async def test_1024_partitions(backend: Backend) -> None:
    pids = [str(i) for i in range(1024)]
    won = await backend.store.claim_ownership([backend.ownership(p, f"owner-{int(p) % 7}", epoch=1 + int(p) % 3)
                                               for p in pids])
    assert len(won) == 1024
    by_pid = {r.partition_id: r for r in won}

    stored = await backend.records(backend.peer)
    assert set(stored) == set(pids)
    for pid in pids:
        record = stored[pid]
        assert record.owner_id == f"owner-{int(pid) % 7}"
        assert record.epoch == 1 + int(pid) % 3
        assert record.etag == by_pid[pid].etag
        assert (record.fully_qualified_namespace, record.eventhub_name, record.consumer_group) == backend.scope


# ------------------------------------------------------------------- other failures


def _failing_transport(should_fail: Callable[[str], bool]) -> Any:
    """A real HTTP transport to Azurite that drops the requests ``should_fail`` picks, as a
    reset connection would (fault injection on the wire; the storage is not mocked)."""
    from azure.core.exceptions import ServiceResponseError
    from azure.core.pipeline.transport import AioHttpTransport

    class FailingTransport(AioHttpTransport):
        async def send(self, request: Any, **kwargs: Any) -> Any:
            if should_fail(request.url):
                raise ServiceResponseError("injected: connection reset by peer")
            return await super().send(request, **kwargs)

    return FailingTransport()


def _is_partition_3(url: str) -> bool:
    return bool(re.search(r"/(ownership|checkpoint)/3(\?|$)", url)) or "RowKey='3'" in url


async def test_an_unexpected_failure_is_never_a_won_claim(backend: Backend) -> None:
    if backend.failing_client is None:
        pytest.skip("the in-memory store has no failure mode besides lost races")

    created = await backend.store.claim_ownership([backend.ownership(str(p), "a") for p in range(6)])
    async with backend.failing_client() as flaky:
        with pytest.raises(ClaimOwnershipError) as raised:
            await flaky.claim_ownership([replace(r, owner_id="b", epoch=2) for r in created])
    error = raised.value
    assert sorted(r.partition_id for r in error.claimed) == ["0", "1", "2", "4", "5"], "won claims are kept"
    assert set(error.failures) == {"3"} and isinstance(error.failures["3"], CheckpointStoreError)
    assert "3" in str(error)
    stored = await backend.records()
    assert stored["3"].owner_id == "a" and all(stored[p].owner_id == "b" for p in "01245")


async def test_an_unexpected_checkpoint_failure_is_not_ownership_lost(backend: Backend) -> None:
    if backend.failing_client is None:
        pytest.skip("the in-memory store has no failure mode besides lost races")
    await backend.store.claim_ownership([backend.ownership("3", "a")])
    async with backend.failing_client() as flaky:
        with pytest.raises(CheckpointStoreError) as raised:
            await flaky.update_checkpoint(backend.checkpoint("3", 1), owner_id="a", epoch=1)
    assert not isinstance(raised.value, OwnershipLostError)
    assert await backend.checkpoints() == {}


# ------------------------------------------------------------------------ server time


def _judge(listing: Any, owner_id: str, expiry: float) -> list[str]:
    """What the real balancer would claim for ``owner_id`` from this listing."""
    decision = decide(listing, ["0"], owner_id, fully_qualified_namespace=NAMESPACE, eventhub_name=HUB,
                      consumer_group=listing.ownerships[0].consumer_group if listing.ownerships else "",
                      strategy=LoadBalancingStrategy.BALANCED, expiration_interval=expiry,
                      renew_after=expiry / 2, rng=random.Random(7))
    return [c.partition_id for c in decision.claims]


async def test_expiry_is_judged_on_the_store_clock_not_a_skewed_local_clock(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    skew = timedelta(minutes=10)
    real_time = time.time

    if backend.server_clock is not None:
        # In memory the store's clock is the "server": put it 10 minutes ahead of ours.
        backend.server_clock.offset = skew
    else:
        # On Azurite the server clock is Azurite's: put this process 10 minutes ahead.
        monkeypatch.setattr(time, "time", lambda: real_time() + skew.total_seconds())

    def local_now() -> datetime:
        return datetime.fromtimestamp(time.time(), timezone.utc)

    [mine] = await backend.store.claim_ownership([backend.ownership("0", "a")])
    listing = await backend.listing(backend.peer)
    [record] = listing.ownerships
    server_age = (listing.server_time - record.last_modified_time).total_seconds()
    # Date and Last-Modified have 1-second resolution on Azure; a slow machine adds a bit.
    assert -1.0 <= server_age < 10, "server_time comes from the store that wrote last_modified"
    assert abs((local_now() - listing.server_time).total_seconds()) > 500, "the local clock really is off"
    assert _judge(listing, "b", expiry=30) == [], "a live partition is not stolen"

    # Let the lease run out on the store's clock while the local clock says it is fresh.
    expiry = 1.0
    if backend.server_clock is not None:
        backend.server_clock.offset = skew + timedelta(seconds=expiry + 1)
    else:
        monkeypatch.setattr(time, "time", lambda: real_time() - skew.total_seconds())
        await asyncio.sleep(expiry + 1.05)  # whole seconds on the server: the age is then >= 2 s
    listing = await backend.listing(backend.peer)
    [record] = listing.ownerships
    assert (listing.server_time - record.last_modified_time).total_seconds() > expiry
    assert (local_now() - record.last_modified_time).total_seconds() < 0, "locally it looks brand new"
    assert _judge(listing, "b", expiry) == ["0"], "an expired partition is taken over"
    [taken] = await backend.peer.claim_ownership([replace(record, owner_id="b", epoch=record.epoch + 1)])
    assert taken.owner_id == "b" and mine.etag != taken.etag


# ---------------------------------------------------------------------- bad records


UNREADABLE_OWNERSHIP = [
    ("ownership-no-owner", "7", "no ownerid"),
    ("ownership-bad-epoch", "8", "not an integer"),
    ("ownership-epoch-too-big", "9", "out of range"),
    ("ownership-foreign", "6", "no ownerid"),
    ("ownership-owner-not-string", "5", "not a string"),
]


async def test_unreadable_ownership_records_are_reported_and_can_be_claimed_over(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    await backend.store.claim_ownership([backend.ownership("0", "a")])
    planted = {pid: (await backend.plant(kind, pid), reason) for kind, pid, reason in UNREADABLE_OWNERSHIP}
    planted = {pid: value for pid, value in planted.items() if value[0] is not None}
    deeper = await backend.plant("foreign-deeper", "4")

    caplog.set_level(logging.WARNING)
    listing = await backend.listing()
    assert [o.partition_id for o in listing.ownerships] == ["0"]
    unreadable = {u.partition_id: u for u in listing.unreadable}
    assert set(unreadable) == set(planted), "a foreign object at a deeper path is no partition's record"
    for pid, (_name, reason) in planted.items():
        assert reason in unreadable[pid].reason
        assert unreadable[pid].etag and unreadable[pid].last_modified_time is not None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for name, _reason in list(planted.values()) + ([(deeper, "")] if deeper else []):
        assert any(name in message for message in warnings), f"no warning names {name}"
    caplog.clear()
    await backend.listing()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "one warning per bad record, not per tick"

    # Its partition cannot be checkpointed by anyone, and once expired it is claimed
    # over with a write conditional on the unreadable record's etag, at an epoch the
    # claimer chose.
    some = next(iter(planted))
    with pytest.raises(OwnershipLostError, match="unreadable"):
        await backend.store.update_checkpoint(backend.checkpoint(some, 1), owner_id="someone", epoch=1)
    kind = next(k for k, p, _r in UNREADABLE_OWNERSHIP if p == some)
    await backend.plant(kind, some)  # rewritten meanwhile: the etag listed is stale now
    won = await backend.peer.claim_ownership(
        [backend.ownership(pid, "b", etag=unreadable[pid].etag, epoch=7) for pid in planted])
    assert {r.partition_id for r in won} == set(planted) - {some}, "a stale etag still loses"
    [fresh] = (await backend.listing()).unreadable
    assert await backend.peer.claim_ownership([backend.ownership(some, "b", etag=fresh.etag, epoch=7)])
    listing = await backend.listing()
    assert listing.unreadable == ()
    assert {o.partition_id: (o.owner_id, o.epoch) for o in listing.ownerships if o.partition_id in planted} == {
        pid: ("b", 7) for pid in planted}


BAD_CHECKPOINTS = [
    ("checkpoint-bad-sequence", "1"),
    ("checkpoint-bad-epoch", "2"),
    ("foreign-checkpoint", "3"),
    ("checkpoint-sequence-too-big", "4"),
]


async def test_corrupted_and_foreign_checkpoints_are_skipped_with_a_warning(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    await backend.store.claim_ownership([backend.ownership(p, "a") for p in ("0", "1")])
    await backend.store.update_checkpoint(backend.checkpoint("0", 5), owner_id="a", epoch=1)
    planted = {kind: await backend.plant(kind, pid) for kind, pid in BAD_CHECKPOINTS}

    caplog.set_level(logging.WARNING)
    checkpoints = await backend.checkpoints()
    assert set(checkpoints) == {"0"} and checkpoints["0"].sequence_number == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for kind, name in planted.items():
        assert any(name in message for message in warnings), f"no warning names {kind} record {name}"
    caplog.clear()
    await backend.checkpoints()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "one warning per bad record, not per tick"

    # The owner repairs a corrupted checkpoint by writing over it, or by fencing it.
    await backend.store.update_checkpoint(backend.checkpoint("1", 7), owner_id="a", epoch=1)
    assert (await backend.checkpoints())["1"].sequence_number == 7
    [two] = await backend.store.claim_ownership([backend.ownership("2", "a")])
    assert await backend.store.fence_checkpoint(two) is None, "an unreadable checkpoint is no position"
    await backend.store.update_checkpoint(backend.checkpoint("2", 9), owner_id="a", epoch=1)
    assert (await backend.checkpoints())["2"].sequence_number == 9


# ------------------------------------------------------------------ errors and input


async def test_claim_with_invalid_input_is_a_configuration_error(backend: Backend) -> None:
    with pytest.raises(ConfigurationError):
        await backend.store.claim_ownership([backend.ownership("0", "a", epoch=-1)])
    with pytest.raises(ConfigurationError):
        await backend.store.update_checkpoint(
            replace(backend.checkpoint("0", 1), sequence_number="12"), owner_id="a", epoch=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="owner_id"):
        await backend.store.claim_ownership([backend.ownership("0", "caf\u00e9")])
    assert await backend.records() == {}


@pytest.mark.parametrize("epoch", [-1, MAX_EPOCH, 2**63, 2**64])
async def test_epochs_out_of_range_are_refused_on_write_naming_partition_and_value(backend: Backend,
                                                                                   epoch: int) -> None:
    with pytest.raises(ConfigurationError) as raised:
        await backend.store.claim_ownership([backend.ownership("p7", "a", epoch=epoch)])
    assert "'p7'" in str(raised.value) and str(epoch) in str(raised.value)
    with pytest.raises(ConfigurationError, match=str(epoch)):
        await backend.store.update_checkpoint(backend.checkpoint("p7", 1), owner_id="a", epoch=epoch)
    with pytest.raises(ConfigurationError, match=str(epoch)):
        await backend.store.fence_checkpoint(backend.ownership("p7", "a", epoch=epoch))
    assert await backend.records() == {}


@pytest.mark.parametrize("sequence_number", [-1, -2, 2**63])
async def test_sequence_numbers_out_of_range_are_refused_on_write(backend: Backend, sequence_number: int) -> None:
    [won] = await backend.store.claim_ownership([backend.ownership("p3", "a")])
    with pytest.raises(ConfigurationError) as raised:
        await backend.store.update_checkpoint(backend.checkpoint("p3", sequence_number), owner_id="a", epoch=1)
    assert "'p3'" in str(raised.value) and str(sequence_number) in str(raised.value)
    assert await backend.checkpoints() == {}
    assert won.epoch == 1


async def test_the_highest_epoch_and_sequence_number_round_trip(backend: Backend) -> None:
    top = MAX_EPOCH - 1
    [won] = await backend.store.claim_ownership([backend.ownership("0", "a", epoch=top)])
    await backend.store.fence_checkpoint(won)
    await backend.store.update_checkpoint(backend.checkpoint("0", 2**63 - 1), owner_id="a", epoch=top)
    assert (await backend.records())["0"].epoch == top
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.epoch) == (2**63 - 1, top)


def test_checkpoint_store_error_is_not_ownership_lost() -> None:
    # Callers tell a lost race from a broken store by type.
    assert not issubclass(CheckpointStoreError, OwnershipLostError)


# ------------------------------------------------------------------ handoff requests


async def test_a_handoff_request_is_persisted_and_cleared(backend: Backend) -> None:
    won = await backend.claim(backend.store, "0", "a")
    listed = (await backend.records(backend.peer))["0"]
    [asked] = await backend.peer.claim_ownership([replace(listed, requested_by="b")])  # keeps owner and epoch
    record = (await backend.records())["0"]
    assert (record.owner_id, record.epoch, record.requested_by, record.etag) == ("a", won.epoch, "b", asked.etag)
    assert await backend.store.claim_ownership([won]) == [], "the owner's renewal with its old etag loses"
    assert await backend.store.release_ownership(record), "the owner hands over"
    handed = (await backend.records())["0"]
    assert (handed.owner_id, handed.requested_by, handed.epoch) == ("", "", won.epoch)
    [taken] = await backend.peer.claim_ownership([replace(handed, owner_id="b", epoch=handed.epoch + 1)])
    assert (await backend.records())["0"].requested_by == ""
    assert taken.owner_id == "b"


# --------------------------------------------------------------------------- members


async def test_members_are_written_listed_and_deleted(backend: Backend) -> None:
    odd = "Proc A/#1?%"  # upper case and characters no blob name or RowKey may hold
    written = await backend.store.write_member(backend.member(odd, strategy="balanced", ordinal="3"))
    await backend.peer.write_member(backend.member("proc a/#1?%"))  # differs only in case: another member
    assert written.etag and written.last_modified_time is not None
    listing = await backend.store.list_members(*backend.scope)
    members = {m.owner_id: m for m in listing.members}
    assert set(members) == {odd, "proc a/#1?%"}
    assert dict(members[odd].properties) == {"strategy": "balanced", "ordinal": "3"}
    assert members[odd].etag == written.etag
    assert timedelta(seconds=-1) <= listing.server_time - members[odd].last_modified_time < timedelta(seconds=30)

    again = await backend.store.write_member(backend.member(odd, strategy="greedy"))
    assert again.etag != written.etag and dict(again.properties) == {"strategy": "greedy"}
    await backend.store.delete_member(again)
    await backend.store.delete_member(again)  # twice is fine
    assert [m.owner_id for m in (await backend.peer.list_members(*backend.scope)).members] == ["proc a/#1?%"]
    assert (await backend.listing()).ownerships == (), "members are not ownership records"


async def test_a_change_notice_changes_the_generation_every_member_listing_returns(backend: Backend) -> None:
    """What a tick at rest reads: one listing of the members carries the change notice's
    generation; an announcement by any client changes it, and it is never a member."""
    await backend.store.write_member(backend.member("a", lease="member"))
    first = await backend.peer.list_members(*backend.scope)
    assert first.generation is None and [m.owner_id for m in first.members] == ["a"]
    await backend.store.announce_change(*backend.scope)
    seen = await backend.peer.list_members(*backend.scope)
    assert seen.generation is not None and [m.owner_id for m in seen.members] == ["a"]
    assert (await backend.peer.list_members(*backend.scope)).generation == seen.generation  # nothing changed
    await backend.peer.announce_change(*backend.scope)
    after = await backend.store.list_members(*backend.scope)
    assert after.generation not in (None, seen.generation)
    _ownership, together = await backend.store.list_ownership_and_members(*backend.scope)
    assert together is not None and together.generation == after.generation  # the tick's one listing too
    assert [m.owner_id for m in together.members] == ["a"]
    assert (await backend.listing()).ownerships == (), "the change notice is not an ownership record"


async def test_a_heartbeat_after_a_claim_lists_no_earlier_than_it_in_the_ticks_one_listing(backend: Backend) -> None:
    """What judging a record by its owner's heartbeat needs (docs/concepts/leases.md): in
    the one listing a tick reads, a member record rewritten after a claim carries a
    last-modified time no earlier than the claim's, both on the store's clock, and the
    listing's server time is no earlier than either (less the second of resolution of an
    HTTP Date header, which the lease's safety margin covers). Rewriting the member record
    changes nothing of the ownership record (no per-partition write)."""
    won = await backend.claim(backend.store, "0", "a")
    await backend.store.write_member(backend.member("a", lease="member"))
    listing, members = await backend.peer.list_ownership_and_members(*backend.scope)
    assert members is not None
    [record], [member] = listing.ownerships, members.members
    assert record.etag == won.etag and record.last_modified_time is not None
    assert member.owner_id == "a" and member.properties.get("lease") == "member"
    assert member.last_modified_time is not None and member.last_modified_time >= record.last_modified_time
    second = timedelta(seconds=1)
    assert members.server_time + second >= member.last_modified_time
    assert listing.server_time + second >= record.last_modified_time
    await backend.store.write_member(backend.member("a", lease="member"))
    again, beats = await backend.peer.list_ownership_and_members(*backend.scope)
    assert beats is not None and beats.members[0].last_modified_time >= member.last_modified_time
    assert [(r.etag, r.last_modified_time) for r in again.ownerships] == [(won.etag, record.last_modified_time)]


async def test_a_change_notice_costs_one_write_and_a_member_listing_one_request(backend: Backend) -> None:
    counts = backend.store.request_counts  # type: ignore[attr-defined]
    before = sum(counts.values())
    await backend.store.announce_change(*backend.scope)
    assert sum(counts.values()) - before == 1
    before = sum(counts.values())
    await backend.store.list_members(*backend.scope)
    assert sum(counts.values()) - before == 1


@pytest.mark.parametrize("properties", [{"Upper": "x"}, {"writetoken": "x"}, {"ok": "caf\u00e9"}, {"ok": 3}])
async def test_bad_member_properties_are_refused(backend: Backend, properties: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        await backend.store.write_member(Member(*backend.scope, "me", properties=properties))
    assert (await backend.store.list_members(*backend.scope)).members == ()


# ----------------------------------------------------------------------- log entries


async def test_of_two_concurrent_creators_of_an_entry_exactly_one_wins(backend: Backend) -> None:
    names = [f"{i:012d}.json" for i in range(6)]
    results = await asyncio.gather(*(
        client.create_entry(*backend.scope, "commits", name, f"{who}-{name}".encode())
        for name in names for who, client in (("a", backend.store), ("b", backend.peer))))
    for index, name in enumerate(names):
        a_won, b_won = results[2 * index], results[2 * index + 1]
        assert a_won != b_won, f"exactly one creator of {name} wins"
        winner = "a" if a_won else "b"
        assert await backend.peer.read_entry(*backend.scope, "commits", name) == f"{winner}-{name}".encode()


async def test_entries_list_by_prefix_sorted_read_and_delete(backend: Backend) -> None:
    log = "Spark Commits/1"  # encoded like any name
    for name in ["b-2", "a-10", "a-2", "B-1", ".hidden", "a"]:
        assert await backend.store.create_entry(*backend.scope, log, name, name.encode())
    assert await backend.store.create_entry(*backend.scope, log, "a-2", b"again") is False
    assert await backend.store.read_entry(*backend.scope, log, "a-2") == b"a-2", "a lost create changes nothing"
    expected = sorted(["b-2", "a-10", "a-2", "B-1", ".hidden", "a"])
    assert await backend.store.list_entries(*backend.scope, log) == expected
    assert await backend.store.list_entries(*backend.scope, log, prefix="a-") == ["a-10", "a-2"]
    assert await backend.store.list_entries(*backend.scope, log, prefix="B") == ["B-1"]
    assert await backend.store.list_entries(*backend.scope, log, prefix=".") == [".hidden"]
    assert await backend.store.list_entries(*backend.scope, "other") == []
    await backend.store.delete_entry(*backend.scope, log, "a-10")
    await backend.store.delete_entry(*backend.scope, log, "a-10")  # twice is fine
    assert await backend.store.read_entry(*backend.scope, log, "a-10") is None
    assert await backend.store.read_entry(*backend.scope, log, "never") is None
    assert await backend.store.list_entries(*backend.scope, log, prefix="a") == ["a", "a-2"]
    assert await backend.checkpoints() == {} and (await backend.listing()).ownerships == ()


async def test_entry_size_limit(backend: Backend) -> None:
    largest = random.Random(3).randbytes(MAX_ENTRY_BYTES)
    assert await backend.store.create_entry(*backend.scope, "big", "full", largest)
    assert await backend.peer.read_entry(*backend.scope, "big", "full") == largest
    assert await backend.store.create_entry(*backend.scope, "big", "empty", b"")
    assert await backend.peer.read_entry(*backend.scope, "big", "empty") == b""
    with pytest.raises(ConfigurationError, match=str(MAX_ENTRY_BYTES)):
        await backend.store.create_entry(*backend.scope, "big", "too-big", largest + b"x")
    assert await backend.store.list_entries(*backend.scope, "big") == ["empty", "full"]


# ------------------------------------------------------------------ ambiguous writes


def lose_first_response(store: Any, operation: str) -> list[bool]:
    """The next ``create`` or ``replace`` of ``store`` lands, but the caller gets the
    conflict the transport's retry would have met (409/412) instead of its response.
    (On Azurite, ``tests/test_store_faults.py`` does the same with a real lost response.)"""
    backend = store.backend
    real = getattr(backend, operation)
    fired: list[bool] = []

    async def landed_then_conflict(*args: Any, **kwargs: Any) -> Any:
        record = await real(*args, **kwargs)
        if fired:
            return record
        fired.append(True)
        raise (RecordExists if operation == "create" else EtagMismatch)("the retry met the first attempt")

    setattr(backend, operation, landed_then_conflict)
    return fired


async def test_a_write_whose_response_was_lost_is_recognised_by_its_token(backend: Backend) -> None:
    lose_first_response(backend.store, "create")
    [won] = await backend.store.claim_ownership([backend.ownership("0", "a")])
    assert (await backend.records())["0"].etag == won.etag, "reported won, with the record's real etag"

    lose_first_response(backend.store, "replace")
    [renewed] = await backend.store.claim_ownership([won])
    assert (await backend.records())["0"].etag == renewed.etag

    lose_first_response(backend.store, "create")
    assert await backend.store.fence_checkpoint(renewed) is None
    lose_first_response(backend.store, "replace")
    await backend.store.update_checkpoint(backend.checkpoint("0", 4), owner_id="a", epoch=renewed.epoch)
    assert (await backend.checkpoints())["0"].sequence_number == 4
    counts = Counter(backend.store.request_counts)  # type: ignore[attr-defined]
    await backend.store.update_checkpoint(backend.checkpoint("0", 5), owner_id="a", epoch=renewed.epoch)
    assert Counter(backend.store.request_counts) - counts == Counter(replace_checkpoint=1), \
        "the etag of the recognised write was cached"

    lose_first_response(backend.store, "create")
    assert await backend.store.create_entry(*backend.scope, "log", "e1", b"data") is True


async def test_a_real_conflict_is_still_a_lost_race(backend: Backend) -> None:
    [won] = await backend.store.claim_ownership([backend.ownership("0", "a")])
    [stolen] = await backend.peer.claim_ownership([replace(won, owner_id="b", epoch=2)])
    assert await backend.store.claim_ownership([won]) == []
    assert (await backend.records())["0"].etag == stolen.etag




async def test_a_checkpoint_carries_its_state_reference_and_the_fence_keeps_it(backend: Backend) -> None:
    """Stateful partitions: the checkpoint names the head of its state log;
    a new owner's fence keeps the position and the state that goes with it, and the
    state log's entries are in the same store."""
    from eventprocessor.state import StateLog
    from eventprocessor.stores.records import StateRef

    old = await backend.claim(backend.store, "0", "old")
    await backend.store.fence_checkpoint(old)
    log = StateLog(backend.store, (NAMESPACE, HUB, backend.consumer_group), "0")
    await log.append(prev=None, ref=StateRef(1, old.epoch), sequence_number=10, changes={"k": "\"v\""})
    await backend.store.update_checkpoint(replace(backend.checkpoint("0", 10), state=StateRef(1, old.epoch)),
                                          owner_id="old", epoch=old.epoch)
    assert (await backend.checkpoints())["0"].state == StateRef(1, old.epoch)
    new = await backend.claim(backend.peer, "0", "new")
    resume = await backend.peer.fence_checkpoint(new)
    assert resume is not None and resume.state == StateRef(1, old.epoch)
    assert (await backend.checkpoints())["0"].state == StateRef(1, old.epoch), "the fence keeps the state"
    restored = await StateLog(backend.peer, (NAMESPACE, HUB, backend.consumer_group), "0").restore(resume.state)
    assert restored.texts == {"k": "\"v\""} and restored.sequence_number == 10
