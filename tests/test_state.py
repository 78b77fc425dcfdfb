"""Stateful partitions: ``context.state`` moves with ownership, exactly once.

Virtual time, the in-memory store and source. The invariant every test checks is the
issue's: after any crash, move or fault, the restored state is exactly the state after
the restored position, so a per-key counter ends equal to the events produced per key.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventprocessor import ConfigurationError, EventProcessor, PartitionProcessor, StatePolicy
from eventprocessor._runtime.bounded_store import MIN_BANDWIDTH, BoundedStore
from eventprocessor._runtime.clock import SystemClock
from eventprocessor.errors import InvalidCheckpointError, OwnershipLostError, StoreTimeoutError
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.state import PartitionState, StateKeeper, StateLog
from eventprocessor.state.log import IN_FLIGHT
from eventprocessor.state.replica import WarmReplica
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import MAX_ENTRY_BYTES, Checkpoint, StateRef
from eventprocessor.testing import FaultyStore, run_virtual, virtual_utc_clock

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


def counting(every: int = 1, totals: dict[str, dict[str, int]] = None):
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


async def final_state(store, partitions: int) -> dict[str, dict[str, int]]:
    """What a new owner restores for each partition now."""
    checkpoints = {c.partition_id: c for c in await store.list_checkpoints(*SCOPE)}
    out = {}
    for pid in map(str, range(partitions)):
        keeper = StateKeeper(StateLog(store, SCOPE, pid), epoch=0)
        await keeper.restore(checkpoints.get(pid))
        out[pid] = dict(keeper.state)
    return out


def expected(source: InMemoryEventSource, partitions: int) -> dict[str, dict[str, int]]:
    return {pid: dict(Counter(e.body_as_str().split(":")[0] for e in source.events(pid)))
            for pid in map(str, range(partitions))}


def test_a_counter_moves_with_the_partition_through_handoffs_and_a_crash_exactly_once():
    async def scenario():
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
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
    seen: list[int] = []

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
        source = InMemoryEventSource(1, clock=virtual_utc_clock())
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
        source = InMemoryEventSource(1, clock=virtual_utc_clock())
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
        with pytest.raises(OwnershipLostError):
            await context.update_checkpoint(context.last_event)
        await a.stop(release=False)
        return await final_state(store, 1)

    state = run_virtual(scenario())
    assert state["0"]["by"] == "a"


def test_a_state_that_cannot_be_read_is_not_dispatched_and_says_so(caplog):
    delivered: list[int] = []

    class Counts(PartitionProcessor):
        async def process_events(self, events, context):
            delivered.extend(e.sequence_number for e in events)
            context.state["n"] = context.state.get("n", 0) + len(events)
            await context.update_checkpoint()

    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        source = InMemoryEventSource(1, clock=virtual_utc_clock())
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
    errors: list[Exception] = []

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
                _ = context.state
            except ConfigurationError as error:
                errors.append(error)

    async def scenario():
        for handler, stateful in ((Rewinds, True), (Stateless, False)):
            source = InMemoryEventSource(1, clock=virtual_utc_clock())
            await source.send("a")
            await source.send("b")
            async with EventProcessor(source, InMemoryCheckpointStore(clock=virtual_utc_clock()), handler,
                                      stateful=stateful, max_batch_size=2, **FAST):
                await asyncio.sleep(3)

    run_virtual(scenario())
    assert "cannot move back" in str(errors[0]) and "stateful=True" in str(errors[1])
    with pytest.raises(ConfigurationError, match="num_standbys"):
        StatePolicy(num_standbys=-1)


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
    per_commit = [b - a for a, b in zip(sizes, sizes[1:], strict=False)]
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
    restores: dict[str, object] = {}

    class Big(PartitionProcessor):
        async def initialize(self, context):
            restores[f"{context.owner_id}/{context.partition_id}"] = context.state_restored

        async def process_events(self, events, context):
            if "blob0" not in context.state:
                for i in range(300):  # a state of ~300 KB per partition
                    context.state[f"blob{i}"] = "x" * 1000
            for _event in events:
                context.state["n"] = context.state.get("n", 0) + 1
            await context.update_checkpoint()

    async def scenario():
        source = InMemoryEventSource(2, clock=virtual_utc_clock())
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
    restores: dict[str, object] = {}
    handler = counting()

    class Recording(handler):  # type: ignore[valid-type,misc]
        async def initialize(self, context):
            restores[f"{context.owner_id}/{context.partition_id}/{context.epoch}"] = context.state_restored

    async def scenario():
        source = InMemoryEventSource(3, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        processors = [EventProcessor(source, store, Recording, owner_id=name, stateful=StatePolicy(num_standbys=1),
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


def _crash_of_the_owner_of_two(rng: random.Random, names: tuple[str, str, str], *, join_spread: float,
                               settle: float):
    """Three stateful processors with one standby each on four partitions, started
    ``join_spread`` s apart at most; ``settle`` s after the shares balanced, the owner of
    two crashes. Returns the crash's time, its partitions, each one's owners after the
    crash in turn (sampled every 0.05 s for 20 s), the standbys :func:`standby_plan` named
    for them at the crash, each claim's restores, and the final and expected states."""
    from eventprocessor.state.replica import standby_plan

    restores: dict[tuple[str, str], list[tuple[float, object]]] = {}

    class Recording(counting(every=10)):  # type: ignore[misc]
        async def initialize(self, context):
            restores.setdefault((context.owner_id, context.partition_id), []).append(
                (asyncio.get_running_loop().time(), context.state_restored))

    async def scenario():
        loop = asyncio.get_running_loop()
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        producing = asyncio.ensure_future(_produce(source, 4, rate=40))
        processors = []
        for name in names:
            processors.append(EventProcessor(source, store, Recording, owner_id=name,
                                             stateful=StatePolicy(num_standbys=1), **FAST))
            await processors[-1].start()
            await asyncio.sleep(rng.uniform(0, join_spread))
        await until(lambda: sorted(len(p.owned_partitions) for p in processors) == [1, 1, 2], what="balance")
        await asyncio.sleep(settle)
        owners = {pid: name for name, p in zip(names, processors, strict=True) for pid in p.owned_partitions}
        planned = standby_plan(owners, names, 1)
        victim = max(zip(names, processors, strict=True), key=lambda np: (len(np[1].owned_partitions), np[0]))
        lost = sorted(victim[1].owned_partitions)
        killed = loop.time()
        await victim[1].stop(release=False)  # a crash
        survivors = [(n, p) for n, p in zip(names, processors, strict=True) if p is not victim[1]]
        held: dict[str, list[str]] = {pid: [] for pid in lost}
        while loop.time() < killed + 20:
            for pid in lost:
                owner = next((n for n, p in survivors if pid in p.owned_partitions), None)
                if owner is not None and (not held[pid] or held[pid][-1] != owner):
                    held[pid].append(owner)
            await asyncio.sleep(0.05)
        producing.cancel()
        await asyncio.sleep(2)
        for _n, p in survivors:
            await p.stop()
        standby = {pid: [m for m, kept in planned.items() if pid in kept] for pid in lost}
        return killed, lost, held, standby, await final_state(store, 4), expected(source, 4)

    killed, lost, held, standby, restored, wanted = run_virtual(scenario())
    return killed, lost, held, standby, restores, restored, wanted


