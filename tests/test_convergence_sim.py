"""The convergence simulator (:mod:`harness.simulation`), kept honest.

Three kinds of test: a simulated run of this SDK's real EventProcessor ends where the
balancer unit tests say it ends; the simulator's own machinery (instants on the virtual
loop, tick schedules, lockstep sequencing, request accounting, the official processor's
harness) gives known results for known schedules; and the delivery measurements are
real: a steal of the official processor re-delivers the batch in flight and two pumps
delivering at once show as overlap, while this SDK's handoffs show neither. Every
scenario runs on a fresh :func:`eventprocessor.testing.run_virtual` loop; nothing is
timed on the wall clock. The same behaviour of this SDK is tested directly, on
:class:`eventprocessor.testing.Cluster`, in ``tests/test_rebalance_scenarios.py``; the
benchmark built on the simulator is ``benchmarks/convergence.py``.
"""
from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from eventprocessor import CheckpointStoreError, LoadBalancingStrategy
from eventprocessor.testing import run_virtual
from harness.simulation import (
    Deliveries,
    Simulation,
    Traffic,
    equal_cost_candidates,
    minimal_moves,
    official_module_patched,
    official_requests_per_hour,
    one_per_tick_limit,
    ours_requests_per_hour,
    shared_candidates,
    shortest_within,
    simulation,
)

BALANCED, GREEDY, STATIC = LoadBalancingStrategy.BALANCED, LoadBalancingStrategy.GREEDY, LoadBalancingStrategy.STATIC
INTERVAL = 10.0
TRAFFIC = Traffic(events_per_second=4.0, step=1.0)


def on_virtual_time(scenario: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """The test: ``scenario`` run to its end on a fresh virtual loop (the simulator's clock)."""
    def test() -> None:
        run_virtual(scenario())

    test.__name__, test.__doc__ = scenario.__name__, scenario.__doc__
    return test


def sorted_counts(sim: Simulation) -> list[int]:
    return sorted(sim.counts().values())


async def settled_with_traffic(sim: Simulation, instances: int, **options: Any) -> None:
    for _ in range(instances):
        sim.add_instance(**options)
    await sim.run_until_balanced(max_ticks=40)
    sim.start_traffic()
    await sim.run_until(sim.now + 3.0)


# ----------------------------------------------------------------- agreement with the balancer tests


@on_virtual_time
async def test_ours_5_partitions_1_then_6_processors_ends_with_one_idle() -> None:
    async with simulation("ours", BALANCED, 5, seed=3) as sim:
        sim.add_instance()
        first = await sim.run_until_balanced(max_ticks=20)
        assert first.ticks_to_balanced == 5, first  # one partition per tick, alone
        for _ in range(5):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=40)
        assert sorted_counts(sim) == [0, 1, 1, 1, 1, 1]
        # Scenario 2 of the seed: with N >= P nothing moves any more.
        mark = sim.mark()
        await sim.run_until(sim.now + 10 * INTERVAL)
        assert sim.result(mark).owner_changes == 0


@on_virtual_time
async def test_ours_18_partitions_3_to_4_processors_ends_4_4_5_5_with_minimal_moves_by_handoff() -> None:
    async with simulation("ours", BALANCED, 18, seed=3) as sim:
        for _ in range(3):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=30)
        assert sorted_counts(sim) == [6, 6, 6]
        before = sim.owner_map()
        mark = sim.mark()
        sim.add_instance()
        phase = await sim.run_until_balanced(max_ticks=30, mark=mark)
        assert sorted_counts(sim) == [4, 4, 5, 5]
        live = [i.owner_id for i in sim.alive]
        assert minimal_moves(before, live, sim.partition_ids) == 4
        # The newcomer takes exactly what it needs, each partition handed over by its owner.
        assert phase.moves == 4 and phase.handoffs == 4 and phase.steals == 0, phase
        assert phase.requests["request"] == 4  # one handoff request per move
        assert phase.requests["fence_checkpoint"] == 4  # one fence per claim won: the real cost


