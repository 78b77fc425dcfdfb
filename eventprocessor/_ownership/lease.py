"""The life cycle of one claim of one partition, and the pure function that keeps the
local leases in line with what the store says.

States (a lease only ever moves forward along these arrows)::

    CLAIMING ──won and fenced──▶ OWNED ──asked to hand over──▶ HANDING_OFF
        │                          │                               │
        │                          └──────────▶ RELEASING ◀────────┘
        └──lost or failed──▶ RELEASED ◀──pump gone── RELEASING

* ``CLAIMING``: the claim (or the adoption of a record that names this processor) is
  being written and the checkpoint fenced. Nothing is dispatched yet.
* ``OWNED``: the claim is current, a pump is live, the renewer keeps the record fresh.
* ``HANDING_OFF``: another processor asked for the partition; the pump finishes its
  batch, checkpoints and closes, then the record is written over to the claimer.
* ``RELEASING``: the claim is ending (stop, lost, self-fenced, pump ended); the pump is
  stopping. Nothing is dispatched.
* ``RELEASED``: the pump is gone. If the end calls for it, the record has been released
  (to nobody, or to the claimer of a handoff); otherwise it is left to expire.

Two rules hold by construction and are property-tested (``tests/test_lease.py``): a
lease is never renewed once its pump has ended, and a partition is never ``OWNED``
without a live pump, because :func:`reconcile` ends such a lease first.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Protocol

from ..events import Event
from ..partition import PartitionContext
from ..policies import CloseReason
from ..stores.records import Ownership

__all__ = ["Pump", "LeaseState", "LeaseEnd", "Lease", "LeaseView", "Snapshot", "Transition", "Reconciliation",
           "reconcile", "ALLOWED"]


TAKEN_OVER = "its receiver or a checkpoint found another owner"
"""Why a lease marked lost ended, unless its records vanished from the store."""

class Pump(Protocol):
    """What the ownership side needs of a claim's pump (the delivery layer's
    :class:`~eventprocessor._delivery.pump.PartitionPump`): whether it still runs, how to
    stop it, where its errors go, and the counters the load meter reads."""

    @property
    def alive(self) -> bool: ...

    @property
    def context(self) -> PartitionContext: ...

    @property
    def events_dispatched(self) -> int: ...

    @property
    def bytes_dispatched(self) -> int: ...

    @property
    def last_completed(self) -> Event | None: ...

    def in_flight(self) -> tuple[int, int, Event | None] | None:
        """With many events in flight: (calls in flight, events held beyond the
        checkpoint, the oldest event not done); None otherwise."""
        ...

    def stop(self, reason: CloseReason) -> None: ...

    def report_error(self, error: Exception) -> None: ...


class LeaseState(enum.Enum):
    """Where one claim of one partition is in its life cycle (see the module docstring)."""

    CLAIMING = "claiming"
    OWNED = "owned"
    HANDING_OFF = "handing_off"
    RELEASING = "releasing"
    RELEASED = "released"


ALLOWED: Mapping[LeaseState, frozenset[LeaseState]] = {
    LeaseState.CLAIMING: frozenset({LeaseState.OWNED, LeaseState.RELEASED}),
    LeaseState.OWNED: frozenset({LeaseState.HANDING_OFF, LeaseState.RELEASING}),
    LeaseState.HANDING_OFF: frozenset({LeaseState.RELEASING}),
    LeaseState.RELEASING: frozenset({LeaseState.RELEASED}),
    LeaseState.RELEASED: frozenset(),
}
"""The only transitions a lease may make."""


class LeaseEnd(enum.Enum):
    """Why a claim ends. Decides the handler's close reason and whether the record is
    written when the pump is gone."""

    SHUTDOWN = "the processor is stopping"
    HANDOFF = "handed over to the processor that asked for it"
    LOST = "another processor owns it now"
    EXPIRED = "the lease ran out before it could be renewed (self-fenced)"
    PUMP_ENDED = "its pump ended"
    STORE_LOST = "its record vanished from the store or went backwards"

    @property
    def close_reason(self) -> CloseReason:
        if self is LeaseEnd.SHUTDOWN:
            return CloseReason.SHUTDOWN
        if self is LeaseEnd.HANDOFF:
            return CloseReason.HANDOFF
        return CloseReason.OWNERSHIP_LOST


class Lease:
    """One claim of one partition by this processor (mutable; owned by the processor).

    ``deadline`` and ``renew_at`` are local monotonic times, measured from the moment the
    last write the store accepted was *sent*, so the lease always ends before any other
    processor could see the record expired. ``confirmed_at`` is when that write's answer
    arrived: a listing sent after it reflects the write.
    """

    def __init__(self, record: Ownership, *, now: float) -> None:
        self.partition_id = record.partition_id
        self.record = record
        self.state = LeaseState.CLAIMING
        self.claimed_at = now
        self.deadline = now
        self.renew_at = now
        self.confirmed_at = now
        self.pump: Pump | None = None
        self.end: LeaseEnd | None = None
        self.end_detail = ""
        self.release_to: str | None = None  # owner id to write once the pump is gone; None = no write
        self.handed_over_hung = False  # ran out, its handler never returned: its record was handed to a peer
        self.hung_warned = False  # said once that no peer could take it
        self.renewal_failures = 0
        self.lost = False  # the pump or a checkpoint learned that another processor owns it
        self.lost_because = TAKEN_OVER

    def __repr__(self) -> str:
        return (f"Lease(partition_id={self.partition_id!r}, state={self.state.value}, epoch={self.epoch}, "
                f"end={self.end.name if self.end else None})")

    @property
    def epoch(self) -> int:
        return self.record.epoch

    @property
    def pump_alive(self) -> bool:
        return self.pump is not None and self.pump.alive

    def dispatchable(self, now: float) -> bool:
        """May the pump hand a batch to the handler now?"""
        return self.state is LeaseState.OWNED and now < self.deadline

    def renewable(self, now: float) -> bool:
        """May the renewer rewrite the record now? Never once the pump has ended."""
        return (self.state in (LeaseState.OWNED, LeaseState.HANDING_OFF) and self.pump_alive and not self.lost
                and now < self.deadline)

    def may_checkpoint(self, now: float) -> bool:
        """May the handler write a checkpoint now? While owned, and while closing after a
        stop or a handoff (so ``close`` can checkpoint), as long as the lease is valid."""
        if self.lost or now >= self.deadline:
            return False
        if self.state in (LeaseState.OWNED, LeaseState.HANDING_OFF):
            return True
        return self.state is LeaseState.RELEASING and self.end in (LeaseEnd.SHUTDOWN, LeaseEnd.HANDOFF)

    def move(self, state: LeaseState) -> None:
        if state not in ALLOWED[self.state]:
            raise RuntimeError(f"lease of partition {self.partition_id}: {self.state.value} -> {state.value} "
                               "is not a transition of the life cycle")
        self.state = state

    def confirm(self, record: Ownership, *, sent_at: float, answered_at: float, lease_length: float,
                renewal_age: float) -> None:
        """The store accepted a write of ours that was sent at ``sent_at``."""
        self.record = record
        self.deadline = sent_at + lease_length
        self.renew_at = sent_at + renewal_age
        self.confirmed_at = answered_at
        self.renewal_failures = 0

    def view(self) -> LeaseView:
        return LeaseView(self.partition_id, self.state, self.record, self.deadline, self.confirmed_at,
                         self.pump_alive, self.lost, self.release_to, self.lost_because)


@dataclass(frozen=True)
class LeaseView:
    """What :func:`reconcile` needs to know about one local lease."""

    partition_id: str
    state: LeaseState
    record: Ownership
    deadline: float
    confirmed_at: float
    pump_alive: bool
    lost: bool = False
    release_to: str | None = None
    lost_because: str = TAKEN_OVER


@dataclass(frozen=True)
class Snapshot:
    """One ownership listing: the records by partition, the partitions whose record is
    unreadable, the store's clock, and the local time the listing request was sent."""

    records: Mapping[str, Ownership]
    server_time: datetime
    sent_at: float
    unreadable: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Transition:
    """Move the lease of ``partition_id`` to ``to``. When it ends, ``end`` says why and
    ``release_to`` which owner id to write once the pump is gone (``""``: release to
    nobody; ``None``: leave the record to expire)."""

    partition_id: str
    to: LeaseState
    end: LeaseEnd | None = None
    detail: str = ""
    release_to: str | None = None


