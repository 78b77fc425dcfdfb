"""One contract, three stores: the same tests against InMemory, Blob-on-Azurite and
Table-on-Azurite (``eventprocessor/checkpoint_store.py`` states the contract).

Every test gets a fresh container / table and a fresh consumer group. Races are real:
on Azurite the two contenders are two store instances with their own HTTP sessions.
"""
from __future__ import annotations

import asyncio
import logging
import random
import re
import time
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Any, AsyncIterator, Awaitable, Callable, List, Optional, Tuple

import pytest

from eventprocessor.balancer import LoadBalancingStrategy, decide
from eventprocessor.checkpoint_store import CheckpointStore
from eventprocessor.errors import CheckpointStoreError, OwnershipLostError
from eventprocessor.records import Checkpoint, Ownership
from stores import InMemoryCheckpointStore

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
    peer: CheckpointStore  # a second client of the same storage (the same object in memory)
    consumer_group: str
    # plants a malformed record; returns the name the store's warning must mention
    plant: Callable[[str, str], Awaitable[str]]
    server_clock: Optional[SkewableServerClock] = None
    # another client of the same storage with extra SDK options (None in memory)
    make_client: Optional[Callable[..., CheckpointStore]] = None

    @property
    def scope(self) -> Tuple[str, str, str]:
        return NAMESPACE, HUB, self.consumer_group

    def ownership(self, pid: str, owner: str, *, etag: Optional[str] = None, epoch: int = 1) -> Ownership:
        return Ownership(NAMESPACE, HUB, self.consumer_group, pid, owner, etag=etag, epoch=epoch)

    def checkpoint(self, pid: str, seq: int) -> Checkpoint:
        return Checkpoint(NAMESPACE, HUB, self.consumer_group, pid, sequence_number=seq, offset=str(seq * 100))

    async def listing(self, store: Optional[CheckpointStore] = None):
        return await (store or self.store).list_ownership(*self.scope)

    async def records(self, store: Optional[CheckpointStore] = None) -> dict:
        return {r.partition_id: r for r in (await self.listing(store)).ownerships}

    async def checkpoints(self) -> dict:
        return {c.partition_id: c for c in await self.store.list_checkpoints(*self.scope)}


# ------------------------------------------------------------------ corruption planters


def _memory_planter(store: InMemoryCheckpointStore, consumer_group: str) -> Callable[[str, str], Awaitable[str]]:
    scope = (NAMESPACE, HUB, consumer_group)

    async def plant(kind: str, pid: str) -> str:
        # Nothing in-process writes these (claims and checkpoints are validated), so
        # plant them behind the API, as a bug or a bad deserializer would.
        if kind == "ownership-no-owner":
            record: Any = Ownership(*scope, pid, owner_id=None, etag='"x"', epoch=1)  # type: ignore[arg-type]
            store._ownership.setdefault(scope, {})[pid] = record
        elif kind == "ownership-bad-epoch":
            store._ownership.setdefault(scope, {})[pid] = Ownership(*scope, pid, "someone", etag='"x"', epoch="abc")  # type: ignore[arg-type]
        elif kind == "foreign-ownership":
            store._ownership.setdefault(scope, {})[pid] = {"ownerid": "not-a-record"}  # type: ignore[assignment]
        elif kind == "checkpoint-bad-sequence":
            store._checkpoints.setdefault(scope, {})[pid] = (Checkpoint(*scope, pid, "abc"), '"x"')  # type: ignore[arg-type]
        elif kind == "checkpoint-bad-epoch":
            store._checkpoints.setdefault(scope, {})[pid] = (Checkpoint(*scope, pid, 5, epoch=-1), '"x"')
        elif kind == "foreign-checkpoint":
            store._checkpoints.setdefault(scope, {})[pid] = ("garbage", '"x"')  # type: ignore[assignment]
        else:
            raise AssertionError(kind)
        return f"partition {pid}"

    return plant