@on_virtual_time
async def test_ours_20_partitions_4_to_3_after_crash_ends_6_7_7_without_steals() -> None:
    async with simulation("ours", BALANCED, 20, seed=3) as sim:
        for _ in range(4):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=30)
        mark = sim.mark()
        await sim.crash(sim.alive[-1])
        phase = await sim.run_until_balanced(max_ticks=30, mark=mark)
        assert sorted_counts(sim) == [6, 7, 7]
        assert phase.steals == 0  # orphans are taken once expired, never stolen
        assert phase.moves == 5


@on_virtual_time
async def test_ours_20_to_25_partitions_with_4_processors_ends_6_6_6_7() -> None:
    async with simulation("ours", BALANCED, 20, seed=3) as sim:
        for _ in range(4):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=30)
        mark = sim.mark()
        sim.add_partitions(5)
        phase = await sim.run_until_balanced(max_ticks=30, mark=mark)
        assert sorted_counts(sim) == [6, 6, 6, 7]
        assert phase.moves == 0 and phase.steals == 0


@on_virtual_time
async def test_ours_graceful_scale_in_releases_so_survivors_take_over_without_steals() -> None:
    async with simulation("ours", BALANCED, 16, seed=5) as sim:
        for _ in range(5):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=30)
        leaving = sim.alive[0]
        leaving_count = sim.counts()[leaving.owner_id]
        mark = sim.mark()
        await sim.stop(leaving)
        assert sim.result(mark).requests["release"] == leaving_count
        phase = await sim.run_until_balanced(max_ticks=30, mark=mark)
        assert sorted_counts(sim) == [4, 4, 4, 4]
        assert phase.steals == 0
        # Released records are claimable at once: no waiting for expiry.
        assert phase.ticks_to_balanced is not None and phase.ticks_to_balanced <= 3, phase


@on_virtual_time
async def test_ours_greedy_cold_start_takes_one_tick_because_members_join_first() -> None:
    for schedule in ("staggered", "lockstep"):
        async with simulation("ours", GREEDY, 32, schedule=schedule, seed=4) as sim:
            mark = sim.mark()
            for _ in range(4):
                sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=20, mark=mark)
            assert phase.ticks_to_balanced == 1, (schedule, phase)
            assert phase.requests["claim"] == 32 and phase.steals == 0 and phase.failed_claims == 0, (schedule, phase)
            assert sorted_counts(sim) == [8, 8, 8, 8]


@on_virtual_time
async def test_ours_static_shares_by_ordinal_then_the_returning_ordinal_gets_its_share_back_by_handoff() -> None:
    async with simulation("ours", STATIC, 8, seed=2, traffic=TRAFFIC) as sim:
        members = [sim.add_instance(ordinal=k, replica_count=4) for k in range(4)]
        await sim.run_until_balanced(max_ticks=20)
        owners = sim.owner_map()
        assert {pid: owners[pid] for pid in ("0", "4", "2", "6")} == {
            "0": members[0].owner_id, "4": members[0].owner_id, "2": members[2].owner_id, "6": members[2].owner_id}
        sim.start_traffic()
        await sim.run_to_mid_batch()
        crash_time = sim.now
        member_expiry = sim.ledger.member_expiry(members[2].owner_id)
        await sim.crash(members[2])
        await sim.run_until_reowned(["2", "6"], max_ticks=15)
        await sim.run_until(sim.now + 2.0)  # the new owner's pump starts after its claim
        resumed = sim.resumed_at(["2", "6"], crash_time)
        assert resumed is not None and member_expiry is not None and resumed >= member_expiry  # ordinal 2 expired
        mark = sim.mark()
        back = sim.add_instance(ordinal=2, replica_count=4)
        await sim.run_until(sim.now + 6 * INTERVAL)
        phase = sim.result(mark)
        assert sim.owner_map()["2"] == back.owner_id and sim.owner_map()["6"] == back.owner_id
        assert phase.handoffs == 2 and phase.steals == 0 and phase.duplicates == 0, phase


