"""The balancing strategies: one pure function each, behind one signature.

A strategy reads one ownership snapshot, judged on the store's clock
(:class:`BalanceView`), and says which partitions this processor should take now, in
order; :func:`~eventprocessor._ownership.balancer.decide` runs the one the processor was
configured with (:data:`STRATEGIES`), adjusts its answer for load and for warm standbys,
and turns it into claims and handoff requests.

* :func:`greedy` and :func:`balanced` deal by counts: the plan every reader of the same
  snapshot agrees on (floor ``P // N``, ceiling ``P // N + 1`` for the ``P % N`` owners that
  already hold the most; unowned partitions first, then the surplus of over-loaded owners,
  served round-robin, neediest first). ``greedy`` takes its whole share in one tick,
  ``balanced`` at most one partition. Processors that tick at the same moment therefore
  claim different partitions instead of racing for the same random one. An unowned
  partition goes first to its *home* (:func:`homes`: a deal that depends on the members
  and partitions only), so processors whose snapshots were taken at different moments
  of a cold start, each with other claims landed, still claim different partitions.
* :func:`static` takes the partitions of this processor's ordinal
  (:func:`static_assignment`).

The randomness the seed asks for is still there: the order in which unowned partitions
are handed out is a pseudo-random permutation (a hash of the partition id), the same for
every reader; and a processor that owns nothing and has no member record is invisible to
the others, so it picks at random, with the injected RNG, among the partitions the
visible owners are not about to take.

Example::

    view = BalanceView.of(listing, ["0", "1", "2"], "me", expiration_interval=60)
    take = STRATEGIES[LoadBalancingStrategy.GREEDY](view, random.Random(1))
"""
from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from ..policies import LoadBalancingStrategy
from ..stores.records import Ownership, OwnershipListing, UnreadableOwnership, partition_sort_key

__all__ = ["BalanceView", "Strategy", "STRATEGIES", "greedy", "balanced", "static", "fair_share", "homes",
           "static_assignment", "record_age", "HANDOFF_PROPERTY", "ORDINAL_PROPERTY"]

HANDOFF_PROPERTY = "handoff"
"""Member property: ``"1"`` when the member answers handoff requests."""
ORDINAL_PROPERTY = "ordinal"
"""Member property: the member's ordinal, for the STATIC strategy."""


def record_age(record: Ownership, now: datetime) -> float:
    """Seconds since ``record`` was written, by the store's clock ``now`` (infinite if never)."""
    if record.last_modified_time is None:
        return float("inf")
    return (now - record.last_modified_time).total_seconds()


