"""The emulated namespace: event hubs, their partitions (in-memory logs) and consumer groups.

Pure bookkeeping, no I/O: the server feeds it encoded messages and asks it for
positions; receivers register here so that the owner-level (epoch) rules are applied
in one place.

Storage. Each partition keeps its events in memory, oldest first, as ready-to-send
message bytes (the producer's sections with the service annotations added: see
:mod:`.messages`). A partition keeps at most ``max_events_per_partition`` events and
none older than ``retention_seconds``; older ones are dropped, as retention drops them
on the service. Sequence numbers start at 0 and never repeat; offsets are the byte
position of the event in the partition (the service's offsets are byte positions too),
as strings.
"""
from __future__ import annotations

import bisect
import struct
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import BrokerError
from .keys import partition_for_key
from .messages import (
    BATCH_FORMAT,
    DELIVERY_ANNOTATIONS,
    MESSAGE_ANNOTATIONS,
    SplitMessage,
    map_section,
    split_batch,
    split_message,
)
from .positions import StartPosition

__all__ = ["Namespace", "EventHub", "Partition", "BrokerError", "ReceiverHandle"]

# The service annotations, as encoded symbol keys.
_SEQ_KEY = b"\xa3\x15x-opt-sequence-number"
_OFFSET_KEY = b"\xa3\x0cx-opt-offset"
_TIME_KEY = b"\xa3\x13x-opt-enqueued-time"
_PKEY_KEY = b"\xa3\x13x-opt-partition-key"
_ANNOTATIONS = struct.Struct(">Bq")
_TIMESTAMP = struct.Struct(">Bq")


class ReceiverHandle(Protocol):
    """What the broker needs from a receiver link: its owner level, a way to wake it
    when events arrive, and a way to disconnect it (epoch stealing)."""

    owner_level: int | None
    name: str

    def wake(self) -> None: ...

    def disconnect(self, condition: str, description: str) -> None: ...


# ----------------------------------------------------------------------------- storage

def _now_ms() -> int:
    return int(time.time() * 1000)


def _key_entry(key: bytes | None) -> bytes:
    """The ``x-opt-partition-key`` annotation entry (key and value, encoded), or nothing."""
    if key is None:
        return b""
    return _PKEY_KEY + (b"\xa1" + bytes((len(key),)) + key if len(key) <= 255
                        else b"\xb1" + len(key).to_bytes(4, "big") + key)


