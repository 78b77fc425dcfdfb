"""Three OS processes share 12 partitions through BlobCheckpointStore on Azurite.

Each process (``python -m harness.worker --source none``) runs an ``EventProcessor`` over
its own 12 partitions without events; they coordinate only through the ownership blobs. The test
checks that they settle at 4/4/4 with every partition owned by a live worker, then
SIGKILLs one and checks that the other two (GREEDY) take all of its partitions within
one tick of its records expiring, without touching each other's partitions and without taking any of
the dead worker's partitions before its lease ran out on the *server's* clock.

No tight timing assertion: the machine is shared. Waits are bounded (expiry plus a
generous number of ticks), the failover time is measured and printed, and the safety
property is checked on the store's own timestamps.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pytest

from eventprocessor._ownership.liveness import heartbeats, with_heartbeats
from harness.worker import WorkerHandle, spawn_worker

pytestmark = [pytest.mark.azurite, pytest.mark.slow]

PARTITIONS = 12
WORKERS = 3
INTERVAL = 0.5  # load-balancing interval, seconds
EXPIRY = 3.0  # ownership expiration interval, seconds
CONSUMER_GROUP = "$default"
# Bounds, not goals: cold start of three Python processes on a busy machine, then
# balance; failover is expiry + 1 s (the store's timestamps have 1 s resolution) +
# many ticks of slack.
STARTUP_TIMEOUT = 30.0
BALANCE_TIMEOUT = 25.0
FAILOVER_TIMEOUT = EXPIRY + 1.0 + 16 * INTERVAL
# The failover bound in ticks of the survivors (their own clock, so it holds on a slow
# machine too): the ticks that fit in the dead worker's lease plus the 1 s timestamp
# resolution, at the shortest jittered tick (0.9 x interval); then ONE tick, in which
# GREEDY survivors claim all the orphans; plus one for the delay of the report.
FAILOVER_TICK_BOUND = int(-(-(EXPIRY + 1.0) // (0.9 * INTERVAL))) + 1 + 1
POLL = 0.2


async def _spawn(owner_id: str, container: str, connection_string: str, tmp_path: Path) -> WorkerHandle:
    """Start the worker program on 12 partitions without events; its handle reads the
    ``started`` line and the ``owned`` lines (what it owns, and its ticks: at least once a
    second, so that the tick count the test reads is recent)."""
    return await spawn_worker(owner_id, hub="mp", container=container, hub_connection_string=None,
                              storage_connection_string=connection_string, log_dir=str(tmp_path),
                              extra=["--source", "none", "--partitions", str(PARTITIONS), "--interval", str(INTERVAL),
                                     "--expiry", str(EXPIRY), "--strategy", "greedy", "--owned-every", "1",
                                     "--stats-interval", "0"])


@dataclass
class Snapshot:
    """The live (unexpired, owned) records, judged on the store's clock."""

    owners: dict[str, str]  # partition id -> owner id
    modified: dict[str, datetime]  # partition id -> last modified (store time)
    server_time: datetime

    def counts(self) -> Counter:
        return Counter(self.owners.values())


async def _snapshot(store, namespace: str, eventhub: str) -> Snapshot:
    listing, members = await store.list_ownership_and_members(namespace, eventhub, CONSUMER_GROUP)
    # A record lives as long as its owner's heartbeat when that heartbeat keeps it: its
    # last proof of life is the later of the two (what the processors judge by).
    listing = with_heartbeats(listing, heartbeats(members))
    owners: dict[str, str] = {}
    modified: dict[str, datetime] = {}
    for record in listing.ownerships:
        if record.is_released or record.last_modified_time is None:
            continue
        if (listing.server_time - record.last_modified_time).total_seconds() >= EXPIRY:
            continue
        owners[record.partition_id] = record.owner_id
        modified[record.partition_id] = record.last_modified_time
    return Snapshot(owners, modified, listing.server_time)


def _fail(message: str, workers: list[WorkerHandle]) -> None:
    pytest.fail(message + "\n" + "\n".join(w.diagnostics() for w in workers), pytrace=False)


