"""Dispatch overhead: events/s through an EventProcessor against a bare asyncio loop.

Both read the same pre-filled :class:`~eventprocessor.sources.InMemoryEventSource` (32
partitions, batches of 300) and do the same work per batch (count the events). The
processor side is a real ``EventProcessor`` with a no-op handler, its store in memory,
GREEDY so that it owns every partition within two ticks; the bare side opens one
receiver per partition and loops ``receive``. Rounds alternate between the two so that
both see the same machine noise; the headline is the median of the per-round ratios
(one round is tens of milliseconds, so single rounds are at the mercy of a shared
machine), with the best round of each side beside it. The processor is timed from
the moment it owns every partition (its balancing ticks are reported separately); the
bare loop from opening its receivers.

Run::

    python -m benchmarks.throughput --record     # writes its section of RESULTS.md
    python -m benchmarks.throughput --events-per-partition 2000 --rounds 1   # smoke, printed only
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from dataclasses import dataclass

from eventprocessor import EventProcessor, LoadBalancingStrategy, PartitionProcessor
from eventprocessor.events import EventPosition
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

from .toolkit import program
from .toolkit.report import median, table, value_range

__all__ = ["main", "measure", "measure_processor", "measure_bare", "Measurement", "check_counts"]

logger = logging.getLogger(__name__)

PARTITIONS = 32
BATCH = 300
TARGET = 0.8


@dataclass(frozen=True)
class Measurement:
    events: int
    seconds: float  # from the timed start to the last event counted
    startup: float = 0.0  # untimed: the processor's balancing ticks before every partition was owned

    @property
    def per_second(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else float("inf")


def fill(partitions: int, per_partition: int) -> InMemoryEventSource:
    """A source with ``per_partition`` small events in each partition."""
    source = InMemoryEventSource(partitions)
    body = b"x" * 64
    for pid in range(partitions):
        for _ in range(per_partition):
            source.append(body, partition_id=str(pid))
    return source


async def measure_processor(source: InMemoryEventSource, total: int, consumer_group: str) -> Measurement:
    """Dispatch rate of the processor's pumps once it owns every partition.

    The balancing ticks are driven by hand (``balance_once`` until every partition is
    owned) and not timed. Each pump's first batch waits at a gate until every partition
    is owned; the clock starts when the gate opens, and every event counts from there.
    """
    done = asyncio.Event()
    gate = asyncio.Event()
    seen = 0

    class NoOp(PartitionProcessor):
        async def process_events(self, events, context):  # type: ignore[no-untyped-def]
            nonlocal seen
            if not gate.is_set():
                await gate.wait()
            seen += len(events)
            if seen >= total:
                done.set()

    processor = EventProcessor(
        source, InMemoryCheckpointStore(), NoOp, consumer_group=consumer_group,
        load_balancing_strategy=LoadBalancingStrategy.GREEDY, max_batch_size=BATCH, prefetch=BATCH,
        initial_event_position=EventPosition.earliest(),
    )
    setup_started = time.perf_counter()
    for _ in range(10):
        await processor.balance_once()
        if len(processor.owned_partitions) == source.partition_count:
            break
    else:
        raise RuntimeError("the processor did not claim every partition in 10 ticks")
    started, seen_before = time.perf_counter(), seen
    gate.set()
    try:
        await done.wait()
        finished = time.perf_counter()
    finally:
        await processor.stop()
    return Measurement(seen - seen_before, finished - started, startup=started - setup_started)


async def measure_bare(source: InMemoryEventSource, total: int, consumer_group: str) -> Measurement:
    """The same partitions read by one task per receiver, counting like the handler."""
    seen = 0
    per_partition = {str(p): source.last_sequence_number(str(p)) + 1 for p in range(source.partition_count)}

    async def drain(pid: str) -> None:
        nonlocal seen
        receiver = await source.open_receiver(pid, consumer_group=consumer_group,
                                              starting_position=EventPosition.earliest(), owner_level=1,
                                              prefetch=BATCH)
        try:
            got = 0
            while got < per_partition[pid]:
                events = await receiver.receive(BATCH, None)
                got += len(events)
                seen += len(events)
        finally:
            await receiver.close()

    started = time.perf_counter()
    await asyncio.gather(*(drain(pid) for pid in per_partition))
    finished = time.perf_counter()
    return Measurement(seen, finished - started)


async def measure(per_partition: int, rounds: int) -> tuple[list[Measurement], list[Measurement]]:
    source = fill(PARTITIONS, per_partition)
    total = PARTITIONS * per_partition
    processor: list[Measurement] = []
    bare: list[Measurement] = []
    for r in range(rounds):
        # A fresh consumer group per round: every round reads from the start.
        bare.append(await measure_bare(source, total, f"bare-{r}"))
        processor.append(await measure_processor(source, total, f"processor-{r}"))
    return processor, bare


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Measure and print the ratio; with ``--record``, write it to RESULTS.md. Example::

        python -m benchmarks.throughput --rounds 3
    """
    parser = program.parser("throughput", __doc__, prog)
    parser.add_argument("--events-per-partition", type=program.at_least_one, default=30_000,
                        help="Events per partition per round. [default: %(default)s]")
    parser.add_argument("--rounds", type=program.at_least_one, default=15,
                        help="Alternating rounds of each side; the median ratio is reported. [default: %(default)s]")
    return program.run("throughput", parser, _run, argv)


