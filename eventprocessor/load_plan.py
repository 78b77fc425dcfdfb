"""The load-aware plan (``balance_by="load"``): move partitions from busy processors to idle
ones, damped, without herding. Pure: no I/O, no clock, no randomness.

Each processor publishes its measured load in its member record (:class:`MemberLoad`:
its CPU utilisation and, per owned partition, events/s, bytes/s, lag and how long ago it
took the partition, all smoothed). Every processor that reads the same records computes
the same plan (:func:`plan_moves`) and acts only on the moves to itself, by a graceful
handoff request, as KCL 3.x's variance-based assignment moves leases from hot workers to
cold ones:

* a partition's *weight* is its share of its owner's utilisation, by events/s; on the
  receiver it costs its events at the receiver's own measured cost per event (machines
  differ), never less than its weight;
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

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from .records import partition_sort_key

__all__ = ["PartitionLoad", "MemberLoad", "LoadPolicy", "plan_moves", "encode_load", "decode_load",
           "LOAD_PROPERTY", "BALANCE_BY"]

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


@dataclass(frozen=True)
class MemberLoad:
    """One processor's measured load: CPU in use over CPU available (0 to 1, cgroup-aware),
    and its partitions' loads."""

    utilization: float
    partitions: Mapping[str, PartitionLoad] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadPolicy:
    """The knobs of the load-aware plan.

    ``threshold``: act on a processor above ``mean * (1 + threshold)`` only (a dead band
    against noise). ``damping``: move at most this fraction of a processor's excess per
    round. ``max_moves``: at most this many partitions leave one processor per round.
    ``cooldown``: seconds a moved partition stays. ``floor``: utilisation below which
    nobody is busy enough to move anything."""

    threshold: float = 0.25
    damping: float = 0.5
    max_moves: int = 1
    cooldown: float = 300.0
    floor: float = 0.1


def _weights(load: MemberLoad) -> Dict[str, float]:
    """Each partition's share of its owner's utilisation, by events/s (equal shares when
    nothing flows)."""
    parts = load.partitions
    if not parts:
        return {}
    total = sum(p.events_per_second for p in parts.values())
    if total <= 0:
        return {pid: load.utilization / len(parts) for pid in parts}
    return {pid: load.utilization * p.events_per_second / total for pid, p in parts.items()}


def plan_moves(loads: Mapping[str, MemberLoad], policy: LoadPolicy = LoadPolicy()) -> Dict[str, str]:
    """Partition -> the processor it should move to, this round (see the module docstring).

    ``loads``: every live processor's load, idle ones included.

    Example::

        plan_moves({"a": MemberLoad(0.9, {"0": PartitionLoad(900), "1": PartitionLoad(100)}),
                    "b": MemberLoad(0.1)})        # {"1": "b"}: the small one leaves, the hot one stays
    """
    if len(loads) < 2:
        return {}
    projected = {member: load.utilization for member, load in loads.items()}
    rate = {member: sum(p.events_per_second for p in load.partitions.values()) for member, load in loads.items()}
    mean = sum(projected.values()) / len(projected)
    ceiling = mean * (1 + policy.threshold)
    if max(projected.values()) < policy.floor:
        return {}
    moves: Dict[str, str] = {}
    givers = sorted((m for m, u in projected.items() if u > ceiling and u >= policy.floor),
                    key=lambda m: (-projected[m], m))
    for giver in givers:
        excess = projected[giver] - mean
        budget = excess * policy.damping
        weights = _weights(loads[giver])
        candidates: List[Tuple[float, str]] = sorted(
            ((w, pid) for pid, w in weights.items() if loads[giver].partitions[pid].age >= policy.cooldown),
            key=lambda item: (-item[0], partition_sort_key(item[1])))
        moved = 0
        for weight, pid in candidates:
            if moved >= policy.max_moves or budget <= 0:
                break
            taker = min((m for m in projected if m != giver), key=lambda m: (projected[m], m))
            if projected[taker] >= mean:
                break  # nobody is below the mean
            # What the partition will cost the taker: its events at the taker's own cost per
            # event when the taker has measured one (machines differ), else the giver's.
            events = loads[giver].partitions[pid].events_per_second
            cost = weight if rate[taker] <= 0 or events <= 0 else \
                max(weight, events * loads[taker].utilization / rate[taker])
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
            rate[taker] += events
            budget -= weight
            moved += 1
    return moves


def encode_load(load: MemberLoad) -> str:
    """``u=0.431;3=120.5/3400/12/600,...``: utilisation, then per partition events/s,
    bytes/s, lag and age (whole seconds), compact enough for member-record metadata."""
    parts = ",".join(f"{pid}={p.events_per_second:.6g}/{p.bytes_per_second:.6g}/{p.lag}/"
                     f"{int(min(p.age, 1e9))}" for pid, p in sorted(load.partitions.items()))
    return f"u={load.utilization:.3f};{parts}"


def decode_load(text: Optional[str]) -> Optional[MemberLoad]:
    """The load a member published, or None if it published none (or garbled)."""
    if not text or not text.startswith("u="):
        return None
    head, _, rest = text.partition(";")
    try:
        utilization = float(head[2:])
        partitions: Dict[str, PartitionLoad] = {}
        for item in filter(None, rest.split(",")):
            pid, _, fields = item.partition("=")
            eps, bps, lag, age = fields.split("/")
            partitions[pid] = PartitionLoad(float(eps), float(bps), int(lag), float(age))
    except ValueError:
        return None
    return MemberLoad(utilization, partitions)