@dataclass(frozen=True)
class Reconciliation:
    """What the local leases must do to agree with the store and the clock.

    ``transitions``: leases that change state. ``refresh``: records that still name this
    processor with the lease's epoch but were rewritten since its last write (a handoff
    request); the lease takes their etag, never a longer deadline. ``adopt``: live
    records that name this processor but that it holds no lease for (a claim whose answer
    was lost, a partition handed over to it); they are renewed before use.
    ``reclaim``: claims (epoch raised, conditional on the etag) of live records that name
    this processor at the epoch of a claim of its own that has ended (its lease ran out,
    or its checkpoint was refused, while its heartbeat kept the record live): never
    resumed at that epoch, so nothing is handed to the ended claim again.
    ``store_lost``: partitions whose record vanished or went backwards.
    """

    transitions: tuple[Transition, ...] = ()
    refresh: tuple[Ownership, ...] = ()
    adopt: tuple[Ownership, ...] = ()
    reclaim: tuple[Ownership, ...] = ()
    store_lost: tuple[str, ...] = ()


def _judge_against_store(lease: LeaseView, snapshot: Snapshot, owner_id: str) -> Transition | None:
    """A lease the snapshot can speak for (its last write was answered before the
    listing was sent): does the store still say it is ours?"""
    pid = lease.partition_id
    record = snapshot.records.get(pid)
    if record is None:
        if pid in snapshot.unreadable:
            return Transition(pid, LeaseState.RELEASING, LeaseEnd.LOST, "its record was overwritten with "
                              "something unreadable")
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.STORE_LOST, "its ownership record is gone")
    if record.epoch < lease.record.epoch:
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.STORE_LOST,
                          f"its record went back from epoch {lease.record.epoch} to {record.epoch}")
    if record.epoch > lease.record.epoch or record.owner_id != owner_id:
        holder = record.owner_id or "nobody"
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.LOST,
                          f"the store says {holder} owns it (epoch {record.epoch})")
    if record.requested_by and lease.state is LeaseState.OWNED:
        return Transition(pid, LeaseState.HANDING_OFF, LeaseEnd.HANDOFF, f"{record.requested_by} asked for it",
                          release_to=record.requested_by)
    return None


