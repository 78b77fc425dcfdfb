"""The records a checkpoint store keeps: ownership and checkpoints.

They are frozen dataclasses, so a record handed out by a store can never be changed
behind the store's back ("copies in and out" comes for free).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

__all__ = ["Ownership", "Checkpoint", "StateRef", "OwnershipListing", "UnreadableOwnership", "Member", "MemberListing",
           "MAX_EPOCH", "MAX_SEQUENCE_NUMBER", "MAX_ENTRY_BYTES", "partition_sort_key"]

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


@dataclass(frozen=True)
class Checkpoint:
    """The position of the last processed event of a partition.

    Consumers resume *after* ``sequence_number``. ``owner_id`` and ``epoch`` record
    who wrote it (``None`` when written by another SDK, such as the official store).
    ``last_modified_time`` is when the store last wrote it (set by stores on listing).
    ``state`` is the version of the partition's state that goes with this position
    (stateful processors only; ``None`` otherwise).
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