@dataclass(frozen=True)
class BalanceView:
    """One ownership snapshot as a strategy reads it (see :meth:`of`).

    ``active``: the live records of the wanted partitions; ``expired``: partitions whose
    record (readable or not) has expired; ``blocked``: partitions held by an unreadable
    record that has not expired (they count for nobody's share); ``reclaimable``: expired
    unreadable records, claimed over their etag; ``owned_by``/``counts``: the live owners'
    partitions; ``unowned``: partitions with no live owner and no block; ``members``: the
    live member records (id -> properties), or None when the store keeps none;
    ``visible``: this processor has a member record the others can see.
    """

    owner_id: str
    wanted: frozenset[str]
    records: Mapping[str, Ownership]
    active: Mapping[str, Ownership]
    expired: tuple[str, ...]
    blocked: frozenset[str]
    reclaimable: Mapping[str, UnreadableOwnership]
    owned_by: Mapping[str, list[str]]
    counts: Mapping[str, int]
    unowned: tuple[str, ...]
    available: int
    members: Mapping[str, Mapping[str, str]] | None
    visible: bool
    balance_factor: int = 1
    replica_count: int = 0

    @staticmethod
    def of(listing: OwnershipListing, partition_ids: Collection[str], owner_id: str, *,
           expiration_interval: float, members: Mapping[str, Mapping[str, str]] | None = None,
           balance_factor: int = 1, replica_count: int = 0) -> BalanceView:
        """Judge ``listing`` on the store's clock: a record is live when its owner id is set
        and ``listing.server_time - last_modified_time <= expiration_interval``."""
        now = listing.server_time
        wanted = set(partition_ids)
        records: dict[str, Ownership] = {}
        for record in listing.ownerships:
            if record.partition_id in wanted:
                records[record.partition_id] = record
        active: dict[str, Ownership] = {}
        expired: list[str] = []
        for pid, record in records.items():
            if record.is_released:
                continue
            if record_age(record, now) > expiration_interval:
                expired.append(pid)
            else:
                active[pid] = record
        # Unreadable records (corrupted, foreign) hold their partition for an unknown owner
        # until they are older than the expiration; then they are claimed like expired ones,
        # conditional on their etag. While held, they count for nobody's share.
        blocked: set = set()
        reclaimable: dict[str, UnreadableOwnership] = {}
        for bad in listing.unreadable:
            if bad.partition_id not in wanted or bad.partition_id in records:
                continue
            modified = bad.last_modified_time
            if modified is not None and (now - modified).total_seconds() <= expiration_interval:
                blocked.add(bad.partition_id)
            else:
                reclaimable[bad.partition_id] = bad
                expired.append(bad.partition_id)
        owned_by: dict[str, list[str]] = {}
        for pid, record in active.items():
            owned_by.setdefault(record.owner_id, []).append(pid)
        return BalanceView(
            owner_id=owner_id, wanted=frozenset(wanted), records=records, active=active, expired=tuple(expired),
            blocked=frozenset(blocked), reclaimable=reclaimable, owned_by=owned_by,
            counts={owner: len(pids) for owner, pids in owned_by.items()},
            unowned=tuple(pid for pid in wanted if pid not in active and pid not in blocked),
            available=len(wanted) - len(blocked), members=members,
            visible=members is not None and owner_id in members, balance_factor=balance_factor,
            replica_count=replica_count)


Strategy = Callable[[BalanceView, random.Random], list[str]]
"""A balancing strategy: the partitions this processor should take now, in order."""


def fair_share(partition_count: int, owner_count: int) -> tuple[int, int]:
    """``(floor, extra)``: everyone owns ``floor`` or ``floor + 1``; ``extra`` owners own ``floor + 1``."""
    if owner_count <= 0:
        return partition_count, 0
    return divmod(partition_count, owner_count)


