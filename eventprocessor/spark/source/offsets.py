"""Offsets of the eventhubs source and the pure planning over them.

An offset names, per partition, the *next* sequence number to read and the offset
string of the event before it (the last one read), when known::

    {"eventhub": "telemetry",
     "partitions": {"0": {"seqNo": 1042, "offset": "266240"}, "1": {"seqNo": 17, "offset": null}}}

That is the JSON Spark keeps in its offset log (``<checkpointLocation>/offsets/N``). A
micro-batch reads ``[start.seqNo, end.seqNo)`` of every partition. Sequence numbers
drive the reads (Event Hubs filters on them exactly); the offset string is kept for the
Event Hubs checkpoints a query writes (``azure-eventhub``'s processor resumes from a
checkpoint's offset, and a geo-replicated namespace's offsets are opaque strings), so it
is the one the hub reported for that very event. It is ``null`` where nothing told it
cheaply (a start resolved from a sequence number, or the end of a rate-limited batch
when no checkpoint store is named).

Everything here is a pure function of offsets and partition properties, so the planning
(rate limits, new partitions, ``Trigger.AvailableNow``, splitting hot partitions) is
tested without Spark or a hub.

Example::

    start = HubOffset.from_json(spark_start)
    end = plan_latest(start, properties, max_rows=10_000)
    ranges = plan_ranges(start, end, min_partitions=8)
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...errors import ConfigurationError, EventSourceError
from ...sources.base import PartitionProperties
from ...stores.records import partition_sort_key

__all__ = ["PartitionPosition", "HubOffset", "ReadRange", "DataLoss", "DataLossError", "plan_latest", "rate_limit",
           "plan_ranges", "data_loss", "end_position"]


@dataclass(frozen=True)
class PartitionPosition:
    """Where a partition's reading stands: ``sequence_number`` is the next event to
    read; ``offset`` is the offset string of the event before it, when known."""

    sequence_number: int
    offset: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"seqNo": self.sequence_number, "offset": self.offset}


@dataclass(frozen=True)
class HubOffset:
    """A whole offset: the event hub and each partition's position."""

    eventhub_name: str
    partitions: Mapping[str, PartitionPosition]

    def to_json(self) -> dict[str, Any]:
        """Partitions in numeric order, so equal offsets are equal JSON text (Spark
        compares the text to tell whether a batch has data)."""
        return {"eventhub": self.eventhub_name,
                "partitions": {pid: self.partitions[pid].to_json()
                               for pid in sorted(self.partitions, key=partition_sort_key)}}

    @classmethod
    def from_json(cls, data: Any, eventhub_name: str) -> HubOffset:
        """Read an offset back from Spark's log; refuse one of another hub or shape."""
        if not isinstance(data, dict) or not isinstance(data.get("partitions"), dict):
            raise ConfigurationError(
                f"the query's checkpoint holds an offset this source did not write ({str(data)[:120]!r}): it was "
                "written by another source; start the query with a new checkpointLocation")
        written_for = data.get("eventhub")
        if written_for != eventhub_name:
            raise ConfigurationError(
                f"the query's checkpoint was written for event hub {written_for!r}, and the connection string now "
                f"names {eventhub_name!r}: use a new checkpointLocation for another hub")
        positions: dict[str, PartitionPosition] = {}
        for pid, value in data["partitions"].items():
            seq = value.get("seqNo") if isinstance(value, dict) else None
            offset = value.get("offset") if isinstance(value, dict) else None
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0 or \
                    not (offset is None or isinstance(offset, str)):
                raise ConfigurationError(f"the query's checkpoint holds a malformed position for partition {pid!r}: "
                                         f"{str(value)[:120]!r}")
            positions[str(pid)] = PartitionPosition(seq, offset)
        return cls(eventhub_name, positions)

    def sequence_numbers(self) -> dict[str, int]:
        return {pid: p.sequence_number for pid, p in self.partitions.items()}


@dataclass(frozen=True)
class ReadRange:
    """What one Spark task reads: ``[from_sequence_number, until_sequence_number)`` of
    one partition (``part`` of ``parts`` when a hot partition is split)."""

    partition_id: str
    from_sequence_number: int
    until_sequence_number: int
    part: int = 0
    parts: int = 1
    planned_at: float = 0.0
    """The driver's clock when the batch was planned: executors learn the batch
    interval from it (they only compare these values with each other)."""

    @property
    def count(self) -> int:
        return self.until_sequence_number - self.from_sequence_number


@dataclass(frozen=True)
class DataLoss:
    """Events that expired before the query read them."""

    partition_id: str
    wanted: int
    earliest: int

    def message(self) -> str:
        return (f"partition {self.partition_id}: the query was to read from sequence number {self.wanted}, but the "
                f"earliest event the hub still holds is {self.earliest}; {self.earliest - self.wanted} events expired "
                "(retention) before they were read")


class DataLossError(EventSourceError):
    """Events the query was to read expired from the hub first (``failOnDataLoss=true``):
    found by :func:`data_loss` on the driver, or as a gap in a range an executor reads."""


def data_loss(start: HubOffset, properties: Mapping[str, PartitionProperties]) -> list[DataLoss]:
    """Partitions whose next event to read has already expired from the hub."""
    lost = []
    for pid, props in properties.items():
        position = start.partitions.get(pid)
        wanted = position.sequence_number if position is not None else 0
        if wanted < props.beginning_sequence_number and not _empty_and_caught_up(props, wanted):
            lost.append(DataLoss(pid, wanted, props.beginning_sequence_number))
    return sorted(lost, key=lambda d: partition_sort_key(d.partition_id))


def _empty_and_caught_up(props: PartitionProperties, wanted: int) -> bool:
    # An empty partition whose events all expired after being read: nothing was lost.
    return props.is_empty and wanted > props.last_enqueued_sequence_number


