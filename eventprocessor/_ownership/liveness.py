"""Liveness per processor: one heartbeat keeps all of a processor's partitions, and a
tick that finds nothing changed reads no ownership record.

The records
===========
* **Ownership records** (one per partition) are written only when ownership changes: a
  claim, a steal, a handoff request, a handoff, a release. Every such write is
  conditional on the etag and raises or keeps the epoch exactly as before, so every
  partition stays fenced by its epoch.
* **Member records** (one per processor) are rewritten every heartbeat (``E/4``). A
  member record carrying ``lease=member`` (:data:`LEASE_PROPERTY`) says: *my heartbeat
  keeps all my partitions*. A record it owns is then live while ``max(record's
  last-modified, its owner's heartbeat) `` is younger than the expiration E on the
  store's clock (:func:`with_heartbeats`); the balancer and the lease table judge
  expiry from that, nothing else changes.
* **The change notice** (``.generation`` among the member records, so one listing of
  the members returns it): every processor that wins an ownership write rewrites it
  (:meth:`~eventprocessor.stores.contract.OwnershipStore.announce_change`), so its etag,
  the ``generation``, changes.

* **Nudges** (:data:`NUDGE_PROPERTY` of a member record): a processor whose ownership
  write concerns another one (it asks it for a partition, takes one from it, hands one
  to it) rewrites its member record at once, naming that processor
  (:func:`encode_nudge`). Every tick reads the member records, so the one named sees it
  at its next tick, at a cost that does not grow with P.

A tick
======
At rest a tick costs one request: list the members (N small records and the
generation). It lists the ownership records too only when something may have changed
(:class:`ChangeWatch`): the generation differs from the last one seen, a member
joined, left or crossed E/2 (leaves the plans) or E (its partitions expire), a member
record nudges this processor anew, the partition ids changed, one of this processor's
leases moved on, the previous tick had work left (claims, handoff requests it waits
on, failures), the renewer asked (``wake``), a record that no heartbeat keeps (an
unreadable one, a foreign owner's, one written after its owner's last heartbeat by an
owner whose heartbeat is no longer live) reaches its expiry (:func:`next_expiry`), or
the safety net is due
(:func:`full_listing_interval`).

**A settled processor ignores the generation.** After a listing that left it owning
the most partitions any processor can be dealt with the members it saw (the count
plan's ceiling, :attr:`~eventprocessor._ownership.balancer.BalanceDecision.ceiling`),
with every claim of the tick won and nothing asked for or awaited, no change notice
can give it work while the members stay the same: the plan never deals it more, and
whoever wants one of its partitions asks for it or takes it, and nudges it. So while a
group forms, the processors that already hold their share stop listing P records at
every other processor's claim: a cold start of N processors costs about one listing
each instead of one per processor per change.

Safety
======
* **Cut off from the store.** A heartbeat the store accepted, sent at local time h,
  extends every owned lease to ``h + E - margin`` (never beyond). Peers judge the
  member expired only when ``server_now - heartbeat > E`` on the store's clock; the
  margin (``max(2 s, E/10)``) covers the one-second timestamps and clock drift. So a
  processor that cannot reach the store self-fences every partition (its pumps stop
  dispatching) before anyone may judge it expired, exactly as with one lease per
  record. A lease whose pump ended is never extended.
* **A lease of its own that ran out** while the heartbeat went on leaves a live record
  naming this processor at the ended claim's epoch: it is claimed again one epoch up,
  never resumed (:func:`~eventprocessor._ownership.lease.reconcile`, ``reclaim``). If its
  handler never returns (the pump never ends), the record is handed to the live peer that
  owns the fewest, one epoch up, on its etag, once it would have expired by itself (the
  safety margin after the lease's end), so the heartbeat does not keep the partition
  from its peers for good (:meth:`~eventprocessor._ownership.taker.Taker._hand_over_hung`).
* **Taking an expired member's partitions.** Its records are claimed as any expired
  record: epoch raised, If-Match the etag listed, then the checkpoint is fenced.
* **A lost nudge** (the nudging member write failed, or a heartbeat in flight
  overwrote it): the nudged processor, if settled, sees the change at the next
  announcement it does not ignore, the next heartbeat of the nudging processor (which
  carries the nudge again, within E/4), or the safety net; the handoff request it
  missed turns into a steal after ``handoff_timeout``, fenced as every steal.
* **A lost change notice** (a writer crashed between its record write and the
  announcement): a steal or a release stays unseen by the others until the next
  announcement by anyone or the safety net, a full listing every
  ``max(4·E, 60 s)`` (5 min with the defaults), jittered. Only progress waits: expiry
  is judged from member records, which every tick reads, and an owner whose partition
  was stolen without notice is still stopped by the epoch (its receiver is
  disconnected by the new owner's, its next checkpoint fails on the fence).
* **A group mixed with azure-eventhub's processor.** That processor judges every record
  by its own age and renews per partition; it neither writes member records nor
  announces changes. A live record it wrote (it drops this SDK's metadata: epoch 0)
  whose owner has no member record, or a live member record without ``lease=member``
  (an older version of this SDK), is a *foreign* owner
  (:func:`foreign_owners`). With ``ownership_renewal="auto"`` (the default) a processor
  that sees one renews each owned record per partition again (every renewal age) and
  lists ownership every tick, until no foreign owner has been seen for E. Until it
  sees one (an official processor that owns nothing yet), its records are not renewed,
  so an official processor joining a group at rest takes every record older than its
  own ``ownership_timeout``: our owners notice at their next listing (the official
  processor does not announce: at the safety net at the latest, or at their next
  checkpoint, which the official processor's unconditional checkpoint write fails).
  Groups that will mix set ``ownership_renewal="partition"``; the drop-in for
  ``EventHubConsumerClient``, which shares azure-eventhub's blob layout, does so by
  default.
"""
from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from .._runtime.timing import Timing
from ..stores.records import MemberListing, OwnershipListing

