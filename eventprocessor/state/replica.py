"""Warm replicas of partition state, and the pure plans of who keeps them.

KIP-441's idea, on this SDK's records: a stateful partition moves only once its new owner
has its state. A processor that is about to ask for a partition (a planned move) loads
the state first, while the owner keeps processing, and follows the owner's commits; it
writes the handoff request once it is within ``acceptable_recovery_lag`` events of the
owner's last checkpoint. At the handoff it reads only the changes since, so the pause
does not grow with the state. ``num_standbys`` keeps such replicas all the time on other
processors (one owner's partitions spread evenly over the others, each chosen by
rendezvous hashing within that), and a crashed owner's partition is claimed by its most
caught-up live standby.

:func:`standby_plan` and :func:`failover_plan` are pure: every processor that reads the
same records computes the same plans.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from ..stores.records import Checkpoint, partition_sort_key
from .keeper import StateKeeper
from .log import StateLog

__all__ = ["WarmReplica", "standby_plan", "failover_plan", "encode_lags", "decode_lags", "LAGS_PROPERTY"]

LAGS_PROPERTY = "standbylags"
"""The member-record property where a processor publishes its replicas' lags."""


def _score(partition_id: str, owner_id: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{partition_id}/{owner_id}".encode(), digest_size=8).digest(), "big")


def standby_plan(owners: Mapping[str, str], members: Iterable[str], count: int) -> dict[str, set[str]]:
    """Which partitions each member keeps a standby replica of: for every owned
    partition, ``count`` live members other than its owner.

    The standbys of one owner's partitions are spread evenly over the other members
    (each keeps at most one more of them than any other), so that when that owner
    crashes, every survivor claims its even part of the partitions, warm, in one move:
    no standby takes them all on top of its share to hand the surplus on a moment later.
    Within that, the pairs that score highest keep them (rendezvous hashing), so a member
    that comes or goes moves few replicas. Pure: the order of ``members`` does not matter."""
    names = sorted(set(members))
    plan: dict[str, set[str]] = {member: set() for member in names}
    if count <= 0:
        return plan
    by_owner: dict[str, list[str]] = {}
    for pid, owner in owners.items():
        by_owner.setdefault(owner, []).append(pid)
    for owner, pids in by_owner.items():
        others = [m for m in names if m != owner]
        if others:
            for pid, keepers in _spread(sorted(pids, key=partition_sort_key), others, min(count, len(others))).items():
                for member in keepers:
                    plan[member].add(pid)
    return plan


def _spread(pids: list[str], others: list[str], count: int) -> dict[str, list[str]]:
    """``count`` of ``others`` for each of one owner's ``pids``, every member keeping
    ``base`` or ``base + 1`` of them: the highest-scoring pairs first, within those
    bounds. Should that leave a partition short (possible when ``count > 1``), each
    partition in turn takes the least-loaded members, the highest-scoring among equals."""
    base, extra = divmod(count * len(pids), len(others))
    kept: dict[str, list[str]] = {pid: [] for pid in pids}
    load = dict.fromkeys(others, 0)
    for _rank, pid, member in sorted((-_score(pid, m), pid, m) for pid in pids for m in others):
        if len(kept[pid]) < count and (load[member] < base or (load[member] == base and extra > 0)):
            if load[member] == base:
                extra -= 1
            kept[pid].append(member)
            load[member] += 1
    if all(len(keepers) == count for keepers in kept.values()):
        return kept
    kept = {pid: [] for pid in pids}
    load = dict.fromkeys(others, 0)
    for pid in pids:
        for member in sorted(others, key=lambda m: (load[m], -_score(pid, m), m))[:count]:
            kept[pid].append(member)
            load[member] += 1
    return kept


def failover_plan(claimable: Iterable[str], lags: Mapping[str, Mapping[str, int]],
                  acceptable_recovery_lag: int) -> dict[str, str]:
    """Who should claim each claimable partition (expired or released) that some live
    member keeps a replica of: the most caught-up one (lags within
    ``acceptable_recovery_lag`` count as caught up; ties go to the lower owner id).
    ``lags``: member -> partition -> events behind."""
    plan: dict[str, str] = {}
    for pid in claimable:
        candidates = [(max(0, lag - acceptable_recovery_lag), member) for member, per in lags.items()
                      if (lag := per.get(pid)) is not None]
        if candidates:
            plan[pid] = min(candidates)[1]
    return plan


def encode_lags(lags: Mapping[str, int]) -> str:
    return ";".join(f"{pid}={lag}" for pid, lag in sorted(lags.items()))


def decode_lags(text: str | None) -> dict[str, int]:
    lags: dict[str, int] = {}
    for part in (text or "").split(";"):
        pid, _, lag = part.partition("=")
        if pid and lag.lstrip("-").isdigit():
            lags[pid] = int(lag)
    return lags


class WarmReplica:
    """A copy of one partition's state that follows the owner's commits.

    Example::

        replica = WarmReplica(StateLog(store, scope, "3"))
        await replica.follow(checkpoint)       # restore at first, then only the changes since
        replica.lag(checkpoint)                # events behind the owner's last checkpoint
    """

    def __init__(self, log: StateLog) -> None:
        self.log = log
        self.keeper = StateKeeper(log, epoch=0)
        self.sequence_number: int | None = None  # the checkpoint position the replica's state goes with
        self.loaded = False
        self.entries_read = 0

    @property
    def partition_id(self) -> str:
        return self.log.partition_id

    async def follow(self, checkpoint: Checkpoint | None) -> None:
        """Catch up with ``checkpoint`` (the owner's latest)."""
        if not self.loaded:
            restored = await self.keeper.restore(checkpoint)
            self.entries_read += restored.entries_read
            self.loaded = True
        else:
            applied = await self.keeper.catch_up(checkpoint)
            self.entries_read += max(applied, 0)
        self.sequence_number = None if checkpoint is None else checkpoint.sequence_number

    def lag(self, checkpoint: Checkpoint | None) -> int | None:
        """Events between the replica's state and ``checkpoint``; None before it loaded."""
        if not self.loaded:
            return None
        if checkpoint is None:
            return 0
        return max(0, checkpoint.sequence_number - (self.sequence_number if self.sequence_number is not None else -1))

    def hand_over(self, keeper: StateKeeper) -> None:
        """Give the replica's state to the claim that takes the partition: a copy, so a
        refresh of the replica still in flight (it started before the claim) cannot
        write into the state the new owner processes with."""
        keeper.adopt(self.keeper.state.copy(), self.keeper.head, self.sequence_number)