def check_counts(processor: list[Measurement], bare: list[Measurement], total: int) -> str:
    """Each side saw what it should: every bare round counted every event once; the
    processor counted some and never more (what it dispatched before it owned every
    partition is not counted). Raises ``RuntimeError`` if not; says what held."""
    if any(b.events != total for b in bare):
        raise RuntimeError(f"a bare round counted {[b.events for b in bare]} events, not {total}")
    if any(not 0 < p.events <= total for p in processor) or any(m.seconds <= 0 for m in processor + bare):
        raise RuntimeError(f"the processor counted {[p.events for p in processor]} events of {total} (or a round "
                           "took no time)")
    return (f"throughput: counts checked: every bare round counted all {total} events; the processor counted "
            f"{min(p.events for p in processor)}-{max(p.events for p in processor)} (after it owned every partition)")


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING)
    processor, bare = asyncio.run(measure(args.events_per_partition, args.rounds))
    print(check_counts(processor, bare, PARTITIONS * args.events_per_partition), file=sys.stderr)
    best_p = max(processor, key=lambda m: m.per_second)
    best_b = max(bare, key=lambda m: m.per_second)
    ratios = [p.per_second / b.per_second for p, b in zip(processor, bare, strict=False)]
    ratio = median(ratios)
    best_ratio = best_p.per_second / best_b.per_second
    rounds = ", ".join(f"{p.per_second:,.0f} / {b.per_second:,.0f}" for p, b in zip(processor, bare, strict=False))
    text = "\n".join([
        "## Throughput: EventProcessor vs a bare asyncio loop",
        "",
        run.header("On a shared machine the per-round ratio is the figure to trust."),
        "",
        f"InMemoryEventSource, {PARTITIONS} partitions x {args.events_per_partition:,} pre-filled events, batch size "
        f"{BATCH}; no-op handler (counts events) vs one task per receiver doing the same count. "
        f"{args.rounds} alternating rounds. With every event already there, no receive ever waits, so this "
        "is the per-batch CPU cost of the pump (owner checks, handler call, counters) against a bare receive loop.",
        "",
        table(["", "events/s (best round)"], [
            ["EventProcessor", f"{best_p.per_second:,.0f}"],
            ["bare asyncio loop", f"{best_b.per_second:,.0f}"],
            ["ratio of the best rounds", f"{best_ratio:.2f}"],
            [f"**median per-round ratio** (target >= {TARGET})",
             f"**{ratio:.2f}** {'(met)' if ratio >= TARGET else '(missed)'}; range {value_range(ratios, '.2f')}"]]),
        "",
        f"Rounds (processor / bare events/s): {rounds}. Processor balancing until it owned "
        f"all {PARTITIONS} partitions (untimed; events dispatched meanwhile are not counted): "
        f"{min(p.startup for p in processor) * 1000:.1f} ms (best round).",
    ])
    run.report(text)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