@on_virtual_time
async def test_ours_balance_factor_leaves_a_small_imbalance_alone() -> None:
    for factor, moves, counts in ((1, 3, [3, 3, 3]), (3, 1, [1, 4, 4])):
        async with simulation("ours", GREEDY, 9, seed=4, balance_tolerance=factor,
                              processor_options={"balance_factor": factor}) as sim:
            for _ in range(2):
                sim.add_instance()
            await sim.run_until_balanced(max_ticks=20)
            mark = sim.mark()
            sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=20, mark=mark)
            assert phase.moves == moves and phase.handoffs == moves and phase.steals == 0, (factor, phase)
            assert sorted_counts(sim) == counts


# ----------------------------------------------------------------- the simulator itself


class Scripted:
    """An instance that only records when it ticks; optionally one store round trip."""

    teardown = None

    def __init__(self, owner_id: str, sim: Simulation, request_latency: float = 0.0) -> None:
        self.owner_id = owner_id
        self.sim = sim
        self.ticks: list[float] = []
        self.latency = request_latency

    @property
    def owned(self) -> frozenset[str]:
        return frozenset()

    async def join(self) -> None:
        pass

    async def tick(self) -> None:
        self.ticks.append(self.sim.now)
        if self.latency:
            await self.sim.instants.sleep(self.latency)

    async def stop(self) -> None:
        pass

    async def crash(self) -> None:
        pass


@on_virtual_time
async def test_an_instant_runs_its_store_work_after_everything_else_in_the_order_it_was_sent() -> None:
    sim = Simulation("official", BALANCED, 1)
    seen: list[str] = []

    async def sender(name: str, yields: int) -> None:
        await sim.instants.sleep_until(5.0)
        for _ in range(yields):  # busy at the instant for a while, then a request
            seen.append(f"{name} busy")
            await asyncio.sleep(0)
        await sim.instants.last()
        seen.append(f"{name} executes")

    await asyncio.gather(sender("a", 3), sender("b", 1), sender("c", 0))
    assert sim.now == 5.0
    executes = [entry for entry in seen if entry.endswith("executes")]
    assert seen[-3:] == executes, seen  # after everything else the instant had to do
    assert executes == ["c executes", "b executes", "a executes"], seen  # in the order the requests were sent
    await sim.stop_run()


@on_virtual_time
async def test_a_cancelled_sleep_leaves_no_wake_up_behind() -> None:
    sim = Simulation("official", BALANCED, 1)
    visited: list[float] = []
    sim.instants.observers.append(lambda: visited.append(sim.now))
    sleeper = asyncio.ensure_future(sim.instants.sleep_until(35.0))
    await asyncio.sleep(0)
    sleeper.cancel()
    await sim.instants.sleep_until(40.0)
    # The loop went from 0 through the samples at 10, 20, 30 (one per tick boundary) to
    # 40, and never stopped at 35: the cancelled sleep left no wake-up behind (the time-out
    # timer of a store call that answered costs nothing).
    assert sleeper.cancelled()
    assert sorted(set(visited)) == [0.0, 10.0, 20.0, 30.0], visited  # 40: this check runs before its end
    await sim.stop_run()


@on_virtual_time
async def test_lockstep_schedule_ticks_every_instance_at_the_same_instants() -> None:
    sim = Simulation("official", BALANCED, 4, schedule="lockstep", interval=INTERVAL)
    a, b = Scripted("a", sim, request_latency=3.0), Scripted("b", sim)
    sim.join(a)  # type: ignore[arg-type]
    sim.join(b)  # type: ignore[arg-type]
    await sim.run_until(35.0)
    assert a.ticks == [0.0, 10.0, 20.0, 30.0], a.ticks
    assert b.ticks == [0.0, 10.0, 20.0, 30.0], b.ticks  # a tick's duration does not shift the grid
    await sim.stop_run()


