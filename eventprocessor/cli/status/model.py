"""What a consumer group looks like, from what its store and event hub said: pure.

:func:`build_status` takes the listings and returns a :class:`GroupStatus`. Expiry is judged
as the processors judge it, ``server_time - last_modified > expiration``, both from the
store, where ``last_modified`` is the later of the record's and its owner's heartbeat when
that heartbeat keeps its partitions (``lease=member``).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any

from eventprocessor._ownership.liveness import heartbeats, with_heartbeats
from eventprocessor._ownership.membership import IN_FLIGHT_PROPERTY, decode_in_flight
from eventprocessor.sources import PartitionProperties
from eventprocessor.stores.records import Checkpoint, MemberListing, OwnershipListing, partition_sort_key

__all__ = ["GroupStatus", "MemberStatus", "PartitionStatus", "StatusSummary", "build_status"]

OWNED, EXPIRED, RELEASED, UNCLAIMED, UNREADABLE = "owned", "expired", "released", "unclaimed", "unreadable"


@dataclass(frozen=True)
class PartitionStatus:
    """One partition as the store (and the event hub) describe it.

    ``state`` is ``owned`` (a live record), ``expired`` (older than the expiration on the
    store's clock: the next tick of any processor takes it), ``released`` (a record with
    no owner), ``unclaimed`` (no record; only known when the hub's partition list was
    read) or ``unreadable`` (a record the store cannot read; ``note`` says why). ``lag``
    is the number of events after the checkpoint (after the start of the partition when
    there is no checkpoint: ``lag_from == "start"``), ``None`` when unknown.
    """

    partition_id: str
    state: str
    owner_id: str | None = None
    epoch: int | None = None
    lease_age: float | None = None
    last_modified_time: datetime | None = None
    requested_by: str = ""
    checkpoint_sequence_number: int | None = None
    checkpoint_offset: str | None = None
    checkpoint_time: datetime | None = None
    checkpoint_age: float | None = None
    checkpoint_owner_id: str | None = None
    checkpoint_epoch: int | None = None
    last_enqueued_sequence_number: int | None = None
    last_enqueued_time: datetime | None = None
    lag: int | None = None
    lag_from: str | None = None
    note: str = ""
    in_flight: int | None = None
    """Calls in flight now, when its owner runs many per partition (``max_concurrency``)."""
    oldest_in_flight_age: float | None = None
    """Seconds since the partition's oldest event not done was enqueued (its owner's last heartbeat)."""


@dataclass(frozen=True)
class MemberStatus:
    """One processor of the group: the partitions it owns (live records) and the expired
    records that still name it, and its heartbeat record when the store keeps them.

    ``state`` is ``live`` when it has a live heartbeat or owns a live record, else
    ``gone``.
    """

    owner_id: str
    state: str
    owned: int
    expired: int
    heartbeat_age: float | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StatusSummary:
    """The counts of the summary line. ``imbalance`` is the most minus the fewest
    partitions owned by a live member (``None`` without live members); ``lag`` the sum
    of the known lags (``None`` when none is known)."""

    partitions: int
    owned: int
    unowned: int
    expired: int
    unreadable: int
    handoffs_pending: int
    live_members: int
    imbalance: int | None
    most_owned: int | None
    fewest_owned: int | None
    lag: int | None
    lag_known: int
    partitions_from: str

    def line(self) -> str:
        """The summary as one line of text."""
        where = "" if self.partitions_from == "eventhub" else " (seen in the store)"
        parts = [f"{self.partitions} partitions{where}: {self.owned} owned, {self.unowned} unowned, "
                 f"{self.expired} expired"]
        if self.unreadable:
            parts[0] += f", {self.unreadable} unreadable"
        if self.handoffs_pending:
            parts[0] += f", {self.handoffs_pending} handoff{'s' if self.handoffs_pending != 1 else ''} pending"
        if self.imbalance is None:
            parts.append(f"{self.live_members} live members")
        else:
            parts.append(f"{self.live_members} live member{'s' if self.live_members != 1 else ''}, imbalance "
                         f"{self.imbalance} (most {self.most_owned}, fewest {self.fewest_owned})")
        if self.lag is None:
            parts.append("lag unknown")
        elif self.lag_known < self.partitions:
            parts.append(f"lag {self.lag} events ({self.lag_known} of {self.partitions} partitions known)")
        else:
            parts.append(f"lag {self.lag} events")
        return " · ".join(parts)


@dataclass(frozen=True)
class GroupStatus:
    """A consumer group at one moment: partitions, members, summary, and notes that say
    what could not be known (members not kept by the store, lag not reachable)."""

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    store: str
    server_time: datetime
    expiration: float
    partitions: tuple[PartitionStatus, ...]
    members: tuple[MemberStatus, ...]
    summary: StatusSummary
    members_note: str | None = None
    lag_note: str | None = None
    records_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: times as ISO 8601 strings, ages in seconds.

        Example::

            print(json.dumps(status.to_json(), indent=2))
        """
        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        document = asdict(self)
        document["members"] = [{**m, "properties": dict(m["properties"])} for m in document["members"]]
        return {"summary_line": self.summary.line(), **plain(document)}


