"""Blocking handlers run off the event loop, in real time.

A handler that blocks (``time.sleep``, CPU-bound code, a synchronous HTTP call) held the
processor's event loop: no lease was renewed, so the lease ran out and the partition
moved. With ``handler_executor="thread"`` (or an executor of the user's) the same
handler runs on a worker thread: leases are renewed, other partitions keep flowing and
``update_checkpoint`` from the thread is carried out on the processor's loop.

Real time on purpose (virtual time cannot pass while a thread sleeps); the leases are
short (expiration 3 s, lease 2.25 s) and the bounds generous.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time

import pytest

from eventprocessor import ConfigurationError, EventProcessor, PartitionProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

SHORT = dict(load_balancing_interval=0.3, partition_ownership_expiration_interval=3.0)
BLOCK = 3.5  # longer than the lease


def blocking_handler(log: list[tuple[str, int, float, str]]) -> type:
    class Blocking(PartitionProcessor):
        async def process_events(self, events, context):
            log.append((context.partition_id, events[0].sequence_number, time.monotonic(),
                        threading.current_thread().name))
            if context.partition_id == "0" and events[0].sequence_number == 0:
                time.sleep(BLOCK)  # blocking work
            await context.update_checkpoint()

    return Blocking


async def run(executor) -> tuple[EventProcessor, list[tuple[str, int, float, str]], list]:
    log: list[tuple[str, int, float, str]] = []
    source, store = InMemoryEventSource(2), InMemoryCheckpointStore()
    processor = EventProcessor(source, store, blocking_handler(log), handler_executor=executor, **SHORT)
    async with processor:
        deadline = time.monotonic() + 10
        while processor.owned_partitions != {"0", "1"}:
            assert time.monotonic() < deadline, "the processor did not claim both partitions"
            await asyncio.sleep(0.05)
        await source.send("block", partition_id="0")
        await asyncio.sleep(0.2)
        started = time.monotonic()
        while time.monotonic() - started < BLOCK + 1:  # partition 1 keeps getting events meanwhile
            await source.send("flow", partition_id="1")
            await asyncio.sleep(0.25)
        await asyncio.sleep(1)
    checkpoints = await store.list_checkpoints("memory.local", "hub", "$default")
    return processor, log, checkpoints


@pytest.mark.slow
def test_a_blocking_handler_on_the_event_loop_costs_its_lease():
    """The control: the same handler on the loop self-fences."""
    processor, _log, _checkpoints = asyncio.run(run(None))
    assert processor.stats.self_fenced >= 1


@pytest.mark.slow
def test_a_blocking_handler_in_a_worker_thread_keeps_every_lease_and_the_other_partitions_flowing():
    processor, log, checkpoints = asyncio.run(run("thread"))
    assert processor.stats.self_fenced == 0 and processor.stats.lost == 0
    blocked_at = next(at for pid, seq, at, _thread in log if pid == "0")
    during = [seq for pid, seq, at, _thread in log if pid == "1" and blocked_at < at < blocked_at + BLOCK]
    assert len(during) >= 5  # partition 1 was dispatched while partition 0's handler blocked
    assert all(thread != threading.main_thread().name for _pid, _seq, _at, thread in log)
    by_partition = {c.partition_id: c.sequence_number for c in checkpoints}
    assert by_partition["0"] == 0  # the checkpoint from the worker thread was written


@pytest.mark.slow
def test_an_executor_of_the_users_runs_the_handlers():
    pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="mine")
    try:
        processor, log, checkpoints = asyncio.run(run(pool))
    finally:
        pool.shutdown()
    assert processor.stats.self_fenced == 0
    assert {thread.split("_")[0] for _pid, _seq, _at, thread in log} == {"mine"}
    assert {c.partition_id for c in checkpoints} == {"0", "1"}


def test_a_process_pool_or_a_word_is_refused_with_the_choices():
    for wrong in ("threads", concurrent.futures.ProcessPoolExecutor(1), 4):
        with pytest.raises(ConfigurationError, match="handler_executor must be None"):
            EventProcessor(InMemoryEventSource(1), InMemoryCheckpointStore(), PartitionProcessor,
                           handler_executor=wrong)
