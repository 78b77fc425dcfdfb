"""The load-aware plan (``load_policy=LoadPolicy(...)``): move partitions from busy processors to idle
ones, damped, without herding. Pure: no I/O, no clock, no randomness.

Each processor publishes its measured load in its member record (:class:`MemberLoad`:
its CPU utilisation and, per owned partition, events/s, bytes/s, lag, how fast the lag
grows and how long ago it took the partition, all smoothed). Every processor that reads
the same snapshot (the member records and the ownership records) computes the same plan
(:func:`plan_moves`) and acts only on the moves to itself, by a graceful handoff request,
as KCL 3.x's variance-based assignment moves leases from hot workers to cold ones:

* **demand, not just use**: a partition's *demand* is the events/s that arrive on it,
  what its owner processed plus the growth of its lag. Utilisation stops at 1.0, so a
  saturated processor looks no busier than a fully used one; its lag does not stop. A
  processor's *demanded utilisation* is its measured utilisation plus, at its own cost
  per event, the events/s its partitions' lags grow by (``u * demand / processed``
  when it owns the same partitions it measured): above 1.0 for a processor that falls
  behind;
* **the snapshot decides who owns what**: a member record is up to a heartbeat old, so
  a partition that moved since its old owner published is counted on its new owner (at
  the load the old owner measured) and no longer on the old one, and it is in its
  cool-down (it moved within the last heartbeat);
* a partition's *weight* is its demand at its owner's cost per event (its share of its
  owner's utilisation when nothing flows); on the receiver it costs its demand at the
  receiver's own measured cost per event (machines differ), or its weight when the
  receiver has measured none;
* a processor above the fleet's mean by more than ``threshold`` (relative) gives away
  partitions, the largest first, at most ``damping`` of its excess per round (but one
  chunky partition may go whole if the giver stays near the mean) and at most
  ``max_moves`` partitions, each to the processor with the least projected load, and
  only when that processor stays below the giver (or the ceiling) afterwards: a move
  never just moves the hot spot;
* a partition moved less than ``cooldown`` seconds ago stays.

So the group converges on any steady load (each round lowers the largest excess) and
does not oscillate under noise (the threshold is a dead band, and the cool-down holds
what just moved).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from ..policies import LoadPolicy
from ..stores.records import partition_sort_key

__all__ = ["PartitionLoad", "MemberLoad", "plan_moves", "published_loads", "demanded_utilization", "encode_load",
           "decode_load", "LOAD_PROPERTY", "BALANCE_BY"]

LOAD_PROPERTY = "load"
"""The member-record property a processor publishes its load in."""
BALANCE_BY = ("count", "load")


@dataclass(frozen=True)
class PartitionLoad:
    """What one owned partition costs its owner (smoothed)."""

    events_per_second: float = 0.0
    bytes_per_second: float = 0.0
    lag: int = 0
    age: float = float("inf")
    """Seconds since its owner took it (a move's cool-down)."""
    lag_growth: float = 0.0
    """Events/s its lag grows by (negative while the backlog drains)."""

    @property
    def demand(self) -> float:
        """Events/s arriving on the partition: what was processed plus the lag's growth."""
        return max(0.0, self.events_per_second + self.lag_growth)


@dataclass(frozen=True)
class MemberLoad:
    """One processor's measured load: CPU in use over CPU available (0 to 1, cgroup-aware),
    and its partitions' loads."""

    utilization: float
    partitions: Mapping[str, PartitionLoad] = field(default_factory=dict)


@dataclass(frozen=True)
class _Held:
    """A partition as the plan sees it: what it costs its current owner."""

    weight: float  # the utilisation it demands of its owner
    demand: float  # events/s arriving on it
    age: float  # seconds since it last changed owner


def _costs(loads: Mapping[str, MemberLoad]) -> tuple[dict[str, float], float | None]:
    """Each member's CPU utilisation per processed event/s (members that processed
    nothing have none), and the fleet's (for those)."""
    costs: dict[str, float] = {}
    used = processed = 0.0
    for member, load in sorted(loads.items()):  # sorted: the same sums, to the last bit, for every reader
        events = sum(p.events_per_second for p in load.partitions.values())
        if events > 0:
            costs[member] = load.utilization / events
            used += load.utilization
            processed += events
    return costs, (used / processed if processed > 0 else None)


def _published(load: MemberLoad, cost: float | None, fleet_cost: float | None) -> dict[str, tuple[float, float]]:
    """Per partition its owner published: (the utilisation it used, the utilisation its
    lag's growth adds). What it used is its events at the owner's cost, or an equal share
    of the owner's utilisation when nothing flowed; its growth is priced at the owner's
    cost, else the fleet's."""
    parts = load.partitions
    out: dict[str, tuple[float, float]] = {}
    for pid, p in parts.items():
        used = cost * p.events_per_second if cost is not None else load.utilization / len(parts)
        price = cost if cost is not None else (fleet_cost or 0.0)
        out[pid] = (used, price * (p.demand - p.events_per_second))
    return out


def _reconcile(loads: Mapping[str, MemberLoad], owners: Mapping[str, str] | None
               ) -> tuple[dict[str, float], dict[str, dict[str, _Held]]]:
    """Each member's demanded utilisation and the partitions it holds, as of the
    ownership snapshot ``owners`` (partition -> owner; None: as published)."""
    costs, fleet_cost = _costs(loads)
    priced = {member: _published(load, costs.get(member), fleet_cost) for member, load in sorted(loads.items())}
    demanded: dict[str, float] = {}
    held: dict[str, dict[str, _Held]] = {}
    for member, load in loads.items():
        level = load.utilization
        mine: dict[str, _Held] = {}
        for pid, p in load.partitions.items():
            used, growth = priced[member][pid]
            if owners is not None and owners.get(pid) != member:
                level -= used  # it left (or was released) since this record was written
                continue
            level += growth
            mine[pid] = _Held(max(0.0, used + growth), p.demand, p.age)
        demanded[member], held[member] = level, mine
    if owners is not None:
        # Taken since its new owner last published: counted on it at the load its previous
        # owner measured (the first record that lists it, in member order), and just moved.
        for pid, member in sorted(owners.items(), key=lambda item: partition_sort_key(item[0])):
            if member not in loads or pid in loads[member].partitions:
                continue
            previous = next((m for m in priced if pid in priced[m]), None)
            weight = sum(priced[previous][pid]) if previous is not None else 0.0
            demand = loads[previous].partitions[pid].demand if previous is not None else 0.0
            held[member][pid] = _Held(max(0.0, weight), demand, 0.0)
            demanded[member] += max(0.0, weight)
    return {member: max(0.0, level) for member, level in demanded.items()}, held


def demanded_utilization(loads: Mapping[str, MemberLoad],
                         owners: Mapping[str, str] | None = None) -> dict[str, float]:
    """Each member's utilisation as :func:`plan_moves` weighs it: what it used, plus what
    its lags' growth asks on top (so above 1.0 for a processor that falls behind), as of
    the ownership snapshot ``owners`` when given.

    Example::

        demanded_utilization({"a": MemberLoad(1.0, {"0": PartitionLoad(100, lag_growth=50)})})   # {"a": 1.5}
    """
    return _reconcile(loads, owners)[0]


def plan_moves(loads: Mapping[str, MemberLoad], policy: LoadPolicy = LoadPolicy(),
               owners: Mapping[str, str] | None = None) -> dict[str, str]:
    """Partition -> the processor it should move to, this round (see the module docstring).

    ``loads``: every live processor's load, idle ones included. ``owners``: who owns
    which partition now, from the ownership records (the member records may be a
    heartbeat older); without it, the loads as published.

    Example::

        plan_moves({"a": MemberLoad(0.9, {"0": PartitionLoad(900), "1": PartitionLoad(100)}),
                    "b": MemberLoad(0.1)})        # {"1": "b"}: the small one leaves, the hot one stays
    """
    if len(loads) < 2:
        return {}
    projected, held = _reconcile(loads, owners)
    costs, _fleet = _costs(loads)
    mean = sum(projected[m] for m in sorted(projected)) / len(projected)
    ceiling = mean * (1 + policy.threshold)
    if max(projected.values()) < policy.floor:
        return {}
    moves: dict[str, str] = {}
    givers = sorted((m for m, u in projected.items() if u > ceiling and u >= policy.floor),
                    key=lambda m: (-projected[m], m))
    for giver in givers:
        excess = projected[giver] - mean
        budget = excess * policy.damping
        candidates: list[tuple[float, str]] = sorted(
            ((h.weight, pid) for pid, h in held[giver].items() if h.age >= policy.cooldown),
            key=lambda item: (-item[0], partition_sort_key(item[1])))
        moved = 0
        for weight, pid in candidates:
            if moved >= policy.max_moves or budget <= 0:
                break
            taker = min((m for m in projected if m != giver), key=lambda m: (projected[m], m))
            if projected[taker] >= mean:
                break  # nobody is below the mean
            # What the partition will cost the taker: its events at the taker's own cost per
            # event when the taker has measured one (machines differ: a partition leaving a
            # slowed processor costs a faster one less), else what it cost the giver.
            demand = held[giver][pid].demand
            cost = weight if taker not in costs or demand <= 0 else demand * costs[taker]
            giver_after, taker_after = projected[giver] - weight, projected[taker] + cost
            if taker_after > max(ceiling, giver_after):
                continue  # it would only move the hot spot
            # Damped: at most a fraction of the excess per round; but the first move may take
            # one chunky partition whole, as long as the giver stays near the mean.
            if weight > budget and not (moved == 0 and giver_after >= mean * (1 - policy.threshold)):
                continue
            moves[pid] = taker
            projected[taker] = taker_after
            projected[giver] = giver_after
            budget -= weight
            moved += 1
    return moves


def encode_load(load: MemberLoad) -> str:
    """``u=0.431;3=120.5/3400/12/600/-1.5,...``: utilisation, then per partition events/s,
    bytes/s, lag, age (whole seconds) and the lag's growth (events/s), compact enough for
    member-record metadata."""
    parts = ",".join(f"{pid}={p.events_per_second:.6g}/{p.bytes_per_second:.6g}/{p.lag}/"
                     f"{int(min(p.age, 1e9))}/{p.lag_growth:.4g}" for pid, p in sorted(load.partitions.items()))
    return f"u={load.utilization:.3f};{parts}"


def decode_load(text: str | None) -> MemberLoad | None:
    """The load a member published, or None if it published none (or garbled). A record
    with four fields per partition (no lag growth) reads with a growth of 0."""
    if not text or not text.startswith("u="):
        return None
    head, _, rest = text.partition(";")
    try:
        utilization = float(head[2:])
        if not math.isfinite(utilization):
            return None
        partitions: dict[str, PartitionLoad] = {}
        for item in filter(None, rest.split(",")):
            pid, _, fields = item.partition("=")
            values = fields.split("/")
            if len(values) not in (4, 5):
                return None
            eps, bps, lag, age = values[:4]
            numbers = [float(eps), float(bps), float(age), float(values[4]) if len(values) == 5 else 0.0]
            if not all(map(math.isfinite, numbers)):
                return None  # a NaN or an infinity would poison every reader's plan
            partitions[pid] = PartitionLoad(numbers[0], numbers[1], int(lag), numbers[2], numbers[3])
    except ValueError:
        return None
    return MemberLoad(utilization, partitions)


def published_loads(members: Mapping[str, Mapping[str, str]] | None) -> dict[str, MemberLoad] | None:
    """The loads live members published (those that published one), from their member
    records' properties; None when the store keeps no members."""
    if members is None:
        return None
    loads = {member: decode_load(properties.get(LOAD_PROPERTY)) for member, properties in members.items()}
    return {member: load for member, load in loads.items() if load is not None}
