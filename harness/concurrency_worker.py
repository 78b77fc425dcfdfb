"""A worker process with many events in flight per partition, and its parent's side: for
the SIGKILL and planned-move tests and benchmark rows of key-ordered concurrency.

Run as ``python -m harness.concurrency_worker``: an ``EventProcessor`` with
``EventHubSource`` (the hub's connection string in ``EVENTPROCESSOR_E2E_HUB``) and
``BlobCheckpointStore`` (``EVENTPROCESSOR_E2E_STORAGE``), ``max_concurrency`` and
``ordering`` as given. Its handler prints a ``call`` line with the call's sequence
numbers before it works on them, awaits ``--latency`` seconds, prints a ``worked`` line,
checkpoints the call (``context.update_checkpoint()``: that marks its events done) and
prints an ``acked`` line once that returned. An acked event is recorded done in the
store, so a new owner must never deliver it again; an event without a ``worked`` line
was never done, so a new owner must deliver it again.
SIGTERM stops it gracefully (the calls in flight finish and are checkpointed).

Lines: ``{"event": "call"|"worked"|"acked", "p": partition, "s": [sequence numbers], "t": time}``,
``{"event": "owned", "owned": [...]}`` and ``{"event": "started"}``.

Example (the parent's side)::

    worker = await spawn("a", hub=hub, container="c", hub_connection_string=hub_conn,
                         storage_connection_string=azurite_conn, log_dir=str(tmp_path),
                         options=["--max-concurrency", "16"])
    ...
    worker.kill()       # SIGKILL
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from typing import Any

from .worker import HUB_ENV, STORAGE_ENV
from .worker.report import emit

__all__ = ["spawn", "ConcurrentWorker", "main"]


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hub", required=True)
    parser.add_argument("--container", required=True)
    parser.add_argument("--owner-id", required=True)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--ordering", choices=["key", "none", "partition"], default="key")
    parser.add_argument("--batch", type=int, default=10, help="max batch size: the most events of one call")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds each call awaits")
    parser.add_argument("--interval", type=float, default=0.5, help="load-balancing interval, seconds")
    parser.add_argument("--expiry", type=float, default=3.0, help="ownership expiration interval, seconds")
    return parser.parse_args(argv)


async def _amain(args: argparse.Namespace) -> int:
    from eventprocessor import EventProcessor, PartitionProcessor
    from eventprocessor.sources.eventhub import EventHubSource
    from eventprocessor.stores.blob import BlobCheckpointStore

    class Handler(PartitionProcessor):
        async def process_events(self, events, context):
            seqs = [event.sequence_number for event in events]
            emit({"event": "call", "p": context.partition_id, "s": seqs, "t": time.time()})
            await asyncio.sleep(args.latency)
            emit({"event": "worked", "p": context.partition_id, "s": seqs, "t": time.time()})
            await context.update_checkpoint()
            emit({"event": "acked", "p": context.partition_id, "s": seqs, "t": time.time()})

    source = EventHubSource.from_connection_string(os.environ[HUB_ENV], eventhub_name=args.hub)
    store = BlobCheckpointStore.from_connection_string(os.environ[STORAGE_ENV], args.container)
    ordering = {"max_concurrency": args.max_concurrency, "ordering": args.ordering}
    processor = EventProcessor(source, store, Handler, owner_id=args.owner_id, max_batch_size=args.batch,
                               load_balancing_interval=args.interval,
                               partition_ownership_expiration_interval=args.expiry, **ordering)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid()})
    async with processor:
        owned: list[str] = []
        while not stop.is_set():
            now = sorted(processor.owned_partitions)
            if now != owned:
                owned = now
                emit({"event": "owned", "owned": owned, "t": time.time()})
            try:
                await asyncio.wait_for(stop.wait(), 0.2)
            except asyncio.TimeoutError:
                pass
    emit({"event": "stopped", "owner": args.owner_id})
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(_amain(_parse(argv)))


class ConcurrentWorker:
    """A worker seen from its parent: every event each of its calls got (``delivered``,
    counted), finished working on (``worked``) and acked (checkpointed), by (partition,
    sequence number)."""

    def __init__(self, owner_id: str, process: asyncio.subprocess.Process, stderr_path: str) -> None:
        self.owner_id = owner_id
        self.process = process
        self.stderr_path = stderr_path
        self.delivered: Counter[tuple[str, int]] = Counter()
        self.worked: set[tuple[str, int]] = set()
        self.acked: set[tuple[str, int]] = set()
        self.owned: list[str] = []
        self.started = False
        self.reader: asyncio.Task[None] | None = None

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            try:
                record: dict[str, Any] = json.loads(raw)
            except ValueError:
                continue
            kind = record.get("event")
            if kind == "call":
                self.delivered.update((record["p"], seq) for seq in record["s"])
            elif kind == "worked":
                self.worked.update((record["p"], seq) for seq in record["s"])
            elif kind == "acked":
                self.acked.update((record["p"], seq) for seq in record["s"])
            elif kind == "owned":
                self.owned = record["owned"]
            elif kind == "started":
                self.started = True

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (graceful), then SIGKILL after ``timeout``; waits for its last lines."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), timeout)
            except asyncio.TimeoutError:
                self.kill()
        await self.process.wait()
        if self.reader is not None:
            await asyncio.wait_for(self.reader, 10)

    def diagnostics(self) -> str:
        with open(self.stderr_path, errors="replace") as handle:
            return f"--- {self.owner_id} (returncode {self.process.returncode})\n{handle.read()[-3000:]}"


async def spawn(owner_id: str, *, hub: str, container: str, hub_connection_string: str,
                storage_connection_string: str, log_dir: str, options: list[str] | None = None) -> ConcurrentWorker:
    """Start a worker with the connection strings in its environment (never on its command line)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **{HUB_ENV: hub_connection_string, STORAGE_ENV: storage_connection_string})
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    with open(stderr_path, "ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "harness.concurrency_worker", "--hub", hub, "--container", container,
            "--owner-id", owner_id, *(options or []), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env)
    worker = ConcurrentWorker(owner_id, process, stderr_path)
    worker.reader = asyncio.create_task(worker.read())
    return worker


if __name__ == "__main__":
    sys.exit(main())
