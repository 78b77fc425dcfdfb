"""Loopback TCP fault proxies, for fault tests: :class:`FaultProxy` for HTTP/1.1 services
(Azurite), :class:`TcpFaultProxy` for any TCP protocol (AMQP: the Event Hubs emulator).

It listens on 127.0.0.1 (a free port), forwards every connection to one upstream
``host:port``, and injects the fault of its current mode into the *next request* on any
connection (new or kept alive):

* ``pass_through()``: forward as is (the initial mode);
* ``add_latency(seconds)``: wait ``seconds`` before forwarding each request;
* ``black_hole()``: accept and read, never forward, never answer (a hung service or a
  lost network path: the client waits for its own read timeout);
* ``reset()``: answer each request by resetting the connection (TCP RST);
* ``drop_response(nth=1, method=None)``: forward the ``nth`` request (counting only
  ``method``, e.g. ``"PUT"``, when given), let the service process it, then close the
  client's connection instead of passing the response on: the write happened, its
  response was lost. Later requests pass through. This is what makes a client's
  transport retry a write that already landed.

It reads requests (head and body, ``Content-Length`` or chunked) to know where one
ends, and relays responses as raw bytes; clients that do not pipeline (aiohttp,
requests, the Azure SDKs) are handled exactly. ``requests`` records ``(method, target)``
of every request seen, ``dropped`` those whose response was dropped.

Asyncio use (the proxy runs on the test's event loop)::

    async with FaultProxy("127.0.0.1", azurite.blob_port) as proxy:
        store = BlobCheckpointStore(f"http://127.0.0.1:{proxy.port}/devstoreaccount1", ...)
        proxy.black_hole()

From synchronous code or for other processes, :class:`ThreadedFaultProxy` runs one on
its own thread::

    with ThreadedFaultProxy("127.0.0.1", azurite.blob_port) as proxy:
        run_workers(blob_endpoint=f"http://127.0.0.1:{proxy.port}/devstoreaccount1")
        proxy.reset()

:class:`TcpFaultProxy` relays bytes without reading them, so it sits in front of any
protocol; its faults act on connections, not requests: ``reset_all()`` (every open
connection reset now, as a restarted middlebox or a flapping network does), ``refuse()``
(new connections reset at once), ``black_hole()`` (connections accepted, nothing relayed
either way, nothing answered; connections caught in it stay dead after it ends, as a TCP
path whose packets were lost does). Its upstream can be moved (``upstream =``) while it
runs, for an emulator restarted elsewhere::

    async with TcpFaultProxy("127.0.0.1", emulator.port) as proxy:
        source = EventHubSource.from_connection_string(connection_string("127.0.0.1", proxy.port), ...)
        proxy.reset_all()
"""
from __future__ import annotations

import asyncio
import logging
import socket
import struct
import threading
from types import TracebackType
from typing import TypeVar

__all__ = ["FaultProxy", "ThreadedFaultProxy", "TcpFaultProxy"]

logger = logging.getLogger(__name__)

_HEAD_LIMIT = 1 << 20
_R = TypeVar("_R", bound="_Relay")


