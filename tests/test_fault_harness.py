"""The deterministic fault harness: real EventProcessors on virtual time, random faults
on each processor's link to the store, on many seeds (hypothesis).

Invariants, checked throughout and at the end of every run:

* two claims never deliver the same partition at once, apart from the takeover window:
  a batch that started before a takeover may finish after it (bounded by the
  handler's own time, ``WORK``);
* every produced event is processed at least once;
* after the faults stop, every partition is owned by exactly one processor with a live
  pump and every event is processed within ``recovery_bound()``;
* ``stop()`` returns within ``shutdown_timeout + store_timeout``.

CI runs ``FAULT_SEEDS`` examples (default 100). A longer soak is one command::

    FAULT_SEEDS=2000 pytest tests/test_fault_harness.py -q
"""
from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eventprocessor.testing import Cluster, run_virtual

INTERVAL = 1.0
EXPIRATION = 12.0
WORK = 0.3  # longest a handler spends on one batch (virtual seconds)
FAULT_WINDOW = 60.0  # faults happen in [0, FAULT_WINDOW) after the cluster settled
SEEDS = int(os.environ.get("FAULT_SEEDS", "100"))


@dataclass(frozen=True)
class Fault:
    kind: str  # latency, hang, down, errors, lost_answers, crash, restart
    target: int  # which processor's link (or which processor)
    start: float
    duration: float
    level: float


faults = st.builds(
    Fault,
    kind=st.sampled_from(["latency", "hang", "down", "errors", "lost_answers", "crash", "restart"]),
    target=st.integers(0, 3),
    start=st.floats(0, FAULT_WINDOW - 5),
    duration=st.floats(0.5, 30),
    level=st.floats(0.05, 1.0),
)


def recovery_bound(partitions: int, processors: int, timing) -> float:
    """After the last fault ends, how long until every partition is dispatched again by
    one live pump and every event is processed, in virtual seconds.

    A lease of a processor cut off from the store ends within ``lease_length`` after its
    last renewal; its record expires ``expiration`` (plus the store clock's one-second
    resolution) after that renewal; then, one partition per tick and processor in
    BALANCED mode, ``ceil(P/N)`` jittered ticks to take them all; one more store call and
    a batch of work to catch up."""
    ticks = math.ceil(partitions / processors) + 2
    return timing.expiration + 1.0 + ticks * timing.interval * 1.1 + timing.store_timeout + 2 * WORK


@settings(max_examples=SEEDS, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None)
@given(seed=st.integers(0, 2**31), partitions=st.integers(2, 8), processors=st.integers(1, 3),
       strategy=st.sampled_from(["balanced", "greedy"]), schedule=st.lists(faults, min_size=1, max_size=5))
# A store that hung for 9 s: the calls sent during the hang time out after it is over, and
# counting them as congestion backed balancing off for 12 s more (recovered after 21.9 s).
@example(seed=1, partitions=3, processors=1, strategy="balanced", schedule=[
    Fault("latency", 0, 0.0, 1.0, 1.0), Fault("latency", 0, 0.0, 1.0, 1.0), Fault("latency", 0, 0.0, 0.5, 0.25),
    Fault("hang", 0, 21.5, 9.0, 1.0)])
def test_invariants_hold_under_random_faults(seed, partitions, processors, strategy, schedule):
    result = run_virtual(run_scenario(seed, partitions, processors, strategy, schedule))
    assert result.missing == 0, f"events never processed: {result.missing}"
    assert result.recovered_after is not None, f"not recovered within {result.bound:.1f} s after the faults"
    assert result.recovered_after <= result.bound
    assert result.max_overlap <= WORK + 1e-6, f"two claims delivered at once for {result.max_overlap:.3f} s"
    assert result.max_stop <= result.stop_bound


@dataclass
class Result:
    missing: int
    recovered_after: float
    bound: float
    max_overlap: float
    max_stop: float
    stop_bound: float
    duplicates: int
    produced: int


async def run_scenario(seed: int, partitions: int, processors: int, strategy: str, schedule: list[Fault]) -> Result:
    cluster = Cluster(partitions, seed=seed, work=WORK, load_balancing_interval=INTERVAL,
                      partition_ownership_expiration_interval=EXPIRATION, load_balancing_strategy=strategy,
                      shutdown_timeout=5.0)
    links = [cluster.link() for _ in range(processors)]
    running = [cluster.add(f"p{i}", store=links[i]) for i in range(processors)]
    for p in running:
        await p.start()
    loop = asyncio.get_running_loop()
    producer = asyncio.ensure_future(cluster.produce_for(FAULT_WINDOW + 40, rate=20))
    await cluster.wait_until(lambda: cluster.settled(running), timeout=60)
    stops: list[float] = []

    async def timed_stop(p, release=True):
        started = loop.time()
        await p.stop(release=release)
        stops.append(loop.time() - started)

    slots = [asyncio.Lock() for _ in range(processors)]

    async def apply(fault: Fault):
        await asyncio.sleep(fault.start)
        index = fault.target % processors
        link = links[index]
        if fault.kind in ("crash", "restart"):
            async with slots[index]:  # one process per slot: a second crash waits for the restart
                victim = running[index]
                await timed_stop(victim, release=fault.kind == "restart")
                await asyncio.sleep(fault.duration)
                replacement = cluster.add(f"p{index}-{int(loop.time() * 1000)}", store=link)
                running[index] = replacement
                await replacement.start()
            return
        if fault.kind == "latency":
            link.latency, link.jitter = 3.0 * fault.level, True
        elif fault.kind == "hang":
            link.hang = True
        elif fault.kind == "down":
            link.down = True
        elif fault.kind == "errors":
            link.error_rate = fault.level
        elif fault.kind == "lost_answers":
            link.lost_answer_rate = fault.level
        await asyncio.sleep(fault.duration)
        link.clear()

    await asyncio.gather(*(apply(f) for f in schedule))
    for link in links:
        link.clear()
    faults_over = loop.time()
    bound = recovery_bound(partitions, processors, running[0].timing)
    produced_by_then = len(cluster.produced)
    # Recovered: one live pump per partition and everything produced while the faults
    # lasted processed (the producer keeps going, so later events are always in flight).
    recovered = await cluster.wait_until(lambda: cluster.settled(running, produced_by_then), timeout=bound + 30,
                                         step=0.1)
    await producer
    await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=bound)
    for p in running:
        await timed_stop(p)
    overlaps = cluster.ledger.overlaps()
    timing = running[0].timing
    return Result(
        missing=len(set(cluster.produced) - cluster.ledger.processed()),
        recovered_after=None if recovered is None else recovered - faults_over,
        bound=bound,
        max_overlap=max((o for _a, _b, o in overlaps), default=0.0),
        max_stop=max(stops, default=0.0),
        stop_bound=timing.shutdown_timeout + timing.store_timeout + 1.0,
        duplicates=cluster.ledger.duplicates(),
        produced=len(cluster.produced),
    )
