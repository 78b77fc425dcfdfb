"""Event bodies arrive exactly as sent, whatever their AMQP body type.

AMQP gives a message one of three bodies: one or more data sections, one or more
amqp-sequence sections, or one amqp-value. azure-eventhub sends each with
``AmqpAnnotatedMessage(data_body= / sequence_body= / value_body=)`` and its consumer
receives each as sent. Here the official producer sends them to the project's Event
Hubs emulator, and what the official ``EventHubConsumerClient`` receives is compared
with what this SDK's ``EventHubSource`` (lean and fallback receive paths) and its
drop-in ``EventHubConsumerClient`` receive for the same events: ``body_type``, ``body``
and ``raw_amqp_message.body``.

The send side follows Microsoft's sample
``sdk/eventhub/azure-eventhub/samples/async_samples/send_and_receive_amqp_annotated_message_async.py``
message for message: the same three messages with the same bodies, properties, header,
footer and annotations, sent the same way (the data message through ``create_batch`` /
``add``, the other two as a list, no partition named).
"""
from __future__ import annotations

import asyncio
import pickle
import time
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

import pytest

from eventprocessor import Event, EventPosition
from eventprocessor.events import BodyType, received_event
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

WHEN = datetime(2026, 1, 1, tzinfo=timezone.utc)
Key = tuple[str, int]  # (partition id, sequence number)


# ----------------------------------------------------------------------------- the send side

async def send_sample_messages(producer: Any) -> None:
    """What the sample's ``send_data_message``, ``send_sequence_message`` and
    ``send_value_message`` send, in its order and its way."""
    from azure.eventhub.amqp import AmqpAnnotatedMessage

    data_message = AmqpAnnotatedMessage(
        data_body=[b"aa", b"bb", b"cc"],
        delivery_annotations={"delivery_annotation_key": "value"},
        application_properties={"body_type": "data"})
    batch = await producer.create_batch()
    batch.add(data_message)
    await producer.send_batch(batch)

    sequence_message = AmqpAnnotatedMessage(
        sequence_body=[b"message", 123.456, True],
        footer={"footer_key": "footer_value"},
        properties={"subject": "sequence"},
        application_properties={"body_type": "sequence"})
    await producer.send_batch([sequence_message])

    value_message = AmqpAnnotatedMessage(
        value_body={b"key": [-123, b"data", False]},
        header={"priority": 10},
        annotations={"annotation_key": "value"},
        application_properties={"body_type": "value"})
    await producer.send_batch([value_message])


# What the sample's messages carry, as a receiver reads them back (by application property).
SAMPLE_BODIES = {
    b"data": ("data", [b"aa", b"bb", b"cc"]),
    b"sequence": ("sequence", [[b"message", 123.456, True]]),
    b"value": ("value", {b"key": [-123, b"data", False]}),
}


async def send_other_bodies(producer: Any) -> int:
    """The body shapes the sample does not send, to partition 0; returns how many."""
    from azure.eventhub import EventData
    from azure.eventhub.amqp import AmqpAnnotatedMessage

    messages = [
        EventData(b"plain"),                                          # one data section: the usual event
        EventData(b""),                                               # one empty data section
        AmqpAnnotatedMessage(data_body=[b"\x00\xff", b"", b"tail"]),  # binary and empty sections
        AmqpAnnotatedMessage(sequence_body=[[1, 2], [b"x", None]]),   # two sequence sections
        AmqpAnnotatedMessage(value_body="text"),                      # a string value
        AmqpAnnotatedMessage(value_body=7),                           # a number
        AmqpAnnotatedMessage(value_body=None),                        # no body at all
    ]
    for message in messages:
        await producer.send_batch([message], partition_id="0")
    return len(messages)


async def produce(conn: str, hub: str) -> int:
    from azure.eventhub.aio import EventHubProducerClient

    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
        await send_sample_messages(producer)
        return 3 + await send_other_bodies(producer)


# ----------------------------------------------------------------------------- how each side reads a body

