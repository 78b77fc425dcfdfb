"""Conformance of the Event Hubs emulator, proven with the official ``azure-eventhub`` client.

Nothing of this SDK runs here: the official producer and consumer talk to the
emulator, and each test states a service behaviour this SDK relies on. A few
properties below what the client exposes (exact credit, refusal frames, garbage on
the socket) use a raw AMQP peer (``tests/amqp_peer.py``).

All tests share one emulator process (the ``eventhubs_emulator`` session fixture) and
each takes fresh hubs from its pool, so they never see each other's events. Tests
that need other settings (a token key, a tiny retention) start their own emulator in
the test's event loop.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from azure.eventhub import EventData
from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient
from azure.eventhub.exceptions import AuthenticationError, ConnectError, ConnectionLostError, EventHubError

from eventprocessor.emulators.eventhubs import EventHubsEmulator
from tests.amqp_peer import RawPeer, key_of

pytestmark = pytest.mark.eventhubs


async def _send(conn: str, hub: str, bodies: list[str], **batch_options: Any) -> None:
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        batch = await producer.create_batch(**batch_options)
        for body in bodies:
            batch.add(EventData(body))
        await producer.send_batch(batch)


async def _receive(conn: str, hub: str, partition_id: str, count: int, *, starting_position: Any = "-1",
                   inclusive: bool = False, consumer_group: str = "$default", timeout: float = 20.0,
                   grace: float = 0.3, **options: Any) -> list[Any]:
    """Events of one partition through the official consumer: ``count`` of them (or what
    came before ``timeout``), plus anything that arrives within ``grace`` after."""
    consumer = EventHubConsumerClient.from_connection_string(conn, consumer_group=consumer_group, eventhub_name=hub)
    got: list[Any] = []
    enough = asyncio.Event()

    async def on_batch(context: Any, events: list[Any]) -> None:
        got.extend((event, context) for event in events)
        if len(got) >= count:
            enough.set()

    async with consumer:
        task = asyncio.create_task(consumer.receive_batch(
            on_batch, partition_id=partition_id, starting_position=starting_position,
            starting_position_inclusive=inclusive, **options))
        try:
            await asyncio.wait_for(enough.wait(), timeout)
            await asyncio.sleep(grace)
        except asyncio.TimeoutError:
            pass
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return [event for event, _context in got] if not options.get("track_last_enqueued_event_properties") else got


async def test_properties_of_hub_and_partitions(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        properties = await producer.get_eventhub_properties()
        assert properties["eventhub_name"] == hub
        assert properties["partition_ids"] == ["0", "1", "2", "3"]
        assert await producer.get_partition_ids() == ["0", "1", "2", "3"]
        empty = await producer.get_partition_properties("2")
        assert empty["is_empty"] is True
        assert (empty["beginning_sequence_number"], empty["last_enqueued_sequence_number"]) == (0, -1)
        assert empty["last_enqueued_offset"] == "-1"
        before = time.time()
        await producer.send_batch([EventData(f"e{i}") for i in range(5)], partition_id="2")
        full = await producer.get_partition_properties("2")
    assert full["is_empty"] is False and full["id"] == "2" and full["eventhub_name"] == hub
    assert (full["beginning_sequence_number"], full["last_enqueued_sequence_number"]) == (0, 4)
    assert int(full["last_enqueued_offset"]) > 0
    assert before - 1 <= full["last_enqueued_time_utc"].timestamp() <= time.time() + 1


async def test_round_trip_keeps_order_bodies_and_properties(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        batch = await producer.create_batch(partition_id="1")
        for index in range(20):
            event = EventData(f"event {index}")
            event.properties = {"index": index, "kind": "reading"}
            event.content_type = "text/plain"
            event.correlation_id = f"corr-{index}"
            event.message_id = f"msg-{index}"
            batch.add(event)
        await producer.send_batch(batch)
        await producer.send_event(EventData("single"), partition_id="1")
    events = await _receive(conn, hub, "1", 21)
    assert [e.body_as_str() for e in events] == [f"event {i}" for i in range(20)] + ["single"]
    assert [e.sequence_number for e in events] == list(range(21))
    offsets = [int(e.offset) for e in events]
    assert offsets == sorted(offsets) and len(set(offsets)) == 21 and offsets[0] == 0
    times = [e.enqueued_time for e in events]
    assert times == sorted(times) and abs(times[-1].timestamp() - time.time()) < 60
    first = events[0]
    assert first.properties == {b"index": 0, b"kind": b"reading"}  # the client decodes strings as bytes
    assert (first.content_type, first.correlation_id, first.message_id) == ("text/plain", "corr-0", "msg-0")


async def test_every_starting_position(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _send(conn, hub, [f"a{i}" for i in range(6)], partition_id="0")
    await asyncio.sleep(0.05)  # a later enqueued time for the second batch
    await _send(conn, hub, [f"b{i}" for i in range(6)], partition_id="0")
    everything = await _receive(conn, hub, "0", 12)
    assert [e.body_as_str() for e in everything] == [f"a{i}" for i in range(6)] + [f"b{i}" for i in range(6)]

    def bodies(events):
        return [e.body_as_str() for e in events]

    def after(key, value, inclusive):
        return [e.body_as_str() for e in everything if (key(e) >= value if inclusive else key(e) > value)]

    fourth = everything[3]
    cases = [
        ("sequence number, exclusive", 3, False, after(lambda e: e.sequence_number, 3, False)),
        ("sequence number, inclusive", 3, True, after(lambda e: e.sequence_number, 3, True)),
        ("offset, exclusive", fourth.offset, False, after(lambda e: int(e.offset), int(fourth.offset), False)),
        ("offset, inclusive", fourth.offset, True, after(lambda e: int(e.offset), int(fourth.offset), True)),
        ("enqueued time, inclusive", everything[6].enqueued_time, True,
         after(lambda e: e.enqueued_time, everything[6].enqueued_time, True)),
        ("enqueued time, exclusive", everything[5].enqueued_time, False,
         after(lambda e: e.enqueued_time, everything[5].enqueued_time, False)),
    ]
    cases.append(("start of stream, inclusive", "-1", True, bodies(everything)))
    # Each receiver mostly waits on the client's polling: run them side by side.
    results = await asyncio.gather(*(
        _receive(conn, hub, "0", len(expected), starting_position=position, inclusive=inclusive, consumer_group=group)
        for (_name, position, inclusive, expected), group in zip(cases, ["$default", "cg1", "cg2"] * 3, strict=False)))
    for (name, _position, _inclusive, expected), received in zip(cases, results, strict=False):
        assert bodies(received) == expected, name


async def test_latest_gets_only_events_sent_after_the_receiver_opened(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _send(conn, hub, ["old"] * 3, partition_id="3")
    consumer = EventHubConsumerClient.from_connection_string(conn, consumer_group="$default", eventhub_name=hub)
    got: list[str] = []

    async def on_event(_context, event):
        got.append(event.body_as_str())

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with consumer, producer:
        task = asyncio.create_task(consumer.receive(on_event, partition_id="3", starting_position="@latest"))
        try:
            # The receiver's position is fixed when its link attaches, which the client
            # does not announce: keep sending numbered events until some arrive.
            sent = 0
            deadline = time.monotonic() + 20
            while len(got) < 3 and time.monotonic() < deadline:
                await producer.send_event(EventData(f"new {sent}"), partition_id="3")
                sent += 1
                await asyncio.sleep(0.2)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert "old" not in got and len(got) >= 3
    first = int(got[0].split()[1])
    assert got == [f"new {i}" for i in range(first, first + len(got))]


async def test_partition_keys_map_to_one_stable_partition(eventhubs_emulator):
    from azure.eventhub._buffered_producer._partition_resolver import PartitionResolver

    conn = eventhubs_emulator.connection_string
    hub = eventhubs_emulator.fresh_hub(8)
    keys = [f"device-{i}" for i in range(12)]
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        for round_ in range(2):
            for key in keys:
                await producer.send_batch([EventData(f"{key} {round_} {i}") for i in range(2)], partition_key=key)
            await producer.send_event(EventData(f"{keys[0]} single"), partition_key=keys[0])
        counts = {pid: (await producer.get_partition_properties(pid))["last_enqueued_sequence_number"] + 1
                  for pid in await producer.get_partition_ids()}
    where = {}
    filled = [pid for pid, count in counts.items() if count]
    received = await asyncio.gather(*(_receive(conn, hub, pid, counts[pid]) for pid in filled))
    for pid, events in zip(filled, received, strict=True):
        for event in events:
            key = event.body_as_str().split()[0]
            assert event.partition_key == key.encode()
            where.setdefault(key, set()).add(pid)
    assert set(where) == set(keys)
    assert all(len(pids) == 1 for pids in where.values()), where
    assert len({next(iter(pids)) for pids in where.values()}) > 1, "every key landed in one partition"
    # The same mapping as the SDK's own buffered producer.
    resolver = PartitionResolver([str(i) for i in range(8)])
    assert {key: next(iter(pids)) for key, pids in where.items()} == {
        key: resolver.get_partition_id_by_partition_key(key) for key in keys}


async def test_sends_without_partition_or_key_go_round_robin(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        for index in range(8):
            await producer.send_batch([EventData(f"rr {index}")])
        counts = [(await producer.get_partition_properties(pid))["last_enqueued_sequence_number"] + 1
                  for pid in ("0", "1", "2", "3")]
    assert counts == [2, 2, 2, 2]


async def test_a_higher_owner_level_disconnects_the_lower_and_a_lower_one_is_refused(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _send(conn, hub, [f"e{i}" for i in range(5)], partition_id="0")

    async def run(owner_level, got, errors):
        consumer = EventHubConsumerClient.from_connection_string(conn, consumer_group="$default", eventhub_name=hub,
                                                                 retry_total=0)

        async def on_event(_context, event):
            got.append(event.sequence_number)

        async def on_error(_context, error):
            errors.append(error)

        async with consumer:
            await consumer.receive(on_event, partition_id="0", starting_position="-1", owner_level=owner_level,
                                   on_error=on_error)

    async def until(condition, what, timeout=20.0):
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, what
            await asyncio.sleep(0.05)

    first_got, first_errors, second_got, second_errors, third_got, third_errors = [], [], [], [], [], []
    tasks = [asyncio.create_task(run(1, first_got, first_errors))]
    try:
        await until(lambda: len(first_got) == 5, "the owner-level-1 receiver got nothing")
        tasks.append(asyncio.create_task(run(2, second_got, second_errors)))
        await until(lambda: first_errors, "the owner-level-1 receiver was not disconnected")
        await until(lambda: len(second_got) == 5, "the owner-level-2 receiver got nothing")
        tasks.append(asyncio.create_task(run(1, third_got, third_errors)))
        await until(lambda: third_errors, "a lower owner level was not refused")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert isinstance(first_errors[0], ConnectionLostError)
    assert "amqp:link:stolen" in str(first_errors[0]) and "epoch" in str(first_errors[0])
    assert isinstance(third_errors[0], ConnectionLostError) and "amqp:link:stolen" in str(third_errors[0])
    assert second_errors == [] and third_got == []


async def test_track_last_enqueued_event_properties(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _send(conn, hub, [f"e{i}" for i in range(4)], partition_id="2")
    received = await _receive(conn, hub, "2", 4, track_last_enqueued_event_properties=True)
    event, context = received[-1]
    last = context.last_enqueued_event_properties
    assert last["sequence_number"] == 3
    assert last["offset"] == event.offset
    assert abs(last["enqueued_time"].timestamp() - event.enqueued_time.timestamp()) < 0.002
    assert last["retrieval_time"] >= last["enqueued_time"]


async def test_a_small_prefetch_still_delivers_a_large_backlog_in_order(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        for start in range(0, 210, 70):
            await producer.send_batch([EventData(str(i)) for i in range(start, start + 70)], partition_id="1")
    events = await _receive(conn, hub, "1", 210, prefetch=7, max_batch_size=5)
    assert [int(e.body_as_str()) for e in events] == list(range(210))


async def test_large_events_round_trip(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    big = "x" * 700_000  # larger than a frame both ways: split on send and on delivery
    await _send(conn, hub, [big, "small"], partition_id="3")
    events = await _receive(conn, hub, "3", 2)
    assert [len(e.body_as_str()) for e in events] == [700_000, 5]


async def test_unknown_hub_and_partition_are_errors_the_client_maps(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    consumer = EventHubConsumerClient.from_connection_string(conn, consumer_group="$default",
                                                             eventhub_name="no-such-hub", retry_total=0)
    async with consumer:
        with pytest.raises(ConnectError, match="could not be found"):
            await consumer.get_partition_ids()
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub, retry_total=0)
    async with producer:
        with pytest.raises(EventHubError):
            await producer.send_batch([EventData("x")], partition_id="99")
        with pytest.raises(ConnectError):
            await producer.get_partition_properties("99")
        await producer.send_batch([EventData("still fine")], partition_id="0")  # the client recovers


async def test_refusals_on_the_wire_unknown_group_partition_and_positions(eventhubs_emulator, hub):
    """The service's refusal: an attach with a null source, then a detach with the error."""
    peer = await RawPeer.connect(eventhubs_emulator.port, key=key_of(eventhubs_emulator.connection_string))
    try:
        cases = [
            (f"{hub}/ConsumerGroups/no-such-group/Partitions/0", None, "amqp:not-found"),
            (f"{hub}/ConsumerGroups/$default/Partitions/9", None, "com.microsoft:argument-out-of-range"),
            (f"{hub}/ConsumerGroups/$default/Partitions/0", "amqp.annotation.x-opt-sequence-number > '41'",
             "com.microsoft:argument-out-of-range"),
            (f"{hub}/ConsumerGroups/$default/Partitions/0", "amqp.annotation.x-opt-offset > 'x'",
             "amqp:invalid-field"),
            (f"{hub}/ConsumerGroups/$default/Partitions/0", "something else", "amqp:invalid-field"),
            ("no-such-hub/ConsumerGroups/$default/Partitions/0", None, "amqp:not-found"),
        ]
        for address, selector, condition in cases:
            peer.attach_receiver(address, selector=selector)
            attach = (await peer.frame())[1]
            detach = (await peer.frame())[1]
            assert attach.name == "attach" and attach.fields[5] is None, address
            assert detach.name == "detach" and detach.fields[1] is True
            assert detach.fields[2].value[0] == condition, (address, selector, detach.fields[2])
        # A consumer group is matched without regard to case, as the service does.
        peer.attach_receiver(f"{hub}/ConsumerGroups/CG1/Partitions/0")
        assert (await peer.frame())[1].fields[5] is not None
    finally:
        await peer.close()


