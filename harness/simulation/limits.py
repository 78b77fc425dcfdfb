"""What the best possible balancer could do, to set beside what one did: the fewest moves
to a balanced assignment (:func:`minimal_moves`) and the fewest ticks when each owner
gains at most one partition per tick (:func:`one_per_tick_limit`)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

__all__ = ["minimal_moves", "one_per_tick_limit"]


def minimal_moves(before: dict[str, str | None], live: Sequence[str], partition_ids: Sequence[str]) -> int:
    """The fewest ownership moves from ``before`` (partition -> owner or None) to any
    balanced assignment of ``partition_ids`` over ``live`` owners.

    Partitions of owners that are not live must move; partitions nobody owned are
    assigned without counting as moves. The optimum keeps as many partitions where they
    are as the floor/ceiling targets allow, giving the ceiling slots to the owners that
    hold the most.
    """
    if not live:
        return 0
    counts = Counter(owner for pid, owner in before.items() if pid in set(partition_ids) and owner in set(live))
    floor, extra = divmod(len(partition_ids), len(live))
    ordered = sorted((counts.get(owner, 0) for owner in live), reverse=True)
    kept = sum(min(count, floor + (1 if i < extra else 0)) for i, count in enumerate(ordered))
    had_owner = sum(1 for pid in partition_ids if before.get(pid) is not None)
    return had_owner - kept


def one_per_tick_limit(before: dict[str, str | None], live: Sequence[str], partition_ids: Sequence[str]) -> int:
    """Fewest ticks to a balanced state when each owner gains at most one partition per
    tick: the largest gain any owner needs under the stickiest balanced targets."""
    if not live:
        return 0
    live_set, pids = set(live), set(partition_ids)
    counts = {owner: 0 for owner in live}
    for pid, owner in before.items():
        if pid in pids and owner in live_set:
            counts[owner] += 1
    floor, extra = divmod(len(partition_ids), len(live))
    ordered = sorted(live, key=lambda o: -counts[o])
    return max(max(0, floor + (1 if i < extra else 0) - counts[o]) for i, o in enumerate(ordered))
