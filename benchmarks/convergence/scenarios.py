"""The convergence benchmark's scenarios: each runs one implementation, one strategy, one
schedule on a fresh simulation (:mod:`harness.simulation`) and returns an :class:`Outcome`."""
from __future__ import annotations

import contextlib
import math
import statistics
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from eventprocessor import LoadBalancingStrategy
from harness.simulation import PhaseResult, Simulation, Traffic, minimal_moves, one_per_tick_limit, simulation

BALANCED, GREEDY, STATIC = LoadBalancingStrategy.BALANCED, LoadBalancingStrategy.GREEDY, LoadBalancingStrategy.STATIC
IMPLEMENTATIONS = ("ours", "official")
STRATEGIES = (BALANCED, GREEDY)
SCHEDULES = ("staggered", "lockstep")
INTERVAL = 10.0
EXPIRATION = 60.0
OFFICIAL_DEFAULTS = (30.0, 180.0)  # EventHubConsumerClient: load_balancing_interval, 6 x that
TRAFFIC = Traffic(events_per_second=4.0, step=1.0)
WORK = 0.05  # virtual seconds a handler spends on each batch
BUSY_WORK = 0.5  # the busy-handler variant: half of every second inside a batch
PRE_ROLL = 3.0  # seconds of traffic before a scenario's event: every partition has a checkpoint


@dataclass
class Outcome:
    """One scenario, one implementation, one strategy, one schedule."""

    scenario: str
    schedule: str
    strategy: LoadBalancingStrategy
    implementation: str
    phase: PhaseResult
    limit_ticks: int | None = None
    min_moves: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    event_tick: float | None = None


# --------------------------------------------------------------------------- helpers

def max_ticks(partitions: int, instances: int) -> int:
    return 4 * math.ceil(partitions / max(1, instances)) + 40


def _sim(impl: str, strategy: LoadBalancingStrategy, partitions: int, schedule: str, seed: int, **kwargs: Any) -> Any:
    options: dict[str, Any] = dict(schedule=schedule, seed=seed, interval=INTERVAL, expiration=EXPIRATION,
                                   traffic=TRAFFIC, work=WORK)
    options.update(kwargs)
    return simulation(impl, strategy, partitions, **options)


async def warm(sim: Simulation, instances: int, *, skews: Sequence[float] = (), **options: Any) -> None:
    for i in range(instances):
        sim.add_instance(skew=skews[i] if i < len(skews) else 0.0, **options)
    await sim.run_until_balanced(max_ticks(len(sim.partition_ids), instances))


async def traffic_on(sim: Simulation) -> None:
    """Start the producer and run until every owned partition has been delivered and
    checkpointed."""
    sim.start_traffic()
    await sim.run_until(sim.now + PRE_ROLL)


@contextlib.asynccontextmanager
async def _flowing(impl: str, strategy: LoadBalancingStrategy, partitions: int, schedule: str, seed: int,
                   instances: int, **kwargs: Any) -> AsyncIterator[Simulation]:
    """A simulation whose ``instances`` are balanced with events flowing (every partition
    checkpointed), for a scenario's event."""
    async with _sim(impl, strategy, partitions, schedule, seed, **kwargs) as sim:
        await warm(sim, instances)
        await traffic_on(sim)
        yield sim


def _samples(sim: Simulation) -> list[tuple[float, dict[str, int]]]:
    return [(s.tick, dict(s.counts)) for s in sim.samples]


def _outcome(sim: Simulation, scenario: str, phase: PhaseResult, **kwargs: Any) -> Outcome:
    extra = kwargs.pop("extra", {})
    extra.setdefault("undelivered", sim.undelivered() if sim.traffic is not None else 0)
    return Outcome(scenario=scenario, schedule=sim.schedule, strategy=sim.strategy,
                   implementation=sim.implementation, phase=phase, samples=_samples(sim), extra=extra, **kwargs)


def orphans_of(sim: Simulation, names: Sequence[str]) -> list[str]:
    owners = sim.owner_map()
    return [pid for pid, owner in owners.items() if owner in set(names)]


# --------------------------------------------------------------------------- scenarios


async def cold_start(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                     partitions: int, instances: int, *, traffic: bool = True) -> Outcome:
    async with _sim(impl, strategy, partitions, schedule, seed) as sim:
        if traffic:
            sim.start_traffic()
        mark = sim.mark()
        for _ in range(instances):
            sim.add_instance()
        phase = await sim.run_until_balanced(max_ticks(partitions, instances), mark=mark)
        limit = math.ceil(partitions / instances) if strategy is BALANCED else 1
        extra = {"traffic": traffic, "undelivered": sim.undelivered() if traffic else 0}
        return _outcome(sim, f"cold start P={partitions} N={instances}", phase, limit_ticks=limit, min_moves=0,
                        event_tick=0.0, extra=extra)


