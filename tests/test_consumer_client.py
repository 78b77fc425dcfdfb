"""The azure-eventhub drop-in (``eventprocessor.EventHubConsumerClient``) over the in-memory
source and store, on the virtual clock: the official callbacks and arguments, their
semantics (default position ``@latest``, dict positions, inclusive, checkpoints first,
empty batches on the timer, close reasons, ``on_error`` with and without a context),
single-partition receives, owner levels, and a clear error for every argument it cannot
honour. ``tests/test_migration.py`` runs the same callbacks under the official client."""
from __future__ import annotations

import asyncio
import logging
import uuid
from collections import defaultdict
from datetime import datetime, timezone
from typing import Any

import pytest

pytest.importorskip("azure.eventhub")

from azure.eventhub import CloseReason as OfficialCloseReason  # noqa: E402
from azure.eventhub import EventData  # noqa: E402

from eventprocessor import (  # noqa: E402
    ConfigurationError,
    ConsumerPartitionContext,
    EventHubConsumerClient,
    FailurePolicy,
    InvalidCheckpointError,
)
from eventprocessor.consumer_client import starting_positions, to_event_data, to_event_position  # noqa: E402
from eventprocessor.events import Event, EventPosition  # noqa: E402
from eventprocessor.sources import InMemoryEventSource  # noqa: E402
from eventprocessor.stores import InMemoryCheckpointStore  # noqa: E402
from eventprocessor.testing import FaultyStore, run_virtual, virtual_utc_clock  # noqa: E402

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=10.0)


class Recorder:
    """One set of callbacks, recording what they see; checkpoints after every batch."""

    def __init__(self, checkpoint: bool = True) -> None:
        self.events: dict[str, list[int]] = defaultdict(list)
        self.bodies: dict[str, list[str]] = defaultdict(list)
        self.batches: dict[str, list[int]] = defaultdict(list)
        self.initialized: list[str] = []
        self.closed: list[tuple] = []
        self.errors: list[tuple] = []
        self.contexts: list[ConsumerPartitionContext] = []
        self.checkpoint = checkpoint

    async def on_event_batch(self, context: ConsumerPartitionContext, events: list[EventData]) -> None:
        self.batches[context.partition_id].append(len(events))
        for event in events:
            assert isinstance(event, EventData)
            self.events[context.partition_id].append(event.sequence_number)
            self.bodies[context.partition_id].append(event.body_as_str())
        if self.checkpoint:
            await context.update_checkpoint()

    async def on_event(self, context: ConsumerPartitionContext, event: EventData | None) -> None:
        if event is None:
            self.batches[context.partition_id].append(0)
            return
        self.events[context.partition_id].append(event.sequence_number)
        self.bodies[context.partition_id].append(event.body_as_str())
        if self.checkpoint:
            await context.update_checkpoint(event)

    async def on_partition_initialize(self, context: ConsumerPartitionContext) -> None:
        self.initialized.append(context.partition_id)
        self.contexts.append(context)

    async def on_partition_close(self, context: ConsumerPartitionContext, reason: Any) -> None:
        self.closed.append((context.partition_id, reason))

    async def on_error(self, context: ConsumerPartitionContext | None, error: Exception) -> None:
        self.errors.append((None if context is None else context.partition_id, error))

    def callbacks(self) -> dict:
        return dict(on_partition_initialize=self.on_partition_initialize, on_partition_close=self.on_partition_close,
                    on_error=self.on_error)

    def total(self) -> int:
        return sum(len(v) for v in self.events.values())


def _world(partitions: int = 4):
    clock = virtual_utc_clock()
    return InMemoryEventSource(partitions, clock=clock), InMemoryCheckpointStore(clock=clock)


async def _until(condition, timeout: float = 60.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def _checkpoints(store, source, group: str = "$default") -> dict[str, int]:
    return {c.partition_id: c.sequence_number
            for c in await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name, group)}


def test_receive_batch_runs_the_official_callbacks_until_close():
    async def scenario():
        source, store = _world()
        for i in range(40):
            await source.send(f"e{i}", partition_id=str(i % 4), properties={"kind": "reading"})
        recorder = Recorder()
        client = EventHubConsumerClient.from_source(source, "$default", checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive_batch(recorder.on_event_batch, starting_position="-1",
                                                        max_batch_size=4, track_last_enqueued_event_properties=True,
                                                        **recorder.callbacks()))
        await _until(lambda: recorder.total() == 40)
        context = recorder.contexts[0]
        seen = (context.fully_qualified_namespace, context.eventhub_name, context.consumer_group)
        newest = context.last_enqueued_event_properties
        owned = set(client.processors["-1"].owned_partitions)
        await client.close()
        await asyncio.wait_for(task, 5)  # receive_batch returns once the client is closed
        return recorder, seen, newest, owned, await _checkpoints(store, source)

    recorder, seen, newest, owned, checkpoints = run_virtual(scenario())
    assert {p: sorted(s) for p, s in recorder.events.items()} == {str(p): list(range(10)) for p in range(4)}
    assert all(size <= 4 for sizes in recorder.batches.values() for size in sizes)
    assert sorted(recorder.initialized) == ["0", "1", "2", "3"] and owned == {"0", "1", "2", "3"}
    assert sorted(recorder.closed) == [(str(p), OfficialCloseReason.SHUTDOWN) for p in range(4)]
    assert seen == ("memory.local", "hub", "$default")
    assert newest is not None and newest["sequence_number"] == 9 and set(newest) == {
        "sequence_number", "offset", "enqueued_time", "retrieval_time"}
    assert checkpoints == {str(p): 9 for p in range(4)}
    assert not recorder.errors


