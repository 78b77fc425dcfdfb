"""The azure-eventhub adapter: configuration, conversion, and an unreachable hub.

No Event Hub (or its Docker-only emulator) is reachable here, so the receive path is
exercised against a closed loopback port: the processor must report the failure and
keep running, owning nothing."""
from __future__ import annotations

import asyncio
import logging
import socket
from datetime import datetime, timezone

import pytest

from eventprocessor import ConfigurationError, EventPosition, EventProcessor, PartitionProcessor
from eventprocessor.sources.eventhub import EventHubSource, to_event, to_starting_position
from stores import InMemoryCheckpointStore

SECRET = "c2VjcmV0LWtleS1kby1ub3QtbGVhaw=="
CONN = f"Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey={SECRET};EntityPath=telemetry"


def test_from_connection_string_reads_namespace_and_hub_and_hides_the_key():
    source = EventHubSource.from_connection_string(CONN)
    assert source.fully_qualified_namespace == "example.servicebus.windows.net"
    assert source.eventhub_name == "telemetry"
    assert SECRET not in repr(source) and SECRET not in str(vars(source).get("_client_kwargs"))


@pytest.mark.parametrize("bad", ["", "not a connection string", "Endpoint=;SharedAccessKey=" + SECRET])
def test_malformed_connection_strings_are_named_without_echoing_them(bad):
    with pytest.raises(ConfigurationError) as info:
        EventHubSource.from_connection_string(bad)
    assert SECRET not in str(info.value)
    assert "connection string" in str(info.value) or "event hub name" in str(info.value)


def test_hub_name_must_agree_with_entity_path():
    with pytest.raises(ConfigurationError, match="differs"):
        EventHubSource.from_connection_string(CONN, eventhub_name="other")


def test_positions_map_to_receive_batch_arguments():
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert to_starting_position(EventPosition.earliest()) == ("-1", False)
    assert to_starting_position(EventPosition.latest()) == ("@latest", False)
    assert to_starting_position(EventPosition.from_sequence_number(7)) == (7, False)
    assert to_starting_position(EventPosition.from_offset("128", inclusive=True)) == ("128", True)
    assert to_starting_position(EventPosition.from_enqueued_time(when)) == (when, False)


def test_event_data_converts_with_the_same_attribute_names():
    from azure.eventhub import EventData

    data = EventData(b"payload")
    data.properties = {b"kind": "reading", "unit": "C"}
    event = to_event(data)
    assert event.body == b"payload" and event.body_as_str() == "payload"
    assert event.properties == {"kind": "reading", "unit": "C"}
    for name in ("sequence_number", "offset", "enqueued_time", "partition_key"):
        assert hasattr(event, name)


async def test_unreachable_hub_is_reported_and_the_processor_keeps_running(caplog):
    with socket.socket() as sock:  # a loopback port with nothing listening
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    conn = (f"Endpoint=sb://127.0.0.1:{port};SharedAccessKeyName=k;SharedAccessKey={SECRET};"
            "EntityPath=hub;UseDevelopmentEmulator=true")
    source = EventHubSource.from_connection_string(conn, retry_total=0)
    errors = []

    async def on_error(error, context):
        errors.append(error)

    caplog.set_level(logging.DEBUG)
    processor = EventProcessor(source, InMemoryCheckpointStore(), PartitionProcessor, error_handler=on_error,
                               load_balancing_interval=0.2, partition_ownership_expiration_interval=2)
    await processor.start()
    try:
        for _ in range(300):
            if processor.ticks >= 2 and errors:
                break
            await asyncio.sleep(0.1)
    finally:
        await processor.stop()
        await source.close()
    assert errors, "the connection failure was not reported"
    assert processor.ticks >= 2 and processor.owned_partitions == frozenset()
    assert SECRET not in caplog.text


async def test_token_credential_constructor_builds_a_client_per_consumer_group():
    from azure.core.credentials import AzureNamedKeyCredential

    source = EventHubSource("example.servicebus.windows.net", "telemetry",
                            AzureNamedKeyCredential("listen", SECRET))
    receiver = await source.open_receiver("0", consumer_group="analytics", starting_position=EventPosition.earliest(),
                                          owner_level=3, prefetch=10)
    client = source._clients["analytics"]
    assert client.eventhub_name == "telemetry" and client._consumer_group == "analytics"
    assert SECRET not in repr(source) and SECRET not in repr(receiver)
    await receiver.close()
    await source.close()
