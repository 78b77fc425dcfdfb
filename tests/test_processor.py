"""EventProcessor end to end on the in-memory store and source, on virtual time.

Every test runs on :class:`~eventprocessor.testing.VirtualTimeLoop`: leases, ticks,
retries and handler work take virtual seconds, so the tests are fast and deterministic,
and they still run the real processor, store and source code.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

from eventprocessor import (
    CloseReason,
    ConfigurationError,
    EventPosition,
    EventProcessor,
    FailurePolicy,
    InvalidCheckpointError,
    OwnershipLostError,
    PartitionProcessor,
    PoisonEventsError,
)
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import run_virtual, virtual_utc_clock

FAST = dict(load_balancing_interval=0.5, partition_ownership_expiration_interval=6.0)


async def until(condition, *, timeout: float = 60.0, what: str = "condition") -> float:
    """Wait (virtual time) until ``condition()``; returns the loop time it held."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} virtual seconds waiting for {what}")
        await asyncio.sleep(0.05)
    return loop.time()


def new_store() -> InMemoryCheckpointStore:
    return InMemoryCheckpointStore(clock=virtual_utc_clock())


def new_source(partitions: int) -> InMemoryEventSource:
    return InMemoryEventSource(partitions, clock=virtual_utc_clock())


class AuditedStore(InMemoryCheckpointStore):
    """The real in-memory store, plus a log of who wrote which checkpoint and who owned
    the partition at that moment."""

    def __init__(self) -> None:
        super().__init__(clock=virtual_utc_clock())
        self.accepted: list[tuple[str, str, int, int, str, int]] = []

    async def update_checkpoint(self, checkpoint, *, owner_id, epoch):
        await super().update_checkpoint(checkpoint, owner_id=owner_id, epoch=epoch)
        listing = await self.list_ownership(checkpoint.fully_qualified_namespace, checkpoint.eventhub_name,
                                            checkpoint.consumer_group)
        current = {r.partition_id: r for r in listing.ownerships}[checkpoint.partition_id]
        self.accepted.append((checkpoint.partition_id, owner_id, epoch, checkpoint.sequence_number,
                              current.owner_id, current.epoch))


def recorder_class():
    class Recorder(PartitionProcessor):
        processed: dict[str, set[tuple[str, int]]] = defaultdict(set)
        closes: list[tuple[str, CloseReason]] = []

        async def process_events(self, events, context):
            for event in events:
                self.processed[context.owner_id].add((context.partition_id, event.sequence_number))
            try:
                await context.update_checkpoint()
            except OwnershipLostError:
                pass

        async def close(self, reason, context):
            self.closes.append((context.partition_id, reason))

    return Recorder


def test_four_processors_32_partitions_balance_then_stop_and_crash_lose_nothing():
    async def scenario():
        source, store, handler = new_source(32), AuditedStore(), recorder_class()
        processors = [EventProcessor(source, store, handler, owner_id=f"p{i}", **FAST) for i in range(4)]
        produced: list[tuple[str, int]] = []
        stop_producing = asyncio.Event()

        async def produce():
            i = 0
            while not stop_producing.is_set():
                event = await source.send(f"e{i}", partition_id=str(i % 32))
                produced.append((str(i % 32), event.sequence_number))
                i += 1
                await asyncio.sleep(0.002)

        producer = asyncio.ensure_future(produce())
        for p in processors:
            await p.start()
        await until(lambda: sorted(len(p.owned_partitions) for p in processors) == [8, 8, 8, 8]
                    and len(set().union(*(p.owned_partitions for p in processors))) == 32, what="balance")
        await processors[0].stop()  # graceful: releases its partitions
        await processors[1].stop(release=False)  # crash: its records expire
        survivors = processors[2:]
        await until(lambda: sorted(len(p.owned_partitions) for p in survivors) == [16, 16]
                    and len(set().union(*(p.owned_partitions for p in survivors))) == 32, what="failover")
        stop_producing.set()
        await producer
        processed = lambda: set().union(*handler.processed.values())  # noqa: E731
        await until(lambda: set(produced) <= processed(), what="every event processed")
        for p in survivors:
            await p.stop()
        listing = await store.list_ownership(source.fully_qualified_namespace, source.eventhub_name, "$default")
        return produced, processed(), store.accepted, listing

    produced, processed, accepted, listing = run_virtual(scenario())
    assert set(produced) <= processed and len(produced) > 1000
    # no checkpoint was ever accepted from anyone but the current owner at that moment
    assert accepted and all(owner == cur_owner and epoch == cur_epoch
                            for _pid, owner, epoch, _seq, cur_owner, cur_epoch in accepted)
    last: dict[str, int] = {}
    for pid, _owner, _epoch, seq, _co, _ce in accepted:  # so stored checkpoints never move backwards
        assert seq >= last.get(pid, -1)
        last[pid] = seq
    assert all(r.owner_id == "" for r in listing.ownerships)  # everyone left gracefully at the end


