"""The loopback fault proxy itself, against a small local HTTP service (no Azurite)."""
from __future__ import annotations

import asyncio
import http.client
import http.server
import threading
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest
from aiohttp import web

from eventprocessor.emulators.fault_proxy import FaultProxy, ThreadedFaultProxy


class Service:
    """An HTTP service on loopback that records the requests it processed."""

    def __init__(self) -> None:
        self.processed: list[str] = []
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.processed.append(f"{request.method} {request.path} {body.decode()}")
        return web.Response(text=f"done {request.method} {request.path}")


@pytest.fixture
async def service() -> AsyncIterator[Service]:
    svc = Service()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", svc.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    svc.port = runner.addresses[0][1]
    try:
        yield svc
    finally:
        await runner.cleanup()


@pytest.fixture
async def proxy(service: Service) -> AsyncIterator[FaultProxy]:
    async with FaultProxy("127.0.0.1", service.port) as running:
        yield running


def _url(proxy: FaultProxy, path: str) -> str:
    return f"http://127.0.0.1:{proxy.port}{path}"


async def test_pass_through_keeps_connections_alive(service: Service, proxy: FaultProxy) -> None:
    async with aiohttp.ClientSession() as session:
        for i in range(3):
            async with session.put(_url(proxy, f"/r{i}"), data=f"body{i}") as response:
                assert await response.text() == f"done PUT /r{i}"
    assert service.processed == ["PUT /r0 body0", "PUT /r1 body1", "PUT /r2 body2"]
    assert proxy.requests == [("PUT", "/r0"), ("PUT", "/r1"), ("PUT", "/r2")]


async def test_latency_delays_each_request(service: Service, proxy: FaultProxy) -> None:
    proxy.add_latency(0.3)
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        async with session.get(_url(proxy, "/slow")) as response:
            assert response.status == 200
        assert time.monotonic() - start >= 0.3
    assert service.processed == ["GET /slow "]


async def test_black_hole_accepts_and_never_answers(service: Service, proxy: FaultProxy) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(_url(proxy, "/before")) as response:
            assert response.status == 200
        proxy.black_hole()  # applies to the kept-alive connection too
        with pytest.raises(asyncio.TimeoutError):
            async with session.get(_url(proxy, "/lost"), timeout=aiohttp.ClientTimeout(total=0.5)):
                pass
    assert service.processed == ["GET /before "]
    assert ("GET", "/lost") in proxy.requests


async def test_reset_fails_the_request_at_once(service: Service, proxy: FaultProxy) -> None:
    proxy.reset()
    async with aiohttp.ClientSession() as session:
        start = time.monotonic()
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.get(_url(proxy, "/reset")):
                pass
        assert time.monotonic() - start < 5
    assert service.processed == []


async def test_drop_response_of_the_nth_post_after_it_was_processed(service: Service, proxy: FaultProxy) -> None:
    proxy.drop_response(2, method="POST")
    async with aiohttp.ClientSession() as session:
        async with session.get(_url(proxy, "/a")) as response:  # not counted: not a POST
            assert response.status == 200
        async with session.post(_url(proxy, "/b"), data="1") as response:
            assert response.status == 200
        with pytest.raises(aiohttp.ClientConnectionError):
            async with session.post(_url(proxy, "/c"), data="2"):
                pass
        async with session.post(_url(proxy, "/d"), data="3") as response:  # later requests pass
            assert response.status == 200
    assert service.processed == ["GET /a ", "POST /b 1", "POST /c 2", "POST /d 3"], "the dropped one was processed"
    assert proxy.dropped == [("POST", "/c")]


async def test_a_dropped_put_is_retried_by_the_client_and_lands_twice(service: Service, proxy: FaultProxy) -> None:
    """What the stores' ambiguous-write handling is for: the client never sees the first
    response, re-sends the idempotent PUT, and the service processes it a second time."""
    proxy.drop_response(1, method="PUT")
    async with aiohttp.ClientSession() as session:
        async with session.put(_url(proxy, "/w"), data="x") as response:
            assert response.status == 200
    assert service.processed == ["PUT /w x", "PUT /w x"]
    assert proxy.dropped == [("PUT", "/w")]


class _SyncHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b"sync ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # silence
        pass


@pytest.fixture
def sync_service() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SyncHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_threaded_proxy_serves_synchronous_clients(sync_service: int) -> None:
    with ThreadedFaultProxy("127.0.0.1", sync_service) as proxy:
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
        connection.request("GET", "/x")
        assert connection.getresponse().read() == b"sync ok"
        connection.close()
        proxy.black_hole()
        connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=0.5)
        with pytest.raises(TimeoutError):
            connection.request("GET", "/y")
            connection.getresponse()
        connection.close()
        assert proxy.requests == [("GET", "/x"), ("GET", "/y")]