def _ended_by_itself(lease: LeaseView, now: float) -> Transition | None:
    """An ``OWNED`` or ``HANDING_OFF`` lease that ends whatever the store says: its pump or
    a checkpoint learned the partition is lost, its pump is gone, or its time ran out."""
    pid = lease.partition_id
    if lease.lost:
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.LOST, lease.lost_because)
    if lease.state is LeaseState.HANDING_OFF and not lease.pump_alive:
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.HANDOFF, "its pump finished",
                          release_to=lease.release_to)
    if not lease.pump_alive:
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.PUMP_ENDED, "its pump ended",
                          release_to="" if now < lease.deadline else None)
    if now >= lease.deadline:
        return Transition(pid, LeaseState.RELEASING, LeaseEnd.EXPIRED, "the lease ran out before a renewal succeeded")
    return None


def _paced(verdict: Transition | None, handoffs: int | None) -> tuple[Transition | None, int | None]:
    """A handoff request is answered only while the pace allows (``handoffs`` left, None:
    any); one over it waits for a later snapshot. Returns the verdict and what is left."""
    if verdict is None or verdict.to is not LeaseState.HANDING_OFF or handoffs is None:
        return verdict, handoffs
    if handoffs <= 0:
        return None, handoffs
    return verdict, handoffs - 1