def test_events_read_like_the_official_client_s():
    async def scenario():
        source, store = _world(1)
        await source.send("héllo", partition_key="device-1", properties={"kind": "reading"})
        seen: list[EventData] = []

        async def on_event(context, event):
            seen.append(event)

        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
        await _until(lambda: seen)
        await client.close()
        await task
        return seen[0], source.events("0")[0]

    event, original = run_virtual(scenario())
    assert event.body_as_str() == "héllo" and b"".join(event.body) == "héllo".encode()
    assert (event.sequence_number, event.offset) == (0, original.offset)
    assert event.enqueued_time == original.enqueued_time.replace(microsecond=original.enqueued_time.microsecond
                                                                 // 1000 * 1000)
    assert event.partition_key == b"device-1"  # bytes, as the official client gives it
    assert event.properties == {b"kind": "reading"}  # AMQP delivers property keys as bytes
    assert event.system_properties[b"x-opt-sequence-number"] == 0


def _official(properties: Any) -> EventData:
    """An EventData as the official client builds it from a received AMQP message."""
    from azure.eventhub._pyamqp.message import Message

    annotations = {b"x-opt-sequence-number": 7, b"x-opt-offset": b"4096", b"x-opt-enqueued-time": 1_767_225_600_123}
    return EventData._from_message(Message(data=[b"x"], message_annotations=annotations, properties=properties))


def _amqp_view(event: EventData) -> tuple:
    raw = event.raw_amqp_message.properties
    return (event.message_id, event.content_type, event.correlation_id, event.system_properties,
            None if raw is None else (raw.message_id, raw.content_type, raw.correlation_id))


@pytest.mark.parametrize("message_id, content_type, correlation_id", [
    ("order-17", "application/json", "request-3"),
    (uuid.UUID(int=42), None, 1234),  # AMQP ids may also be a uuid, a ulong or binary
    (None, "text/plain", None),
    (None, None, None),  # no properties section at all, as the official client receives it
])
def test_to_event_data_carries_the_amqp_properties_as_the_official_client_reads_them(
        message_id, content_type, correlation_id):
    from azure.eventhub._pyamqp.message import Properties

    def wire(value: Any) -> Any:  # strings arrive as bytes from the AMQP decoder
        return value.encode("utf-8") if isinstance(value, str) else value

    sent = (message_id, content_type, correlation_id)
    official = _official(Properties(message_id=wire(message_id), content_type=wire(content_type),
                                    correlation_id=wire(correlation_id)) if any(v is not None for v in sent) else None)
    ours = to_event_data(Event(b"x", 7, "4096", datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=timezone.utc),
                               message_id=message_id, content_type=content_type, correlation_id=correlation_id))
    assert (ours.message_id, ours.content_type, ours.correlation_id) == sent
    assert _amqp_view(ours) == _amqp_view(official)


def test_memory_source_events_carry_amqp_properties_to_the_callbacks():
    async def scenario():
        source, store = _world(1)
        await source.send("a", message_id="m-1", content_type="application/json", correlation_id="c-1")
        await source.send("b")
        seen: list[EventData] = []

        async def on_event(context, event):
            seen.append(event)

        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
        await _until(lambda: len(seen) == 2)
        await client.close()
        await task
        return seen, source.events("0")

    seen, originals = run_virtual(scenario())
    assert (originals[0].message_id, originals[0].content_type, originals[0].correlation_id) == (
        "m-1", "application/json", "c-1")
    assert [(e.message_id, e.content_type, e.correlation_id) for e in seen] == [
        ("m-1", "application/json", "c-1"), (None, None, None)]
    assert seen[0].system_properties[b"message-id"] == b"m-1"


