"""The drop-in against the emulator, judged by the official client: what azure-eventhub's
own live tests found it doing differently from ``azure.eventhub.aio.EventHubConsumerClient``.

* ``get_eventhub_properties`` (with ``get_partition_ids`` and ``get_partition_properties``)
  answers as the official client's does, under every credential type the official
  client takes, and a refused credential raises its ``AuthenticationError``.
* What reaches ``on_error`` is azure-eventhub's exception: a receiver taken over by a
  higher owner level gives an ``EventHubError``; an ``ssl_context`` that refuses the
  server's certificate gives a ``ConnectError`` (through a TLS-terminating relay in front
  of the emulator, reached with ``custom_endpoint_address``).
* A checkpoint store written against azure-eventhub's public ``CheckpointStore``
  interface runs the drop-in: claims and checkpoints go through its four methods, and
  the next client resumes after its checkpoints.
* Events carry the whole AMQP message as the official client gives it:
  ``raw_amqp_message`` with header, delivery and message annotations, every properties
  field (``subject``...), application properties and footer.

All tests use the session's emulator (which checks SAS tokens) and fresh hubs.
"""
from __future__ import annotations

import asyncio
import ssl
import time
import uuid
from collections import Counter
from typing import Any

import pytest
from azure.core.credentials import AccessToken, AzureNamedKeyCredential, AzureSasCredential
from azure.eventhub import EventData, TransportType, parse_connection_string
from azure.eventhub.aio import CheckpointStore as OfficialCheckpointStore
from azure.eventhub.aio import EventHubConsumerClient as Official
from azure.eventhub.aio import EventHubProducerClient, EventHubSharedKeyCredential
from azure.eventhub.amqp import AmqpAnnotatedMessage
from azure.eventhub.exceptions import AuthenticationError, ConnectError, EventHubError

from eventprocessor import EventHubConsumerClient as DropIn
from eventprocessor.emulators.fault_proxy import TcpFaultProxy
from harness.tls import TestPki

pytestmark = pytest.mark.eventhubs


def _key(conn: str) -> tuple[str, str]:
    parsed = parse_connection_string(conn)
    return parsed.shared_access_key_name or "", parsed.shared_access_key or ""


