"""Migrating from azure-eventhub: ONE set of callbacks runs under the official
``EventHubConsumerClient`` (with ``azure-eventhub-checkpointstoreblob-aio``) and under
this SDK's drop-in (``eventprocessor.EventHubConsumerClient`` with
``stores.BlobCheckpointStore``), against the project's Event Hubs emulator and one
Azurite, with the same results.

The program below is the same for both: only the two classes differ (``CLIENTS``), which
is the migration docs/howto/migrating.md describes.

1. From scratch, on two consumer groups of one hub: the same events per partition (sequence
   numbers and bodies), the same partitions initialized and closed (``SHUTDOWN``), the
   same last-enqueued properties, and the same checkpoints, each read back through the
   other side's store.
2. Resuming: official, then ours, then official on one consumer group, and the reverse;
   each run receives exactly the events after the other's checkpoints. Also official,
   then the drop-in given azure-eventhub's own store (only the consumer's import changed),
   then official.
3. The AMQP properties a producer sets (``message_id``, ``content_type``,
   ``correlation_id``; strings, a UUID and an int id) read the same in both clients'
   callbacks: as attributes, in ``system_properties`` and in ``raw_amqp_message.properties``.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest

pytestmark = [pytest.mark.azurite, pytest.mark.eventhubs]

PARTITIONS = 4
CLIENT_OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=10.0)


def _classes(implementation: str) -> tuple[Any, Any]:
    """The only difference between the programs: where the two classes come from.
    ``one-import`` changes only the consumer's import and keeps azure-eventhub's store,
    which the drop-in runs as ``stores.BlobCheckpointStore`` on the same container."""
    if implementation == "official":
        from azure.eventhub.aio import EventHubConsumerClient
        from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore
    elif implementation == "one-import":
        from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

        from eventprocessor import EventHubConsumerClient  # type: ignore[assignment]
    else:
        from eventprocessor import EventHubConsumerClient  # type: ignore[assignment]
        from eventprocessor.stores import BlobCheckpointStore  # type: ignore[assignment]
    return EventHubConsumerClient, BlobCheckpointStore


class Callbacks:
    """The user's callbacks, unchanged between the two clients: record what arrives and
    checkpoint after every batch."""

    def __init__(self) -> None:
        self.events: dict[str, list[tuple[int, str]]] = defaultdict(list)
        self.initialized: list[str] = []
        self.closed: list[tuple[str, str]] = []
        self.errors: list[tuple[str | None, str]] = []
        self.last_enqueued: dict[str, int] = {}
        self.names: set = set()
        self.amqp: dict[str, list[tuple[Any, ...]]] = defaultdict(list)

    async def on_event_batch(self, partition_context, events) -> None:
        for event in events:
            self.events[partition_context.partition_id].append((event.sequence_number, event.body_as_str()))
            raw = event.raw_amqp_message.properties
            self.amqp[partition_context.partition_id].append((
                event.sequence_number, event.message_id, event.content_type, event.correlation_id,
                {key: value for key, value in event.system_properties.items() if not key.startswith(b"x-opt-")},
                (raw.message_id, raw.content_type, raw.correlation_id) if raw else None))
        newest = partition_context.last_enqueued_event_properties
        if newest:
            self.last_enqueued[partition_context.partition_id] = newest["sequence_number"]
        self.names.add((partition_context.eventhub_name, partition_context.consumer_group))
        if events:
            await partition_context.update_checkpoint(events[-1])

    async def on_partition_initialize(self, partition_context) -> None:
        self.initialized.append(partition_context.partition_id)

    async def on_partition_close(self, partition_context, reason) -> None:
        self.closed.append((partition_context.partition_id, reason.name))

    async def on_error(self, partition_context, error) -> None:
        self.errors.append((partition_context.partition_id if partition_context else None, repr(error)))

    def total(self) -> int:
        return sum(len(v) for v in self.events.values())

    def sequence_numbers(self) -> dict[str, list[int]]:
        return {pid: [seq for seq, _body in events] for pid, events in sorted(self.events.items())}


async def consume(implementation: str, *, conn: str, hub: str, group: str, storage: str, container: str,
                  expected: int) -> Callbacks:
    """The user's program: receive until ``expected`` events arrived (plus a second for
    anything extra), then close."""
    EventHubConsumerClient, BlobCheckpointStore = _classes(implementation)
    callbacks = Callbacks()
    checkpoint_store = BlobCheckpointStore.from_connection_string(storage, container)
    client = EventHubConsumerClient.from_connection_string(conn, consumer_group=group, eventhub_name=hub,
                                                           checkpoint_store=checkpoint_store, **CLIENT_OPTIONS)
    task = asyncio.create_task(client.receive_batch(
        callbacks.on_event_batch, max_batch_size=10, starting_position="-1",
        track_last_enqueued_event_properties=True, on_partition_initialize=callbacks.on_partition_initialize,
        on_partition_close=callbacks.on_partition_close, on_error=callbacks.on_error))
    try:
        started = time.monotonic()
        while callbacks.total() < expected:
            assert not task.done(), task.exception()
            assert time.monotonic() - started < 60, f"{implementation} received {callbacks.total()} of {expected}"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)  # anything beyond what it should get would arrive now
    finally:
        await client.close()
        await asyncio.wait_for(task, 30)
        await checkpoint_store.close()
    return callbacks


async def _produce(conn: str, hub: str, phase: str, per_partition: int) -> None:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
        for pid in range(PARTITIONS):
            await producer.send_batch([EventData(f"{phase}-{pid}-{i}") for i in range(per_partition)],
                                      partition_id=str(pid))


def _amqp_properties(pid: int, i: int) -> dict[str, Any]:
    """What the producer sets on event ``i`` of partition ``pid``: strings, nothing, or a
    UUID message id with an int correlation id (AMQP allows ulong, uuid, binary, string)."""
    if i % 3 == 0:
        return {"message_id": f"m-{pid}-{i}", "content_type": "application/json", "correlation_id": f"c-{pid}"}
    if i % 3 == 1:
        return {}
    return {"message_id": uuid.UUID(int=pid * 1000 + i), "correlation_id": pid * 1000 + i}


async def _produce_with_amqp_properties(conn: str, hub: str, per_partition: int) -> None:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
        for pid in range(PARTITIONS):
            batch = []
            for i in range(per_partition):
                event = EventData(f"p-{pid}-{i}")
                for name, value in _amqp_properties(pid, i).items():
                    setattr(event, name, value)
                batch.append(event)
            await producer.send_batch(batch, partition_id=str(pid))


async def _container(azurite: Any) -> str:
    from azure.storage.blob.aio import BlobServiceClient

    name = f"migration-{uuid.uuid4().hex[:12]}"
    async with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        await service.create_container(name)  # the official store does not create it
    return name


async def _checkpoints(implementation: str, storage: str, container: str, namespace: str, hub: str,
                       group: str) -> dict[str, tuple[int, str]]:
    """Checkpoints as ``implementation``'s store reads them: (sequence number, offset)."""
    _client, BlobCheckpointStore = _classes(implementation)
    store = BlobCheckpointStore.from_connection_string(storage, container)
    try:
        found = await store.list_checkpoints(namespace, hub, group)
    finally:
        await store.close()
    if implementation in ("official", "one-import"):
        return {c["partition_id"]: (int(c["sequence_number"]), str(c["offset"])) for c in found}
    return {c.partition_id: (c.sequence_number, str(c.offset)) for c in found}


