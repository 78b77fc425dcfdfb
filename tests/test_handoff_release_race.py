"""A handoff or a release must not be lost to the owner's own renewal in flight.

The race, as it shows on real processes (``tests/test_handoff_processes.py``, interval
0.5 s, expiration 3 s): a renewal that lost to the handoff request is retried with the
refreshed etag just as the pump of the partition being handed over finishes. The renewal
lands first and changes the record's etag; the handoff write, conditional on the etag
before it, loses. Unless the owner writes it once more, the record still names the old
owner, which takes the partition back at its next tick (``taken over``) and hands it over
a second time: a second pause. A stopping owner would leave the partition to wait for its
record to expire (75 s by default).

The store here lets the owner's own renewal land just before its release or handoff
write, every time, on virtual time.
"""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from eventprocessor import CloseReason
from eventprocessor.stores.records import Ownership
from eventprocessor.testing import Cluster, FaultyStore, run_virtual

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0)


class RenewalLandsFirst(FaultyStore):
    """Before ``owner``'s first write that gives a partition away (a release or a
    handoff), rewrites that partition's record as it is: what the owner's own renewal
    in flight does to the record's etag."""

    def __init__(self, inner, owner: str) -> None:
        super().__init__(inner)
        self.owner = owner
        self.raced: set[str] = set()

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        claims = list(ownerships)
        for claim in claims:
            if claim.owner_id == self.owner or claim.partition_id in self.raced:
                continue
            listing = await self.inner.list_ownership(claim.fully_qualified_namespace, claim.eventhub_name,
                                                      claim.consumer_group)
            stored = next((r for r in listing.ownerships if r.partition_id == claim.partition_id), None)
            if stored is not None and stored.owner_id == self.owner:
                self.raced.add(claim.partition_id)
                assert await self.inner.claim_ownership([stored])  # the renewal, on the current etag
        return await super().claim_ownership(claims)


def test_a_handoff_is_written_once_even_when_the_owners_renewal_lands_first():
    async def scenario():
        cluster = Cluster(2, seed=5, work=0.2, **OPTIONS)
        store = RenewalLandsFirst(cluster.memory, "a")
        a = cluster.add("a", store=store)
        await a.start()
        assert await cluster.wait_until(lambda: len(a.owned_partitions) == 2, timeout=10) is not None
        producer = asyncio.ensure_future(cluster.produce_for(15, rate=20))
        await asyncio.sleep(2)
        b = cluster.add("b")
        await b.start()
        loop = asyncio.get_running_loop()
        joined = loop.time()
        moved = await cluster.wait_until(lambda: len(a.owned_partitions) == 1 and len(b.owned_partitions) == 1,
                                         timeout=20, step=0.05)
        await producer
        await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=20)
        stats = a.stats
        for p in (a, b):
            await p.stop()
        return cluster, store, None if moved is None else moved - joined, stats

    cluster, store, seconds, stats = run_virtual(scenario())
    handoffs = Counter(pid for owner, pid, reason in cluster.ledger.closes
                       if owner == "a" and reason is CloseReason.HANDOFF)
    assert handoffs and set(handoffs) <= store.raced  # the race happened on the handoff
    assert list(handoffs.values()) == [1], f"a handed over {dict(handoffs)} (once is right)"
    assert stats.handed_off == 1 and stats.adopted == 0, stats
    assert seconds is not None and seconds < 3 * OPTIONS["load_balancing_interval"], seconds
    assert cluster.ledger.duplicates() == 0


def test_a_release_at_stop_is_written_even_when_the_owners_renewal_lands_first():
    async def scenario():
        cluster = Cluster(2, seed=6, work=0.2, **OPTIONS)
        store = RenewalLandsFirst(cluster.memory, "a")
        a = cluster.add("a", store=store)
        b = cluster.add("b")
        await a.start()
        assert await cluster.wait_until(lambda: len(a.owned_partitions) == 2, timeout=10) is not None
        producer = asyncio.ensure_future(cluster.produce_for(10, rate=20))
        await asyncio.sleep(1)
        store.raced.add("0")  # partition 0 is handed over to b without a race
        await b.start()
        assert await cluster.wait_until(lambda: len(b.owned_partitions) == 1, timeout=20) is not None
        await asyncio.sleep(1)
        loop = asyncio.get_running_loop()
        stopped_at = loop.time()
        await a.stop()
        taken = await cluster.wait_until(lambda: len(b.owned_partitions) == 2, timeout=30, step=0.05)
        await producer
        await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=20)
        stats = a.stats
        await b.stop()
        return cluster, store, None if taken is None else taken - stopped_at, stats

    cluster, store, seconds, stats = run_virtual(scenario())
    assert store.raced == {"0", "1"}  # the race happened on the release of partition 1
    assert stats.released == 1, stats
    # Released, the partition is claimed at b's next tick, not once its record expired (12 s).
    assert seconds is not None and seconds < 2 * OPTIONS["load_balancing_interval"] + 0.5, seconds
    assert cluster.ledger.duplicates() == 0
