"""Stateful partitions (issue 26): ``context.state`` moves with ownership, exactly once.

Virtual time, the in-memory store and source. The invariant every test checks is the
issue's: after any crash, move or fault, the restored state is exactly the state after
the restored position, so a per-key counter ends equal to the events produced per key.
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter
from typing import Dict, List

import pytest

from eventprocessor import ConfigurationError, EventProcessor, PartitionProcessor
from eventprocessor.errors import InvalidCheckpointError
from eventprocessor.records import StateRef
from eventprocessor.sources import MemoryEventSource
from eventprocessor.state import PartitionState, StateKeeper, StateLog, StateUnreadableError
from eventprocessor.testing import FaultyStore, run_virtual, virtual_utc_clock
from stores import InMemoryCheckpointStore

FAST = dict(load_balancing_interval=0.5, partition_ownership_expiration_interval=6.0)
SCOPE = ("memory.local", "hub", "$default")


async def until(condition, *, timeout: float = 120.0, what: str = "condition") -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} virtual seconds waiting for {what}")
        await asyncio.sleep(0.05)
    return loop.time()


def counting(every: int = 1, totals: Dict[str, Dict[str, int]] = None):
    """Counts events per key in context.state, checkpoints every ``every`` batches, and
    records the counts each claim saw when it closed."""

    class Counting(PartitionProcessor):
        batches = 0

        async def process_events(self, events, context):
            for event in events:
                key = event.body_as_str().split(":")[0]
                context.state[key] = context.state.get(key, 0) + 1
            Counting.batches += 1
            if Counting.batches % every == 0:
                await context.update_checkpoint()

        async def close(self, reason, context):
            if totals is not None:
                totals[context.partition_id] = dict(context.state)

    return Counting


async def final_state(store, partitions: int) -> Dict[str, Dict[str, int]]:
    """What a new owner restores for each partition now."""
    checkpoints = {c.partition_id: c for c in await store.list_checkpoints(*SCOPE)}
    out = {}
    for pid in map(str, range(partitions)):
        keeper = StateKeeper(StateLog(store, SCOPE, pid), epoch=0)
        await keeper.restore(checkpoints.get(pid))
        out[pid] = dict(keeper.state)
    return out


def expected(source: MemoryEventSource, partitions: int) -> Dict[str, Dict[str, int]]:
    return {pid: dict(Counter(e.body_as_str().split(":")[0] for e in source.events(pid)))
            for pid in map(str, range(partitions))}


def test_a_counter_moves_with_the_partition_through_handoffs_and_a_crash_exactly_once():
    async def scenario():
        source = MemoryEventSource(4, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        handler = counting()
        a = EventProcessor(source, store, handler, owner_id="a", stateful=True, **FAST)
        await a.start()
        for i in range(200):
            await source.send(f"k{i % 7}:{i}", partition_id=str(i % 4))
        await until(lambda: sum(len(source.events(p)) for p in "0123") == 200)
        b = EventProcessor(source, store, handler, owner_id="b", stateful=True, **FAST)
        await b.start()  # scale out: partitions handed over with their state
        await until(lambda: len(b.owned_partitions) == 2, what="the handoffs")
        for i in range(200, 400):
            await source.send(f"k{i % 7}:{i}", partition_id=str(i % 4))
        await asyncio.sleep(5)
        await a.stop(release=False)  # a crash: a's partitions are taken over after expiry
        await until(lambda: len(b.owned_partitions) == 4, what="the takeover")
        for i in range(400, 500):
            await source.send(f"k{i % 7}:{i}", partition_id=str(i % 4))
        await asyncio.sleep(5)
        await b.stop()
        return await final_state(store, 4), expected(source, 4)

    restored, wanted = run_virtual(scenario())
    assert restored == wanted


def test_a_batch_whose_handler_raises_is_rolled_back_before_it_is_delivered_again():
    seen: List[int] = []

    class FailsOnce(PartitionProcessor):
        failed = False

        async def process_events(self, events, context):
            for event in events:
                context.state["n"] = context.state.get("n", 0) + 1
                seen.append(event.sequence_number)
                if event.sequence_number == 3 and not FailsOnce.failed:
                    FailsOnce.failed = True
                    raise RuntimeError("downstream hiccup")
            await context.update_checkpoint()

    async def scenario():
        source = MemoryEventSource(1, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        for i in range(6):
            await source.send(f"e{i}")
        async with EventProcessor(source, store, FailsOnce, stateful=True, **FAST):
            await until(lambda: seen.count(5) >= 1, what="the whole batch")
            await asyncio.sleep(2)
        return await final_state(store, 1)

    state = run_virtual(scenario())
    assert seen.count(0) == 2  # delivered again once
    assert state == {"0": {"n": 6}}  # counted once each, the failed attempt undone


def test_a_zombie_cannot_overwrite_the_state_even_while_its_own_clock_says_it_owns_the_partition():
    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        source = MemoryEventSource(1, clock=virtual_utc_clock())
        for i in range(3):
            await source.send(f"e{i}")
        zombie_ctx = []

        class Keeps(PartitionProcessor):
            async def process_events(self, events, context):
                context.state["by"] = context.owner_id
                zombie_ctx.append(context)
                await context.update_checkpoint()

        a = EventProcessor(source, store, Keeps, owner_id="a", stateful=True, **FAST)
        await a.start()
        await until(lambda: zombie_ctx, what="a's first batch")
        # b takes the partition by a higher epoch: a's lease is still valid on a's clock.
        listing = await store.list_ownership(*SCOPE)
        record = listing.ownerships[0]
        from dataclasses import replace
        won = await store.claim_ownership([replace(record, owner_id="b", epoch=record.epoch + 1)])
        await store.fence_checkpoint(won[0])
        context = zombie_ctx[-1]
        context.state["by"] = "zombie"
        with pytest.raises(Exception):
            await context.update_checkpoint(context.last_event)
        await a.stop(release=False)
        return await final_state(store, 1)

    state = run_virtual(scenario())
    assert state["0"]["by"] == "a"


def test_a_state_that_cannot_be_read_is_not_dispatched_and_says_so(caplog):
    delivered: List[int] = []

    class Counts(PartitionProcessor):
        async def process_events(self, events, context):
            delivered.extend(e.sequence_number for e in events)
            context.state["n"] = context.state.get("n", 0) + len(events)
            await context.update_checkpoint()

    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        source = MemoryEventSource(1, clock=virtual_utc_clock())
        for i in range(3):
            await source.send(f"e{i}")
        async with EventProcessor(source, store, Counts, owner_id="a", stateful=True, **FAST):
            await until(lambda: len(delivered) == 3)
        for name in await store.list_entries(*SCOPE, "state-0"):  # the state is lost
            await store.delete_entry(*SCOPE, "state-0", name)
        delivered.clear()
        await source.send("e3")
        async with EventProcessor(source, store, Counts, owner_id="b", stateful=True, **FAST) as b:
            await asyncio.sleep(10)
            return b.owned_partitions

    with caplog.at_level(logging.ERROR, logger="eventprocessor"):
        owned = run_virtual(scenario())
    assert owned == {"0"} and delivered == []  # kept, never run on an empty state
    assert any("cannot be read" in r.getMessage() and "not dispatched" in r.getMessage() for r in caplog.records)


def test_bad_values_and_a_rewind_are_clear_errors_and_stateless_processors_have_no_state():
    state = PartitionState()
    with pytest.raises(ConfigurationError, match="not JSON"):
        state["k"] = {1, 2}
    with pytest.raises(ConfigurationError, match="at most"):
        PartitionState(max_value_bytes=100)["k"] = "x" * 200
    state["l"] = [1]
    state["l"].append(2)  # a copy: assign to change
    assert state["l"] == [1]
    errors: List[Exception] = []

    class Rewinds(PartitionProcessor):
        async def process_events(self, events, context):
            context.state["n"] = 1
            await context.update_checkpoint()
            try:
                await context.update_checkpoint(events[0], allow_rewind=True)
            except InvalidCheckpointError as error:
                errors.append(error)

    class Stateless(PartitionProcessor):
        async def process_events(self, events, context):
            try:
                context.state
            except ConfigurationError as error:
                errors.append(error)

    async def scenario():
        for handler, stateful in ((Rewinds, True), (Stateless, False)):
            source = MemoryEventSource(1, clock=virtual_utc_clock())
            await source.send("a")
            await source.send("b")
            async with EventProcessor(source, InMemoryCheckpointStore(clock=virtual_utc_clock()), handler,
                                      stateful=stateful, max_batch_size=2, **FAST):
                await asyncio.sleep(3)

    run_virtual(scenario())
    assert "cannot move back" in str(errors[0]) and "stateful=True" in str(errors[1])
    with pytest.raises(ConfigurationError, match="num_standbys"):
        EventProcessor(MemoryEventSource(1), InMemoryCheckpointStore(), PartitionProcessor, num_standbys=1)


def test_a_commit_writes_the_change_not_the_state_and_snapshots_keep_restores_short():
    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        log = StateLog(store, SCOPE, "0")
        keeper = StateKeeper(log, epoch=1, snapshot_every=10)
        for i in range(1000):
            keeper.state[f"key{i}"] = "x" * 100
        sizes = []
        for n in range(25):
            keeper.state["counter"] = n
            ref = await keeper.prepare(n)
            keeper.committed(ref)
            sizes.append(keeper.change_bytes)
            await asyncio.sleep(0)
        await keeper.close(wait=True)
        head = keeper.head
        restored = await log.restore(head)
        return sizes, restored, len(await store.list_entries(*SCOPE, "state-0"))

    sizes, restored, entries = run_virtual(scenario())
    per_commit = [b - a for a, b in zip(sizes, sizes[1:])]
    assert per_commit[0] < 200  # a commit of one key writes that key (the first wrote all 1000 keys)
    assert restored.texts["counter"] == "24" and len(restored.texts) == 1001
    assert restored.changes_since_snapshot <= 10 and entries <= 12  # compacted: a snapshot and a few changes


def test_the_state_log_skips_changes_that_were_never_checkpointed():
    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        log = StateLog(store, SCOPE, "0")
        await log.append(prev=None, ref=StateRef(1, 1), sequence_number=0, changes={"a": "1"})
        await log.append(prev=StateRef(1, 1), ref=StateRef(2, 1), sequence_number=1, changes={"a": "2"})  # orphan
        await log.append(prev=StateRef(1, 1), ref=StateRef(2, 2), sequence_number=1, changes={"b": "1"})  # new owner
        return await log.restore(StateRef(2, 2)), await log.changes_between(StateRef(1, 1), StateRef(2, 2))

    restored, between = run_virtual(scenario())
    assert restored.texts == {"a": "1", "b": "1"}
    assert [change["set"] for change in between] == [{"b": 1}]


def test_a_planned_move_waits_for_a_warm_replica_and_the_new_owner_reads_only_the_changes_since():
    """KIP-441: b asks for a's partitions only once their state is loaded and following;
    at the handoff it reads the few changes since, not the state."""
    restores: Dict[str, object] = {}

    class Big(PartitionProcessor):
        async def initialize(self, context):
            restores[f"{context.owner_id}/{context.partition_id}"] = context.state_restored

        async def process_events(self, events, context):
            if "blob0" not in context.state:
                for i in range(300):  # a state of ~300 KB per partition
                    context.state[f"blob{i}"] = "x" * 1000
            for event in events:
                context.state["n"] = context.state.get("n", 0) + 1
            await context.update_checkpoint()

    async def scenario():
        source = MemoryEventSource(2, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        a = EventProcessor(source, store, Big, owner_id="a", stateful=True, **FAST)
        await a.start()
        producing = asyncio.ensure_future(_produce(source, 2, rate=20))
        await until(lambda: a.owned_partitions == {"0", "1"})
        await asyncio.sleep(5)
        b = EventProcessor(source, store, Big, owner_id="b", stateful=True, **FAST)
        await b.start()
        await until(lambda: len(b.owned_partitions) == 1, what="one partition moved")
        await asyncio.sleep(3)
        producing.cancel()
        await asyncio.sleep(2)
        await a.stop()
        await b.stop()
        return await final_state(store, 2), expected(source, 2)

    restored, wanted = run_virtual(scenario())
    moved = [info for key, info in restores.items() if key.startswith("b/")]
    assert moved and all(info.warm for info in moved)
    assert all(info.entries_read <= 3 for info in moved), [(i.entries_read, i.bytes_read) for i in moved]
    assert {pid: {"n": state["n"]} for pid, state in restored.items()} == \
        {pid: {"n": sum(counts.values())} for pid, counts in wanted.items()}


def test_a_crashed_owner_fails_over_to_its_caught_up_standby():
    restores: Dict[str, object] = {}
    handler = counting()

    class Recording(handler):  # type: ignore[valid-type,misc]
        async def initialize(self, context):
            restores[f"{context.owner_id}/{context.partition_id}/{context.epoch}"] = context.state_restored

    async def scenario():
        source = MemoryEventSource(3, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        processors = [EventProcessor(source, store, Recording, owner_id=name, stateful=True, num_standbys=1,
                                     **FAST) for name in ("a", "b", "c")]
        for p in processors:
            await p.start()
        producing = asyncio.ensure_future(_produce(source, 3, rate=30))
        await until(lambda: all(len(p.owned_partitions) == 1 for p in processors), what="balance")
        await asyncio.sleep(10)  # standbys load and follow
        victim = processors[0]
        lost = next(iter(victim.owned_partitions))
        await victim.stop(release=False)  # a crash
        survivors = processors[1:]
        await until(lambda: any(lost in p.owned_partitions for p in survivors), what="the failover")
        await asyncio.sleep(5)
        producing.cancel()
        await asyncio.sleep(2)
        for p in survivors:
            await p.stop()
        return lost, await final_state(store, 3), expected(source, 3)

    lost, restored, wanted = run_virtual(scenario())
    takeover = [info for key, info in restores.items() if key.split("/")[1] == lost and not key.startswith("a/")]
    assert takeover and takeover[0].warm  # the standby had the state
    assert restored == wanted


async def _produce(source: MemoryEventSource, partitions: int, *, rate: float) -> None:
    i = 0
    while True:
        await source.send(f"k{i % 5}:{i}", partition_id=str(i % partitions))
        i += 1
        await asyncio.sleep(1 / rate)
