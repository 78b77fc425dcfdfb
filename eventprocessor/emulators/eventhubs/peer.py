"""What the parts of a connection see of it and of the server, as protocols: the modules
that serve links (:mod:`.attach`, :mod:`.links`, :mod:`.management`) and WebSocket
connections (:mod:`.websocket`) depend on these, not on :mod:`.connection` or
:mod:`.server`, so those can import them without a cycle."""
from __future__ import annotations

import asyncio
from typing import Any, Protocol

from .broker import Namespace

__all__ = ["ConnectionView", "ServerView"]


class ServerView(Protocol):
    """The listening server, as a connection sees it."""

    namespace: Namespace
    sas_key_name: str | None
    sas_key: str | None
    container_id: str
    connections: set[Any]
    loop: asyncio.AbstractEventLoop | None


class ConnectionView(Protocol):
    """One client connection, as its sessions and links see it."""

    server: ServerView
    namespace: Namespace
    loop: asyncio.AbstractEventLoop
    closed: bool
    paused: bool
    remote_max_frame_size: int
    authorized_audiences: list[str]

    def write(self, data: bytes) -> None: ...