class _Request:
    def __init__(self, raw: bytes, method: str, target: str) -> None:
        self.raw, self.method, self.target = raw, method, target


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """One whole request (head and body) from the client; ``None`` at end of stream."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, ConnectionError):
        return None
    lines = head.decode("latin-1").split("\r\n")
    method, target = (lines[0].split(" ") + ["", ""])[:2]
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            chunk = await reader.readexactly(size + 2)
            body += size_line + chunk
            if size == 0:
                break
    elif headers.get("content-length"):
        body = await reader.readexactly(int(headers["content-length"]))
    return _Request(head + body, method, target)


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST rather than FIN: SO_LINGER with a zero timeout."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    writer.transport.abort()


class _Relay:
    """What both proxies share: the listening server on 127.0.0.1, the tasks handling its
    connections, ``async with``, and a stop that drops every connection and waits for them."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.AbstractServer | None = None
        self._handlers: set[asyncio.Task] = set()

    async def start(self: _R) -> _R:
        raise NotImplementedError

    def _drop_connections(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        self._drop_connections()  # every handler then sees its connection end and returns
        if self._handlers:
            _done, stuck = await asyncio.wait(list(self._handlers), timeout=5)
            for task in stuck:
                task.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _handling(self) -> asyncio.Task:
        """Count the running task among the connection handlers (it discards itself)."""
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        return task

    async def __aenter__(self: _R) -> _R:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


class FaultProxy(_Relay):
    """The proxy (see the module docstring). Bind address is always 127.0.0.1."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self.requests: list[tuple[str, str]] = []
        self.dropped: list[tuple[str, str]] = []
        self._writers: set[asyncio.StreamWriter] = set()
        self.pass_through()

    # ------------------------------------------------------------------ modes

    def pass_through(self) -> None:
        """Forward everything unchanged."""
        self._drop_method: str | None = None
        self._mode, self._latency, self._drop_at, self._counted = "pass", 0.0, 0, 0

    def add_latency(self, seconds: float) -> None:
        """Wait ``seconds`` before forwarding each request."""
        self.pass_through()
        self._latency = float(seconds)

    def black_hole(self) -> None:
        """Accept and read requests, never answer them."""
        self.pass_through()
        self._mode = "black_hole"

    def reset(self) -> None:
        """Reset the connection on each request."""
        self.pass_through()
        self._mode = "reset"

    def drop_response(self, nth: int = 1, *, method: str | None = None) -> None:
        """Forward the ``nth`` request from now (of ``method`` only, when given), then
        close the client's connection instead of relaying its response."""
        if nth < 1:
            raise ValueError("nth counts from 1")
        self.pass_through()
        self._mode, self._drop_at, self._drop_method = "drop", nth, method.upper() if method else None

    def _drops(self, request: _Request) -> bool:
        if self._mode != "drop" or (self._drop_method and request.method != self._drop_method):
            return False
        self._counted += 1
        if self._counted != self._drop_at:
            return False
        self.pass_through()  # only that one response is lost
        return True

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> FaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0, limit=_HEAD_LIMIT)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _drop_connections(self) -> None:
        self.close_connections()

    def close_connections(self) -> None:
        """Drop every open connection (both sides), as a restarted middlebox would."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    # ------------------------------------------------------------------ serving

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = self._handling()
        self._writers.add(client_writer)
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        relay: asyncio.Task | None = None
        try:
            while True:
                request = await _read_request(client_reader)
                if request is None:
                    return
                self.requests.append((request.method, request.target))
                if self._mode == "black_hole":
                    while await client_reader.read(65536):
                        pass
                    return
                if self._mode == "reset":
                    _reset(client_writer)
                    return
                if self._latency:
                    await asyncio.sleep(self._latency)
                if upstream is None:
                    upstream = await asyncio.open_connection(*self.upstream, limit=_HEAD_LIMIT)
                    self._writers.add(upstream[1])
                if self._drops(request):
                    if relay is not None:
                        relay.cancel()
                        await asyncio.wait([relay])
                        relay = None
                    upstream[1].write(request.raw)
                    await upstream[1].drain()
                    await upstream[0].read(1)  # the service has answered: the request was processed
                    self.dropped.append((request.method, request.target))
                    logger.debug("fault proxy: dropped the response of %s %s", request.method, request.target)
                    return
                if relay is None:
                    relay = asyncio.ensure_future(self._relay(upstream[0], client_writer))
                upstream[1].write(request.raw)
                await upstream[1].drain()
        except (ConnectionError, asyncio.IncompleteReadError, OSError):
            return
        finally:
            if relay is not None:
                relay.cancel()
            for writer in (client_writer, upstream[1] if upstream else None):
                if writer is not None:
                    self._writers.discard(writer)
                    writer.transport.abort()
            self._handlers.discard(task)

    @staticmethod
    async def _relay(upstream: asyncio.StreamReader, client: asyncio.StreamWriter) -> None:
        # Cancelled (a response about to be dropped) it leaves the client connected, so
        # that the client learns of the loss only once the service has answered.
        try:
            while data := await upstream.read(65536):
                client.write(data)
                await client.drain()
        except (ConnectionError, OSError):
            pass
        client.transport.abort()


class ThreadedFaultProxy:
    """A :class:`FaultProxy` on its own thread and event loop, for synchronous tests and
    for services used by other processes. Mode methods are forwarded to the loop."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.proxy = FaultProxy(upstream_host, upstream_port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)

    @property
    def port(self) -> int:
        return self.proxy.port

    @property
    def requests(self) -> list[tuple[str, str]]:
        return list(self.proxy.requests)

    @property
    def dropped(self) -> list[tuple[str, str]]:
        return list(self.proxy.dropped)

    def __enter__(self) -> ThreadedFaultProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()

    def _call(self, name: str, *args: object, **kwargs: object) -> None:
        async def call() -> None:
            getattr(self.proxy, name)(*args, **kwargs)

        asyncio.run_coroutine_threadsafe(call(), self._loop).result(timeout=10)

    def pass_through(self) -> None:
        self._call("pass_through")

    def add_latency(self, seconds: float) -> None:
        self._call("add_latency", seconds)

    def black_hole(self) -> None:
        self._call("black_hole")

    def reset(self) -> None:
        self._call("reset")

    def drop_response(self, nth: int = 1, *, method: str | None = None) -> None:
        self._call("drop_response", nth, method=method)

    def close_connections(self) -> None:
        self._call("close_connections")