def test_starting_positions_mean_what_they_mean_in_azure_eventhub():
    utc = timezone.utc
    when = datetime(2026, 1, 2, 3, 4, 5)
    assert starting_positions(None, False) == (EventPosition.latest(), EventPosition.earliest())
    assert starting_positions("-1", False)[0] == EventPosition.earliest()
    assert starting_positions("@latest", False)[0] == EventPosition.latest()
    assert starting_positions(5, False)[0] == EventPosition.from_sequence_number(5)
    assert starting_positions(5, True)[0] == EventPosition.from_sequence_number(5, inclusive=True)
    assert starting_positions("1024", True)[0] == EventPosition.from_offset("1024", inclusive=True)
    # a naive datetime is UTC, as azure-eventhub reads it (utctimetuple of a naive datetime)
    assert starting_positions(when, False)[0] == EventPosition.from_enqueued_time(when.replace(tzinfo=utc))
    # a dict: partitions left out start at the beginning; inclusive by partition
    initial, default = starting_positions({"0": 3, "1": "@latest"}, {"0": True})
    assert initial == {"0": EventPosition.from_sequence_number(3, inclusive=True), "1": EventPosition.latest()}
    assert default == EventPosition.earliest()
    # one position, inclusive for some partitions only
    initial, default = starting_positions(7, {"2": True})
    assert initial == {"2": EventPosition.from_sequence_number(7, inclusive=True)}
    assert default == EventPosition.from_sequence_number(7)
    for bad in (True, 1.5, "latest", object()):
        with pytest.raises(ConfigurationError, match="starting_position"):
            to_event_position(bad, False)
    with pytest.raises(ConfigurationError, match="starting_position_inclusive"):
        starting_positions(3, "yes")


def test_default_position_is_latest_and_a_checkpoint_wins_over_any_position():
    async def scenario():
        source, store = _world(2)
        for i in range(10):
            await source.send(f"old{i}", partition_id=str(i % 2))
        first = Recorder()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive_batch(first.on_event_batch, **first.callbacks()))
        await _until(lambda: len(first.initialized) == 2)
        await asyncio.sleep(1)
        for i in range(4):
            await source.send(f"new{i}", partition_id=str(i % 2))
        await _until(lambda: first.total() == 4)
        await client.close()
        await task
        # A new client resumes from the checkpoints, whatever starting_position says.
        for i in range(2):
            await source.send(f"later{i}", partition_id=str(i))
        second = Recorder()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive_batch(second.on_event_batch, starting_position="-1",
                                                        starting_position_inclusive=True))
        await _until(lambda: second.total() == 2)
        await asyncio.sleep(2)
        await client.close()
        await task
        return first, second

    first, second = run_virtual(scenario())
    assert {p: v for p, v in first.bodies.items()} == {"0": ["new0", "new2"], "1": ["new1", "new3"]}
    assert {p: v for p, v in second.bodies.items()} == {"0": ["later0"], "1": ["later1"]}


def test_positions_by_partition_with_inclusive_and_exclusive_starts():
    async def scenario():
        source, store = _world(3)
        for i in range(15):
            await source.send(f"e{i}", partition_id=str(i % 3))
        recorder = Recorder()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive_batch(
            recorder.on_event_batch, starting_position={"0": 2, "1": 2}, starting_position_inclusive={"0": True}))
        await _until(lambda: recorder.total() == 3 + 2 + 5)
        await asyncio.sleep(1)
        await client.close()
        await task
        return recorder

    recorder = run_virtual(scenario())
    # "0" from 2 inclusive, "1" after 2, "2" left out of the dict: from the beginning
    assert dict(recorder.events) == {"0": [2, 3, 4], "1": [3, 4], "2": [0, 1, 2, 3, 4]}


def test_max_wait_time_delivers_empty_batches_and_none_on_the_timer():
    async def scenario():
        source, store = _world(1)
        batches, singles = Recorder(), Recorder()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        other = EventHubConsumerClient.from_source(source, "cg2", checkpoint_store=store, **OPTIONS)
        tasks = [asyncio.create_task(client.receive_batch(batches.on_event_batch, max_wait_time=2.0)),
                 asyncio.create_task(other.receive(singles.on_event, max_wait_time=2.0))]
        await asyncio.sleep(11)
        await source.send("one", partition_id="0")
        await asyncio.sleep(1)
        await client.close()
        await other.close()
        await asyncio.gather(*tasks)
        return batches, singles

    batches, singles = run_virtual(scenario())
    for recorder in (batches, singles):
        empties = [size for size in recorder.batches["0"] if size == 0]
        assert 3 <= len(empties) <= 6, recorder.batches  # one per 2 s while idle
        assert recorder.bodies["0"] == ["one"]


