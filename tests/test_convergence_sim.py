"""Keep the convergence simulator honest.

Two kinds of test: a simulated run of this SDK's real EventProcessor must end where the
balancer unit tests say it ends, and the simulator's own machinery (virtual time, tick
schedules, lockstep sequencing, request accounting, the official-balancer harness) must
produce known results for known schedules. No wall-clock assertions.
"""
from __future__ import annotations

import asyncio
import random
from typing import FrozenSet, List

import pytest

from benchmarks.convergence import one_per_tick_limit
from benchmarks.simulation import (Ledger, Simulation, VirtualScheduler, minimal_moves,
                                   official_module_patched, simulation)
from eventprocessor import LoadBalancingStrategy

BALANCED, GREEDY = LoadBalancingStrategy.BALANCED, LoadBalancingStrategy.GREEDY
INTERVAL = 10.0


def sorted_counts(sim: Simulation) -> List[int]:
    return sorted(sim.counts().values())


# ----------------------------------------------------------------- agreement with the balancer tests


async def test_ours_5_partitions_1_then_6_processors_ends_with_one_idle():
    async with simulation("ours", BALANCED, 5, seed=3) as sim:
        sim.add_instance()
        first = await sim.run_until_balanced(max_ticks=20)
        assert first.ticks_to_balanced == 5  # one partition per tick, alone
        for _ in range(5):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=40)
        assert sorted_counts(sim) == [0, 1, 1, 1, 1, 1]
        # Scenario 2 of the seed: with N >= P nothing moves any more.
        mark = sim.mark()
        await sim.run_until(sim.scheduler.now + 10 * INTERVAL)
        assert sim.result(mark).owner_changes == 0


async def test_ours_18_partitions_3_to_4_processors_ends_4_4_5_5_with_minimal_moves():
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
        assert phase.moves == 4 and phase.steals == 4  # the newcomer takes exactly what it needs


async def test_ours_20_partitions_4_to_3_after_crash_ends_6_7_7_without_steals():
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


async def test_ours_20_to_25_partitions_with_4_processors_ends_6_6_6_7():
    async with simulation("ours", BALANCED, 20, seed=3) as sim:
        for _ in range(4):
            sim.add_instance()
        await sim.run_until_balanced(max_ticks=30)
        mark = sim.mark()
        sim.add_partitions(5)
        phase = await sim.run_until_balanced(max_ticks=30, mark=mark)
        assert sorted_counts(sim) == [6, 6, 6, 7]
        assert phase.moves == 0 and phase.steals == 0


async def test_ours_graceful_scale_in_releases_so_survivors_take_over_without_steals():
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
        assert phase.ticks_to_balanced is not None and phase.ticks_to_balanced <= 3


# ----------------------------------------------------------------- the simulator itself


class Scripted:
    """An instance that only records when it ticks; optionally one store round trip."""

    def __init__(self, owner_id: str, sim: Simulation, request_latency: float = 0.0) -> None:
        self.owner_id = owner_id
        self.sim = sim
        self.ticks: List[float] = []
        self.latency = request_latency

    @property
    def owned(self) -> FrozenSet[str]:
        return frozenset()

    @property
    def dispatching(self) -> FrozenSet[str]:
        return frozenset()

    async def tick(self) -> None:
        self.ticks.append(self.sim.scheduler.now)
        if self.latency:
            await self.sim.scheduler.sleep(self.latency)

    async def stop(self) -> None:
        pass

    async def crash(self) -> None:
        pass


async def test_scheduler_runs_events_by_time_then_by_scheduling_order():
    scheduler = VirtualScheduler()
    seen: List[str] = []
    scheduler.call_at(5.0, lambda: seen.append("b"))
    scheduler.call_at(1.0, lambda: seen.append("a"))
    scheduler.call_at(5.0, lambda: seen.append("c"))
    while scheduler.next_time() is not None:
        scheduler.pop()()
    assert seen == ["a", "b", "c"]
    assert scheduler.now == 5.0


async def test_lockstep_schedule_ticks_every_instance_at_the_same_instants():
    sim = Simulation("official", BALANCED, 4, schedule="lockstep", interval=INTERVAL)
    a, b = Scripted("a", sim, request_latency=3.0), Scripted("b", sim)
    sim.join(a)
    sim.join(b)
    await sim.run_until(35.0)
    assert a.ticks == [0.0, 10.0, 20.0, 30.0]
    assert b.ticks == [0.0, 10.0, 20.0, 30.0]  # a tick's duration does not shift the grid
    await sim.stop_run()


