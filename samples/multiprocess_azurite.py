"""Several OS processes share one event hub through Blob storage (Azurite).

Run it from the repository root (needs the ``[eventhub,blob]`` extras and ``npm ci``):

    python samples/multiprocess_azurite.py              # starts Azurite and a local Event Hubs emulator
    STORAGE_CONNECTION_STRING=... EVENTHUB_CONNECTION_STRING=... python samples/multiprocess_azurite.py --eventhub hub

Three worker processes (this file with ``--worker``) each run an ``EventProcessor`` over
``EventHubSource`` with ``BlobCheckpointStore``; they coordinate only through the
ownership blobs. The parent sends events with the official producer, waits until the
checkpoints in the store reach the last event of every partition, stops one worker
(SIGTERM: it finishes its batches, checkpoints and hands its partitions back), sends
more, and stops the rest. Connection strings go to the workers in the environment,
never on a command line.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import re
import signal
import sys
import time
import uuid
from contextlib import AsyncExitStack

from eventprocessor import EventProcessor, PartitionContext, PartitionProcessor
from eventprocessor.cli.running import run_program
from eventprocessor.cli.user_errors import require_or_exit

WORKERS = 3
OPTIONS = dict(load_balancing_interval=2.0, partition_ownership_expiration_interval=10.0)


# ----------------------------------------------------------------------------- a worker

class Handler(PartitionProcessor):
    processed = 0

    async def process_events(self, events, context: PartitionContext) -> None:
        Handler.processed += len(events)
        await context.update_checkpoint()


async def worker(name: str, eventhub: str, container: str) -> int:
    from eventprocessor.sources.eventhub import EventHubSource
    from eventprocessor.stores import BlobCheckpointStore

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    source = EventHubSource.from_connection_string(os.environ["EVENTHUB_CONNECTION_STRING"], eventhub_name=eventhub,
                                                   partition_ids_ttl=5.0)
    store = BlobCheckpointStore.from_connection_string(os.environ["STORAGE_CONNECTION_STRING"], container)
    processor = EventProcessor(source, store, Handler, owner_id=name, **OPTIONS)
    try:
        await processor.start()
        shown: list[str] | None = None
        while not stop.is_set():
            owned = sorted(processor.owned_partitions, key=int)
            if owned != shown:
                print(f"{name} owns [{' '.join(owned)}]", flush=True)
                shown = owned
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
    finally:
        await processor.stop()
        await source.close()
        await store.close()
    print(f"{name} stopped: {Handler.processed} events processed", flush=True)
    return 0


# ----------------------------------------------------------------------------- the parent

class Worker:
    def __init__(self, name: str, process: asyncio.subprocess.Process) -> None:
        self.name = name
        self.process = process
        self.owned: set[str] = set()
        self.processed: int | None = None
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode().rstrip()
            print(line, flush=True)
            owns = re.fullmatch(rf"{self.name} owns \[(.*)\]", line)
            if owns:
                self.owned = set(owns.group(1).split())
            stopped = re.fullmatch(rf"{self.name} stopped: (\d+) events processed", line)
            if stopped:
                self.processed = int(stopped.group(1))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(self.process.wait(), 60)
        await self.reader


async def until(condition, what: str, timeout: float = 60.0) -> None:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{what} did not happen within {timeout:g} s")
        await asyncio.sleep(0.1)


async def parent(args: argparse.Namespace) -> int:
    from azure.eventhub import EventData, parse_connection_string
    from azure.eventhub.aio import EventHubProducerClient

    from eventprocessor.stores import BlobCheckpointStore

    workers: list[Worker] = []
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

            emulator = await stack.enter_async_context(EventHubsEmulator(eventhubs=[args.eventhub], partitions=8))
            conn = emulator.connection_string
            print(f"started an Event Hubs emulator on 127.0.0.1:{emulator.port}")
        container = f"sample-{uuid.uuid4().hex[:10]}"
        store = BlobCheckpointStore.from_connection_string(storage, container)
        stack.push_async_callback(store.close)
        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=args.eventhub)
        stack.push_async_callback(producer.close)
        namespace = parse_connection_string(conn).fully_qualified_namespace
        partitions = await producer.get_partition_ids()
        sent = 0

        async def send(count: int) -> None:
            nonlocal sent
            for i in range(count):
                pid = partitions[(sent + i) % len(partitions)]
                await producer.send_batch([EventData(f"reading {sent + i}")], partition_id=pid)
            sent += count

        async def checkpointed() -> bool:
            last = {pid: (await producer.get_partition_properties(pid))["last_enqueued_sequence_number"]
                    for pid in partitions}
            found = {c.partition_id: c.sequence_number
                     for c in await store.list_checkpoints(namespace, args.eventhub, "$default")}
            return all(found.get(pid) == seq for pid, seq in last.items() if seq >= 0)

        async def wait_checkpointed(what: str) -> None:
            started = time.monotonic()
            while not await checkpointed():
                if time.monotonic() - started > 60:
                    raise TimeoutError(f"{what}: the checkpoints did not reach the last events within 60 s")
                await asyncio.sleep(0.5)
            print(f"{what}: every partition checkpointed at its last event ({sent} events sent)", flush=True)

        environment = {**os.environ, "STORAGE_CONNECTION_STRING": storage, "EVENTHUB_CONNECTION_STRING": conn}
        try:
            for index in range(1, WORKERS + 1):
                process = await asyncio.create_subprocess_exec(
                    sys.executable, __file__, "--worker", f"worker-{index}", "--eventhub", args.eventhub,
                    "--container", container, stdout=asyncio.subprocess.PIPE, env=environment)
                workers.append(Worker(f"worker-{index}", process))
            await until(lambda: set().union(*(w.owned for w in workers)) == set(partitions)
                        and all(w.owned for w in workers), "every partition owned, every worker busy")
            print(f"balanced: {', '.join(f'{w.name}={len(w.owned)}' for w in workers)}", flush=True)
            await send(args.events // 2)
            await wait_checkpointed("first half")
            leaving, staying = workers[0], workers[1:]
            print(f"stopping {leaving.name}", flush=True)
            await leaving.stop()
            await until(lambda: set().union(*(w.owned for w in staying)) == set(partitions),
                        f"the others taking over {leaving.name}'s partitions")
            print(f"rebalanced: {', '.join(f'{w.name}={len(w.owned)}' for w in staying)}", flush=True)
            await send(args.events - args.events // 2)
            await wait_checkpointed("second half")
        finally:
            for w in workers:
                try:
                    await w.stop()
                except Exception:
                    w.process.kill()
                    await w.process.wait()
    processed = {w.name: w.processed for w in workers}
    total = sum(p or 0 for p in processed.values())
    print(f"processed per worker: {processed}; total {total} for {sent} events sent "
          f"({total - sent} delivered twice)")
    return 0 if total == sent else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--eventhub", default="telemetry")
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--container", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.worker:
        return asyncio.run(worker(args.worker, args.eventhub, args.container))
    # Everything it needs, checked before it starts anything: a missing piece is one line naming the fix.
    require_or_exit("samples/multiprocess_azurite.py", extras=["eventhub", "blob"],
                    azurite=not os.environ.get("STORAGE_CONNECTION_STRING"))
    return run_program(parent(args))  # Ctrl-C and SIGTERM stop the workers, Azurite and the emulator, too


if __name__ == "__main__":
    raise SystemExit(main())