@pytest.mark.parametrize("seed", range(15))
def test_a_crash_right_after_a_join_fails_over_to_the_standby_the_plan_names_and_restores_warm(seed):
    """Three processors join at random moments and the owner of two partitions crashes
    0-2.5 s after the shares balanced: the join has just moved standbys (the plan follows
    owners and members), and a replica published for the old plan may still be in the
    member records while the new standby loads its own. Each lost partition must still go
    to the standby that :func:`standby_plan` names for the owners at the crash, restored
    from its warm replica, and the counts stay exact. (The process test's check once read
    a member record of that moment as the standby; 5 seeds in 1,000 of this scenario.)"""
    rng = random.Random(seed)
    killed, lost, held, standby, restores, restored, wanted = _crash_of_the_owner_of_two(
        rng, ("s0", "s1", "s2"), join_spread=8, settle=rng.uniform(0, 2.5))
    for pid in lost:
        assert held[pid][:1] == standby[pid], (pid, held, standby)
        after = [info for t, info in restores[(held[pid][0], pid)] if t > killed]
        assert after and after[0].warm, (pid, after)
    assert restored == wanted


@settings(max_examples=300, deadline=None)
@given(members=st.integers(2, 6), partitions=st.integers(1, 40), count=st.integers(1, 3), data=st.data())
def test_the_standbys_of_one_owners_partitions_are_spread_over_the_other_members(members, partitions, count, data):
    """A crash then fails over in one move: each survivor takes its even part of the dead
    owner's partitions, warm, instead of one standby taking them all on top of its share
    and handing the surplus on (a second pause, to a processor that may be cold)."""
    from eventprocessor.state.replica import standby_plan

    names = [f"m{i}" for i in range(members)]
    owners = {str(p): data.draw(st.sampled_from(names)) for p in range(partitions)}
    plan = standby_plan(owners, names, count)
    assert plan == standby_plan(owners, list(reversed(names)), count)  # pure: the order of the listing is no input
    for pid, owner in owners.items():
        keepers = [m for m, kept in plan.items() if pid in kept]
        assert owner not in keepers and len(keepers) == min(count, members - 1), (pid, owner, keepers)
    for owner in set(owners.values()):
        spread = [sum(1 for pid, o in owners.items() if o == owner and pid in plan[m]) for m in names if m != owner]
        assert max(spread) - min(spread) <= 1, (owner, spread, plan)