def _blob_planter(container: Any, consumer_group: str) -> Callable[[str, str], Awaitable[str]]:
    base = f"{NAMESPACE}/{HUB}/{consumer_group}".lower()

    async def plant(kind: str, pid: str) -> str:
        name, metadata, data = {
            "ownership-no-owner": (f"{base}/ownership/{pid}", {"epoch": "1"}, b""),
            "ownership-bad-epoch": (f"{base}/ownership/{pid}", {"ownerid": "someone", "epoch": "abc"}, b""),
            "foreign-ownership": (f"{base}/ownership/{pid}/notes.txt", {"ownerid": "x"}, b"hello"),
            "checkpoint-bad-sequence": (f"{base}/checkpoint/{pid}", {"sequencenumber": "abc", "offset": "1"}, b""),
            "checkpoint-bad-epoch": (f"{base}/checkpoint/{pid}",
                                     {"sequencenumber": "5", "offset": "1", "epoch": "-1"}, b""),
            "foreign-checkpoint": (f"{base}/checkpoint/{pid}", {}, b"not a checkpoint"),
        }[kind]
        await container.get_blob_client(name).upload_blob(data, overwrite=True, metadata=metadata)
        return name

    return plant


def _table_planter(table: Any, consumer_group: str) -> Callable[[str, str], Awaitable[str]]:
    prefix = f"{NAMESPACE} {HUB} {consumer_group}"

    async def plant(kind: str, pid: str) -> str:
        pk_kind, fields = {
            "ownership-no-owner": ("Ownership", {"epoch": 1}),
            "ownership-bad-epoch": ("Ownership", {"ownerid": "someone", "epoch": "abc"}),
            "foreign-ownership": ("Ownership", {"ownerid": 42}),
            "checkpoint-bad-sequence": ("Checkpoint", {"sequencenumber": "abc", "offset": "1"}),
            "checkpoint-bad-epoch": ("Checkpoint", {"sequencenumber": "5", "offset": "1", "epoch": -1}),
            "foreign-checkpoint": ("Checkpoint", {"note": "not a checkpoint"}),
        }[kind]
        await table.upsert_entity({"PartitionKey": f"{prefix} {pk_kind}", "RowKey": pid, **fields})
        return f"RowKey={pid!r}"

    return plant


# --------------------------------------------------------------------------- fixture


@pytest.fixture(params=["memory", "blob", "table"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    consumer_group = f"cg-{uuid.uuid4().hex[:8]}"
    if request.param == "memory":
        clock = SkewableServerClock()
        store = InMemoryCheckpointStore(clock=clock)
        yield Backend("memory", store, store, consumer_group, _memory_planter(store, consumer_group), clock)
        return

    azurite = request.getfixturevalue("azurite")
    if request.param == "blob":
        from azure.storage.blob.aio import ContainerClient

        from stores import BlobCheckpointStore

        container = f"conf-{uuid.uuid4().hex[:12]}"
        store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
        peer = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
        raw = ContainerClient.from_connection_string(azurite.connection_string, container)
        try:
            await store.list_ownership(NAMESPACE, HUB, consumer_group)  # creates the container
            yield Backend("blob", store, peer, consumer_group, _blob_planter(raw, consumer_group),
                          make_client=lambda **kw: BlobCheckpointStore.from_connection_string(
                              azurite.connection_string, container, **kw))
        finally:
            await raw.delete_container()
            await raw.close()
            await store.close()
            await peer.close()
        return

    from azure.data.tables.aio import TableClient

    from stores import TableCheckpointStore

    table_name = f"conf{uuid.uuid4().hex[:12]}"
    store = TableCheckpointStore.from_connection_string(azurite.connection_string, table_name)
    peer = TableCheckpointStore.from_connection_string(azurite.connection_string, table_name)
    raw = TableClient.from_connection_string(azurite.connection_string, table_name)
    try:
        await store.list_ownership(NAMESPACE, HUB, consumer_group)  # creates the table
        yield Backend("table", store, peer, consumer_group, _table_planter(raw, consumer_group),
                      make_client=lambda **kw: TableCheckpointStore.from_connection_string(
                          azurite.connection_string, table_name, **kw))
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


async def _steal(backend: Backend, pid: str = "0") -> Tuple[Ownership, Ownership]:
    [old] = await backend.store.claim_ownership([backend.ownership(pid, "old", epoch=1)])
    await backend.store.update_checkpoint(backend.checkpoint(pid, 10), owner_id="old", epoch=1)
    listed = (await backend.records(backend.peer))[pid]
    [new] = await backend.peer.claim_ownership([replace(listed, owner_id="new", epoch=listed.epoch + 1)])
    return old, new


async def test_fenced_checkpoint_after_steal_new_owner_wrote_first(backend: Backend) -> None:
    _old, new = await _steal(backend)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)

    with pytest.raises(OwnershipLostError) as raised:
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=1)
    assert raised.value.partition_id == "0"

    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (20, "new", 2)


