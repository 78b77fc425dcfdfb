"""The records a checkpoint store keeps: ownership and checkpoints.

They are frozen dataclasses, so a record handed out by a store can never be changed
behind the store's back ("copies in and out" comes for free).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Optional, Tuple

__all__ = ["Ownership", "Checkpoint", "OwnershipListing"]


@dataclass(frozen=True)
class Ownership:
    """Who owns one partition of one event hub for one consumer group.

    ``owner_id`` is ``""`` for a released record. ``last_modified_time`` and ``etag``
    are set by the store on every write (``None`` on a claim for a partition that has
    no record yet). ``epoch`` grows by one every time the owner changes; it is the
    receiver's owner level and the fencing token of checkpoints. A renewal keeps it.
    """

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    partition_id: str
    owner_id: str
    last_modified_time: Optional[datetime] = None
    etag: Optional[str] = None
    epoch: int = 0

    @property
    def is_released(self) -> bool:
        return not self.owner_id


@dataclass(frozen=True)
class Checkpoint:
    """The position of the last processed event of a partition.

    Consumers resume *after* ``sequence_number``. ``owner_id`` and ``epoch`` record
    who wrote it (``None`` when written by another SDK, such as the official store).
    """

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    partition_id: str
    sequence_number: int
    offset: Optional[str] = None
    owner_id: Optional[str] = None
    epoch: Optional[int] = None


@dataclass(frozen=True)
class OwnershipListing:
    """The ownership records of one (namespace, event hub, consumer group) and the
    store's own clock at the time of listing.

    Expiry is always judged as ``server_time - record.last_modified_time``, both read
    from the store, so a processor whose local clock is off cannot misjudge it.
    """

    ownerships: Tuple[Ownership, ...]
    server_time: datetime
