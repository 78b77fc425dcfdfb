"""A consumer of a real event hub over AMQP, with no cloud account: the local emulator.

Run it from the repository root (needs the ``[eventhub]`` extra):

    python samples/eventhub_consumer.py                       # starts an emulator in this process
    python samples/eventhub_consumer.py --connection-string "$EVENTHUB_CONNECTION_STRING" --eventhub telemetry

With no connection string it starts ``eventprocessor.emulators.eventhubs`` on a free loopback port,
sends 200 events with azure-eventhub's own producer, and consumes them with an
``EventProcessor`` over ``EventHubSource``. Given a connection string (a real
namespace, Microsoft's Docker emulator, or ``eventprocessor emulator`` running
elsewhere) the same code runs unchanged against that hub.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
from collections import Counter
from contextlib import AsyncExitStack

from eventprocessor.cli.running import run_program
from eventprocessor.cli.user_errors import require_or_exit

# What the sample needs, checked before anything starts: a missing piece is one line naming the fix.
require_or_exit("samples/eventhub_consumer.py", extras=["eventhub"])

from azure.eventhub import EventData  # noqa: E402
from azure.eventhub.aio import EventHubProducerClient  # noqa: E402

from eventprocessor import EventProcessor, PartitionContext, PartitionProcessor  # noqa: E402
from eventprocessor.sources.eventhub import EventHubSource  # noqa: E402
from eventprocessor.stores import InMemoryCheckpointStore  # noqa: E402

received: Counter = Counter()


class Printer(PartitionProcessor):
    async def initialize(self, context: PartitionContext) -> None:
        print(f"reading partition {context.partition_id} of {context.eventhub_name}")

    async def process_events(self, events, context: PartitionContext) -> None:
        received[context.partition_id] += len(events)
        last = events[-1]
        print(f"partition {context.partition_id}: {len(events)} events up to #{last.sequence_number} "
              f"({last.body_as_str()!r}, key {last.partition_key})")
        await context.update_checkpoint()


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--connection-string", help="an Event Hubs connection string (default: a local emulator)")
    parser.add_argument("--eventhub", default="telemetry")
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long to consume")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    async with AsyncExitStack() as stack:
        conn = args.connection_string
        if conn is None:
            from eventprocessor.emulators.eventhubs import EventHubsEmulator

            emulator = await stack.enter_async_context(EventHubsEmulator(eventhubs=[args.eventhub], partitions=4))
            conn = emulator.connection_string
            print(f"started an Event Hubs emulator: {conn}")

        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=args.eventhub)
        async with producer:
            for start in range(0, args.events, 50):
                await producer.send_batch([EventData(f"reading {i}") for i in range(start, start + 50)],
                                          partition_key=f"device-{start // 50}")

        source = EventHubSource.from_connection_string(conn, eventhub_name=args.eventhub)
        stack.push_async_callback(source.close)
        processor = EventProcessor(source, InMemoryCheckpointStore(), Printer, load_balancing_strategy="greedy",
                                   load_balancing_interval=1.0, partition_ownership_expiration_interval=10.0)
        async with processor:
            await asyncio.sleep(args.seconds)
    total = sum(received.values())
    print(f"received {total} events: {dict(sorted(received.items()))}")
    return 0 if total >= args.events else 1


if __name__ == "__main__":
    raise SystemExit(run_program(main()))  # Ctrl-C and SIGTERM stop the emulator it started, too
