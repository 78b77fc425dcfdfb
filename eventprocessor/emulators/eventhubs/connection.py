"""One AMQP 1.0 connection of the emulator: frames in, frames out.

An ``asyncio.Protocol`` that parses frames straight from ``data_received`` (no task per
connection, no copy per frame beyond the slice of the frame itself), over a TCP
transport or over a WebSocket (:mod:`.websocket`). Everything runs on one event loop;
the broker is plain data.

What a connection goes through, as ``azure-eventhub`` drives it:

1. Protocol header. ``AMQP 3 1 0 0`` starts SASL: the server offers ANONYMOUS (and
   PLAIN, EXTERNAL, MSSBCBS), accepts any ``sasl-init`` with outcome ok, then expects
   ``AMQP 0 1 0 0``. A plain AMQP header skips SASL. TLS is not offered: a TLS header
   or handshake is answered with the supported header and the connection is closed,
   which is what a client without ``UseDevelopmentEmulator=true`` sees.
2. ``open`` / ``begin`` / ``attach`` (:mod:`.attach`).
3. Transfers. Sent messages (format 0, or the batch format whose ``data`` sections are
   whole messages) are stored (:meth:`.broker.EventHub.ingest`) and settled with
   ``accepted``; requests on ``$cbs`` and ``$management`` are answered
   (:mod:`.management`); receivers get pre-settled transfers as their link credit
   allows (:mod:`.links`).

A frame the server cannot parse closes that connection with ``amqp:decode-error`` (or
``amqp:connection:framing-error``); other connections are not affected.
"""
from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Any

from . import frames as F
from .attach import SENDER_CREDIT, attach
from .codec import AMQPDecodeError, Described, Symbol
from .errors import BrokerError
from .links import InboundLink, OutboundLink, Session
from .management import answer

if TYPE_CHECKING:  # pragma: no cover
    from .peer import ServerView

__all__ = ["Connection", "MAX_FRAME_SIZE"]

logger = logging.getLogger(__name__)

MAX_FRAME_SIZE = 256 * 1024
_CHANNEL_MAX = 255
_SESSION_WINDOW = 5000


class Connection(asyncio.Protocol):
    """One client connection."""

    def __init__(self, server: ServerView) -> None:
        self.server = server
        self.namespace = server.namespace
        self.loop = asyncio.get_running_loop() if server.loop is None else server.loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.state = "header"  # header -> sasl -> header -> open -> opened -> closed
        self.sasl_done = False
        self.sessions: dict[int, Session] = {}  # by the client's channel
        self.remote_max_frame_size = 512
        self.closed = False
        self.paused = False
        self.peer = "?"
        self.authorized_audiences: list[str] = []
        self.idle_timer: asyncio.TimerHandle | None = None
        self._dispositions: list[tuple[Session, int, Any]] = []

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
                if isinstance(link, OutboundLink) and link.partition is not None:
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
                self.write(F.open_frame(self.server.container_id, hostname=None, max_frame_size=MAX_FRAME_SIZE,
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
            if size > MAX_FRAME_SIZE:
                self.close_with("amqp:connection:framing-error",
                                f"frame of {size} bytes exceeds the max-frame-size {MAX_FRAME_SIZE}")
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
            session = self._session(channel)
            if session is not None:
                attach(self, session, frame)
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
        self.remote_max_frame_size = max(512, min(int(max_frame) if max_frame is not None else MAX_FRAME_SIZE,
                                                  16 * 1024 * 1024))
        self.write(F.open_frame(self.server.container_id, hostname=None, max_frame_size=MAX_FRAME_SIZE,
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
        session = Session(self, channel, channel, next_incoming_id=fields[1] or 0,
                           remote_incoming_window=int(incoming_window))
        self.sessions[channel] = session
        self.write(F.begin_frame(channel, remote_channel=channel, next_outgoing_id=0,
                                 incoming_window=_SESSION_WINDOW, outgoing_window=0xFFFFFFFF, handle_max=0xFFFF))

    def _session(self, channel: int) -> Session | None:
        # The client sends detach for its $management links after end on that channel:
        # frames for a channel that is gone are ignored, not treated as errors.
        return self.sessions.get(channel)

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
                if isinstance(any_link, OutboundLink):
                    any_link.wake() if any_link.partition is not None else any_link._flush_queue()
            return
        link = session.links.get(handle)
        if isinstance(link, OutboundLink):
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
        elif isinstance(link, InboundLink) and fields[9]:
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
        if not isinstance(link, InboundLink):
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
        if link.credit <= SENDER_CREDIT // 2:
            link.credit = SENDER_CREDIT
            session.send_link_flow(link)
        elif session.received_since_flow >= _SESSION_WINDOW // 2:
            session.send_session_flow()
        state = self._deliver(link, message, message_format)
        if not settled:
            self._dispositions.append((session, delivery_id, state))

    def _deliver(self, link: InboundLink, message: bytes, message_format: int) -> Described:
        try:
            if len(message) > self.namespace.max_message_size:
                raise BrokerError("amqp:link:message-size-exceeded",
                                  f"The received message ({len(message)} bytes) exceeds the limit "
                                  f"({self.namespace.max_message_size} bytes).")
            if link.kind == "hub":
                assert link.hub is not None
                link.hub.ingest(message, message_format, link.partition)
            else:
                answer(self, link, message)
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