def test_a_failing_batch_is_redelivered_from_memory_then_succeeds():
    errors: list[Exception] = []
    delivered: list[int] = []

    class Flaky(PartitionProcessor):
        failed = False

        async def process_events(self, events, context):
            delivered.extend(e.sequence_number for e in events)
            if not Flaky.failed and events[-1].sequence_number >= 5:
                Flaky.failed = True
                raise RuntimeError("boom in handler")
            await context.update_checkpoint()

        async def process_error(self, error, context):
            errors.append(error)

    async def scenario():
        source = new_source(1)
        for i in range(10):
            await source.send(str(i))
        p = EventProcessor(source, new_store(), Flaky, max_batch_size=6, **FAST)
        async with p:
            await until(lambda: 9 in delivered, what="the rest of the partition")

    run_virtual(scenario())
    assert [str(e) for e in errors] == ["boom in handler"]
    assert delivered[:12] == [0, 1, 2, 3, 4, 5] * 2  # the same batch again, once
    assert delivered[12:] == [6, 7, 8, 9]


def test_an_event_that_always_fails_is_retried_a_bounded_number_of_times_then_skipped():
    """A handler that raises on one event every time must not see its batch redelivered
    forever, holding back the events after it."""
    seen: dict[int, int] = defaultdict(int)
    poison_errors: list[PoisonEventsError] = []
    dead: list[int] = []

    class Picky(PartitionProcessor):
        async def process_events(self, events, context):
            for e in events:
                seen[e.sequence_number] += 1
            if any(e.sequence_number == 17 for e in events):
                raise ValueError("cannot parse event 17")
            await context.update_checkpoint()

        async def process_error(self, error, context):
            if isinstance(error, PoisonEventsError):
                poison_errors.append(error)

    async def dead_letter(events, error, context):
        dead.extend(e.sequence_number for e in events)

    async def scenario():
        source, store = new_source(1), new_store()
        for i in range(40):
            await source.send(str(i))
        p = EventProcessor(source, store, Picky, max_batch_size=25,
                           failure_policy=FailurePolicy(max_delivery_attempts=3, dead_letter=dead_letter), **FAST)
        async with p:
            done = await until(lambda: seen[39] >= 1, what="events after the poison one")
            await asyncio.sleep(60)  # nothing more is redelivered
        checkpoints = await store.list_checkpoints("memory.local", "hub", "$default")
        return done, checkpoints

    done, checkpoints = run_virtual(scenario())
    assert seen[17] == 3  # once in its batch, twice alone: max_delivery_attempts in all
    assert all(seen[i] <= 2 for i in range(17)), seen  # the events before it: once more, no more
    assert all(seen[i] >= 1 for i in range(40))
    assert [e.events[0].sequence_number for e in poison_errors] == [17]
    assert poison_errors[0].attempts == 3 and isinstance(poison_errors[0].__cause__, ValueError)
    assert dead == [17]
    assert checkpoints[0].sequence_number == 39
    assert done < 30


