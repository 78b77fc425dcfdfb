"""Interop with the official ``azure-eventhub-checkpointstoreblob-aio`` on Azurite:
what it writes, ``BlobCheckpointStore`` reads, and the reverse, so a deployment can
switch SDKs in either direction and resume from the same checkpoints."""
from __future__ import annotations

import asyncio
import types
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from azure.storage.blob.aio import ContainerClient

from eventprocessor import EventProcessor, LoadBalancingStrategy, PartitionProcessor
from eventprocessor.errors import OwnershipLostError
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import BlobCheckpointStore
from eventprocessor.stores.records import Checkpoint, Member, Ownership

pytest.importorskip("azure.eventhub.extensions.checkpointstoreblobaio")
from azure.eventhub.extensions.checkpointstoreblobaio import (  # noqa: E402
    BlobCheckpointStore as OfficialBlobCheckpointStore,
)

NS = "Interop.servicebus.windows.net"  # mixed case: both stores lower-case blob names
HUB = "Orders"


@pytest.fixture
async def stores(azurite: Any) -> AsyncIterator[tuple[BlobCheckpointStore, Any, str]]:
    container = f"interop-{uuid.uuid4().hex[:10]}"
    consumer_group = f"cg-{uuid.uuid4().hex[:6]}"
    ours = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    # The official store rejects UseDevelopmentStorage=true and does not create its container.
    official = OfficialBlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    await ours.list_ownership(NS, HUB, consumer_group)  # creates the container
    try:
        yield ours, official, consumer_group
    finally:
        await ours.close()
        async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
            await raw.delete_container()
        await official.close()


def _official_ownership(cg: str, pid: str, owner: str, etag: Any = None) -> dict[str, Any]:
    return {"fully_qualified_namespace": NS, "eventhub_name": HUB, "consumer_group": cg,
            "partition_id": pid, "owner_id": owner, "etag": etag}


def _official_checkpoint(cg: str, pid: str, seq: int, offset: str) -> dict[str, Any]:
    return {"fully_qualified_namespace": NS, "eventhub_name": HUB, "consumer_group": cg,
            "partition_id": pid, "sequence_number": seq, "offset": offset}


async def test_records_written_by_the_official_store_are_read_by_ours(stores: Any) -> None:
    ours, official, cg = stores
    claimed = await official.claim_ownership([_official_ownership(cg, "0", "legacy-a"),
                                              _official_ownership(cg, "1", "legacy-b")])
    assert len(claimed) == 2
    await official.update_checkpoint(_official_checkpoint(cg, "0", 100, "12345"))
    await official.update_checkpoint(_official_checkpoint(cg, "1", 7, "99"))

    listing = await ours.list_ownership(NS, HUB, cg)
    records = {r.partition_id: r for r in listing.ownerships}
    assert {p: (r.owner_id, r.epoch) for p, r in records.items()} == {"0": ("legacy-a", 0), "1": ("legacy-b", 0)}
    official_etags = {o["partition_id"]: o["etag"] for o in claimed}
    for pid, record in records.items():
        assert record.etag.strip('"') == official_etags[pid].strip('"')
        assert abs(record.last_modified_time.timestamp() - claimed[int(pid)]["last_modified_time"]) < 1
        assert (record.fully_qualified_namespace, record.eventhub_name, record.consumer_group) == (NS, HUB, cg)

    checkpoints = {c.partition_id: c for c in await ours.list_checkpoints(NS, HUB, cg)}
    assert checkpoints == {
        "0": Checkpoint(NS, HUB, cg, "0", 100, "12345", owner_id=None, epoch=None),
        "1": Checkpoint(NS, HUB, cg, "1", 7, "99", owner_id=None, epoch=None),
    }

    # Ours takes over with the official record's etag and checkpoints, fenced, over its blob.
    [taken] = await ours.claim_ownership([replace(records["0"], owner_id="new", epoch=1)])
    await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "0", 101, "12400"), owner_id="new", epoch=1)
    # and a stale official renewal now loses
    assert await official.claim_ownership([_official_ownership(cg, "0", "legacy-a", claimed[0]["etag"])]) == []
    assert (await ours.list_checkpoints(NS, HUB, cg))[0].sequence_number == 101
    assert taken.epoch == 1


