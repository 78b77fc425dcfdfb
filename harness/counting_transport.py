"""An HTTP transport for the Azure clients that counts the requests it sends, by method.

Passed as ``transport=`` to a store or a storage client, it counts every attempt (retries
included) the same way for every store, without touching their code: the store benchmark
bills each operation with it, and the worker program reports its processor's requests.

Example::

    transport = CountingTransport()
    store = BlobCheckpointStore.from_connection_string(conn, "checkpoints", transport=transport)
    ...
    print(transport.total, transport.requests["PUT"])
"""
from __future__ import annotations

from collections import Counter
from typing import Any

try:
    from azure.core.pipeline.transport import AioHttpTransport
except ImportError:  # no [blob] extra: --help and the in-memory runs still work without it
    AioHttpTransport = object  # type: ignore[misc,assignment]

__all__ = ["CountingTransport"]


class CountingTransport(AioHttpTransport):
    """An aiohttp transport that counts the HTTP requests it sends, by method."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.requests: Counter[str] = Counter()

    async def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        self.requests[request.method] += 1
        return await super().send(request, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.requests.values())