class Partition:
    """One partition: an append-only log with a bounded, moving start."""

    def __init__(self, hub: EventHub, partition_id: str) -> None:
        self.hub = hub
        self.partition_id = partition_id
        # Parallel lists from ``_head`` on: payloads, offsets, enqueued times (ms),
        # and where each payload's header section ends (delivery annotations go after it).
        self._payloads: list[bytes] = []
        self._header_ends: list[int] = []
        # The producer's delivery annotations, for the few events that have them, by
        # sequence number: (their section's length, its entries, their item count).
        self._delivery: dict[int, tuple[int, bytes, int]] = {}
        self._offsets: list[int] = []
        self._times: list[int] = []
        self._head = 0
        self.begin_sequence_number = 0  # of the oldest retained event
        self.next_sequence_number = 0
        self.next_offset = 0
        self.last_enqueued_time = 0
        self.receivers: dict[str, list[ReceiverHandle]] = {}

    # -- reading
    @property
    def retained(self) -> int:
        return self.next_sequence_number - self.begin_sequence_number

    @property
    def is_empty(self) -> bool:
        return self.retained == 0

    @property
    def last_sequence_number(self) -> int:
        return self.next_sequence_number - 1

    @property
    def last_offset(self) -> int:
        return self._offsets[-1] if self.retained else -1

    def event(self, sequence_number: int) -> tuple[bytes, int, int, int]:
        """(payload, header end, offset, enqueued ms) of a retained event."""
        index = self._head + sequence_number - self.begin_sequence_number
        return self._payloads[index], self._header_ends[index], self._offsets[index], self._times[index]

    def payload_slice(self, first: int, count: int) -> list[bytes]:
        index = self._head + first - self.begin_sequence_number
        return self._payloads[index:index + count]

    def with_delivery_annotations(self, sequence_number: int, entries: bytes, count: int) -> bytes:
        """A retained event with ``entries`` (``count`` items, encoded) in its delivery
        annotations, beside the producer's: what a receiver that asked for runtime
        metrics gets."""
        payload, header_end, _offset, _time = self.event(sequence_number)
        length, own, own_count = self._delivery.get(sequence_number, (0, b"", 0))
        return (payload[:header_end] + map_section(DELIVERY_ANNOTATIONS, entries + own, count + own_count)
                + payload[header_end + length:])

    def resolve(self, position: StartPosition) -> int:
        """The sequence number of the first event a receiver at ``position`` gets.

        Raises :class:`BrokerError` (``com.microsoft:argument-out-of-range``) for a
        sequence number or offset past the end of the partition, as the service does,
        so that a checkpoint from another life of the hub is not silently waited on.
        """
        if position.kind == "latest":
            return self.next_sequence_number
        if position.kind == "start":
            return self.begin_sequence_number
        if position.kind == "sequence_number":
            first = position.value if position.inclusive else position.value + 1
            if first > self.next_sequence_number:
                raise BrokerError(
                    "com.microsoft:argument-out-of-range",
                    f"The supplied sequence number '{position.value}' is invalid. The last sequence number in the "
                    f"system is '{self.last_sequence_number}' (partition {self.partition_id} of "
                    f"{self.hub.name}).")
            return max(first, self.begin_sequence_number)
        if position.kind == "offset":
            if position.value > self.next_offset:  # past where the next event will be
                raise BrokerError(
                    "com.microsoft:argument-out-of-range",
                    f"The supplied offset '{position.value}' is invalid. The last offset in the system is "
                    f"'{self.last_offset}' (partition {self.partition_id} of {self.hub.name}).")
            offsets = self._offsets
            if position.inclusive:
                index = bisect.bisect_left(offsets, position.value, self._head)
            else:
                index = bisect.bisect_right(offsets, position.value, self._head)
            return self.begin_sequence_number + index - self._head
        if position.kind == "enqueued_time":
            times = self._times
            if position.inclusive:
                index = bisect.bisect_left(times, position.value, self._head)
            else:
                index = bisect.bisect_right(times, position.value, self._head)
            return self.begin_sequence_number + index - self._head
        raise BrokerError("amqp:invalid-field", f"unknown position kind {position.kind!r}")

    # -- writing
    def append(self, messages: list[SplitMessage], partition_key: bytes | None) -> None:
        """Store producer messages, stamping the service annotations (see :mod:`.messages`).
        Each keeps its own partition key; ``partition_key`` is for those without one (a
        batch's key)."""
        now = max(_now_ms(), self.last_enqueued_time)
        time_entry = _TIME_KEY + _TIMESTAMP.pack(0x83, now)
        payloads, header_ends, offsets, times = self._payloads, self._header_ends, self._offsets, self._times
        sequence = self.next_sequence_number
        offset = self.next_offset
        for message in messages:
            key = partition_key if message.partition_key is None else message.partition_key.encode("utf-8")
            offset_text = str(offset).encode()
            service = (_SEQ_KEY + _ANNOTATIONS.pack(0x81, sequence)
                       + _OFFSET_KEY + b"\xa1" + bytes((len(offset_text),)) + offset_text + time_entry
                       + _key_entry(key))
            annotations = map_section(MESSAGE_ANNOTATIONS, service + message.annotations,
                                      (6 if key is None else 8) + message.annotation_count)
            delivery = b""
            if message.delivery_count:
                delivery = map_section(DELIVERY_ANNOTATIONS, message.delivery, message.delivery_count)
                self._delivery[sequence] = (len(delivery), message.delivery, message.delivery_count)
            payload = message.header + delivery + annotations + message.rest
            payloads.append(payload)
            header_ends.append(len(message.header))
            offsets.append(offset)
            times.append(now)
            offset += len(payload)
            sequence += 1
        self.next_sequence_number = sequence
        self.next_offset = offset
        self.last_enqueued_time = now
        self._drop_old(now)
        for group in self.receivers.values():
            for receiver in group:
                receiver.wake()

    def _drop_old(self, now: int) -> None:
        limits = self.hub.namespace
        excess = self.retained - limits.max_events_per_partition
        cutoff = now - int(limits.retention_seconds * 1000)
        head, times = self._head, self._times
        if excess > 0:
            head += excess
        while head < len(times) and times[head] < cutoff:
            head += 1
        if head == self._head:
            return
        if self._delivery:
            for sequence in range(self.begin_sequence_number, self.begin_sequence_number + head - self._head):
                self._delivery.pop(sequence, None)
        self.begin_sequence_number += head - self._head
        self._head = head
        if head > 1024 and head * 2 > len(times):
            del self._payloads[:head], self._header_ends[:head], self._offsets[:head], self._times[:head]
            self._head = 0

    # -- receivers and owner levels
    def add_receiver(self, consumer_group: str, receiver: ReceiverHandle) -> None:
        """Apply Event Hubs' owner-level rules, then register ``receiver``.

        A receiver with owner level e2 disconnects every receiver with a lower or equal
        level and every receiver without one; it is refused if one with a higher level
        is connected. A receiver without an owner level is refused while one with a
        level is connected, and at most 5 such receivers share a partition per group.
        """
        group = self.receivers.setdefault(consumer_group.casefold(), [])
        level = receiver.owner_level
        holders = [r for r in group if r.owner_level is not None]
        if level is None:
            if holders:
                top = max(r.owner_level for r in holders)  # type: ignore[type-var]
                raise BrokerError(
                    "amqp:link:stolen",
                    f"Receiver '{receiver.name}' without an owner level cannot connect to partition "
                    f"{self.partition_id} of {self.hub.name} (consumer group {consumer_group}): a receiver with "
                    f"owner level '{top}' is connected.")
            if len(group) >= 5:
                raise BrokerError(
                    "amqp:resource-limit-exceeded",
                    f"Exceeded the maximum number of allowed receivers per partition in a consumer group which is "
                    f"5 (partition {self.partition_id} of {self.hub.name}, consumer group {consumer_group}).")
            group.append(receiver)
            return
        higher = [r for r in holders if r.owner_level > level]  # type: ignore[operator]
        if higher:
            raise BrokerError(
                "amqp:link:stolen",
                f"Receiver '{receiver.name}' with owner level '{level}' cannot connect to partition "
                f"{self.partition_id} of {self.hub.name} (consumer group {consumer_group}): a receiver with the "
                f"higher owner level '{higher[0].owner_level}' is connected.")
        for other in list(group):
            group.remove(other)
            other.disconnect(
                "amqp:link:stolen",
                f"New receiver '{receiver.name}' with higher epoch of '{level}' is created hence current receiver "
                f"'{other.name}' with epoch '{other.owner_level}' is getting disconnected (partition "
                f"{self.partition_id} of {self.hub.name}, consumer group {consumer_group}).")
        group.append(receiver)

    def remove_receiver(self, consumer_group: str, receiver: ReceiverHandle) -> None:
        group = self.receivers.get(consumer_group.casefold())
        if group and receiver in group:
            group.remove(receiver)


