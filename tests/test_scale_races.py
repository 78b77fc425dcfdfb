"""Races the scale benchmark (``python -m benchmarks.scale``) found on Azurite, pinned on
virtual time with the real processor and the in-memory store.

At 4096 partitions over 32 processes on 2 cores a listing takes tens of seconds to come
back; whatever the processor writes meanwhile is newer than that listing.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, List

from eventprocessor import EventProcessor, PartitionProcessor, StoreDataLostError
from eventprocessor.records import OwnershipListing
from eventprocessor.testing import FaultyStore, run_virtual

from benchmarks.harness import Cluster

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=30.0)


class LateAnswers(FaultyStore):
    """A link whose ownership listings are read when sent and answered ``delay`` seconds
    later, as a big listing parsed on a busy machine is."""

    delay = 3.0

    async def list_ownership(self, *scope: str) -> OwnershipListing:
        listing = await self.inner.list_ownership(*scope)
        await asyncio.sleep(self.delay)
        return listing


def test_a_handoff_written_while_a_slow_listing_is_in_flight_is_not_reported_as_store_data_loss(caplog):
    """Scale row: a processor handed partitions over (each handoff writes the record with
    the next epoch) while its own listing, sent before, was still on its way; that listing
    showed the epochs from before the handoff, and the processor reported "the epochs of
    partitions [...] went backwards": an ERROR, ``StoreDataLostError`` to every handler,
    ``stats.store_data_lost``, though the store had lost nothing."""

    errors: List[Exception] = []

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

    with caplog.at_level(logging.ERROR, logger="eventprocessor.processor"):
        balanced, stats = run_virtual(scenario())
    assert balanced is not None
    assert stats.handed_off >= 4
    assert stats.store_data_lost == 0
    assert not [e for e in errors if isinstance(e, StoreDataLostError)]
    assert not [r for r in caplog.records if "went backwards" in r.getMessage()]
