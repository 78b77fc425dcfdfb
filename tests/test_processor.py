"""EventProcessor end to end on the in-memory store and source (real time, short intervals)."""
from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Callable, Dict, List, Set, Tuple

import pytest

from eventprocessor import (CheckpointStoreError, CloseReason, ConfigurationError, EventProcessor, EventPosition,
                            OwnershipLostError, PartitionProcessor)
from eventprocessor.sources import MemoryEventSource
from stores import InMemoryCheckpointStore

FAST = dict(load_balancing_interval=0.1, partition_ownership_expiration_interval=1.0)


async def eventually(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


class AuditedStore(InMemoryCheckpointStore):
    """The real in-memory store, plus a log of who wrote which checkpoint and who owned
    the partition at that moment."""

    def __init__(self) -> None:
        super().__init__()
        self.accepted: List[Tuple[str, str, int, int, str, int]] = []
        self.refused = 0

    async def update_checkpoint(self, checkpoint, *, owner_id, epoch):
        try:
            await super().update_checkpoint(checkpoint, owner_id=owner_id, epoch=epoch)
        except OwnershipLostError:
            self.refused += 1
            raise
        scope = (checkpoint.fully_qualified_namespace, checkpoint.eventhub_name, checkpoint.consumer_group)
        current = self._ownership[scope][checkpoint.partition_id]
        self.accepted.append((checkpoint.partition_id, owner_id, epoch, checkpoint.sequence_number,
                              current.owner_id, current.epoch))


class Recorder(PartitionProcessor):
    processed: Dict[str, Set[Tuple[str, int]]] = defaultdict(set)
    deliveries: List[Tuple[str, int]] = []
    closes: List[Tuple[str, CloseReason]] = []

    async def process_events(self, events, context):
        for event in events:
            self.processed[context.owner_id].add((context.partition_id, event.sequence_number))
            self.deliveries.append((context.partition_id, event.sequence_number))
        try:
            await context.update_checkpoint()
        except OwnershipLostError:
            pass

    async def close(self, reason, context):
        self.closes.append((context.partition_id, reason))


def recorder_class():
    return type("Rec", (Recorder,), {"processed": defaultdict(set), "deliveries": [], "closes": []})


async def test_four_processors_32_partitions_balance_then_stop_and_crash_lose_nothing():
    source = MemoryEventSource(32)
    store = AuditedStore()
    handler = recorder_class()
    processors = [EventProcessor(source, store, handler, owner_id=f"p{i}", **FAST) for i in range(4)]
    produced: List[Tuple[str, int]] = []
    stop_producing = asyncio.Event()

    async def produce():
        i = 0
        while not stop_producing.is_set():
            event = await source.send(f"e{i}", partition_id=str(i % 32))
            produced.append((str(i % 32), event.sequence_number))
            i += 1
            if i % 64 == 0:
                await asyncio.sleep(0.005)

    producer = asyncio.create_task(produce())
    for p in processors:
        await p.start()
    await eventually(lambda: sorted(len(p.owned_partitions) for p in processors) == [8, 8, 8, 8]
                     and len(set().union(*(p.owned_partitions for p in processors))) == 32, what="balance")

    await processors[0].stop()  # graceful: releases its partitions
    await processors[1].stop(release=False)  # crash: its records expire
    survivors = processors[2:]
    await eventually(lambda: sorted(len(p.owned_partitions) for p in survivors) == [16, 16]
                     and len(set().union(*(p.owned_partitions for p in survivors))) == 32, what="failover")
    stop_producing.set()
    await producer
    processed = lambda: set().union(*handler.processed.values())  # noqa: E731
    await eventually(lambda: set(produced) <= processed(), what="every event processed")
    for p in survivors:
        await p.stop()

    assert set(produced) <= processed()
    assert len(produced) > 1000
    # no checkpoint was ever accepted from anyone but the current owner at that moment
    assert store.accepted and all(owner == cur_owner and epoch == cur_epoch
                                  for _pid, owner, epoch, _seq, cur_owner, cur_epoch in store.accepted)
    # so stored checkpoints never move backwards
    last: Dict[str, int] = {}
    for pid, _owner, _epoch, seq, _co, _ce in store.accepted:
        assert seq >= last.get(pid, -1)
        last[pid] = seq
    # the stopped processor closed with SHUTDOWN and released: nothing was left to expire
    listing = await store.list_ownership(source.fully_qualified_namespace, source.eventhub_name, "$default")
    assert all(r.owner_id == "" for r in listing.ownerships)


async def test_handler_errors_go_to_process_error_and_the_partition_resumes_from_its_checkpoint():
    source = MemoryEventSource(1)
    for i in range(10):
        await source.send(str(i))
    errors: List[Exception] = []
    delivered: List[int] = []

    class Flaky(PartitionProcessor):
        failed = False

        async def process_events(self, events, context):
            delivered.extend(e.sequence_number for e in events)
            if events[0].sequence_number == 0:
                await context.update_checkpoint(events[3])
            if not Flaky.failed and events[-1].sequence_number >= 5:
                Flaky.failed = True
                raise RuntimeError("boom in handler")

        async def process_error(self, error, context):
            errors.append(error)

    processor = EventProcessor(source, InMemoryCheckpointStore(), Flaky, max_batch_size=6, **FAST)
    async with processor:
        await eventually(lambda: delivered.count(9) >= 1 and Flaky.failed, what="redelivery")
    assert [str(e) for e in errors] == ["boom in handler"]
    # first delivery 0..5 failed after checkpointing 3; the partition resumed at 4
    assert delivered[:6] == [0, 1, 2, 3, 4, 5] and delivered[6] == 4
    assert sorted(set(delivered)) == list(range(10))


async def test_slow_handler_stalls_neither_other_partitions_nor_the_balancing_loop():
    source = MemoryEventSource(4)
    gate = asyncio.Event()
    done: Set[str] = set()

    class Slow(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "0":
                await gate.wait()
            done.add(context.partition_id)

    processor = EventProcessor(source, InMemoryCheckpointStore(), Slow, load_balancing_strategy="greedy", **FAST)
    async with processor:
        await eventually(lambda: len(processor.owned_partitions) == 4, what="all owned")
        for pid in "0123":
            await source.send("x", partition_id=pid)
        await eventually(lambda: done == {"1", "2", "3"}, what="other partitions processed")
        ticks = processor.ticks
        await eventually(lambda: processor.ticks >= ticks + 3, what="loop keeps ticking")
        gate.set()
        await eventually(lambda: "0" in done, what="slow partition finished")


async def test_steal_closes_old_claim_with_ownership_lost_and_fences_its_checkpoint():
    source = MemoryEventSource(2)
    store = InMemoryCheckpointStore()
    contexts = {}
    closes = []

    class Keep(PartitionProcessor):
        async def initialize(self, context):
            contexts[(context.owner_id, context.partition_id)] = context

        async def close(self, reason, context):
            closes.append((context.owner_id, context.partition_id, reason))

    a = EventProcessor(source, store, Keep, owner_id="a", **FAST)
    await a.start()
    await eventually(lambda: a.owned_partitions == {"0", "1"}, what="a owns both")
    b = EventProcessor(source, store, Keep, owner_id="b", **FAST)
    await b.start()
    await eventually(lambda: len(b.owned_partitions) == 1 and len(a.owned_partitions) == 1, what="steal")
    (stolen,) = b.owned_partitions
    await eventually(lambda: ("a", stolen, CloseReason.OWNERSHIP_LOST) in closes, what="close(OWNERSHIP_LOST)")
    await source.send("e", partition_id=stolen)
    new_ctx = contexts[("b", stolen)]
    await eventually(lambda: new_ctx.last_event is not None, what="b received")
    await new_ctx.update_checkpoint()
    old_ctx = contexts[("a", stolen)]
    old_ctx.last_event = new_ctx.last_event
    with pytest.raises(OwnershipLostError):
        await old_ctx.update_checkpoint()
    # even bypassing the local check, the store refuses the old epoch
    with pytest.raises(OwnershipLostError):
        await store.update_checkpoint(new_ctx.last_checkpoint, owner_id="a", epoch=old_ctx.epoch)
    (cp,) = [c for c in await store.list_checkpoints("memory.local", "hub", "$default") if c.partition_id == stolen]
    assert (cp.owner_id, cp.epoch) == ("b", new_ctx.epoch)
    await a.stop()
    await b.stop()
    assert ("b", stolen, CloseReason.SHUTDOWN) in closes


async def test_stop_releases_so_another_processor_claims_without_waiting_for_expiry():
    source = MemoryEventSource(4)
    store = InMemoryCheckpointStore()
    slow = dict(load_balancing_interval=0.1, partition_ownership_expiration_interval=30.0)
    a = EventProcessor(source, store, PartitionProcessor, owner_id="a", load_balancing_strategy="greedy", **slow)
    await a.start()
    await eventually(lambda: len(a.owned_partitions) == 4, what="a owns all")
    await a.stop()
    listing = await store.list_ownership("memory.local", "hub", "$default")
    assert {r.owner_id for r in listing.ownerships} == {""}
    b = EventProcessor(source, store, PartitionProcessor, owner_id="b", load_balancing_strategy="greedy", **slow)
    await b.start()
    await eventually(lambda: len(b.owned_partitions) == 4, timeout=5, what="b claims released partitions")
    await b.stop()


class FlakyStore(InMemoryCheckpointStore):
    """The in-memory store with an outage switch (fault injection, not a mock)."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def _check(self):
        if self.down:
            raise CheckpointStoreError("store unreachable (injected outage)")

    async def list_ownership(self, *args):
        self._check()
        return await super().list_ownership(*args)

    async def claim_ownership(self, ownerships):
        self._check()
        return await super().claim_ownership(ownerships)


async def test_self_fencing_stops_dispatch_before_the_lease_could_expire_on_the_store():
    source = MemoryEventSource(2)
    store = FlakyStore()
    closes = []
    errors = []

    class Watch(PartitionProcessor):
        async def close(self, reason, context):
            closes.append(reason)

        async def process_error(self, error, context):
            errors.append(error)

    loop = asyncio.get_running_loop()
    processor = EventProcessor(source, store, Watch, load_balancing_strategy="greedy",
                               load_balancing_interval=0.1, partition_ownership_expiration_interval=2.0)
    await processor.start()
    await eventually(lambda: len(processor.owned_partitions) == 2, what="owns both")
    listing = await store.list_ownership("memory.local", "hub", "$default")
    last_write = max(r.last_modified_time for r in listing.ownerships)
    store.down = True
    await eventually(lambda: not processor.owned_partitions, timeout=10, what="self-fenced")
    fenced_at = store.now()
    # stopped dispatching before the records could be judged expired by the store
    assert (fenced_at - last_write).total_seconds() < 2.0
    await eventually(lambda: closes == [CloseReason.OWNERSHIP_LOST] * 2, what="close(OWNERSHIP_LOST)")
    assert any(isinstance(e, CheckpointStoreError) for e in errors)
    store.down = False
    await eventually(lambda: len(processor.owned_partitions) == 2, what="recovers after the outage")
    await processor.stop()
    del loop


def test_configuration_errors_name_the_problem():
    source, store = MemoryEventSource(1), InMemoryCheckpointStore()
    with pytest.raises(ConfigurationError, match="load_balancing_interval"):
        EventProcessor(source, store, PartitionProcessor, load_balancing_interval=0)
    with pytest.raises(ConfigurationError, match="longer than load_balancing_interval"):
        EventProcessor(source, store, PartitionProcessor, load_balancing_interval=10,
                       partition_ownership_expiration_interval=5)
    with pytest.raises(ConfigurationError, match="load_balancing_strategy"):
        EventProcessor(source, store, PartitionProcessor, load_balancing_strategy="fastest")
    with pytest.raises(ConfigurationError, match="PartitionProcessor"):
        EventProcessor(source, store, object)  # type: ignore[arg-type]


async def test_factory_callable_and_initial_position_per_partition():
    source = MemoryEventSource(2)
    for i in range(4):
        await source.send(str(i), partition_id=str(i % 2))
    seen: List[Tuple[str, int]] = []

    class Collect(PartitionProcessor):
        async def process_events(self, events, context):
            seen.extend((context.partition_id, e.sequence_number) for e in events)

    processor = EventProcessor(source, InMemoryCheckpointStore(), lambda: Collect(),
                               load_balancing_strategy="greedy",
                               initial_event_position={"0": EventPosition.from_sequence_number(0),
                                                       "1": EventPosition.earliest()}, **FAST)
    async with processor:
        await eventually(lambda: len(seen) == 3, what="3 events")
    assert sorted(seen) == [("0", 1), ("1", 0), ("1", 1)]