def test_receive_hands_events_one_by_one_and_does_not_repeat_those_on_event_returned_from():
    async def scenario():
        source, store = _world(1)
        for i in range(6):
            await source.send(f"e{i}", partition_id="0")
        calls: list[int] = []
        errors: list[tuple] = []
        failures = {3: 2}  # sequence number 3 fails twice, then works

        async def on_event(context, event):
            calls.append(event.sequence_number)
            if failures.get(event.sequence_number, 0) > 0:
                failures[event.sequence_number] -= 1
                raise RuntimeError(f"boom {event.sequence_number}")
            await context.update_checkpoint(event)

        async def on_error(context, error):
            errors.append((context.partition_id if context else None, str(error)))

        client = EventHubConsumerClient.from_source(source, checkpoint_store=store,
                                                    failure_policy=FailurePolicy(retry_backoff=0.1), **OPTIONS)
        task = asyncio.create_task(client.receive(on_event, starting_position="-1", on_error=on_error))
        await _until(lambda: 5 in calls)
        await client.close()
        await task
        return calls, errors, await _checkpoints(store, source)

    calls, errors, checkpoints = run_virtual(scenario())
    assert calls == [0, 1, 2, 3, 3, 3, 4, 5]
    assert errors == [("0", "boom 3"), ("0", "boom 3")]
    assert checkpoints == {"0": 5}


def test_on_error_gets_no_context_for_a_store_failure_and_each_partition_s_own_errors_once():
    async def scenario():
        source, inner = _world(2)
        store = FaultyStore(inner)
        recorder = Recorder()

        async def failing_init(context):
            raise ValueError(f"init {context.partition_id}")

        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        callbacks = {**recorder.callbacks(), "on_partition_initialize": failing_init}
        task = asyncio.create_task(client.receive_batch(recorder.on_event_batch, **callbacks))
        await _until(lambda: "-1" in client.processors and len(client.processors["-1"].owned_partitions) == 2)
        await asyncio.sleep(0.5)
        before = list(recorder.errors)
        store.down = True
        await asyncio.sleep(2.5)
        store.down = False
        await client.close()
        await task
        return before, recorder.errors

    before, errors = run_virtual(scenario())
    assert sorted((p, str(e)) for p, e in before) == [("0", "init 0"), ("1", "init 1")]
    store_errors = [(p, e) for p, e in errors[len(before):] if "injected" in str(e)]
    assert any(p is None for p, _e in store_errors), errors  # balancing: no partition, as azure-eventhub
    # an error with a partition is reported once, with that partition's context
    assert len([1 for p, e in errors if str(e) == "init 0"]) == 1


def test_a_partition_id_receives_that_partition_only_and_two_such_clients_do_not_block_each_other():
    async def scenario():
        source, store = _world(4)
        for i in range(20):
            await source.send(f"e{i}", partition_id=str(i % 4))
        zero, two = Recorder(), Recorder()
        clients = [EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS) for _ in range(2)]
        tasks = [asyncio.create_task(clients[0].receive_batch(zero.on_event_batch, partition_id="0",
                                                              starting_position="-1")),
                 asyncio.create_task(clients[1].receive_batch(two.on_event_batch, partition_id="2",
                                                              starting_position="-1"))]
        await _until(lambda: zero.total() == 5 and two.total() == 5)
        await asyncio.sleep(2)
        missing = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        bad = Recorder()
        bad_task = asyncio.create_task(missing.receive_batch(bad.on_event_batch, partition_id="9",
                                                             on_error=bad.on_error))
        await asyncio.sleep(2)
        for client in (*clients, missing):
            await client.close()
        await asyncio.gather(*tasks, bad_task)
        return zero, two, bad, await _checkpoints(store, source)

    zero, two, bad, checkpoints = run_virtual(scenario())
    assert set(zero.events) == {"0"} and set(two.events) == {"2"}
    assert checkpoints == {"0": 4, "2": 4}
    assert bad.total() == 0 and any("partition_id '9' does not exist" in str(e) for _p, e in bad.errors)


class RecordingSource(InMemoryEventSource):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.owner_levels: list[int | None] = []

    async def open_receiver(self, partition_id, **kwargs):
        self.owner_levels.append(kwargs["owner_level"])
        return await super().open_receiver(partition_id, **kwargs)


def test_receivers_open_at_owner_level_plus_the_claim_s_epoch():
    async def scenario():
        source = RecordingSource(2)
        store = InMemoryCheckpointStore()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        recorder = Recorder()
        task = asyncio.create_task(client.receive_batch(recorder.on_event_batch, owner_level=100))
        await _until(lambda: len(source.owner_levels) == 2)
        await client.close()
        await task
        return source.owner_levels

    assert run_virtual(scenario()) == [101, 101]


def test_checkpoint_on_release_is_off_as_in_azure_eventhub_and_can_be_turned_on():
    async def scenario(on: bool):
        source, store = _world(1)
        for i in range(5):
            await source.send(f"e{i}", partition_id="0")
        recorder = Recorder(checkpoint=False)
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, checkpoint_on_release=on,
                                                    **OPTIONS)
        task = asyncio.create_task(client.receive_batch(recorder.on_event_batch, starting_position="-1"))
        await _until(lambda: recorder.total() == 5)
        await client.close()
        await task
        return await _checkpoints(store, source)

    assert run_virtual(scenario(False)) == {}
    assert run_virtual(scenario(True)) == {"0": 4}


