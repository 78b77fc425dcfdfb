"""The load balancer: a pure function from an ownership snapshot to the claims to make.

It follows the design in the seed (expire stale owners, claim an unowned partition,
or steal one from an over-loaded owner, with the floor/ceiling rule ``P // N`` and
``P // N + 1`` where only ``P % N`` owners may hold the extra one) and adds one thing:
*coordination without messages*. Every processor that reads the same snapshot computes
the same plan (who should end up with how many, and which unowned or surplus partition
goes to which needy owner), and takes only its own share of it. Processors that tick at
the same moment therefore claim different partitions instead of racing for the same
random one, which is what lets cold start finish in ``ceil(P/N)`` ticks without steals.

The randomness the seed asks for is still there:

* the order in which unowned partitions are handed out is a pseudo-random permutation
  (a hash of the partition id), the same for every reader of the snapshot;
* a processor that owns nothing is invisible to the others (membership is only what
  the records show), so it picks at random, with the injected RNG, among the partitions
  the visible owners are not about to take.

No I/O, no clock, no global ``random``: the snapshot carries the store's time and the
caller passes the RNG.
"""
from __future__ import annotations

import enum
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from .records import Ownership, OwnershipListing

__all__ = ["LoadBalancingStrategy", "BalanceDecision", "decide", "fair_share"]


class LoadBalancingStrategy(str, enum.Enum):
    """How fast a processor takes its share.

    ``BALANCED`` claims at most one new partition per tick (the seed's protocol: smooth,
    few conflicts). ``GREEDY`` claims up to its whole fair share in one tick.
    """

    BALANCED = "balanced"
    GREEDY = "greedy"


@dataclass(frozen=True)
class BalanceDecision:
    """What one processor should do this tick.

    ``owned``: the live records the store says this processor owns (store etags).
    ``renewals``: the subset of ``owned`` to rewrite now, because they are older than
    the renewal age. ``claims``: new claims, each conditional on the store's etag for
    that partition (``None`` = create-if-absent), with the epoch already advanced.
    ``stolen_from``: for claims on live records, the owner they are taken from.
    """

    owned: Tuple[Ownership, ...]
    renewals: Tuple[Ownership, ...]
    claims: Tuple[Ownership, ...]
    stolen_from: Mapping[str, str] = field(default_factory=dict)
    active_owners: int = 0
    expired: Tuple[str, ...] = ()


def fair_share(partition_count: int, owner_count: int) -> Tuple[int, int]:
    """``(floor, extra)``: everyone owns ``floor`` or ``floor + 1``; ``extra`` owners own ``floor + 1``."""
    if owner_count <= 0:
        return partition_count, 0
    return divmod(partition_count, owner_count)