@on_virtual_time
async def test_staggered_schedule_waits_an_interval_after_each_tick_completes() -> None:
    sim = Simulation("official", BALANCED, 4, schedule="staggered", interval=INTERVAL, seed=7)
    a = Scripted("a", sim, request_latency=2.0)
    sim.join(a)  # type: ignore[arg-type]
    await sim.run_until(60.0)
    phase = a.ticks[0]
    assert 0.0 <= phase < INTERVAL
    assert a.ticks == pytest.approx([phase + 12.0 * k for k in range(len(a.ticks))], rel=1e-6, abs=1e-9)
    assert len(a.ticks) == int((60.0 - phase) // 12.0) + 1
    await sim.stop_run()


@on_virtual_time
async def test_known_schedule_gives_known_tick_counts_for_the_official_balancer() -> None:
    # Alone, the official BALANCED strategy claims one claimable partition per tick.
    for schedule in ("staggered", "lockstep"):
        async with simulation("official", BALANCED, 6, schedule=schedule, seed=2) as sim:
            sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=30)
            assert phase.ticks_to_balanced == 6, (schedule, phase)
            assert phase.requests["claim"] == 6 and phase.failed_claims == 0


@on_virtual_time
async def test_known_schedule_gives_known_tick_counts_for_ours() -> None:
    for schedule in ("staggered", "lockstep"):
        async with simulation("ours", BALANCED, 6, schedule=schedule, seed=2) as sim:
            sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=30)
            assert phase.ticks_to_balanced == 6, (schedule, phase)


@on_virtual_time
async def test_lockstep_instances_list_the_same_snapshot_before_anyone_writes() -> None:
    # Two official GREEDY instances on an empty store: each lists nothing and tries to
    # create all 4 records. Every record is created once; the other attempt fails.
    async with simulation("official", GREEDY, 4, schedule="lockstep", seed=11) as sim:
        sim.add_instance()
        sim.add_instance()
        mark = sim.mark()
        await sim.run_until(1.0)
        phase = sim.result(mark)
        assert phase.requests["list_ownership"] == 2
        assert phase.requests["claim"] == 8
        assert phase.failed_claims == 4
        assert sum(sim.counts().values()) == 4


def test_official_module_time_and_random_are_restored_after_a_run() -> None:
    from azure.eventhub.aio._eventprocessor import _ownership_manager as module

    original = (module.time, module.random)
    with official_module_patched():
        assert module.time is not original[0]
    assert (module.time, module.random) == original


@on_virtual_time
async def test_official_instance_sees_its_own_skewed_clock_but_records_carry_store_time() -> None:
    async with simulation("official", BALANCED, 4, seed=1) as sim:
        honest = sim.add_instance()
        await sim.run_until_balanced(max_ticks=10)
        skewed = sim.add_instance(skew=300.0)
        mark = sim.mark()
        await sim.run_until(sim.now + 3 * INTERVAL)
        # Ahead by 5 minutes, it judges every live record expired and takes them.
        assert sim.ledger.steals_by[skewed.owner_id] >= 1
        assert sim.result(mark).steals >= 1
        assert honest.owner_id != skewed.owner_id


@on_virtual_time
async def test_official_dispatch_runs_one_receive_task_per_partition_its_last_claim_returned() -> None:
    async with simulation("official", GREEDY, 8, seed=6, traffic=TRAFFIC) as sim:
        await settled_with_traffic(sim, 2)
        for instance in sim.alive:
            assert set(instance._tasks) == set(instance.owned) and len(instance.owned) == 4  # type: ignore[attr-defined]
        sim.add_instance()
        await sim.run_until_balanced(max_ticks=20)
        for instance in sim.alive:
            assert set(instance._tasks) == set(instance.owned)  # type: ignore[attr-defined]
        # Only the current owner of a partition delivers it now.
        now = sim.now
        await sim.run_until(now + 5.0)
        owners = sim.owner_map()
        assert all(b.owner_id == owners[b.partition_id] for b in sim.deliveries.since(now))


def test_minimal_moves_and_one_per_tick_limits() -> None:
    eight_each = {str(p): "abcd"[p % 4] for p in range(32)}
    assert minimal_moves(eight_each, list("abcde"), [str(p) for p in range(32)]) == 6
    assert one_per_tick_limit(eight_each, list("abcde"), [str(p) for p in range(32)]) == 6
    assert minimal_moves(eight_each, list("abc"), [str(p) for p in range(32)]) == 8  # d's orphans
    assert minimal_moves(eight_each, list("abcd"), [str(p) for p in range(40)]) == 0  # growth
    assert one_per_tick_limit(eight_each, list("abcd"), [str(p) for p in range(40)]) == 2