def _seconds(later: datetime, earlier: datetime | None) -> float | None:
    return None if earlier is None else (later - earlier).total_seconds()


def build_status(*, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, store: str,
                 expiration: float, ownership: OwnershipListing, checkpoints: Sequence[Checkpoint],
                 members: MemberListing | None = None, members_note: str | None = None,
                 partition_ids: Sequence[str] | None = None,
                 properties: Mapping[str, PartitionProperties] | None = None,
                 lag_note: str | None = None) -> GroupStatus:
    """The status of a group from what its store (and event hub) said. Pure.

    ``partition_ids`` is the hub's partition list when it was read (partitions without a
    record are then ``unclaimed``); ``properties`` the partitions' newest events, for lag.

    Example::

        listing = await store.list_ownership(ns, hub, group)
        status = build_status(fully_qualified_namespace=ns, eventhub_name=hub, consumer_group=group,
                               store=repr(store), expiration=60, ownership=listing,
                               checkpoints=await store.list_checkpoints(ns, hub, group))
        print(status.summary.line())
    """
    now = ownership.server_time
    properties = properties or {}
    ownership = with_heartbeats(ownership, heartbeats(members))
    records = {record.partition_id: record for record in ownership.ownerships}
    unreadable = {record.partition_id: record for record in ownership.unreadable}
    by_partition = {checkpoint.partition_id: checkpoint for checkpoint in checkpoints}
    ids = set(records) | set(unreadable) | set(by_partition) | set(properties) | set(partition_ids or ())

    rows: list[PartitionStatus] = []
    for pid in sorted(ids, key=partition_sort_key):
        record = records.get(pid)
        fields: dict[str, Any] = {}
        if record is not None:
            age = _seconds(now, record.last_modified_time)
            if record.is_released:
                state = RELEASED
            else:
                state = EXPIRED if age is not None and age > expiration else OWNED
            fields.update(owner_id=record.owner_id or None, epoch=record.epoch, lease_age=age,
                          last_modified_time=record.last_modified_time, requested_by=record.requested_by)
        elif pid in unreadable:
            bad = unreadable[pid]
            state = UNREADABLE
            fields.update(lease_age=_seconds(now, bad.last_modified_time), last_modified_time=bad.last_modified_time,
                          note=bad.reason)
        else:
            state = UNCLAIMED
        checkpoint = by_partition.get(pid)
        if checkpoint is not None:
            fields.update(checkpoint_sequence_number=checkpoint.sequence_number, checkpoint_offset=checkpoint.offset,
                          checkpoint_time=checkpoint.last_modified_time,
                          checkpoint_age=_seconds(now, checkpoint.last_modified_time),
                          checkpoint_owner_id=checkpoint.owner_id, checkpoint_epoch=checkpoint.epoch)
        newest = properties.get(pid)
        if newest is not None:
            fields.update(last_enqueued_sequence_number=newest.last_enqueued_sequence_number,
                          last_enqueued_time=newest.last_enqueued_time_utc, **_lag(newest, checkpoint))
        rows.append(PartitionStatus(partition_id=pid, state=state, **fields))

    member_rows = _members(rows, members, expiration)
    rows = _with_in_flight(rows, member_rows, now)
    records_note = None
    if not (records or unreadable or by_partition or (members is not None and members.members)):
        # The usual cause is a name that differs from the processors' (blob names are
        # lower-cased, the namespace is the fully qualified one).
        records_note = (f"no records of consumer group {consumer_group!r} of {fully_qualified_namespace}/"
                        f"{eventhub_name} in this store: check --namespace, --eventhub, --consumer-group and "
                        "the container or table")
    return GroupStatus(
        fully_qualified_namespace=fully_qualified_namespace, eventhub_name=eventhub_name,
        consumer_group=consumer_group, store=store, server_time=now, expiration=expiration,
        partitions=tuple(rows), members=member_rows,
        summary=_summary(rows, member_rows, "eventhub" if partition_ids is not None else "store"),
        members_note=members_note, lag_note=lag_note, records_note=records_note)


