"""The emulator as the official client sees the service: what azure-eventhub's own live
tests found the emulator doing differently from Event Hubs, each as a test with the
official client (or, below what it exposes, the raw AMQP peer of ``tests/amqp_peer.py``).

* A partition key on a send to a partition (azure-eventhub's buffered producer maps the
  key to a partition itself and sends there with the key) is accepted and kept.
* Delivery annotations a producer sets are delivered with the event, beside the
  service's own runtime ones.
* A receiver attached without a starting-position filter starts at the beginning of
  the partition. The service does: azure-eventhub's ``test_send_with_long_interval_async``
  sends two events, then opens a receiver without a filter and reads both.
* A producer or a management call for a hub that does not exist fails when it connects:
  the service answers the token (``put-token``) for it with 404, which the client
  raises as ``AuthenticationError``, a ``ConnectError``.
* AMQP over WebSockets (``TransportType.AmqpOverWebsocket``), the transport of clients
  behind HTTP proxies, on the emulator's own port: the official producer and consumer,
  :class:`EventHubSource` and the drop-in consumer over it.

All tests use the session's emulator and fresh hubs.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from azure.eventhub import EventData, TransportType
from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.amqp import AmqpAnnotatedMessage
from azure.eventhub.exceptions import ConnectError

from tests.amqp_peer import RawPeer, key_of

pytestmark = pytest.mark.eventhubs


async def _read(conn: str, hub: str, partition_id: str, count: int, *, timeout: float = 20.0,
                **options: Any) -> list[tuple[Any, Any]]:
    """``count`` events (with their contexts) of one partition, from the start, through
    the official consumer."""
    consumer = EventHubConsumerClient.from_connection_string(conn, consumer_group="$default", eventhub_name=hub,
                                                             **options.pop("client", {}))
    got: list[tuple[Any, Any]] = []
    enough = asyncio.Event()

    async def on_event_batch(context: Any, events: list[Any]) -> None:
        got.extend((event, context) for event in events)
        if len(got) >= count:
            enough.set()

    async with consumer:
        task = asyncio.create_task(consumer.receive_batch(on_event_batch, partition_id=partition_id,
                                                          starting_position="-1", **options))
        try:
            await asyncio.wait_for(enough.wait(), timeout)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return got


async def test_the_buffered_producer_sends_each_key_to_its_partition_with_the_key(eventhubs_emulator):
    from azure.eventhub._buffered_producer._partition_resolver import PartitionResolver

    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    keys = [f"device-{i}" for i in range(6)]
    sent: list[str] = []
    failed: list[Exception] = []

    async def on_success(events: list[EventData], _pid: str | None) -> None:
        sent.extend(event.body_as_str() for event in events)

    async def on_error(_events: list[EventData], _pid: str | None, error: Exception) -> None:
        failed.append(error)

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub, buffered_mode=True,
                                                             on_success=on_success, on_error=on_error,
                                                             max_wait_time=0.2, retry_total=0)
    async with producer:
        for key in keys:
            for index in range(2):
                await producer.send_event(EventData(f"{key} {index}"), partition_key=key)
        await producer.flush()
    assert failed == [] and len(sent) == 12
    expected = {key: PartitionResolver(["0", "1", "2", "3"]).get_partition_id_by_partition_key(key) for key in keys}
    where: dict[str, set[str]] = {}
    for pid in sorted(set(expected.values())):
        count = sum(1 for key in keys if expected[key] == pid) * 2
        for event, _context in await _read(conn, hub, pid, count):
            key = event.body_as_str().split()[0]
            assert event.partition_key == key.encode()
            where.setdefault(key, set()).add(pid)
    assert where == {key: {pid} for key, pid in expected.items()}


async def test_delivery_annotations_a_producer_set_are_delivered_beside_the_service_s_own(eventhubs_emulator):
    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)

    def annotated(index: int) -> AmqpAnnotatedMessage:
        return AmqpAnnotatedMessage(data_body=[b"aa", b"bb"], header={"priority": 10},
                                    delivery_annotations={"delann_key": f"delann_value {index}"},
                                    application_properties={"index": index})

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        await producer.send_event(annotated(0), partition_id="1")
        await producer.send_batch([annotated(1), annotated(2)], partition_id="1")
    for track in (False, True):
        received = await _read(conn, hub, "1", 3, track_last_enqueued_event_properties=track)
        for index, (event, context) in enumerate(received):
            raw = event.raw_amqp_message
            assert raw.delivery_annotations[b"delann_key"] == f"delann_value {index}".encode()
            assert raw.header.priority == 10 and list(raw.body) == [b"aa", b"bb"]
            if track:
                assert raw.delivery_annotations[b"last_enqueued_sequence_number"] == 2
                assert context.last_enqueued_event_properties["sequence_number"] == 2


async def test_a_receiver_without_a_starting_position_filter_starts_at_the_beginning(eventhubs_emulator):
    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        await producer.send_batch([EventData(f"e{i}") for i in range(3)], partition_id="2")
    peer = await RawPeer.connect(eventhubs_emulator.port, key=key_of(eventhubs_emulator.connection_string))
    try:
        handle = peer.attach_receiver(f"{hub}/ConsumerGroups/$default/Partitions/2")  # no filter
        assert (await peer.frame())[1].name == "attach"
        peer.flow(handle, delivery_count=0, link_credit=10)
        transfers = await peer.frames_until_quiet()
    finally:
        await peer.close()
    assert [frame.name for frame in transfers] == ["transfer"] * 3


async def test_a_producer_for_a_hub_that_does_not_exist_fails_to_connect(eventhubs_emulator):
    conn = eventhubs_emulator.connection_string
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name="nemo", retry_total=0)
    async with producer:
        with pytest.raises(ConnectError, match="could not be found"):
            await producer.create_batch()
        with pytest.raises(ConnectError, match="could not be found"):
            await producer.send_batch([EventData("x")], partition_id="0")
    consumer = EventHubConsumerClient.from_connection_string(conn, "$default", eventhub_name="nemo", retry_total=0)
    async with consumer:
        with pytest.raises(ConnectError, match="could not be found"):
            await consumer.get_eventhub_properties()


def _over_websockets(port: int) -> dict[str, Any]:
    """What a client needs to reach the emulator over WebSockets: the transport, and the
    emulator's port (a WebSocket client goes to port 443 unless told otherwise)."""
    return {"transport_type": TransportType.AmqpOverWebsocket, "custom_endpoint_address": f"sb://127.0.0.1:{port}"}


