"""The load balancer: a pure function from an ownership snapshot to the claims to make.

It follows the design in the seed (expire stale owners, claim an unowned partition,
or steal one from an over-loaded owner, with the floor/ceiling rule ``P // N`` and
``P // N + 1`` where only ``P % N`` owners may hold the extra one) and adds one thing:
*coordination without messages*. Every processor that reads the same snapshot computes
the same plan and takes only its own share of it (the strategies:
:mod:`~eventprocessor._ownership.strategies`).

:func:`decide` runs in four steps, each a pure function:

1. judge the snapshot on the store's clock (:meth:`~eventprocessor._ownership.strategies.BalanceView.of`);
2. ask the configured strategy what to take (:data:`~eventprocessor._ownership.strategies.STRATEGIES`);
3. adjust that for measured load (:func:`moved_by_load`) and for warm standbys
   (:func:`preferring_standbys`);
4. turn it into claims and handoff requests (:func:`_claims`).

No I/O, no clock, no global ``random``: the snapshot carries the store's time and the
caller passes the RNG.
"""
from __future__ import annotations

import random
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from ..policies import LoadBalancingStrategy, LoadPolicy
from ..stores.records import Ownership, OwnershipListing, UnreadableOwnership, partition_sort_key
from .load_plan import MemberLoad, plan_moves
from .strategies import HANDOFF_PROPERTY, STRATEGIES, BalanceView, record_age

__all__ = ["BalanceDecision", "BalanceReport", "decide", "heirs", "moved_by_load", "preferring_standbys"]


@dataclass(frozen=True)
class BalanceReport:
    """What one balancing tick did. For logs, tests and the convergence benchmark."""

    owned: frozenset[str]
    claimed: frozenset[str]
    renewed: frozenset[str]
    stolen: Mapping[str, str]
    lost: frozenset[str]
    failed_claims: frozenset[str]
    requests: Mapping[str, int] = field(default_factory=dict)
    error: Exception | None = None
    duration: float = 0.0


@dataclass(frozen=True)
class BalanceDecision:
    """What one processor should do this tick.

    ``owned``: the live records the store says this processor owns (store etags).
    ``renewals``: the subset of ``owned`` to rewrite now, because they are older than
    the renewal age. ``claims``: new claims, each conditional on the store's etag for
    that partition (``None`` = create-if-absent), with the epoch already advanced.
    ``stolen_from``: for claims on live records, the owner they are taken from.
    """

    owned: tuple[Ownership, ...]
    renewals: tuple[Ownership, ...]
    claims: tuple[Ownership, ...]
    stolen_from: Mapping[str, str] = field(default_factory=dict)
    active_owners: int = 0
    expired: tuple[str, ...] = ()
    handoff_requests: tuple[Ownership, ...] = ()
    """Records to rewrite as they are but with ``requested_by`` = this processor: asks
    their live owners to hand the partitions over (graceful handoff)."""
    awaiting_handoff: tuple[str, ...] = ()
    """Partitions this processor asked for and is still waiting on."""
    ceiling: int | None = None
    """The most partitions the count plan can deal this processor while the members stay
    the ones this snapshot shows (``ceil(P / N)``); None when the plan is not by counts
    alone (the static strategy, balancing by load, warm standbys preferred). A processor
    that owns this many is never dealt more: only a request for one of its partitions, a
    steal or a change of members can give it work (see :mod:`.liveness`)."""


def moved_by_load(view: BalanceView, take: list[str], loads: Mapping[str, MemberLoad] | None,
                  policy: LoadPolicy) -> list[str]:
    """Balancing by load: partitions with a live owner move by
    :func:`~eventprocessor._ownership.load_plan.plan_moves` (from busy processors to idle
    ones, damped, every move a handoff request) instead of by counts; unowned ones are
    still dealt by counts. Until every live member has published a load, nothing moves."""
    members, active, owner_id = view.members or {}, view.active, view.owner_id
    take = [pid for pid in take if pid not in active]  # live owners' partitions move by load
    if loads is not None and all(member in loads for member in members):
        # Who owns what comes from the ownership records, not from the member records:
        # those are up to a heartbeat old, and a partition that moved since would move again.
        moves = plan_moves({member: loads[member] for member in members}, policy,
                           owners={pid: record.owner_id for pid, record in active.items()})
        take += sorted((pid for pid, target in moves.items() if target == owner_id and pid in active
                        and members.get(active[pid].owner_id, {}).get(HANDOFF_PROPERTY) == "1"),
                       key=partition_sort_key)
    return take


