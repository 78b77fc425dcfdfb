"""Many events in flight per partition, with real processes, the session's Event Hubs
emulator and Azurite (:mod:`harness.concurrency_worker`): 16 calls in flight per
partition, each checkpointing its own events.

* SIGKILL: the next owner delivers again every event that was not done (the handler had
  not finished it), never one that was acked (its checkpoint had returned), and no more
  than the calls in flight could hold;
* a planned move (the first process stopped gracefully while a second runs): nothing
  is delivered twice.

Duplicates and losses are counted from the lines the handlers printed.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from harness.concurrency_worker import ConcurrentWorker, spawn
from harness.worker import create_container

pytestmark = [pytest.mark.azurite, pytest.mark.eventhubs, pytest.mark.slow]

PARTITIONS, EVENTS, KEYS, IN_FLIGHT, BATCH = 4, 1200, 60, 16, 10


async def _produce(connection_string: str, hub: str) -> None:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    async with EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub) as producer:
        for key in range(KEYS):
            batch = await producer.create_batch(partition_key=f"k{key}")
            for index in range(EVENTS // KEYS):
                batch.add(EventData(f"k{key}/{index}"))
            await producer.send_batch(batch)


async def _until(condition, what: str, workers: list[ConcurrentWorker], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n" + "\n".join(w.diagnostics() for w in workers))
        await asyncio.sleep(0.05)


async def test_after_sigkill_only_what_was_not_done_is_delivered_again_and_a_planned_move_repeats_nothing(
        azurite, eventhubs_emulator, tmp_path):
    options = ["--max-concurrency", str(IN_FLIGHT), "--batch", str(BATCH), "--latency", "0.2", "--expiry", "3"]
    common = dict(hub_connection_string=eventhubs_emulator.connection_string,
                  storage_connection_string=azurite.connection_string, log_dir=str(tmp_path), options=options)
    hub = eventhubs_emulator.fresh_hub(PARTITIONS)
    await create_container(azurite.connection_string, f"c-{hub}".lower())
    container = f"c-{hub}".lower()
    await _produce(eventhubs_emulator.connection_string, hub)
    workers: list[ConcurrentWorker] = []
    try:
        first = await spawn("first", hub=hub, container=container, **common)
        workers.append(first)
        await _until(lambda: len(first.acked) >= EVENTS // 4, "a quarter of the events acked", workers)
        first.kill()
        await first.process.wait()
        await asyncio.wait_for(first.reader, 10)
        second = await spawn("second", hub=hub, container=container, **common)
        workers.append(second)
        await _until(lambda: len(set(first.delivered) | set(second.delivered)) == EVENTS, "every event", workers)
        # A planned move: a third process joins, then the second stops gracefully.
        third = await spawn("third", hub=hub, container=container, **common)
        workers.append(third)
        await _until(lambda: len(third.owned) == PARTITIONS // 2, "the third process's share", workers)
        await second.stop()
        await _until(lambda: len(third.owned) == PARTITIONS, "the third process taking every partition", workers)
        await asyncio.sleep(2)
    finally:
        for worker in workers:
            await worker.stop()
    again = set(first.delivered) & set(second.delivered)
    never_done = set(first.delivered) - first.worked
    assert never_done <= again, sorted(never_done - again)[:10]  # every event not done is delivered again
    assert not again & first.acked, sorted(again & first.acked)[:10]  # nothing acked is delivered twice
    assert len(again) <= PARTITIONS * IN_FLIGHT * BATCH  # at most what the calls in flight held
    assert first.delivered.most_common(1)[0][1] == 1 and second.delivered.most_common(1)[0][1] == 1
    # The planned moves (the third joining, the second leaving) delivered nothing twice.
    assert not set(second.delivered) & set(third.delivered)
    print(f"\nSIGKILL with {PARTITIONS} x {IN_FLIGHT} calls of up to {BATCH} events in flight: "
          f"{len(first.delivered)} delivered by the first, {len(never_done)} of them not done, {len(first.acked)} "
          f"acked, {len(again)} delivered again "
          f"(bound {PARTITIONS * IN_FLIGHT * BATCH}); planned moves: 0 delivered twice")
