"""The emulator's listening socket: AMQP 1.0 and AMQP over WebSockets on one port.

A connection's first bytes say what it is: an HTTP ``GET`` is a WebSocket client
(:mod:`.websocket`), anything else speaks AMQP (:mod:`.connection`: headers, SASL,
sessions, links; :mod:`.attach`, :mod:`.links` and :mod:`.management` for what runs on
them; :mod:`.broker` for the hubs).

Tokens: by default any ``put-token`` is accepted, like Microsoft's Docker emulator. With
``sas_key`` set, a token must be a SharedAccessSignature signed with that key (and
naming ``sas_key_name``) and not expired, or the request gets status 401 (see
:mod:`.management`).
"""
from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

from .broker import Namespace
from .connection import Connection
from .websocket import WebSocketEndpoint

__all__ = ["AMQPServer"]

logger = logging.getLogger(__name__)

_HTTP_GET = b"GET "


class AMQPServer:
    """Accepts AMQP connections (over TCP, or over WebSockets) on ``host:port`` and serves
    ``namespace``."""

    def __init__(self, namespace: Namespace, *, host: str = "127.0.0.1", port: int = 0,
                 sas_key_name: str | None = None, sas_key: str | None = None) -> None:
        self.namespace = namespace
        self.host = host
        self.port = port
        self.sas_key_name = sas_key_name
        self.sas_key = sas_key
        self.container_id = f"eventprocessor-emulator-{uuid.uuid4().hex[:8]}"
        self.connections: set[Connection] = set()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._websockets: WebSocketEndpoint | None = None

    def __repr__(self) -> str:
        return f"AMQPServer(host={self.host!r}, port={self.port})"

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._websockets = WebSocketEndpoint(self)
        self._server = await self.loop.create_server(lambda: _FirstBytes(self), self.host, self.port,
                                                     reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for connection in list(self.connections):
            connection.close_with("amqp:connection:forced", "the emulator is shutting down")
        if self._websockets is not None:
            await self._websockets.shutdown()
        await self._server.wait_closed()
        self._server = None

    def protocol_for(self, first_bytes: bytes) -> asyncio.Protocol:
        """The protocol of a connection that starts with ``first_bytes``."""
        if first_bytes.startswith(_HTTP_GET) and self._websockets is not None:
            return self._websockets.protocol()
        return Connection(self)


class _FirstBytes(asyncio.Protocol):
    """Reads a connection's first bytes, then hands the connection (and those bytes) to
    the protocol they name."""

    def __init__(self, server: AMQPServer) -> None:
        self._server = server
        self._transport: Any = None
        self._buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) < len(_HTTP_GET) and _HTTP_GET.startswith(self._buffer):
            return  # not enough to tell yet
        protocol = self._server.protocol_for(self._buffer)
        self._transport.set_protocol(protocol)
        protocol.connection_made(self._transport)
        protocol.data_received(self._buffer)