__all__ = ["LEASE_PROPERTY", "MEMBER_LEASES", "NUDGE_PROPERTY", "encode_nudge", "nudged_by", "heartbeats",
           "with_heartbeats", "foreign_owners", "next_expiry", "full_listing_interval", "ChangeWatch", "RenewalMode"]

logger = logging.getLogger(__name__)

LEASE_PROPERTY = "lease"
"""Member property: ``member`` when the member's heartbeat keeps all its partitions."""
MEMBER_LEASES = "member"


NUDGE_PROPERTY = "nudge"
"""Member property: ``<sequence>:<digest>,<digest>...``, the processors this member's
latest ownership write concerned (each id as a 12-hex-digit digest: any id fits in a
record's properties)."""


def _digest(owner_id: str) -> str:
    return hashlib.blake2b(owner_id.encode("utf-8"), digest_size=6).hexdigest()


def encode_nudge(sequence: int, owners: Iterable[str]) -> str:
    """The :data:`NUDGE_PROPERTY` value of a member's ``sequence``-th nudge of ``owners``."""
    return f"{sequence}:" + ",".join(sorted(_digest(owner) for owner in owners))


def nudged_by(members: MemberListing, owner_id: str) -> frozenset[tuple[str, str]]:
    """(member, sequence) of each member record whose latest nudge names ``owner_id``."""
    mine = _digest(owner_id)
    found = set()
    for member in members.members:
        sequence, _, digests = member.properties.get(NUDGE_PROPERTY, "").partition(":")
        if mine in digests.split(","):
            found.add((member.owner_id, sequence))
    return frozenset(found)


def heartbeats(members: MemberListing | None) -> dict[str, datetime]:
    """Owner id -> last heartbeat, of the members whose heartbeat keeps their partitions."""
    if members is None:
        return {}
    return {m.owner_id: m.last_modified_time for m in members.members
            if m.last_modified_time is not None and m.properties.get(LEASE_PROPERTY) == MEMBER_LEASES}