async def test_three_processes_balance_then_survivors_take_over_a_killed_one(azurite, tmp_path):
    from eventprocessor.stores.blob import BlobCheckpointStore

    container = f"mp-{uuid.uuid4().hex[:12]}"
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    workers: list[WorkerHandle] = []
    try:
        for index in range(WORKERS):
            workers.append(await _spawn(f"worker-{index}", container, azurite.connection_string, tmp_path))

        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not all(w.started for w in workers):
            if time.monotonic() > deadline or not all(w.alive for w in workers):
                _fail("workers did not all start", workers)
            await asyncio.sleep(POLL)
        namespace = workers[0].started["namespace"]
        eventhub = workers[0].started["eventhub"]
        ids = {w.owner_id for w in workers}

        # Phase 1: balanced 4/4/4, in the store and in what each worker dispatches.
        start = time.monotonic()
        while True:
            snap = await _snapshot(store, namespace, eventhub)
            balanced = (
                len(snap.owners) == PARTITIONS
                and set(snap.counts()) <= ids
                and sorted(snap.counts().values()) == [PARTITIONS // WORKERS] * WORKERS
                and all(set(w.owned) == {p for p, o in snap.owners.items() if o == w.owner_id} for w in workers)
            )
            if balanced:
                break
            if time.monotonic() - start > BALANCE_TIMEOUT or not all(w.alive for w in workers):
                _fail(f"no balanced ownership within {BALANCE_TIMEOUT}s: {dict(snap.counts())}", workers)
            await asyncio.sleep(POLL)
        balance_seconds = time.monotonic() - start
        assert all(w.alive for w in workers)

        # Phase 2: SIGKILL one worker; the two others must take all its partitions.
        victim, survivors = workers[0], workers[1:]
        before = {w.owner_id: {p for p, o in snap.owners.items() if o == w.owner_id} for w in workers}
        victim.kill()
        await victim.process.wait()
        killed_at = time.monotonic()
        ticks_at_kill = {w.owner_id: w.ticks for w in survivors}
        # The dead worker's last write, on the store's clock: the latest proof of life seen
        # on any of its records, its heartbeat included (a write in flight at the kill
        # shows up in later polls).
        victim_last_write: datetime | None = None
        takeover_modified: dict[str, datetime] = {}
        while True:
            snap = await _snapshot(store, namespace, eventhub)
            for partition, owner in snap.owners.items():
                if owner == victim.owner_id:
                    stamp = snap.modified[partition]
                    victim_last_write = stamp if victim_last_write is None else max(victim_last_write, stamp)
                elif partition in before[victim.owner_id]:
                    takeover_modified.setdefault(partition, snap.modified[partition])
            done = (
                len(snap.owners) == PARTITIONS
                and set(snap.counts()) <= {w.owner_id for w in survivors}
                and all(set(w.owned) == {p for p, o in snap.owners.items() if o == w.owner_id}
                        for w in survivors)
            )
            if done:
                break
            if time.monotonic() - killed_at > FAILOVER_TIMEOUT or not all(w.alive for w in survivors):
                _fail(
                    f"survivors did not take over within {FAILOVER_TIMEOUT}s (expiry {EXPIRY}s + slack): "
                    f"{dict(snap.counts())}",
                    workers,
                )
            await asyncio.sleep(POLL)
        failover_seconds = time.monotonic() - killed_at
        failover_ticks = max(w.ticks - ticks_at_kill[w.owner_id] for w in survivors)

        counts = snap.counts()
        # Stickiness: each survivor kept its own partitions; only the dead one's moved.
        for w in survivors:
            mine = {p for p, o in snap.owners.items() if o == w.owner_id}
            assert before[w.owner_id] <= mine, f"{w.owner_id} lost partitions it owned before the kill"
        assert sum(counts.values()) == PARTITIONS
        # Safety, on the store's clock: no partition of the dead worker was taken before
        # its lease ran out (both stamps have 1 s resolution, hence the 1 s allowance).
        assert victim_last_write is not None
        for partition, stamp in takeover_modified.items():
            lease_age = (stamp - victim_last_write).total_seconds()
            assert lease_age >= EXPIRY - 1.0, (
                f"partition {partition} was taken {lease_age:.1f}s (store time) after the dead "
                f"worker's last write, before its {EXPIRY}s lease ran out"
            )
        # Liveness, in the survivors' own ticks rather than wall-clock time.
        assert failover_ticks <= FAILOVER_TICK_BOUND, (
            f"failover took {failover_ticks} ticks of the survivors, more than {FAILOVER_TICK_BOUND} "
            f"(expiry {EXPIRY}s at {INTERVAL}s per tick, plus claims and slack)"
        )
        server_failover = max(
            (stamp - victim_last_write).total_seconds() for stamp in takeover_modified.values()
        ) if takeover_modified else float("nan")
        print(
            f"\nmulti-process: balanced {PARTITIONS // WORKERS}/{PARTITIONS // WORKERS}/{PARTITIONS // WORKERS} "
            f"in {balance_seconds:.1f}s; after SIGKILL the survivors owned all {PARTITIONS} partitions "
            f"{failover_seconds:.1f}s later ({failover_ticks} survivor ticks, bound {FAILOVER_TICK_BOUND}); "
            f"on the store's clock the last takeover came {server_failover:.0f}s after the dead worker's "
            f"last write (expiry {EXPIRY}s, tick {INTERVAL}s, timestamps 1s resolution); "
            f"final split {sorted(counts.values())}"
        )
    finally:
        for w in workers:
            w.kill()
        for w in workers:
            await w.stop()  # already killed: waits for the process and its reader
        await store.close()