async def test_records_written_by_ours_are_read_by_the_official_store(stores: Any, azurite: Any) -> None:
    ours, official, cg = stores
    won = await ours.claim_ownership([Ownership(NS, HUB, cg, str(p), f"owner-{p % 2}", epoch=p + 1) for p in range(4)])
    for record in won:
        await ours.update_checkpoint(Checkpoint(NS, HUB, cg, record.partition_id, 10 + int(record.partition_id),
                                                str(1000 + int(record.partition_id))),
                                     owner_id=record.owner_id, epoch=record.epoch)
    await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "3", 20, None), owner_id="owner-1", epoch=4)

    listed = {o["partition_id"]: o for o in await official.list_ownership(NS, HUB, cg)}
    assert {p: o["owner_id"] for p, o in listed.items()} == {"0": "owner-0", "1": "owner-1", "2": "owner-0",
                                                            "3": "owner-1"}
    ours_by_pid = {r.partition_id: r for r in won}
    for pid, record in listed.items():
        assert record["etag"].strip('"') == ours_by_pid[pid].etag.strip('"')
        assert record["last_modified_time"] == ours_by_pid[pid].last_modified_time.timestamp()

    checkpoints = {c["partition_id"]: c for c in await official.list_checkpoints(NS, HUB, cg)}
    assert {p: (c["sequence_number"], c["offset"]) for p, c in checkpoints.items()} == {
        "0": (10, "1000"), "1": (11, "1001"), "2": (12, "1002"),
        "3": (20, "-1"),  # no offset: Event Hubs' start of stream, never "None"
    }
    assert (await ours.list_checkpoints(NS, HUB, cg))[3].offset is None

    # The official store can take a partition back with the etag it lists. It does not
    # fence (its claims leave the checkpoint record alone), so our old owner's client,
    # holding the etag of its own last checkpoint, is stopped by the official
    # processor's first checkpoint, not by its claim; a client that verifies ownership
    # is refused at once.
    renewed = await official.claim_ownership([_official_ownership(cg, "2", "legacy", listed["2"]["etag"])])
    assert [o["owner_id"] for o in renewed] == ["legacy"]
    async with BlobCheckpointStore.from_connection_string(azurite.connection_string, ours.container_name) as fresh:
        with pytest.raises(OwnershipLostError):
            await fresh.update_checkpoint(Checkpoint(NS, HUB, cg, "2", 99, "1"), owner_id="owner-0", epoch=3)
    await official.update_checkpoint(_official_checkpoint(cg, "2", 50, "5000"))
    with pytest.raises(OwnershipLostError):
        await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "2", 99, "1"), owner_id="owner-0", epoch=3)
    assert {c["partition_id"]: c["sequence_number"] for c in await official.list_checkpoints(NS, HUB, cg)}["2"] == 50