async def test_fenced_checkpoint_after_steal_new_owner_not_written_yet(backend: Backend) -> None:
    _old, new = await _steal(backend)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=1)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (10, "old", 1), "refused write left no trace"

    await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 25), owner_id="old", epoch=1)
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (20, "new", 2)


async def test_checkpoint_without_ownership_or_after_release_is_refused(backend: Backend) -> None:
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 1), owner_id="a", epoch=1)
    [mine] = await backend.store.claim_ownership([backend.ownership("0", "a", epoch=1)])
    await backend.store.update_checkpoint(backend.checkpoint("0", 2), owner_id="a", epoch=1)
    with pytest.raises(OwnershipLostError):  # same owner, wrong epoch
        await backend.store.update_checkpoint(backend.checkpoint("0", 3), owner_id="a", epoch=2)
    assert await backend.store.release_ownership(mine)
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 4), owner_id="a", epoch=1)
    assert (await backend.checkpoints())["0"].sequence_number == 2


async def test_old_owner_write_racing_a_steal_never_overwrites_the_new_owner(backend: Backend) -> None:
    """The window between the ownership check and the write, forced open: the old
    owner's check is made to pass although the partition was stolen and the new owner
    has checkpointed. Its conditional write must fail and leave the new checkpoint."""
    if backend.name == "memory":
        pytest.skip("the in-memory store checks and writes atomically: there is no window")
    _old, new = await _steal(backend)
    await backend.peer.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)

    store: Any = backend.store
    real_verify = store._verify_owner
    calls = []

    async def stale_first_check(*args: Any, **kwargs: Any) -> None:
        calls.append(args)
        if len(calls) == 1:
            return  # the check "happened before the steal"
        await real_verify(*args, **kwargs)

    store._verify_owner = stale_first_check
    with pytest.raises(OwnershipLostError):
        await backend.store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=1)
    assert len(calls) == 2, "the conflict made it re-check ownership"
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (20, "new", 2)


async def test_old_owner_write_landing_in_the_window_is_replaced_by_the_new_owner(backend: Backend) -> None:
    """The other order: the old owner's write lands after the steal, between the new
    owner's read of the checkpoint etag and its first write. The new owner's write hits
    412, re-checks that it still owns the partition, re-reads and writes: its checkpoint
    wins, and the old owner's next write is refused."""
    if backend.name == "memory":
        pytest.skip("the in-memory store checks and writes atomically: there is no window")
    _old, new = await _steal(backend)
    old_store: Any = backend.store
    new_store: Any = backend.peer
    real_verify = old_store._verify_owner
    real_read = new_store._read_checkpoint_etag
    landed = []

    async def stale_check(*args: Any, **kwargs: Any) -> None:
        if not landed:
            return  # the old owner checked just before the steal
        await real_verify(*args, **kwargs)

    async def read_then_old_owner_lands(*args: Any, **kwargs: Any) -> Any:
        etag = await real_read(*args, **kwargs)
        if not landed:
            await old_store.update_checkpoint(backend.checkpoint("0", 15), owner_id="old", epoch=1)
            landed.append(True)
        return etag

    old_store._verify_owner = stale_check
    new_store._read_checkpoint_etag = read_then_old_owner_lands
    await new_store.update_checkpoint(backend.checkpoint("0", 20), owner_id="new", epoch=new.epoch)
    assert landed
    assert new_store.request_counts["read_checkpoint"] == 2, "the conflict made the new owner re-read"
    stored = (await backend.checkpoints())["0"]
    assert (stored.sequence_number, stored.owner_id, stored.epoch) == (20, "new", 2)

    with pytest.raises(OwnershipLostError):
        await old_store.update_checkpoint(backend.checkpoint("0", 16), owner_id="old", epoch=1)
    assert (await backend.checkpoints())["0"].sequence_number == 20