def _materialized(body_type: Any, body: Any) -> Any:
    """An azure body as a value: data and sequence bodies are generators of sections."""
    return body if body_type == "value" else list(body)


def event_data_view(event: Any) -> dict[str, Any]:
    """What a handler of an ``EventData`` sees of its body."""
    raw = event.raw_amqp_message
    try:
        text: Any = event.body_as_str()
    except TypeError as error:
        text = ("TypeError", str(error))
    return {"body_type": event.body_type, "body": _materialized(event.body_type, event.body),
            "raw_body_type": raw.body_type, "raw_body": _materialized(raw.body_type, raw.body), "text": text}


def sent_body(event: Event) -> Any:
    """An Event's body as sent, in ``raw_amqp_message.body``'s terms."""
    if event.body_type == "data":
        return [event.body] if event.amqp_body is None else list(event.amqp_body)
    if event.body_type == "sequence":
        return list(event.amqp_body)
    return event.amqp_body


# ----------------------------------------------------------------------------- receiving

async def receive_official(conn: str, hub: str, group: str, count: int, client_class: Any = None,
                           **options: Any) -> dict[Key, Any]:
    """``count`` events from every partition through an ``EventHubConsumerClient`` (the
    official one unless ``client_class``), by (partition, sequence number)."""
    if client_class is None:
        from azure.eventhub.aio import EventHubConsumerClient as client_class
    got: dict[Key, Any] = {}
    enough = asyncio.Event()

    async def on_event(context: Any, event: Any) -> None:
        if event is not None:
            got[(context.partition_id, event.sequence_number)] = event
            if len(got) >= count:
                enough.set()

    client = client_class.from_connection_string(conn, consumer_group=group, eventhub_name=hub, **options)
    async with client:
        task = asyncio.create_task(client.receive(on_event, starting_position="-1"))
        try:
            await asyncio.wait_for(enough.wait(), 60)
            await asyncio.sleep(0.5)  # anything beyond what was sent would arrive now
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert len(got) == count, f"{len(got)} of {count} events arrived"
    return got


async def receive_source(conn: str, hub: str, per_partition: dict[str, int], *, lean: bool) -> dict[Key, Event]:
    """The events of every partition through ``EventHubSource`` receivers."""
    from eventprocessor.sources.eventhub import EventHubSource

    source = EventHubSource.from_connection_string(conn, eventhub_name=hub, lean_receive=lean)
    got: dict[Key, Event] = {}
    try:
        for pid, count in per_partition.items():
            receiver = await source.open_receiver(pid, consumer_group="$default",
                                                  starting_position=EventPosition.earliest(), owner_level=None,
                                                  prefetch=20)
            assert type(receiver).__name__ == ("_LeanReceiver" if lean else "_BatchReceiver")
            events: list[Event] = []
            deadline = time.monotonic() + 30
            while len(events) < count and time.monotonic() < deadline:
                events.extend(await receiver.receive(20, 0.5))
            await receiver.close()
            assert len(events) == count, f"partition {pid}: {len(events)} of {count} events"
            got.update({(pid, e.sequence_number): e for e in events})
    finally:
        await source.close()
    return got


@pytest.fixture(scope="module")
def bodies_hub(eventhubs_emulator) -> dict[str, Any]:
    """One hub with the sample's messages and the other body shapes, and what the
    official consumer received from it (the reference for every test here)."""
    conn = eventhubs_emulator.connection_string
    hub = eventhubs_emulator.fresh_hub(4)

    async def setup() -> tuple[int, dict[Key, Any]]:
        count = await produce(conn, hub)
        return count, await receive_official(conn, hub, "cg1", count)

    count, official = asyncio.run(setup())
    return {"conn": conn, "hub": hub, "count": count, "official": official}