async def test_the_official_sdk_still_works_beside_our_new_records(stores: Any) -> None:
    """Fenced placeholders, a handoff request, a release, members, log entries and write
    tokens in the container: the official store still lists every ownership and
    checkpoint record, and the official load balancer still claims over ours (it just
    cannot hand off)."""
    from azure.eventhub import LoadBalancingStrategy as OfficialStrategy
    from azure.eventhub.aio._eventprocessor._ownership_manager import OwnershipManager

    ours, official, cg = stores
    won = await ours.claim_ownership([Ownership(NS, HUB, cg, str(p), "ours", epoch=1) for p in range(4)])
    for record in won:
        await ours.fence_checkpoint(record)
    await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "0", 10, "1000"), owner_id="ours", epoch=1)
    listed = {o.partition_id: o for o in (await ours.list_ownership(NS, HUB, cg)).ownerships}
    assert await ours.claim_ownership([replace(listed["1"], requested_by="other")])
    assert await ours.release_ownership(listed["3"])
    await ours.write_member(Member(NS, HUB, cg, "ours", properties={"handoff": "yes"}))
    assert await ours.create_entry(NS, HUB, cg, "commits", "000000000000.json", b'{"type": "fence"}')

    ownership = {o["partition_id"]: o["owner_id"] for o in await official.list_ownership(NS, HUB, cg)}
    assert ownership == {"0": "ours", "1": "ours", "2": "ours", "3": None}  # as it lists its own releases
    checkpoints = {c["partition_id"]: (c["sequence_number"], c["offset"])
                   for c in await official.list_checkpoints(NS, HUB, cg)}
    # Placeholders read as sequence number -1 at offset "-1": an official processor
    # starts those partitions from the start of the stream.
    assert checkpoints == {"0": (10, "1000"), "1": (-1, "-1"), "2": (-1, "-1"), "3": (-1, "-1")}

    async def partition_ids() -> list[str]:
        return ["0", "1", "2", "3"]

    client = types.SimpleNamespace(_address=types.SimpleNamespace(hostname=NS), eventhub_name=HUB,
                                   get_partition_ids=partition_ids)
    manager = OwnershipManager(client, cg, "official", official, 60.0, OfficialStrategy.GREEDY, None)
    assert "3" in await manager.claim_ownership(), "the released partition is claimed over our record"
    manager.ownership_timeout = 0.0  # ours have all expired for it now
    await asyncio.sleep(0.01)
    await manager.claim_ownership()
    after = {o.partition_id: o for o in (await ours.list_ownership(NS, HUB, cg)).ownerships}
    assert {p: (o.owner_id, o.requested_by) for p, o in after.items()} == {p: ("official", "") for p in "0123"}
    assert (await manager.get_checkpoints())["0"]["sequence_number"] == 10
    assert [m.owner_id for m in (await ours.list_members(NS, HUB, cg)).members] == ["ours"]
    assert await ours.read_entry(NS, HUB, cg, "commits", "000000000000.json") == b'{"type": "fence"}'


class _Recorder(PartitionProcessor):
    seen: dict[str, list[int]] = {}

    async def process_events(self, events: list[Any], context: Any) -> None:
        self.seen.setdefault(context.partition_id, []).extend(e.sequence_number for e in events)
        await context.update_checkpoint()


async def _drain(processor: EventProcessor, seen: dict[str, list[int]], last: int, partitions: int) -> None:
    for _ in range(2 * partitions):  # a newcomer may take one partition per tick at first
        await processor.balance_once()
        if len(processor.owned_partitions) == partitions:
            break
    for _ in range(200):  # bounded: at most ~10 s
        if len(seen) == partitions and all(s and s[-1] == last for s in seen.values()):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"events not delivered: {seen}")


async def test_switch_over_resumes_from_the_same_checkpoints(stores: Any) -> None:
    ours, official, cg = stores
    source = InMemoryEventSource(4, eventhub_name=HUB, fully_qualified_namespace=NS)
    for i in range(10):
        for pid in range(4):
            await source.send(f"event {i}", partition_id=str(pid))
    events = {str(p): source.events(str(p)) for p in range(4)}

    # 1. The official SDK's era: it owned the partitions, checkpointed event 4, shut down
    #    (its shutdown releases ownership by writing an empty owner id).
    claimed = await official.claim_ownership([_official_ownership(cg, str(p), "legacy") for p in range(4)])
    for pid in range(4):
        event = events[str(pid)][4]
        await official.update_checkpoint(_official_checkpoint(cg, str(pid), event.sequence_number, event.offset))
    await official.claim_ownership([dict(o, owner_id="") for o in claimed])

    # 2. This SDK takes over and resumes after event 4.
    _Recorder.seen = {}
    processor = EventProcessor(source, ours, _Recorder, consumer_group=cg,
                               load_balancing_strategy=LoadBalancingStrategy.GREEDY)
    try:
        await _drain(processor, _Recorder.seen, last=9, partitions=4)
        assert processor.owned_partitions == {"0", "1", "2", "3"}
    finally:
        await processor.stop()
    assert {p: s[0] for p, s in _Recorder.seen.items()} == {str(p): 5 for p in range(4)}, "resumed after event 4"
    assert all(s == list(range(5, 10)) for s in _Recorder.seen.values())

    # 3. Back to the official SDK: it sees our checkpoints and our released ownership.
    checkpoints = {c["partition_id"]: c for c in await official.list_checkpoints(NS, HUB, cg)}
    assert {p: (c["sequence_number"], c["offset"]) for p, c in checkpoints.items()} == {
        str(p): (events[str(p)][9].sequence_number, events[str(p)][9].offset) for p in range(4)}
    ownership = await official.list_ownership(NS, HUB, cg)
    assert len(ownership) == 4 and not any(o["owner_id"] for o in ownership), "released on stop"
    back = await official.claim_ownership([dict(o, owner_id="legacy-again") for o in ownership])
    assert len(back) == 4


