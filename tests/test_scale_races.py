"""Races the scale benchmark (``python -m benchmarks.scale``) found on Azurite, pinned on
virtual time with the real processor and the in-memory store.

At 4096 partitions over 32 processes on 2 cores a listing takes tens of seconds to come
back; whatever the processor writes meanwhile is newer than that listing.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from eventprocessor import EventProcessor, PartitionProcessor, StoreDataLostError
from eventprocessor.testing import Cluster, FaultyStore, run_virtual

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=30.0)


class LateAnswers(FaultyStore):
    """A link whose ownership listings are read when sent and answered ``delay`` seconds
    later, as a big listing parsed on a busy machine is."""

    delay = 3.0

    async def forward(self, operation: str, call: Any, units: int = 1) -> Any:
        if operation != "list_ownership":  # the tick's listing (ownership and members together)
            return await super().forward(operation, call, units)
        listing = await call()
        await asyncio.sleep(self.delay)
        return listing


def test_a_handoff_written_while_a_slow_listing_is_in_flight_is_not_reported_as_store_data_loss(caplog):
    """Scale row: a processor handed partitions over (each handoff writes the record with
    the next epoch) while its own listing, sent before, was still on its way; that listing
    showed the epochs from before the handoff, and the processor reported "the epochs of
    partitions [...] went backwards": an ERROR, ``StoreDataLostError`` to every handler,
    ``stats.store_data_lost``, though the store had lost nothing."""

    errors: list[Exception] = []

    class SlowClose(PartitionProcessor):
        async def process_events(self, events: Any, context: Any) -> None:
            pass

        async def process_error(self, error: Exception, context: Any) -> None:
            errors.append(error)

        async def close(self, reason: Any, context: Any) -> None:
            await asyncio.sleep(0.5)  # the handoff is written a little after the listing that asked for it

    async def scenario():
        cluster = Cluster(8, seed=4, **OPTIONS)
        link = LateAnswers(cluster.memory)
        a = EventProcessor(cluster.source, link, SlowClose, owner_id="a", error_handler=lambda e, c: errors.append(e),
                           **OPTIONS)
        await a.start()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 8, timeout=60)
        b = cluster.add("b", load_balancing_strategy="balanced")
        await b.start()
        balanced = await cluster.wait_until(
            lambda: len(a.owned_partitions) == 4 and len(b.owned_partitions) == 4, timeout=120)
        await asyncio.sleep(10)  # a few more slow listings after the handoffs
        stats = a.stats
        await b.stop()
        await a.stop()
        return balanced, stats

    with caplog.at_level(logging.ERROR, logger="eventprocessor"):
        balanced, stats = run_virtual(scenario())
    assert balanced is not None
    assert stats.handed_off >= 4
    assert stats.store_data_lost == 0
    assert not [e for e in errors if isinstance(e, StoreDataLostError)]
    assert not [r for r in caplog.records if "went backwards" in r.getMessage()]


class Crowded(FaultyStore):
    """A client whose requests share its CPU (or a store that serves them one by one):
    a call takes ``cost`` seconds per request in flight when it starts. Claims count one
    request per record, a fence three."""

    cost = 0.03

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.in_flight = 0
        self.most = 0

    async def _crowded(self, requests: int, call: Any) -> Any:
        self.in_flight += requests
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.cost * self.in_flight)
            return await call()
        finally:
            self.in_flight -= requests

    async def claim_ownership(self, ownerships: Any) -> Any:
        claims = list(ownerships)
        return await self._crowded(len(claims), lambda: self.inner.claim_ownership(claims))

    async def fence_checkpoint(self, ownership: Any) -> Any:
        return await self._crowded(3, lambda: self.inner.fence_checkpoint(ownership))


def test_hundreds_of_claims_and_renewals_on_a_busy_client_are_all_written_in_time():
    """Scale row: 4096 partitions over 16 processes on 2 cores. Each processor's first
    tick wrote its 256 claims in one store call and then fenced all 256 at once; on a
    client whose CPU those requests share, every call outlived its store timeout, the
    claims counted as not won, and every later tick did the same again: after minutes,
    most processors owned nothing. The renewer wrote all the leases due in one call too,
    which ran out the same way. Now claims and renewals go 32 per call, with at most 32
    fences in flight beside the next call of claims, so each deadline covers its own
    requests and a few calls'."""

    async def scenario():
        cluster = Cluster(256, seed=9)
        link = Crowded(cluster.memory)
        a = cluster.add("a", store=link, load_balancing_strategy="greedy", load_balancing_interval=2.0,
                        partition_ownership_expiration_interval=60.0, ownership_renewal="partition")
        await a.start()
        owned = await cluster.wait_until(lambda: len(a.owned_partitions) == 256, timeout=180)
        await asyncio.sleep(150)  # every lease renewed at least twice
        still = len(a.owned_partitions)
        stats, timeout, most = a.stats, a.timing.store_timeout, link.most
        await a.stop()
        return owned, still, stats, most, timeout

    owned, still, stats, most, timeout = run_virtual(scenario())
    assert timeout == 5.0 and Crowded.cost * 256 > timeout  # one call of all the claims would time out
    assert owned is not None, "the processor never took its partitions"
    assert still == 256
    assert stats.self_fenced == 0 and stats.renewals >= 2 * 256
    assert most <= 32 * 3 + 32  # one batch's fences beside the next batch's claims
