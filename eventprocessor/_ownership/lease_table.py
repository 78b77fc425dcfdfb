"""LeaseTable: this processor's leases, and the only code that changes one.

Every change of a :class:`~eventprocessor._ownership.lease.Lease` goes through a method here: a
claim registered, confirmed or dropped, a pump started, a renewal won or failed, a
claim ended, the store's view reconciled (:func:`~eventprocessor._ownership.lease.reconcile`). The
table also says each ownership change once: one log line with structured fields
(:data:`OWNERSHIP_LOG_FIELDS`) and one metric.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

from .._runtime.clock import Clock
from .._runtime.stats import ProcessorStats
from .._runtime.telemetry import Telemetry
from .._runtime.timing import Timing
from ..policies import CloseReason
from ..stores.records import Ownership, partition_sort_key
from .lease import Lease, LeaseEnd, LeaseState, Pump, Reconciliation, Snapshot, reconcile

__all__ = ["LeaseTable", "OWNERSHIP_LOG_FIELDS", "OWNERSHIP_REASONS", "sorted_ids"]

logger = logging.getLogger(__name__)

OWNERSHIP_LOG_FIELDS = ("eventprocessor.reason", "eventprocessor.owner_id", "eventprocessor.partition_id",
                        "eventprocessor.epoch", "eventprocessor.eventhub_name", "eventprocessor.consumer_group")
"""The attributes every ownership-change log record carries (read them with ``getattr``).
``eventprocessor.reason`` is one of :data:`OWNERSHIP_REASONS`."""
OWNERSHIP_REASONS = ("claimed", "expired", "stolen", "adopted", "released", "handed_off", "lost", "self_fenced",
                     "store_lost")
_REASON_WORDS = {
    "claimed": "claimed", "expired": "claimed after expiry", "stolen": "stolen", "adopted": "taken over",
    "released": "released", "handed_off": "handed over", "lost": "lost", "self_fenced": "self-fenced",
    "store_lost": "dropped",
}
_END_REASONS = {
    LeaseEnd.SHUTDOWN: "released",
    LeaseEnd.HANDOFF: "handed_off",
    LeaseEnd.LOST: "lost",
    LeaseEnd.EXPIRED: "self_fenced",
    LeaseEnd.PUMP_ENDED: "released",
    LeaseEnd.STORE_LOST: "store_lost",
}


def sorted_ids(pids: Iterable[str]) -> list[str]:
    return sorted(pids, key=partition_sort_key)


class LeaseTable:
    """The leases of one processor, by partition.

    ``on_released(leases)`` is called with leases whose pump is gone and whose record
    must be written (released or handed over); ``on_refreshed()`` when a lease took a
    newer etag from the store (the renewer must use it).
    """

    def __init__(self, *, owner_id: str, eventhub_name: str, consumer_group: str, describe: str, clock: Clock,
                 timing: Timing, stats: ProcessorStats, telemetry: Telemetry,
                 on_released: Callable[[list[Lease]], None], on_refreshed: Callable[[], None],
                 handoff_pace: tuple[int, float] | None = None) -> None:
        self._owner_id = owner_id
        self._handoff_pace = handoff_pace
        self._handed_over_at: list[float] = []  # local times handoff records were written (paced tables only)
        self._handoffs_unwritten = 0  # handoffs whose pump is gone and whose record is being written
        self._eventhub_name = eventhub_name
        self._consumer_group = consumer_group
        self._describe = describe
        self._clock = clock
        self._timing = timing
        self._stats = stats
        self._telemetry = telemetry
        self._on_released = on_released
        self._on_refreshed = on_refreshed
        self._leases: dict[str, Lease] = {}
        self.per_record: Callable[[], bool] = lambda: True
        """Whether each record is renewed by its own write (else the heartbeat keeps them)."""
        self.ended_at: dict[str, float] = {}
        """Partition -> local time this processor's last claim of it ended."""
        self.ended_epochs: dict[str, int] = {}
        """Partition -> epoch of this processor's last claim of it that ended (a record
        that still names it at that epoch is claimed anew above it, never resumed)."""

    # ----------------------------------------------------------------- reading
    def get(self, partition_id: str) -> Lease | None:
        return self._leases.get(partition_id)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def __len__(self) -> int:
        return len(self._leases)

    def __contains__(self, partition_id: object) -> bool:
        return partition_id in self._leases

    def owned(self) -> frozenset[str]:
        """Partitions that may be dispatched now (claim owned, lease valid)."""
        now = self._clock.monotonic()
        return frozenset(pid for pid, lease in self._leases.items() if lease.dispatchable(now))

    def held(self) -> set[str]:
        """Partitions with a lease in any state but RELEASED."""
        return {pid for pid, lease in self._leases.items() if lease.state is not LeaseState.RELEASED}

    def with_live_pumps(self) -> set[str]:
        return {pid for pid, lease in self._leases.items() if lease.pump_alive}

    def states(self) -> Mapping[str, LeaseState]:
        return {pid: lease.state for pid, lease in self._leases.items()}

    def dispatch_view(self) -> frozenset:
        """What this processor may dispatch and the state of each lease: a lease that ran
        out or moved on since the last listing is a change to list ownership for."""
        return frozenset(self.owned()) | frozenset(self.states().items())

    def in_state(self, *states: LeaseState) -> list[Lease]:
        return [lease for lease in self._leases.values() if lease.state in states]

    def owned_leases(self) -> list[Lease]:
        return self.in_state(LeaseState.OWNED)

    def pumps(self) -> list[Pump]:
        return [lease.pump for lease in self._leases.values() if lease.pump is not None]

    def renewal_due(self, now: float) -> list[Lease]:
        if not self.per_record():
            return []
        return [lease for lease in self._leases.values() if lease.renewable(now) and lease.renew_at <= now]

    def next_renewal(self, now: float) -> float | None:
        """Seconds until the next renewal or deadline of a renewable lease, or None."""
        if not self.per_record():
            return None
        times = [t for lease in self._leases.values() if lease.renewable(now) for t in (lease.renew_at, lease.deadline)]
        return min(times) - now if times else None

    def deadlines(self) -> list[float]:
        return [lease.deadline for lease in self._leases.values() if lease.state is LeaseState.OWNED]

    # ----------------------------------------------------------------- claims
    def claiming(self, record: Ownership) -> Lease:
        """Register a claim about to be written (nothing is dispatched yet)."""
        lease = Lease(record, now=self._clock.monotonic())
        self._leases[lease.partition_id] = lease
        return lease

    def confirm(self, lease: Lease, record: Ownership, *, sent_at: float, answered_at: float) -> None:
        """The store accepted a write of ``lease``'s record (a claim or a renewal)."""
        lease.confirm(record, sent_at=sent_at, answered_at=answered_at, lease_length=self._timing.lease_length,
                      renewal_age=self._timing.renewal_age)

    def heartbeat_accepted(self, *, sent_at: float) -> None:
        """The store accepted a member record that keeps this processor's partitions,
        sent at ``sent_at``: every lease still renewable now lasts until ``sent_at +
        lease_length`` (never shorter than it was). A lease that ran out or whose pump
        ended is not revived."""
        now = self._clock.monotonic()
        deadline = sent_at + self._timing.lease_length
        for lease in self._leases.values():
            if lease.renewable(now) and deadline > lease.deadline:
                lease.deadline = deadline

    def renewal_failed(self, lease: Lease) -> None:
        lease.renewal_failures += 1
        lease.renew_at = self._clock.monotonic() + self._timing.renewal_retry

    def drop(self, lease: Lease) -> None:
        """A claim that was not won (or could not be fenced): forget it."""
        if self._leases.get(lease.partition_id) is lease:
            del self._leases[lease.partition_id]
        if lease.state is LeaseState.CLAIMING:
            lease.move(LeaseState.RELEASED)

    def started(self, lease: Lease, pump: Pump) -> None:
        lease.pump = pump
        lease.move(LeaseState.OWNED)

    def lost(self, lease: Lease, *, records_vanished: bool = False) -> None:
        """The pump or a checkpoint learned that another processor owns the partition, or
        (``records_vanished``) that the store lost the claim's records."""
        lease.lost = True
        if records_vanished:
            lease.lost_because = "its checkpoint and ownership records vanished from the store"

    def leave_to_expire(self, lease: Lease) -> None:
        """Write nothing when this claim's pump is gone (a hung handler, ``release=False``)."""
        lease.release_to = None

    def forget_released(self) -> None:
        """Drop every lease whose pump is gone (the end of ``stop()``)."""
        for lease in list(self._leases.values()):
            if not lease.pump_alive:
                self._leases.pop(lease.partition_id, None)

    def end(self, lease: Lease, end: LeaseEnd, detail: str, *, release_to: str | None) -> None:
        """Move ``lease`` to RELEASING and stop its pump."""
        if lease.state is LeaseState.CLAIMING:
            lease.move(LeaseState.RELEASED)
            lease.end, lease.end_detail, lease.release_to = end, detail, None
            return
        if lease.state is LeaseState.RELEASING or lease.state is LeaseState.RELEASED:
            return
        lease.move(LeaseState.RELEASING)
        self.ended_at[lease.partition_id] = self._clock.monotonic()
        self.ended_epochs[lease.partition_id] = lease.epoch
        if end is LeaseEnd.EXPIRED:
            self._stats.self_fenced += 1
        elif end is LeaseEnd.LOST:
            self._stats.lost += 1
        if lease.end is not LeaseEnd.HANDOFF or end is not LeaseEnd.HANDOFF:
            lease.end, lease.end_detail = end, detail
            lease.release_to = release_to
        withdrawn = lease.end is LeaseEnd.HANDOFF and lease.release_to == ""  # its requester stopped
        self.changed("released" if withdrawn else _END_REASONS[lease.end or end], lease.partition_id, lease.epoch,
                     detail, level=logging.INFO if end in (LeaseEnd.SHUTDOWN, LeaseEnd.HANDOFF) else logging.WARNING)
        if lease.pump is not None:
            lease.pump.stop(end.close_reason)

    def end_all(self, *, release: bool) -> None:
        """``stop()``: end every live claim; release its record when the pump is gone
        (``release``), or leave every record to expire, as a crash would."""
        for lease in list(self._leases.values()):
            if lease.state in (LeaseState.OWNED, LeaseState.HANDING_OFF, LeaseState.CLAIMING):
                self.end(lease, LeaseEnd.SHUTDOWN, "the processor is stopping", release_to="" if release else None)
            if not release:
                lease.release_to = None

    # ----------------------------------------------------------------- reconciling
    def handoffs_allowed(self, now: float) -> int | None:
        """How many handoff requests may be answered now: None (any) unless the table is
        paced (``handoff_pace=(count, seconds)``, balancing by load), then ``count`` less
        the handoffs under way and those that ended within the last ``seconds``. Every
        planner in a group ticks on its own, so two of them can each ask a busy processor
        for a partition within one interval; the pace keeps it to ``count`` (a request
        over it waits in the record and is answered a little later)."""
        if self._handoff_pace is None:
            return None
        count, seconds = self._handoff_pace
        self._handed_over_at = [t for t in self._handed_over_at if t > now - seconds]
        under_way = self._handoffs_unwritten + sum(
            1 for lease in self._leases.values() if lease.end is LeaseEnd.HANDOFF and lease.release_to
            and lease.state in (LeaseState.HANDING_OFF, LeaseState.RELEASING))
        return max(0, count - under_way - len(self._handed_over_at))

    def handoff_written(self) -> None:
        """A handoff's record write has ended (written, or failed and left to expire): the
        pace counts it from now."""
        if self._handoff_pace is not None and self._handoffs_unwritten > 0:
            self._handoffs_unwritten -= 1
            self._handed_over_at.append(self._clock.monotonic())

    def reconcile(self, snapshot: Snapshot | None = None) -> Reconciliation:
        """Run the pure :func:`reconcile` over the table and carry out what it says."""
        result = Reconciliation()
        for _round in range(3):  # a pump found gone can end its lease in the same call
            now = self._clock.monotonic()
            result = reconcile([lease.view() for lease in self._leases.values()], now=now, owner_id=self._owner_id,
                               snapshot=snapshot, expiration=self._timing.expiration,
                               handoffs=self.handoffs_allowed(now), ended_epochs=self.ended_epochs)
            for record in result.refresh:
                self._refresh(record)
            released = []
            for transition in result.transitions:
                lease = self._leases.get(transition.partition_id)
                if lease is None:
                    continue
                if transition.to is LeaseState.RELEASED:
                    if self._handoff_pace is not None and lease.end is LeaseEnd.HANDOFF and lease.release_to:
                        self._handoffs_unwritten += 1  # until the releaser has written it
                    lease.move(LeaseState.RELEASED)
                    released.append(lease)
                elif transition.to is LeaseState.HANDING_OFF:
                    assert transition.end is not None
                    lease.move(LeaseState.HANDING_OFF)
                    lease.end, lease.end_detail, lease.release_to = transition.end, transition.detail, \
                        transition.release_to
                    if lease.pump is not None:
                        lease.pump.stop(CloseReason.HANDOFF)
                else:
                    assert transition.end is not None
                    self.end(lease, transition.end, transition.detail, release_to=transition.release_to)
            if released:
                for lease in released:
                    self._leases.pop(lease.partition_id, None)
                to_write = [lease for lease in released if lease.release_to is not None]
                if to_write:
                    self._on_released(to_write)
            if not result.transitions:
                break
            snapshot = None  # the snapshot has been applied; later rounds only follow pumps
        return result

    def hung_past_expiry(self) -> list[Lease]:
        """Leases that ran out while their handler does not return, for longer than the
        record would have lived by itself (the safety margin after the lease's end).

        Such a lease stays RELEASING for as long as that handler runs, and its record
        names this processor at the ended claim's epoch, so this processor's heartbeat
        would keep it live for good and no peer could take the partition. The taker
        hands each of them to a peer (:meth:`hand_over_hung`)."""
        now = self._clock.monotonic()
        return [lease for lease in self._leases.values()
                if lease.state is LeaseState.RELEASING and lease.end is LeaseEnd.EXPIRED and lease.pump_alive
                and not lease.handed_over_hung and now >= lease.deadline + self._timing.safety_margin]

    def hand_over_hung(self, hung: Mapping[str, Lease], heirs: Mapping[str, str]) -> None:
        """Write each hung lease's record to its heir (one epoch up, conditional on its
        etag, as a handoff): the heir adopts it and fences the checkpoint, so the ended
        claim's handler can write nothing more. A failed write is tried again at the next
        tick while the handler still runs (:meth:`hand_over_failed`). A lease without an
        heir (no live peer) waits, said once."""
        handed = []
        for pid, lease in hung.items():
            heir = heirs.get(pid)
            if heir is None:
                if not lease.hung_warned:
                    lease.hung_warned = True
                    logger.error("processor %s: partition %s's handler has not returned since its claim ended "
                                 "(epoch %d), and no other processor is live to take the partition: it waits for "
                                 "that handler, or for a peer to start", self._describe, pid, lease.record.epoch)
                continue
            logger.warning("processor %s: partition %s's handler has not returned since its claim ended (epoch %d); "
                           "handing the partition to %s one epoch up, so it does not stay with the ended claim",
                           self._describe, pid, lease.record.epoch, heir)
            lease.handed_over_hung = True
            lease.release_to = heir
            handed.append(lease)
        if handed:
            self._on_released(handed)

    def hand_over_failed(self, lease: Lease) -> None:
        """Writing a hung lease's handover failed: the next tick tries again while that
        handler still runs."""
        if lease.state is LeaseState.RELEASING and lease.pump_alive:
            lease.handed_over_hung = False

    def _refresh(self, record: Ownership) -> None:
        stale = self._leases.get(record.partition_id)
        if stale is None:
            return
        stale.record = replace(stale.record, etag=record.etag, requested_by=record.requested_by)
        if stale.state is LeaseState.HANDING_OFF and stale.release_to and record.requested_by != stale.release_to:
            logger.info("processor %s: %s withdrew its request for partition %s (it stopped); releasing it instead",
                        self._describe, stale.release_to, stale.partition_id)
            stale.release_to = ""
        self._on_refreshed()

    # ----------------------------------------------------------------- saying it
    def changed(self, reason: str, partition_id: str, epoch: int, detail: str, level: int = logging.INFO) -> None:
        """One log line and one metric per ownership change, saying why. The structured
        fields (:data:`OWNERSHIP_LOG_FIELDS`) are attributes of the log record, for JSON
        formatters and OpenTelemetry's logging handler."""
        logger.log(level, "processor %s: partition %s %s (epoch %d): %s", self._describe, partition_id,
                   _REASON_WORDS.get(reason, reason), epoch, detail,
                   extra={"eventprocessor.owner_id": self._owner_id, "eventprocessor.partition_id": partition_id,
                          "eventprocessor.epoch": epoch, "eventprocessor.reason": reason,
                          "eventprocessor.eventhub_name": self._eventhub_name,
                          "eventprocessor.consumer_group": self._consumer_group})
        self._telemetry.ownership_changed(reason, partition_id)