@on_virtual_time
async def test_concurrent_write_batches_interleave_record_by_record() -> None:
    sim = Simulation("official", BALANCED, 1)
    applied: list[str] = []

    async def record(item: str) -> str:
        applied.append(item)
        return item

    async def batch(name: str) -> list[str]:
        return await sim.instants.write_group(0.0, [f"{name}{i}" for i in range(20)], record, random.Random(4))

    a, b = await asyncio.gather(batch("a"), batch("b"))
    assert a == [f"a{i}" for i in range(20)]  # results come back in item order
    assert b == [f"b{i}" for i in range(20)]
    owners = [item[0] for item in applied]
    assert owners != sorted(owners)  # not one batch after the other
    await sim.stop_run()


# ----------------------------------------------------------------- request accounting


@on_virtual_time
async def test_steady_requests_per_hour_match_the_formulas_members_included() -> None:
    for implementation in ("ours", "official"):
        async with simulation(implementation, GREEDY, 12, seed=8, interval=INTERVAL, expiration=60.0) as sim:
            for _ in range(3):
                sim.add_instance()
            await sim.run_until_balanced(max_ticks=20)
            mark = sim.mark()
            await sim.run_until(sim.now + 200 * INTERVAL)
            phase = sim.result(mark)
        per_hour = phase.coordination_requests / phase.duration * 3600
        if implementation == "ours":
            # at rest a tick lists the members (with the change notice), ownership only as the safety net
            assert phase.requests["list_members"] == phase.instance_ticks
            assert phase.requests["list_ownership"] < phase.instance_ticks / 10
            assert phase.requests["write_member"] > 0 and not phase.requests.get("renew")
            expected = ours_requests_per_hour(12, 3, INTERVAL, 60.0)
        else:
            assert phase.requests["list_ownership"] == phase.instance_ticks and "list_members" not in phase.requests
            expected = official_requests_per_hour(12, 3, INTERVAL, jitter=0.0)
        assert per_hour == pytest.approx(expected, rel=0.03), (implementation, per_hour, expected)


def test_equal_cost_candidates_are_the_shortest_expirations_within_the_budget() -> None:
    budget = official_requests_per_hour(32, 4, 30.0)
    for interval, expiration in equal_cost_candidates(budget, 32, 4, [20.0, 25.0, 30.0]):
        assert ours_requests_per_hour(32, 4, interval, expiration) <= budget
        # the shortest: one second less is over the budget or shorter than two intervals
        assert expiration - 1 < 2 * interval or ours_requests_per_hour(32, 4, interval, expiration - 1) > budget
    assert equal_cost_candidates(budget, 32, 4, [3.0]) == []  # listing alone would exceed it


def test_both_sides_choose_from_the_same_candidates_each_within_its_own_cost() -> None:
    budget = official_requests_per_hour(32, 4, 30.0)
    shared = shared_candidates(budget, 32, 4, [15.0, 30.0], ["default"])
    [(_, shortest_ours)] = equal_cost_candidates(budget, 32, 4, [30.0])
    # At rest ours reads no ownership record and renews none: even the shortest candidate,
    # two intervals, fits the budget.
    assert shortest_ours == 60.0
    assert shared[30.0] == [60.0, 90.0, 180.0], shared  # 2, 3, 6 intervals (ours among them)
    assert shared[15.0] == sorted({30.0, 45.0, 90.0, equal_cost_candidates(budget, 32, 4, [15.0])[0][1]})
    # The official's cost is set by the interval alone: it affords 30 s, not 15 s, and
    # takes its shortest candidate expiration there.
    official = shortest_within(lambda i, _e: official_requests_per_hour(32, 4, i), budget, shared)
    assert official == [(30.0, 60.0)], official
    ours = shortest_within(lambda i, e: ours_requests_per_hour(32, 4, i, e), budget, shared)
    assert (30.0, shortest_ours) in ours, ours
    assert all(ours_requests_per_hour(32, 4, i, e) <= budget for i, e in ours)