@pytest.mark.parametrize("seed", range(30))
def test_a_crashed_owners_partitions_fail_over_warm_to_distinct_survivors_in_one_move(seed):
    """The process test's scenario on the virtual clock: three processors with one standby
    each on four partitions, the owner of two crashes. Each of its partitions is claimed by
    the standby the plan names, restored warm, and stays there: the two go to the two
    survivors, so no handoff follows the failover. (With both standbys on one survivor it
    took both and handed one on within a second, sometimes before delivering a batch of
    it; the process test then saw the second owner as the one the failover chose.)"""
    rng = random.Random(seed)
    names = (f"p{seed}-0", f"p{seed}-1", f"p{seed}-2")  # the names the plan hashes vary with the seed
    killed, lost, held, standby, restores, restored, wanted = _crash_of_the_owner_of_two(
        rng, names, join_spread=2, settle=10 + rng.uniform(0, 1.5))  # the standbys load and follow
    for pid in lost:
        assert held[pid] == standby[pid], (pid, held, standby)  # claimed by its standby, and no move after
        after = [info for t, info in restores[(held[pid][0], pid)] if t > killed]
        assert after and after[0].warm, (pid, after)
    assert len({held[pid][0] for pid in lost}) == len(lost)  # one each
    assert restored == wanted


async def _produce(source: InMemoryEventSource, partitions: int, *, rate: float) -> None:
    i = 0
    while True:
        await source.send(f"k{i % 5}:{i}", partition_id=str(i % partitions))
        i += 1
        await asyncio.sleep(1 / rate)


def test_a_replica_is_handed_over_even_when_the_claim_outlasts_a_refresh():
    """The replica of a partition being claimed must survive until the claim takes it:
    a store slow to answer claims and fences (longer than the replicas' refresh, half an
    interval) once let the refresh drop it first, and the new owner restored cold."""
    restores: dict[str, object] = {}

    class Recording(counting()):  # type: ignore[misc]
        async def initialize(self, context):
            restores[f"{context.owner_id}/{context.partition_id}"] = context.state_restored

    async def scenario():
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        store = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()))
        store.latency, store.only = 0.4, {"claim_ownership", "fence_checkpoint"}  # > interval / 2
        a = EventProcessor(source, store, Recording, owner_id="a", stateful=True, **FAST)
        await a.start()
        producing = asyncio.ensure_future(_produce(source, 4, rate=20))
        await until(lambda: len(a.owned_partitions) == 4)
        await asyncio.sleep(3)
        b = EventProcessor(source, store, Recording, owner_id="b", stateful=True, **FAST)
        await b.start()
        await until(lambda: len(b.owned_partitions) == 2, what="two partitions moved")
        await asyncio.sleep(2)
        producing.cancel()
        await asyncio.sleep(1)
        await a.stop()
        await b.stop()
        return await final_state(store, 4), expected(source, 4)

    restored, wanted = run_virtual(scenario())
    moved = {key: info for key, info in restores.items() if key.startswith("b/")}
    assert len(moved) == 2 and all(info.warm for info in moved.values()), moved
    assert restored == wanted