async def _rebalance(sim: Simulation, name: str, event: Callable[[], Awaitable[Any]], budget: int) -> Outcome:
    """The rebalance after ``event``: ticks to balanced against the one-per-tick limit
    (BALANCED; 1 tick for GREEDY), moves against the fewest possible."""
    before = sim.owner_map()
    event_tick = sim.now / INTERVAL
    mark = sim.mark()
    await event()
    live = [i.owner_id for i in sim.alive]
    phase = await sim.run_until_balanced(budget, mark=mark)
    limit = one_per_tick_limit(before, live, sim.partition_ids) if sim.strategy is BALANCED else 1
    return _outcome(sim, name, phase, limit_ticks=limit, min_moves=minimal_moves(before, live, sim.partition_ids),
                    event_tick=event_tick)


async def scale_out(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                    partitions: int, instances: int, added: int, *, work: float = WORK) -> Outcome:
    async def add() -> None:
        for _ in range(added):
            sim.add_instance()

    async with _flowing(impl, strategy, partitions, schedule, seed, instances, work=work) as sim:
        busy = "" if work == WORK else f", busy handlers ({work * 1000:.0f} ms per batch)"
        return await _rebalance(sim, f"scale out P={partitions} N={instances}->{instances + added}{busy}", add,
                                max_ticks(partitions, instances + added))


async def scale_in(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                   partitions: int, instances: int, removed: int) -> Outcome:
    async with _flowing(impl, strategy, partitions, schedule, seed, instances) as sim:
        await sim.run_to_mid_batch()
        return await _rebalance(sim, f"graceful scale in P={partitions} N={instances}->{instances - removed}",
                                lambda: sim.stop(*sim.alive[:removed]), max_ticks(partitions, instances))


async def crash(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                partitions: int, instances: int, crashed: int) -> Outcome:
    async with _flowing(impl, strategy, partitions, schedule, seed, instances) as sim:
        await sim.run_to_mid_batch()
        victims = list(sim.alive[-crashed:])
        before = sim.owner_map()
        orphans = orphans_of(sim, [v.owner_id for v in victims])
        expiry = sim.record_expiry(orphans)
        crash_time = sim.now
        mark = sim.mark()
        for victim in victims:
            await sim.crash(victim)
        live = [i.owner_id for i in sim.alive]
        reowned = await sim.run_until_reowned(orphans, max_ticks(partitions, instances) + EXPIRATION / INTERVAL)
        phase = await sim.run_until_balanced(max_ticks(partitions, instances) + EXPIRATION / INTERVAL, mark=mark)
        resumed = sim.resumed_at(orphans, crash_time)
        forced = math.ceil(len(orphans) / max(1, len(live))) if strategy is BALANCED else 1
        to_expiry = sim.ticks_between(crash_time, expiry) if expiry > crash_time else 0
        limit = to_expiry + (one_per_tick_limit(before, live, sim.partition_ids) if strategy is BALANCED else 1)
        extra = {
            "orphans": len(orphans),
            "survivors": len(live),
            "forced_ticks": forced,
            "failover_s": None if reowned is None else reowned - crash_time,
            "resumed_s": None if resumed is None else resumed - crash_time,
            "ticks_past_expiry": None if reowned is None else max(0.0, reowned - expiry) / INTERVAL,
        }
        return _outcome(sim, f"crash P={partitions} N={instances}, {crashed} crash", phase,
                        limit_ticks=limit, min_moves=minimal_moves(before, live, sim.partition_ids),
                        extra=extra, event_tick=crash_time / INTERVAL)


async def growth(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                 partitions: int, instances: int, added: int) -> Outcome:
    async def grow() -> None:
        sim.add_partitions(added)

    async with _flowing(impl, strategy, partitions, schedule, seed, instances) as sim:
        return await _rebalance(sim, f"partition growth {partitions}->{partitions + added}, N={instances}", grow,
                                max_ticks(partitions + added, instances))


