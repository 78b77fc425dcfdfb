"""The AMQP 1.0 server: connections, sessions and links over the emulated namespace.

One ``asyncio.Protocol`` per TCP connection parses frames straight from
``data_received`` (no task per connection, no copy per frame beyond the slice of the
frame itself). Everything runs on one event loop; the broker is plain data.

What a connection goes through, as ``azure-eventhub`` drives it:

1. Protocol header. ``AMQP 3 1 0 0`` starts SASL: the server offers ANONYMOUS (and
   PLAIN, EXTERNAL, MSSBCBS), accepts any ``sasl-init`` with outcome ok, then expects
   ``AMQP 0 1 0 0``. A plain AMQP header skips SASL. TLS is not offered: a TLS header
   or handshake is answered with the supported header and the connection is closed,
   which is what a client without ``UseDevelopmentEmulator=true`` sees.
2. ``open`` / ``begin`` / ``attach``. Link addresses:
   ``$cbs`` (put-token), ``$management`` (READ of hub and partition properties),
   ``<hub>`` or ``<hub>/Partitions/<id>`` (senders),
   ``<hub>/ConsumerGroups/<group>/Partitions/<id>`` (receivers, with a selector filter
   for the starting position and ``com.microsoft:epoch`` as the owner level).
3. Transfers. Sent messages (format 0, or the batch format 0x80013700 whose ``data``
   sections are whole messages) are stored and settled with ``accepted``; receivers get
   pre-settled transfers as their link credit allows, many per socket write.

A refused link gets an ``attach`` with a null terminus and a ``detach`` carrying the
error, as the service does. A frame the server cannot parse closes that connection
with ``amqp:decode-error`` (or ``amqp:connection:framing-error``); other connections
are not affected.

Tokens: by default any ``put-token`` is accepted (status 202), like Microsoft's Docker
emulator. With ``sas_key`` set, a token must be a SharedAccessSignature signed with that
key and not expired, or the request gets status 401.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import struct
import time
import uuid
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlparse

from . import frames as F
from .broker import BrokerError, EventHub, Namespace, Partition, parse_selector, split_message
from .codec import AMQPDecodeError, Described, StringArray, Symbol, Timestamp, decode, encode

__all__ = ["AMQPServer"]

logger = logging.getLogger(__name__)

_MAX_FRAME_SIZE = 256 * 1024
_CHANNEL_MAX = 255
_SESSION_WINDOW = 5000
_SENDER_CREDIT = 1000
_BATCH_FORMAT = 0x80013700
_EPOCH = "com.microsoft:epoch"
_RUNTIME_METRIC = "com.microsoft:enable-receiver-runtime-metric"
_SELECTOR = "apache.org:selector-filter:string"
_SELECTOR_CODE = 0x0000468C00000004


def _now_ms() -> int:
    return int(time.time() * 1000)


def _entity_path(address: str | None) -> list[str]:
    """The path segments of a link address (``amqps://host:port/hub/...`` or a bare path)."""
    if not address:
        return []
    if "://" in address:
        address = urlparse(address).path
    return [segment for segment in address.strip("/").split("/") if segment]


def _message(properties: list[Any], application_properties: dict[str, Any], value: Any) -> bytes:
    """An encoded response message: properties, application properties, amqp-value body."""
    full = (properties + [None] * 13)[:13]
    return (F.section(0x73, full) + b"\x00\x53\x74" + encode(application_properties)
            + b"\x00\x53\x77" + encode(value))


class _Link:
    """State common to both link directions."""

    def __init__(self, session: _Session, name: str, remote_handle: int, handle: int, address: str | None) -> None:
        self.session = session
        self.name = name
        self.remote_handle = remote_handle
        self.handle = handle
        self.address = address
        self.closed = False

    def detached(self) -> None:
        self.closed = True


class _InboundLink(_Link):
    """The client sends on it (a producer, or the request half of ``$cbs``/``$management``)."""

    def __init__(self, session: _Session, name: str, remote_handle: int, handle: int, address: str | None,
                 kind: str, hub: EventHub | None = None, partition: Partition | None = None) -> None:
        super().__init__(session, name, remote_handle, handle, address)
        self.kind = kind  # "cbs", "management" or "hub"
        self.hub = hub
        self.partition = partition
        self.delivery_count = 0
        self.credit = 0
        self.partial: bytearray | None = None
        self.partial_format = 0
        self.partial_id = 0
        self.partial_settled = False


class _OutboundLink(_Link):
    """The client receives on it: events of a partition, or the replies of ``$cbs``/``$management``."""

    def __init__(self, session: _Session, name: str, remote_handle: int, handle: int, address: str | None,
                 kind: str) -> None:
        super().__init__(session, name, remote_handle, handle, address)
        self.kind = kind  # "cbs", "management" or "partition"
        self.delivery_count = 0
        self.credit = 0
        self.drain = False
        self.queue: list[bytes] = []  # replies waiting for credit
        # Partition receivers only:
        self.partition: Partition | None = None
        self.consumer_group = ""
        self.owner_level: int | None = None
        self.cursor = 0
        self.runtime_metric = False
        self.scheduled = False

    # -- the broker's ReceiverHandle
    def wake(self) -> None:
        if not self.scheduled and self.credit > 0 and not self.closed:
            self.scheduled = True
            self.session.connection.loop.call_soon(self.flush)

    def disconnect(self, condition: str, description: str) -> None:
        if self.closed:
            return
        self.closed = True
        logger.info("receiver %s on partition %s disconnected: %s", self.name,
                    self.partition.partition_id if self.partition else "?", condition)
        self.session.detach_link(self, F.error(condition, description))

    # -- sending
    def flush(self) -> None:
        self.scheduled = False
        connection = self.session.connection
        if self.closed or connection.closed:
            return
        if self.partition is None:
            self._flush_queue()
            return
        if connection.paused or self.credit <= 0:
            return
        partition = self.partition
        if self.cursor < partition.begin_sequence_number:
            self.cursor = partition.begin_sequence_number  # events dropped by retention are gone
        available = partition.next_sequence_number - self.cursor
        count = min(self.credit, available, self.session.remote_incoming_window, 2000)
        if count <= 0:
            if self.drain and available <= 0:
                self._drained()
            return
        session = self.session
        channel, handle = session.channel, self.handle
        delivery_id = session.next_outgoing_id
        max_frame = connection.remote_max_frame_size
        chunks: list[bytes] = []
        frames_sent = 0
        if self.runtime_metric:
            last_time = Timestamp(partition.last_enqueued_time)
            retrieved = Timestamp(_now_ms())
            annotations = b"\x00\x53\x71" + encode({
                Symbol("last_enqueued_sequence_number"): partition.last_sequence_number,
                Symbol("last_enqueued_offset"): str(partition.last_offset),
                Symbol("last_enqueued_time_utc"): last_time,
                Symbol("runtime_info_retrieval_time_utc"): retrieved,
            })
            for sequence in range(self.cursor, self.cursor + count):
                payload, header_end, _offset, _time = partition.event(sequence)
                payload = payload[:header_end] + annotations + payload[header_end:]
                for piece in F.transfer_frames(channel, handle, delivery_id & 0xFFFFFFFF, payload, max_frame):
                    chunks.append(piece)
                    frames_sent += 1
                delivery_id += 1
        else:
            room = max_frame - 42
            transfer = F.transfer_frame
            for payload in partition.payload_slice(self.cursor, count):
                if len(payload) <= room:
                    chunks.append(transfer(channel, handle, delivery_id & 0xFFFFFFFF, payload))
                    frames_sent += 1
                else:
                    pieces = F.transfer_frames(channel, handle, delivery_id & 0xFFFFFFFF, payload, max_frame)
                    chunks.extend(pieces)
                    frames_sent += len(pieces)
                delivery_id += 1
        connection.write(b"".join(chunks))
        session.next_outgoing_id = delivery_id
        session.remote_incoming_window -= frames_sent
        self.cursor += count
        self.credit -= count
        self.delivery_count += count
        if self.credit > 0 and partition.next_sequence_number > self.cursor:
            self.wake()
        elif self.drain and self.credit > 0:
            self._drained()

    def _drained(self) -> None:
        self.delivery_count += self.credit
        self.credit = 0
        self.drain = False
        self.session.send_link_flow(self)

    def reply(self, message: bytes) -> None:
        self.queue.append(message)
        self._flush_queue()

    def _flush_queue(self) -> None:
        session = self.session
        while self.queue and self.credit > 0 and not self.closed:
            message = self.queue.pop(0)
            delivery_id = session.next_outgoing_id
            session.connection.write(b"".join(F.transfer_frames(
                session.channel, self.handle, delivery_id & 0xFFFFFFFF, message,
                session.connection.remote_max_frame_size)))
            session.next_outgoing_id += 1
            session.remote_incoming_window -= 1
            self.credit -= 1
            self.delivery_count += 1

    def detached(self) -> None:
        super().detached()
        if self.partition is not None:
            self.partition.remove_receiver(self.consumer_group, self)


class _Session:
    def __init__(self, connection: _Connection, channel: int, remote_channel: int, next_incoming_id: int,
                 remote_incoming_window: int) -> None:
        self.connection = connection
        self.channel = channel
        self.remote_channel = remote_channel
        self.next_incoming_id = next_incoming_id
        self.incoming_window = _SESSION_WINDOW
        self.received_since_flow = 0
        self.next_outgoing_id = 0
        self.remote_incoming_window = remote_incoming_window
        self.links: dict[int, _Link] = {}  # by the client's handle
        self.next_handle = 0
        self.ended = False

    # -- frames out
    def send_link_flow(self, link: _Link, *, echo: bool = False) -> None:
        credit = link.credit if isinstance(link, (_InboundLink, _OutboundLink)) else 0
        self.connection.write(F.flow_frame(
            self.channel, next_incoming_id=self.next_incoming_id, incoming_window=self.incoming_window,
            next_outgoing_id=self.next_outgoing_id, outgoing_window=0xFFFFFFFF, handle=link.handle,
            delivery_count=link.delivery_count, link_credit=credit,  # type: ignore[attr-defined]
            available=None, drain=getattr(link, "drain", False), echo=echo))
        self.received_since_flow = 0

    def send_session_flow(self) -> None:
        self.connection.write(F.flow_frame(
            self.channel, next_incoming_id=self.next_incoming_id, incoming_window=self.incoming_window,
            next_outgoing_id=self.next_outgoing_id, outgoing_window=0xFFFFFFFF))
        self.received_since_flow = 0

    def detach_link(self, link: _Link, err: Described | None) -> None:
        link.detached()
        self.links.pop(link.remote_handle, None)
        if not self.ended and not self.connection.closed:
            self.connection.write(F.detach_frame(self.channel, handle=link.handle, closed=True, err=err))

    def refuse(self, fields: list[Any], raw: list[bytes], role_of_client: bool, handle: int, err: Described) -> None:
        """Refuse an attach: answer with our terminus null, then detach with ``err``."""
        client_is_receiver = role_of_client
        self.connection.write(F.attach_frame(
            self.channel, name=fields[0], handle=handle, role=not role_of_client, snd_settle_mode=fields[3] or 0,
            rcv_settle_mode=fields[4] or 0,
            source=None if client_is_receiver else F.Raw(raw[5]),
            target=F.Raw(raw[6]) if client_is_receiver else None,
            initial_delivery_count=0 if client_is_receiver else None, max_message_size=None))
        self.connection.write(F.detach_frame(self.channel, handle=handle, closed=True, err=err))

    def end(self, err: Described | None = None) -> None:
        for link in list(self.links.values()):
            link.detached()
        self.links.clear()
        if not self.ended:
            self.ended = True
            self.connection.write(F.end_frame(self.channel, err))


class _Connection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: AMQPServer) -> None:
        self.server = server
        self.namespace = server.namespace
        self.loop = asyncio.get_running_loop() if server.loop is None else server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = "header"  # header -> sasl -> header -> open -> opened -> closed
        self.sasl_done = False
        self.sessions: dict[int, _Session] = {}  # by the client's channel
        self.remote_max_frame_size = 512
        self.closed = False
        self.paused = False
        self.peer = "?"
        self.authorized_audiences: list[str] = []
        self.idle_timer: asyncio.TimerHandle | None = None
        self._dispositions: list[tuple[_Session, int, Any]] = []

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        assert self.transport is not None
        self.transport.set_write_buffer_limits(high=4 * 1024 * 1024)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.server.connections.add(self)
        logger.debug("connection from %s", self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        if self.idle_timer is not None:
            self.idle_timer.cancel()
        for session in list(self.sessions.values()):
            for link in list(session.links.values()):
                link.detached()
        self.sessions.clear()
        logger.debug("connection from %s closed (%s)", self.peer, exc)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        for session in self.sessions.values():
            for link in session.links.values():
                if isinstance(link, _OutboundLink) and link.partition is not None:
                    link.wake()

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        self.buffer += data
        try:
            self._process()
        except (AMQPDecodeError, ValueError, TypeError, KeyError, IndexError, struct.error) as problem:
            logger.warning("closing connection from %s: malformed input: %s", self.peer, problem)
            self.close_with("amqp:decode-error", f"malformed frame: {problem}")
        except Exception as problem:  # never let one connection take the server down
            logger.exception("closing connection from %s after an internal error", self.peer)
            self.close_with("amqp:internal-error", f"emulator error: {type(problem).__name__}: {problem}")
        self._flush_dispositions()

    # -- output
    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def close_with(self, condition: str, description: str) -> None:
        if self.closed:
            return
        if self.state in ("opened", "open"):
            if self.state == "open":  # the client has not opened yet: open first, then close
                self.write(F.open_frame(self.server.container_id, hostname=None, max_frame_size=_MAX_FRAME_SIZE,
                                        channel_max=_CHANNEL_MAX, idle_timeout_ms=None))
            self.write(F.close_frame(F.error(condition, description)))
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- input
    def _process(self) -> None:
        buffer = self.buffer
        pos = 0
        while not self.closed:
            if self.state == "header":
                if len(buffer) - pos < 8:
                    break
                self._on_header(bytes(buffer[pos:pos + 8]))
                pos += 8
                continue
            if len(buffer) - pos < 8:
                break
            size, doff, frame_type, channel = F.read_frame_header(buffer, pos)
            if size < 8 or doff < 2 or doff * 4 > size:
                raise AMQPDecodeError(f"bad frame header (size {size}, data offset {doff})")
            if size > _MAX_FRAME_SIZE:
                self.close_with("amqp:connection:framing-error",
                                f"frame of {size} bytes exceeds the max-frame-size {_MAX_FRAME_SIZE}")
                return
            if len(buffer) - pos < size:
                break
            body = memoryview(buffer)[pos + doff * 4:pos + size]
            try:
                if size == doff * 4:
                    pass  # an empty frame: a heartbeat
                elif frame_type == 1:
                    self._on_sasl(F.decode_performative(body))
                elif frame_type == 0:
                    self._on_frame(channel, F.decode_performative(body))
                else:
                    raise AMQPDecodeError(f"unknown frame type {frame_type}")
            finally:
                body.release()
            pos += size
        del buffer[:pos]

    def _on_header(self, header: bytes) -> None:
        if header == F.SASL_HEADER and not self.sasl_done:
            self.write(F.SASL_HEADER)
            self.write(F.sasl_mechanisms(["ANONYMOUS", "PLAIN", "EXTERNAL", "MSSBCBS"]))
            self.state = "sasl"
        elif header == F.AMQP_HEADER:
            self.write(F.AMQP_HEADER)
            self.state = "open"
        else:
            reason = ("TLS is not offered (use a connection string with UseDevelopmentEmulator=true)"
                      if header.startswith(b"\x16\x03") or header == F.TLS_HEADER else f"unsupported header {header!r}")
            logger.warning("connection from %s refused: %s", self.peer, reason)
            self.write(F.SASL_HEADER if not self.sasl_done else F.AMQP_HEADER)
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def _on_sasl(self, frame: F.Performative) -> None:
        if self.state != "sasl" or frame.code != F.SASL_INIT:
            raise AMQPDecodeError(f"unexpected SASL frame {frame.name}")
        self.write(F.sasl_outcome(0))
        self.sasl_done = True
        self.state = "header"

    def _on_frame(self, channel: int, frame: F.Performative) -> None:
        code, fields = frame.code, frame.fields
        if self.state == "open":
            if code != F.OPEN:
                raise AMQPDecodeError(f"expected open, got {frame.name}")
            self._on_open(fields)
            return
        if self.state != "opened":
            raise AMQPDecodeError(f"{frame.name} after close")
        if code == F.TRANSFER:
            self._on_transfer(channel, frame)
        elif code == F.FLOW:
            self._on_flow(channel, fields)
        elif code == F.DISPOSITION:
            pass  # deliveries to clients are pre-settled; nothing to track
        elif code == F.ATTACH:
            self._on_attach(channel, frame)
        elif code == F.DETACH:
            self._on_detach(channel, fields)
        elif code == F.BEGIN:
            self._on_begin(channel, fields)
        elif code == F.END:
            session = self.sessions.pop(channel, None)
            if session is not None:
                session.end()
        elif code == F.CLOSE:
            self.write(F.close_frame())
            self.state = "closed"
            self.closed = True
            if self.transport is not None:
                self.transport.close()
        elif code == F.OPEN:
            raise AMQPDecodeError("a second open on the connection")
        else:
            raise AMQPDecodeError(f"unexpected {frame.name} frame")

    def _on_open(self, fields: list[Any]) -> None:
        max_frame = fields[2]
        self.remote_max_frame_size = max(512, min(int(max_frame) if max_frame is not None else _MAX_FRAME_SIZE,
                                                  16 * 1024 * 1024))
        self.write(F.open_frame(self.server.container_id, hostname=None, max_frame_size=_MAX_FRAME_SIZE,
                                channel_max=_CHANNEL_MAX, idle_timeout_ms=None,
                                properties={Symbol("product"): "eventprocessor emulator"}))
        self.state = "opened"
        idle = fields[4]
        if idle:
            # The client closes the connection if it hears nothing for its idle timeout.
            self._schedule_heartbeat(max(0.05, idle / 2000.0))

    def _schedule_heartbeat(self, every: float) -> None:
        def beat() -> None:
            if not self.closed:
                self.write(F.EMPTY_FRAME)
                self.idle_timer = self.loop.call_later(every, beat)

        self.idle_timer = self.loop.call_later(every, beat)

    def _on_begin(self, channel: int, fields: list[Any]) -> None:
        if channel in self.sessions:
            raise AMQPDecodeError(f"channel {channel} already has a session")
        if len(self.sessions) > _CHANNEL_MAX:
            raise AMQPDecodeError("too many sessions")
        incoming_window = fields[2] or 0
        session = _Session(self, channel, channel, next_incoming_id=fields[1] or 0,
                           remote_incoming_window=int(incoming_window))
        self.sessions[channel] = session
        self.write(F.begin_frame(channel, remote_channel=channel, next_outgoing_id=0,
                                 incoming_window=_SESSION_WINDOW, outgoing_window=0xFFFFFFFF, handle_max=0xFFFF))

    def _session(self, channel: int) -> _Session | None:
        # The client sends detach for its $management links after end on that channel:
        # frames for a channel that is gone are ignored, not treated as errors.
        return self.sessions.get(channel)

    # -- links
    def _on_attach(self, channel: int, frame: F.Performative) -> None:
        session = self._session(channel)
        if session is None:
            return
        fields, raw = frame.fields, frame.raw
        name, remote_handle, role = fields[0], fields[1], fields[2]
        if not isinstance(name, str) or not isinstance(remote_handle, int) or not isinstance(role, bool):
            raise AMQPDecodeError("attach needs a name, a handle and a role")
        if remote_handle in session.links:
            raise AMQPDecodeError(f"handle {remote_handle} is already attached")
        handle = session.next_handle
        session.next_handle += 1
        source = fields[5].value if isinstance(fields[5], Described) else None
        target = fields[6].value if isinstance(fields[6], Described) else None
        properties = fields[13] if isinstance(fields[13], dict) else {}
        desired = fields[12] if isinstance(fields[12], list) else ([fields[12]] if fields[12] else [])
        try:
            if role:  # the client receives: we send
                address = source[0] if source else None
                link = self._outbound(session, name, remote_handle, handle, address, source, properties, desired)
                if link.partition is not None:
                    # The owner-level rules run before the attach is answered, so a refused
                    # receiver gets the service's refusal: a null source, then the error.
                    link.partition.add_receiver(link.consumer_group, link)
                session.links[remote_handle] = link
                offered = [_RUNTIME_METRIC] if link.runtime_metric else None
                self.write(F.attach_frame(
                    channel, name=name, handle=handle, role=False, snd_settle_mode=1,
                    rcv_settle_mode=fields[4] or 0, source=F.Raw(raw[5]), target=F.Raw(raw[6]),
                    initial_delivery_count=0, max_message_size=self.namespace.max_message_size,
                    offered_capabilities=offered,
                    properties={Symbol(_EPOCH): link.owner_level} if link.owner_level is not None else None))
                if link.partition is not None:
                    logger.debug("receiver %s attached to %s/%s partition %s at sequence %d (owner level %s)",
                                 name, link.partition.hub.name, link.consumer_group, link.partition.partition_id,
                                 link.cursor, link.owner_level)
            else:  # the client sends: we receive
                address = target[0] if target else None
                inbound = self._inbound(session, name, remote_handle, handle, address)
                session.links[remote_handle] = inbound
                self.write(F.attach_frame(
                    channel, name=name, handle=handle, role=True, snd_settle_mode=fields[3] or 0,
                    rcv_settle_mode=0, source=F.Raw(raw[5]), target=F.Raw(raw[6]),
                    initial_delivery_count=None, max_message_size=self.namespace.max_message_size))
                inbound.credit = _SENDER_CREDIT
                session.send_link_flow(inbound)
        except BrokerError as refused:
            logger.info("attach of %s to %s refused: %s", name, source[0] if role and source else
                        (target[0] if target else None), refused.description)
            session.refuse(fields, raw, role, handle, F.error(refused.condition, refused.description))

    def _outbound(self, session: _Session, name: str, remote_handle: int, handle: int, address: str | None,
                  source: list[Any] | None, properties: dict[Any, Any], desired: list[Any]) -> _OutboundLink:
        path = _entity_path(address)
        if path in (["$cbs"], ["$management"]):
            return _OutboundLink(session, name, remote_handle, handle, address, path[0][1:])
        # <hub>/ConsumerGroups/<group>/Partitions/<id>
        if len(path) != 5 or path[1].lower() != "consumergroups" or path[3].lower() != "partitions":
            raise BrokerError("amqp:not-found", f"The messaging entity '{address}' could not be found: a receiver "
                                                "address is <hub>/ConsumerGroups/<group>/Partitions/<id>.")
        hub = self.namespace.hub(path[0])
        hub.check_consumer_group(path[2])
        partition = hub.partition(path[4])
        self.namespace.check_busy()
        self._check_authorized(hub)
        link = _OutboundLink(session, name, remote_handle, handle, address, "partition")
        link.consumer_group = path[2]
        level = properties.get(_EPOCH, properties.get(Symbol(_EPOCH)))
        if level is not None and not isinstance(level, int):
            raise BrokerError("amqp:invalid-field", f"{_EPOCH} must be a long, got {type(level).__name__}")
        link.owner_level = level
        link.runtime_metric = _RUNTIME_METRIC in desired
        filters = source[7] if source and len(source) > 7 and isinstance(source[7], dict) else {}
        expression = None
        for key, value in filters.items():
            described = value if isinstance(value, Described) else None
            if key == _SELECTOR or (described is not None and described.descriptor in (_SELECTOR, _SELECTOR_CODE)):
                expression = described.value if described is not None else value
        if expression is not None and not isinstance(expression, str):
            raise BrokerError("amqp:invalid-field", "the selector filter must be a string")
        link.cursor = partition.resolve(parse_selector(expression))
        link.partition = partition
        return link

    def _inbound(self, session: _Session, name: str, remote_handle: int, handle: int,
                 address: str | None) -> _InboundLink:
        path = _entity_path(address)
        if path in (["$cbs"], ["$management"]):
            return _InboundLink(session, name, remote_handle, handle, address, path[0][1:])
        if len(path) == 1:
            hub = self.namespace.hub(path[0])
            self._check_authorized(hub)
            return _InboundLink(session, name, remote_handle, handle, address, "hub", hub)
        if len(path) == 3 and path[1].lower() == "partitions":
            hub = self.namespace.hub(path[0])
            partition = hub.partition(path[2])
            self._check_authorized(hub)
            return _InboundLink(session, name, remote_handle, handle, address, "hub", hub, partition)
        raise BrokerError("amqp:not-found", f"The messaging entity '{address}' could not be found: a sender address "
                                            "is <hub> or <hub>/Partitions/<id>.")

    def _check_authorized(self, hub: EventHub) -> None:
        if self.server.sas_key is None:
            return
        wanted = hub.name.casefold()
        for audience in self.authorized_audiences:
            path = _entity_path(audience)
            if not path or path[0].casefold() == wanted:
                return
        raise BrokerError("amqp:unauthorized-access",
                          f"Unauthorized access to '{hub.name}': no valid token was put for it on this connection.")

    def _on_detach(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        if session is None:
            return
        link = session.links.pop(fields[0], None)
        if link is None:
            return
        link.detached()
        self.write(F.detach_frame(channel, handle=link.handle, closed=bool(fields[1])))

    def _on_flow(self, channel: int, fields: list[Any]) -> None:
        session = self._session(channel)
        if session is None:
            return
        next_incoming_id, incoming_window = fields[0], fields[1] or 0
        # The client's view of how many more transfers it takes from us.
        base = next_incoming_id if next_incoming_id is not None else 0
        session.remote_incoming_window = base + int(incoming_window) - session.next_outgoing_id
        handle = fields[4]
        if handle is None:
            for any_link in session.links.values():
                if isinstance(any_link, _OutboundLink):
                    any_link.wake() if any_link.partition is not None else any_link._flush_queue()
            return
        link = session.links.get(handle)
        if isinstance(link, _OutboundLink):
            delivery_count = fields[5] if fields[5] is not None else 0
            link_credit = fields[6] or 0
            link.credit = max(0, delivery_count + link_credit - link.delivery_count)
            link.drain = bool(fields[8])
            if fields[9]:
                session.send_link_flow(link)
            if link.partition is not None:
                link.flush()
            else:
                link._flush_queue()
        elif isinstance(link, _InboundLink) and fields[9]:
            session.send_link_flow(link, echo=False)

    # -- transfers from the client
    def _on_transfer(self, channel: int, frame: F.Performative) -> None:
        session = self._session(channel)
        if session is None:
            return
        fields = frame.fields
        session.next_incoming_id += 1
        session.received_since_flow += 1
        link = session.links.get(fields[0])
        if not isinstance(link, _InboundLink):
            raise AMQPDecodeError(f"transfer on handle {fields[0]}, which is not a sending link")
        more = bool(fields[5])
        if link.partial is None:
            link.partial_id = fields[1] if fields[1] is not None else 0
            link.partial_format = fields[3] or 0
            link.partial_settled = bool(fields[4])
            if more:
                link.partial = bytearray(frame.payload)
                return
            message: Any = frame.payload
        else:
            link.partial += frame.payload
            if len(link.partial) > self.namespace.max_message_size + 64 * 1024:
                raise AMQPDecodeError("a multi-frame message exceeds the maximum message size")
            if more:
                return
            message = bytes(link.partial)
            link.partial = None
        delivery_id, message_format, settled = link.partial_id, link.partial_format, link.partial_settled
        link.delivery_count += 1
        link.credit -= 1
        if link.credit <= _SENDER_CREDIT // 2:
            link.credit = _SENDER_CREDIT
            session.send_link_flow(link)
        elif session.received_since_flow >= _SESSION_WINDOW // 2:
            session.send_session_flow()
        state = self._deliver(link, message, message_format)
        if not settled:
            self._dispositions.append((session, delivery_id, state))

    def _deliver(self, link: _InboundLink, message: bytes, message_format: int) -> Described:
        try:
            if len(message) > self.namespace.max_message_size:
                raise BrokerError("amqp:link:message-size-exceeded",
                                  f"The received message ({len(message)} bytes) exceeds the limit "
                                  f"({self.namespace.max_message_size} bytes).")
            if link.kind == "hub":
                self._store(link, message, message_format)
            elif link.kind == "cbs":
                self._on_put_token(link, message)
            else:
                self._on_management(link, message)
            return F.accepted()
        except BrokerError as refused:
            return F.rejected(refused.condition, refused.description)
        except AMQPDecodeError as problem:
            return F.rejected("amqp:decode-error", f"the message could not be parsed: {problem}")

    def _flush_dispositions(self) -> None:
        """Settle the deliveries of this read in as few frames as possible (runs of ids)."""
        pending, self._dispositions = self._dispositions, []
        if self.closed or not pending:
            return
        start = 0
        while start < len(pending):
            session, first, state = pending[start]
            end = start + 1
            while (end < len(pending) and pending[end][0] is session and pending[end][1] == pending[end - 1][1] + 1
                   and pending[end][2] == state):
                end += 1
            last = pending[end - 1][1]
            if not session.ended:
                self.write(F.disposition_frame(session.channel, role=True, first=first,
                                               last=last if last != first else None, settled=True, state=state))
            start = end

    def _store(self, link: _InboundLink, message: bytes, message_format: int) -> None:
        hub = link.hub
        assert hub is not None
        if message_format == _BATCH_FORMAT:
            _header, _entries, _count, rest, batch_key = split_message(message)
            inner: list[Any] = []
            key = batch_key
            for code, _start, value_start, _end in F.split_sections(rest):
                if code != 0x75:
                    continue
                value, _ = decode(rest, value_start)
                if not isinstance(value, bytes):
                    raise AMQPDecodeError("a batch data section is not binary")
                header, entries, count, body, inner_key = split_message(value)
                inner.append((header, entries, count, body))
                if key is None:
                    key = inner_key
            messages = inner
        else:
            header, entries, count, body, key = split_message(message)
            messages = [(header, entries, count, body)]
        if not messages:
            return
        if link.partition is not None:
            if key is not None:
                raise BrokerError("com.microsoft:argument-error",
                                  "A partition key cannot be used with a send to a specific partition.")
            partition = link.partition
        else:
            partition = hub.route(key)
        partition.append(messages, key.encode("utf-8") if key is not None else None)

    def _request(self, message: bytes) -> tuple[list[Any], dict[Any, Any], Any]:
        properties: list[Any] = []
        application: dict[Any, Any] = {}
        body: Any = None
        for code, _start, value_start, _end in F.split_sections(message):
            if code in (0x73, 0x74, 0x77):
                value, _ = decode(message, value_start)
                if code == 0x73 and isinstance(value, list):
                    properties = value
                elif code == 0x74 and isinstance(value, dict):
                    application = value
                elif code == 0x77:
                    body = value
        return properties, application, body

    def _reply_link(self, request_link: _InboundLink) -> _OutboundLink | None:
        for link in request_link.session.links.values():
            if isinstance(link, _OutboundLink) and link.kind == request_link.kind and not link.closed:
                return link
        return None

    def _respond(self, request_link: _InboundLink, properties: list[Any], status: int, description: str,
                 value: Any) -> None:
        reply_link = self._reply_link(request_link)
        if reply_link is None:
            logger.info("a %s request arrived with no reply link on its session", request_link.kind)
            return
        message_id = properties[0] if properties else None
        reply_link.reply(_message(
            [None, None, None, None, None, message_id],
            {"status-code": status, "status-description": description, "statusCode": status,
             "statusDescription": description},
            value))

    def _on_put_token(self, link: _InboundLink, message: bytes) -> None:
        properties, application, body = self._request(message)
        operation = application.get("operation")
        audience = application.get("name")
        if operation != "put-token":
            self._respond(link, properties, 400, f"unsupported $cbs operation {operation!r}", None)
            return
        token = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
        problem = self.server.check_token(token, audience, application.get("type"))
        if problem is not None:
            logger.info("put-token for %s refused: %s", audience, problem)
            self._respond(link, properties, 401, f"InvalidSignature: {problem}", None)
            return
        if isinstance(audience, str):
            self.authorized_audiences.append(audience)
        self._respond(link, properties, 202, "Accepted", None)

    def _on_management(self, link: _InboundLink, message: bytes) -> None:
        properties, application, _body = self._request(message)
        operation = application.get("operation")
        kind = application.get("type")
        name = application.get("name")
        if operation != "READ":
            self._respond(link, properties, 400, f"unsupported $management operation {operation!r}", None)
            return
        try:
            if not isinstance(name, str):
                raise BrokerError("amqp:invalid-field", "a READ request needs the application property 'name'")
            hub = self.namespace.hub(name)
            self._check_authorized(hub)
            if kind == "com.microsoft:eventhub":
                value: dict[Any, Any] = {
                    "name": hub.name, "type": kind, "created_at": Timestamp(hub.created_at),
                    "partition_count": hub.partition_count, "partition_ids": StringArray(hub.partition_ids),
                }
            elif kind == "com.microsoft:partition":
                partition = hub.partition(str(application.get("partition")))
                value = {
                    "name": hub.name, "type": kind, "partition": partition.partition_id,
                    "begin_sequence_number": partition.begin_sequence_number,
                    "last_enqueued_sequence_number": partition.last_sequence_number,
                    "last_enqueued_offset": str(partition.last_offset),
                    "last_enqueued_time_utc": Timestamp(partition.last_enqueued_time),
                    "is_partition_empty": partition.is_empty,
                }
            else:
                raise BrokerError("amqp:invalid-field", f"unsupported READ type {kind!r}")
        except BrokerError as refused:
            status = {"amqp:not-found": 404, "amqp:unauthorized-access": 401}.get(refused.condition, 400)
            if refused.condition == "com.microsoft:argument-out-of-range":
                status = 404
            self._respond(link, properties, status, refused.description, None)
            return
        self._respond(link, properties, 200, "OK", value)


class AMQPServer:
    """Accepts AMQP connections on ``host:port`` and serves ``namespace``."""

    def __init__(self, namespace: Namespace, *, host: str = "127.0.0.1", port: int = 0,
                 sas_key_name: str | None = None, sas_key: str | None = None) -> None:
        self.namespace = namespace
        self.host = host
        self.port = port
        self.sas_key_name = sas_key_name
        self.sas_key = sas_key
        self.container_id = f"eventprocessor-emulator-{uuid.uuid4().hex[:8]}"
        self.connections: set[_Connection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None

    def __repr__(self) -> str:
        return f"AMQPServer(host={self.host!r}, port={self.port})"

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._server = await self.loop.create_server(lambda: _Connection(self), self.host, self.port,
                                                     reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self.connections):
            connection.close_with("amqp:connection:forced", "the emulator is shutting down")
        await self._server.wait_closed()
        self._server = None

    def check_token(self, token: Any, audience: Any, token_type: Any) -> str | None:
        """None if the token is acceptable, else why not (never the token itself)."""
        if self.sas_key is None:
            return None
        if not isinstance(token, str) or not token.startswith("SharedAccessSignature "):
            return "only SharedAccessSignature tokens can be checked by this emulator"
        fields = {key: values[0] for key, values in parse_qs(token[len("SharedAccessSignature "):]).items()}
        try:
            resource, signature, expiry = fields["sr"], fields["sig"], int(fields["se"])
        except (KeyError, ValueError):
            return "the token lacks sr, sig or se"
        if self.sas_key_name and fields.get("skn") != self.sas_key_name:
            return "the token names another shared access key"
        if expiry < time.time():
            return "the token has expired"
        expected = base64.b64encode(hmac.new(self.sas_key.encode("utf-8"),
                                             f"{quote_plus(resource)}\n{expiry}".encode(),
                                             hashlib.sha256).digest()).decode()
        if not hmac.compare_digest(expected, signature):
            return "the signature does not match the key"
        return None