WARM_SEEDS = range(40)


@pytest.mark.parametrize("seed", WARM_SEEDS)
def test_every_planned_move_of_a_scale_out_restores_from_a_warm_replica(seed):
    """2 -> 4 processors on 8 stateful partitions, with handlers of random speed and a store
    slow to write ownership: each new owner of a moved partition starts from its warm
    replica. The replica of a partition asked for used to be dropped when the asker's
    next plan named another partition while the owner was still handing the first one
    over (the record carried the request; the handoff then restored cold). Seeded: the
    handlers' and the store's delays."""
    restores: dict[str, object] = {}
    stopping: list[bool] = []
    rng = random.Random(seed)

    class Recording(counting()):  # type: ignore[misc]
        async def process_events(self, events, context):
            await asyncio.sleep(rng.uniform(0, 0.8))
            await super().process_events(events, context)

        async def initialize(self, context):
            if not stopping:
                restores[f"{context.owner_id}/{context.partition_id}/{context.epoch}"] = context.state_restored

    async def scenario():
        source = InMemoryEventSource(8, clock=virtual_utc_clock())
        store = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()), rng=random.Random(seed))
        store.latency, store.jitter, store.only = 0.3, True, {"claim_ownership"}  # below the store timeout
        first = [EventProcessor(source, store, Recording, owner_id=name, stateful=True, **FAST) for name in "ab"]
        for p in first:
            await p.start()
        producing = asyncio.ensure_future(_produce(source, 8, rate=40))
        await until(lambda: all(len(p.owned_partitions) == 4 for p in first), what="a and b balanced")
        await asyncio.sleep(3)
        added = [EventProcessor(source, store, Recording, owner_id=name, stateful=True, **FAST) for name in "cd"]
        for p in added:
            await p.start()
        await until(lambda: all(len(p.owned_partitions) == 2 for p in first + added), what="two each")
        await asyncio.sleep(2)
        producing.cancel()
        await asyncio.sleep(1)
        stopping.append(True)
        for p in first + added:
            await p.stop()
        return await final_state(store, 8), expected(source, 8)

    restored, wanted = run_virtual(scenario())
    assert restored == wanted
    moved = {key: info for key, info in restores.items() if key[0] in "cd"}
    assert len(moved) >= 4 and all(info.warm for info in moved.values()), {k: i.warm for k, i in moved.items()}


def test_a_replica_handed_over_no_longer_changes_the_new_owners_state():
    """A refresh of the replica still in flight when the claim takes it (it started
    before) must not write into the state the new owner now processes with."""
    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        owner = StateKeeper(StateLog(store, SCOPE, "0"), epoch=1)
        owner.state["pad"] = "x" * 1000  # changes of one small key do not outweigh it: no compaction meanwhile
        checkpoints = []
        for n in range(3):
            owner.state["k"] = n
            ref = await owner.prepare(n)
            owner.committed(ref)
            checkpoints.append(Checkpoint("memory.local", "hub", "$default", "0", sequence_number=n, offset=str(n),
                                          state=ref))
        replica = WarmReplica(StateLog(store, SCOPE, "0"))
        await replica.follow(checkpoints[0])
        new_owner = StateKeeper(StateLog(store, SCOPE, "0"), epoch=2)
        replica.hand_over(new_owner)
        restored = await new_owner.restore(checkpoints[2])
        new_owner.state["k"] = 100  # the new owner processes
        await replica.follow(checkpoints[1])  # the refresh that was in flight completes
        return restored, new_owner.state["k"], replica.keeper.state["k"]

    restored, value, replicas = run_virtual(scenario())
    assert restored.warm
    assert value == 100 and replicas == 1