def _adoptions(snapshot: Snapshot, held: Mapping[str, LeaseView], owner_id: str, expiration: float) -> list[Ownership]:
    """Live records that name ``owner_id`` but that it holds no lease for (or only a
    released one)."""
    adopt: list[Ownership] = []
    for pid, record in snapshot.records.items():
        holding = held.get(pid)
        if record.owner_id != owner_id or (holding is not None and holding.state is not LeaseState.RELEASED):
            continue
        if record.last_modified_time is None:
            continue
        if (snapshot.server_time - record.last_modified_time).total_seconds() > expiration:
            continue  # expired: the balancer claims it like any other
        adopt.append(record)
    return adopt


def reconcile(leases: Iterable[LeaseView], *, now: float, owner_id: str, snapshot: Snapshot | None = None,
              expiration: float = float("inf"), handoffs: int | None = None,
              ended_epochs: Mapping[str, int] | None = None) -> Reconciliation:
    """Compare the local leases with the clock and (optionally) a store snapshot.

    Pure: no I/O, no clock reads, no randomness. Rules, in order, for a lease that is
    ``OWNED`` or ``HANDING_OFF``:

    1. its pump has ended → ``RELEASING`` (release to nobody while the lease is valid, so
       that the partition is taken again at once);
    2. ``now`` is past its deadline → ``RELEASING``, self-fenced, record left to expire;
    3. if the snapshot was sent after the lease's last write was answered: the record is
       gone or its epoch went down → ``RELEASING`` (store lost); another owner or a higher
       epoch → ``RELEASING`` (lost); a handoff request while ``OWNED`` → ``HANDING_OFF``
       (at most ``handoffs`` of them, None: all; the others keep their requests, taking the
       record's etag, and are judged again by a later snapshot), writing the record over
       to the requester once the pump is gone.

    Before those: a lease whose pump or checkpoint learned that the partition is lost →
    ``RELEASING`` (lost); a ``HANDING_OFF`` lease whose pump is gone → ``RELEASING``,
    still handing over. A ``RELEASING`` lease whose pump is gone → ``RELEASED``. Live
    records that name ``owner_id`` but have no lease (or only a released one) are adopted,
    unless their epoch is at most that of a claim of ``owner_id`` that ended
    (``ended_epochs``: partition -> epoch): those are reclaimed above it.
    """
    transitions: list[Transition] = []
    refresh: list[Ownership] = []
    store_lost: list[str] = []
    held: dict[str, LeaseView] = {}
    for lease in leases:
        held[lease.partition_id] = lease
        pid = lease.partition_id
        if lease.state is LeaseState.RELEASING:
            if not lease.pump_alive:
                transitions.append(Transition(pid, LeaseState.RELEASED))
            continue
        if lease.state not in (LeaseState.OWNED, LeaseState.HANDING_OFF):
            continue
        ended = _ended_by_itself(lease, now)
        if ended is not None:
            transitions.append(ended)
            continue
        if snapshot is None or lease.confirmed_at > snapshot.sent_at:
            continue  # the listing may predate our last write: it cannot judge this lease
        verdict, handoffs = _paced(_judge_against_store(lease, snapshot, owner_id), handoffs)
        if verdict is not None:
            transitions.append(verdict)
            if verdict.end is LeaseEnd.STORE_LOST:
                store_lost.append(pid)
        record = snapshot.records.get(pid)
        if (verdict is None or verdict.to is LeaseState.HANDING_OFF) and record is not None \
                and record.etag != lease.record.etag:
            refresh.append(record)
    adopt = _adoptions(snapshot, held, owner_id, expiration) if snapshot is not None else []
    last_ended = ended_epochs or {}
    resumable = [r for r in adopt if r.epoch > last_ended.get(r.partition_id, -1)]
    reclaim = [replace(r, epoch=r.epoch + 1, requested_by="") for r in adopt if r not in resumable]
    return Reconciliation(
        transitions=tuple(transitions),
        refresh=tuple(refresh),
        adopt=tuple(sorted(resumable, key=lambda r: r.partition_id)),
        reclaim=tuple(sorted(reclaim, key=lambda r: r.partition_id)),
        store_lost=tuple(store_lost),
    )
