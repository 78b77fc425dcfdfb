"""Checkpoint every N events, and what that costs after a crash: at most N - 1 events again.

Run it from the repository root:  python samples/checkpoint_every_n.py [--every 25]

Checkpointing every batch costs one store write per batch. Checkpointing every N events
costs one per N, and a crash replays the events after the last checkpoint: fewer than N
per partition. A graceful stop or handoff replays nothing, because the processor
checkpoints the last completed batch when it lets a partition go
(``PartitionProcessor.checkpoint_on_release``).

The sample consumes 500 events with one processor, lets a second take over after a
graceful stop, then a third after a crash (what a killed process leaves behind: no
checkpoint at the end, ownership left to expire; simulated in one process with
``stop(release=False)`` and ``checkpoint_on_release`` off), and counts what each
partition received twice.
"""
from __future__ import annotations

import argparse
import asyncio
from collections import Counter

from eventprocessor import EventProcessor, PartitionContext, PartitionProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

PARTITIONS = 4
OPTIONS = dict(load_balancing_interval=0.2, partition_ownership_expiration_interval=2.0)

deliveries: Counter = Counter()  # (partition, sequence number) -> times delivered


class EveryN(PartitionProcessor):
    """Checkpoints once ``every`` events have been processed since the last checkpoint."""

    every = 25
    checkpoints = 0

    def __init__(self) -> None:
        self.since_checkpoint = 0

    async def process_events(self, events, context: PartitionContext) -> None:
        for event in events:
            deliveries[(context.partition_id, event.sequence_number)] += 1
            self.since_checkpoint += 1
            if self.since_checkpoint >= self.every:
                await context.update_checkpoint(event)  # this event, not necessarily the batch's last
                EveryN.checkpoints += 1
                self.since_checkpoint = 0


class Crashing(EveryN):
    checkpoint_on_release = False  # a killed process writes nothing on its way out


async def run_until(source: InMemoryEventSource, store: InMemoryCheckpointStore, name: str,
                    wanted: set[tuple[str, int]], *, crash: bool) -> None:
    processor = EventProcessor(source, store, Crashing if crash else EveryN, owner_id=name, max_batch_size=10,
                               **OPTIONS)
    await processor.start()
    while not wanted <= set(deliveries):
        await asyncio.sleep(0.05)
    await processor.stop(release=not crash)
    print(f"{name}: {'crashed' if crash else 'stopped gracefully'} with "
          f"{len(set(deliveries))} distinct events delivered so far")


def replayed() -> int:
    return sum(count - 1 for count in deliveries.values())


async def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--every", type=int, default=25, help="checkpoint every N events")
    args = parser.parse_args(argv)
    EveryN.every = args.every
    source, store = InMemoryEventSource(PARTITIONS), InMemoryCheckpointStore()

    def produce(start: int, count: int) -> set[tuple[str, int]]:
        for i in range(start, start + count):
            source.append(f"reading {i}", partition_id=str(i % PARTITIONS))
        return {(str(p), seq) for p in range(PARTITIONS) for seq in range(source.last_sequence_number(str(p)) + 1)}

    await run_until(source, store, "first", produce(0, 210), crash=False)
    graceful = replayed()
    await run_until(source, store, "second", produce(210, 150), crash=True)
    before_crash = replayed()
    await run_until(source, store, "third", produce(360, 140), crash=False)
    after_crash = replayed() - before_crash
    per_partition = Counter(pid for (pid, _seq), count in deliveries.items() for _ in range(count - 1))
    print(f"checkpoints written by the handler: {EveryN.checkpoints} for {len(deliveries)} events "
          f"(every {args.every})")
    print(f"replayed after the graceful stop: {graceful}")
    print(f"replayed after the crash: {after_crash} ({dict(sorted(per_partition.items()))} per partition, "
          f"at most {args.every - 1} each)")
    ok = graceful == 0 and all(count <= args.every - 1 for count in per_partition.values()) \
        and len(deliveries) == 500
    print("ok" if ok else "unexpected")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