def test_a_warm_replica_whose_changes_were_compacted_away_is_restored_once():
    """When the changes since a replica's head were compacted away, the new owner
    restores from the snapshot: once, not twice."""
    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        owner = StateKeeper(StateLog(store, SCOPE, "0"), epoch=1, snapshot_every=2)
        checkpoints = []
        for n in range(6):
            owner.state["k"] = n
            ref = await owner.prepare(n)
            owner.committed(ref)
            await asyncio.sleep(0)  # the background snapshot and compaction
            checkpoints.append(Checkpoint("memory.local", "hub", "$default", "0", sequence_number=n, offset=str(n),
                                          state=ref))
        await owner.close(wait=True)
        replica = WarmReplica(StateLog(store, SCOPE, "0"))
        replica.keeper.state["k"], replica.keeper.head = 0, checkpoints[0].state  # a replica left at the start
        replica.loaded, replica.sequence_number = True, 0
        new_owner = StateKeeper(StateLog(store, SCOPE, "0"), epoch=2)
        replica.hand_over(new_owner)
        reads = store.request_counts["read_entry"]
        restored = await new_owner.restore(checkpoints[-1])
        return restored, store.request_counts["read_entry"] - reads, dict(new_owner.state)

    restored, reads, state = run_virtual(scenario())
    assert state == {"k": 5} and not restored.warm
    # The changes above the replica's head (only the newest is left: the chain breaks
    # there), then the snapshot, once (it was read twice).
    assert restored.entries_read == 1 and reads == 2, (reads, restored.entries_read)


def test_a_small_state_is_not_snapshotted_at_every_commit():
    """The changes of a small counter outweigh it at once; a snapshot (and a listing and
    deletes) at every commit tripled what a commit costs, and compacted away the changes
    a warm replica a commit behind needed. Up to one store entry of changes waits for the
    commit count."""
    async def scenario():
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        keeper = StateKeeper(StateLog(store, SCOPE, "0"), epoch=1)
        for n in range(30):
            keeper.state[f"k{n % 5}"] = n
            ref = await keeper.prepare(n)
            keeper.committed(ref)
            await asyncio.sleep(0)
        await keeper.close(wait=True)
        return dict(store.request_counts), await keeper.log.restore(keeper.head)

    counts, restored = run_virtual(scenario())
    assert counts.get("create_entry") == 30 and not counts.get("delete_entry"), counts  # the 30 changes only
    assert restored.texts == {f"k{i}": str(25 + i) for i in range(5)}


async def _commit_chunks_and_restore(store, chunks: int):
    """Commit a state of ``chunks`` entry-sized values through ``store`` (epoch 1), then
    restore it as the next owner (epoch 2) would."""
    keeper = StateKeeper(StateLog(store, SCOPE, "0"), epoch=1)
    for i in range(chunks):
        keeper.state[f"big{i}"] = "x" * (MAX_ENTRY_BYTES - 20)
    ref = await keeper.prepare(0)
    keeper.committed(ref)
    await keeper.close(wait=True)
    return await StateKeeper(StateLog(store, SCOPE, "0"), epoch=2).restore(
        Checkpoint("memory.local", "hub", "$default", "0", sequence_number=0, offset="0", state=ref))


def test_a_state_of_many_store_entries_is_written_and_read_within_the_store_timeout():
    """Every store call has its own deadline (store_timeout). A large change or snapshot
    is many entry-sized chunks: sent all at once to a store that serves one request at a
    time (Azurite), the last ones waited behind the others past their deadline, so a
    64 MB state could never be committed or restored with a 6-s expiration. A few at a
    time, each call's deadline covers its own request."""
    async def scenario():
        faulty = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()))
        faulty.service = {"create_entry": 0.05, "read_entry": 0.05}  # one worker, 50 ms per chunk
        store = BoundedStore(faulty, timeout=0.5, clock=SystemClock())
        restored = await _commit_chunks_and_restore(store, 16)
        return restored, store.timeouts

    restored, timeouts = run_virtual(scenario())
    assert len(restored.texts) == 16 and not timeouts


class SlowLink(FaultyStore):
    """A store that moves ``rate`` bytes/s, one request at a time (as Azurite serves
    them): an entry call waits for the requests queued before it, then for its own bytes
    (written, or read back) plus 2 ms. A caller that gives up leaves the link busy. Other
    calls are not slowed."""

    def __init__(self, inner, rate: float) -> None:
        super().__init__(inner)
        self.rate = rate
        self._link_free_at = 0.0

    async def _carry(self, size: int) -> None:
        loop = asyncio.get_running_loop()
        self._link_free_at = max(self._link_free_at, loop.time()) + 0.002 + size / self.rate
        await asyncio.sleep(self._link_free_at - loop.time())

    async def create_entry(self, *where_and_data):
        await self._carry(len(where_and_data[-1]))
        return await super().create_entry(*where_and_data)

    async def read_entry(self, *where):
        data = await super().read_entry(*where)
        await self._carry(len(data or b""))
        return data