# ------------------------------------------- azure-eventhub's store, run as ours


def _official_builds(azurite: Any, container: str) -> dict[str, Any]:
    """azure-eventhub's BlobCheckpointStore (aio and sync) built each way its docs show."""
    from azure.core.credentials import AzureNamedKeyCredential, AzureSasCredential
    from azure.storage.blob import AccountSasPermissions, ResourceTypes, generate_account_sas

    sync = pytest.importorskip("azure.eventhub.extensions.checkpointstoreblob")
    sas = generate_account_sas("devstoreaccount1", azurite.account_key,
                               ResourceTypes(service=True, container=True, object=True),
                               AccountSasPermissions(read=True, list=True, write=True, create=True, delete=True),
                               expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    sas_string = f"BlobEndpoint={azurite.blob_endpoint};SharedAccessSignature={sas}"
    builds = {}
    for flavour, cls in (("aio", OfficialBlobCheckpointStore), ("sync", sync.BlobCheckpointStore)):
        builds.update({
            f"{flavour}: connection string with a key": cls.from_connection_string(
                azurite.connection_string, container_name=container),
            f"{flavour}: connection string with a SAS": cls.from_connection_string(sas_string, container),
            f"{flavour}: URL with a SAS": cls(f"{azurite.blob_endpoint}?{sas}", container),
            f"{flavour}: AzureSasCredential": cls(blob_account_url=azurite.blob_endpoint, container_name=container,
                                                  credential=AzureSasCredential(sas)),
            f"{flavour}: AzureNamedKeyCredential": cls(azurite.blob_endpoint, container, credential=(
                AzureNamedKeyCredential("devstoreaccount1", azurite.account_key))),
        })
    return {"sas": sas, **builds}


async def test_azure_eventhub_s_store_runs_as_ours_on_its_container_with_fencing(azurite: Any) -> None:
    """``BlobCheckpointStore.from_azure_eventhub``: whatever way the official store was
    built, ours runs on the same container and account, writes blobs the official store
    reads, and fences checkpoints by epoch, which the official store never does."""
    container = f"adopt-{uuid.uuid4().hex[:10]}"
    builds = _official_builds(azurite, container)
    sig = builds.pop("sas").split("sig=")[1].split("&")[0]
    try:
        for index, (what, official) in enumerate(builds.items()):
            cg = f"cg-{index}"
            ours = BlobCheckpointStore.from_azure_eventhub(official)
            async with ours:
                assert ours.container_name == container, what
                assert azurite.account_key not in repr(ours) and sig not in repr(ours), what
                [first] = await ours.claim_ownership([Ownership(NS, HUB, cg, "0", "first-owner")])
                await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "0", 40, "4000"), owner_id="first-owner",
                                             epoch=first.epoch)
                [second] = await ours.claim_ownership([replace(first, owner_id="new-owner", epoch=first.epoch + 1)])
                await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "0", 41, "4100"), owner_id="new-owner",
                                             epoch=second.epoch)
                with pytest.raises(OwnershipLostError):  # the first owner, a zombie now
                    await ours.update_checkpoint(Checkpoint(NS, HUB, cg, "0", 42, "4200"), owner_id="first-owner",
                                                 epoch=first.epoch)
            read_back = official.list_checkpoints(NS, HUB, cg)
            owners = official.list_ownership(NS, HUB, cg)
            if asyncio.iscoroutine(read_back):
                read_back, owners = await read_back, await owners
            assert [(c["partition_id"], c["sequence_number"], c["offset"]) for c in read_back] == [("0", 41, "4100")], \
                what
            assert [(o["partition_id"], o["owner_id"]) for o in owners] == [("0", "new-owner")], what
    finally:
        for official in builds.values():
            closing = official.close()
            if asyncio.iscoroutine(closing):
                await closing
        async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
            await raw.delete_container()