def test_cancelling_the_receive_task_stops_gracefully():
    async def scenario():
        source, store = _world(2)
        recorder = Recorder()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive_batch(recorder.on_event_batch, **recorder.callbacks()))
        await _until(lambda: len(recorder.initialized) == 2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        listing = await store.list_ownership(source.fully_qualified_namespace, source.eventhub_name, "$default")
        return recorder, listing

    recorder, listing = run_virtual(scenario())
    assert sorted(recorder.closed) == [("0", OfficialCloseReason.SHUTDOWN), ("1", OfficialCloseReason.SHUTDOWN)]
    assert all(record.owner_id == "" for record in listing.ownerships)  # released


def test_update_checkpoint_refuses_what_the_official_one_would_silently_write():
    async def scenario():
        source, store = _world(2)
        for i in range(4):
            await source.send(f"e{i}", partition_id=str(i % 2))
        outcomes: list[str] = []
        batches: dict[str, list[EventData]] = {}

        async def on_event_batch(context, events):
            batches[context.partition_id] = events
            if len(batches) < 2:
                return
            other = batches["1" if context.partition_id == "0" else "0"]
            for attempt in (lambda: context.update_checkpoint(other[0]),):
                try:
                    await attempt()
                    outcomes.append("written")
                except InvalidCheckpointError as error:
                    outcomes.append(str(error))
            await context.update_checkpoint(events[-1])
            try:
                await context.update_checkpoint(events[0])
            except InvalidCheckpointError as error:
                outcomes.append(str(error))

        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        task = asyncio.create_task(client.receive_batch(on_event_batch, starting_position="-1"))
        await _until(lambda: len(outcomes) >= 2)
        await client.close()
        await task
        return outcomes

    outcomes = run_virtual(scenario())
    assert "each partition's context checkpoints only its own events" in outcomes[0]
    assert "would move the checkpoint back" in outcomes[1]


def test_a_second_receive_on_the_same_client_and_group_is_refused():
    async def scenario():
        source, store = _world(2)
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        recorder = Recorder()
        task = asyncio.create_task(client.receive_batch(recorder.on_event_batch, partition_id="0"))
        await asyncio.sleep(0.1)
        errors = []
        for kwargs in ({}, {"partition_id": "0"}):
            try:
                await client.receive_batch(recorder.on_event_batch, **kwargs)
            except ConfigurationError as error:
                errors.append(str(error))
        other = asyncio.create_task(client.receive_batch(recorder.on_event_batch, partition_id="1"))
        await asyncio.sleep(1)
        running = set(client.processors)
        await client.close()
        await asyncio.gather(task, other)
        return errors, running

    errors, running = run_virtual(scenario())
    assert errors == ["this consumer client is already receiving events for consumer group $default",
                      "this consumer client is already receiving events from partition 0 for consumer group $default"]
    assert running == {"0", "1"}


@pytest.mark.parametrize("kwargs, needles", [
    (dict(uamqp_transport=True), ["uamqp_transport"]),
    (dict(loop=object()), ["loop"]),
    (dict(prefetch_count=10, owner_levl=1), ["owner_levl", "prefetch_count"]),
    (dict(checkpoint_store=object()), ["checkpoint_store must be", "BlobCheckpointStore", "CheckpointStore interface",
                                       "object"]),
])
def test_arguments_it_cannot_honour_are_refused_by_name(kwargs, needles):
    options = {"checkpoint_store": InMemoryCheckpointStore(), **kwargs}
    with pytest.raises(ConfigurationError) as raised:
        EventHubConsumerClient.from_connection_string(
            "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=secret-key;UseDevelopmentEmulator=true",
            "$default", eventhub_name="hub", **options)
    for needle in needles:
        assert needle in str(raised.value)
    assert "secret-key" not in str(raised.value)


@pytest.mark.parametrize("method, kwargs, name", [
    ("receive_batch", {"prefetch_count": 10}, "prefetch_count"),
    ("receive", {"max_batch_size": 5}, "max_batch_size"),
    ("receive", {"partition": "0"}, "partition"),
])
def test_an_unknown_receive_argument_is_a_type_error_naming_it_before_anything_runs(method, kwargs, name):
    """``receive`` and ``receive_batch`` share their keyword arguments
    (``ReceiveOptions``); one neither takes fails as a Python signature would, naming it
    and the ones it takes, and nothing is received."""
    async def scenario():
        source, store = _world(2)
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **OPTIONS)
        recorder = Recorder()
        callback = recorder.on_event_batch if method == "receive_batch" else recorder.on_event
        with pytest.raises(TypeError) as raised:
            await getattr(client, method)(callback, starting_position="-1", **kwargs)
        running = set(client.processors)
        await client.close()
        return str(raised.value), running

    message, running = run_virtual(scenario())
    assert message.startswith(f"{method}() got an unexpected keyword argument {name!r}")
    takes = message.split("(it takes ", 1)[1]
    assert "starting_position" in takes and ("max_batch_size" in takes) == (method == "receive_batch")
    assert running == set()


