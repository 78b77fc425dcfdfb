"""End to end over AMQP: this SDK's processor, azure-eventhub's own, and a bare receive loop, on one emulator.

Run it with ``python -m benchmarks.e2e`` (or ``eventprocessor bench e2e``). It starts its
own Event Hubs emulator (``eventprocessor.emulators.eventhubs``) and its own Azurite, both on
loopback, and uses them for every side:

* **floor**: a bare receive loop on azure-eventhub's own AMQP client
  (``python -m harness.worker --impl floor``): it receives and decodes the messages, reads their
  sequence numbers and counts them; nothing else. No consumer can do less;
* **ours**: ``EventProcessor`` + ``EventHubSource`` + this SDK's ``BlobCheckpointStore``;
* **official**: ``azure.eventhub.aio.EventHubConsumerClient.receive_batch`` + the
  ``azure-eventhub-checkpointstoreblob-aio`` ``BlobCheckpointStore``.

Each runs as a separate OS process. Both consumers take batches of ``--batch`` events,
balance GREEDY with the same intervals, and checkpoint a partition once
``--checkpoint-events`` of its events were delivered since its last checkpoint (the same
cadence in events on both sides, whatever the size of the batches each one gets).
Measured, in one run:

1. **Fill**: the official producer fills a hub with ``--events`` events; its rate, its
   CPU per event and the emulator's CPU per event in.
2. **Prefetch sweep**: each side reads ``--sweep-events`` events from the start with
   every prefetch of ``--sweep``; each side then runs at the prefetch that gave it the
   most events/s.
3. **Throughput**: ``--rounds`` rounds; in each, every side reads the whole hub from the
   start (the order rotates). Events/s and CPU per event are those of the steady window
   (from the moment every partition delivered a batch to the last expected event), with
   the emulator's CPU per event in the same window and the CPU other processes of the
   machine took meanwhile. Ours and the official are reported as fractions of the floor
   of the same round; a round in which other work took more than ``--busy-cores`` of the
   machine is flagged and left out of the headline.
4. **Failover**: two processes under a steady stream; one is SIGKILLed; seconds until
   each of its partitions is delivered again by the survivor (max over partitions).
5. **Scale-out**: two processes under a steady stream, then two more; duplicates
   delivered from the scale-out on (deliveries of events delivered before), and events
   lost (must be 0). The official runs twice: checkpointing in ``on_partition_close``
   as a careful user would, and as its samples do (no checkpoint on close).

``--save-json PATH`` also writes the run's figures; ``--from-json PATH`` runs nothing and
prints the tables of such a file again, judged with the options of that command (another
``--busy-cores``, say): how the tests check the rule that leaves busy rounds out.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.worker import WorkerHandle, create_container, spawn_worker

from .toolkit import program, services
from .toolkit.machine import CpuMeter, process_cpu_seconds
from .toolkit.report import header, median, number, table, value_range

__all__ = ["main", "Phase", "summarize", "save_run", "load_run"]

logger = logging.getLogger(__name__)

SIDES = ("floor", "ours", "official")
CONSUMERS = ("ours", "official")
SCALE_OUT_SIDES = ("ours", "official", "official-as-documented")
SCALE_OUT_LABELS = {"ours": "ours", "official": "official, checkpoint in `on_partition_close`",
                    "official-as-documented": "official as its samples write it (no checkpoint on close)"}
TARGET = 0.85  # ours / floor, events/s


@dataclass
class Fill:
    rate: float = 0.0
    producer_us: float = 0.0
    emulator_us: float | None = None


@dataclass
class Phase:
    """One side reading the pre-filled hub once: the figures of its steady window."""

    side: str
    prefetch: int
    events: int
    rate: float  # events/s
    cpu_us: float  # the consumer process's CPU µs per event
    emulator_us: float | None  # the emulator's CPU µs per event
    others_cores: float | None  # cores other processes of the machine used meanwhile
    load: float  # 1-minute load average at the end
    startup: float  # seconds from the process start to every partition flowing

    def busy(self, threshold: float) -> bool:
        return self.others_cores is not None and self.others_cores > threshold


@dataclass
class Results:
    fill: Fill = field(default_factory=Fill)
    sweep: list[Phase] = field(default_factory=list)
    prefetch: dict[str, int] = field(default_factory=dict)  # the sweep's choice per side
    rounds: list[dict[str, Phase]] = field(default_factory=list)
    failover: dict[str, list[float]] = field(default_factory=lambda: {i: [] for i in CONSUMERS})
    failover_lost: dict[str, int] = field(default_factory=lambda: {i: 0 for i in CONSUMERS})
    # per side, per round: duplicates after the scale-out, lost, partitions moved, seconds to settle
    scale_out: dict[str, list[tuple[int, int, int, float]]] = field(
        default_factory=lambda: {i: [] for i in SCALE_OUT_SIDES})


class _Streaming:
    """Worker processes of one side sharing a hub while the benchmark streams events to it."""

    def __init__(self, bench: Bench, hub: str, container: str, impl: str, extra: list[str], names: str) -> None:
        self.bench, self.hub, self.container, self.impl, self.extra, self.names = \
            bench, hub, container, impl, extra, names
        self.workers: list[WorkerHandle] = []
        self.stop = asyncio.Event()
        self.producer: asyncio.Task[None] | None = None

    async def spawn(self, index: int) -> WorkerHandle:
        return await self.bench.spawn(self.impl, f"{self.names}-{index}", self.hub, self.container, self.extra)

    def delivered(self) -> set[tuple[str, int]]:
        return set().union(*(set(w.deliveries) for w in self.workers))

    async def drained(self, what: str) -> int:
        """Stop the stream, wait until every event the hub holds was delivered; the events lost."""
        self.stop.set()
        if self.producer is not None:
            await self.producer
        counts = await self.bench._counts(self.hub)
        expected = {(p, s) for p, n in counts.items() for s in range(n)}
        await self.bench._until(lambda: expected <= self.delivered(), what, self.workers)
        return len(expected - self.delivered())


class Bench:
    def __init__(self, args: argparse.Namespace, hub_conn: str, emulator_pid: int, azurite_pid: int | None,
                 storage_conn: str, log_dir: str) -> None:
        self.args = args
        self.hub_conn = hub_conn
        self.emulator_pid = emulator_pid
        self.storage_conn = storage_conn
        self.log_dir = log_dir
        self.hubs = iter(f"bench-{i}" for i in range(100))
        self.results = Results()
        own = {"emulator": emulator_pid, "benchmark": os.getpid()}
        if azurite_pid is not None:
            own["azurite"] = azurite_pid
        self.meter = CpuMeter(own)

    def options(self, interval: float, expiry: float, *, prefetch: int, checkpoint_events: int) -> list[str]:
        return ["--batch", str(self.args.batch), "--prefetch", str(prefetch), "--checkpoint-events",
                str(checkpoint_events), "--interval", str(interval), "--expiry", str(expiry), "--strategy", "greedy"]

    async def spawn(self, impl: str, owner: str, hub: str, container: str, extra: list[str]) -> WorkerHandle:
        await create_container(self.storage_conn, container)
        return await spawn_worker(owner, hub=hub, container=container, hub_connection_string=self.hub_conn,
                                  storage_connection_string=self.storage_conn, log_dir=self.log_dir,
                                  extra=["--impl", impl, *extra])

    # ------------------------------------------------------------------ 1. fill
    async def fill(self, hub: str, total: int) -> None:
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        partitions = self.args.partitions
        body = b"x" * self.args.body
        producer = EventHubProducerClient.from_connection_string(self.hub_conn, eventhub_name=hub)
        async with producer:
            await producer.get_partition_ids()
            emulator_before = process_cpu_seconds(self.emulator_pid)
            started, cpu_before = time.perf_counter(), time.process_time()
            for pid in range(partitions):
                sent, share = 0, total // partitions
                while sent < share:
                    batch = await producer.create_batch(partition_id=str(pid))
                    while sent < share:
                        try:
                            batch.add(EventData(body))
                        except ValueError:
                            break
                        sent += 1
                    await producer.send_batch(batch)
            seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_before
            emulator_after = process_cpu_seconds(self.emulator_pid)
        fill = self.results.fill
        fill.rate = total / seconds
        fill.producer_us = 1e6 * cpu / total
        if emulator_before is not None and emulator_after is not None:
            fill.emulator_us = 1e6 * (emulator_after - emulator_before) / total

    # ------------------------------------------------------------------ 2, 3. one side reading the hub
    async def read_hub(self, side: str, hub: str, total: int, prefetch: int, tag: str) -> Phase:
        """``side`` reads ``total`` events of ``hub`` from its start, in a process of its own."""
        owner = f"{side}-{tag}"
        spawned = time.time()
        if side == "floor":
            worker = await spawn_worker(owner, hub=hub, container=None, hub_connection_string=self.hub_conn,
                                        storage_connection_string=None, log_dir=self.log_dir,
                                        extra=["--impl", "floor", "--prefetch", str(prefetch), "--expect", str(total)])
        else:
            worker = await self.spawn(side, owner, hub, f"tp-{side}-{uuid.uuid4().hex[:8]}",
                                      [*self.options(10.0, 60.0, prefetch=prefetch,
                                                     checkpoint_events=self.args.checkpoint_events),
                                       "--report", "events", "--expect", str(total)])
        self.meter.track("consumer", worker.process.pid)
        try:
            deadline = time.monotonic() + self.args.timeout
            while worker.done is None:
                if time.monotonic() > deadline or not worker.alive:
                    raise RuntimeError(f"{side} did not consume {total} events:\n{worker.diagnostics()}")
                await asyncio.sleep(0.1)
            await asyncio.sleep(2 * 0.25)  # a meter sample after the end of the window
        finally:
            await worker.stop()
            self.meter.forget("consumer")
        assert worker.done is not None
        # The steady window starts when every partition is flowing (its first batch
        # delivered): each side claims and opens receivers at its own pace, and that
        # start-up is reported on its own.
        first_batch: dict[str, float] = {}
        for t, partition, _first, _last in worker.batches:
            first_batch.setdefault(partition, t)
        flowing = max(first_batch.values())
        start = next((s for s in worker.stats if s[0] >= flowing), None)
        if start is None or worker.done["t"] - start[0] <= 0:
            raise RuntimeError(f"{side}: the run ended before a steady window (raise --events)")
        seconds = worker.done["t"] - start[0]
        events = worker.done["events"] - start[1]
        cpu = worker.done["cpu"] - start[2]
        window = self.meter.window(start[0], worker.done["t"])
        emulator = window.cpu("emulator")
        return Phase(side, prefetch, events, events / seconds, 1e6 * cpu / events,
                     None if emulator is None else 1e6 * emulator / events, window.others_cores, window.load,
                     flowing - spawned)

    # ------------------------------------------------------------------ steady streams
    async def _stream(self, hub: str, stop: asyncio.Event, rate: float, counter: list[int]) -> None:
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        partitions = self.args.partitions
        producer = EventHubProducerClient.from_connection_string(self.hub_conn, eventhub_name=hub)
        async with producer:
            started = time.monotonic()
            while not stop.is_set():
                partition = str((counter[0] // 10) % partitions)
                await producer.send_batch([EventData(b"s") for _ in range(10)], partition_id=partition)
                counter[0] += 10
                delay = started + counter[0] / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)

    @staticmethod
    def _recent(worker: WorkerHandle, since: float) -> set[str]:
        return {p for (t, p, _f, _l) in worker.batches if t >= since}

    async def _until(self, condition: Any, what: str, workers: list[WorkerHandle],
                     timeout: float | None = None) -> float:
        started = time.monotonic()
        limit = timeout or self.args.timeout
        while not condition():
            if time.monotonic() - started > limit:
                raise RuntimeError(f"{what} did not happen within {limit:.0f}s\n"
                                   + "\n".join(w.diagnostics() for w in workers))
            await asyncio.sleep(0.1)
        return time.monotonic() - started

    async def _counts(self, hub: str) -> dict[str, int]:
        from azure.eventhub.aio import EventHubProducerClient

        producer = EventHubProducerClient.from_connection_string(self.hub_conn, eventhub_name=hub)
        async with producer:
            return {pid: (await producer.get_partition_properties(pid))["last_enqueued_sequence_number"] + 1
                    for pid in await producer.get_partition_ids()}

    def _settled(self, workers: list[WorkerHandle], window: float = 2.0) -> bool:
        """Every partition delivered lately, each by one worker, shared fairly among them."""
        now = time.time()
        owners: dict[str, set[str]] = {}
        for worker in workers:
            for partition in self._recent(worker, now - window):
                owners.setdefault(partition, set()).add(worker.owner_id)
        if len(owners) != self.args.partitions or any(len(o) != 1 for o in owners.values()):
            return False
        shares = [sum(1 for o in owners.values() if w.owner_id in o) for w in workers]
        return max(shares) - min(shares) <= 1

    def _stream_options(self, side: str) -> tuple[str, list[str]]:
        impl = "official" if side.startswith("official") else side
        extra = self.options(self.args.interval, self.args.expiry, prefetch=self.args.stream_prefetch,
                             checkpoint_events=self.args.stream_checkpoint_events)
        if side == "official":
            extra.append("--checkpoint-on-close")
        return impl, extra

    @contextlib.asynccontextmanager
    async def _streaming(self, side: str, tag: str, round_: int) -> AsyncIterator[_Streaming]:
        """Two processes of ``side`` sharing a fresh hub under a steady stream, until the
        end of the block (then the stream and every process are stopped)."""
        hub = next(self.hubs)
        impl, extra = self._stream_options(side)
        streaming = _Streaming(self, hub, f"{tag}-{side[:8]}-{round_}-{uuid.uuid4().hex[:6]}", impl, extra,
                               f"{side}-{tag}-{round_}")
        streaming.workers = [await streaming.spawn(i) for i in range(2)]
        producer = asyncio.create_task(self._stream(hub, streaming.stop, self.args.rate, [0]))
        streaming.producer = producer
        try:
            await self._until(lambda: self._settled(streaming.workers), f"{side}: two processes sharing the hub",
                              streaming.workers)
            yield streaming
        finally:
            streaming.stop.set()
            if not producer.done():
                producer.cancel()
            for worker in streaming.workers:
                await worker.stop()

    # ------------------------------------------------------------------ 4. failover
    async def failover(self, side: str, round_: int) -> tuple[float, int]:
        async with self._streaming(side, "fo", round_) as streaming:
            victim, survivor = streaming.workers
            victim_partitions = self._recent(victim, time.time() - 2.0)
            victim.kill()
            killed_at = time.time()
            await victim.process.wait()
            await self._until(lambda: victim_partitions <= self._recent(survivor, killed_at),
                              f"{side}: the survivor taking over", [survivor], timeout=self.args.expiry * 4 + 30)
            seconds = max(min(t for (t, p, _f, _l) in survivor.batches if p == partition and t > killed_at)
                          - killed_at for partition in victim_partitions)
            lost = await streaming.drained(f"{side}: draining after the failover")
        return seconds, lost

    # ------------------------------------------------------------------ 5. scale-out
    async def scale_out(self, side: str, round_: int) -> tuple[int, int, int, float]:
        async with self._streaming(side, "so", round_) as streaming:
            workers = streaming.workers
            before = {p: w.owner_id for w in workers for p in self._recent(w, time.time() - 2.0)}
            scaled_at = time.time()
            workers += [await streaming.spawn(i) for i in (2, 3)]
            settle = await self._until(lambda: self._settled(workers), f"{side}: four processes sharing the hub",
                                       workers)
            after = {p: w.owner_id for w in workers for p in self._recent(w, time.time() - 2.0)}
            await asyncio.sleep(2.0)
            lost = await streaming.drained(f"{side}: draining after the scale-out")
        moved = sum(1 for p, owner in after.items() if before.get(p) != owner)
        return _duplicates_since(workers, scaled_at), lost, moved, settle

    # ------------------------------------------------------------------ the run
    async def run(self) -> Results:
        async with self.meter.sampling():
            return await self._run()

    async def _run(self) -> Results:
        args, results = self.args, self.results
        hub = next(self.hubs)
        print(f"filling {hub} with {args.events} events ...", file=sys.stderr)
        await self.fill(hub, args.events)
        print(f"fill: {results.fill.rate:.0f} events/s", file=sys.stderr)
        for side in SIDES:
            if len(args.sweep) == 1:
                results.prefetch[side] = args.sweep[0]
                continue
            tried: dict[int, float] = {}
            for prefetch in args.sweep:
                phase = await self.read_hub(side, hub, args.sweep_events, prefetch, f"sweep-{prefetch}")
                results.sweep.append(phase)
                tried[prefetch] = phase.rate
                print(f"sweep {side} prefetch {prefetch}: {phase.rate:.0f} events/s, {phase.cpu_us:.1f} µs/event, "
                      f"others {number(phase.others_cores, '.2f')} cores", file=sys.stderr)
            results.prefetch[side] = max(tried, key=lambda p: tried[p])
        for round_ in range(args.rounds):
            order = SIDES[round_ % 3:] + SIDES[:round_ % 3]
            phases: dict[str, Phase] = {}
            for side in order:
                phase = await self.read_hub(side, hub, args.events, results.prefetch[side], f"r{round_}")
                phases[side] = phase
                print(f"round {round_} {side}: {phase.rate:.0f} events/s, {phase.cpu_us:.1f} µs/event, emulator "
                      f"{number(phase.emulator_us)} µs/event, others {number(phase.others_cores, '.2f')} cores, load "
                      f"{phase.load:.1f}", file=sys.stderr)
            results.rounds.append(phases)
        for round_ in range(args.failover_rounds):
            for side in (CONSUMERS if round_ % 2 == 0 else CONSUMERS[::-1]):
                seconds, lost = await self.failover(side, round_)
                results.failover[side].append(seconds)
                results.failover_lost[side] += lost
                print(f"failover round {round_} {side}: {seconds:.1f}s, lost {lost}", file=sys.stderr)
        for round_ in range(0 if args.no_scale_out else args.scale_out_rounds):
            for side in (SCALE_OUT_SIDES if round_ % 2 == 0 else SCALE_OUT_SIDES[::-1]):
                outcome = await self.scale_out(side, round_)
                results.scale_out[side].append(outcome)
                print(f"scale-out round {round_} {side}: {outcome[0]} duplicates, {outcome[1]} lost, "
                      f"{outcome[2]} moved, settled in {outcome[3]:.1f}s", file=sys.stderr)
        return results


def _duplicates_since(workers: list[WorkerHandle], since: float) -> int:
    """Deliveries at or after ``since`` of events that had been delivered before
    (by any process), replaying the batches of all processes in time order."""
    batches = sorted((t, p, first, last) for w in workers for (t, p, first, last) in w.batches)
    seen: set[tuple[str, int]] = set()
    duplicates = 0
    for t, partition, first, last in batches:
        for seq in range(first, last + 1):
            key = (partition, seq)
            if key in seen:
                duplicates += t >= since
            else:
                seen.add(key)
    return duplicates


@dataclass
class Summary:
    """The throughput rounds in figures: which rounds count, and the ratios over them."""

    quiet: list[int]  # indexes of the rounds in which no phase was busy
    busy: bool  # too few quiet rounds: the run is not a result
    ratios: dict[str, list[float]]  # "ours/floor", "official/floor", "ours/official": per counted round
    cpu_ratios: dict[str, list[float]]
    counted: list[int]  # the rounds the figures come from (the quiet ones, or all when busy)


def summarize(rounds: list[dict[str, Phase]], busy_cores: float, min_quiet: int) -> Summary:
    """Per-round ratios of events/s and CPU per event. A round counts when no phase of it
    was busy (other processes used more than ``busy_cores``); with fewer than
    ``min_quiet`` such rounds the run is flagged busy and every round is shown, for
    information only.

    Example::

        summary = summarize(results.rounds, busy_cores=0.3, min_quiet=3)
        print(summary.busy, summary.ratios["ours/floor"])
    """
    quiet = [i for i, phases in enumerate(rounds) if not any(p.busy(busy_cores) for p in phases.values())]
    busy = len(quiet) < min(min_quiet, len(rounds))
    counted = list(range(len(rounds))) if busy else quiet
    pairs = (("ours", "floor"), ("official", "floor"), ("ours", "official"))
    ratios = {f"{a}/{b}": [rounds[i][a].rate / rounds[i][b].rate for i in counted] for a, b in pairs}
    cpu_ratios = {f"{a}/{b}": [rounds[i][a].cpu_us / rounds[i][b].cpu_us for i in counted] for a, b in pairs}
    return Summary(quiet, busy, ratios, cpu_ratios, counted)


def render(results: Results, args: argparse.Namespace, head: str) -> str:
    """The section: ``head`` (the line under the title, :func:`~benchmarks.toolkit.report.header`), then the tables."""
    summary = summarize(results.rounds, args.busy_cores, args.min_quiet_rounds)
    fill, prefetch = results.fill, results.prefetch
    counted = [results.rounds[i] for i in summary.counted]

    def column(side: str, attribute: str) -> list[float]:
        return [getattr(phases[side], attribute) for phases in counted
                if getattr(phases[side], attribute) is not None]

    ours_floor = summary.ratios["ours/floor"]
    verdict = "met" if median(ours_floor) >= TARGET else "not met"
    busy_note = (f"**Busy machine: in {len(results.rounds) - len(summary.quiet)} of {len(results.rounds)} rounds other "
                 f"processes used more than {args.busy_cores} cores, so this run is not a result.** The figures below "
                 f"are medians over all rounds, shown for information only.") if summary.busy else (
        f"{len(summary.quiet)} of {len(results.rounds)} rounds were quiet (other processes used at most "
        f"{args.busy_cores} cores in every phase); the figures are medians over those rounds, with their range.")
    loads = ", ".join(f"{max(p.load for p in results.rounds[i].values()):.1f}" for i in summary.counted)
    lines = [
        "## End to end over AMQP: this SDK, azure-eventhub, and a bare receive loop (`e2e`)",
        "",
        head,
        "",
        "One Event Hubs emulator (`eventprocessor.emulators.eventhubs`, its own process) and one Azurite, "
        f"both on 127.0.0.1 and "
        f"started by the benchmark; every consumer is a separate OS process. *floor*: a bare receive loop on "
        f"azure-eventhub's own AMQP client (`python -m harness.worker --impl floor`: receive, decode, read each "
        f"sequence number, "
        f"count; no `EventData`, no processor, no checkpoint). *ours*: `EventProcessor` + `EventHubSource` + our "
        f"`BlobCheckpointStore`. *official*: `EventHubConsumerClient.receive_batch` + "
        f"`azure-eventhub-checkpointstoreblob-aio` at its defaults. Both consumers: batches of at most {args.batch} "
        f"events, a checkpoint of a partition every {args.checkpoint_events:,} of its events, GREEDY, "
        f"{args.partitions} partitions of {args.events // args.partitions:,} {args.body}-byte events.",
        "",
    ]
    if results.sweep:
        lines += [
            f"### Prefetch sweep ({args.sweep_events:,} events from the start, one run per value)",
            "",
            "| side | " + " | ".join(f"prefetch {p}" for p in args.sweep) + " | chosen |",
            "|---|" + "---:|" * len(args.sweep) + "---:|",
        ]
        for side in SIDES:
            by_prefetch = {p.prefetch: p for p in results.sweep if p.side == side}
            cells = [f"{by_prefetch[p].rate:,.0f}/s, {by_prefetch[p].cpu_us:.1f} µs"
                     + (" (busy)" if by_prefetch[p].busy(args.busy_cores) else "") if p in by_prefetch else "-"
                     for p in args.sweep]
            lines.append(f"| {side} | " + " | ".join(cells) + f" | **{prefetch.get(side, '-')}** |")
        lines += ["", "Each side then runs at the prefetch that gave it the most events/s (its link credit per "
                      "partition).", ""]
    lines += [
        f"### Throughput ({args.events:,} events read from the start by one process per side; {args.rounds} rounds, "
        f"the order of the sides rotating)",
        "",
        busy_note,
        "",
        table(["side", "prefetch", "events/s (median)", "range", "CPU µs/event (median)", "range",
               "emulator CPU µs/event", "start-up (s)"],
              [[side, prefetch.get(side, "-"), number(median(column(side, "rate")), ",.0f"),
                value_range(column(side, "rate")), number(median(column(side, "cpu_us"))),
                value_range(column(side, "cpu_us"), ".1f"), number(median(column(side, "emulator_us"))),
                number(median(column(side, "startup")))] for side in SIDES], align="lrrrrrrr"),
        "",
        table(["ratio (per round)", "events/s, median", "range", "CPU per event, median", "range"],
              [[name, f"**{number(median(summary.ratios[name]), '.2f')}**", value_range(summary.ratios[name], ".2f"),
                number(median(summary.cpu_ratios[name]), ".2f"), value_range(summary.cpu_ratios[name], ".2f")]
               for name in ("ours/floor", "official/floor", "ours/official")], align="lrrrr"),
        "",
        f"Ours at **{number(median(ours_floor), '.2f')}x** of the floor's events/s, median of {len(ours_floor)} rounds "
        f"(range {value_range(ours_floor, '.2f')}; target >= {TARGET}: {verdict}"
        f"{', busy machine: not a result' if summary.busy else ''}"
        f"); 1-minute load average at the end of each of those rounds: {loads}.",
        "",
        "Per round (events/s; CPU µs/event; cores used by other processes during the phase; `busy` when above "
        f"{args.busy_cores}):",
        "",
        table(["round", "floor", "ours", "official", "ours/floor", "official/floor", "load"],
              [[index, *(f"{phases[s].rate:,.0f}; {phases[s].cpu_us:.1f}; {number(phases[s].others_cores, '.2f')}"
                         + (" busy" if phases[s].busy(args.busy_cores) else "") for s in SIDES),
                f"{phases['ours'].rate / phases['floor'].rate:.2f}",
                f"{phases['official'].rate / phases['floor'].rate:.2f}", f"{max(p.load for p in phases.values()):.1f}"]
               for index, phases in enumerate(results.rounds)], align="rlllrrr"),
        "",
        "Timed from the moment every partition has delivered a batch (sampled every 0.25 s) to the last expected "
        "event, counting only the events and CPU of that window; CPU is the consumer process's own (user + system, "
        "all threads). Other processes' CPU is the machine's busy time (`/proc/stat`) minus that of this run's "
        "processes (consumer, emulator, Azurite, the benchmark) over the same window. The load average counts this "
        "run's own processes too (about 1.3 on an idle machine). Start-up (claiming partitions, opening receivers) "
        "is the last column of the first table.",
        "",
        f"Fill: the official producer sent {args.events:,} events at {fill.rate:,.0f}/s, {fill.producer_us:.1f} µs of "
        f"its CPU per event; the emulator took {number(fill.emulator_us)} µs per event in.",
        "",
    ]
    fo = results.failover
    if fo["ours"] or fo["official"]:
        lines += [
            f"### Failover (2 processes, {args.rate:.0f} events/s, load-balancing interval {args.interval} s, "
            f"ownership expiration {args.expiry} s, prefetch {args.stream_prefetch}, a checkpoint every "
            f"{args.stream_checkpoint_events} events of a partition; one SIGKILLed)",
            "",
            table(["", "seconds from SIGKILL to the last of its partitions delivered again (median)", "range",
                   "events lost"],
                  [[side, number(median(fo[side])), value_range(fo[side], ".1f"), results.failover_lost[side]]
                   for side in CONSUMERS], align="lrrr"),
            "", "Both wait for the dead process's ownership to expire, then claim at their next tick and "
                      "open a receiver. Ours judges expiry on the store's clock, whose timestamps have 1-second "
                      "resolution, and keeps a self-fencing margin; the official processor uses the local clock.",
                  ""]
    if any(results.scale_out.values()):
        lines += [
            f"### Scale-out 2 -> 4 processes ({args.rate:.0f} events/s, interval {args.interval} s, expiration "
            f"{args.expiry} s, a checkpoint every {args.stream_checkpoint_events} events of a partition; "
            f"{args.scale_out_rounds} rounds)",
            "",
            table(["", "duplicates after the scale-out (median)", "per round", "events lost", "partitions moved",
                   "seconds to settle (median)"],
                  [[SCALE_OUT_LABELS[side], number(median([r[0] for r in rounds]), ".0f"),
                    ", ".join(str(r[0]) for r in rounds), sum(r[1] for r in rounds),
                    ", ".join(str(r[2]) for r in rounds), number(median([r[3] for r in rounds]))]
                   for side, rounds in results.scale_out.items() if rounds], align="lrrrrr"),
            "", "A duplicate is a delivery, at or after the moment the two new processes start, of an event "
                      "some process had delivered before (a moved partition replays from its last checkpoint). "
                      "Ours hands a moved partition over (its owner finishes the batch, checkpoints and releases "
                      "it); the official new owner claims it over the old one, which still delivers until its next "
                      "tick, so a checkpoint on close comes after the new owner read the older one.", ""]
    return "\n".join(lines)


def save_run(path: str, results: Results, command: str, seconds: float) -> None:
    """Write a run's figures as JSON (``--save-json``), for ``--from-json`` to print again."""
    Path(path).write_text(json.dumps({"command": command, "seconds": seconds, "results": asdict(results)}, indent=1))