async def test_token_credentials_of_the_official_stores_carry_over() -> None:
    """An async token credential is used as it is; the sync store's sync credential is
    called in a worker thread (no request is sent: Azurite takes tokens over HTTPS only)."""
    import threading

    from azure.core.credentials import AccessToken
    from azure.identity.aio import ClientSecretCredential

    from eventprocessor.stores.blob import ThreadedTokenCredential

    sync = pytest.importorskip("azure.eventhub.extensions.checkpointstoreblob")

    class IssuedHere:  # a sync TokenCredential that says on which thread it was asked
        def __init__(self) -> None:
            self.threads: list[int] = []

        def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
            self.threads.append(threading.get_ident())
            return AccessToken(f"token for {scopes[0]}", 4_000_000_000)

    async with ClientSecretCredential("tenant", "client", "s3cr3t-client-secret") as credential:
        official = OfficialBlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints",
                                               credential=credential)
        ours = BlobCheckpointStore.from_azure_eventhub(official)
        assert ours.backend.client.credential is credential and "s3cr3t" not in repr(ours)
        await ours.close()
        await official.close()
    issued = IssuedHere()
    ours = BlobCheckpointStore.from_azure_eventhub(
        sync.BlobCheckpointStore("https://acct.blob.core.windows.net", "checkpoints", credential=issued))
    wrapped = ours.backend.client.credential
    assert isinstance(wrapped, ThreadedTokenCredential)
    token = await wrapped.get_token("https://storage.azure.com/.default")
    assert token.token == "token for https://storage.azure.com/.default"
    assert issued.threads and issued.threads[0] != threading.get_ident()
    await ours.close()


def test_only_azure_eventhub_s_blob_store_is_taken() -> None:
    from eventprocessor.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="takes azure-eventhub's BlobCheckpointStore"):
        BlobCheckpointStore.from_azure_eventhub(BlobCheckpointStore("https://acct.blob.core.windows.net", "abc"))


async def test_the_drop_in_given_the_official_store_receives_again_after_close(azurite: Any) -> None:
    """azure-eventhub's client can receive again after ``close()``; so can the drop-in,
    although it closed the store it built from the official one."""
    from eventprocessor import EventHubConsumerClient

    container = f"again-{uuid.uuid4().hex[:10]}"
    official = OfficialBlobCheckpointStore.from_connection_string(azurite.connection_string, container_name=container)
    source = InMemoryEventSource(2)
    client = EventHubConsumerClient.from_source(source, "$default", checkpoint_store=official,
                                                load_balancing_interval=1.0)
    received: list[int] = []
    errors: list[Exception] = []

    async def on_event_batch(context: Any, events: list[Any]) -> None:
        received.extend(event.sequence_number for event in events)
        await context.update_checkpoint()

    async def on_error(context: Any, error: Exception) -> None:
        errors.append(error)

    try:
        for round_ in range(2):
            for i in range(8):
                await source.send(f"r{round_}-{i}", partition_id=str(i % 2))
            task = asyncio.create_task(client.receive_batch(on_event_batch, starting_position="-1", on_error=on_error))
            for _ in range(200):
                if len(received) == 8 * (round_ + 1) or task.done():
                    break
                await asyncio.sleep(0.05)
            await client.close()
            await task
        assert sorted(received) == sorted(list(range(4)) * 2 + list(range(4, 8)) * 2) and errors == []
        read_back = await official.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name, "$default")
        assert sorted((c["partition_id"], c["sequence_number"]) for c in read_back) == [("0", 7), ("1", 7)]
    finally:
        await official.close()
        async with ContainerClient.from_connection_string(azurite.connection_string, container) as raw:
            await raw.delete_container()
