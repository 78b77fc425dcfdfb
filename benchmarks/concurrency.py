"""Many events in flight per partition: an I/O-bound handler, one event at a time vs the
``asyncio.gather`` workaround vs key-ordered concurrency, against the limit.

The handler waits on I/O for every event, in two flavours: a plain ``asyncio.sleep`` of
``--latency`` seconds, and a GET to a local aiohttp server (in a process of its own)
that answers after that delay. Events carry partition keys drawn from ``--keys`` keys
with a skewed (Zipf-like, exponent ``--skew``) distribution; one event in ``--slow-every``
waits ``--slow`` seconds instead. Contestants, each on a fresh in-memory source and store:

* **sequential**: ``process_events`` handles each event in turn (the documented way),
  one batch at a time per partition;
* **gather per batch**: the usual workaround, ``asyncio.gather`` over each batch of 100
  (the whole partition waits for the slowest event of each batch, and a key's events no
  longer run in order);
* **ours at 16, 64, 256 in flight**: ``max_concurrency=N, ordering="key"``, each call
  handling its events (all of one key) in turn;
* **the limit**: partitions x N / latency, what N calls in flight per partition could do
  if every event took the latency (the slow events and the hot keys cost more);
* **the floor** beside every column: a bare loop doing only the unavoidable work, the
  same events' I/O on as many workers as the column has events in flight (partitions x
  1, x 100, x N), no processor, no order, no checkpoint: what this machine, this client
  and this server could do at that concurrency in this run.

Every column, its floor included, has an aiohttp ``ClientSession`` of its own, shared by
all its handlers, its connector sized for the column's events in flight, the way a user
would set one up; the server runs in a process of its own. Every figure is the steady
state: events/s from the 10th to the 90th percent of the events done (the start and the
last slow events left out), over enough events that every partition sees many slow ones
(the gather column at least 20 batches per partition by default; a whole run of only a
few batches, start and tail included, gives gather less, as the issue's 961 events/s did).

The crash and planned-move rows run :mod:`harness.concurrency_worker` as OS processes on
the Event Hubs emulator and Azurite (64 calls in flight per partition): after SIGKILL,
the events delivered again against those not done and the in-flight bound; after a
planned move, the events delivered twice (0). Counted from what the handlers printed.
Run::

    python -m benchmarks.concurrency --record
    python -m benchmarks.concurrency --events 4000 --no-processes     # a quick look
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import multiprocessing
import random
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from eventprocessor import EventProcessor, PartitionProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

from .toolkit import program, services

__all__ = ["main", "skewed_keys", "measure"]

logger = logging.getLogger(__name__)

GATHER_BATCH = 100
IN_FLIGHT = (16, 64, 256)

Wait = Callable[[Any], Awaitable[None]]  # one event's I/O


def skewed_keys(count: int, keys: int, skew: float, rng: random.Random) -> list[str]:
    """``count`` keys out of ``keys``, key k drawn with weight 1 / (k + 1) ** skew."""
    weights = [1 / (k + 1) ** skew for k in range(keys)]
    return [f"k{k}" for k in rng.choices(range(keys), weights=weights, k=count)]


def _serve(port_out: Any) -> None:
    """The local HTTP server (a process of its own): ``GET /?d=seconds`` answers after ``d``."""
    from aiohttp import web

    async def wait(request: web.Request) -> web.Response:
        await asyncio.sleep(float(request.query.get("d", "0")))
        return web.Response(text="ok")

    async def run() -> None:
        app = web.Application()
        app.router.add_get("/", wait)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        port_out.send(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(run())


class _Waits:
    """The I/O of one event: sleep, or a GET to the server; ``--slow`` for the slow ones.
    ``in_flight``: the most GETs at once (the connector's limit: one connection each)."""

    def __init__(self, kind: str, latency: float, slow: float, slow_every: int, port: int | None,
                 in_flight: int) -> None:
        self.kind, self.latency, self.slow, self.slow_every, self.port = kind, latency, slow, slow_every, port
        self.in_flight = in_flight
        self.session: Any = None
        self.url = f"http://127.0.0.1:{port}/"
        self._params = {latency: {"d": f"{latency:g}"}, slow: {"d": f"{slow:g}"}}

    def delay(self, event: Any) -> float:
        return self.slow if event.body == b"slow" else self.latency

    async def __call__(self, event: Any) -> None:
        delay = self.delay(event)
        if self.kind == "sleep":
            await asyncio.sleep(delay)
            return
        async with self.session.get(self.url, params=self._params[delay]) as response:
            await response.read()

    async def __aenter__(self) -> _Waits:
        if self.kind == "http":
            import aiohttp

            self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=self.in_flight))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.session is not None:
            await self.session.close()


