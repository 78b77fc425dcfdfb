"""The floor of ``e2e``: a bare receive loop on azure-eventhub's own AMQP client.

One OS process reads every partition of a hub from its start with azure-eventhub's
``_pyamqp`` receive client and does only what no consumer can avoid: it receives the
messages (the client reads and decodes each frame into a ``Message``), reads each one's
sequence number, and counts them. No ``EventData``, no ``Event``, no processor, no
handler, no checkpoint. Whatever a consumer does beyond this is its overhead; ``e2e``
reports ours and the official consumer as fractions of this loop's events/s.

How it drives the client, and why it is the fastest way we found:

- each partition's receiver is opened the way the client opens one
  (``EventHubConsumerClient._create_consumer`` and ``EventHubConsumer._open``: the
  connection, the CBS token, the link with ``prefetch`` credit), outside the clock;
- then its AMQP handler is driven directly: ``do_work_async(batch=credit)`` reads as
  many frames as the link has credit for (the hub is full, so none of them waits), and
  the client grants ``prefetch`` again when the credit reaches 0;
- messages are appended by a plain callback (the consumer's own takes an
  ``asyncio.Lock`` per message), and the link's delivery-tag set is emptied after each
  read (the client would keep a tag per message forever).

It prints the same JSON lines as ``benchmarks/e2e_worker.py`` (``started``, ``batch``,
``stats``, ``first``, ``done``), so ``e2e`` times it the same way. The connection
string comes from ``EVENTPROCESSOR_E2E_HUB``.

Example::

    EVENTPROCESSOR_E2E_HUB='Endpoint=sb://127.0.0.1:5672;...;UseDevelopmentEmulator=true' \\
        python -m benchmarks.e2e_floor --hub bench-0 --expect 400000 --prefetch 300
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

HUB_ENV = "EVENTPROCESSOR_E2E_HUB"
_SEQ = b"x-opt-sequence-number"


def _emit(record: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(record, separators=(",", ":")) + "\n")
    sys.stdout.flush()


class _Count:
    def __init__(self, expect: int) -> None:
        self.expect = expect
        self.events = 0
        self.finished = asyncio.Event()

    def delivered(self, partition_id: str, sequence_numbers: list[int]) -> None:
        if self.events == 0:
            _emit({"event": "first", "cpu": time.process_time(), "t": time.time()})
        self.events += len(sequence_numbers)
        _emit({"event": "batch", "p": partition_id, "s": [sequence_numbers[0], sequence_numbers[-1]],
               "c": int(sequence_numbers[-1] - sequence_numbers[0] + 1 == len(sequence_numbers)), "t": time.time()})
        if self.expect and self.events >= self.expect and self.events - len(sequence_numbers) < self.expect:
            _emit({"event": "done", "events": self.events, "cpu": time.process_time(), "t": time.time()})
            self.finished.set()


async def _partition(client: Any, consumer_group: str, partition_id: str, prefetch: int, count: _Count,
                     stop: asyncio.Event) -> None:
    async def unused(*_args: Any) -> None:
        return None

    consumer = client._create_consumer(consumer_group, partition_id, "-1", unused, prefetch=prefetch)
    await consumer._open()
    handler = consumer._handler
    received: list[Any] = []

    async def append(message: Any) -> None:
        received.append(message)

    handler._message_received_callback = append
    link = handler._link
    tags = link._received_delivery_tags
    try:
        while not stop.is_set():
            credit = link.current_link_credit
            if await handler.do_work_async(batch=credit if credit > 0 else prefetch) is False:
                raise RuntimeError(f"partition {partition_id}: the client closed the receiver")
            tags.clear()
            if received:
                messages = received[:]
                received.clear()
                count.delivered(partition_id, [m.message_annotations[_SEQ] for m in messages])
    finally:
        await consumer.close()


async def _amain(args: argparse.Namespace) -> int:
    from azure.eventhub.aio import EventHubConsumerClient

    conn = os.environ.get(HUB_ENV)
    if not conn:
        print(f"e2e_floor: {HUB_ENV} is not set", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    count = _Count(args.expect)
    client = EventHubConsumerClient.from_connection_string(conn, consumer_group=args.consumer_group,
                                                           eventhub_name=args.hub)
    _emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "floor", "eventhub": args.hub})

    async def stats() -> None:
        while True:
            _emit({"event": "stats", "events": count.events, "cpu": time.process_time(), "t": time.time(),
                   "rss": None})
            await asyncio.sleep(args.stats_interval)

    reporter = asyncio.create_task(stats())
    async with client:
        ids = await client.get_partition_ids()
        tasks = [asyncio.create_task(_partition(client, args.consumer_group, pid, args.prefetch, count, stop))
                 for pid in ids]
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        stop.set()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        waiter.cancel()
    reporter.cancel()
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    _emit({"event": "stopped", "owner": args.owner_id})
    for failure in failures:
        print(f"e2e_floor: {failure!r}", file=sys.stderr)
    return 1 if failures else 0


async def spawn_floor(owner_id: str, *, hub: str, hub_connection_string: str, log_dir: str,
                      extra: list[str] | None = None) -> Any:
    """Start ``python -m benchmarks.e2e_floor`` (the connection string in its environment)
    and return a ``WorkerHandle`` reading its JSON lines, as ``e2e_worker``'s are read."""
    from harness.worker_process import WorkerHandle

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env[HUB_ENV] = hub_connection_string
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.e2e_floor", "--hub", hub, "--owner-id", owner_id, *(extra or []),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=stderr, cwd=root, env=env)
    handle = WorkerHandle(owner_id, process, stderr_path)
    handle.reader = asyncio.create_task(handle.read())
    return handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hub", required=True)
    parser.add_argument("--owner-id", default="floor")
    parser.add_argument("--consumer-group", default="$default")
    parser.add_argument("--prefetch", type=int, default=300, help="link credit per partition")
    parser.add_argument("--expect", type=int, default=0, help="say 'done' (with the CPU time) at this many events")
    parser.add_argument("--stats-interval", type=float, default=0.25, help="seconds between stats lines")
    return asyncio.run(_amain(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
