"""Running e2e's phases: the fill, each side reading the hub, failover and scale-out under
a steady stream, every consumer a worker process (:mod:`harness.worker`)."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from harness.worker import WorkerHandle, create_container, spawn_worker

from ..toolkit.machine import CpuMeter, process_cpu_seconds
from ..toolkit.report import number
from .results import CONSUMERS, FLOORS, SCALE_OUT_SIDES, SIDES, Phase, Results

__all__ = ["Bench"]


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
        if side in FLOORS:
            worker = await spawn_worker(owner, hub=hub, container=None, hub_connection_string=self.hub_conn,
                                        storage_connection_string=None, log_dir=self.log_dir,
                                        extra=["--impl", side, "--prefetch", str(prefetch), "--expect", str(total)])
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
            order = SIDES[round_ % len(SIDES):] + SIDES[:round_ % len(SIDES)]
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