def test_park_policy_stops_only_the_poisoned_partition():
    class Picky(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "0":
                raise ValueError("always")

    async def scenario():
        source = new_source(2)
        await source.send("x", partition_id="0")
        p = EventProcessor(source, new_store(), Picky,
                           failure_policy=FailurePolicy(on_poison="park", max_delivery_attempts=2), **FAST)
        async with p:
            await until(lambda: p.pump("0") is not None and p.pump("0").parked is not None, what="parked")
            await source.send("y", partition_id="1")
            await until(lambda: p.pump("1") is not None and p.pump("1").events_dispatched == 1, what="other runs")
            parked_still_owned = "0" in p.leases
        return parked_still_owned

    assert run_virtual(scenario())


def test_slow_handler_stalls_neither_other_partitions_nor_the_balancing_loop():
    gate = asyncio.Event()
    done: set[str] = set()

    class Slow(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "0":
                await gate.wait()
            done.add(context.partition_id)

    async def scenario():
        source = new_source(4)
        p = EventProcessor(source, new_store(), Slow, **FAST)
        async with p:
            await until(lambda: len(p.owned_partitions) == 4, what="all owned")
            for pid in "0123":
                await source.send("x", partition_id=pid)
            await until(lambda: done == {"1", "2", "3"}, what="other partitions processed")
            ticks = p.ticks
            await until(lambda: p.ticks >= ticks + 3, what="the loop keeps ticking")
            gate.set()
            await until(lambda: "0" in done, what="slow partition finished")

    run_virtual(scenario())


def test_steal_closes_old_claim_with_ownership_lost_and_fences_its_checkpoint():
    contexts = {}
    closes = []

    class Keep(PartitionProcessor):
        async def initialize(self, context):
            contexts[(context.owner_id, context.partition_id)] = context

        async def close(self, reason, context):
            closes.append((context.owner_id, context.partition_id, reason))

    async def scenario():
        source, store = new_source(2), new_store()
        a = EventProcessor(source, store, Keep, owner_id="a", handoff_timeout=None, **FAST)
        await a.start()
        await until(lambda: a.owned_partitions == {"0", "1"}, what="a owns both")
        b = EventProcessor(source, store, Keep, owner_id="b", handoff_timeout=None, **FAST)
        await b.start()
        await until(lambda: len(b.owned_partitions) == 1 and len(a.owned_partitions) == 1, what="steal")
        (stolen,) = b.owned_partitions
        await until(lambda: ("a", stolen, CloseReason.OWNERSHIP_LOST) in closes, what="close(OWNERSHIP_LOST)")
        await source.send("e", partition_id=stolen)
        new_ctx = contexts[("b", stolen)]
        await until(lambda: new_ctx.last_event is not None, what="b received")
        await new_ctx.update_checkpoint()
        old_ctx = contexts[("a", stolen)]
        old_ctx.last_event = new_ctx.last_event
        with pytest.raises(OwnershipLostError):
            await old_ctx.update_checkpoint()
        with pytest.raises(OwnershipLostError):  # even bypassing the local check, the store refuses
            await store.update_checkpoint(new_ctx.last_checkpoint, owner_id="a", epoch=old_ctx.epoch)
        (cp,) = [c for c in await store.list_checkpoints("memory.local", "hub", "$default")
                 if c.partition_id == stolen]
        await a.stop()
        await b.stop()
        return stolen, cp, new_ctx.epoch

    stolen, cp, epoch = run_virtual(scenario())
    assert (cp.owner_id, cp.epoch) == ("b", epoch)
    assert ("b", stolen, CloseReason.SHUTDOWN) in closes


def test_stop_releases_so_another_processor_claims_without_waiting_for_expiry():
    async def scenario():
        source, store = new_source(4), new_store()
        slow = dict(load_balancing_interval=0.5, partition_ownership_expiration_interval=300.0)
        a = EventProcessor(source, store, PartitionProcessor, owner_id="a", **slow)
        await a.start()
        await until(lambda: len(a.owned_partitions) == 4, what="a owns all")
        await a.stop()
        listing = await store.list_ownership("memory.local", "hub", "$default")
        b = EventProcessor(source, store, PartitionProcessor, owner_id="b", **slow)
        await b.start()
        started = asyncio.get_running_loop().time()
        taken = await until(lambda: len(b.owned_partitions) == 4, what="b claims released partitions")
        await b.stop()
        return listing, taken - started

    listing, took = run_virtual(scenario())
    assert {r.owner_id for r in listing.ownerships} == {""}
    assert took < 3  # a few ticks, not the 300 s expiration


def test_factory_callable_and_initial_position_per_partition():
    seen: list[tuple[str, int]] = []

    class Collect(PartitionProcessor):
        async def process_events(self, events, context):
            seen.extend((context.partition_id, e.sequence_number) for e in events)

    async def scenario():
        source = new_source(2)
        for i in range(4):
            await source.send(str(i), partition_id=str(i % 2))
        p = EventProcessor(source, new_store(), lambda: Collect(),
                           initial_event_position={"0": EventPosition.from_sequence_number(0),
                                                   "1": EventPosition.earliest()}, **FAST)
        async with p:
            await until(lambda: len(seen) == 3, what="3 events")

    run_virtual(scenario())
    assert sorted(seen) == [("0", 1), ("1", 0), ("1", 1)]


def test_checkpoints_are_refused_for_other_partitions_undelivered_events_and_rewinds():
    """update_checkpoint in partition 0's handler with an event of partition 1 must be
    refused: accepted, partition 0 would resume at partition 1's position."""
    outcomes: dict[str, object] = {}
    contexts = {}

    class Mixer(PartitionProcessor):
        async def process_events(self, events, context):
            contexts[context.partition_id] = (context, events)

    async def scenario():
        source, store = new_source(2), new_store()
        for i in range(6):
            await source.send(str(i), partition_id=str(i % 2))
        p = EventProcessor(source, store, Mixer, **FAST)
        async with p:
            await until(lambda: len(contexts) == 2, what="both partitions delivered")
            ctx0, events0 = contexts["0"]
            _ctx1, events1 = contexts["1"]
            await ctx0.update_checkpoint(events0[1])
            for name, call in {
                "other partition": lambda: ctx0.update_checkpoint(events1[-1]),
                "rewind": lambda: ctx0.update_checkpoint(events0[0]),
            }.items():
                try:
                    await call()
                except InvalidCheckpointError as error:
                    outcomes[name] = error
            await ctx0.update_checkpoint(events0[0], allow_rewind=True)
            outcomes["rewound"] = (await store.list_checkpoints("memory.local", "hub", "$default"))
        return outcomes

    outcomes = run_virtual(scenario())
    assert "event of partition 1" in str(outcomes["other partition"])
    assert "back from sequence number 1 to 0" in str(outcomes["rewind"])
    rewound = {c.partition_id: c.sequence_number for c in outcomes["rewound"]}
    assert rewound == {"0": 0}


def test_a_factory_that_returns_the_wrong_type_is_reported_once_and_stops_the_processor():
    """A factory that returns 42 must be reported to error_handler once, not as a
    traceback per claim."""
    reported: list[Exception] = []

    async def on_error(error, context):
        reported.append(error)

    async def scenario():
        p = EventProcessor(new_source(4), new_store(), lambda: 42, error_handler=on_error, **FAST)
        with pytest.raises(ConfigurationError, match="returned int, not a PartitionProcessor"):
            await asyncio.wait_for(p.run(), 30)
        return p.is_running

    assert run_virtual(scenario()) is False
    assert len(reported) == 1 and isinstance(reported[0], ConfigurationError)


def test_a_failing_process_error_reaches_error_handler_once():
    reported: list[Exception] = []

    class Bad(PartitionProcessor):
        async def process_events(self, events, context):
            raise RuntimeError("handler")

        async def process_error(self, error, context):
            raise KeyError("process_error itself is broken")

    async def on_error(error, context):
        reported.append(error)

    async def scenario():
        source = new_source(2)
        for i in range(10):
            await source.send(str(i))
        p = EventProcessor(source, new_store(), Bad, error_handler=on_error,
                           failure_policy=FailurePolicy(max_delivery_attempts=3), **FAST)
        async with p:
            await asyncio.sleep(20)

    run_virtual(scenario())
    broken = [e for e in reported if isinstance(e, KeyError)]
    assert len(broken) == 1