async def test_credit_bounds_what_the_emulator_sends(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    await _send(conn, hub, [f"e{i}" for i in range(30)], partition_id="2")
    peer = await RawPeer.connect(eventhubs_emulator.port, key=key_of(eventhubs_emulator.connection_string))
    try:
        handle = peer.attach_receiver(f"{hub}/ConsumerGroups/$default/Partitions/2",
                                      selector="amqp.annotation.x-opt-offset > '-1'")
        attach = (await peer.frame())[1]
        assert attach.name == "attach" and attach.fields[9] == 0  # initial delivery count
        assert await peer.frames_until_quiet(0.3) == []  # no credit, nothing sent
        peer.flow(handle, delivery_count=0, link_credit=7)
        first = await peer.frames_until_quiet()
        assert [f.name for f in first] == ["transfer"] * 7
        ids = [f.fields[1] for f in first]  # delivery ids: consecutive (the token's reply took one before)
        assert ids == list(range(ids[0], ids[0] + 7))
        assert all(f.fields[4] is True for f in first)  # pre-settled
        peer.flow(handle, delivery_count=7, link_credit=100, next_incoming_id=ids[-1] + 1)
        rest = await peer.frames_until_quiet()
        assert len(rest) == 23
    finally:
        await peer.close()


async def test_garbage_closes_only_that_connection(eventhubs_emulator, hub):
    conn = eventhubs_emulator.connection_string
    bad_frames = [
        # HTTP, but not the WebSocket endpoint: an HTTP error, then closed.
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 404"),
        (b"GET /$servicebus/websocket HTTP/1.1\r\nHost: x\r\n\r\n", b"HTTP/1.1 400"),  # no upgrade
        (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", b"AMQP"),  # a TLS ClientHello: its header, then closed
        (b"PUT / HTTP/1.1\r\n\r\n", b"AMQP"),  # neither: AMQP's header, then closed
    ]
    for garbage, expected in bad_frames:
        reader, writer = await asyncio.open_connection("127.0.0.1", eventhubs_emulator.port)
        writer.write(garbage)
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(expected), (garbage, answer)
        writer.close()
    # A malformed frame after open: closed with amqp:decode-error, not a crash.
    peer = await RawPeer.connect(eventhubs_emulator.port)
    peer.writer.write(b"\x00\x00\x00\x10\x02\x00\x00\x00" + b"\x00\x53\x12\xc0\xff\xff\xff\xff")
    closing = await peer.frames_until_quiet()
    assert closing and closing[-1].name == "close"
    assert closing[-1].fields[0].value[0] == "amqp:decode-error"
    assert peer.reader.at_eof()
    await peer.close()
    # Everyone else is unaffected.
    await _send(conn, hub, ["after garbage"], partition_id="0")
    assert [e.body_as_str() for e in await _receive(conn, hub, "0", 1)] == ["after garbage"]


async def test_tokens_are_checked_when_a_key_is_set():
    async with EventHubsEmulator(eventhubs=["secured"], partitions=1, sas_key="the-real-key") as emulator:
        good = emulator.connection_string
        wrong = good.replace("SharedAccessKey=the-real-key", "SharedAccessKey=not-the-key")
        producer = EventHubProducerClient.from_connection_string(wrong, eventhub_name="secured", retry_total=0)
        async with producer:
            with pytest.raises(AuthenticationError):
                await producer.get_partition_ids()
        producer = EventHubProducerClient.from_connection_string(good, eventhub_name="secured", retry_total=0)
        async with producer:
            assert await producer.get_partition_ids() == ["0"]


async def test_retention_drops_the_oldest_events_beyond_the_bound():
    from eventprocessor.emulators.eventhubs import EmulatorConfig

    config = EmulatorConfig.from_flags(eventhubs=["small"], partitions=1, max_events_per_partition=5)
    async with EventHubsEmulator(config) as emulator:
        conn = emulator.connection_string
        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name="small")
        async with producer:
            await producer.send_batch([EventData(f"e{i}") for i in range(8)], partition_id="0")
            properties = await producer.get_partition_properties("0")
        assert (properties["beginning_sequence_number"], properties["last_enqueued_sequence_number"]) == (3, 7)
        events = await _receive(conn, "small", "0", 5)
        assert [e.sequence_number for e in events] == [3, 4, 5, 6, 7]


async def test_an_emulator_on_loopback_can_be_used_from_the_same_event_loop():
    async with EventHubsEmulator(eventhubs=["inproc"], partitions=2) as emulator:
        assert emulator.host == "127.0.0.1" and emulator.port > 0
        assert "UseDevelopmentEmulator=true" in emulator.connection_string
        await _send(emulator.connection_string_for("inproc"), "inproc", ["here"], partition_id="1")
        assert [e.body_as_str() for e in await _receive(emulator.connection_string, "inproc", "1", 1)] == ["here"]
        assert emulator.connections >= 0
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", emulator.port)

