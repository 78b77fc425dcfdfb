"""The records a checkpoint store keeps: ownership and checkpoints.

They are frozen dataclasses, so a record handed out by a store can never be changed
behind the store's back ("copies in and out" comes for free).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["Ownership", "Checkpoint", "StateRef", "DoneBeyond", "MAX_DONE_TEXT",
           "OwnershipListing", "UnreadableOwnership", "Member", "MemberListing",
           "FIRST_EPOCH", "MAX_EPOCH", "MAX_SEQUENCE_NUMBER", "MAX_ENTRY_BYTES", "partition_sort_key"]

FIRST_EPOCH = 1
"""The epoch of a partition's first claim: an unowned partition reads as epoch 0, and
every claim writes the epoch it read plus one."""

MAX_EPOCH = 2**63 - 1
"""Epochs are Event Hubs owner levels, signed 64-bit integers. A record whose epoch is
above ``MAX_EPOCH - 1`` can never be claimed again with a higher one, so stores report
it as unreadable rather than hand it out."""

MAX_SEQUENCE_NUMBER = 2**63 - 1
"""Event Hubs sequence numbers are signed 64-bit integers."""

MAX_ENTRY_BYTES = 15 * 64 * 1024
"""The most data one log entry (``CheckpointStore.create_entry``) holds, on every store:
983,040 bytes. Azure Table entities hold at most 1 MiB, in properties of at most 64 KiB,
so the Table store splits an entry into 15 binary properties; the other stores keep
the same limit, so that a log works the same on all of them."""


def partition_sort_key(partition_id: str) -> tuple[int, object]:
    """Partition ids in the order people expect: numbers by value ("2" before "10"),
    then any other ids by text."""
    return (0, int(partition_id)) if partition_id.isdigit() else (1, partition_id)


@dataclass(frozen=True)
class Ownership:
    """Who owns one partition of one event hub for one consumer group.

    ``owner_id`` is ``""`` for a released record. ``last_modified_time`` and ``etag``
    are set by the store on every write (``None`` on a claim for a partition that has
    no record yet). ``epoch`` grows by one every time the owner changes; it is the
    receiver's owner level and the fencing token of checkpoints. A renewal keeps it.
    ``requested_by`` is the processor that asked the owner to hand the partition over
    (graceful handoff), ``""`` when nobody asked.
    """

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    partition_id: str
    owner_id: str
    last_modified_time: datetime | None = None
    etag: str | None = None
    epoch: int = 0
    requested_by: str = ""

    @property
    def is_released(self) -> bool:
        return not self.owner_id


@dataclass(frozen=True)
class StateRef:
    """Which version of a partition's state goes with a checkpoint: the head of its state
    log, written by the claim of ``epoch`` (see :mod:`eventprocessor.state`)."""

    version: int
    epoch: int

    def __str__(self) -> str:
        return f"{self.version}.{self.epoch}"

    @staticmethod
    def parse(text: str) -> StateRef:
        version, _, epoch = text.partition(".")
        if not version.isdigit() or not epoch.isdigit():
            raise ValueError(f"a state reference is '<version>.<epoch>', got {text!r}")
        return StateRef(int(version), int(epoch))


MAX_DONE_TEXT = 1000
"""The most characters a checkpoint's record of the events done beyond it takes (one
record field: within the 1,024 printable characters every store keeps per field, and far
inside blob metadata's 8 KiB)."""


_DIGITS = re.compile(r"[0-9a-z]{1,13}")


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if not number:
            return text