def _rank(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()


def _partition_sort_key(partition_id: str) -> Tuple[int, object]:
    return (0, int(partition_id)) if partition_id.isdigit() else (1, partition_id)


@dataclass(frozen=True)
class _Plan:
    targets: Dict[str, int]
    deal: Dict[str, List[str]]  # owner -> partitions it should take, in order
    pool: List[str]  # unowned partitions, then the surplus of over-loaded owners
    victims: Dict[str, str]  # surplus partition -> live owner it would be taken from


def _plan(
    counts: Mapping[str, int],
    owned_by: Mapping[str, Sequence[str]],
    unowned: Sequence[str],
    partition_count: int,
    per_owner_limit: Optional[int],
) -> _Plan:
    """The plan every reader of the same snapshot agrees on.

    Extra slots go to the owners that already hold the most (sticky: a balanced state
    is a fixed point). The pool is the unowned partitions first, then the surplus of
    owners above their target, taken from the most loaded owner first. Needy owners
    are served round-robin, neediest first, at most ``per_owner_limit`` each.
    """
    members = sorted(counts, key=_rank)
    floor, extra = fair_share(partition_count, len(members))
    by_load = sorted(members, key=lambda m: (-counts[m], _rank(m)))
    targets = {m: floor + (1 if i < extra else 0) for i, m in enumerate(by_load)}

    surplus: List[Tuple[str, str]] = []
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

    pool: List[Tuple[str, Optional[str]]] = [(p, None) for p in sorted(unowned, key=_rank)]
    pool += [(p, v) for p, v in surplus]
    needs = {m: targets[m] - counts[m] for m in members if counts[m] < targets[m]}
    if per_owner_limit is not None:
        needs = {m: min(n, per_owner_limit) for m, n in needs.items()}
    needy = sorted(needs, key=lambda m: (counts[m], _rank(m)))
    deal: Dict[str, List[str]] = {m: [] for m in needy}
    victims: Dict[str, str] = {p: v for p, v in surplus}
    position = 0
    round_number = 0
    while position < len(pool) and any(needs[m] > round_number for m in needy):
        for m in needy:
            if needs[m] > round_number and position < len(pool):
                deal[m].append(pool[position][0])
                position += 1
        round_number += 1
    return _Plan(targets=targets, deal=deal, pool=[p for p, _v in pool], victims=victims)


def _random_surplus(plan: _Plan, owned_by: Mapping[str, Sequence[str]], wanted: int,
                    rng: random.Random) -> List[str]:
    """Up to ``wanted`` partitions taken at random from the owners above their target,
    no more from each than its surplus. Several invisible newcomers reading the same
    snapshot then rarely pick the same partition."""
    surplus = Counter(plan.victims.values())
    candidates: List[str] = []
    for victim in sorted(surplus, key=_rank):
        theirs = sorted(owned_by[victim], key=_partition_sort_key)
        candidates += rng.sample(theirs, surplus[victim])
    rng.shuffle(candidates)
    return candidates[:wanted]


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
    renew_after: float,
    rng: random.Random,
) -> BalanceDecision:
    """Decide this tick's renewals and claims for ``owner_id``.

    A record is live when its owner id is set and ``listing.server_time -
    last_modified_time <= expiration_interval``: expiry is judged on the store's clock.
    Only live records owned by ``owner_id`` are renewed, with the store's etag, and only
    once they are ``renew_after`` seconds old. In ``BALANCED`` mode at most one new
    partition is claimed; in ``GREEDY`` mode up to the fair share.

    Example::

        decision = decide(listing, ["0", "1", "2"], "me", fully_qualified_namespace="ns",
                          eventhub_name="hub", consumer_group="$default",
                          strategy=LoadBalancingStrategy.BALANCED, expiration_interval=60,
                          renew_after=30, rng=random.Random(1))
    """
    now = listing.server_time
    wanted = set(partition_ids)
    records: Dict[str, Ownership] = {}
    for record in listing.ownerships:
        if record.partition_id in wanted:
            records[record.partition_id] = record

    def age(record: Ownership) -> float:
        if record.last_modified_time is None:
            return float("inf")
        return (now - record.last_modified_time).total_seconds()

    active: Dict[str, Ownership] = {}
    expired: List[str] = []
    for pid, record in records.items():
        if record.is_released:
            continue
        if age(record) > expiration_interval:
            expired.append(pid)
        else:
            active[pid] = record

    owned_by: Dict[str, List[str]] = {}
    for pid, record in active.items():
        owned_by.setdefault(record.owner_id, []).append(pid)
    counts = {owner: len(pids) for owner, pids in owned_by.items()}
    unowned = [pid for pid in wanted if pid not in active]
    mine = tuple(sorted((active[p] for p in owned_by.get(owner_id, ())), key=lambda r: _partition_sort_key(r.partition_id)))
    renewals = tuple(r for r in mine if age(r) >= renew_after)

    limit = 1 if strategy is LoadBalancingStrategy.BALANCED else None
    if not counts.get(owner_id):
        # Nobody can see a processor that owns nothing, so its fair share (and everyone
        # else's) would be computed without it. It claims one partition first, to show
        # up in every snapshot; from the next tick on every plan includes it. In GREEDY
        # mode this costs one tick, and in exchange starters don't all claim everything
        # and early newcomers don't take partitions that later ones must steal back.
        limit = 1
    view = dict(counts)
    view.setdefault(owner_id, 0)
    plan = _plan(view, owned_by, unowned, len(wanted), limit)
    take = list(plan.deal.get(owner_id, ()))

    if counts.get(owner_id, 0) == 0 and take:
        # Nobody else can see this processor yet, so their plans leave it out. Pick at
        # random among what their plans do not hand out this tick: unowned partitions
        # first, else the surplus of over-loaded owners.
        others = {m: c for m, c in counts.items() if m != owner_id}
        taken_by_others = set()
        if others:
            other_plan = _plan(others, owned_by, unowned, len(wanted), limit)
            taken_by_others = {p for ps in other_plan.deal.values() for p in ps}
        unclaimed = [p for p in plan.pool if p not in plan.victims]
        free = [p for p in unclaimed if p not in taken_by_others] or unclaimed
        if free:
            take = rng.sample(sorted(free, key=_partition_sort_key), min(len(take), len(free)))
        else:
            take = _random_surplus(plan, owned_by, len(take), rng)

    claims: List[Ownership] = []
    stolen_from: Dict[str, str] = {}
    for pid in take:
        previous = records.get(pid)
        claims.append(
            Ownership(
                fully_qualified_namespace=fully_qualified_namespace,
                eventhub_name=eventhub_name,
                consumer_group=consumer_group,
                partition_id=pid,
                owner_id=owner_id,
                etag=previous.etag if previous is not None else None,
                last_modified_time=previous.last_modified_time if previous is not None else None,
                epoch=(previous.epoch + 1) if previous is not None else 1,
            )
        )
        if pid in active:
            stolen_from[pid] = active[pid].owner_id
    return BalanceDecision(
        owned=mine,
        renewals=renewals,
        claims=tuple(claims),
        stolen_from=stolen_from,
        active_owners=len(view),
        expired=tuple(sorted(expired, key=_partition_sort_key)),
    )