async def rolling_restart(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                          partitions: int, instances: int, downtime: float = 5.0) -> Outcome:
    """Each instance in turn is stopped (while every partition is inside a batch) and
    replaced, ``downtime`` seconds later, by a new one; the next goes once the group is
    balanced again."""
    async with _flowing(impl, strategy, partitions, schedule, seed, instances) as sim:
        mark = sim.mark()
        originals = list(sim.alive)
        for old in originals:
            await sim.run_to_mid_batch()
            await sim.stop(old)
            await sim.run_until(sim.now + downtime)
            sim.add_instance()
            await sim.run_until_balanced(max_ticks(partitions, instances), settle_ticks=2)
        phase = sim.result(mark, balanced_at=sim.balanced_since)
        pauses = sim.deliveries.longest_pauses(mark["at"], sim.now)
        extra = {"pause_max": max(pauses.values(), default=0.0),
                 "pause_median": statistics.median(pauses.values()) if pauses else 0.0,
                 "downtime": downtime}
        return _outcome(sim, f"rolling restart P={partitions} N={instances}", phase, extra=extra)


async def standbys(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int,
                   partitions: int, instances: int) -> Outcome:
    """More instances than partitions: the extra ones stand by. One owner crashes."""
    async with _flowing(impl, strategy, partitions, schedule, seed, instances) as sim:
        await sim.run_to_mid_batch()
        counts = sim.counts()
        idle = {owner for owner, count in counts.items() if count == 0}
        victim = next(i for i in sim.alive if counts[i.owner_id] > 0)
        orphans = orphans_of(sim, [victim.owner_id])
        expiry = sim.record_expiry(orphans)
        crash_time = sim.now
        mark = sim.mark()
        await sim.crash(victim)
        await sim.run_until_reowned(orphans, EXPIRATION / INTERVAL + 10)
        phase = await sim.run_until_balanced(EXPIRATION / INTERVAL + 10, mark=mark, settle_ticks=2)
        resumed = sim.resumed_at(orphans, crash_time)
        takers = {b.owner_id for pid in orphans
                  for b in [sim.deliveries.first_batch(pid, crash_time, {i.owner_id for i in sim.alive})] if b}
        member_expiry = sim.ledger.member_expiry(victim.owner_id)
        extra = {"standbys": len(idle), "expected_standbys": max(0, instances - partitions),
                 "by_standby": bool(takers) and takers <= idle,
                 "resumed_s": None if resumed is None else resumed - crash_time,
                 "expiry_s": expiry - crash_time,
                 "member_expiry_s": None if member_expiry is None else member_expiry - crash_time}
        return _outcome(sim, f"standbys P={partitions} N={instances}, 1 owner crashes", phase, extra=extra,
                        event_tick=crash_time / INTERVAL)


async def static_assignment(schedule: str, seed: int, partitions: int, replicas: int, crashed_ordinal: int) -> Outcome:
    """STATIC: shares by ordinal; ordinal ``crashed_ordinal`` crashes, then returns."""
    async with _sim("ours", STATIC, partitions, schedule, seed) as sim:
        sim.start_traffic()
        mark = sim.mark()
        members = [sim.add_instance(ordinal=k, replica_count=replicas) for k in range(replicas)]
        cold = await sim.run_until_balanced(max_ticks(partitions, replicas), mark=mark)
        shares = {k: sorted((pid for pid, o in sim.owner_map().items() if o == m.owner_id), key=int)
                  for k, m in enumerate(members)}
        expected = {k: [str(i) for i in range(partitions) if i % replicas == k] for k in range(replicas)}
        await sim.run_to_mid_batch()
        victim = members[crashed_ordinal]
        orphans = orphans_of(sim, [victim.owner_id])
        expiry = sim.record_expiry(orphans)
        member_expiry = sim.ledger.member_expiry(victim.owner_id)
        crash_time = sim.now
        crash_mark = sim.mark()
        await sim.crash(victim)
        await sim.run_until_reowned(orphans, EXPIRATION / INTERVAL + 10)
        after_crash = await sim.run_until_balanced(EXPIRATION / INTERVAL + 10, mark=crash_mark, settle_ticks=2)
        resumed = sim.resumed_at(orphans, crash_time)
        return_mark = sim.mark()
        back = sim.add_instance(ordinal=crashed_ordinal, replica_count=replicas)

        def share_back() -> bool:
            owners = sim.owner_map()
            return all(owners[pid] == back.owner_id for pid in expected[crashed_ordinal])

        await sim.run_until(sim.now + 10 * INTERVAL, stop_when=share_back)
        returned_at = sim.now if share_back() else None
        await sim.run_until(sim.now + 2 * INTERVAL)
        returned = sim.result(return_mark, balanced_at=returned_at)
        extra = {
            "cold_ticks": cold.ticks_to_balanced, "shares_ok": shares == expected,
            "crash": after_crash, "resumed_s": None if resumed is None else resumed - crash_time,
            "expiry_s": expiry - crash_time, "return": returned,
            "member_expiry_s": None if member_expiry is None else member_expiry - crash_time,
        }
        return _outcome(sim, f"static P={partitions} replica_count={replicas}: ordinal {crashed_ordinal} crashes, "
                        "then returns", cold, extra=extra)