def load_run(path: str) -> tuple[Results, str, float]:
    """A run saved by ``--save-json`` (or written by hand: the keys of :class:`Results`,
    any of them left out): its results, its command and its duration. Raises
    ``ValueError`` naming what is wrong."""
    try:
        saved = json.loads(Path(path).read_text())
        raw = saved["results"]
        results = Results(fill=Fill(**raw.get("fill", {})), sweep=[Phase(**p) for p in raw.get("sweep", [])],
                          prefetch={side: int(p) for side, p in raw.get("prefetch", {}).items()},
                          rounds=[{side: Phase(**p) for side, p in phases.items()} for phases in raw.get("rounds", [])])
        results.failover.update(raw.get("failover", {}))
        results.failover_lost.update(raw.get("failover_lost", {}))
        results.scale_out.update({side: [tuple(r) for r in rounds]
                                  for side, rounds in raw.get("scale_out", {}).items()})
        return results, str(saved.get("command", "(command not saved)")), float(saved.get("seconds", 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"--from-json {path}: not a run saved by --save-json ({type(error).__name__}: {error})") \
            from None


def _prefetches(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep takes prefetch values separated by commas, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--sweep takes positive prefetch values, got {text!r}")
    return values


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("e2e", __doc__, prog)
    parser.add_argument("--events", type=int, default=None, help="events per throughput phase (default 400000)")
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--body", type=int, default=32, help="event size in bytes")
    parser.add_argument("--batch", type=int, default=300, help="max batch size of both consumers")
    parser.add_argument("--checkpoint-events", type=int, default=1000,
                        help="throughput: both consumers checkpoint a partition once this many of its events were "
                             "delivered since its last checkpoint")
    parser.add_argument("--sweep", type=_prefetches, default=[100, 300, 1000, 3000],
                        help="prefetch values each side is tried with (one value: no sweep)")
    parser.add_argument("--sweep-events", type=int, default=None, help="events per sweep phase (default: --events/2)")
    parser.add_argument("--rounds", type=program.at_least_one, default=5,
                        help="throughput rounds (each side once per round)")
    parser.add_argument("--busy-cores", type=float, default=0.3,
                        help="a phase is busy when other processes used more than this many cores meanwhile")
    parser.add_argument("--min-quiet-rounds", type=int, default=3,
                        help="with fewer quiet rounds than this, the run is flagged busy (not a result)")
    parser.add_argument("--failover-rounds", type=int, default=2)
    parser.add_argument("--scale-out-rounds", type=int, default=2)
    parser.add_argument("--no-scale-out", action="store_true")
    parser.add_argument("--rate", type=float, default=1000.0, help="events/s of the steady stream")
    parser.add_argument("--stream-prefetch", type=int, default=300, help="prefetch in the failover and scale-out runs")
    parser.add_argument("--stream-checkpoint-events", type=int, default=100,
                        help="failover and scale-out: a checkpoint of a partition every this many of its events")
    parser.add_argument("--interval", type=float, default=1.0, help="load-balancing interval (failover, scale-out)")
    parser.add_argument("--expiry", type=float, default=6.0, help="ownership expiration (failover, scale-out)")
    parser.add_argument("--timeout", type=float, default=180.0, help="give up on a phase after this many seconds")
    parser.add_argument("--quick", action="store_true", help="a small smoke run (never recorded)")
    parser.add_argument("--save-json", metavar="PATH", help="also write the run's figures to PATH, for --from-json")
    parser.add_argument("--from-json", metavar="PATH",
                        help="run nothing: print the tables of a run saved with --save-json, judged with this "
                             "command's options (--busy-cores, --min-quiet-rounds, ...); never recorded")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print the tables; ``--record`` writes them to RESULTS.md.

    Example::

        python -m benchmarks.e2e --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.quick:
            if args.record:
                parser.error("--quick runs are partial: they are never recorded")
            args.events = args.events or 60_000
            args.sweep = args.sweep[:2]
            args.rounds, args.failover_rounds, args.no_scale_out = 1, 0, True
        args.events = args.events or 400_000
        args.sweep_events = args.sweep_events or args.events // 2
        if args.events < 8 * args.partitions or args.sweep_events > args.events:
            parser.error("--events must be at least 8 per partition, and --sweep-events at most --events")
        if args.from_json:
            if args.record or args.save_json:
                parser.error("--from-json prints a saved run again: it is never recorded or saved")
            try:
                results, command, seconds = load_run(args.from_json)
            except ValueError as error:
                parser.error(str(error))
            print(render(results, args, header(command, seconds=seconds)))
            return 0
        return _run(args, run)

    return program.run("e2e", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    hubs = {f"bench-{index}": args.partitions for index in range(100)}
    with services.logs("e2e", None) as log_dir, services.azurite_and_emulator(
            ["--max-events-per-partition", str(max(100_000, args.events))], hubs=hubs) as (emulator, azurite):
        azurite_pid = azurite.process.pid if azurite.process is not None else None
        bench = Bench(args, emulator.connection_string, emulator.pid, azurite_pid, azurite.connection_string, log_dir)
        results = asyncio.run(bench.run())
    if args.save_json:
        save_run(args.save_json, results, run.command, run.seconds)
    run.report(render(results, args, run.header(flag_busy=False)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