def _per_partition(official: dict[Key, Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pid, _seq in official:
        counts[pid] = counts.get(pid, 0) + 1
    return counts


@pytest.mark.eventhubs
def test_the_official_client_receives_the_sample_s_bodies_as_sent_through_the_emulator(bodies_hub):
    """The reference is right: the emulator stored and returned every body type as sent."""
    official = bodies_hub["official"]
    by_kind = {e.properties.get(b"body_type"): event_data_view(e) for e in official.values()
               if e.properties.get(b"body_type")}
    assert {kind: (view["body_type"], view["raw_body"]) for kind, view in by_kind.items()} == SAMPLE_BODIES
    others = sorted((key, event_data_view(e)["raw_body"]) for key, e in official.items()
                    if not e.properties.get(b"body_type"))
    assert [body for _key, body in others] == [
        [b"plain"], [b""], [b"\x00\xff", b"", b"tail"], [[1, 2], [b"x", None]], b"text", 7, None]
    sequence = next(e for e in official.values() if e.properties.get(b"body_type") == b"sequence")
    assert sequence.raw_amqp_message.footer == {b"footer_key": b"footer_value"}
    value = next(e for e in official.values() if e.properties.get(b"body_type") == b"value")
    assert value.raw_amqp_message.header.priority == 10
    assert value.raw_amqp_message.annotations[b"annotation_key"] == b"value"


@pytest.mark.eventhubs
@pytest.mark.parametrize("lean", [True, False], ids=["lean", "receive_batch-fallback"])
async def test_event_hub_source_receives_every_body_as_the_official_client_does(bodies_hub, lean):
    official = bodies_hub["official"]
    ours = await receive_source(bodies_hub["conn"], bodies_hub["hub"], _per_partition(official), lean=lean)
    assert set(ours) == set(official)
    for key, reference in official.items():
        view, event = event_data_view(reference), ours[key]
        assert (event.body_type, sent_body(event)) == (view["body_type"], view["raw_body"]), key
        if view["body_type"] == "data":
            assert event.body == b"".join(view["raw_body"]), key
            if isinstance(view["text"], str):
                assert event.body_as_str() == view["text"], key
            else:  # not UTF-8: azure-eventhub wraps the UnicodeDecodeError in a TypeError, Event never did
                with pytest.raises(UnicodeDecodeError):
                    event.body_as_str()
        elif view["body_type"] == "value" and isinstance(view["raw_body"], (bytes, type(None))):
            assert event.body == (view["raw_body"] or b"") and event.body_as_str() == view["text"], key
        else:  # no text form: a clear error instead of azure-eventhub's Python repr
            assert event.body == b"", key
            with pytest.raises(TypeError, match="amqp_body"):
                event.body_as_str()


@pytest.mark.eventhubs
async def test_the_drop_in_consumer_client_hands_callbacks_the_bodies_the_official_one_does(bodies_hub):
    from eventprocessor import EventHubConsumerClient

    official = bodies_hub["official"]
    ours = await receive_official(bodies_hub["conn"], bodies_hub["hub"], "cg2", bodies_hub["count"],
                                  client_class=EventHubConsumerClient, checkpoint_store=InMemoryCheckpointStore(),
                                  load_balancing_interval=0.5)
    assert set(ours) == set(official)
    for key, reference in official.items():
        # body_as_str() included: the Python repr of a sequence or a value, as azure-eventhub gives it
        assert event_data_view(ours[key]) == event_data_view(reference), key
        assert ours[key].properties == reference.properties, key


# ----------------------------------------------------------------------------- Event, without a network

def test_an_event_without_the_new_fields_is_a_single_data_section_as_before():
    event = Event(b"hello", 1, "0", WHEN)
    assert (event.body_type, event.amqp_body) == (BodyType.DATA, None)
    assert event.body_type == "data" and event.body_as_str() == "hello"
    positional = Event(b"hello", 1, "0", WHEN, None, {}, None, None, None, None)
    assert positional == event


@pytest.mark.parametrize("body_type, amqp_body, body, text", [
    (BodyType.DATA, None, b'{"a": 1}', '{"a": 1}'),
    (BodyType.DATA, (b'{"a": ', b"1}"), b'{"a": 1}', '{"a": 1}'),
    (BodyType.VALUE, b'{"a": 1}', b'{"a": 1}', '{"a": 1}'),
    (BodyType.VALUE, '{"a": 1}', b'{"a": 1}', '{"a": 1}'),
    (BodyType.VALUE, None, b"", ""),
])
def test_text_bodies_read_as_text_and_json(body_type, amqp_body, body, text):
    event = Event(body, 4, "0", WHEN, partition_id="2", body_type=body_type, amqp_body=amqp_body)
    assert event.body_as_str() == text
    if text:
        assert event.body_as_json() == {"a": 1}


@pytest.mark.parametrize("body_type, amqp_body, what", [
    (BodyType.SEQUENCE, ([b"message", 123.456, True],), "a sequence body"),
    (BodyType.VALUE, {b"key": [-123, b"data", False]}, r"an AMQP value body \(dict\)"),
    (BodyType.VALUE, 7, r"an AMQP value body \(int\)"),
])
def test_bodies_without_text_raise_naming_the_event_and_amqp_body(body_type, amqp_body, what):
    event = Event(b"", 4, "0", WHEN, partition_id="2", body_type=body_type, amqp_body=amqp_body)
    for convert in (event.body_as_str, event.body_as_json):
        with pytest.raises(TypeError, match=f"event 4 of partition 2 has {what}.*read event.amqp_body"):
            convert()


def test_body_as_json_of_text_that_is_not_json_is_a_type_error_as_in_azure_eventhub():
    with pytest.raises(TypeError, match="not JSON"):
        Event(b"not json", 1, "0", WHEN).body_as_json()


def test_received_event_builds_the_same_event_as_the_constructor():
    import dataclasses

    fields = [f.name for f in dataclasses.fields(Event)]
    values = (b"aabb", 3, "64", WHEN, "key", {"k": 1}, "1", "m", "text/plain", 9, BodyType.DATA, (b"aa", b"bb"))
    fast = received_event(*values)
    assert type(fast) is Event and fast == Event(*values)
    assert list(vars(fast)) == fields, "received_event must set every field of Event, and only those"
    assert received_event(*values[:10]) == Event(*values[:10])
    assert replace(fast, body=b"x").body == b"x" and repr(fast) == repr(Event(*values))
    assert pickle.loads(pickle.dumps(fast)) == fast  # events cross processes (the Spark sink, dead letters)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.body = b"y"  # type: ignore[misc]


# ----------------------------------------------------------------------------- InMemoryEventSource

async def test_memory_source_sends_every_body_type_as_amqp_annotated_message_takes_them():
    source = InMemoryEventSource(1)
    plain = await source.send("hi")
    sections = await source.send([b"aa", "bb", b"cc"])
    one_sequence = await source.send(sequence_body=[b"message", 123.456, True])
    two_sequences = await source.send(sequence_body=[[1], [2, 3]])
    value = await source.send(value_body={b"key": [-123, b"data", False]})
    text = await source.send(value_body="text")
    nothing = await source.send(value_body=None)
    assert (plain.body, plain.body_type, plain.amqp_body) == (b"hi", BodyType.DATA, None)
    assert (sections.body, sections.amqp_body) == (b"aabbcc", (b"aa", b"bb", b"cc"))
    assert (one_sequence.body_type, one_sequence.amqp_body) == (BodyType.SEQUENCE, ([b"message", 123.456, True],))
    assert two_sequences.amqp_body == ([1], [2, 3])
    assert (value.body_type, value.amqp_body, value.body) == (BodyType.VALUE, {b"key": [-123, b"data", False]}, b"")
    assert (text.body, text.body_as_str()) == (b"text", "text")
    assert (nothing.body_type, nothing.amqp_body, nothing.body_as_str()) == (BodyType.VALUE, None, "")
    receiver = await source.open_receiver("0", consumer_group="$default",
                                          starting_position=EventPosition.earliest(),
                                          owner_level=None)
    assert await receiver.receive(10, 0) == [plain, sections, one_sequence, two_sequences, value, text, nothing]


@pytest.mark.parametrize("arguments, error, message", [
    ({}, "ConfigurationError", "exactly one of body"),
    ({"body": b"x", "value_body": 1}, "ConfigurationError", "got body, value_body"),
    ({"body": []}, "TypeError", "non-empty list"),
    ({"body": [b"a", 1]}, "TypeError", "data section must be bytes or str"),
    ({"sequence_body": "abc"}, "TypeError", "sequence_body must be a non-empty list"),
    ({"sequence_body": []}, "TypeError", "sequence_body must be a non-empty list"),
])
async def test_memory_source_refuses_bodies_it_cannot_send(arguments, error, message):
    with pytest.raises(Exception, match=message) as info:
        await InMemoryEventSource(1).send(**arguments)
    assert type(info.value).__name__ == error


# ------------------------------------------------------------------------- the drop-in's EventData, without a network

def _received_message(**body: Any) -> Any:
    """A message as azure-eventhub's decoder hands it over (its own codec, both ways)."""
    from azure.eventhub._pyamqp._decode import decode_payload
    from azure.eventhub._pyamqp._encode import encode_payload
    from azure.eventhub._pyamqp.message import Message
    from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

    annotations = {b"x-opt-sequence-number": 5, b"x-opt-offset": b"640",
                   b"x-opt-enqueued-time": {TYPE: AMQPTypes.timestamp, VALUE: 1_767_225_600_123}}
    message = Message(message_annotations=annotations, application_properties={b"kind": b"reading"}, **body)
    return decode_payload(memoryview(encode_payload(bytearray(), message)))


BODIES = {
    "one data section": {"data": [b"plain"]},
    "three data sections": {"data": [b"aa", b"bb", b"cc"]},
    "one sequence section": {"sequence": [[b"message", 123.456, True]]},
    "two sequence sections": {"sequence": [[1, 2], [b"x"]]},
    "a map value": {"value": {b"key": [-123, b"data", False]}},
    "a binary value": {"value": b"bytes"},
    "an int value": {"value": 7},
    "no body": {},
}


@pytest.mark.parametrize("shape", list(BODIES))
def test_to_event_data_reads_like_the_event_data_azure_eventhub_builds(shape):
    from azure.eventhub import EventData

    from eventprocessor.consumer_client import to_event_data
    from eventprocessor.sources.eventhub import message_to_event

    message = _received_message(**BODIES[shape])
    official = EventData._from_message(message)
    ours = to_event_data(message_to_event(message, "0"))
    assert event_data_view(ours) == event_data_view(official)
    assert (ours.sequence_number, ours.offset, ours.enqueued_time, ours.properties) == (
        official.sequence_number, official.offset, official.enqueued_time, official.properties)


# (body, body_type, amqp_body) each shape becomes
EXPECTED_FIELDS = {
    "one data section": (b"plain", "data", None),
    "three data sections": (b"aabbcc", "data", (b"aa", b"bb", b"cc")),
    "one sequence section": (b"", "sequence", ([b"message", 123.456, True],)),
    "two sequence sections": (b"", "sequence", ([1, 2], [b"x"])),
    "a map value": (b"", "value", {b"key": [-123, b"data", False]}),
    "a binary value": (b"bytes", "value", b"bytes"),
    "an int value": (b"", "value", 7),
    "no body": (b"", "value", None),
}


@pytest.mark.parametrize("shape", list(BODIES))
def test_message_to_event_keeps_every_body_type_as_sent(shape):
    """The lean receive path's conversion, on messages as the client decodes them; the
    fallback's (``to_event`` of the client's ``EventData``) gives the same Event."""
    from azure.eventhub import EventData

    from eventprocessor.sources.eventhub import message_to_event, to_event

    message = _received_message(**BODIES[shape])
    event = message_to_event(message, "3")
    assert (event.body, event.body_type, event.amqp_body) == EXPECTED_FIELDS[shape]
    assert type(event.body) is bytes and isinstance(event.body_type, BodyType)
    assert (event.sequence_number, event.offset, event.partition_id, event.properties) == (
        5, "640", "3", {"kind": b"reading"})
    assert event.enqueued_time == datetime(2026, 1, 1, 0, 0, 0, 123000, tzinfo=timezone.utc)
    assert to_event(EventData._from_message(message), "3") == event
