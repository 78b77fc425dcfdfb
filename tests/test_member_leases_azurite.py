"""The scale-out of ``tests/test_member_leases.py`` on the real transport: processors
with DEFAULT options on Azurite's Blob store, in real time, one store client each (as
separate processes would have). 32 partitions, 2 processors, then 2 more: the new ones
own their 8 partitions each within 3 s, every move a handoff, no event handled twice
(counted from what the handlers received).

The four processors share one event loop here, and every tick's Azure SDK calls cost
client CPU: on a machine with more runnable work than cores (``os.getloadavg()``), each
step takes that many times longer, so the 3 s bound is scaled by the oversubscription
measured during the run (1 on a machine with a core to spare)."""
from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from eventprocessor import EventProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import BlobCheckpointStore
from eventprocessor.testing import DeliveryRecorder, recording_handler

pytestmark = [pytest.mark.azurite]

PARTITIONS = 32


async def _until(condition, timeout: float, step: float = 0.05) -> float | None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while loop.time() < end:
        if condition():
            return loop.time()
        await asyncio.sleep(step)
    return None


async def test_a_scale_out_from_2_to_4_on_azurite_settles_within_3_seconds_with_no_duplicate(azurite):
    container = f"scaleout-{uuid.uuid4().hex[:10]}"
    source = InMemoryEventSource(PARTITIONS)
    recorder = DeliveryRecorder()
    handler = recording_handler(recorder, work=0.01)
    stores = [BlobCheckpointStore.from_connection_string(azurite.connection_string, container) for _ in range(4)]
    processors = [EventProcessor(source, stores[i], handler, owner_id=f"p{i}") for i in range(4)]

    def counts(running: list[EventProcessor]) -> list[int]:
        return sorted(len(p.owned_partitions) for p in running)

    async def produce() -> None:
        while True:
            for pid in range(PARTITIONS):
                await source.send(b"x", partition_id=str(pid))
            await asyncio.sleep(0.05)

    producer = asyncio.get_running_loop().create_task(produce())
    try:
        for p in processors[:2]:
            await p.start()
        assert await _until(lambda: counts(processors[:2]) == [16, 16], timeout=60) is not None
        await asyncio.sleep(2.0)
        started = asyncio.get_running_loop().time()
        for p in processors[2:]:
            await p.start()
        settled = await _until(lambda: counts(processors) == [8, 8, 8, 8], timeout=60)
        await asyncio.sleep(1.0)
    finally:
        producer.cancel()
        for p in processors:
            await p.stop()
        await stores[0].backend.client.delete_container()
        for store in stores:
            await store.close()
    took = None if settled is None else settled - started
    oversubscribed = max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))
    print(f"\nscale-out 2 -> 4 processors, {PARTITIONS} partitions on Azurite: settled in "
          f"{'-' if took is None else f'{took:.2f}'} s (CPU oversubscribed {oversubscribed:.1f}x)")
    assert took is not None and took <= 3.0 * oversubscribed, (took, oversubscribed)
    assert recorder.duplicates() == 0 and recorder.overlaps() == []
    assert sum(p.stats.steals for p in processors) == 0


async def test_a_cold_start_on_azurite_lists_every_record_about_once_per_processor(azurite):
    """8 processors started together on 64 partitions (``group_join_delay=1``, so that each
    plans with the whole group): each lists the ownership records once, claims its share
    and, settled, ignores the other processors' change notices. Counted from each
    processor's own store calls; duplicates from what the handlers received."""
    container = f"coldstart-{uuid.uuid4().hex[:10]}"
    partitions, count = 64, 8
    source = InMemoryEventSource(partitions)
    recorder = DeliveryRecorder()
    handler = recording_handler(recorder, work=0.0)
    stores = [BlobCheckpointStore.from_connection_string(azurite.connection_string, container) for _ in range(count)]
    processors = [EventProcessor(source, stores[i], handler, owner_id=f"c{i}", group_join_delay=1.0)
                  for i in range(count)]
    try:
        await asyncio.gather(*(p.start() for p in processors))
        balanced = await _until(lambda: sorted(len(p.owned_partitions) for p in processors) == [8] * count,
                                timeout=60)
        await asyncio.sleep(3.0)  # every change notice of the formation seen
        for pid in range(partitions):
            await source.send(b"x", partition_id=str(pid))
        delivered = await _until(lambda: len(recorder.processed()) == partitions, timeout=30)
        listings = sum(n for p in processors for op, n in p.store_calls.calls.items()
                       if op.startswith("list_ownership"))
        lost_races = sum(1 for p in processors if p.stats.claims_lost)  # processors that lost a claim race
    finally:
        for p in processors:
            await p.stop()
        await stores[0].backend.client.delete_container()
        for store in stores:
            await store.close()
    print(f"\ncold start of {count} processors on {partitions} partitions on Azurite: {listings} ownership listings, "
          f"{lost_races} processors lost a claim race")
    assert balanced is not None and delivered is not None
    assert listings <= count + lost_races, (listings, lost_races)
    assert recorder.duplicates() == 0 and recorder.overlaps() == []