def _rank(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


@dataclass(frozen=True)
class _Plan:
    targets: dict[str, int]
    deal: dict[str, list[str]]  # owner -> partitions it should take, in order
    pool: list[str]  # unowned partitions, then the surplus of over-loaded owners
    victims: dict[str, str]  # surplus partition -> live owner it would be taken from


def homes(partition_ids: Collection[str], members: Collection[str]) -> dict[str, str]:
    """Each partition's home among ``members``: the partitions in their hashed order dealt
    round-robin to the members in theirs. It depends on the member set and the partitions
    only, not on who owns what, so processors that read the store at different moments
    of a cold start (each snapshot with other claims landed) deal the unowned partitions
    alike, and their claims do not race."""
    ordered = sorted(members, key=_rank)
    if not ordered:
        return {}
    return {pid: ordered[i % len(ordered)] for i, pid in enumerate(sorted(partition_ids, key=_rank))}


def _plan(
    counts: Mapping[str, int],
    owned_by: Mapping[str, Sequence[str]],
    unowned: Sequence[str],
    partition_count: int,
    per_owner_limit: int | None,
    balance_factor: int = 1,
    home: Mapping[str, str] | None = None,
) -> _Plan:
    """The plan every reader of the same snapshot agrees on.

    Extra slots go to the owners that already hold the most (sticky: a balanced state
    is a fixed point). The pool is the unowned partitions first, then the surplus of
    owners above their target, taken from the most loaded owner first. A needy owner
    first gets the unowned partitions whose ``home`` it is (:func:`homes`), up to its
    need; then needy owners are served round-robin from what is left of the pool,
    neediest first, at most ``per_owner_limit`` each.
    """
    members = sorted(counts, key=_rank)
    floor, extra = fair_share(partition_count, len(members))
    by_load = sorted(members, key=lambda m: (-counts[m], _rank(m)))
    targets = {m: floor + (1 if i < extra else 0) for i, m in enumerate(by_load)}

    surplus: list[tuple[str, str]] = []
    remaining = {m: counts[m] - targets[m] for m in members if counts[m] > targets[m]}
    queues = {m: sorted(owned_by.get(m, ()), key=_rank) for m in remaining}
    load = {m: counts[m] for m in remaining}
    while remaining:
        victim = min(remaining, key=lambda m: (-load[m], _rank(m)))
        surplus.append((queues[victim].pop(0), victim))
        load[victim] -= 1
        remaining[victim] -= 1
        if remaining[victim] == 0:
            del remaining[victim]

    if balance_factor > 1:
        surplus = surplus[:_moves_needed(counts, len(unowned), balance_factor)]
    pool: list[tuple[str, str | None]] = [(p, None) for p in sorted(unowned, key=_rank)]
    pool += [(p, v) for p, v in surplus]
    needs = {m: targets[m] - counts[m] for m in members if counts[m] < targets[m]}
    if per_owner_limit is not None:
        needs = {m: min(n, per_owner_limit) for m, n in needs.items()}
    needy = sorted(needs, key=lambda m: (counts[m], _rank(m)))
    deal: dict[str, list[str]] = {m: [] for m in needy}
    victims: dict[str, str] = {p: v for p, v in surplus}
    rest = pool
    if home:
        dealt: set[str] = set()
        for pid, taken_from in pool:
            member = home.get(pid)
            if taken_from is None and member in deal and len(deal[member]) < needs[member]:
                deal[member].append(pid)
                dealt.add(pid)
        rest = [(p, v) for p, v in pool if p not in dealt]
    position = 0
    while position < len(rest) and any(needs[m] > len(deal[m]) for m in needy):
        for m in needy:
            if needs[m] > len(deal[m]) and position < len(rest):
                deal[m].append(rest[position][0])
                position += 1
    return _Plan(targets=targets, deal=deal, pool=[p for p, _v in pool], victims=victims)


def _moves_needed(counts: Mapping[str, int], unowned: int, balance_factor: int) -> int:
    """How many partitions must move between live owners so that, once the unowned ones
    went to the least loaded, the most loaded holds at most ``balance_factor`` more than
    the least loaded (KIP-441's balance factor: a smaller imbalance is left alone)."""
    load = sorted(counts.values())
    if not load:
        return 0
    for _ in range(unowned):
        load[0] += 1
        load.sort()
    moves = 0
    while load[-1] - load[0] > balance_factor:
        load[-1] -= 1
        load[0] += 1
        load.sort()
        moves += 1
    return moves


def static_assignment(partition_ids: Collection[str], ordinals: Mapping[str, int],
                      replica_count: int) -> dict[str, str]:
    """The STATIC strategy's target owner of every partition.

    Partition ``i`` (in partition-id order) belongs to the member whose ordinal is
    ``i % replica_count``. The partitions of ordinals with no live member are dealt
    round-robin, in order, to the live members by ordinal. ``ordinals`` maps live member
    ids to their ordinals; of two members claiming one ordinal the smaller id keeps it.
    """
    holder: dict[int, str] = {}
    for member, ordinal in sorted(ordinals.items()):
        holder.setdefault(ordinal, member)
    live = [holder[o] for o in sorted(holder)]
    if not live:
        return {}
    targets: dict[str, str] = {}
    orphans: list[str] = []
    for index, pid in enumerate(sorted(partition_ids, key=partition_sort_key)):
        assigned = holder.get(index % replica_count)
        if assigned is None:
            orphans.append(pid)
        else:
            targets[pid] = assigned
    for index, pid in enumerate(orphans):
        targets[pid] = live[index % len(live)]
    return targets


def _random_surplus(plan: _Plan, owned_by: Mapping[str, Sequence[str]], wanted: int,
                    rng: random.Random) -> list[str]:
    """Up to ``wanted`` partitions taken at random from the owners above their target,
    no more from each than its surplus. Several invisible newcomers reading the same
    snapshot then rarely pick the same partition."""
    surplus = Counter(plan.victims.values())
    candidates: list[str] = []
    for victim in sorted(surplus, key=_rank):
        theirs = sorted(owned_by[victim], key=partition_sort_key)
        candidates += rng.sample(theirs, surplus[victim])
    rng.shuffle(candidates)
    return candidates[:wanted]


def _by_counts(view: BalanceView, rng: random.Random, limit: int | None) -> list[str]:
    """Take this processor's part of the count plan, at most ``limit`` partitions."""
    owner_id, counts, owned_by, unowned = view.owner_id, view.counts, view.owned_by, list(view.unowned)
    if not counts.get(owner_id) and not view.visible:
        # Nobody can see a processor that owns nothing and has no member record, so
        # its fair share (and everyone else's) would be computed without it. It
        # claims one partition first, to show up in every snapshot.
        limit = 1
    plan_of = dict(counts)
    for member in view.members or ():
        plan_of.setdefault(member, 0)
    plan_of.setdefault(owner_id, 0)
    plan = _plan(plan_of, owned_by, unowned, view.available, limit, view.balance_factor,
                 homes(view.wanted - view.blocked, plan_of))
    take = list(plan.deal.get(owner_id, ()))
    if counts.get(owner_id, 0) == 0 and take and not view.visible:
        # Nobody else can see this processor yet, so their plans leave it out. Pick at
        # random among what their plans do not hand out this tick: unowned partitions
        # first, else the surplus of over-loaded owners.
        others = {m: c for m, c in counts.items() if m != owner_id}
        taken_by_others = set()
        if others:
            other_plan = _plan(others, owned_by, unowned, view.available, limit, view.balance_factor)
            taken_by_others = {p for ps in other_plan.deal.values() for p in ps}
        unclaimed = [p for p in plan.pool if p not in plan.victims]
        free = [p for p in unclaimed if p not in taken_by_others] or unclaimed
        if free:
            take = rng.sample(sorted(free, key=partition_sort_key), min(len(take), len(free)))
        else:
            take = _random_surplus(plan, owned_by, len(take), rng)
    return take


def greedy(view: BalanceView, rng: random.Random) -> list[str]:
    """Up to this processor's whole fair share in one tick (see the module docstring)."""
    return _by_counts(view, rng, None)


def balanced(view: BalanceView, rng: random.Random) -> list[str]:
    """At most one partition per tick: the seed's protocol, smooth and with few conflicts."""
    return _by_counts(view, rng, 1)


def static(view: BalanceView, rng: random.Random) -> list[str]:
    """The partitions of this processor's ordinal it does not own yet (:func:`static_assignment`
    over the ordinals the live member records carry)."""
    ordinals = {m: int(p[ORDINAL_PROPERTY]) for m, p in (view.members or {}).items()
                if p.get(ORDINAL_PROPERTY, "").isdigit()}
    targets = (static_assignment(view.wanted - view.blocked, ordinals, view.replica_count)
               if view.replica_count > 0 else {})
    owner_id, active = view.owner_id, view.active
    return sorted((pid for pid, member in targets.items() if member == owner_id and
                   (pid not in active or active[pid].owner_id != owner_id)), key=partition_sort_key)


STRATEGIES: Mapping[LoadBalancingStrategy, Strategy] = {
    LoadBalancingStrategy.GREEDY: greedy,
    LoadBalancingStrategy.BALANCED: balanced,
    LoadBalancingStrategy.STATIC: static,
}
"""The strategy function of each :class:`~eventprocessor.policies.LoadBalancingStrategy`."""