def _with_in_flight(rows: list[PartitionStatus], members: Sequence[MemberStatus],
                    now: datetime) -> list[PartitionStatus]:
    """The calls in flight and the oldest event not done, as each owner last published them."""
    published = {member.owner_id: decode_in_flight(member.properties.get(IN_FLIGHT_PROPERTY)) for member in members
                 if IN_FLIGHT_PROPERTY in member.properties}
    if not published:
        return rows
    result = []
    for row in rows:
        found = published.get(row.owner_id or "", {}).get(row.partition_id) if row.state == OWNED else None
        if found is not None:
            calls, _held, oldest = found
            age = None if oldest is None else max(0.0, now.timestamp() - oldest)
            row = replace(row, in_flight=calls, oldest_in_flight_age=age)
        result.append(row)
    return result


def _lag(newest: PartitionProperties, checkpoint: Checkpoint | None) -> dict[str, Any]:
    """Events still to process: after the checkpoint, or all the partition holds. Events
    older than the partition's retention are gone, so they are not counted."""
    if newest.is_empty:
        return {"lag": 0, "lag_from": "checkpoint" if checkpoint is not None else "start"}
    before_first = newest.beginning_sequence_number - 1
    if checkpoint is None:
        return {"lag": newest.last_enqueued_sequence_number - before_first, "lag_from": "start"}
    return {"lag": newest.last_enqueued_sequence_number - max(checkpoint.sequence_number, before_first),
            "lag_from": "checkpoint"}


def _members(rows: Sequence[PartitionStatus], members: MemberListing | None,
             expiration: float) -> tuple[MemberStatus, ...]:
    owned = Counter(row.owner_id for row in rows if row.state == OWNED and row.owner_id)
    expired = Counter(row.owner_id for row in rows if row.state == EXPIRED and row.owner_id)
    heartbeats: dict[str, tuple[float | None, Mapping[str, str]]] = {}
    if members is not None:
        for member in members.members:
            heartbeats[member.owner_id] = (_seconds(members.server_time, member.last_modified_time),
                                           dict(member.properties))
    result = []
    for owner_id in sorted(set(owned) | set(expired) | set(heartbeats)):
        age, props = heartbeats.get(owner_id, (None, {}))
        beating = owner_id in heartbeats and age is not None and age <= expiration
        state = "live" if beating or owned[owner_id] else "gone"
        result.append(MemberStatus(owner_id=owner_id, state=state, owned=owned[owner_id],
                                   expired=expired[owner_id], heartbeat_age=age, properties=props))
    return tuple(result)


def _summary(rows: Sequence[PartitionStatus], members: Sequence[MemberStatus], partitions_from: str) -> StatusSummary:
    states = Counter(row.state for row in rows)
    live = [member.owned for member in members if member.state == "live"]
    lags = [row.lag for row in rows if row.lag is not None]
    return StatusSummary(
        partitions=len(rows), owned=states[OWNED], unowned=states[RELEASED] + states[UNCLAIMED],
        expired=states[EXPIRED], unreadable=states[UNREADABLE],
        handoffs_pending=sum(1 for row in rows if row.state == OWNED and row.requested_by),
        live_members=len(live), imbalance=(max(live) - min(live)) if live else None,
        most_owned=max(live) if live else None, fewest_owned=min(live) if live else None,
        lag=sum(lags) if lags else None, lag_known=len(lags), partitions_from=partitions_from)