# ----------------------------------------------------------------- deliveries are measured


def test_deliveries_count_duplicates_overlap_and_pauses_from_batches() -> None:
    clock = [0.0]
    deliveries = Deliveries(lambda: clock[0])

    def batch(pid: str, owner: str, claim: int, first: int, last: int, start: float, end: float) -> Any:
        clock[0] = start
        b = deliveries.begin(pid, owner, claim, first, last)
        clock[0] = end
        deliveries.end(b)
        return b

    batch("0", "a", 1, 0, 3, 0.0, 0.5)
    batch("0", "a", 1, 4, 7, 1.0, 1.5)
    batch("0", "b", 2, 4, 9, 1.2, 1.4)  # b re-delivers 4..7 while a is still in its batch
    batch("0", "a", 1, 8, 9, 1.5, 1.6)  # touches a's previous batch: no overlap with itself
    batch("1", "c", 1, 0, 3, 0.0, 0.1)
    batch("1", "c", 1, 4, 7, 5.0, 5.1)  # a pause of 4.9 s
    assert deliveries.duplicates() == 4 + 2
    assert deliveries.duplicates(start=1.3) == 2
    seconds, most = deliveries.overlap(0.0, 10.0)
    assert seconds == pytest.approx(0.2) and most == 2
    assert deliveries.overlap(1.4, 10.0) == (0.0, 1)  # b's batch ended as the window opens
    pauses = deliveries.longest_pauses(0.0, 10.0)
    assert (pauses["1"], pauses["0"]) == pytest.approx((4.9, 0.5))
    first = deliveries.first_batch("0", 1.1, {"b"})
    assert first is not None and first.owner_id == "b"


@on_virtual_time
async def test_an_official_steal_redelivers_the_batch_in_flight_and_both_claims_deliver_at_once() -> None:
    async with simulation("official", GREEDY, 12, seed=1, traffic=TRAFFIC, work=0.5) as sim:
        await settled_with_traffic(sim, 3)
        mark = sim.mark()
        thief = sim.add_instance()
        phase = await sim.run_until_balanced(max_ticks=20, mark=mark)
        assert phase.steals == 3, phase
        assert phase.duplicates > 0
        assert phase.overlap_seconds > 0 and phase.max_deliverers == 2, phase
        # Every duplicate is the thief re-reading from the checkpoint: its first batch of a
        # stolen partition starts right after the victim's last checkpointed batch.
        for b in sim.deliveries.since(mark["at"]):
            if b.duplicates:
                assert b.owner_id == thief.owner_id
                earlier = [e for e in sim.deliveries.batches if e.partition_id == b.partition_id and e.start < b.start
                           and e.owner_id != thief.owner_id]
                victim_batch = max(earlier, key=lambda e: e.start)
                assert victim_batch.first == b.first and victim_batch.end is not None and victim_batch.end > b.start


@on_virtual_time
async def test_ours_hands_over_instead_so_the_same_scale_out_has_no_duplicate_and_no_overlap() -> None:
    async with simulation("ours", GREEDY, 12, seed=1, traffic=TRAFFIC, work=0.5) as sim:
        await settled_with_traffic(sim, 3)
        mark = sim.mark()
        sim.add_instance()
        phase = await sim.run_until_balanced(max_ticks=20, mark=mark)
        assert phase.moves == 3 and phase.handoffs == 3 and phase.steals == 0, phase
        assert phase.duplicates == 0 and phase.overlap_seconds == 0 and phase.max_deliverers == 1, phase
        assert sim.undelivered() == 0


