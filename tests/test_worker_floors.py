"""The floors of the ``e2e`` benchmark on the session's Event Hubs emulator: the bare
receive loops ``python -m harness.worker --impl floor`` (azure-eventhub's frame reading)
and ``--impl floor-lean`` (this SDK's lean receive path's, ``frames.read_buffered_frames``).

Each reads a filled hub from its start and must report every event exactly once: a
floor that lost, repeated or invented an event would make every ratio against it wrong.
The hub holds more than a prefetch per partition, so the link's credit is granted
again several times, and each read asks for fewer frames than the credit.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from harness.worker import spawn_worker

pytestmark = [pytest.mark.eventhubs]

PARTITIONS = 4  # the ``hub`` fixture's
PER_PARTITION = 1_500
PREFETCH = 200


async def _fill(conn: str, hub: str) -> None:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        for partition in range(PARTITIONS):
            sent = 0
            while sent < PER_PARTITION:
                batch = await producer.create_batch(partition_id=str(partition))
                while sent < PER_PARTITION:
                    try:
                        batch.add(EventData(b"e%d" % sent))
                    except ValueError:
                        break
                    sent += 1
                await producer.send_batch(batch)


@pytest.mark.parametrize("impl", ["floor", "floor-lean"])
async def test_a_floor_reports_every_event_of_the_hub_exactly_once(eventhubs_emulator, hub, impl, tmp_path):
    conn = eventhubs_emulator.connection_string
    await _fill(conn, hub)
    total = PARTITIONS * PER_PARTITION
    worker = await spawn_worker(f"{impl}-0", hub=hub, container=None, hub_connection_string=conn,
                                storage_connection_string=None, log_dir=str(tmp_path),
                                extra=["--impl", impl, "--prefetch", str(PREFETCH), "--expect", str(total)])
    try:
        deadline = time.monotonic() + 60
        while worker.done is None and worker.alive and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert worker.done is not None, worker.diagnostics()
        await asyncio.sleep(0.5)  # a delivery past the hub's end (a repeat) would show by now
    finally:
        await worker.stop()
    assert worker.process.returncode == 0 and worker.stopped, worker.diagnostics()
    assert worker.started is not None and worker.started["impl"] == impl
    expected = {(str(p), s) for p in range(PARTITIONS) for s in range(PER_PARTITION)}
    assert set(worker.deliveries) == expected, (sorted(expected - set(worker.deliveries))[:10],
                                                sorted(set(worker.deliveries) - expected)[:10])
    repeated = {key: n for key, n in worker.deliveries.items() if n != 1}
    assert not repeated, f"delivered more than once: {sorted(repeated.items())[:10]}"
    assert worker.done["events"] == total and worker.events == total