async def test_checkpoint_of_a_later_epoch_is_never_overwritten(backend: Backend) -> None:
    # A partition back with "a" at epoch 3 while the checkpoint says epoch 5 (a store
    # restored from backup, say): "a" must not roll it back.
    await backend.store.claim_ownership([backend.ownership("0", "b", epoch=5)])
    await backend.store.update_checkpoint(backend.checkpoint("0", 50), owner_id="b", epoch=5)
    listed = (await backend.records())["0"]
    await backend.store.claim_ownership([replace(listed, owner_id="a", epoch=3)])
    with pytest.raises(OwnershipLostError):
        await backend.peer.update_checkpoint(backend.checkpoint("0", 40), owner_id="a", epoch=3)
    assert (await backend.checkpoints())["0"].sequence_number == 50


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
    if backend.make_client is None:
        pytest.skip("the in-memory store has no failure mode besides lost races")
    from eventprocessor.errors import ClaimOwnershipError

    created = await backend.store.claim_ownership([backend.ownership(str(p), "a") for p in range(6)])
    async with backend.make_client(transport=_failing_transport(_is_partition_3), retry_total=0) as flaky:
        with pytest.raises(ClaimOwnershipError) as raised:
            await flaky.claim_ownership([replace(r, owner_id="b", epoch=2) for r in created])
    error = raised.value
    assert sorted(r.partition_id for r in error.claimed) == ["0", "1", "2", "4", "5"], "won claims are kept"
    assert set(error.failures) == {"3"} and isinstance(error.failures["3"], CheckpointStoreError)
    assert "3" in str(error)
    stored = await backend.records()
    assert stored["3"].owner_id == "a" and all(stored[p].owner_id == "b" for p in "01245")


async def test_an_unexpected_checkpoint_failure_is_not_ownership_lost(backend: Backend) -> None:
    if backend.make_client is None:
        pytest.skip("the in-memory store has no failure mode besides lost races")
    await backend.store.claim_ownership([backend.ownership("3", "a")])
    async with backend.make_client(transport=_failing_transport(_is_partition_3), retry_total=0) as flaky:
        with pytest.raises(CheckpointStoreError) as raised:
            await flaky.update_checkpoint(backend.checkpoint("3", 1), owner_id="a", epoch=1)
    assert not isinstance(raised.value, OwnershipLostError)
    assert await backend.checkpoints() == {}


# ------------------------------------------------------------------------ server time


def _judge(listing: Any, owner_id: str, expiry: float) -> List[str]:
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


CORRUPTIONS = [
    ("ownership-no-owner", "7"),
    ("ownership-bad-epoch", "8"),
    ("foreign-ownership", "9"),
    ("checkpoint-bad-sequence", "1"),
    ("checkpoint-bad-epoch", "2"),
    ("foreign-checkpoint", "3"),
]


async def test_corrupted_and_foreign_records_are_skipped_with_a_warning(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    await backend.store.claim_ownership([backend.ownership(p, "a") for p in ("0", "1")])
    await backend.store.update_checkpoint(backend.checkpoint("0", 5), owner_id="a", epoch=1)
    planted = {kind: await backend.plant(kind, pid) for kind, pid in CORRUPTIONS}

    caplog.set_level(logging.WARNING)
    records = await backend.records()
    checkpoints = await backend.checkpoints()
    assert set(records) == {"0", "1"}
    assert set(checkpoints) == {"0"} and checkpoints["0"].sequence_number == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for kind, name in planted.items():
        assert any(name in message for message in warnings), f"no warning names {kind} record {name}"

    caplog.clear()
    await backend.records()
    await backend.checkpoints()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], "one warning per bad record, not per tick"

    # The owner repairs a corrupted checkpoint by writing over it.
    await backend.store.update_checkpoint(backend.checkpoint("1", 7), owner_id="a", epoch=1)
    assert (await backend.checkpoints())["1"].sequence_number == 7


# ------------------------------------------------------------------ errors and input


async def test_claim_with_invalid_input_is_a_configuration_error(backend: Backend) -> None:
    from eventprocessor.errors import ConfigurationError

    with pytest.raises(ConfigurationError):
        await backend.store.claim_ownership([backend.ownership("0", "a", epoch=-1)])
    with pytest.raises(ConfigurationError):
        await backend.store.update_checkpoint(
            replace(backend.checkpoint("0", 1), sequence_number="12"), owner_id="a", epoch=1)  # type: ignore[arg-type]
    assert await backend.records() == {}


def test_checkpoint_store_error_is_not_ownership_lost() -> None:
    # Callers tell a lost race from a broken store by type.
    assert not issubclass(CheckpointStoreError, OwnershipLostError)
