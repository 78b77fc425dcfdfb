"""A minimal AMQP 1.0 client for protocol-level tests of the emulator.

The conformance tests use the official ``azure-eventhub`` client for everything it can
express. A few properties are below what it exposes: exactly how many transfers a
given credit yields, what a refused attach looks like on the wire, and how the server
treats bytes that are not AMQP. This peer speaks just enough AMQP for those.
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import time
from typing import Any
from urllib.parse import quote_plus

from eventprocessor.emulators.eventhubs import frames as F
from eventprocessor.emulators.eventhubs.codec import Described, Symbol, encode

__all__ = ["RawPeer", "key_of"]


def key_of(connection_string: str) -> tuple[str, str]:
    """(key name, key) of an emulator's connection string."""
    fields = dict(part.split("=", 1) for part in connection_string.split(";") if "=" in part)
    return fields["SharedAccessKeyName"], fields["SharedAccessKey"]


class RawPeer:
    """One connection: header, optional SASL, open and one session on channel 0."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.next_handle = 0

    @classmethod
    async def connect(cls, port: int, *, sasl: bool = True, open_session: bool = True,
                      key: tuple[str, str] | None = None) -> RawPeer:
        """Connect; with ``key`` (key name, key) put a SAS token for the whole namespace
        signed with it first, as a client does before it attaches (the session's emulator
        checks tokens)."""
        peer = await cls._connect(port, sasl=sasl, open_session=open_session)
        if key is not None:
            await peer.put_token("sb://127.0.0.1/", *key)
        return peer

    @classmethod
    async def _connect(cls, port: int, *, sasl: bool, open_session: bool) -> RawPeer:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        peer = cls(reader, writer)
        if sasl:
            writer.write(F.SASL_HEADER)
            assert await reader.readexactly(8) == F.SASL_HEADER
            mechanisms = await peer.frame()
            assert mechanisms[1].code == F.SASL_MECHANISMS
            writer.write(F.sasl_frame(F.performative(F.SASL_INIT, [Symbol("ANONYMOUS"), b"", None])))
            outcome = await peer.frame()
            assert outcome[1].code == F.SASL_OUTCOME and outcome[1].fields[0] == 0
        if open_session:
            writer.write(F.AMQP_HEADER)
            assert await reader.readexactly(8) == F.AMQP_HEADER
            writer.write(F.open_frame("raw-peer", hostname="127.0.0.1", max_frame_size=65536, channel_max=8,
                                      idle_timeout_ms=None))
            assert (await peer.frame())[1].code == F.OPEN
            writer.write(F.begin_frame(0, remote_channel=None, next_outgoing_id=0, incoming_window=100000,
                                       outgoing_window=100000, handle_max=64))
            assert (await peer.frame())[1].code == F.BEGIN
        return peer

    async def frame(self, timeout: float = 5.0) -> tuple[int, F.Performative]:
        """The next non-empty frame: (channel, performative)."""
        while True:
            header = await asyncio.wait_for(self.reader.readexactly(8), timeout)
            size, doff, _kind, channel = F.read_frame_header(header)
            body = await asyncio.wait_for(self.reader.readexactly(size - 8), timeout)
            if size > doff * 4:
                return channel, F.decode_performative(body[doff * 4 - 8:])

    async def frames_until_quiet(self, quiet: float = 0.5) -> list[F.Performative]:
        """Every frame until none arrives for ``quiet`` seconds or the server closes."""
        frames = []
        while True:
            try:
                frames.append((await self.frame(timeout=quiet))[1])
            except (asyncio.TimeoutError, asyncio.IncompleteReadError):
                return frames

    async def put_token(self, audience: str, key_name: str, key: str) -> None:
        """Put a SAS token for ``audience`` on ``$cbs`` and wait for its 202."""
        expiry = int(time.time()) + 3600
        signature = base64.b64encode(hmac.new(key.encode(), f"{quote_plus(audience)}\n{expiry}".encode(),
                                              hashlib.sha256).digest()).decode()
        token = (f"SharedAccessSignature sr={quote_plus(audience)}&sig={quote_plus(signature)}&se={expiry}"
                 f"&skn={key_name}")
        sender, receiver = self.next_handle, self.next_handle + 1
        self.next_handle += 2
        for handle, role in ((sender, False), (receiver, True)):
            self.writer.write(F.attach_frame(
                0, name=f"cbs-{handle}", handle=handle, role=role, snd_settle_mode=0, rcv_settle_mode=0,
                source=F.source("$cbs"), target=F.target("$cbs"), initial_delivery_count=0 if not role else None,
                max_message_size=None))
        self.flow(receiver, delivery_count=0, link_credit=1)
        message = (F.section(0x73, [b"put-token-1"]) + b"\x00\x53\x74"
                   + encode({"operation": "put-token", "type": "servicebus.windows.net:sastoken", "name": audience})
                   + b"\x00\x53\x77" + encode(token))
        self.writer.write(F.transfer_frame(0, sender, 0, message))
        while True:
            frame = (await self.frame())[1]
            if frame.name == "transfer":
                assert b"\xa1\x08Accepted" in frame.payload, frame.payload
                return

    def attach_receiver(self, address: str, *, selector: str | None = None,
                        owner_level: int | None = None) -> int:
        handle = self.next_handle
        self.next_handle += 1
        filters = None
        if selector is not None:
            filters = {Symbol("apache.org:selector-filter:string"):
                       Described(Symbol("apache.org:selector-filter:string"), selector)}
        properties: dict[Any, Any] | None = {Symbol("com.microsoft:epoch"): owner_level} \
            if owner_level is not None else None
        self.writer.write(F.attach_frame(
            0, name=f"raw-receiver-{handle}", handle=handle, role=True, snd_settle_mode=2, rcv_settle_mode=0,
            source=F.source(address, filters), target=F.target("raw"), initial_delivery_count=None,
            max_message_size=None, properties=properties))
        return handle

    def flow(self, handle: int, *, delivery_count: int, link_credit: int, next_incoming_id: int = 0) -> None:
        self.writer.write(F.flow_frame(0, next_incoming_id=next_incoming_id, incoming_window=100000,
                                       next_outgoing_id=0, outgoing_window=100000, handle=handle,
                                       delivery_count=delivery_count, link_credit=link_credit))

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass

