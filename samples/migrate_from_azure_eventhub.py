"""Migrating from azure-eventhub: the same callbacks, first under the official client, then
under eventprocessor's drop-in, which resumes from the official client's checkpoints.

Run it from the repository root (needs the ``[eventhub,blob]`` extras,
``azure-eventhub-checkpointstoreblob-aio`` and ``npm ci``):

    python samples/migrate_from_azure_eventhub.py        # starts Azurite and a local Event Hubs emulator
    python samples/migrate_from_azure_eventhub.py --eventhub hub   # with STORAGE_CONNECTION_STRING and
                                                                   # EVENTHUB_CONNECTION_STRING set

``run()`` is the user's program. It is called twice, with the classes of ``official()``
and of ``eventprocessor()``: only the consumer client's import differs, that is the whole
migration. azure-eventhub's ``BlobCheckpointStore`` stays; the drop-in runs
``stores.BlobCheckpointStore`` on its container, so the checkpoints stay in the same blobs.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import uuid
from collections import defaultdict
from contextlib import AsyncExitStack
from typing import Any

from eventprocessor.cli.running import run_program
from eventprocessor.cli.user_errors import require_or_exit


def official() -> tuple[Any, Any]:
    from azure.eventhub.aio import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    return EventHubConsumerClient, BlobCheckpointStore


def eventprocessor() -> tuple[Any, Any]:
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    from eventprocessor import EventHubConsumerClient

    return EventHubConsumerClient, BlobCheckpointStore


async def run(classes: tuple[Any, Any], *, conn: str, eventhub: str, storage: str, container: str,
              expected: int) -> dict[str, list[int]]:
    """The user's program: receive ``expected`` events, checkpointing each batch, then close."""
    EventHubConsumerClient, BlobCheckpointStore = classes
    received: dict[str, list[int]] = defaultdict(list)
    done = asyncio.Event()

    async def on_event_batch(partition_context, events):
        for event in events:
            received[partition_context.partition_id].append(event.sequence_number)
        if events:
            await partition_context.update_checkpoint()
        if sum(len(seqs) for seqs in received.values()) >= expected:
            done.set()

    async def on_error(partition_context, error):
        print(f"error on {partition_context.partition_id if partition_context else 'load balancing'}: {error!r}")

    checkpoint_store = BlobCheckpointStore.from_connection_string(storage, container_name=container)
    client = EventHubConsumerClient.from_connection_string(
        conn, consumer_group="$default", eventhub_name=eventhub, checkpoint_store=checkpoint_store,
        load_balancing_interval=1.0, partition_ownership_expiration_interval=10.0)
    receiving = asyncio.create_task(client.receive_batch(on_event_batch, max_batch_size=50, starting_position="-1",
                                                         on_error=on_error))
    try:
        await asyncio.wait_for(done.wait(), 60)
        await asyncio.sleep(1.0)  # anything it should not get would arrive now
    finally:
        await client.close()
        await receiving
        await checkpoint_store.close()
    return dict(received)


def describe(received: dict[str, list[int]]) -> str:
    return ", ".join(f"{pid}: {seqs[0]}-{seqs[-1]}" if seqs else f"{pid}: none"
                     for pid, seqs in sorted(received.items(), key=lambda kv: int(kv[0])))


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eventhub", default="telemetry")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    # Everything it needs, checked before it starts anything: a missing piece is one line naming the fix.
    require_or_exit("samples/migrate_from_azure_eventhub.py", extras=["eventhub", "blob"],
                    packages=[("azure.eventhub.extensions.checkpointstoreblobaio",
                               "azure-eventhub-checkpointstoreblob-aio")],
                    azurite=not os.environ.get("STORAGE_CONNECTION_STRING"))
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient
    from azure.storage.blob.aio import BlobServiceClient

    async with AsyncExitStack() as stack:
        storage = os.environ.get("STORAGE_CONNECTION_STRING")
        if not storage:
            from eventprocessor.emulators.azurite import start_azurite

            azurite = start_azurite()
            stack.callback(azurite.stop)
            storage = azurite.connection_string
            print(f"started Azurite on 127.0.0.1:{azurite.blob_port}")
        conn = os.environ.get("EVENTHUB_CONNECTION_STRING")
        if not conn:
            from eventprocessor.emulators.eventhubs import EventHubsEmulator

            emulator = await stack.enter_async_context(EventHubsEmulator(eventhubs=[args.eventhub], partitions=4))
            conn = emulator.connection_string
            print(f"started an Event Hubs emulator on 127.0.0.1:{emulator.port}")
        container = f"migration-{uuid.uuid4().hex[:10]}"
        async with BlobServiceClient.from_connection_string(storage) as service:
            await service.create_container(container)  # the official store does not create its container
        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=args.eventhub)
        stack.push_async_callback(producer.close)
        partitions = await producer.get_partition_ids()

        async def send(label: str, per_partition: int) -> None:
            for pid in partitions:
                await producer.send_batch([EventData(f"{label} {i}") for i in range(per_partition)], partition_id=pid)

        common = dict(conn=conn, eventhub=args.eventhub, storage=storage, container=container)
        await send("before", 25)
        before = await run(official(), expected=25 * len(partitions), **common)
        print(f"azure-eventhub received {sum(map(len, before.values()))} events ({describe(before)})")
        await send("after", 15)
        after = await run(eventprocessor(), expected=15 * len(partitions), **common)
        print(f"eventprocessor received {sum(map(len, after.values()))} events ({describe(after)}), resuming from "
              "azure-eventhub's checkpoints")
    ok = all(before.get(pid) == list(range(25)) and after.get(pid) == list(range(25, 40)) for pid in partitions)
    print("nothing missed, nothing received twice" if ok else "unexpected: see the sequence numbers above")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_program(main()))  # Ctrl-C and SIGTERM stop Azurite and the emulator it started, too