async def test_staggered_schedule_waits_an_interval_after_each_tick_completes():
    sim = Simulation("official", BALANCED, 4, schedule="staggered", interval=INTERVAL, seed=7)
    a = Scripted("a", sim, request_latency=2.0)
    sim.join(a)
    await sim.run_until(60.0)
    phase = a.ticks[0]
    assert 0.0 <= phase < INTERVAL
    assert a.ticks == pytest.approx([phase + 12.0 * k for k in range(len(a.ticks))])
    assert len(a.ticks) == int((60.0 - phase) // 12.0) + 1
    await sim.stop_run()


async def test_known_schedule_gives_known_tick_counts_for_the_official_balancer():
    # Alone, the official BALANCED strategy claims one claimable partition per tick.
    for schedule in ("staggered", "lockstep"):
        async with simulation("official", BALANCED, 6, schedule=schedule, seed=2) as sim:
            sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=30)
            assert phase.ticks_to_balanced == 6
            assert phase.requests["claim"] == 6 and phase.failed_claims == 0


async def test_known_schedule_gives_known_tick_counts_for_ours():
    for schedule in ("staggered", "lockstep"):
        async with simulation("ours", BALANCED, 6, schedule=schedule, seed=2) as sim:
            sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=30)
            assert phase.ticks_to_balanced == 6
        async with simulation("ours", GREEDY, 6, schedule=schedule, seed=2) as sim:
            sim.add_instance()
            phase = await sim.run_until_balanced(max_ticks=30)
            # Seeing nobody, it claims one partition first (so simultaneous starters
            # do not all grab everything), then its whole fair share.
            assert phase.ticks_to_balanced == 2


async def test_lockstep_instances_list_the_same_snapshot_before_anyone_writes():
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


async def test_official_module_time_and_random_are_restored_after_a_run():
    from azure.eventhub.aio._eventprocessor import _ownership_manager as module

    original = (module.time, module.random)
    with official_module_patched():
        assert module.time is not original[0]
    assert (module.time, module.random) == original


async def test_official_instance_sees_its_own_skewed_clock_but_records_carry_store_time():
    async with simulation("official", BALANCED, 4, seed=1) as sim:
        honest = sim.add_instance()
        await sim.run_until_balanced(max_ticks=10)
        skewed = sim.add_instance(skew=300.0)
        mark = sim.mark()
        await sim.run_until(sim.scheduler.now + 3 * INTERVAL)
        # Ahead by 5 minutes, it judges every live record expired and takes them.
        assert sim.ledger.steals_by[skewed.owner_id] >= 1
        assert sim.result(mark).steals >= 1
        assert honest.owner_id != skewed.owner_id


def test_ledger_tells_moves_steals_renewals_and_releases_apart():
    ledger = Ledger(expiration=60.0)
    ledger.write("0", "a", True, 0.0)  # first claim: not a move
    ledger.write("0", "a", True, 30.0)  # renewal
    ledger.write("0", "b", True, 40.0)  # live record taken: a steal
    ledger.write("0", "", True, 50.0)  # release by b
    ledger.write("0", "c", True, 55.0)  # released record taken: a move, no steal
    ledger.write("0", "d", False, 56.0)  # lost race: a 412
    ledger.write("0", "d", True, 200.0)  # expired record taken: a move, no steal
    assert ledger.moves == 3
    assert ledger.steals == 1
    assert ledger.failed_claims == 1
    assert ledger.requests == {"claim": 5, "renew": 1, "release": 1}


def test_minimal_moves_and_one_per_tick_limits():
    eight_each = {str(p): "abcd"[p % 4] for p in range(32)}
    assert minimal_moves(eight_each, list("abcde"), [str(p) for p in range(32)]) == 6
    assert one_per_tick_limit(eight_each, list("abcde"), [str(p) for p in range(32)]) == 6
    assert minimal_moves(eight_each, list("abc"), [str(p) for p in range(32)]) == 8  # d's orphans
    assert minimal_moves(eight_each, list("abcd"), [str(p) for p in range(40)]) == 0  # growth
    assert one_per_tick_limit(eight_each, list("abcd"), [str(p) for p in range(40)]) == 2


async def test_concurrent_write_batches_interleave_record_by_record():
    scheduler = VirtualScheduler()
    applied: List[str] = []

    async def batch(name: str) -> List[str]:
        return await scheduler.write_group(0.0, [f"{name}{i}" for i in range(20)],
                                           lambda item: applied.append(item) or item, random.Random(4))

    a = asyncio.ensure_future(batch("a"))
    b = asyncio.ensure_future(batch("b"))
    await asyncio.sleep(0)
    scheduler.pop()()
    assert await a == [f"a{i}" for i in range(20)]  # results come back in item order
    assert await b == [f"b{i}" for i in range(20)]
    owners = [item[0] for item in applied]
    assert owners != sorted(owners)  # not one batch after the other
