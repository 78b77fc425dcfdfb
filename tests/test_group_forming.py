"""A group forming: with ``group_join_delay``, processors started together wait for the
member set to settle before their first claims (``Membership.form_group``, Kafka's ``group.initial.rebalance.delay``
on member records), so each claims its final share at once.

Virtual time, the in-memory store and source, every processor's real balancing loop
(``start()``). Without the wait, a processor that listed the members before the others had
written theirs claimed by a partial view, and the group then moved partitions to each late
joiner by handoffs: 16 processors started over 1 s on 1,024 partitions balanced after
6.6-10.9 s with 581-935 partitions handed over (4 seeds, 2026-11-29).
"""
from __future__ import annotations

import asyncio
import random

import pytest

from eventprocessor import EventProcessor, PartitionProcessor
from eventprocessor._ownership.membership import JOIN_MAX_FACTOR
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import FaultyStore, run_virtual, virtual_utc_clock

SEEDS = range(10)
DELAY = 1.0  # group_join_delay


class Idle(PartitionProcessor):
    async def process_events(self, events, context):
        pass


async def _until(condition, *, timeout: float, step: float = 0.05) -> float | None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    while not condition():
        if loop.time() - started > timeout:
            return None
        await asyncio.sleep(step)
    return loop.time() - started


def _group(partitions: int, seed: int) -> tuple[InMemoryEventSource, FaultyStore]:
    source = InMemoryEventSource(partitions, clock=virtual_utc_clock())
    store = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()), rng=random.Random(seed))
    store.latency, store.jitter = 0.02, True
    return source, store


@pytest.mark.parametrize("seed", SEEDS)
def test_processors_started_within_a_second_claim_their_final_shares_at_once(seed):
    partitions, count, spread = 256, 16, 1.0

    async def scenario():
        rng = random.Random(seed)
        source, store = _group(partitions, seed)
        processors = [EventProcessor(source, store, Idle, owner_id=f"p{i:02d}", group_join_delay=DELAY)
                      for i in range(count)]

        async def start(processor: EventProcessor) -> None:
            await asyncio.sleep(rng.uniform(0, spread))
            await processor.start()

        loop = asyncio.get_running_loop()
        started = loop.time()
        await asyncio.gather(*(start(p) for p in processors))
        took = await _until(lambda: all(len(p.owned_partitions) == partitions // count for p in processors),
                            timeout=60)
        took = None if took is None else loop.time() - started
        stats = [p.stats for p in processors]
        for p in processors:
            await p.stop()
        return took, stats

    took, stats = run_virtual(scenario())
    assert took is not None, "not balanced within 60 s"
    # Every partition claimed once, by its final owner: nothing handed over or stolen.
    assert sum(s.handed_off for s in stats) == 0
    assert sum(s.steals for s in stats) == 0
    assert sum(s.claims_won for s in stats) == partitions
    # The last one joins within `spread`; the set is seen unchanged for one settle
    # (listed every quarter interval), then one tick claims.
    assert took <= spread + DELAY * 1.25 + 1.5  # one tick of the default 1-s interval, jittered, took


def test_a_processor_joining_a_running_group_does_not_wait_for_it_to_form():
    """The wait is for a forming group only: a third processor joining two that own
    everything asks for its share at its first tick."""

    async def scenario():
        source, store = _group(12, 0)
        first = [EventProcessor(source, store, Idle, owner_id=name, group_join_delay=DELAY) for name in ("a", "b")]
        for p in first:
            await p.start()
        assert await _until(lambda: all(len(p.owned_partitions) == 6 for p in first), timeout=30) is not None
        late = EventProcessor(source, store, Idle, owner_id="c", group_join_delay=DELAY)
        await late.start()
        took = await _until(lambda: len(late.owned_partitions) == 4, timeout=30)
        for p in [*first, late]:
            await p.stop()
        return took

    took = run_virtual(scenario())
    assert took is not None and took < 1.5, took


def test_a_lone_processor_waits_one_settle_and_a_group_that_keeps_growing_at_most_the_cap():
    async def scenario():
        source, store = _group(8, 0)
        loop = asyncio.get_running_loop()
        lone = EventProcessor(source, store, Idle, owner_id="lone", group_join_delay=DELAY)
        started = loop.time()
        await lone.start()
        alone = await _until(lambda: len(lone.owned_partitions) == 8, timeout=30)
        await lone.stop()
        # A group where a new member joins every half delay, for ten seconds: the
        # first ones claim by the cap, however long the joining goes on.
        source, store = _group(64, 1)
        joining = [EventProcessor(source, store, Idle, owner_id=f"g{i:02d}", group_join_delay=DELAY) for i in range(20)]
        started = loop.time()
        await joining[0].start()
        first_claim = None
        for p in joining[1:]:
            await asyncio.sleep(DELAY / 2)
            await p.start()
            if first_claim is None and joining[0].owned_partitions:
                first_claim = loop.time() - started
        for p in joining:
            await p.stop()
        return alone, first_claim

    alone, first_claim = run_virtual(scenario())
    assert alone is not None and DELAY <= alone <= DELAY * 1.25 + 1.5
    assert first_claim is not None and first_claim <= JOIN_MAX_FACTOR * DELAY + 1.5, first_claim
