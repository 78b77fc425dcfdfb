"""One EventProcessor in its own OS process, for ``tests/test_multiprocess.py``.

Runs an ``EventProcessor`` over its own ``InMemoryEventSource`` (events do not matter: the
test is about ownership) with our ``BlobCheckpointStore`` on the Azurite the test
started, and prints one JSON line to stdout whenever the set of partitions it
dispatches changes, plus a heartbeat every second. SIGTERM stops it gracefully; the
test normally ends it with SIGKILL.

The connection string comes from the environment (``EVENTPROCESSOR_MP_CONNECTION_STRING``)
so that it never shows in a process listing.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from typing import Any

CONNECTION_STRING_ENV = "EVENTPROCESSOR_MP_CONNECTION_STRING"

logger = logging.getLogger("mp_worker")


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--container", required=True)
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--interval", type=float, default=0.5, help="load-balancing interval, seconds")
    parser.add_argument("--expiry", type=float, default=3.0, help="ownership expiration interval, seconds")
    parser.add_argument("--strategy", choices=["balanced", "greedy"], default="greedy")
    return parser.parse_args(argv)


async def _amain(args: argparse.Namespace) -> int:
    from eventprocessor import EventProcessor, PartitionProcessor
    from eventprocessor.sources import InMemoryEventSource
    from eventprocessor.stores.blob import BlobCheckpointStore

    connection_string = os.environ.get(CONNECTION_STRING_ENV)
    if not connection_string:
        print(f"mp_worker: {CONNECTION_STRING_ENV} is not set", file=sys.stderr)
        return 2

    class Idle(PartitionProcessor):
        """Receives and drops events; ownership is what is being tested."""

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    store = BlobCheckpointStore.from_connection_string(connection_string, args.container)
    source = InMemoryEventSource(args.partitions)
    processor = EventProcessor(
        source,
        store,
        Idle,
        owner_id=args.owner_id,
        load_balancing_strategy=args.strategy,
        load_balancing_interval=args.interval,
        partition_ownership_expiration_interval=args.expiry,
    )
    try:
        await processor.start()
        _emit(
            {
                "owner": args.owner_id,
                "event": "started",
                "pid": os.getpid(),
                "namespace": source.fully_qualified_namespace,
                "eventhub": source.eventhub_name,
            }
        )
        last: list[str] | None = None
        last_emit = 0.0
        while not stop.is_set():
            owned = sorted(processor.owned_partitions, key=lambda pid: (len(pid), pid))
            now = time.monotonic()
            if owned != last or now - last_emit >= 1.0:
                _emit(
                    {"owner": args.owner_id, "event": "owned", "owned": owned, "ticks": processor.ticks, "t": now}
                )
                last, last_emit = owned, now
            try:
                await asyncio.wait_for(stop.wait(), timeout=0.1)
            except asyncio.TimeoutError:
                pass
    finally:
        await processor.stop()
        await store.close()
        await source.close()
    _emit({"owner": args.owner_id, "event": "stopped"})
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    return asyncio.run(_amain(_parse(argv)))


if __name__ == "__main__":
    sys.exit(main())