def end_position(props: PartitionProperties) -> PartitionPosition:
    """The position after the partition's last event (its offset string, when it has one)."""
    last = props.last_enqueued_sequence_number
    known = last >= 0 and props.last_enqueued_offset not in (None, "", "-1")
    return PartitionPosition(last + 1, props.last_enqueued_offset if known else None)


def plan_latest(start: HubOffset, properties: Mapping[str, PartitionProperties], *, max_rows: int | None = None,
                target: HubOffset | None = None) -> HubOffset:
    """The end of the next micro-batch.

    * Every partition the hub reports counts; one missing from ``start`` is new and is
      read from sequence number 0 (its first event).
    * A partition with nothing new keeps ``start``'s entry exactly, so that a batch with
      no data is the same JSON as its start.
    * ``max_rows`` (Spark's ``ReadMaxRows``) caps the events of the batch, shared by
      :func:`rate_limit`; the offset strings of capped ends are left ``None``.
    * ``target`` (``Trigger.AvailableNow``) is never passed, and partitions it does not
      know (added after the trigger started) are left out.

    Example::

        end = plan_latest(start, {"0": props0, "1": props1}, max_rows=1000)
    """
    current = dict(start.partitions)
    begins: dict[str, int] = {}
    available: dict[str, PartitionPosition] = {}
    for pid, props in properties.items():
        if target is not None and pid not in target.partitions:
            continue
        position = current.get(pid)
        if position is None:
            position = PartitionPosition(0)
            current[pid] = position
        # Events below the hub's earliest have expired: do not count them against the limit.
        begins[pid] = max(position.sequence_number, props.beginning_sequence_number)
        end = end_position(props)
        if target is not None:
            cap = target.partitions[pid]
            if cap.sequence_number < end.sequence_number:
                end = cap
        if end.sequence_number > position.sequence_number:
            available[pid] = end
    if max_rows is not None:
        capped = rate_limit(begins, {pid: end.sequence_number for pid, end in available.items()}, max_rows)
        available = {pid: (end if capped[pid] == end.sequence_number else PartitionPosition(capped[pid]))
                     for pid, end in available.items() if capped[pid] > current[pid].sequence_number}
    result = {pid: available.get(pid, position) for pid, position in current.items()}
    return HubOffset(start.eventhub_name, result)


def rate_limit(begins: Mapping[str, int], untils: Mapping[str, int], max_rows: int) -> dict[str, int]:
    """Share ``max_rows`` among partitions by backlog, exactly ``max_rows`` in all when
    the backlog is larger (the Microsoft connector shares in proportion too, but may go
    over the limit by rounding up).

    When the limit allows, every partition with a backlog gets one event first, so a
    small partition is never starved by large ones; the rest goes in proportion to what
    is left of each backlog (floors, then one each to the largest remainders).

    Example::

        rate_limit({"0": 0, "1": 0}, {"0": 900, "1": 100}, 100)  # {"0": 89, "1": 11}
    """
    if max_rows < 1:
        raise ConfigurationError(f"max_rows must be at least 1, got {max_rows}")
    sizes = {pid: max(0, until - begins[pid]) for pid, until in untils.items()}
    total = sum(sizes.values())
    if total <= max_rows:
        return dict(untils)
    waiting = [pid for pid, size in sizes.items() if size > 0]
    quotas = {pid: (1 if size > 0 and max_rows >= len(waiting) else 0) for pid, size in sizes.items()}
    budget = max_rows - sum(quotas.values())
    rest = {pid: sizes[pid] - quotas[pid] for pid in sizes}
    rest_total = sum(rest.values())
    remainders: list[tuple[int, tuple[int, object], str]] = []
    for pid, size in rest.items():
        share = budget * size // rest_total if rest_total else 0
        quotas[pid] += share
        remainders.append((-(budget * size % rest_total) if rest_total else 0, partition_sort_key(pid), pid))
    left = max_rows - sum(quotas.values())
    for _remainder, _order, pid in sorted(remainders):
        if left == 0:
            break
        if sizes[pid] > quotas[pid]:
            quotas[pid] += 1
            left -= 1
    return {pid: begins[pid] + quotas[pid] for pid in untils}


def plan_ranges(start: HubOffset, end: HubOffset, min_partitions: int | None = None) -> list[ReadRange]:
    """The Spark input partitions of a batch: one per Event Hubs partition with events
    in ``[start, end)``; with ``min_partitions``, partitions are split into sequence
    ranges in proportion to their size until there are at least that many (as the
    Kafka source's ``minPartitions`` does).

    Example::

        plan_ranges(start, end)       # [ReadRange("0", 100, 250), ReadRange("1", 40, 60)]
    """
    ranges: list[ReadRange] = []
    for pid in sorted(end.partitions, key=partition_sort_key):
        position = start.partitions.get(pid)
        begin = position.sequence_number if position is not None else 0
        until = end.partitions[pid].sequence_number
        if until > begin:
            ranges.append(ReadRange(pid, begin, until))
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.count for r in ranges)
    split: list[ReadRange] = []
    for whole in ranges:
        parts = max(1, round(whole.count / total * min_partitions))
        parts = min(parts, whole.count)
        remaining, begin = whole.count, whole.from_sequence_number
        for part in range(parts):
            size = remaining // (parts - part)
            remaining -= size
            split.append(ReadRange(whole.partition_id, begin, begin + size, part, parts))
            begin += size
    return split


def starting_offset(eventhub_name: str, positions: Iterable[tuple[str, PartitionPosition]]) -> HubOffset:
    """A :class:`HubOffset` from resolved starting positions."""
    return HubOffset(eventhub_name, dict(positions))