def test_retry_backoff_is_taken_as_azure_eventhub_takes_it_with_a_warning(caplog):
    """azure-eventhub ignores ``retry_backoff`` (its option is ``retry_backoff_factor``), and
    its own tests pass it: the drop-in takes it too, changes nothing with it, and says so."""
    with caplog.at_level(logging.WARNING, logger="eventprocessor.consumer_client"):
        client = EventHubConsumerClient.from_connection_string(
            "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=secret-key;UseDevelopmentEmulator=true",
            "$default", eventhub_name="hub", retry_total=1, retry_backoff=0.02)
    assert "retry_backoff" not in client.processor_options and "failure_policy" not in client.processor_options
    said = [r.getMessage() for r in caplog.records if "retry_backoff" in r.getMessage()]
    assert len(said) == 1 and "retry_backoff_factor" in said[0] and "FailurePolicy(retry_backoff" in said[0]


def test_the_official_blob_store_runs_as_ours_on_the_same_container(caplog):
    official = pytest.importorskip("azure.eventhub.extensions.checkpointstoreblobaio")

    from eventprocessor.stores import BlobCheckpointStore

    store = official.BlobCheckpointStore.from_connection_string(
        "DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey=c2VjcmV0LWtleQ==;"
        "BlobEndpoint=http://127.0.0.1:1/devstoreaccount1;", container_name="checkpoints")
    with caplog.at_level(logging.INFO, logger="eventprocessor.consumer_client"):
        client = EventHubConsumerClient.from_source(InMemoryEventSource(1), checkpoint_store=store)
    assert isinstance(client.checkpoint_store, BlobCheckpointStore)
    assert client.checkpoint_store.container_name == "checkpoints"
    assert client.checkpoint_store.account_url == "http://127.0.0.1:1/devstoreaccount1"
    said = [r.getMessage() for r in caplog.records if "azure-eventhub's BlobCheckpointStore" in r.getMessage()]
    assert len(said) == 1 and "checkpoints" in said[0] and "c2VjcmV0LWtleQ==" not in caplog.text


def test_a_store_written_to_the_official_interface_balances_and_keeps_checkpoints(caplog):
    """azure-eventhub's own in-memory store (a store written to its public interface,
    handing out its live dicts): two clients share the partitions through it, and the
    checkpoints are in it."""
    from azure.eventhub.aio._eventprocessor.in_memory_checkpoint_store import InMemoryCheckpointStore as Official

    from eventprocessor.consumer_client.official_store import OfficialInterfaceStore

    official = Official()

    async def scenario():
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        for i in range(40):
            await source.send(f"e{i}", partition_id=str(i % 4))
        first, second = Recorder(), Recorder()
        one = EventHubConsumerClient.from_source(source, checkpoint_store=official, owner_id="one", **OPTIONS)
        two = EventHubConsumerClient.from_source(source, checkpoint_store=official, owner_id="two", **OPTIONS)
        assert isinstance(one.checkpoint_store, OfficialInterfaceStore)
        tasks = [asyncio.create_task(one.receive_batch(first.on_event_batch, starting_position="-1",
                                                       **first.callbacks()))]
        await _until(lambda: first.total() == 40)
        tasks.append(asyncio.create_task(two.receive_batch(second.on_event_batch, starting_position="-1",
                                                           **second.callbacks())))
        await _until(lambda: len(second.initialized) == 2)
        for i in range(40):
            await source.send(f"f{i}", partition_id=str(i % 4))
        await _until(lambda: first.total() + second.total() >= 80)
        await one.close()
        await two.close()
        await asyncio.gather(*tasks)
        listed = await official.list_checkpoints("memory.local", "hub", "$default")
        return first, second, {c["partition_id"]: c["sequence_number"] for c in listed}

    with caplog.at_level(logging.INFO, logger="eventprocessor.consumer_client"):
        first, second, checkpoints = run_virtual(scenario())
    assert sorted(second.initialized) == sorted(set(second.initialized)) and len(second.initialized) == 2
    delivered = {(p, s) for r in (first, second) for p, seqs in r.events.items() for s in seqs}
    assert delivered == {(str(p), s) for p in range(4) for s in range(20)}  # nothing lost
    assert checkpoints == {str(p): 19 for p in range(4)}
    assert any("CheckpointStore interface" in r.getMessage() for r in caplog.records)