async def test_amqp_over_websockets_for_the_official_clients_the_source_and_the_drop_in(eventhubs_emulator):
    from eventprocessor import EventHubConsumerClient as DropIn
    from eventprocessor.events import EventPosition
    from eventprocessor.sources.eventhub import EventHubSource

    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    websockets = _over_websockets(eventhubs_emulator.port)
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub, **websockets)
    async with producer:
        assert (await producer.get_eventhub_properties())["partition_ids"] == ["0", "1", "2", "3"]
        await producer.send_batch([EventData(f"ws {i}") for i in range(3)], partition_id="0")
    official = await _read(conn, hub, "0", 3, client=websockets)
    assert [event.body_as_str() for event, _context in official] == ["ws 0", "ws 1", "ws 2"]

    source = EventHubSource.from_connection_string(conn, eventhub_name=hub, **websockets)
    try:
        receiver = await source.open_receiver("0", consumer_group="$default",
                                              starting_position=EventPosition.earliest(), owner_level=None)
        events: list[Any] = []
        while len(events) < 3:
            events += await receiver.receive(10, 5.0)
        await receiver.close()
    finally:
        await source.close()
    assert [event.body_as_str() for event in events] == ["ws 0", "ws 1", "ws 2"]

    got: list[str] = []
    enough = asyncio.Event()

    async def on_event(_context: Any, event: Any) -> None:
        got.append(event.body_as_str())
        if len(got) == 3:
            enough.set()

    client = DropIn.from_connection_string(conn, "$default", eventhub_name=hub, **websockets)
    async with client:
        task = asyncio.create_task(client.receive(on_event, partition_id="0", starting_position="-1"))
        try:
            await asyncio.wait_for(enough.wait(), 20)
        finally:
            await client.close()
            await task
    assert got == ["ws 0", "ws 1", "ws 2"]
