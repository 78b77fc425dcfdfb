"""The azure-eventhub adapter: configuration, conversion, receiving, and how it fails.

Receiving and failures run against the session's Event Hubs emulator (the official
client talks to it unchanged), so every path here carries real AMQP traffic.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import pytest
from azure.eventhub.exceptions import AuthenticationError, ConnectError, ConnectionLostError, OperationTimeoutError

from eventprocessor import (
    ConfigurationError,
    EventPosition,
    EventProcessor,
    EventSourceError,
    PartitionProcessor,
    ReceiverDisconnectedError,
)
from eventprocessor.sources.eventhub import (
    EventHubSource,
    lean_receive_supported,
    message_to_event,
    to_event,
    to_starting_position,
)
from eventprocessor.stores import InMemoryCheckpointStore

SECRET = "c2VjcmV0LWtleS1kby1ub3QtbGVhaw=="
CONN = f"Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey={SECRET};EntityPath=telemetry"


def _closed_port() -> int:
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _emulator_conn(port: int, key: str = SECRET, hub: str = "hub") -> str:
    return (f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey={key};EntityPath={hub};"
            "UseDevelopmentEmulator=true")


# ----------------------------------------------------------------------------- configuration

def test_from_connection_string_reads_namespace_and_hub_and_hides_the_key():
    source = EventHubSource.from_connection_string(CONN)
    assert source.fully_qualified_namespace == "example.servicebus.windows.net"
    assert source.eventhub_name == "telemetry"
    assert SECRET not in repr(source) and SECRET not in str(source.client_options)
    assert source.client_options == {"idle_timeout": 30.0} and source.credential is None


def test_client_options_are_a_read_only_view_with_secrets_masked():
    proxy = {"proxy_hostname": "127.0.0.1", "proxy_port": 3128, "username": "u", "password": SECRET}
    source = EventHubSource.from_connection_string(CONN, http_proxy=proxy, retry_total=2, custom_token=SECRET)
    options = source.client_options
    assert options["http_proxy"] == {"proxy_hostname": "127.0.0.1", "proxy_port": 3128, "username": "u",
                                     "password": "***"}
    assert options["custom_token"] == "***" and options["retry_total"] == 2 and options["idle_timeout"] == 30.0
    assert SECRET not in repr(options) and SECRET not in str(dict(options))
    with pytest.raises(TypeError):
        options["retry_total"] = 5  # type: ignore[index]
    options["http_proxy"]["proxy_port"] = 1  # a copy: the source's own options are untouched
    assert source.client_options["http_proxy"]["proxy_port"] == 3128 and proxy["password"] == SECRET


def test_lean_receive_false_chooses_the_public_path_and_anything_else_is_refused():
    assert not EventHubSource.from_connection_string(CONN, lean_receive=False).uses_lean_receive
    with pytest.raises(ConfigurationError, match="lean_receive must be True .* or False .*, got 'no'"):
        EventHubSource.from_connection_string(CONN, lean_receive="no")


@pytest.mark.parametrize("bad", ["", "not a connection string", "Endpoint=;SharedAccessKey=" + SECRET])
def test_malformed_connection_strings_are_named_without_echoing_them(bad):
    with pytest.raises(ConfigurationError) as info:
        EventHubSource.from_connection_string(bad)
    assert SECRET not in str(info.value)
    assert "connection string" in str(info.value) or "event hub name" in str(info.value)


def test_hub_name_must_agree_with_entity_path():
    with pytest.raises(ConfigurationError, match="differs"):
        EventHubSource.from_connection_string(CONN, eventhub_name="other")


@pytest.mark.parametrize("option, value", [("operation_timeout", 0), ("partition_ids_ttl", -1)])
def test_bad_timeouts_are_configuration_errors(option, value):
    with pytest.raises(ConfigurationError, match=option):
        EventHubSource.from_connection_string(CONN, **{option: value})


def test_positions_map_to_receive_arguments():
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert to_starting_position(EventPosition.earliest()) == ("-1", False)
    assert to_starting_position(EventPosition.latest()) == ("@latest", False)
    assert to_starting_position(EventPosition.from_sequence_number(7)) == (7, False)
    assert to_starting_position(EventPosition.from_offset("128", inclusive=True)) == ("128", True)
    assert to_starting_position(EventPosition.from_enqueued_time(when)) == (when, False)


def test_event_data_and_raw_messages_convert_to_the_same_event():
    from azure.eventhub import EventData
    from azure.eventhub._pyamqp.message import Message, Properties

    annotations = {b"x-opt-sequence-number": 41, b"x-opt-offset": b"8192",
                   b"x-opt-enqueued-time": 1_767_225_600_123, b"x-opt-partition-key": b"device-7"}
    message = Message(data=[b"pay", b"load"], message_annotations=annotations,
                      application_properties={b"kind": b"reading", "unit": "C"},
                      properties=Properties(message_id=b"order-17", content_type=b"application/json",
                                            correlation_id=uuid.UUID(int=9)))
    lean = message_to_event(message)
    public = to_event(EventData._from_message(message))
    assert lean == public
    assert (lean.message_id, lean.content_type, lean.correlation_id) == (
        "order-17", "application/json", uuid.UUID(int=9))  # as EventData reads them: strings decoded
    bare = Message(data=[b"x"], message_annotations=annotations)
    assert message_to_event(bare) == to_event(EventData._from_message(bare))
    assert (message_to_event(bare).message_id, message_to_event(bare).content_type,
            message_to_event(bare).correlation_id) == (None, None, None)
    assert lean.body == b"payload" and lean.sequence_number == 41 and lean.offset == "8192"
    assert lean.partition_key == "device-7" and lean.properties == {"kind": b"reading", "unit": "C"}
    assert lean.enqueued_time == datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=timezone.utc)


def test_each_event_gets_its_own_enqueued_time_when_consecutive_events_share_one():
    """message_to_event reuses the datetime of the previous event when the enqueued time
    is the same (events sent together); a different one is never reused."""
    from azure.eventhub._pyamqp.message import Message

    times = [1_767_225_600_123, 1_767_225_600_123, 1_767_225_600_124, 1_767_225_600_123, 0]
    events = [message_to_event(Message(data=[b"x"], message_annotations={
        b"x-opt-sequence-number": n, b"x-opt-offset": b"0", b"x-opt-enqueued-time": ms})) for n, ms in enumerate(times)]
    assert [e.enqueued_time for e in events] == [datetime.fromtimestamp(ms / 1000, timezone.utc) for ms in times]


def test_the_installed_azure_eventhub_offers_the_lean_receive_path():
    """Fails loudly when azure-eventhub changes the consumer internals EventHubSource
    drives. It still works then (through receive_batch), but slower: update
    eventprocessor/sources/eventhub/lean.py."""
    import azure.eventhub
    from azure.eventhub.aio import EventHubConsumerClient

    assert lean_receive_supported(EventHubConsumerClient), (
        f"azure-eventhub {azure.eventhub.__version__} no longer offers _create_consumer / EventHubConsumer._open: "
        "EventHubSource falls back to receive_batch")
    assert EventHubSource.from_connection_string(CONN).uses_lean_receive


async def test_token_credential_constructor_builds_a_client_per_consumer_group():
    from azure.core.credentials import AzureNamedKeyCredential

    credential = AzureNamedKeyCredential("listen", SECRET)
    source = EventHubSource("example.servicebus.windows.net", "telemetry", credential)
    assert source.credential is credential
    receiver = await source.open_receiver("0", consumer_group="analytics", starting_position=EventPosition.earliest(),
                                          owner_level=3, prefetch=10)
    assert list(source.clients) == ["analytics"]
    client = source.clients["analytics"]
    assert client.eventhub_name == "telemetry" and client._consumer_group == "analytics"
    assert SECRET not in repr(source) and SECRET not in repr(receiver)
    await receiver.close()
    await source.close()


# ----------------------------------------------------------------------------- receiving

async def _produce(conn: str, hub: str, per_partition: int, partitions: int = 4) -> None:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        for pid in range(partitions):
            batch = []
            for i in range(per_partition):
                event = EventData(f"{pid}-{i}")
                event.message_id, event.correlation_id = f"m-{pid}-{i}", f"c-{pid}"
                event.content_type = "text/plain"
                batch.append(event)
            await producer.send_batch(batch, partition_id=str(pid))


async def _drain(receiver, count: int, batch: int = 50, timeout: float = 20.0) -> list[Any]:
    events: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events.extend(await receiver.receive(batch, 0.5))
    return events


@pytest.mark.eventhubs
async def test_receivers_start_where_asked_and_return_small_batches(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 30)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    try:
        assert await source.get_partition_ids() == ["0", "1", "2", "3"]
        cases = [(EventPosition.earliest(), 0), (EventPosition.from_sequence_number(9), 10),
                 (EventPosition.from_sequence_number(9, inclusive=True), 9)]
        receivers = [await source.open_receiver("2", consumer_group=group, starting_position=position,
                                                owner_level=None, prefetch=20)
                     for (position, _first), group in zip(cases, ["$default", "cg1", "cg2"], strict=False)]
        results = await asyncio.gather(*(_drain(r, 30 - first, batch=7)
                                         for r, (_p, first) in zip(receivers, cases, strict=True)))
        for (position, first), events in zip(cases, results, strict=False):
            assert [e.sequence_number for e in events] == list(range(first, 30)), position
            assert [e.body for e in events] == [f"2-{i}".encode() for i in range(first, 30)]
            assert [(e.message_id, e.content_type, e.correlation_id) for e in events] == [
                (f"m-2-{i}", "text/plain", "c-2") for i in range(first, 30)]
        assert all(len(batch) <= 7 for batch in [await receivers[0].receive(7, 0.2)])
        for receiver in receivers:
            await receiver.close()
        latest = await source.open_receiver("2", consumer_group="$default", starting_position=EventPosition.latest(),
                                            owner_level=None, prefetch=20)
        assert await latest.receive(10, 1.0) == []  # nothing new yet: an empty batch after max_wait_time
        await latest.close()
    finally:
        await source.close()


@pytest.mark.eventhubs
async def test_a_trickle_is_delivered_as_it_arrives_not_once_the_prefetch_fills(eventhubs_emulator, hub):
    """azure-eventhub's client reads as many frames per call as it is asked for, and only
    stops early when the socket stays quiet for 0.2 s. Asked for the whole prefetch (300),
    a partition receiving 5 events every 0.1 s would hold them for up to 6 s, and a
    partition that just moved would wait that long for its first batch."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    conn = eventhubs_emulator.connection_string
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    sent_at: list[float] = []
    latencies: list[float] = []
    try:
        receiver = await source.open_receiver("1", consumer_group="$default",
                                              starting_position=EventPosition.earliest(), owner_level=None,
                                              prefetch=300)
        assert await receiver.receive(300, 0.5) == []  # the link is open

        async def receive() -> None:
            while len(latencies) < 100:
                for event in await receiver.receive(300, None):
                    latencies.append(time.monotonic() - sent_at[event.sequence_number])

        reading = asyncio.create_task(receive())
        async with producer:
            for _round in range(20):
                await producer.send_batch([EventData(b"t") for _ in range(5)], partition_id="1")
                sent_at.extend([time.monotonic()] * 5)  # from the moment the hub has them
                await asyncio.sleep(0.1)
        await asyncio.wait_for(reading, 30)
        await receiver.close()
    finally:
        await source.close()
    assert len(latencies) == 100
    assert max(latencies) < 1.0, f"events waited up to {max(latencies):.2f} s in the receiver (median " \
                                 f"{sorted(latencies)[50]:.2f} s)"