def _count_per_partition(recorder: Recorder) -> dict[str, list[int]]:
    return {pid: sorted(seqs) for pid, seqs in sorted(recorder.events.items())}


def test_without_a_checkpoint_store_each_receive_call_reads_every_partition_in_memory(caplog):
    """azure-eventhub's meaning of no checkpoint store: the receive call reads every
    partition itself, with checkpoints in memory for that call only; said once (INFO)."""
    async def scenario():
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        for i in range(40):
            await source.send(f"e{i}", partition_id=str(i % 4))
        client = EventHubConsumerClient.from_source(source, "$default")  # the defaults, as the samples use them
        first = Recorder()
        task = asyncio.create_task(client.receive(first.on_event, starting_position="-1", **first.callbacks()))
        await _until(lambda: first.total() == 40)
        await client.close()
        await asyncio.wait_for(task, 5)
        # The first call checkpointed every event; a new call has a new in-memory store.
        again = Recorder()
        task = asyncio.create_task(client.receive_batch(again.on_event_batch, starting_position="-1"))
        await _until(lambda: again.total() == 40)
        await asyncio.sleep(5)
        await client.close()
        await asyncio.wait_for(task, 5)
        return first, again

    with caplog.at_level(logging.INFO, logger="eventprocessor.consumer_client"):
        first, again = run_virtual(scenario())
    every = {str(p): list(range(10)) for p in range(4)}
    assert _count_per_partition(first) == every and _count_per_partition(again) == every
    assert sorted(first.initialized) == ["0", "1", "2", "3"]
    assert sorted(first.closed) == [(str(p), OfficialCloseReason.SHUTDOWN) for p in range(4)]
    assert not first.errors
    notes = [r for r in caplog.records if "no checkpoint_store" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO], notes
    assert "in memory" in notes[0].getMessage()


def test_without_a_checkpoint_store_receivers_are_not_exclusive_so_two_clients_both_read_everything():
    async def scenario():
        source = RecordingSource(4, clock=virtual_utc_clock())
        for i in range(40):
            await source.send(f"e{i}", partition_id=str(i % 4))
        recorders = [Recorder(), Recorder()]
        clients = [EventHubConsumerClient.from_source(source, "$default") for _ in recorders]
        tasks = [asyncio.create_task(c.receive_batch(r.on_event_batch, starting_position="-1", **r.callbacks()))
                 for c, r in zip(clients, recorders, strict=False)]
        await _until(lambda: all(r.total() == 40 for r in recorders))
        await asyncio.sleep(5)
        for client in clients:
            await client.close()
        await asyncio.gather(*tasks)
        plain = list(source.owner_levels)
        # An owner_level given without a store is used as it is, as azure-eventhub does.
        leveled = EventHubConsumerClient.from_source(source, "$default")
        task = asyncio.create_task(leveled.receive_batch(Recorder().on_event_batch, partition_id="2",
                                                         owner_level=7))
        await _until(lambda: len(source.owner_levels) == len(plain) + 1)
        await leveled.close()
        await task
        return recorders, plain, source.owner_levels[len(plain):]

    recorders, plain, leveled = run_virtual(scenario())
    every = {str(p): list(range(10)) for p in range(4)}
    assert [_count_per_partition(r) for r in recorders] == [every, every]
    assert not any(r.errors for r in recorders)
    assert plain == [None] * 8 and leveled == [7]