def with_heartbeats(listing: OwnershipListing, beats: Mapping[str, datetime]) -> OwnershipListing:
    """``listing`` with each owned record's last-modified time raised to its owner's last
    heartbeat: the time liveness is judged from (pure)."""
    if not beats:
        return listing
    records = []
    for record in listing.ownerships:
        beat = beats.get(record.owner_id) if record.owner_id else None
        if beat is not None and (record.last_modified_time is None or beat > record.last_modified_time):
            record = replace(record, last_modified_time=beat)
        records.append(record)
    return replace(listing, ownerships=tuple(records))


def foreign_owners(listing: OwnershipListing, members: MemberListing | None, expiration: float) -> set[str]:
    """Owners that judge records by their own age: owners of live records written by
    azure-eventhub's processor (it drops this SDK's metadata, so they read as epoch 0;
    ours never claim below 1) that have no member record, and live members whose
    heartbeat does not keep their partitions (an older version of this SDK). A processor
    of ours whose member record could not be written yet is not one: its records carry
    epochs, and it renews them one by one until its heartbeat is written."""
    if members is None:
        return set()
    known = {m.owner_id for m in members.members}
    now = listing.server_time
    foreign = {r.owner_id for r in listing.ownerships
               if r.owner_id and r.epoch == 0 and r.owner_id not in known and r.last_modified_time is not None
               and (now - r.last_modified_time).total_seconds() <= expiration}
    foreign |= {m.owner_id for m in members.members
                if m.last_modified_time is not None and m.properties.get(LEASE_PROPERTY) != MEMBER_LEASES
                and (members.server_time - m.last_modified_time).total_seconds() <= expiration}
    return foreign


def next_expiry(listing: OwnershipListing, beats: Mapping[str, datetime], expiration: float) -> float | None:
    """Seconds from the listing (with :func:`with_heartbeats` applied) until the first
    owned record expires that its owner's heartbeat does not keep: an owner that renews
    per partition, an unreadable record, or a record written after its owner's last
    heartbeat by an owner whose heartbeat is no longer live (a claim by a processor that
    then crashed); None if there is none. A record whose owner's heartbeat is live is
    kept by that owner's next heartbeat, or, if none comes, its member record expires,
    which every tick sees, and the listing that change brings finds the record's own
    expiry. So a burst of claims (a cold start) does not make every processor list P
    records again when the claims' own times run out."""
    now = listing.server_time

    def kept(owner_id: str, modified: datetime | None) -> bool:
        beat = beats.get(owner_id)
        return beat is not None and (beat == modified or (now - beat).total_seconds() <= expiration)

    times = [r.last_modified_time for r in listing.ownerships
             if r.owner_id and not kept(r.owner_id, r.last_modified_time)]
    times += [u.last_modified_time for u in listing.unreadable]
    left = [expiration - (now - t).total_seconds() for t in times if t is not None]
    left = [seconds for seconds in left if seconds >= 0]
    return min(left) if left else None


def full_listing_interval(expiration: float) -> float:
    """The safety net: a processor that skips listings lists every record at least this
    often (``max(4·E, 60 s)``), in case a change notice was lost."""
    return Timing.full_listing_interval_for(expiration)


@dataclass(frozen=True)
class _Seen:
    generation: str | None
    in_plans: frozenset[str]  # members younger than E/2
    keeping: frozenset[str]  # members younger than E
    properties: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] | None  # when plans read them
    partition_ids: tuple[str, ...]
    owned: frozenset  # what this processor could dispatch, and its leases' states
    nudges: frozenset[tuple[str, str]]  # (member, sequence) of the nudges naming this processor


