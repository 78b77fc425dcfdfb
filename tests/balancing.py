"""A tiny driver for balancer tests: processors tick against one InMemoryCheckpointStore
under a virtual store clock, using the real ``decide`` and the real store semantics."""
from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from eventprocessor._ownership.balancer import BalanceDecision, decide
from eventprocessor._ownership.strategies import fair_share
from eventprocessor.policies import LoadBalancingStrategy
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import Ownership

NS, HUB, CG = "ns.example", "hub", "$default"
EXPIRATION = 60.0
INTERVAL = 10.0


class VirtualTime:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Cluster:
    partitions: int
    strategy: LoadBalancingStrategy = LoadBalancingStrategy.BALANCED
    seed: int = 0
    time: VirtualTime = field(default_factory=VirtualTime)
    decisions: list[tuple] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.store = InMemoryCheckpointStore(clock=self.time)
        self.rngs: dict[str, random.Random] = {}

    @property
    def partition_ids(self) -> list[str]:
        return [str(i) for i in range(self.partitions)]

    async def tick(self, owner: str) -> BalanceDecision:
        rng = self.rngs.setdefault(owner, random.Random(f"{self.seed}-{owner}"))
        listing = await self.store.list_ownership(NS, HUB, CG)
        decision = decide(listing, self.partition_ids, owner, fully_qualified_namespace=NS, eventhub_name=HUB,
                          consumer_group=CG, strategy=self.strategy, expiration_interval=EXPIRATION,
                          renew_after=EXPIRATION / 2, rng=rng)
        self.decisions.append((owner, listing, decision))
        await self.store.claim_ownership(list(decision.renewals) + list(decision.claims))
        return decision

    async def round(self, owners: Iterable[str], seconds: float = INTERVAL) -> list[BalanceDecision]:
        decisions = [await self.tick(o) for o in owners]
        self.time.advance(seconds)
        return decisions

    async def seed_ownership(self, assignment: dict[str, str | None], age: float = 0.0) -> None:
        """Write records directly: partition -> owner (None = no record)."""
        self.time.advance(-age)
        await self.store.claim_ownership(
            Ownership(NS, HUB, CG, pid, owner, epoch=1) for pid, owner in assignment.items() if owner is not None)
        self.time.advance(age)

    async def live_counts(self, owners: Iterable[str]) -> dict[str, int]:
        listing = await self.store.list_ownership(NS, HUB, CG)
        counts = Counter({o: 0 for o in owners})
        for record in listing.ownerships:
            age = (listing.server_time - record.last_modified_time).total_seconds()
            if record.owner_id and age <= EXPIRATION and record.partition_id in self.partition_ids:
                counts[record.owner_id] += 1
        return dict(counts)

    async def unowned(self, owners: Iterable[str]) -> int:
        counts = await self.live_counts(owners)
        return self.partitions - sum(counts[o] for o in owners)

    async def balanced(self, owners: list[str]) -> bool:
        counts = await self.live_counts(owners)
        values = [counts[o] for o in owners]
        return sum(values) == self.partitions and max(values) - min(values) <= 1


def steal_is_allowed(decision: BalanceDecision, listing, owner: str, partitions: int) -> bool:
    """The seed's rule, judged in the claimer's own view of the snapshot."""
    counts: Counter = Counter()
    for record in listing.ownerships:
        age = (listing.server_time - record.last_modified_time).total_seconds()
        if record.owner_id and age <= EXPIRATION:
            counts[record.owner_id] += 1
    counts.setdefault(owner, 0)
    floor, _extra = fair_share(partitions, len(counts))
    for victim in decision.stolen_from.values():
        if counts[victim] > floor + 1:
            continue
        if counts[victim] == floor + 1 and counts[owner] < floor:
            continue
        return False
    return True