def _azure_clients_made(monkeypatch) -> list[Any]:
    """Every azure-eventhub ``EventHubConsumerClient`` built from now on, as ``(args,
    kwargs)``: what this SDK hands the AMQP client. The real constructor runs (it does
    not connect)."""
    from azure.eventhub import aio as azure_aio

    made: list[Any] = []

    class Recorded(azure_aio.EventHubConsumerClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            made.append((args, kwargs))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(azure_aio, "EventHubConsumerClient", Recorded)
    return made


async def _open_and_close_a_receiver(client: EventHubConsumerClient) -> None:
    """Build the AMQP client a receiver reads through (nothing is sent on the network)."""
    receiver = await client.source.open_receiver("0", consumer_group="$default",
                                                 starting_position=EventPosition.earliest(), owner_level=None)
    await receiver.close()
    await client.close()


def test_client_options_reach_the_amqp_client_and_bad_values_fail_at_receive(monkeypatch):
    made = _azure_clients_made(monkeypatch)
    client = EventHubConsumerClient.from_connection_string(
        "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=x;EntityPath=hub;"
        "UseDevelopmentEmulator=true", "$default", checkpoint_store=InMemoryCheckpointStore(), retry_total=1,
        user_agent="migrated", load_balancing_strategy="balanced", owner_id="me")
    # The options given reach the client as given; EventHubSource adds its idle-timeout
    # default (30 s, so a black-holed connection is noticed) unless one is given.
    asyncio.run(_open_and_close_a_receiver(client))
    (_args, given), = made
    assert {name: given.get(name) for name in ("retry_total", "user_agent", "idle_timeout")} == \
        {"retry_total": 1, "user_agent": "migrated", "idle_timeout": 30.0}
    # EventProcessor's own options stay with the processor: the AMQP client has azure-eventhub's defaults.
    strategy = given["load_balancing_strategy"]
    assert "owner_id" not in given and given["checkpoint_store"] is None
    assert getattr(strategy, "value", strategy) == "greedy"
    assert client.processor_options["partition_ownership_expiration_interval"] == 180  # 6 x 30 s, as azure-eventhub
    with pytest.raises(ConfigurationError, match="from_source"):
        EventHubConsumerClient.from_source(InMemoryEventSource(1), checkpoint_store=InMemoryCheckpointStore(),
                                           retry_total=1)

    async def bad_receive():
        async def on_event_batch(context, events):
            pass

        with pytest.raises(ConfigurationError, match="max_batch_size"):
            await client.receive_batch(on_event_batch, max_batch_size=0)
        with pytest.raises(ConfigurationError, match="owner_level"):
            await client.receive_batch(on_event_batch, owner_level=-1)
        with pytest.raises(ConfigurationError, match="on_event_batch must be an async callable"):
            await client.receive_batch("not callable")  # type: ignore[arg-type]
        await client.close()

    asyncio.run(bad_receive())


def test_a_handoff_closes_the_old_owner_s_partitions_as_ownership_lost_and_loses_nothing():
    async def scenario():
        source, store = _world(4)
        first, second = Recorder(), Recorder()
        one = EventHubConsumerClient.from_source(source, checkpoint_store=store, owner_id="one", **OPTIONS)
        two = EventHubConsumerClient.from_source(source, checkpoint_store=store, owner_id="two", **OPTIONS)
        tasks = [asyncio.create_task(one.receive_batch(first.on_event_batch, starting_position="-1",
                                                       **first.callbacks()))]
        await _until(lambda: len(first.initialized) == 4)
        for i in range(40):
            await source.send(f"a{i}", partition_id=str(i % 4))
        tasks.append(asyncio.create_task(two.receive_batch(second.on_event_batch, starting_position="-1",
                                                           **second.callbacks())))
        await _until(lambda: len(second.initialized) == 2)
        for i in range(40):
            await source.send(f"b{i}", partition_id=str(i % 4))
        await _until(lambda: first.total() + second.total() >= 80)
        await asyncio.sleep(1)
        await one.close()
        await two.close()
        await asyncio.gather(*tasks)
        return first, second

    first, second = run_virtual(scenario())
    moved = set(second.initialized)
    assert {(p, r) for p, r in first.closed if p in moved} == {(p, OfficialCloseReason.OWNERSHIP_LOST) for p in moved}
    delivered = [(p, s) for r in (first, second) for p, seqs in r.events.items() for s in seqs]
    assert sorted(set(delivered)) == sorted((str(p), s) for p in range(4) for s in range(20))
    assert len(delivered) == 80  # handed over at a checkpoint: no duplicates


def test_the_official_constructor_and_the_management_calls(monkeypatch):
    from azure.core.credentials import AzureNamedKeyCredential

    made = _azure_clients_made(monkeypatch)

    credential = AzureNamedKeyCredential("RootManageSharedAccessKey", "not-a-real-key")
    client = EventHubConsumerClient("contoso.servicebus.windows.net", "telemetry", "$default", credential,
                                    checkpoint_store=InMemoryCheckpointStore(), user_agent="migrated")
    assert (client.fully_qualified_namespace, client.eventhub_name) == ("contoso.servicebus.windows.net", "telemetry")
    assert "not-a-real-key" not in repr(client)
    asyncio.run(_open_and_close_a_receiver(client))  # the AMQP client gets the credential as given
    (args, given), = made
    assert args[:4] == ("contoso.servicebus.windows.net", "telemetry", "$default", credential)
    assert given["user_agent"] == "migrated"

    async def scenario():
        source, store = _world(2)
        await source.send("x", partition_id="1")
        over_memory = EventHubConsumerClient.from_source(source, checkpoint_store=store)
        return await over_memory.get_partition_ids(), await over_memory.get_partition_properties("1")

    ids, properties = run_virtual(scenario())
    assert ids == ["0", "1"]
    assert {k: v for k, v in properties.items() if k != "last_enqueued_time_utc"} == {
        "eventhub_name": "hub", "id": "1", "beginning_sequence_number": 0, "last_enqueued_sequence_number": 0,
        "last_enqueued_offset": "0", "is_empty": False}