async def _count_reads(receiver, monkeypatch, cancelled: Any = None) -> tuple[list[int], list[Any]]:
    """Open ``receiver`` and count the frames of each read it asks the client for (a
    spy on the client's receive handler class; the frames are still read by the client
    itself), and append to ``cancelled`` each read that was cancelled. Returns the
    frames and what the opening read delivered (one event at most: callers account for
    it)."""
    from azure.eventhub._pyamqp.aio._client_async import ReceiveClientAsync

    opened = await receiver.receive(1, 0.01)
    frames: list[int] = []
    read = ReceiveClientAsync.do_work_async

    async def counted(self: Any, **kwargs: Any) -> Any:
        frames.append(kwargs.get("batch", 1))
        try:
            return await read(self, **kwargs)
        except asyncio.CancelledError:
            if cancelled is not None:
                cancelled.append(kwargs.get("batch", 1))
            raise

    monkeypatch.setattr(ReceiveClientAsync, "do_work_async", counted)
    return frames, opened


@pytest.mark.eventhubs
async def test_a_backlog_is_read_in_few_large_reads(eventhubs_emulator, hub, monkeypatch):
    """Each read the client is asked for costs about as much as several frames. A
    receiver that asked for 4 frames at a time spent about 4.5 µs per event more than
    one asking for its whole credit; reads now grow while they come back full. (The e2e
    floors, ``harness/worker/floor.py``, read 64 frames at a time: more per call kept
    thousands of messages alive for the cyclic garbage collector.)"""
    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 3000, partitions=1)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    try:
        receiver = await source.open_receiver("0", consumer_group="$default",
                                              starting_position=EventPosition.earliest(), owner_level=None,
                                              prefetch=300)
        frames, opened = await _count_reads(receiver, monkeypatch)
        first = opened[-1].sequence_number if opened else None
        events = await _drain(receiver, 2999 - (first if first is not None else -1), batch=300)
        await receiver.close()
    finally:
        await source.close()
    assert events[-1].sequence_number == 2999
    assert [e.sequence_number for e in events] == list(range(events[0].sequence_number, 3000))
    assert len(frames) < 100, f"{len(frames)} reads for 3000 events; frames asked: {frames[:40]}"
    assert max(frames) > 16


