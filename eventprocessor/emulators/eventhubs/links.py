"""Sessions and links of one AMQP connection: what the client sends on (producers, the
request halves of ``$cbs`` and ``$management``) and what it receives on (partition
receivers, and the reply halves).

A partition receiver is the broker's :class:`~.broker.ReceiverHandle`: the partition
wakes it when events arrive, and disconnects it when a higher owner level takes over.
It sends pre-settled transfers as its link credit and the session window allow, many
per socket write.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from . import frames as F
from .broker import EventHub, Partition
from .codec import Described, Symbol, Timestamp, encode

if TYPE_CHECKING:  # pragma: no cover
    from .peer import ConnectionView

__all__ = ["Link", "InboundLink", "OutboundLink", "Session"]

logger = logging.getLogger(__name__)

_SESSION_WINDOW = 5000


def _now_ms() -> int:
    return int(time.time() * 1000)


def _runtime_entries(partition: Partition) -> bytes:
    """The service's runtime metrics of ``partition`` (its newest event, and now), as
    delivery-annotation entries: 4 keys and their values."""
    values = {"last_enqueued_sequence_number": partition.last_sequence_number,
              "last_enqueued_offset": str(partition.last_offset),
              "last_enqueued_time_utc": Timestamp(partition.last_enqueued_time),
              "runtime_info_retrieval_time_utc": Timestamp(_now_ms())}
    return b"".join(encode(Symbol(key)) + encode(value) for key, value in values.items())


class Link:
    """State common to both link directions."""

    def __init__(self, session: Session, name: str, remote_handle: int, handle: int, address: str | None) -> None:
        self.session = session
        self.name = name
        self.remote_handle = remote_handle
        self.handle = handle
        self.address = address
        self.closed = False

    def detached(self) -> None:
        self.closed = True


class InboundLink(Link):
    """The client sends on it (a producer, or the request half of ``$cbs``/``$management``)."""

    def __init__(self, session: Session, name: str, remote_handle: int, handle: int, address: str | None,
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


class OutboundLink(Link):
    """The client receives on it: events of a partition, or the replies of ``$cbs``/``$management``."""

    def __init__(self, session: Session, name: str, remote_handle: int, handle: int, address: str | None,
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
            runtime = _runtime_entries(partition)
            for sequence in range(self.cursor, self.cursor + count):
                payload = partition.with_delivery_annotations(sequence, runtime, 8)
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


class Session:
    def __init__(self, connection: ConnectionView, channel: int, remote_channel: int, next_incoming_id: int,
                 remote_incoming_window: int) -> None:
        self.connection = connection
        self.channel = channel
        self.remote_channel = remote_channel
        self.next_incoming_id = next_incoming_id
        self.incoming_window = _SESSION_WINDOW
        self.received_since_flow = 0
        self.next_outgoing_id = 0
        self.remote_incoming_window = remote_incoming_window
        self.links: dict[int, Link] = {}  # by the client's handle
        self.next_handle = 0
        self.ended = False

    # -- frames out
    def send_link_flow(self, link: Link, *, echo: bool = False) -> None:
        credit = link.credit if isinstance(link, (InboundLink, OutboundLink)) else 0
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

    def detach_link(self, link: Link, err: Described | None) -> None:
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