@on_virtual_time
async def test_a_crash_costs_exactly_the_batches_in_flight_and_the_dead_instance_sends_nothing() -> None:
    for implementation in ("ours", "official"):
        async with simulation(implementation, GREEDY, 12, seed=3, traffic=TRAFFIC) as sim:
            await settled_with_traffic(sim, 3)
            await sim.run_to_mid_batch()
            victim = sim.alive[-1]
            crash_time = sim.now
            in_flight = [b for b in sim.deliveries.batches if b.owner_id == victim.owner_id and b.end is None]
            assert len(in_flight) == 4, (implementation, in_flight)  # every partition of the victim is mid-batch
            member_writes = sim.ledger.members.get(victim.owner_id)
            mark = sim.mark()
            await sim.crash(victim)
            orphans = [b.partition_id for b in in_flight]
            await sim.run_until_reowned(orphans, max_ticks=15)
            await sim.run_until(sim.now + 2 * INTERVAL)
            phase = sim.result(mark)
            assert all(b.end == crash_time for b in in_flight)  # handlers stopped mid-batch
            assert phase.duplicates == sum(b.last - b.first + 1 for b in in_flight), (implementation, phase)
            assert not [b for b in sim.deliveries.since(crash_time) if b.owner_id == victim.owner_id]
            assert sim.ledger.members.get(victim.owner_id) == member_writes  # no heartbeat after death
            try:
                await victim.store.list_checkpoints("memory.local", "hub", "$default")  # type: ignore[attr-defined]
            except CheckpointStoreError:
                pass
            else:
                raise AssertionError(f"{implementation}: the dead instance's store still answered")
            assert sim.resumed_at(orphans, crash_time) is not None and sim.undelivered() == 0


@on_virtual_time
async def test_rolling_restart_ours_hands_over_without_duplicates_the_official_stop_cancels_batches() -> None:
    results: dict[str, Any] = {}
    for implementation in ("ours", "official"):
        async with simulation(implementation, GREEDY, 8, seed=5, traffic=TRAFFIC) as sim:
            await settled_with_traffic(sim, 2)
            mark = sim.mark()
            for old in list(sim.alive):
                await sim.run_to_mid_batch()
                await sim.stop(old)
                sim.add_instance()
                await sim.run_until_balanced(max_ticks=20, settle_ticks=2)
            results[implementation] = (sim.result(mark), sim.undelivered())
    ours, official = results["ours"], results["official"]
    assert ours[0].duplicates == 0 and ours[1] == 0, ours
    assert official[0].duplicates > 0  # its stop cancels handlers half-way through a batch


@on_virtual_time
async def test_standbys_own_nothing_and_one_takes_over_once_the_crashed_records_expired() -> None:
    async with simulation("ours", GREEDY, 4, seed=1, traffic=TRAFFIC) as sim:
        await settled_with_traffic(sim, 8)
        counts = sim.counts()
        assert sorted(counts.values()) == [0, 0, 0, 0, 1, 1, 1, 1]
        standbys = {owner for owner, count in counts.items() if count == 0}
        victim = next(i for i in sim.alive if counts[i.owner_id])
        orphan = next(pid for pid, owner in sim.owner_map().items() if owner == victim.owner_id)
        record_expiry = sim.record_expiry([orphan])
        member_expiry = sim.ledger.member_expiry(victim.owner_id)
        crash_time = sim.now
        await sim.crash(victim)
        await sim.run_until_reowned([orphan], max_ticks=15)
        await sim.run_until(sim.now + 2.0)  # the new owner's pump starts after its claim
        resumed = sim.resumed_at([orphan], crash_time)
        first = sim.deliveries.first_batch(orphan, crash_time, {i.owner_id for i in sim.alive})
        assert first is not None and first.owner_id in standbys
        assert resumed is not None and record_expiry <= resumed
        # While the crashed processor's member record is live it still counts in the plans
        # (and may be dealt the orphan): takeover comes within a tick of the later expiry.
        assert resumed <= max(record_expiry, member_expiry or 0.0) + INTERVAL


@on_virtual_time
async def test_events_of_partitions_the_official_never_claims_are_counted_as_never_delivered() -> None:
    for implementation, lost in (("ours", False), ("official", True)):
        async with simulation(implementation, GREEDY, 4, seed=2, traffic=TRAFFIC) as sim:
            await settled_with_traffic(sim, 2)
            sim.add_partitions(2)
            await sim.run_until(sim.now + 10 * INTERVAL)
            assert (sim.undelivered() > 0) is lost, implementation