@pytest.mark.eventhubs
async def test_a_trickle_right_after_a_backlog_is_not_held_by_the_large_reads(eventhubs_emulator, hub, monkeypatch):
    """A large read asks for frames that may not come for a while: once the backlog
    is drained, events arriving 5 every 0.1 s must still be delivered as they arrive,
    not when the read's frames are all there. And no read of the client is ever
    cancelled while the receiver is open: the client sends its link and session flow
    frames from inside a read, and a version that cut reads by cancelling them left
    the hub without credit (a benchmark run stalled for good)."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 2000, partitions=1)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    sent_at: dict = {}
    latencies: list[float] = []
    try:
        receiver = await source.open_receiver("0", consumer_group="$default",
                                              starting_position=EventPosition.earliest(), owner_level=None,
                                              prefetch=300)
        cancelled: list[int] = []
        frames, opened = await _count_reads(receiver, monkeypatch, cancelled)
        backlog = await _drain(receiver, 1999 - (opened[-1].sequence_number if opened else 0), batch=300)
        assert backlog[-1].sequence_number == 1999 and max(frames) > 16  # the reads had grown

        async def receive() -> None:
            while len(latencies) < 100:
                for event in await receiver.receive(300, None):
                    latencies.append(time.monotonic() - sent_at[event.sequence_number])

        reading = asyncio.create_task(receive())
        async with producer:
            for round_ in range(20):
                await producer.send_batch([EventData(b"t") for _ in range(5)], partition_id="0")
                for number in range(2000 + 5 * round_, 2005 + 5 * round_):
                    sent_at[number] = time.monotonic()
                await asyncio.sleep(0.1)
        await asyncio.wait_for(reading, 30)
        assert cancelled == [], f"reads of {cancelled} frames were cancelled"
        await receiver.close()
    finally:
        await source.close()
    assert len(latencies) == 100
    assert max(latencies) < 1.0, f"events waited up to {max(latencies):.2f} s in the receiver (median " \
                                 f"{sorted(latencies)[50]:.2f} s)"


@pytest.mark.eventhubs
async def test_the_lean_receiver_takes_each_message_from_the_client_itself(eventhubs_emulator, hub, monkeypatch):
    """The consumer's own message callback takes an asyncio.Lock per message (about
    2.5 µs of the client's ~30 µs per event here); the lean receiver puts its own on the
    client's AMQP handler. Fails loudly when azure-eventhub no longer has that callback
    (the receiver then keeps the consumer's, and still works). A spy on the consumer's
    callback counts the messages it took; the public receive_batch path shows the spy
    sees them."""
    from azure.eventhub.aio._transport._pyamqp_transport_async import PyamqpTransportAsync

    taken: list[Any] = []
    original = PyamqpTransportAsync.message_received_async

    async def spy(consumer: Any, message: Any) -> None:
        taken.append(message)
        await original(consumer, message)

    monkeypatch.setattr(PyamqpTransportAsync, "message_received_async", staticmethod(spy))
    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 5, partitions=1)
    for lean in (True, False):
        source = EventHubSource.from_connection_string(conn, eventhub_name=hub, lean_receive=lean)
        try:
            receiver = await source.open_receiver("0", consumer_group="$default",
                                                  starting_position=EventPosition.earliest(), owner_level=None,
                                                  prefetch=10)
            events = await _drain(receiver, 5)
            assert [e.sequence_number for e in events] == [0, 1, 2, 3, 4]
            await receiver.close()
        finally:
            await source.close()
        if lean:
            assert taken == [], (
                "azure-eventhub's receive client no longer has _message_received_callback: EventHubSource keeps the "
                "consumer's (with its lock per message)")
    assert len(taken) >= 5, "the spy sees the messages of the public receive path"


@pytest.mark.eventhubs
async def test_a_receiver_that_stays_open_keeps_nothing_per_event_it_received(eventhubs_emulator, hub):
    """azure-eventhub's AMQP link adds the delivery tag of every message it receives to a
    set that only an outgoing disposition empties, and azure-eventhub sends none: a
    receiver that stays open grew by about 100 bytes per event, 90 MB per million
    (found by ``python -m benchmarks.soak``; the official consumer grows alike). Memory
    allocated by the client's AMQP code and still held after a round of events is
    measured with tracemalloc, between two moments when every event sent was received."""
    import tracemalloc

    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    conn = eventhubs_emulator.connection_string
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    receiver = await source.open_receiver("0", consumer_group="$default", starting_position=EventPosition.earliest(),
                                          owner_level=None, prefetch=100)
    received = [0]  # how many, in order; the events themselves are not kept (their ints are the codec's)

    async def send_and_receive(count: int) -> None:
        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
        async with producer:
            for _ in range(count // 500):
                await producer.send_batch([EventData(b"e") for _ in range(500)], partition_id="0")
        deadline = time.monotonic() + 30
        target = received[0] + count
        while received[0] < target and time.monotonic() < deadline:
            for event in await receiver.receive(100, 0.5):
                assert event.sequence_number == received[0]
                received[0] += 1

    amqp_code = [tracemalloc.Filter(True, "*azure/eventhub/_pyamqp/*")]
    try:
        await send_and_receive(1000)  # warm: the link, its buffers and the codec's caches
        tracemalloc.start()
        try:
            await send_and_receive(500)
            before = tracemalloc.take_snapshot().filter_traces(amqp_code)
            await send_and_receive(5000)
            after = tracemalloc.take_snapshot().filter_traces(amqp_code)
        finally:
            tracemalloc.stop()
        await receiver.close()
    finally:
        await source.close()
    assert received[0] == 6500
    grown = after.compare_to(before, "lineno")
    held = sum(stat.size_diff for stat in grown)
    assert held < 50_000, (f"the AMQP client held {held} more bytes after 5000 more events; most at "
                           + ", ".join(f"{stat.traceback} {stat.size_diff:+d} B" for stat in grown[:3]))


@pytest.mark.eventhubs
async def test_a_higher_owner_level_takes_the_partition_from_a_receiver(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 5)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    try:
        old = await source.open_receiver("1", consumer_group="$default", starting_position=EventPosition.earliest(),
                                         owner_level=1, prefetch=10)
        assert len(await _drain(old, 5)) == 5
        new = await source.open_receiver("1", consumer_group="$default", starting_position=EventPosition.earliest(),
                                         owner_level=2, prefetch=10)
        assert len(await _drain(new, 5)) == 5
        with pytest.raises(ReceiverDisconnectedError) as info:
            await asyncio.wait_for(old.receive(10, None), 10)
        assert info.value.partition_id == "1"
        assert isinstance(info.value, ConnectionLostError)  # what azure-eventhub reports for a stolen link
        stale = await source.open_receiver("1", consumer_group="$default", starting_position=EventPosition.earliest(),
                                           owner_level=1, prefetch=10)
        with pytest.raises(ReceiverDisconnectedError):
            await stale.receive(10, 1.0)
        for receiver in (old, new, stale):
            await receiver.close()
    finally:
        await source.close()


@pytest.mark.eventhubs
async def test_a_processor_consumes_the_hub_and_a_successor_resumes_from_its_checkpoints(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 50)
    store = InMemoryCheckpointStore()
    seen: list[tuple] = []

    class Recorder(PartitionProcessor):
        async def process_events(self, events, context):
            seen.extend((context.partition_id, e.sequence_number) for e in events)
            await context.update_checkpoint()

    async def run_until(count: int) -> None:
        source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
        processor = EventProcessor(source, store, Recorder, load_balancing_strategy="greedy",
                                   load_balancing_interval=0.3, partition_ownership_expiration_interval=3)
        try:
            async with processor:
                deadline = time.monotonic() + 30
                while len(seen) < count and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
        finally:
            await source.close()

    await run_until(200)
    assert sorted(seen) == sorted((str(p), s) for p in range(4) for s in range(50))
    checkpoints = await store.list_checkpoints(EventHubSource.from_connection_string(conn, eventhub_name=hub)
                                               .fully_qualified_namespace, hub, "$default")
    assert {c.partition_id: c.sequence_number for c in checkpoints} == {str(p): 49 for p in range(4)}
    await _produce(conn, hub, 10)
    await run_until(240)
    assert sorted(seen[200:]) == sorted((str(p), s) for p in range(4) for s in range(50, 60))


# ----------------------------------------------------------------------------- failures

async def test_an_unreachable_hub_fails_fast_naming_namespace_and_hub_never_the_key():
    source = EventHubSource.from_connection_string(_emulator_conn(_closed_port()))
    started = time.monotonic()
    with pytest.raises(EventSourceError) as info:
        await source.get_partition_ids()
    elapsed = time.monotonic() - started
    await source.close()
    error = info.value
    assert error.reason == "unreachable" and elapsed < 5.0
    assert isinstance(error, ConnectError)  # azure-eventhub's class for it too
    assert error.eventhub_name == "hub" and error.fully_qualified_namespace.startswith("127.0.0.1:")
    assert "'hub'" in str(error) and "127.0.0.1" in str(error) and SECRET not in str(error)


async def test_an_unresolvable_host_fails_fast_too():
    conn = ("Endpoint=sb://no-such-namespace.invalid;SharedAccessKeyName=k;"
            f"SharedAccessKey={SECRET};EntityPath=hub;UseDevelopmentEmulator=true")
    source = EventHubSource.from_connection_string(conn)
    started = time.monotonic()
    with pytest.raises(EventSourceError) as info:
        await source.get_partition_ids()
    await source.close()
    assert info.value.reason == "unreachable" and time.monotonic() - started < 5.0
    assert "no-such-namespace.invalid" in str(info.value) and SECRET not in str(info.value)


async def test_a_host_that_never_answers_times_out_within_the_operation_timeout():
    async def silent(reader, writer):
        await reader.read()  # accept, then say nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    source = EventHubSource.from_connection_string(_emulator_conn(port), operation_timeout=1.5)
    started = time.monotonic()
    try:
        with pytest.raises(EventSourceError) as info:
            await source.get_partition_ids()
    finally:
        await source.close()
        server.close()
    assert info.value.reason == "timeout" and 1.4 < time.monotonic() - started < 4.0
    assert isinstance(info.value, OperationTimeoutError)


@pytest.mark.eventhubs
async def test_unknown_hub_and_consumer_group_are_not_found_errors(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    missing = EventHubSource.from_connection_string(conn, eventhub_name="no-such-hub")
    with pytest.raises(EventSourceError) as info:
        await missing.get_partition_ids()
    await missing.close()
    assert info.value.reason == "not-found" and "'no-such-hub'" in str(info.value)
    # The service refuses the token for a hub that does not exist: the client's AuthenticationError.
    assert isinstance(info.value, AuthenticationError) and "could not be found" in str(info.value)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    receiver = await source.open_receiver("0", consumer_group="no-such-group",
                                          starting_position=EventPosition.earliest(), owner_level=1, prefetch=10)
    with pytest.raises(EventSourceError) as info:
        await receiver.receive(10, 5)
    await receiver.close()
    await source.close()
    assert info.value.reason == "not-found" and "'no-such-group'" in str(info.value)
    assert isinstance(info.value, ConnectionLostError)  # as the client maps amqp:not-found on a link


@pytest.mark.eventhubs
async def test_a_position_past_the_end_is_refused(eventhubs_emulator, hub):
    source = EventHubSource.from_connection_string(eventhubs_emulator.connection_string, eventhub_name=hub)
    receiver = await source.open_receiver("3", consumer_group="$default",
                                          starting_position=EventPosition.from_sequence_number(500), owner_level=1,
                                          prefetch=10)
    with pytest.raises(EventSourceError) as info:
        await receiver.receive(10, 5)
    await receiver.close()
    await source.close()
    assert info.value.reason == "refused" and "partition '3'" in str(info.value)
    assert isinstance(info.value, ConnectError)  # a vendor condition on a link: the client's ConnectError


async def test_a_rejected_credential_is_an_unauthorized_error_without_the_key(caplog):
    from eventprocessor.emulators.eventhubs import EventHubsEmulator

    caplog.set_level(logging.DEBUG)
    async with EventHubsEmulator(eventhubs=["hub"], partitions=2, sas_key="the-right-key") as emulator:
        source = EventHubSource.from_connection_string(_emulator_conn(emulator.port, key=SECRET))
        with pytest.raises(EventSourceError) as info:
            await source.get_partition_ids()
        receiver = await source.open_receiver("0", consumer_group="$default",
                                              starting_position=EventPosition.earliest(), owner_level=1, prefetch=5)
        with pytest.raises(EventSourceError) as on_receive:
            await receiver.receive(5, 5)
        await receiver.close()
        await source.close()
    assert info.value.reason == "unauthorized" and on_receive.value.reason == "unauthorized"
    assert SECRET not in str(info.value) + str(on_receive.value) + caplog.text


async def test_an_unreachable_hub_reaches_the_error_handler_within_5_seconds(caplog):
    """The issue's row: start() with an unreachable hub gave no error for 12 s and then
    blamed the store. Now the source error reaches error_handler at the first tick."""
    source = EventHubSource.from_connection_string(_emulator_conn(_closed_port()))
    errors: list[Exception] = []

    async def on_error(error, context):
        errors.append(error)

    caplog.set_level(logging.DEBUG)
    processor = EventProcessor(source, InMemoryCheckpointStore(), PartitionProcessor, error_handler=on_error,
                               load_balancing_interval=0.2, partition_ownership_expiration_interval=2)
    started = time.monotonic()
    await processor.start()
    try:
        while not errors and time.monotonic() - started < 5.0:
            await asyncio.sleep(0.05)
        first_error_after = time.monotonic() - started
        while processor.ticks < 3 and time.monotonic() - started < 15:
            await asyncio.sleep(0.05)
    finally:
        await processor.stop()
        await source.close()
    assert errors, "the unreachable hub was not reported within 5 s"
    assert first_error_after < 5.0
    assert isinstance(errors[0], EventSourceError) and errors[0].reason == "unreachable"
    assert errors[0].eventhub_name == "hub"
    assert processor.ticks >= 3 and processor.owned_partitions == frozenset()  # it keeps trying
    assert SECRET not in caplog.text


async def test_a_source_failure_is_not_logged_as_a_store_failure(caplog):
    source = EventHubSource.from_connection_string(_emulator_conn(_closed_port()))
    caplog.set_level(logging.DEBUG)
    processor = EventProcessor(source, InMemoryCheckpointStore(), PartitionProcessor,
                               load_balancing_interval=0.2, partition_ownership_expiration_interval=2)
    await processor.start()
    try:
        started = time.monotonic()
        while processor.ticks < 2 and time.monotonic() - started < 10:
            await asyncio.sleep(0.05)
    finally:
        await processor.stop()
        await source.close()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("eventprocessor")]
    assert errors and all("ownership" not in r.getMessage() for r in caplog.records
                          if r.name.startswith("eventprocessor._ownership.lease_table"))


@pytest.mark.eventhubs
async def test_the_public_receive_batch_fallback_reads_and_is_fenced_too(eventhubs_emulator, hub):
    """What a future azure-eventhub without the internals gets: slower, same behaviour."""
    conn = eventhubs_emulator.connection_string
    await _produce(conn, hub, 12)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub, lean_receive=False)
    lean = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    try:
        fallback = await source.open_receiver("0", consumer_group="$default",
                                              starting_position=EventPosition.from_sequence_number(1),
                                              owner_level=1, prefetch=10)
        assert type(fallback).__name__ == "_BatchReceiver"
        events = await _drain(fallback, 10)
        assert [e.sequence_number for e in events] == list(range(2, 12))
        assert events[0].body == b"0-2" and events[0].partition_key is None
        assert (events[0].message_id, events[0].content_type, events[0].correlation_id) == ("m-0-2", "text/plain",
                                                                                           "c-0")
        taker = await lean.open_receiver("0", consumer_group="$default", starting_position=EventPosition.latest(),
                                         owner_level=2, prefetch=10)
        assert await taker.receive(10, 0.5) == []
        with pytest.raises(ReceiverDisconnectedError):
            await asyncio.wait_for(_drain(fallback, 1000, timeout=15), 20)
        await fallback.close()
        await taker.close()
    finally:
        await source.close()
        await lean.close()
