"""Callbacks, as azure-eventhub's EventHubConsumerClient takes them, run by eventprocessor.

Run it from the repository root (needs the ``[eventhub]`` extra; ``[blob]`` with a
storage connection string):

    python samples/callback_consumer.py                  # starts a local Event Hubs emulator in this process
    EVENTHUB_CONNECTION_STRING=... python samples/callback_consumer.py --eventhub telemetry
    STORAGE_CONNECTION_STRING=... python samples/callback_consumer.py   # checkpoints in Blob storage

``eventprocessor.EventHubConsumerClient`` is the drop-in for the official client: the same
``from_connection_string``, ``receive_batch`` and callbacks. The sample sends
``--events`` events, receives them in batches (an empty batch every ``max_wait_time``
seconds while the hub is quiet), checkpoints each batch and closes the client once every
event has arrived. Connection strings come from the environment, never the command line.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import uuid
from collections import Counter
from contextlib import AsyncExitStack
from typing import Any

from eventprocessor.cli.running import run_program
from eventprocessor.cli.user_errors import require_or_exit

# What the sample needs, checked before anything starts: a missing piece is one line naming the fix.
require_or_exit("samples/callback_consumer.py",
                extras=["eventhub"] + (["blob"] if os.environ.get("STORAGE_CONNECTION_STRING") else []))

from azure.eventhub import EventData  # noqa: E402
from azure.eventhub.aio import EventHubProducerClient  # noqa: E402

from eventprocessor import EventHubConsumerClient  # noqa: E402

received: Counter = Counter()
empty_batches = 0
all_received = asyncio.Event()
expected = 0


async def on_partition_initialize(partition_context) -> None:
    print(f"partition {partition_context.partition_id}: receiving (epoch {partition_context.epoch})")


async def on_event_batch(partition_context, events: list[EventData]) -> None:
    global empty_batches
    if not events:
        empty_batches += 1  # max_wait_time passed without an event
        return
    received[partition_context.partition_id] += len(events)
    last = events[-1]
    print(f"partition {partition_context.partition_id}: {len(events)} events up to #{last.sequence_number} "
          f"({last.body_as_str()!r})")
    await partition_context.update_checkpoint()
    if sum(received.values()) >= expected:
        all_received.set()


async def on_partition_close(partition_context, reason) -> None:
    print(f"partition {partition_context.partition_id}: closed ({reason.name})")


async def on_error(partition_context, error: Exception) -> None:
    where = f"partition {partition_context.partition_id}" if partition_context else "load balancing"
    print(f"{where}: error {error!r}")


def checkpoint_store(stack: AsyncExitStack) -> Any:
    storage = os.environ.get("STORAGE_CONNECTION_STRING")
    if storage:
        from eventprocessor.stores import BlobCheckpointStore

        store = BlobCheckpointStore.from_connection_string(storage, f"callbacks-{uuid.uuid4().hex[:8]}")
        print("checkpoints in Blob storage")
    else:
        from eventprocessor.stores import InMemoryCheckpointStore

        store = InMemoryCheckpointStore()
        print("checkpoints in memory")
    stack.push_async_callback(store.close)
    return store


async def main(argv: list[str] | None = None) -> int:
    global expected
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eventhub", default="telemetry")
    parser.add_argument("--events", type=int, default=120)
    parser.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds")
    args = parser.parse_args(argv)
    expected = args.events
    logging.basicConfig(level=logging.WARNING)

    async with AsyncExitStack() as stack:
        conn = os.environ.get("EVENTHUB_CONNECTION_STRING")
        if not conn:
            from eventprocessor.emulators.eventhubs import EventHubsEmulator

            emulator = await stack.enter_async_context(EventHubsEmulator(eventhubs=[args.eventhub], partitions=4))
            conn = emulator.connection_string
            print(f"started an Event Hubs emulator on 127.0.0.1:{emulator.port}")

        async with EventHubProducerClient.from_connection_string(conn, eventhub_name=args.eventhub) as producer:
            for pid in await producer.get_partition_ids():
                share = args.events // 4 + (1 if int(pid) < args.events % 4 else 0)
                await producer.send_batch([EventData(f"reading {pid}-{i}") for i in range(share)], partition_id=pid)

        client = EventHubConsumerClient.from_connection_string(
            conn, consumer_group="$default", eventhub_name=args.eventhub, checkpoint_store=checkpoint_store(stack),
            load_balancing_interval=1.0, partition_ownership_expiration_interval=10.0)
        receiving = asyncio.create_task(client.receive_batch(
            on_event_batch, max_batch_size=20, max_wait_time=1.0, starting_position="-1",
            on_partition_initialize=on_partition_initialize, on_partition_close=on_partition_close,
            on_error=on_error))
        try:
            await asyncio.wait_for(all_received.wait(), args.timeout)
        except asyncio.TimeoutError:
            print(f"timed out after {args.timeout:g} s")
        await client.close()  # receive_batch returns once the client is closed
        await receiving
    total = sum(received.values())
    print(f"received {total} of {args.events} events: {dict(sorted(received.items()))}; "
          f"{empty_batches} empty batches while the hub was quiet")
    return 0 if total == args.events else 1


if __name__ == "__main__":
    raise SystemExit(run_program(main()))  # Ctrl-C and SIGTERM stop the emulator it started, too