class _Pipe:
    """One client connection and its upstream connection."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.swallowed = False  # caught by a black hole: never relays again

    def reset(self) -> None:
        _reset(self.client)
        if self.upstream is not None:
            self.upstream.transport.abort()


class TcpFaultProxy(_Relay):
    """A byte relay with connection faults, for protocols other than HTTP (see the module
    docstring). Binds 127.0.0.1 only. ``accepted`` counts client connections,
    ``resets`` connections it reset, ``swallowed`` connections a black hole caught."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self.accepted = 0
        self.resets = 0
        self.swallowed = 0
        self._mode = "pass"
        self._pipes: set[_Pipe] = set()

    @property
    def connections(self) -> int:
        """Client connections open now."""
        return len(self._pipes)

    def pass_through(self) -> None:
        """Relay new connections (connections a black hole caught stay dead)."""
        self._mode = "pass"

    def refuse(self) -> None:
        """Reset every new connection as soon as it is accepted."""
        self._mode = "refuse"

    def black_hole(self) -> None:
        """From now on relay nothing, answer nothing, on open and new connections alike."""
        self._mode = "black_hole"
        for pipe in self._pipes:
            if not pipe.swallowed:
                pipe.swallowed = True
                self.swallowed += 1

    def reset_all(self) -> int:
        """Reset every open connection now (both sides); returns how many."""
        pipes = list(self._pipes)
        for pipe in pipes:
            pipe.reset()
        self.resets += len(pipes)
        return len(pipes)

    async def start(self) -> TcpFaultProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def _drop_connections(self) -> None:
        for pipe in list(self._pipes):
            pipe.reset()

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = self._handling()
        self.accepted += 1
        pipe = _Pipe(client_writer)
        self._pipes.add(pipe)
        relays: list[asyncio.Task] = []
        try:
            if self._mode == "refuse":
                self.resets += 1
                pipe.reset()
                return
            if self._mode == "black_hole":
                pipe.swallowed = True
                self.swallowed += 1
            else:
                try:
                    upstream_reader, pipe.upstream = await asyncio.open_connection(*self.upstream)
                except OSError:
                    pipe.reset()  # the service is down: the client sees its connection reset
                    return
                relays.append(asyncio.ensure_future(self._relay(upstream_reader, client_writer, pipe)))
            relays.append(asyncio.ensure_future(self._relay(client_reader, pipe.upstream, pipe)))
            await asyncio.wait(relays, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for relay in relays:
                relay.cancel()
            self._pipes.discard(pipe)
            pipe.reset()
            self._handlers.discard(task)

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter | None, pipe: _Pipe) -> None:
        try:
            while data := await reader.read(65536):
                if pipe.swallowed or writer is None:
                    continue  # into the black hole
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