async def _until(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


class _SasTokenCredential:
    """A token credential (what Azure AD gives) handing out SAS tokens signed with the
    emulator's key: the token path of the client, with a token the emulator checks."""

    def __init__(self, key_name: str, key: str) -> None:
        self._shared = EventHubSharedKeyCredential(key_name, key)

    async def get_token(self, *scopes: str, **kwargs: Any) -> AccessToken:
        return await self._shared.get_token("sb://emulator/")

    async def close(self) -> None:
        return None


async def test_management_calls_answer_as_the_official_client_s_under_every_credential(eventhubs_emulator, tmp_path):
    from azure.eventhub.aio._client_base_async import EventHubSASTokenCredential

    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    key_name, key = _key(conn)
    token = (await EventHubSharedKeyCredential(key_name, key).get_token(f"sb://emulator.test/{hub}")).token
    credentials = {
        "AzureNamedKeyCredential": AzureNamedKeyCredential(key_name, key),
        "EventHubSharedKeyCredential": EventHubSharedKeyCredential(key_name, key),
        "AzureSasCredential": AzureSasCredential(token),
        "EventHubSASTokenCredential": EventHubSASTokenCredential(token, time.time() + 3000),
        "a token credential": _SasTokenCredential(key_name, key),
    }
    pki = TestPki.create(tmp_path, hostnames=["127.0.0.1"])
    async with TcpFaultProxy("127.0.0.1", eventhubs_emulator.port, ssl=pki.server_context()) as relay:
        over_tls = {"custom_endpoint_address": f"sb://127.0.0.1:{relay.port}", "transport_type": TransportType.Amqp,
                    "ssl_context": pki.client_context()}
        async with Official.from_connection_string(conn, "$default", eventhub_name=hub) as official:
            expected = await _management(official)
        assert expected[0]["eventhub_name"] == hub and expected[0]["partition_ids"] == ["0", "1", "2", "3"]
        async with DropIn.from_connection_string(conn, "$default", eventhub_name=hub) as client:
            assert await _management(client) == expected, "connection string"
        for name, credential in credentials.items():
            for kind in (Official, DropIn):
                async with kind("emulator.test", hub, "$default", credential, **over_tls) as client:
                    assert await _management(client) == expected, (name, kind)
        for refused in (AzureNamedKeyCredential(key_name, "not-the-key"), AzureNamedKeyCredential("not-him", key)):
            async with DropIn("emulator.test", hub, "$default", refused, retry_total=0, **over_tls) as client:
                with pytest.raises(AuthenticationError):
                    await client.get_eventhub_properties()
    async with DropIn.from_connection_string(conn, "$default", eventhub_name="nemo", retry_total=0) as client:
        with pytest.raises(ConnectError, match="could not be found"):
            await client.get_eventhub_properties()


async def _management(client: Any) -> tuple:
    return (await client.get_eventhub_properties(), await client.get_partition_ids(),
            await client.get_partition_properties("2"))


async def test_a_receiver_taken_over_by_a_higher_owner_level_reaches_on_error_as_an_event_hub_error(
        eventhubs_emulator):
    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    errors: list[Exception] = []
    got: list[int] = []

    async def on_error(_context: Any, error: Exception) -> None:
        errors.append(error)

    async def on_event(_context: Any, event: Any) -> None:
        got.append(event.sequence_number)

    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
        await producer.send_batch([EventData("e")], partition_id="0")
    first = DropIn.from_connection_string(conn, "$default", eventhub_name=hub)
    second = Official.from_connection_string(conn, "$default", eventhub_name=hub)
    async with first, second:
        tasks = [asyncio.create_task(first.receive(on_event, partition_id="0", starting_position="-1",
                                                   on_error=on_error))]
        try:
            await _until(lambda: got == [0], "the drop-in received nothing")
            tasks.append(asyncio.create_task(second.receive(on_event, partition_id="0", starting_position="-1",
                                                            owner_level=1)))
            await _until(lambda: errors, "the drop-in's receiver was not taken over")
        finally:
            await first.close()
            await second.close()
            tasks[-1].cancel()  # the official client's receive returns only after its 30-s balancing sleep
            await asyncio.gather(*tasks, return_exceptions=True)
    assert tasks[0].result() is None  # the drop-in's returned by itself, once closed
    assert isinstance(errors[0], EventHubError), repr(errors[0])


async def test_an_ssl_context_that_refuses_the_certificate_reaches_on_error_as_a_connect_error(
        eventhubs_emulator, tmp_path):
    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    key_name, key = _key(conn)
    pki = TestPki.create(tmp_path, hostnames=["127.0.0.1"])
    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
        await producer.send_batch([EventData("over TLS")], partition_id="1")
    async with TcpFaultProxy("127.0.0.1", eventhubs_emulator.port, ssl=pki.server_context()) as relay:
        for context, trusted in ((ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), False), (pki.client_context(), True)):
            errors: list[Exception] = []
            got: list[str] = []

            async def on_error(_context: Any, error: Exception, errors: list = errors) -> None:
                errors.append(error)

            async def on_event(_context: Any, event: Any, got: list = got) -> None:
                got.append(event.body_as_str())

            client = DropIn("emulator.test", hub, "$default", AzureNamedKeyCredential(key_name, key),
                            custom_endpoint_address=f"sb://127.0.0.1:{relay.port}", transport_type=TransportType.Amqp,
                            ssl_context=context, retry_total=0)
            async with client:
                task = asyncio.create_task(client.receive(on_event, starting_position="-1", on_error=on_error))
                try:
                    await _until(lambda got=got, errors=errors, trusted=trusted: got if trusted else errors,
                                 "no outcome")
                finally:
                    await client.close()
                    await task
            if trusted:
                assert got == ["over TLS"] and errors == []
            else:
                assert isinstance(errors[0], ConnectError), repr(errors[0])
                assert "CERTIFICATE_VERIFY_FAILED" in str(errors[0])


class _UserStore(OfficialCheckpointStore):
    """A checkpoint store as a user writes one against azure-eventhub's public
    interface: dicts in memory, claims conditional on the etag."""

    def __init__(self) -> None:
        self.ownership: dict[tuple, dict[str, Any]] = {}
        self.checkpoints: dict[tuple, dict[str, Any]] = {}
        self.calls: Counter[str] = Counter()

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                             **kwargs: Any) -> list[dict[str, Any]]:
        self.calls["list_ownership"] += 1
        scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        return [dict(record) for key, record in self.ownership.items() if key[:3] == scope]

    async def claim_ownership(self, ownership_list: Any, **kwargs: Any) -> list[dict[str, Any]]:
        self.calls["claim_ownership"] += 1
        claimed = []
        for wanted in ownership_list:
            key = (wanted["fully_qualified_namespace"], wanted["eventhub_name"], wanted["consumer_group"],
                   wanted["partition_id"])
            current = self.ownership.get(key)
            if (current["etag"] if current else None) != wanted.get("etag"):
                continue
            record = dict(wanted, etag=uuid.uuid4().hex, last_modified_time=time.time())
            self.ownership[key] = record
            claimed.append(dict(record))
        return claimed

    async def update_checkpoint(self, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        self.calls["update_checkpoint"] += 1
        key = (checkpoint["fully_qualified_namespace"], checkpoint["eventhub_name"], checkpoint["consumer_group"],
               checkpoint["partition_id"])
        self.checkpoints[key] = dict(checkpoint)

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                               **kwargs: Any) -> list[dict[str, Any]]:
        self.calls["list_checkpoints"] += 1
        scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        return [dict(record) for key, record in self.checkpoints.items() if key[:3] == scope]


