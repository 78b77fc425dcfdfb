"""The source and store as one receive call sees them (one partition, an owner level)."""
from __future__ import annotations

from dataclasses import replace

from ..errors import ConfigurationError
from ..events import EventPosition
from ..sources.base import EventSource, PartitionProperties, PartitionReceiver
from ..stores.contract import CheckpointStore, StoreWrapper
from ..stores.records import Member, MemberListing, OwnershipListing


class _ReceiveSource(EventSource):
    """The client's source as one receive call sees it: only ``partition_id`` when one is
    given, and receivers opened at ``owner_level`` (0 when None) + the claim's epoch; when
    not ``exclusive`` (no checkpoint store), at ``owner_level`` as given, None included."""

    def __init__(self, inner: EventSource, partition_id: str | None, owner_level: int | None, *,
                 exclusive: bool) -> None:
        self.inner = inner
        self.fully_qualified_namespace = inner.fully_qualified_namespace
        self.eventhub_name = inner.eventhub_name
        self._partition_id = partition_id
        self._owner_level = owner_level
        self._exclusive = exclusive

    async def get_partition_ids(self) -> list[str]:
        ids = await self.inner.get_partition_ids()
        if self._partition_id is None:
            return ids
        if self._partition_id not in ids:
            raise ConfigurationError(f"partition_id {self._partition_id!r} does not exist; the event hub "
                                     f"{self.eventhub_name!r} has partitions {ids}")
        return [self._partition_id]

    async def open_receiver(self, partition_id: str, *, consumer_group: str, starting_position: EventPosition,
                            owner_level: int | None, prefetch: int,
                            track_last_enqueued_event_properties: bool = False) -> PartitionReceiver:
        if not self._exclusive:
            level = self._owner_level
        else:
            level = None if owner_level is None else owner_level + (self._owner_level or 0)
        options = {"track_last_enqueued_event_properties": True} if track_last_enqueued_event_properties else {}
        return await self.inner.open_receiver(partition_id, consumer_group=consumer_group,
                                              starting_position=starting_position, owner_level=level,
                                              prefetch=prefetch, **options)

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        return await self.inner.get_partition_properties(partition_id)


class _OnePartitionStore(StoreWrapper):
    """The store as a single-partition receive sees it: that partition's records only,
    and no member records, so the processor claims its one partition by itself without
    counting the processors that read other partitions."""

    def __init__(self, inner: CheckpointStore, partition_id: str) -> None:
        super().__init__(inner)
        self._partition_id = partition_id

    def _only_mine(self, listing: OwnershipListing) -> OwnershipListing:
        pid = self._partition_id
        return replace(listing, ownerships=tuple(r for r in listing.ownerships if r.partition_id == pid),
                       unreadable=tuple(u for u in listing.unreadable if u.partition_id == pid))

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str,
                             consumer_group: str) -> OwnershipListing:
        return self._only_mine(await super().list_ownership(fully_qualified_namespace, eventhub_name, consumer_group))

    async def list_ownership_and_members(self, fully_qualified_namespace: str, eventhub_name: str,
                                         consumer_group: str) -> tuple[OwnershipListing, MemberListing | None]:
        return await self.list_ownership(fully_qualified_namespace, eventhub_name, consumer_group), None

    async def list_members(self, *scope: str) -> MemberListing:
        raise NotImplementedError("a single-partition receive keeps no member records")

    async def write_member(self, member: Member) -> Member:
        raise NotImplementedError("a single-partition receive keeps no member records")

    async def delete_member(self, member: Member) -> None:
        raise NotImplementedError("a single-partition receive keeps no member records")

    async def announce_change(self, *scope: str) -> None:
        raise NotImplementedError("a single-partition receive keeps no member records")