def _handler(wait: Wait, counted: list[int], gather: bool) -> type:
    class Handler(PartitionProcessor):
        async def process_events(self, events, context):
            if gather:
                await asyncio.gather(*(wait(event) for event in events))
                counted[0] += len(events)
            else:
                for event in events:
                    await wait(event)
                    counted[0] += 1

    return Handler


def _events(events: int, args: argparse.Namespace) -> list[tuple[bytes, str]]:
    """(body, partition key) of every event, the same for every contestant."""
    return [(b"slow" if index % args.slow_every == args.slow_every - 1 else b"x" * 32, key)
            for index, key in enumerate(skewed_keys(events, args.keys, args.skew, random.Random(args.seed)))]


async def _steady(counted: list[int], events: int) -> float:
    """Events/s from the 10th to the 90th percent of ``events`` counted."""
    marks: dict[float, float] = {}
    while counted[0] < events:
        await asyncio.sleep(0.005)
        for mark in (0.1, 0.9):
            if mark not in marks and counted[0] >= mark * events:
                marks[mark] = time.monotonic()
    return 0.8 * events / (marks[0.9] - marks[0.1])


async def _floor(waits: _Waits, events: int, args: argparse.Namespace) -> float:
    """The bare loop: ``waits.in_flight`` workers doing the events' I/O, nothing else."""

    class Event:  # what the I/O reads of an event
        __slots__ = ("body",)

        def __init__(self, body: bytes) -> None:
            self.body = body

    todo = [Event(body) for body, _key in _events(events, args)]
    todo.reverse()
    counted = [0]

    async def worker() -> None:
        while todo:
            await waits(todo.pop())
            counted[0] += 1

    workers = [asyncio.create_task(worker()) for _ in range(waits.in_flight)]
    try:
        return await _steady(counted, events)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


async def _one(waits: _Waits, events: int, args: argparse.Namespace, contestant: str) -> float:
    """Events/s of one contestant over ``events`` events, in the steady state (:func:`_steady`)."""
    source = InMemoryEventSource(args.partitions)
    for body, key in _events(events, args):
        source.append(body, partition_key=key)
    counted = [0]
    options: dict[str, Any] = {"max_batch_size": GATHER_BATCH} if contestant == "gather" else {}
    if contestant.startswith("ours"):
        options = {"max_concurrency": int(contestant[4:]), "ordering": "key"}
    handler = _handler(waits, counted, contestant == "gather")
    async with EventProcessor(source, InMemoryCheckpointStore(), handler, load_balancing_interval=0.5,
                              **options):
        return await _steady(counted, events)


def _in_flight(contestant: str, partitions: int) -> int:
    """The most events a contestant has in flight (its I/O's connections)."""
    per_partition = {"sequential": 1, "gather": GATHER_BATCH}.get(contestant) or int(contestant[4:])
    return partitions * per_partition


