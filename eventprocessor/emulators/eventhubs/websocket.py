"""AMQP over WebSockets, as Event Hubs serves it at ``/$servicebus/websocket`` (WebSocket
subprotocol ``AMQPWSB10``): the transport of clients behind HTTP proxies
(``transport_type=TransportType.AmqpOverWebsocket``).

The emulator serves it on its AMQP port: a connection whose first bytes are an HTTP
``GET`` goes to aiohttp's low-level HTTP server (``aiohttp.web.Server``), which does the
WebSocket handshake and framing; the binary messages then feed an AMQP
:class:`~.connection.Connection` exactly as TCP bytes would. Needs ``aiohttp`` (the
async client needs it for WebSockets too); without it such requests are answered
``501`` with the install hint.

A client reaches it with the emulator's connection string plus
``custom_endpoint_address="sb://127.0.0.1:<port>"`` (a WebSocket client goes to port
443 unless told otherwise)::

    EventHubProducerClient.from_connection_string(conn, transport_type=TransportType.AmqpOverWebsocket,
                                                  custom_endpoint_address=f"sb://127.0.0.1:{port}")
"""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from .peer import ServerView

__all__ = ["WebSocketEndpoint", "PATH", "SUBPROTOCOL"]

logger = logging.getLogger(__name__)

PATH = "/$servicebus/websocket"
SUBPROTOCOL = "AMQPWSB10"
_HIGH_WATER = 4 * 1024 * 1024
_LOW_WATER = 1024 * 1024


class WebSocketEndpoint:
    """The WebSocket endpoint of one emulator: :meth:`protocol` makes the protocol for a
    connection that starts with an HTTP request."""

    def __init__(self, server: ServerView) -> None:
        self._server = server
        try:
            from aiohttp import web
        except ImportError:
            self._http: Any = None
        else:
            self._http = web.Server(self._handle)

    def protocol(self) -> asyncio.Protocol:
        if self._http is None:
            return _NoWebSockets()
        return self._http()

    async def shutdown(self) -> None:
        if self._http is not None:
            await self._http.shutdown(timeout=5)

    async def _handle(self, request: Any) -> Any:
        from aiohttp import WSMsgType, web

        if request.path != PATH:
            return _refusal(web, 404, f"Event Hubs serves AMQP over WebSockets at {PATH}")
        socket = web.WebSocketResponse(protocols=(SUBPROTOCOL,))
        if not socket.can_prepare(request).ok:
            return _refusal(web, 400, f"expected a WebSocket upgrade with subprotocol {SUBPROTOCOL}")
        await socket.prepare(request)
        from .connection import Connection

        transport = _WebSocketTransport(socket, request.transport)
        connection = Connection(self._server)
        transport.protocol = connection
        connection.connection_made(transport)
        try:
            async for message in socket:
                if message.type == WSMsgType.BINARY:
                    connection.data_received(message.data)
                elif message.type == WSMsgType.TEXT:
                    connection.close_with("amqp:decode-error", "AMQP over WebSockets is sent in binary messages")
                if connection.closed:
                    break
        finally:
            await transport.finish()
            connection.connection_lost(None)
        return socket


def _refusal(web: Any, status: int, text: str) -> Any:
    """An HTTP error answer, after which the connection is closed."""
    response = web.Response(status=status, text=text + "\n")
    response.force_close()
    return response


class _WebSocketTransport(asyncio.Transport):
    """What an AMQP connection writes to, over a WebSocket: each write is queued and sent
    as a binary message, in order, by one task; writing pauses the connection above 4 MB
    queued and resumes it below 1 MB, as a TCP transport's buffer limits do."""

    def __init__(self, socket: Any, http_transport: Any) -> None:
        super().__init__()
        self._socket = socket
        self._peer = http_transport.get_extra_info("peername") if http_transport is not None else None
        self._queue: deque[bytes] = deque()
        self._queued = 0
        self._paused = False
        self._closing = False
        self._writer: asyncio.Task[None] | None = None
        self.protocol: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        return None  # fixed limits: see the class docstring

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._closing or not data:
            return
        self._queue.append(bytes(data))
        self._queued += len(data)
        if self._queued > _HIGH_WATER and not self._paused and self.protocol is not None:
            self._paused = True
            self.protocol.pause_writing()
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._send())

    def close(self) -> None:
        """Send what is queued, then close the WebSocket."""
        if self._closing:
            return
        self._closing = True
        if self._writer is None:
            self._writer = asyncio.get_running_loop().create_task(self._send())

    def abort(self) -> None:
        self._closing = True
        self._queue.clear()
        if self._writer is not None:
            self._writer.cancel()
        asyncio.get_running_loop().create_task(self._socket.close())

    async def finish(self) -> None:
        """Send what is queued and close (the connection ended)."""
        self.close()
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)

    async def _send(self) -> None:
        try:
            while self._queue:
                chunk = b"".join(self._queue)
                self._queue.clear()
                self._queued = 0
                await self._socket.send_bytes(chunk)
                if self._paused and self._queued < _LOW_WATER and self.protocol is not None:
                    self._paused = False
                    self.protocol.resume_writing()
        except (ConnectionError, RuntimeError) as error:
            logger.debug("a WebSocket connection failed while sending: %r", error)
            self._closing = True
            self._queue.clear()
        finally:
            self._writer = None
            if self._closing:
                await self._socket.close()


class _NoWebSockets(asyncio.Protocol):
    """Answers a WebSocket request when aiohttp is not installed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        text = b"AMQP over WebSockets needs aiohttp in the emulator's environment: pip install aiohttp\n"
        logger.warning("a WebSocket connection was refused: the emulator needs aiohttp for WebSockets "
                       "(pip install aiohttp)")
        self._transport.write(b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain\r\nConnection: close\r\n"  # type: ignore[attr-defined]
                              + f"Content-Length: {len(text)}\r\n\r\n".encode() + text)
        self._transport.close()
