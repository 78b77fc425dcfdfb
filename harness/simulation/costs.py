"""What balancing costs in storage requests, by formula, and the settings both SDKs may
choose within one budget: the arithmetic of the convergence benchmark's equal-cost
failover, shared with the tests that check the simulator against it.

Example::

    budget = official_requests_per_hour(32, 4, 30.0)          # the official processor at its defaults
    shared = shared_candidates(budget, 32, 4, [15.0, 30.0], ["default"])
    ours = shortest_within(lambda i, e: ours_requests_per_hour(32, 4, i, e), budget, shared)
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from eventprocessor import Timing

__all__ = ["EXPIRATION_MULTIPLES", "RENEWAL_RULES", "equal_cost_candidates", "official_requests_per_hour",
           "ours_requests_per_hour", "renewal_for", "shared_candidates", "shortest_within"]


def ours_requests_per_hour(partitions: int, instances: int, interval: float, expiration: float,
                           renewal_age: float | None = None, renewal: str = "member") -> float:
    """This SDK's steady-state storage requests per hour. With ``renewal="member"`` (the
    default, ``ownership_renewal="auto"`` in a group of its own): each processor lists
    the members (with the change notice) once per tick (``N / I``), writes its member
    record every quarter of the expiration (``4N / E``), which keeps all its partitions,
    and lists ownership only as the safety net, on average every ``0.875 x max(4E, 60 s)``
    (``full_listing_interval``, jittered down by up to a quarter): nothing grows with P
    but that one listing's pages. With ``renewal="partition"``: one listing of ownership
    and members per tick (``N / I``), each owned record rewritten once per renewal age
    (``P / R``, by default ``R = max(E/2, lease - 15 s)``,
    :meth:`Timing.default_renewal_age`) and the member records (``4N / E``)."""
    if renewal == "member":
        return 3600.0 * (instances / interval + 4 * instances / expiration
                         + instances / (0.875 * Timing.full_listing_interval_for(expiration)))
    renewal_seconds = Timing.default_renewal_age(expiration) if renewal_age is None else renewal_age
    return 3600.0 * (instances / interval + partitions / renewal_seconds + 4 * instances / expiration)


def official_requests_per_hour(partitions: int, instances: int, interval: float, jitter: float = 0.2) -> float:
    """The official processor's: each tick lists ownership once and rewrites every owned
    record (``(N + P) / tick``); its loop sleeps ``interval x (1 + U(0, jitter))``."""
    return 3600.0 * (instances + partitions) / (interval * (1 + jitter / 2))


RENEWAL_RULES = ("default", "half")
"""How the equal-cost candidates set the renewal age: the SDK's default rule
(:meth:`Timing.default_renewal_age`), or at half the expiration (a second set of candidates
whose records are rewritten less often)."""


def renewal_for(rule: str, expiration: float) -> float | None:
    """The ``ownership_renewal_age`` a candidate passes (None: the SDK's default)."""
    return None if rule == "default" else expiration / 2


def equal_cost_candidates(target_per_hour: float, partitions: int, instances: int, intervals: Sequence[float],
                          rule: str = "default") -> list[tuple[float, float]]:
    """For each interval, the shortest whole-second expiration, at least two intervals
    (see :data:`EXPIRATION_MULTIPLES`), whose formula cost (this SDK's) is at most
    ``target_per_hour``, with the renewal age set by ``rule``."""
    found = []
    for interval in intervals:
        expiration = math.ceil(2 * interval)
        while expiration <= 3600:
            cost = ours_requests_per_hour(partitions, instances, interval, expiration,
                                          renewal_for(rule, expiration))
            if cost <= target_per_hour:
                found.append((interval, float(expiration)))
                break
            expiration += 1
    return found


EXPIRATION_MULTIPLES = (2, 3, 6)
"""Expirations every side may pick, in load-balancing intervals (the official default is
6; below 2 a single late tick lets a live record expire)."""


def shared_candidates(budget: float, partitions: int, instances: int, intervals: Sequence[float],
                      rules: Sequence[str]) -> dict[float, list[float]]:
    """The (interval -> expirations) both sides choose from: for each interval, this SDK's
    shortest whole-second expiration within ``budget`` under each renewal rule, and
    :data:`EXPIRATION_MULTIPLES` intervals."""
    pairs: dict[float, set] = {interval: {float(k * interval) for k in EXPIRATION_MULTIPLES} for interval in intervals}
    for rule in rules:
        for interval, expiration in equal_cost_candidates(budget, partitions, instances, intervals, rule):
            pairs[interval].add(expiration)
    return {interval: sorted(expirations) for interval, expirations in pairs.items()}


def shortest_within(cost: Callable[[float, float], float], budget: float,
                    candidates: dict[float, list[float]]) -> list[tuple[float, float]]:
    """For each interval, the shortest candidate expiration whose formula ``cost(interval,
    expiration)`` is within ``budget``: at one interval and within the budget a longer
    expiration cannot fail over sooner (orphans are claimable once their records expired)."""
    chosen = []
    for interval, expirations in candidates.items():
        fitting = [e for e in expirations if cost(interval, e) <= budget * (1 + 1e-9)]
        if fitting:
            chosen.append((interval, fitting[0]))
    return chosen
