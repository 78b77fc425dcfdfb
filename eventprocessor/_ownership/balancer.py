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

import hashlib
import random
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace

from ..policies import LoadBalancingStrategy, LoadPolicy
from ..stores.records import Ownership, OwnershipListing, UnreadableOwnership, partition_sort_key
from .load_plan import MemberLoad, plan_moves

__all__ = ["BalanceDecision", "decide", "fair_share", "static_assignment",
           "HANDOFF_PROPERTY", "ORDINAL_PROPERTY"]

HANDOFF_PROPERTY = "handoff"
"""Member property: ``"1"`` when the member answers handoff requests."""
ORDINAL_PROPERTY = "ordinal"
"""Member property: the member's ordinal, for the STATIC strategy."""


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


def _plan(
    counts: Mapping[str, int],
    owned_by: Mapping[str, Sequence[str]],
    unowned: Sequence[str],
    partition_count: int,
    per_owner_limit: int | None,
    balance_factor: int = 1,
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
    position = 0
    round_number = 0
    while position < len(pool) and any(needs[m] > round_number for m in needy):
        for m in needy:
            if needs[m] > round_number and position < len(pool):
                deal[m].append(pool[position][0])
                position += 1
        round_number += 1
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
    counts. Until every live member has published a load, nothing moves.

    ``renewals`` are listed for the record only: the renewer renews on its own schedule.

    Example::

        decision = decide(listing, ["0", "1", "2"], "me", fully_qualified_namespace="ns",
                          eventhub_name="hub", consumer_group="$default",
                          strategy=LoadBalancingStrategy.GREEDY, expiration_interval=60,
                          rng=random.Random(1))
    """
    now = listing.server_time
    wanted = set(partition_ids)
    records: dict[str, Ownership] = {}
    for record in listing.ownerships:
        if record.partition_id in wanted:
            records[record.partition_id] = record

    def age(record: Ownership) -> float:
        if record.last_modified_time is None:
            return float("inf")
        return (now - record.last_modified_time).total_seconds()

    active: dict[str, Ownership] = {}
    expired: list[str] = []
    for pid, record in records.items():
        if record.is_released:
            continue
        if age(record) > expiration_interval:
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
    counts = {owner: len(pids) for owner, pids in owned_by.items()}
    unowned = [pid for pid in wanted if pid not in active and pid not in blocked]
    available = len(wanted) - len(blocked)
    mine = tuple(sorted((active[p] for p in owned_by.get(owner_id, ())),
                        key=lambda r: partition_sort_key(r.partition_id)))
    renewals = tuple(r for r in mine if age(r) >= renew_after)
    visible = members is not None and owner_id in members

    if strategy is LoadBalancingStrategy.STATIC:
        ordinals = {m: int(p[ORDINAL_PROPERTY]) for m, p in (members or {}).items()
                    if p.get(ORDINAL_PROPERTY, "").isdigit()}
        targets = static_assignment(wanted - blocked, ordinals, replica_count) if replica_count > 0 else {}
        take = sorted((pid for pid, member in targets.items() if member == owner_id and
                       (pid not in active or active[pid].owner_id != owner_id)), key=partition_sort_key)
    else:
        limit = 1 if strategy is LoadBalancingStrategy.BALANCED else None
        if not counts.get(owner_id) and not visible:
            # Nobody can see a processor that owns nothing and has no member record, so
            # its fair share (and everyone else's) would be computed without it. It
            # claims one partition first, to show up in every snapshot.
            limit = 1
        view = dict(counts)
        for member in members or ():
            view.setdefault(member, 0)
        view.setdefault(owner_id, 0)
        plan = _plan(view, owned_by, unowned, available, limit, balance_factor)
        take = list(plan.deal.get(owner_id, ()))
        if counts.get(owner_id, 0) == 0 and take and not visible:
            # Nobody else can see this processor yet, so their plans leave it out. Pick at
            # random among what their plans do not hand out this tick: unowned partitions
            # first, else the surplus of over-loaded owners.
            others = {m: c for m, c in counts.items() if m != owner_id}
            taken_by_others = set()
            if others:
                other_plan = _plan(others, owned_by, unowned, available, limit, balance_factor)
                taken_by_others = {p for ps in other_plan.deal.values() for p in ps}
            unclaimed = [p for p in plan.pool if p not in plan.victims]
            free = [p for p in unclaimed if p not in taken_by_others] or unclaimed
            if free:
                take = rng.sample(sorted(free, key=partition_sort_key), min(len(take), len(free)))
            else:
                take = _random_surplus(plan, owned_by, len(take), rng)

    if load_policy is not None and strategy is not LoadBalancingStrategy.STATIC and members is not None:
        take = [pid for pid in take if pid not in active]  # live owners' partitions move by load
        if loads is not None and all(member in loads for member in members):
            # Who owns what comes from the ownership records, not from the member records:
            # those are up to a heartbeat old, and a partition that moved since would move again.
            moves = plan_moves({member: loads[member] for member in members}, load_policy,
                               owners={pid: record.owner_id for pid, record in active.items()})
            take += sorted((pid for pid, target in moves.items() if target == owner_id and pid in active
                            and members.get(active[pid].owner_id, {}).get(HANDOFF_PROPERTY) == "1"),
                           key=partition_sort_key)
    if preferred:
        take = [pid for pid in take if pid in active or preferred.get(pid, owner_id) == owner_id]
        take += sorted((pid for pid, member in preferred.items() if member == owner_id and pid in wanted
                        and pid not in active and pid not in blocked and pid not in take), key=partition_sort_key)

    claims: list[Ownership] = []
    requests: list[Ownership] = []
    awaiting: list[str] = []
    stolen_from: dict[str, str] = {}
    made = requests_made or {}
    for pid in take:
        current = active.get(pid)
        if current is not None and handoff_timeout is not None and members is not None \
                and members.get(current.owner_id, {}).get(HANDOFF_PROPERTY) == "1":
            # A live owner that can hand over: ask, and steal only if it does not answer.
            requester = current.requested_by
            if requester == owner_id:
                if made.get(pid, 0.0) < handoff_timeout:
                    awaiting.append(pid)
                    continue
            elif requester and requester in members:
                awaiting.append(pid)  # another live member asked first; it is its move
                continue
            else:
                requests.append(replace(current, requested_by=owner_id))
                awaiting.append(pid)
                continue
        previous: Ownership | UnreadableOwnership | None = records.get(pid) or reclaimable.get(pid)
        claims.append(
            Ownership(
                fully_qualified_namespace=fully_qualified_namespace,
                eventhub_name=eventhub_name,
                consumer_group=consumer_group,
                partition_id=pid,
                owner_id=owner_id,
                etag=previous.etag if previous is not None else None,
                last_modified_time=previous.last_modified_time if previous is not None else None,
                # An unreadable record's epoch is unknown: the processor raises the claim
                # above every epoch it has seen, and the checkpoint fence above the stored one.
                epoch=(previous.epoch + 1) if isinstance(previous, Ownership) else 1,
            )
        )
        if current is not None:
            stolen_from[pid] = current.owner_id
    return BalanceDecision(
        owned=mine,
        renewals=renewals,
        claims=tuple(claims),
        stolen_from=stolen_from,
        active_owners=len(set(counts) | set(members or ()) | {owner_id}),
        expired=tuple(sorted(expired, key=partition_sort_key)),
        handoff_requests=tuple(requests),
        awaiting_handoff=tuple(awaiting),
    )
