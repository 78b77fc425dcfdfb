"""The real Event Hubs path end to end: OS processes, the AMQP emulator, Blob storage on Azurite.

1. Three worker processes (``python -m harness.worker``) each run an ``EventProcessor``
   with ``EventHubSource`` and ``BlobCheckpointStore``; the official producer feeds an
   8-partition hub on the session emulator. One worker is SIGKILLed mid-stream. The
   test checks that no event is lost, that the survivors resume the dead worker's
   partitions within the failover bound, and reports the duplicates (a crash replays
   from the last checkpoint; they are counted, not forbidden).
2. Checkpoints interoperate both ways with the official ``EventHubConsumerClient`` and
   its blob checkpoint store: each resumes exactly where the other stopped.

The failover bound: the dead worker's leases expire on the store's clock after
``EXPIRY`` (+1 s, the storage timestamps' resolution); a survivor claims them at its
next tick (at most ``INTERVAL`` x 1.1 later, twice for a lost race) and then opens an
AMQP receiver, which takes the official client about 1 s on this machine. 5 s of slack
covers a busy 2-core machine.
"""
from __future__ import annotations

import asyncio
import time
import uuid

import pytest

from harness.worker import WorkerHandle, spawn_worker

pytestmark = [pytest.mark.azurite, pytest.mark.eventhubs, pytest.mark.slow]

PARTITIONS = 8
WORKERS = 3
INTERVAL = 0.5
EXPIRY = 3.0
TOTAL = 6000
RATE = 800.0  # events per second from the producer
FAILOVER_BOUND = EXPIRY + 1.0 + 2 * 1.1 * INTERVAL + 1.0 + 5.0
WORKER_OPTIONS = ["--interval", str(INTERVAL), "--expiry", str(EXPIRY), "--strategy", "greedy", "--batch", "100",
                  "--prefetch", "100"]


async def _until(condition, what: str, timeout: float, workers: list[WorkerHandle]) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            pytest.fail(f"{what} did not happen within {timeout:.0f}s\n" + "\n".join(w.diagnostics() for w in workers),
                        pytrace=False)
        await asyncio.sleep(0.1)
    return time.monotonic() - started


async def _partition_counts(conn: str, hub: str) -> dict[str, int]:
    from azure.eventhub.aio import EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        return {pid: (await producer.get_partition_properties(pid))["last_enqueued_sequence_number"] + 1
                for pid in await producer.get_partition_ids()}


async def _create_container(azurite, name: str) -> None:
    from azure.storage.blob.aio import BlobServiceClient

    async with BlobServiceClient.from_connection_string(azurite.connection_string) as service:
        await service.create_container(name)