@dataclass
class EventHub:
    namespace: Namespace
    name: str
    partition_count: int
    consumer_groups: dict[str, str] = field(default_factory=dict)  # casefolded -> as configured
    created_at: int = field(default_factory=_now_ms)
    partitions: list[Partition] = field(default_factory=list)
    _round_robin: int = 0

    def __post_init__(self) -> None:
        self.partitions = [Partition(self, str(index)) for index in range(self.partition_count)]
        self.consumer_groups.setdefault("$default", "$Default")

    @property
    def partition_ids(self) -> list[str]:
        return [p.partition_id for p in self.partitions]

    def add_partitions(self, partition_count: int) -> None:
        """Grow the hub to ``partition_count`` partitions, as Event Hubs' premium and
        dedicated tiers allow (a hub never shrinks). New partitions start empty; keys
        map over the new count from now on."""
        if partition_count < self.partition_count:
            raise ValueError(f"event hub {self.name!r} has {self.partition_count} partitions; a hub never shrinks")
        self.partitions.extend(Partition(self, str(index)) for index in range(self.partition_count, partition_count))
        self.partition_count = partition_count

    def partition(self, partition_id: str) -> Partition:
        try:
            index = int(partition_id)
        except (TypeError, ValueError):
            index = -1
        if not 0 <= index < self.partition_count or str(index) != partition_id:
            raise BrokerError(
                "com.microsoft:argument-out-of-range",
                f"The specified partition '{partition_id}' is invalid for event hub '{self.name}': partition ids "
                f"are 0 to {self.partition_count - 1}.")
        return self.partitions[index]

    def check_consumer_group(self, consumer_group: str) -> None:
        if consumer_group.casefold() not in self.consumer_groups:
            raise BrokerError(
                "amqp:not-found",
                f"The messaging entity '{self.namespace.host}:eventhub:{self.name}~consumergroups/{consumer_group}' "
                "could not be found.")

    def ingest(self, message: Any, message_format: int, partition: Partition | None) -> None:
        """Store a producer's transfer: one message, or a batch (``BATCH_FORMAT``), sent to
        ``partition`` or (None) routed by its partition key. A partition key on a send to a
        partition is kept with the events, as the service keeps it (azure-eventhub's
        buffered producer maps keys to partitions itself and sends so)."""
        if message_format == BATCH_FORMAT:
            messages, key = split_batch(message)
        else:
            single = split_message(message)
            messages, key = [single], single.partition_key
        if messages:
            target = partition if partition is not None else self.route(key)
            target.append(messages, key.encode("utf-8") if key is not None else None)

    def route(self, partition_key: str | None) -> Partition:
        """Where a send without a partition id goes: by key hash, else round robin."""
        if partition_key is not None:
            return self.partitions[partition_for_key(partition_key, self.partition_count)]
        self._round_robin = (self._round_robin + 1) % self.partition_count
        return self.partitions[self._round_robin]