def test_a_large_first_commit_and_its_restore_get_time_for_their_bytes():
    """The recorded benchmark's bug: the first commit of a 64 MB state timed out
    (``create_entry ... did not answer within 0.5 s``) on Azurite, which serves one
    request at a time, so the batch was rolled back and delivered again. Here 15 MB go
    over a 10 MiB/s link, 8 chunks in flight: the 6th queued past 0.5 s. A call now gets
    store_timeout + its bytes in flight over 4 MiB/s."""
    async def scenario():
        link = SlowLink(InMemoryCheckpointStore(clock=virtual_utc_clock()), rate=10 * 1024 * 1024)
        store = BoundedStore(link, timeout=0.5, clock=SystemClock())
        restored = await _commit_chunks_and_restore(store, 16)
        return restored, store.timeouts, store.bytes_in_flight

    restored, timeouts, in_flight = run_virtual(scenario())
    assert not timeouts, timeouts
    assert restored.texts == {f"big{i}": '"' + "x" * (MAX_ENTRY_BYTES - 20) + '"' for i in range(16)}
    assert in_flight == 0


@pytest.mark.parametrize("chunks", [0, 16])
def test_a_store_that_never_answers_fails_a_commit_within_the_documented_bound(chunks):
    """A black-holed store is still detected: a small commit within store_timeout (and
    its few bytes), a large one within store_timeout + 8 chunks in flight / 4 MiB/s."""
    async def scenario():
        faulty = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()))
        store = BoundedStore(faulty, timeout=0.5, clock=SystemClock())
        keeper = StateKeeper(StateLog(store, SCOPE, "0"), epoch=1)
        keeper.state["k"] = 1
        for i in range(chunks):
            keeper.state[f"big{i}"] = "x" * (MAX_ENTRY_BYTES - 20)
        faulty.hang = True
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreTimeoutError, match="did not answer within"):
            await keeper.prepare(0)
        took = loop.time() - started
        return took, store.bytes_in_flight, faulty.calls["create_entry"]

    took, left_in_flight, sent = run_virtual(scenario())
    bound = 0.5 + (min(chunks, IN_FLIGHT) * MAX_ENTRY_BYTES + 1024) / MIN_BANDWIDTH
    assert 0.5 <= took <= bound + 0.01, (took, bound)
    # The failed commit left no calls behind: the others in flight were cancelled, and
    # the chunks queued after them never sent.
    assert left_in_flight == 0 and sent == min(chunks + 1, IN_FLIGHT), (left_in_flight, sent)


def test_the_first_commit_of_a_large_state_is_not_failed_by_its_own_deadlines():
    """The benchmark's 16 duplicates, on the virtual clock: a handler pads its state to
    15 MB at the claim; its first checkpoint writes it all over a 10 MiB/s link that
    serves one request at a time, with this expiration's 0.5-s store_timeout. The commit
    timed out, the batch was rolled back and delivered again. Now every event is
    delivered once and counted once."""
    seen: list[int] = []

    class Padded(PartitionProcessor):
        async def initialize(self, context):
            for i in range(16):
                context.state[f"big{i}"] = "x" * (MAX_ENTRY_BYTES - 20)

        async def process_events(self, events, context):
            for event in events:
                seen.append(event.sequence_number)
                context.state["n"] = context.state.get("n", 0) + 1
            await context.update_checkpoint()

    async def scenario():
        source = InMemoryEventSource(1, clock=virtual_utc_clock())
        store = SlowLink(InMemoryCheckpointStore(clock=virtual_utc_clock()), rate=10 * 1024 * 1024)
        for i in range(6):
            await source.send(f"e{i}")
        async with EventProcessor(source, store, Padded, stateful=True, **FAST) as processor:
            assert processor.store_calls.timeout == 0.5
            await until(lambda: 5 in seen, what="the first batch")
            await asyncio.sleep(3)
            for i in range(6, 10):
                await source.send(f"e{i}")
            await until(lambda: 9 in seen, what="the second batch")
            await asyncio.sleep(3)
        return await final_state(store, 1)

    state = run_virtual(scenario())
    assert seen == list(range(10)), seen  # each event delivered once
    assert state["0"]["n"] == 10