class ChangeWatch:
    """Decides whether a tick may skip the ownership listing (see the module docstring).

    ``member_expiration`` and ``expiration`` are the two ages a member crosses;
    ``watch_properties`` makes any change of a member's properties a change (balancing
    by load, warm standbys: plans read them)."""

    def __init__(self, *, expiration: float, member_expiration: float, rng: random.Random,
                 watch_properties: bool = False, owner_id: str = "") -> None:
        self._expiration = expiration
        self._member_expiration = member_expiration
        self._rng = rng
        self._watch_properties = watch_properties
        self._owner_id = owner_id
        self._seen: _Seen | None = None
        self._work_left = True
        self._settled = False
        self._next_full = float("-inf")

    @property
    def settled(self) -> bool:
        """The last listing left this processor settled: change notices alone are ignored."""
        return self._settled

    def invalidate(self) -> None:
        """List at the next tick (a renewal lost its write, a lease ended)."""
        self._work_left = True

    def _view(self, members: MemberListing, partition_ids: Sequence[str], owned: frozenset) -> _Seen:
        now = members.server_time
        ages = {m.owner_id: (now - m.last_modified_time).total_seconds() for m in members.members
                if m.last_modified_time is not None}
        properties = None
        if self._watch_properties:
            properties = tuple(sorted((m.owner_id, tuple(sorted(m.properties.items()))) for m in members.members))
        return _Seen(members.generation, frozenset(o for o, age in ages.items() if age <= self._member_expiration),
                     frozenset(o for o, age in ages.items() if age <= self._expiration), properties,
                     tuple(partition_ids), owned, nudged_by(members, self._owner_id))

    def unchanged(self, members: MemberListing, partition_ids: Sequence[str], now: float,
                  owned: frozenset) -> bool:
        """Whether a tick that listed ``members`` may skip the ownership listing (``owned``:
        what this processor may dispatch now; a lease that ended since is a change). A
        settled processor ignores the change notice (see the module docstring)."""
        if self._work_left or self._seen is None or now >= self._next_full:
            return False
        view = self._view(members, partition_ids, owned)
        if self._settled:
            view = replace(view, generation=self._seen.generation)
        return view == self._seen

    def listed(self, members: MemberListing, partition_ids: Sequence[str], now: float, *, work_left: bool,
               owned: frozenset, expires_in: float | None = None, settled: bool = False) -> None:
        """A full listing was made, after ``members`` had been listed: remember what it
        saw, whether the tick left work for the next one, whether it left this processor
        settled, and when a record it saw expires by its own age (``expires_in``
        seconds: list again then)."""
        self._next_full = now + full_listing_interval(self._expiration) * self._rng.uniform(0.75, 1.0)
        if expires_in is not None:
            self._next_full = min(self._next_full, now + expires_in)
        self._seen = self._view(members, partition_ids, owned)
        self._work_left = work_left and not settled
        self._settled = settled


class RenewalMode:
    """Which way this processor keeps its partitions now: by its heartbeat, or by
    rewriting each record (and listing every tick). ``per_partition`` is True with
    ``ownership_renewal="partition"``, when the store keeps no member records or takes
    no change notices (``members()``, ``announcing()``: None while unknown), and, with
    ``"auto"``, for E after a foreign owner was seen. ``on_changed()`` is called when a
    foreign owner turns it on (the renewer has records to rewrite)."""

    def __init__(self, *, mode: str, expiration: float, now: Callable[[], float], describe: str,
                 members: Callable[[], bool | None], announcing: Callable[[], bool | None]) -> None:
        self._mode = mode
        self._expiration = expiration
        self._now = now
        self._describe = describe
        self._members = members
        self._announcing = announcing
        self._foreign_until = float("-inf")
        self.on_changed: Callable[[], None] = lambda: None

    @property
    def per_partition(self) -> bool:
        if self._mode == "partition" or not self._members() or self._announcing() is False:
            return True
        return self._mode == "auto" and self._now() < self._foreign_until

    def note(self, listing: OwnershipListing, members: MemberListing | None) -> None:
        """Look for owners that judge records by their own age in a full listing."""
        foreign = foreign_owners(listing, members, self._expiration)
        if not foreign:
            return
        was = self.per_partition
        self._foreign_until = self._now() + self._expiration
        if not was and self._mode == "auto":
            logger.warning("processor %s: %s judge ownership by each record's age (azure-eventhub's processor, or an "
                           "older version of this SDK); renewing every owned record again and listing ownership "
                           "every tick until none has been seen for %g s", self._describe, sorted(foreign),
                           self._expiration)
            self.on_changed()