@dataclass
class Namespace:
    """Every event hub of the emulator, with the storage limits that apply to all."""

    host: str = "localhost"
    max_events_per_partition: int = 100_000
    retention_seconds: float = 3600.0
    max_message_size: int = 1024 * 1024
    hubs: dict[str, EventHub] = field(default_factory=dict)
    busy_until: float = 0.0  # time.monotonic() until which receivers are throttled (see throttle)
    busy_retry_after: float = 4.0
    throttled: int = 0  # receiver attaches refused with server-busy

    def throttle(self, seconds: float, *, retry_after: float = 4.0) -> None:
        """Throttle receivers for ``seconds``, as the service does when a namespace is over
        its throughput units: every receiver is detached, and every receiver attach is
        refused, with ``com.microsoft:server-busy`` and the service's "Please wait N
        seconds" text. (Call it on the emulator's event loop.)"""
        self.busy_until = time.monotonic() + seconds
        self.busy_retry_after = retry_after
        for hub in self.hubs.values():
            for partition in hub.partitions:
                for group in partition.receivers.values():
                    for receiver in list(group):
                        group.remove(receiver)
                        receiver.disconnect("com.microsoft:server-busy", self._busy_text())

    def _busy_text(self) -> str:
        return (f"The request was terminated because the namespace {self.host} is being throttled. Error code : "
                f"50002. Please wait {self.busy_retry_after:g} seconds and try again.")

    def check_busy(self) -> None:
        """Raise server-busy while the namespace is throttled (see :meth:`throttle`)."""
        if time.monotonic() < self.busy_until:
            self.throttled += 1
            raise BrokerError("com.microsoft:server-busy", self._busy_text())

    def add_hub(self, name: str, partition_count: int, consumer_groups: list[str] | None = None) -> EventHub:
        hub = EventHub(self, name, partition_count)
        for group in consumer_groups or []:
            hub.consumer_groups[group.casefold()] = group
        self.hubs[name.casefold()] = hub
        return hub

    def hub(self, name: str) -> EventHub:
        try:
            return self.hubs[name.casefold()]
        except KeyError:
            raise BrokerError("amqp:not-found",
                              f"The messaging entity 'sb://{self.host}/{name}' could not be found.") from None