def preferring_standbys(view: BalanceView, take: list[str], preferred: Mapping[str, str]) -> list[str]:
    """Claimable partitions that ``preferred`` gives to a member (a caught-up standby) are
    left to it by everyone else, and claimed by it on top of its share."""
    owner_id, active = view.owner_id, view.active
    take = [pid for pid in take if pid in active or preferred.get(pid, owner_id) == owner_id]
    take += sorted((pid for pid, member in preferred.items() if member == owner_id and pid in view.wanted
                    and pid not in active and pid not in view.blocked and pid not in take), key=partition_sort_key)
    return take


@dataclass
class _Claims:
    claims: list[Ownership] = field(default_factory=list)
    requests: list[Ownership] = field(default_factory=list)
    awaiting: list[str] = field(default_factory=list)
    stolen_from: dict[str, str] = field(default_factory=dict)


def _claims(view: BalanceView, take: list[str], scope: tuple[str, str, str], handoff_timeout: float | None,
            requests_made: Mapping[str, float]) -> _Claims:
    """The claims (each conditional on the record's etag, the epoch advanced) and the
    handoff requests that take ``take``: a live owner that answers handoff requests is
    asked, and stolen from only if the request is ``handoff_timeout`` old."""
    out = _Claims()
    members, owner_id = view.members, view.owner_id
    for pid in take:
        current = view.active.get(pid)
        if current is not None and handoff_timeout is not None and members is not None \
                and members.get(current.owner_id, {}).get(HANDOFF_PROPERTY) == "1":
            # A live owner that can hand over: ask, and steal only if it does not answer.
            requester = current.requested_by
            if requester == owner_id:
                if requests_made.get(pid, 0.0) < handoff_timeout:
                    out.awaiting.append(pid)
                    continue
            elif requester and requester in members:
                out.awaiting.append(pid)  # another live member asked first; it is its move
                continue
            else:
                out.requests.append(replace(current, requested_by=owner_id))
                out.awaiting.append(pid)
                continue
        previous: Ownership | UnreadableOwnership | None = view.records.get(pid) or view.reclaimable.get(pid)
        out.claims.append(Ownership(
            *scope, partition_id=pid, owner_id=owner_id,
            etag=previous.etag if previous is not None else None,
            last_modified_time=previous.last_modified_time if previous is not None else None,
            # An unreadable record's epoch is unknown: the processor raises the claim
            # above every epoch it has seen, and the checkpoint fence above the stored one.
            epoch=(previous.epoch + 1) if isinstance(previous, Ownership) else 1,
        ))
        if current is not None:
            out.stolen_from[pid] = current.owner_id
    return out