@dataclass(frozen=True)
class DoneBeyond:
    """The events done beyond a checkpoint (many events in flight per partition): the
    ranges of sequence numbers, inclusive, sorted, apart, all above the checkpoint's.

    Stored as one field of the checkpoint record, relative to the checkpoint's sequence
    number: for each range, the gap after the previous one (or after the checkpoint) and
    its length minus one, in base 36, joined by ``.``: ``"1.0.3.4"`` after 40 is 42 and
    47-51. :meth:`encode` keeps at most :data:`MAX_DONE_TEXT` characters by leaving the
    last ranges out: those events are then delivered again after a crash, never lost.
    A reader that ignores the field (azure-eventhub, an older SDK) resumes after the
    checkpoint and redelivers them all: at least once, still in order.
    """

    ranges: tuple[tuple[int, int], ...] = ()

    def __contains__(self, sequence_number: object) -> bool:
        ranges = self.ranges
        if not ranges or not isinstance(sequence_number, int):
            return False
        low, high = 0, len(ranges)
        while low < high:  # the last range starting at or before the number
            middle = (low + high) // 2
            if ranges[middle][0] <= sequence_number:
                low = middle + 1
            else:
                high = middle
        return low > 0 and sequence_number <= ranges[low - 1][1]

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)

    def after(self, sequence_number: int) -> DoneBeyond:
        """The ranges above ``sequence_number`` (a later checkpoint's share)."""
        kept = tuple((max(first, sequence_number + 1), last) for first, last in self.ranges
                     if last > sequence_number)
        return DoneBeyond(kept) if len(kept) != len(self.ranges) or kept != self.ranges else self

    def encode(self, after: int, limit: int = MAX_DONE_TEXT) -> str:
        """The field's text, relative to the checkpoint at ``after`` (at most ``limit`` characters)."""
        parts: list[str] = []
        size, previous = -1, after
        for first, last in self.ranges:
            pair = f"{_base36(first - previous - 1)}.{_base36(last - first)}"
            if size + 1 + len(pair) > limit:
                break
            parts.append(pair)
            size += 1 + len(pair)
            previous = last
        return ".".join(parts)

    @staticmethod
    def decode(text: str, after: int) -> DoneBeyond:
        """The inverse of :meth:`encode`; ``ValueError`` for text it cannot have made."""
        if not text:
            return DoneBeyond()
        parts = text.split(".")
        if len(parts) % 2 or not all(_DIGITS.fullmatch(part) for part in parts):
            raise ValueError(f"a done-beyond record is pairs of base-36 numbers joined by '.', got {text[:40]!r}")
        ranges, previous = [], after
        for index in range(0, len(parts), 2):
            first = previous + 1 + int(parts[index], 36)
            last = first + int(parts[index + 1], 36)
            ranges.append((first, last))
            previous = last
        return DoneBeyond(tuple(ranges))


@dataclass(frozen=True)
class Checkpoint:
    """The position of the last processed event of a partition.

    Consumers resume *after* ``sequence_number``. ``owner_id`` and ``epoch`` record
    who wrote it (``None`` when written by another SDK, such as the official store).
    ``last_modified_time`` is when the store last wrote it (set by stores on listing).
    ``state`` is the version of the partition's state that goes with this position
    (stateful processors only; ``None`` otherwise). ``done_beyond`` lists the events
    done after it while earlier ones were still in flight (``max_concurrency > 1``):
    a new owner skips them (see :class:`DoneBeyond`).
    """

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    partition_id: str
    sequence_number: int
    offset: str | None = None
    owner_id: str | None = None
    epoch: int | None = None
    last_modified_time: datetime | None = None
    state: StateRef | None = None
    done_beyond: DoneBeyond = DoneBeyond()


@dataclass(frozen=True)
class OwnershipListing:
    """The ownership records of one (namespace, event hub, consumer group) and the
    store's own clock at the time of listing.

    Expiry is always judged as ``server_time - record.last_modified_time``, both read
    from the store, so a processor whose local clock is off cannot misjudge it.
    """

    ownerships: tuple[Ownership, ...]
    server_time: datetime
    unreadable: tuple[UnreadableOwnership, ...] = ()


@dataclass(frozen=True)
class UnreadableOwnership:
    """An ownership record the store holds but cannot read: corrupted, written by a
    foreign program, or with an epoch out of range.

    Its partition is treated as owned by an unknown processor until the record is older
    than the expiration interval; then it may be claimed like an expired record, with a
    write conditional on ``etag``. ``reason`` says what is wrong, for the log.
    """

    partition_id: str
    etag: str
    last_modified_time: datetime | None
    reason: str


@dataclass(frozen=True)
class Member:
    """One live processor of a consumer group: its heartbeat record.

    Processors that own nothing are visible to the balancer through these records.
    ``properties`` carries what peers may need to know (the strategy, an ordinal for
    static assignment, whether it can hand partitions over); values are strings.
    """

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    owner_id: str
    last_modified_time: datetime | None = None
    etag: str | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MemberListing:
    """The member records of one consumer group, and the store's clock when listed.

    ``generation`` is the etag of the group's change notice (see
    :meth:`~eventprocessor.stores.contract.OwnershipStore.announce_change`): it differs
    from one listing to the next when some processor announced an ownership change in
    between; ``None`` when none was ever announced (or the store was wiped)."""

    members: tuple[Member, ...]
    server_time: datetime
    generation: str | None = None