def measure(args: argparse.Namespace, kind: str, port: int | None) -> dict[str, float]:
    """Events/s of every contestant with one kind of I/O (``sleep`` or ``http``), and of
    its floor (``floor:`` + the contestant's name)."""
    sizes = {"sequential": max(400, args.events // 40), "gather": max(2000, args.events // 5)}

    async def run() -> dict[str, float]:
        found: dict[str, float] = {}
        for contestant in ("sequential", "gather", *(f"ours{n}" for n in IN_FLIGHT)):
            events, in_flight = sizes.get(contestant, args.events), _in_flight(contestant, args.partitions)
            for name, contest in ((f"floor:{contestant}", _floor), (contestant, None)):
                async with _Waits(kind, args.latency, args.slow, args.slow_every, port, in_flight) as waits:
                    found[name] = await (_floor(waits, events, args) if contest is _floor
                                         else _one(waits, events, args, contestant))
                print(f"concurrency: {kind} {name}: {found[name]:,.0f} events/s", file=sys.stderr)
        return found

    return asyncio.run(run())


async def _processes(args: argparse.Namespace, hub_conn: str, storage_conn: str, log_dir: str) -> dict[str, Any]:
    """The SIGKILL and planned-move rows (see the module docstring)."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    from harness.concurrency_worker import spawn
    from harness.worker import create_container

    hub, container, events, n, batch = "concurrency", "concurrency", args.process_events, 64, 10
    await create_container(storage_conn, container)
    async with EventHubProducerClient.from_connection_string(hub_conn, eventhub_name=hub) as producer:
        by_key: dict[str, int] = {}
        for key in skewed_keys(events, args.keys, args.skew, random.Random(args.seed)):
            by_key[key] = by_key.get(key, 0) + 1
        for key, count in by_key.items():
            event_batch = await producer.create_batch(partition_key=key)
            for index in range(count):
                event_batch.add(EventData(f"{key}/{index}"))
            await producer.send_batch(event_batch)
    common: dict[str, Any] = dict(hub=hub, container=container, hub_connection_string=hub_conn,
                                  storage_connection_string=storage_conn, log_dir=log_dir,
                                  options=["--max-concurrency", str(n), "--batch", str(batch), "--latency",
                                           f"{max(args.latency, 0.1):g}"])

    async def until(condition: Callable[[], bool], timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while not condition() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    first = await spawn("first", **common)
    await until(lambda: len(first.acked) >= events // 4)
    first.kill()
    await first.process.wait()
    await asyncio.wait_for(first.reader, 10)  # type: ignore[arg-type]
    second = await spawn("second", **common)
    await until(lambda: len(set(first.delivered) | set(second.delivered)) == events)
    third = await spawn("third", **common)
    await until(lambda: len(third.owned) == args.partitions // 2)
    await second.stop()
    await until(lambda: len(third.owned) == args.partitions)
    await asyncio.sleep(2)
    await third.stop()
    again = set(first.delivered) & set(second.delivered)
    return {"delivered": len(first.delivered), "not_done": len(set(first.delivered) - first.worked),
            "again": len(again), "acked_again": len(again & first.acked),
            "lost": events - len(set(first.delivered) | set(second.delivered) | set(third.delivered)),
            "bound": args.partitions * n * batch, "moved_twice": len(set(second.delivered) & set(third.delivered)),
            "events": events}


def _targets(sleep: dict[str, float], http: dict[str, float], args: argparse.Namespace) -> list[str]:
    """The issue's targets, each with the figure of this run and whether it holds."""
    limit = args.partitions * 64 / args.latency
    checks = [("sleep >= 0.8x the limit", sleep["ours64"] / limit, 0.8),
              ("aiohttp >= 0.6x the limit", http["ours64"] / limit, 0.6),
              ("sleep >= 10x gather", sleep["ours64"] / sleep["gather"], 10.0),
              ("aiohttp >= 10x gather", http["ours64"] / http["gather"], 10.0)]
    floors = [f"floor at 64 in flight ({kind}): {found['floor:ours64'] / limit:.2f}x the limit, ours "
              f"{found['ours64'] / found['floor:ours64']:.2f} of it"
              for kind, found in (("sleep", sleep), ("aiohttp", http))]
    return [f"{name}: {value:.2f} ({'met' if value >= bound else 'not met'})" for name, value, bound in checks] + floors


def _top_share(args: argparse.Namespace) -> float:
    return 1 / sum(1 / (k + 1) ** args.skew for k in range(args.keys))


def _table(kind: str, found: dict[str, float], args: argparse.Namespace) -> list[str]:
    limit = {n: args.partitions * n / args.latency for n in IN_FLIGHT}
    ours = [f"ours{n}" for n in IN_FLIGHT]
    return [f"| {kind} | {found['sequential']:,.0f} | {found['gather']:,.0f} | "
            + " | ".join(f"{found[f'ours{n}']:,.0f} ({found[f'ours{n}'] / limit[n]:.2f}x)" for n in IN_FLIGHT)
            + " | " + " / ".join(f"{limit[n]:,.0f}" for n in IN_FLIGHT) + " |",
            f"| floor: {kind}, bare loop, same events in flight | "
            + " | ".join(f"{found['floor:' + name]:,.0f}" for name in ("sequential", "gather"))
            + " | " + " | ".join(f"{found['floor:' + name]:,.0f} ({found[name] / found['floor:' + name]:.2f} of it)"
                                 for name in ours) + " | - |"]


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING)
    receive, send = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(send,), daemon=True)
    server.start()
    try:
        port = receive.recv()
        results = {kind: measure(args, kind, port) for kind in ("sleep", "http")}
    finally:
        server.terminate()
        server.join()
    rows = None
    if not args.no_processes:
        with services.logs("concurrency", args.log_dir) as log_dir, \
                services.azurite_and_emulator(hubs={"concurrency": args.partitions}) as (emulator, azurite):
            rows = asyncio.run(_processes(args, emulator.connection_string, azurite.connection_string, log_dir))
    sleep, http = results["sleep"], results["http"]
    lines = [
        "## Many events in flight per partition (`concurrency`)",
        "",
        run.header(),
        "",
        f"{args.partitions} partitions; {args.events:,} events for ours ({max(2000, args.events // 5):,} for gather, "
        f"{max(400, args.events // 40):,} sequential) over {args.keys:,} keys, Zipf-like exponent {args.skew} (the "
        f"hottest key {_top_share(args):.2%} of the events: its events run in turn); each "
        f"event waits {args.latency * 1000:g} ms on I/O, one in {args.slow_every} waits {args.slow:g} s. Events/s "
        f"from 10 % to 90 % of the events done (the steady state); ours with `ordering=\"key\"`, (x of the "
        f"limit).",
        "",
        "| handler I/O | sequential | gather per batch of 100 | ours, 16 in flight (x limit) | ours, 64 | ours, 256 | "
        "limit: partitions x N / latency |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *_table("`asyncio.sleep`", sleep, args),
        *_table("aiohttp GET, local server", http, args),
        "",
        f"Ours at 64 in flight / gather: {sleep['ours64'] / sleep['gather']:.1f}x (sleep), "
        f"{http['ours64'] / http['gather']:.1f}x (aiohttp).",
        "",
        "Targets at 64 in flight: " + "; ".join(_targets(sleep, http, args)) + ".",
    ]
    if rows is not None:
        lines += [
            "",
            f"Crash and planned move, OS processes on the emulator and Azurite ({rows['events']:,} events, 64 calls "
            "of up to 10 events in flight per partition, each call checkpointing its own events):",
            "",
            "| what | delivered again | not done when it happened | bound | acked and delivered again | lost |",
            "|---|---:|---:|---:|---:|---:|",
            f"| SIGKILL of the owner | {rows['again']} | {rows['not_done']} | {rows['bound']} | "
            f"{rows['acked_again']} | {rows['lost']} |",
            f"| planned move (a process joins, another leaves) | {rows['moved_twice']} | - | 0 | - | - |",
        ]
    run.report("\n".join(lines))
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    parser = program.parser("concurrency", __doc__, prog)
    parser.add_argument("--partitions", type=int, default=4,
                        help="Partitions of the in-memory source (an even number). [default: %(default)s]")
    parser.add_argument("--events", type=int, default=40_000,
                        help="Events for each of ours (fewer for the others); at least 1000. [default: %(default)s]")
    parser.add_argument("--keys", type=int, default=10_000,
                        help="Distinct partition keys the events are drawn from. [default: %(default)s]")
    parser.add_argument("--skew", type=float, default=0.3,
                        help="Zipf exponent of the key distribution. [default: %(default)s]")
    parser.add_argument("--latency", type=float, default=0.02, help="Seconds of I/O per event. [default: %(default)s]")
    parser.add_argument("--slow", type=float, default=1.0,
                        help="Seconds of I/O of a slow event. [default: %(default)s]")
    parser.add_argument("--slow-every", type=int, default=500,
                        help="One event in this many is slow. [default: %(default)s]")
    parser.add_argument("--seed", type=int, default=36,
                        help="Seed of the key draw (the same keys for every contestant). [default: %(default)s]")
    parser.add_argument("--process-events", type=int, default=4000,
                        help="Events of the crash and move rows. [default: %(default)s]")
    parser.add_argument("--no-processes", action="store_true", help="Leave out the crash and planned-move rows.")
    parser.add_argument("--log-dir", help="Keep the workers' logs here. [default: a temporary directory, removed]")

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.events < 1000 or args.partitions < 2 or args.partitions % 2:
            parser.error("--events must be at least 1000 and --partitions an even number of at least 2")
        return _run(args, run)

    return program.run("concurrency", parser, body, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