async def _receive_all(client: DropIn, count: int) -> dict[str, list[str]]:
    got: dict[str, list[str]] = {}

    async def on_event_batch(context: Any, events: list[Any]) -> None:
        got.setdefault(context.partition_id, []).extend(event.body_as_str() for event in events)
        await context.update_checkpoint()

    async with client:
        task = asyncio.create_task(client.receive_batch(on_event_batch, starting_position="-1"))
        try:
            await _until(lambda: sum(map(len, got.values())) >= count, f"{count} events not received")
            await asyncio.sleep(0.3)  # anything extra would arrive now
        finally:
            await client.close()
            await task
    return got


async def test_a_checkpoint_store_written_to_the_official_interface_runs_the_drop_in(eventhubs_emulator):
    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    store = _UserStore()

    async def send(tag: str, count: int) -> None:
        async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
            for pid in ("0", "1", "2", "3"):
                await producer.send_batch([EventData(f"{tag} {pid} {i}") for i in range(count)], partition_id=pid)

    await send("first", 3)
    first = await _receive_all(DropIn.from_connection_string(conn, "$default", eventhub_name=hub,
                                                             checkpoint_store=store, load_balancing_interval=0.5), 12)
    assert {pid: len(bodies) for pid, bodies in first.items()} == {pid: 3 for pid in "0123"}
    assert {key[3]: record["sequence_number"] for key, record in store.checkpoints.items()} == {p: 2 for p in "0123"}
    assert len(store.ownership) == 4 and store.calls["claim_ownership"] >= 1
    await send("second", 2)
    second = await _receive_all(DropIn.from_connection_string(conn, "$default", eventhub_name=hub,
                                                              checkpoint_store=store, load_balancing_interval=0.5), 8)
    assert sorted(body for bodies in second.values() for body in bodies) == sorted(
        f"second {pid} {i}" for pid in "0123" for i in range(2))  # resumed after the checkpoints
    assert {key[3]: record["sequence_number"] for key, record in store.checkpoints.items()} == {p: 4 for p in "0123"}


def _view(event: EventData) -> tuple:
    """Everything the official client lets a callback read of an event."""
    raw = event.raw_amqp_message
    header = raw.header
    properties = raw.properties
    return (event.body_type, list(raw.body) if event.body_type != "value" else raw.body, event.body_as_str(),
            event.sequence_number, event.offset, event.enqueued_time, event.partition_key, event.properties,
            event.system_properties, event.message_id, event.content_type, event.correlation_id,
            None if header is None else (header.priority, header.durable, header.time_to_live, header.first_acquirer,
                                         header.delivery_count),
            raw.delivery_annotations, raw.annotations, raw.application_properties, raw.footer,
            None if properties is None else {name: getattr(properties, name) for name in (
                "message_id", "user_id", "to", "subject", "reply_to", "correlation_id", "content_type",
                "content_encoding", "absolute_expiry_time", "creation_time", "group_id", "group_sequence",
                "reply_to_group_id")}, str(event))


async def test_events_carry_the_whole_amqp_message_as_the_official_client_gives_them(eventhubs_emulator):
    conn, hub = eventhubs_emulator.connection_string, eventhubs_emulator.fresh_hub(4)
    messages = [
        AmqpAnnotatedMessage(sequence_body=[b"message", 123.456, True], header={"priority": 10, "durable": True},
                             annotations={"ann_key": "ann_value"}, delivery_annotations={"delann_key": "delann_value"},
                             properties={"subject": "sequence", "reply_to": "here", "message_id": "m1",
                                         "content_type": "text/plain", "group_id": "g", "user_id": b"u"},
                             application_properties={"body_type": "sequence"}, footer={"footer_key": "footer_value"}),
        AmqpAnnotatedMessage(value_body={b"key": [-123, b"data", False]}, annotations={"ann_key": "v"}),
        EventData("plain"),
    ]
    async with EventHubProducerClient.from_connection_string(conn, eventhub_name=hub) as producer:
        for message in messages:
            await producer.send_event(message, partition_id="3")

    async def read(client_class: Any) -> list[tuple]:
        got: list[EventData] = []

        async def on_event(_context: Any, event: EventData) -> None:
            got.append(event)

        client = client_class.from_connection_string(conn, "$default", eventhub_name=hub)
        async with client:
            task = asyncio.create_task(client.receive(on_event, partition_id="3", starting_position="-1"))
            try:
                await _until(lambda: len(got) >= 3, "three events not received")
            finally:
                await client.close()
                task.cancel()  # the official client's receive returns only after its 30-s balancing sleep
                await asyncio.gather(task, return_exceptions=True)
        return [_view(event) for event in got]

    official, drop_in = await read(Official), await read(DropIn)
    assert official[0][13][b"delann_key"] == b"delann_value" and official[0][17]["subject"] == b"sequence"
    assert drop_in == official
