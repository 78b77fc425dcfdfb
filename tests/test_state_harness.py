"""The fault harness for stateful partitions: a per-key counter in
``context.state`` ends equal to the events produced per key, on many seeds.

Real stateful EventProcessors on virtual time over the in-memory store, each behind its
own faulty link, with crashes (records left to expire), graceful restarts (handoffs and
releases), processors joining (planned moves with warm-up), standbys, and store faults
(latency, a black hole, an outage, errors, answers lost after the write). Handlers
checkpoint at random cadences, so crashes replay from checkpoints of every age. At the
end every partition's state is restored the way a new owner would restore it and
compared with the counts of what was produced.

CI runs ``STATE_SEEDS`` examples (default 30); ``STATE_SEEDS=500 pytest
tests/test_state_harness.py -q`` is the soak.
"""
from __future__ import annotations

import asyncio
import os
import random
from collections import Counter
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventprocessor import OwnershipLostError, PartitionProcessor, StatePolicy
from eventprocessor.errors import CheckpointStoreError
from eventprocessor.state import StateKeeper, StateLog
from eventprocessor.testing import Cluster, run_virtual

SEEDS = int(os.environ.get("STATE_SEEDS", "30"))
SCOPE = ("memory.local", "hub", "$default")
OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0, shutdown_timeout=5.0)
WINDOW = 40.0


@dataclass(frozen=True)
class Fault:
    kind: str  # crash, restart, join, latency, hang, down, errors, lost_answers
    target: int
    start: float
    duration: float
    level: float


faults = st.builds(Fault, kind=st.sampled_from(["crash", "restart", "join", "latency", "hang", "down", "errors",
                                                "lost_answers"]),
                   target=st.integers(0, 2), start=st.floats(0, WINDOW - 5), duration=st.floats(0.5, 20),
                   level=st.floats(0.05, 0.8))


def counting_handler(rng: random.Random, cluster: Cluster) -> type:
    class Counting(PartitionProcessor):
        async def process_events(self, events, context):
            cluster.ledger.record(context, events, asyncio.get_running_loop().time())
            for event in events:
                key = f"k{int(event.body_as_str()[1:]) % 5}"
                context.state[key] = context.state.get(key, 0) + 1
            await asyncio.sleep(rng.uniform(0, 0.2))
            if rng.random() < 0.6:
                try:
                    await context.update_checkpoint()
                except (OwnershipLostError, CheckpointStoreError):
                    pass  # redelivered from the last checkpoint by whoever owns it next

    return Counting


@settings(max_examples=SEEDS, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None)
@given(seed=st.integers(0, 2**31), partitions=st.integers(1, 6), processors=st.integers(1, 3),
       standbys=st.integers(0, 1), schedule=st.lists(faults, min_size=1, max_size=4))
def test_a_per_key_counter_ends_equal_to_what_was_produced(seed, partitions, processors, standbys, schedule):
    restored, wanted = run_virtual(run_scenario(seed, partitions, processors, standbys, schedule))
    assert restored == wanted


async def run_scenario(seed: int, partitions: int, processors: int, standbys: int,
                       schedule: list[Fault]) -> tuple:
    cluster = Cluster(partitions, seed=seed, stateful=StatePolicy(num_standbys=standbys), **OPTIONS)
    cluster.handler = counting_handler(random.Random(seed), cluster)
    links = [cluster.link() for _ in range(processors)]
    running = [cluster.add(f"p{i}", store=links[i]) for i in range(processors)]
    for p in running:
        await p.start()
    loop = asyncio.get_running_loop()
    producer = asyncio.ensure_future(cluster.produce_for(WINDOW + 20, rate=15))
    slots = [asyncio.Lock() for _ in range(processors)]

    async def apply(fault: Fault) -> None:
        await asyncio.sleep(fault.start)
        index = fault.target % processors
        link = links[index]
        if fault.kind in ("crash", "restart"):
            async with slots[index]:
                await running[index].stop(release=fault.kind == "restart")
                await asyncio.sleep(fault.duration)
                running[index] = cluster.add(f"p{index}-{int(loop.time() * 1000)}", store=link)
                await running[index].start()
            return
        if fault.kind == "join":  # a processor joins for a while: planned moves out and back
            joined = cluster.add(f"j{index}-{int(loop.time() * 1000)}", store=cluster.link())
            await joined.start()
            await asyncio.sleep(fault.duration)
            await joined.stop()
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
    await producer
    await cluster.wait_until(lambda: cluster.settled(running), timeout=120, step=0.25)
    await asyncio.sleep(5)
    for p in running:
        await p.stop()
    checkpoints = {c.partition_id: c for c in await cluster.memory.list_checkpoints(*SCOPE)}
    restored: dict[str, dict[str, int]] = {}
    for pid in map(str, range(partitions)):
        keeper = StateKeeper(StateLog(cluster.memory, SCOPE, pid), epoch=0)
        await keeper.restore(checkpoints.get(pid))
        restored[pid] = dict(keeper.state)
    wanted = {pid: dict(Counter(f"k{int(e.body_as_str()[1:]) % 5}" for e in cluster.source.events(pid)))
              for pid in map(str, range(partitions))}
    return restored, wanted