def _namespace(conn: str) -> str:
    from azure.eventhub import parse_connection_string

    return parse_connection_string(conn).fully_qualified_namespace


async def test_one_set_of_callbacks_gives_the_same_results_under_both_clients(eventhubs_emulator, azurite):
    conn, storage = eventhubs_emulator.connection_string, azurite.connection_string
    hub = eventhubs_emulator.fresh_hub(PARTITIONS)
    container = await _container(azurite)
    await _produce(conn, hub, "a", 23)
    groups = {"official": "cg1", "ours": "cg2"}
    runs = {impl: await consume(impl, conn=conn, hub=hub, group=group, storage=storage, container=container,
                                expected=23 * PARTITIONS)
            for impl, group in groups.items()}
    official, ours = runs["official"], runs["ours"]

    expected = {str(p): [(i, f"a-{p}-{i}") for i in range(23)] for p in range(PARTITIONS)}
    assert dict(official.events) == expected
    assert dict(ours.events) == expected
    assert sorted(official.initialized) == sorted(ours.initialized) == [str(p) for p in range(PARTITIONS)]
    assert sorted(official.closed) == sorted(ours.closed) == [(str(p), "SHUTDOWN") for p in range(PARTITIONS)]
    assert official.last_enqueued == ours.last_enqueued == {str(p): 22 for p in range(PARTITIONS)}
    assert official.names == {(hub, "cg1")} and ours.names == {(hub, "cg2")}
    assert official.errors == ours.errors == []

    # Each side's checkpoints, read back through the other side's store, and compared.
    namespace = _namespace(conn)
    written_by_official = await _checkpoints("ours", storage, container, namespace, hub, "cg1")
    written_by_ours = await _checkpoints("official", storage, container, namespace, hub, "cg2")
    assert written_by_official == written_by_ours
    assert {pid: seq for pid, (seq, _offset) in written_by_ours.items()} == {str(p): 22 for p in range(PARTITIONS)}