def decide(
    listing: OwnershipListing,
    partition_ids: Collection[str],
    owner_id: str,
    *,
    fully_qualified_namespace: str,
    eventhub_name: str,
    consumer_group: str,
    strategy: LoadBalancingStrategy,
    expiration_interval: float,
    rng: random.Random,
    renew_after: float = 0.0,
    members: Mapping[str, Mapping[str, str]] | None = None,
    balance_factor: int = 1,
    handoff_timeout: float | None = None,
    requests_made: Mapping[str, float] | None = None,
    replica_count: int = 0,
    preferred: Mapping[str, str] | None = None,
    loads: Mapping[str, MemberLoad] | None = None,
    load_policy: LoadPolicy | None = None,
) -> BalanceDecision:
    """Decide this tick's claims and handoff requests for ``owner_id``.

    A record is live when its owner id is set and ``listing.server_time -
    last_modified_time <= expiration_interval``: expiry is judged on the store's clock.
    In ``BALANCED`` mode at most one new partition is claimed; in ``GREEDY`` mode up to
    the fair share; in ``STATIC`` mode the partitions of this member's ordinal (see
    :func:`static_assignment`).

    ``members`` maps the live member records (id → properties) when the store keeps
    them: processors that own nothing then count in the plan, and a member whose
    ``handoff`` property is ``"1"`` is asked to hand a partition over instead of having it
    stolen; the steal happens only if the request is ``handoff_timeout`` seconds old
    (``requests_made`` gives the age of this processor's pending requests). Without
    ``members`` (a store that keeps none), a processor that owns nothing is invisible
    and claims one partition first, as the seed's protocol does. ``balance_factor``
    is the imbalance tolerated before any partition moves between live owners.

    ``preferred`` maps claimable partitions (no live owner) to the member that should
    take them (a caught-up standby of a stateful partition, see
    :func:`~eventprocessor.state.replica.failover_plan`): everyone else leaves them alone,
    and that member claims them on top of its share (handoffs restore the balance later).

    With a ``load_policy`` (and ``members`` and their ``loads``): partitions with a live
    owner move by :func:`~eventprocessor._ownership.load_plan.plan_moves` (from busy processors to
    idle ones, damped, every move a handoff request) instead of by counts, each partition
    counted on the owner the ownership records name; unowned ones are still dealt by
    counts. Until every live member has published a load, nothing moves. (``renewals``
    are listed for the record only: the renewer renews on its own schedule.)

    Example::

        decision = decide(listing, ["0", "1", "2"], "me", fully_qualified_namespace="ns",
                          eventhub_name="hub", consumer_group="$default",
                          strategy=LoadBalancingStrategy.GREEDY, expiration_interval=60,
                          rng=random.Random(1))
    """
    view = BalanceView.of(listing, partition_ids, owner_id, expiration_interval=expiration_interval,
                          members=members, balance_factor=balance_factor, replica_count=replica_count)
    take = STRATEGIES[strategy](view, rng)
    if load_policy is not None and strategy is not LoadBalancingStrategy.STATIC and members is not None:
        take = moved_by_load(view, take, loads, load_policy)
    if preferred:
        take = preferring_standbys(view, take, preferred)
    made = _claims(view, take, (fully_qualified_namespace, eventhub_name, consumer_group), handoff_timeout,
                   requests_made or {})
    mine = tuple(sorted((view.active[p] for p in view.owned_by.get(owner_id, ())),
                        key=lambda r: partition_sort_key(r.partition_id)))
    active_owners = len(set(view.counts) | set(members or ()) | {owner_id})
    return BalanceDecision(
        owned=mine,
        renewals=tuple(r for r in mine if record_age(r, listing.server_time) >= renew_after),
        claims=tuple(made.claims),
        stolen_from=made.stolen_from,
        active_owners=active_owners,
        expired=tuple(sorted(view.expired, key=partition_sort_key)),
        handoff_requests=tuple(made.requests),
        awaiting_handoff=tuple(made.awaiting),
        ceiling=_ceiling(view.available, active_owners, strategy, load_policy, preferred),
    )


def _ceiling(available: int, owners: int, strategy: LoadBalancingStrategy, load_policy: LoadPolicy | None,
             preferred: Mapping[str, str] | None) -> int | None:
    """:attr:`BalanceDecision.ceiling`: ``ceil(P / N)`` when the plan deals by counts alone."""
    if strategy is LoadBalancingStrategy.STATIC or load_policy is not None or preferred:
        return None
    return -(-available // owners)


def heirs(partition_ids: Collection[str], listing: OwnershipListing, owner_id: str, *,
          expiration_interval: float, members: Mapping[str, Mapping[str, str]] | None) -> dict[str, str]:
    """The live peer each of ``partition_ids`` (this processor's partitions whose lease ran
    out under a handler that never returned) is handed to: the one that owns the fewest
    live records, ties by id, counting each hand-over as it is dealt. The peers are the
    live members other than ``owner_id`` (the live owners, when the store keeps no
    members). Empty when no peer is live."""
    counts: dict[str, int] = {member: 0 for member in (members or ()) if member != owner_id}
    for record in listing.ownerships:
        if record.owner_id and record.owner_id != owner_id and (members is None or record.owner_id in counts) \
                and record_age(record, listing.server_time) <= expiration_interval:
            counts[record.owner_id] = counts.get(record.owner_id, 0) + 1
    dealt: dict[str, str] = {}
    if not counts:
        return dealt
    for pid in sorted(partition_ids, key=partition_sort_key):
        peer = min(counts, key=lambda owner: (counts[owner], owner))
        counts[peer] += 1
        dealt[pid] = peer
    return dealt