async def balance_factor(strategy: LoadBalancingStrategy, schedule: str, seed: int, factor: int, partitions: int,
                         instances: int, added: int) -> Outcome:
    async with _flowing("ours", strategy, partitions, schedule, seed, instances, balance_tolerance=factor,
                        processor_options={"balance_factor": factor}) as sim:
        before = sim.owner_map()
        mark = sim.mark()
        for _ in range(added):
            sim.add_instance()
        live = [i.owner_id for i in sim.alive]
        phase = await sim.run_until_balanced(max_ticks(partitions, instances + added), mark=mark)
        counts = sim.counts()
        extra = {"factor": factor, "spread": max(counts.values()) - min(counts.values()),
                 "counts": sorted(counts.values())}
        return _outcome(sim, f"balance_factor={factor}: scale out P={partitions} N={instances}->{instances + added}",
                        phase, min_moves=minimal_moves(before, live, sim.partition_ids), extra=extra)


async def steady(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int, partitions: int,
                 instances: int, ticks: int, *, latency: float = 0.0, jitter: float = 0.0, interval: float = INTERVAL,
                 expiration: float = EXPIRATION, renewal_age: float | None = None, label: str = "") -> Outcome:
    """No traffic: storage requests of a balanced group, per hour."""
    options = {} if renewal_age is None else {"ownership_renewal_age": renewal_age}
    async with simulation(impl, strategy, partitions, schedule=schedule, seed=seed, interval=interval,
                          expiration=expiration, latency=latency, tick_jitter=jitter,
                          processor_options=options) as sim:
        await warm(sim, instances)
        mark = sim.mark()
        await sim.run_until(sim.now + ticks * interval)
        phase = sim.result(mark, balanced_at=mark["at"] if sim.is_balanced() else None)
        per_hour = phase.coordination_requests / phase.duration * 3600.0
        extra = {"per_hour": per_hour, "latency": latency, "jitter": jitter, "ticks": ticks}
        return Outcome(scenario=label or f"steady P={partitions} N={instances}", schedule=schedule,
                       strategy=strategy, implementation=impl, phase=phase, extra=extra)


async def skewed(impl: str, strategy: LoadBalancingStrategy, schedule: str, seed: int, partitions: int,
                 instances: int, skew: float, ticks: int) -> Outcome:
    """One instance's local clock is ``skew`` seconds ahead. Cold start, a steady stretch
    with traffic, then the crash of one other instance."""
    async with _sim(impl, strategy, partitions, schedule, seed) as sim:
        watched = sim.add_instance(skew=skew)
        for _ in range(instances - 1):
            sim.add_instance()
        cold = await sim.run_until_balanced(max_ticks(partitions, instances))
        # Cold-start steals are the strategy's own business (greedy newcomers steal by
        # design); what the skew may cause is counted from here on.
        steals_before = sim.ledger.steals_by.get(watched.owner_id, 0)
        await traffic_on(sim)
        mark = sim.mark()
        await sim.run_until(sim.now + ticks * INTERVAL)
        await sim.run_to_mid_batch()
        # What the skew causes is measured up to the crash; the crash's own cost (the
        # batches in flight) is the same for both and is in the failover table.
        phase = sim.result(mark, balanced_at=cold.balanced_at)
        victim = sim.alive[-1]
        orphans = orphans_of(sim, [victim.owner_id])
        expiry = sim.record_expiry(orphans)
        await sim.crash(victim)
        reowned = await sim.run_until_reowned(orphans, max_ticks(partitions, instances) + EXPIRATION / INTERVAL)
        await sim.run_until(sim.now + 10 * INTERVAL)
        extra = {
            "skew": skew,
            "steals_by_skewed": sim.ledger.steals_by.get(watched.owner_id, 0) - steals_before,
            "orphans": len(orphans),
            "ticks_past_expiry": None if reowned is None else max(0.0, reowned - expiry) / INTERVAL,
            "cold_ticks": cold.ticks_to_balanced,
        }
        return _outcome(sim, f"clock skew +{skew:.0f}s, P={partitions} N={instances}", phase, extra=extra)