@pytest.mark.parametrize("order", [("official", "ours", "official"), ("ours", "official", "ours"),
                                   ("official", "one-import", "official")],
                         ids=["official-then-ours", "ours-then-official", "official-then-one-import"])
async def test_each_client_resumes_from_the_other_s_checkpoints(eventhubs_emulator, azurite, order):
    conn, storage = eventhubs_emulator.connection_string, azurite.connection_string
    hub = eventhubs_emulator.fresh_hub(PARTITIONS)
    container = await _container(azurite)
    group = "cg1"
    phases = [("a", 0, 12), ("b", 12, 20), ("c", 20, 25)]  # (label, first sequence number, end)
    for implementation, (label, first, end) in zip(order, phases, strict=False):
        await _produce(conn, hub, label, end - first)
        run = await consume(implementation, conn=conn, hub=hub, group=group, storage=storage, container=container,
                            expected=(end - first) * PARTITIONS)
        assert run.sequence_numbers() == {str(p): list(range(first, end)) for p in range(PARTITIONS)}, (
            f"{implementation} did not resume exactly after the previous run's checkpoints")
        assert run.errors == []
    checkpoints = await _checkpoints(order[0], storage, container, _namespace(conn), hub, group)
    assert {pid: seq for pid, (seq, _offset) in checkpoints.items()} == {str(p): 24 for p in range(PARTITIONS)}


async def test_amqp_message_properties_read_the_same_under_both_clients(eventhubs_emulator, azurite):
    """A producer's message_id, content_type and correlation_id reach both clients'
    callbacks with the same values (a user who reads ``event.message_id`` after migrating
    gets what the producer set, not None)."""
    conn, storage = eventhubs_emulator.connection_string, azurite.connection_string
    hub = eventhubs_emulator.fresh_hub(PARTITIONS)
    container = await _container(azurite)
    await _produce_with_amqp_properties(conn, hub, 6)
    runs = {impl: await consume(impl, conn=conn, hub=hub, group=group, storage=storage, container=container,
                                expected=6 * PARTITIONS)
            for impl, group in {"official": "cg1", "ours": "cg2"}.items()}
    official, ours = runs["official"], runs["ours"]
    assert official.errors == ours.errors == []

    seen = {pid: [(seq, message_id, content_type, correlation_id)
                  for seq, message_id, content_type, correlation_id, _system, _raw in events]
            for pid, events in official.amqp.items()}
    expected = {str(p): [(i, *(_amqp_properties(p, i).get(name)
                               for name in ("message_id", "content_type", "correlation_id")))
                         for i in range(6)]
                for p in range(PARTITIONS)}
    assert seen == expected  # what the producer set, as the official client reads it
    assert dict(ours.amqp) == dict(official.amqp)  # and ours reads exactly the same, raw values included