async def test_processes_survive_a_sigkill_without_losing_an_event(azurite, eventhubs_emulator, tmp_path):
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    conn = eventhubs_emulator.connection_string
    hub = eventhubs_emulator.fresh_hub(PARTITIONS)
    container = f"e2e-{uuid.uuid4().hex[:12]}"
    workers: list[WorkerHandle] = []
    produced = 0
    try:
        for index in range(WORKERS):
            workers.append(await spawn_worker(
                f"worker-{index}", hub=hub, container=container, hub_connection_string=conn,
                storage_connection_string=azurite.connection_string, log_dir=str(tmp_path), extra=WORKER_OPTIONS))

        def owned() -> set[str]:
            return set().union(*(set(w.owned) for w in workers if w.alive))

        await _until(lambda: len(owned()) == PARTITIONS and all(w.owned for w in workers),
                     "every partition owned and every worker busy", 60, workers)

        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
        kill_at = TOTAL // 3
        victim, killed_at, victim_partitions = None, 0.0, set()
        async with producer:
            started = time.monotonic()
            while produced < TOTAL:
                partition = str((produced // 20) % PARTITIONS)
                await producer.send_batch([EventData(f"e{produced + i}") for i in range(20)], partition_id=partition)
                produced += 20
                if victim is None and produced >= kill_at:
                    victim = max(workers, key=lambda w: len(w.owned))
                    victim_partitions = set(victim.owned)
                    victim.kill()
                    killed_at = time.time()
                    await victim.process.wait()
                delay = started + produced / RATE - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        assert victim is not None
        counts = await _partition_counts(conn, hub)
        assert sum(counts.values()) == TOTAL
        expected = {(pid, seq) for pid, count in counts.items() for seq in range(count)}
        survivors = [w for w in workers if w is not victim]

        def delivered() -> set[tuple[str, int]]:
            return set().union(*(set(w.deliveries) for w in workers))

        drain_seconds = await _until(lambda: expected <= delivered(), "delivery of every produced event",
                                     EXPIRY + 60, workers)
        assert all(w.alive for w in survivors)
    finally:
        for worker in workers:
            await worker.stop()

    deliveries = sum(sum(w.deliveries.values()) for w in workers)
    lost = expected - delivered()
    duplicates = deliveries - len(delivered())
    failovers = {}
    for partition in victim_partitions:
        after = [t for w in survivors for (t, p, _first, _last) in w.batches if p == partition and t > killed_at]
        failovers[partition] = min(after) - killed_at if after else float("inf")
    replayed = {p: sum(n - 1 for (pp, _s), n in _merged(workers).items() if pp == p and n > 1)
                for p in sorted(victim_partitions, key=int)}
    print(f"\ne2e: {TOTAL} events over {PARTITIONS} partitions, {WORKERS} processes; SIGKILL of {victim.owner_id} "
          f"(partitions {sorted(victim_partitions, key=int)}) after {kill_at} events; lost {len(lost)}; "
          f"duplicates {duplicates} (per dead partition {replayed}); failover "
          f"{max(failovers.values()):.1f}s (bound {FAILOVER_BOUND:.1f}s; per partition "
          f"{ {p: round(s, 1) for p, s in sorted(failovers.items(), key=lambda kv: int(kv[0]))} }); "
          f"drained {drain_seconds:.1f}s after the last send")
    assert not lost, f"{len(lost)} events were never delivered, e.g. {sorted(lost)[:5]}"
    assert victim_partitions and max(failovers.values()) <= FAILOVER_BOUND


def _merged(workers: list[WorkerHandle]) -> dict[tuple[str, int], int]:
    merged: dict[tuple[str, int], int] = {}
    for worker in workers:
        for key, count in worker.deliveries.items():
            merged[key] = merged.get(key, 0) + count
    return merged


async def test_checkpoints_interoperate_both_ways_with_the_official_consumer(azurite, eventhubs_emulator, tmp_path):
    """official -> ours -> official, each resuming exactly where the previous one stopped."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    conn = eventhubs_emulator.connection_string
    hub = eventhubs_emulator.fresh_hub(4)
    container = f"interop-{uuid.uuid4().hex[:12]}"
    await _create_container(azurite, container)  # the official store does not create it
    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)

    async def produce(phase: str, per_partition: int) -> None:
        async with producer:
            for pid in range(4):
                await producer.send_batch([EventData(f"{phase}{i}") for i in range(per_partition)],
                                          partition_id=str(pid))

    async def consume(impl: str, owner: str, until: int) -> WorkerHandle:
        worker = await spawn_worker(owner, hub=hub, container=container, hub_connection_string=conn,
                                    storage_connection_string=azurite.connection_string, log_dir=str(tmp_path),
                                    extra=["--impl", impl, "--interval", "0.5", "--expiry", "4",
                                           "--strategy", "greedy", "--batch", "10", "--prefetch", "20"])
        try:
            await _until(lambda: sum(worker.deliveries.values()) >= until, f"{impl} consuming {until} events",
                         60, [worker])
            await asyncio.sleep(1.0)  # anything beyond what it should get would arrive now
        finally:
            await worker.stop()  # graceful: checkpoints written, ownership released
        return worker

    await produce("a", 25)
    first = await consume("official", "official-1", 100)
    await produce("b", 15)
    second = await consume("ours", "ours-1", 60)
    await produce("c", 10)
    third = await consume("official", "official-2", 40)

    def received(worker: WorkerHandle) -> dict[str, list[int]]:
        result: dict[str, list[int]] = {}
        for (partition, seq), count in sorted(worker.deliveries.items(), key=lambda kv: (int(kv[0][0]), kv[0][1])):
            result.setdefault(partition, []).extend([seq] * count)
        return result

    assert received(first) == {str(p): list(range(0, 25)) for p in range(4)}
    assert received(second) == {str(p): list(range(25, 40)) for p in range(4)}, "ours did not resume from official"
    assert received(third) == {str(p): list(range(40, 50)) for p in range(4)}, "official did not resume from ours"
