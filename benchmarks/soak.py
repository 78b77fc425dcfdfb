"""Memory soak: does a long-running consumer's resident memory stay flat?

Run it with ``python -m benchmarks.soak`` (or ``eventprocessor bench soak``). Each subject
runs for a fixed number of events in its own OS process (``python -m harness.worker``),
which samples its own resident set size (RSS, from ``/proc/self/statm``) at a fixed
cadence, so that nothing else (the producer, the emulator, Azurite, the other subjects)
counts in what is measured:

* **ours, memory**: ``EventProcessor`` over a ``InMemoryEventSource`` in the same process
  (retention of a few backlogs per partition, so the log itself stays bounded) with
  ``InMemoryCheckpointStore``; its producer is a task of that process, as the source is
  in-process by nature. Millions of events.
* **ours, emulator**: ``EventProcessor`` + ``EventHubSource`` + this SDK's
  ``BlobCheckpointStore`` on Azurite, reading the project's Event Hubs emulator.
* **official, emulator**: azure-eventhub's ``EventHubConsumerClient.receive_batch`` +
  ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore`` on Azurite (not
  its in-memory default), on the same emulator in the same run.

The two emulator subjects read the same number of events, sent by this program's own
process with the official producer, which keeps ``--backlog`` events ahead of the
consumer. Every subject has the same handler: it looks at every event and checkpoints a
partition once ``--checkpoint-events`` of its events were delivered since its last
checkpoint; the same partitions, batch size, prefetch, load-balancing interval and
expiration, GREEDY.

Reported per subject: RSS at the end of warm-up (the first ``--warmup`` fraction of its
events) and at the end, the maximum, the least-squares slope of RSS after warm-up (per
million events and per hour), events/s, and the verdict *flat* when the slope per
million events is at most ``--flat-mb-per-million``. A whole run is bounded by
``--budget-seconds``; a subject cut short by it says so. ``--tracemalloc`` (never
recorded: it slows the subjects down several times) prints the allocation sites that grew
after warm-up, the tool to find a leak's cause.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.worker import WorkerHandle, create_container, spawn_worker

from .toolkit import program, services
from .toolkit.report import median_range, table

__all__ = ["main", "analyse", "Analysis"]

logger = logging.getLogger(__name__)

SUBJECTS = ("memory", "ours", "official")
LABELS = {"memory": "ours, InMemoryEventSource", "ours": "ours, emulator", "official": "official, emulator"}
MB = 1024 * 1024


@dataclass(frozen=True)
class Analysis:
    """What one subject's samples say. RSS figures in MB (MiB)."""

    events: int
    seconds: float
    rss_warm: float
    rss_end: float
    rss_max: float
    slope_per_million: float | None  # None: too few samples after warm-up to fit a line
    slope_per_hour: float | None

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def growth(self) -> float:
        return self.rss_end - self.rss_warm

    def flat(self, threshold: float) -> bool | None:
        return None if self.slope_per_million is None else self.slope_per_million <= threshold


def analyse(samples: Sequence[tuple[float, int, int]], warmup: float) -> Analysis:
    """Fit RSS after warm-up. ``samples`` are (wall time, events delivered, RSS bytes) in
    time order. The run is the samples from the first one with an event delivered to
    the first one that has every event of the run (later ones are the idle tail before
    the stop); warm-up is its first ``warmup`` fraction of events.

    Example::

        analyse([(0.0, 0, 50 * MB), (1.0, 100, 52 * MB), (2.0, 200, 52 * MB)], 0.2).slope_per_million
    """
    if not samples:
        raise ValueError("no samples: the subject never reported")
    final = max(events for _t, events, _rss in samples)
    window = [s for s in samples if s[1] > 0]
    if not window:
        raise ValueError("the subject delivered no event")
    end = next(i for i, s in enumerate(window) if s[1] == final)
    window = window[:end + 1]
    warm_index = next(i for i, s in enumerate(window) if s[1] >= warmup * final)
    fitted = window[warm_index:]
    slope_events = slope_time = None
    if len(fitted) >= 3 and fitted[-1][1] > fitted[0][1]:
        rss = [s[2] / MB for s in fitted]
        slope_events = statistics.linear_regression([s[1] / 1e6 for s in fitted], rss).slope
        slope_time = statistics.linear_regression([s[0] / 3600 for s in fitted], rss).slope
    return Analysis(events=final, seconds=window[-1][0] - window[0][0] if len(window) > 1 else 0.0,
                    rss_warm=window[warm_index][2] / MB, rss_end=window[-1][2] / MB,
                    rss_max=max(s[2] for s in samples) / MB, slope_per_million=slope_events,
                    slope_per_hour=slope_time)


@dataclass
class Run:
    subject: str
    round_: int
    target: int
    analysis: Analysis
    cut_short: bool  # the budget ended it before its target
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (wall time, events, RSS bytes)
    traced: list[dict[str, Any]] = field(default_factory=list)


class Soak:
    def __init__(self, args: argparse.Namespace, hub_conn: str | None, storage_conn: str | None,
                 log_dir: str) -> None:
        self.args = args
        self.hub_conn = hub_conn
        self.storage_conn = storage_conn
        self.log_dir = log_dir
        self.hubs: Iterator[str] = iter(f"bench-{i}" for i in range(100))
        self.runs: list[Run] = []

    def plan(self) -> list[tuple[int, str]]:
        """(round, subject) in running order: the memory subject first (it is quick, so the
        budget left is shared by the emulator subjects), and the emulator subjects in
        alternating order from round to round."""
        a = self.args
        order: list[tuple[int, str]] = []
        for round_ in range(a.rounds):
            emulated = [s for s in ("ours", "official") if s in a.subjects]
            order += [(round_, s) for s in (["memory"] if "memory" in a.subjects else [])]
            order += [(round_, s) for s in (emulated if round_ % 2 == 0 else emulated[::-1])]
        return order

    def worker_options(self, subject: str, target: int) -> list[str]:
        a = self.args
        options = ["--impl", "official" if subject == "official" else "ours", "--report", "counts",
                   "--expect", str(target), "--checkpoint-events", str(a.checkpoint_events),
                   "--stats-interval", str(a.sample_interval), "--batch", str(a.batch), "--prefetch", str(a.prefetch),
                   "--interval", str(a.interval), "--expiry", str(a.expiry), "--strategy", "greedy"]
        if subject == "memory":
            per_partition = a.backlog // a.partitions
            options += ["--source", "memory", "--partitions", str(a.partitions), "--produce", str(target),
                        "--backlog", str(per_partition), "--retention", str(2 * per_partition), "--body", str(a.body)]
        if a.tracemalloc:
            options += ["--tracemalloc-at", str(max(1, int(target * a.warmup / 2))),
                        "--tracemalloc-frames", str(a.tracemalloc_frames)]
        return options

    async def run(self) -> list[Run]:
        plan = self.plan()
        deadline = time.monotonic() + self.args.budget_seconds
        for index, (round_, subject) in enumerate(plan):
            budget = (deadline - time.monotonic()) / (len(plan) - index)
            run = await self.run_subject(subject, round_, budget)
            self.runs.append(run)
            a = run.analysis
            slope = "n/a" if a.slope_per_million is None else f"{a.slope_per_million:+.2f} MB per million events"
            print(f"round {round_} {LABELS[subject]}: {a.events} events at {a.rate:.0f}/s, RSS {a.rss_warm:.1f} -> "
                  f"{a.rss_end:.1f} MB (max {a.rss_max:.1f}), slope {slope}"
                  + (" (cut short by the budget)" if run.cut_short else ""), file=sys.stderr)
        return self.runs

    async def run_subject(self, subject: str, round_: int, budget: float) -> Run:
        a = self.args
        target = a.memory_events if subject == "memory" else a.emulator_events
        owner = f"soak-{subject}-{round_}"
        if subject == "memory":
            worker = await spawn_worker(owner, hub="soak", container=None, hub_connection_string=None,
                                        storage_connection_string=None, log_dir=self.log_dir,
                                        extra=self.worker_options(subject, target))
            feeder: asyncio.Task[None] | None = None
        else:
            assert self.hub_conn is not None and self.storage_conn is not None
            hub, container = next(self.hubs), f"soak-{subject}-{round_}-{uuid.uuid4().hex[:6]}"
            await create_container(self.storage_conn, container)
            worker = await spawn_worker(owner, hub=hub, container=container, hub_connection_string=self.hub_conn,
                                        storage_connection_string=self.storage_conn, log_dir=self.log_dir,
                                        extra=self.worker_options(subject, target))
            feeder = asyncio.create_task(self.feed(hub, target, worker))
        cut_short = False
        try:
            ends = time.monotonic() + budget
            while worker.done is None:
                if not worker.alive:
                    raise RuntimeError(f"{LABELS[subject]} stopped before {target} events:\n{worker.diagnostics()}")
                if feeder is not None and feeder.done() and feeder.exception() is not None:
                    raise RuntimeError(f"the producer for {LABELS[subject]} failed: {feeder.exception()!r}")
                if time.monotonic() > ends:
                    cut_short = True
                    break
                await asyncio.sleep(0.1)
            # One more sample, taken once every event was delivered: the end of the run.
            settle = time.monotonic() + 3 * a.sample_interval + 1.0
            while not cut_short and (not worker.stats or worker.stats[-1][1] < target) \
                    and time.monotonic() < settle:
                await asyncio.sleep(0.05)
        finally:
            if feeder is not None:
                feeder.cancel()
                await asyncio.gather(feeder, return_exceptions=True)
            await worker.stop()
        samples = [(t, events, rss) for (t, events, _cpu, rss) in worker.stats if rss is not None]
        if not samples:
            raise RuntimeError(f"{LABELS[subject]} reported no RSS (is /proc mounted?):\n{worker.diagnostics()}")
        return Run(subject, round_, target, analyse(samples, a.warmup), cut_short, traced=worker.traced,
                   samples=samples)

    async def feed(self, hub: str, total: int, worker: WorkerHandle) -> None:
        """Send ``total`` events round-robin over the partitions, at most ``--backlog``
        ahead of what the worker reported delivered."""
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        a = self.args
        body = b"x" * a.body
        assert self.hub_conn is not None, "the producer runs on the emulator's hub"
        producer = EventHubProducerClient.from_connection_string(self.hub_conn, eventhub_name=hub)
        async with producer:
            sent, partition = 0, 0
            while sent < total:
                if sent - worker.events >= a.backlog:
                    await asyncio.sleep(0.02)
                    continue
                count = min(100, total - sent)
                await producer.send_batch([EventData(body) for _ in range(count)], partition_id=str(partition))
                sent += count
                partition = (partition + 1) % a.partitions


def render(runs: list[Run], args: argparse.Namespace, head: str) -> str:
    threshold = args.flat_mb_per_million
    rows = []
    for subject in SUBJECTS:
        mine = [r for r in runs if r.subject == subject]
        if not mine:
            continue
        results = [r.analysis for r in mine]

        verdicts = [a.flat(threshold) for a in results]
        flat = sum(1 for v in verdicts if v)
        if any(v is None for v in verdicts):
            verdict = "too short to fit"
        elif flat == len(verdicts):
            verdict = "**flat**" if len(verdicts) == 1 else f"**flat** in {flat}/{len(verdicts)} rounds"
        else:
            verdict = f"**grows** in {len(verdicts) - flat}/{len(verdicts)} rounds"
        events = median_range((float(a.events) for a in results), ",.0f")
        if any(r.cut_short for r in mine):
            events += f" of {mine[0].target:,} (budget)"
        rows.append([LABELS[subject], events, median_range((a.rate for a in results), ",.0f"),
                     median_range((a.rss_warm for a in results), ".1f"),
                     median_range((a.rss_end for a in results), ".1f"),
                     median_range((a.rss_max for a in results), ".1f"),
                     median_range((a.growth for a in results), "+.1f"),
                     median_range((a.slope_per_million for a in results), "+.2f"),
                     median_range((a.slope_per_hour for a in results), "+.1f"), verdict])
    rounds = f"{args.rounds} rounds (median, range in brackets)" if args.rounds > 1 else "1 round"
    lines = [
        "## Memory soak: resident memory of a long-running consumer (`soak`)",
        "",
        head,
        "",
        f"Each subject runs in its own OS process (`python -m harness.worker`) and samples its own resident set "
        f"(`/proc/self/statm`) every {args.sample_interval:g} s; the producer, the Event Hubs emulator and Azurite are "
        f"other processes (except over `InMemoryEventSource`, whose producer is a task of the subject's process: the "
        f"source is in-process, and retains {2 * (args.backlog // args.partitions):,} events per partition). *ours, "
        f"InMemoryEventSource*: `EventProcessor` + `InMemoryCheckpointStore`. *ours, emulator*: `EventProcessor` + "
        f"`EventHubSource` + our `BlobCheckpointStore` on Azurite. *official, emulator*: "
        f"`EventHubConsumerClient.receive_batch` + `azure-eventhub-checkpointstoreblob-aio` on Azurite (not its "
        f"in-memory default). The emulator subjects read the same {args.emulator_events:,} events, sent by the "
        f"benchmark's process with the official producer at most {args.backlog:,} events ahead of the consumer. "
        f"Same settings for all: {args.partitions} partitions, {args.body}-byte events, batch {args.batch}, prefetch "
        f"{args.prefetch}, a checkpoint of a partition every {args.checkpoint_events:,} of its events, "
        f"load-balancing interval {args.interval:g} s, expiration {args.expiry:g} s, GREEDY. {rounds}.",
        "",
        table(["Subject", "events", "events/s", "RSS at warm-up end (MB)", "RSS at end (MB)", "max RSS (MB)",
               "growth after warm-up (MB)", "slope (MB per million events)", "slope (MB per hour)", "verdict"],
              rows, align="lrrrrrrrr"),
        "",
        f"Warm-up is each run's first {args.warmup:.0%} of its events; the slopes are least-squares fits of RSS "
        f"against events delivered and against time, over every sample from the end of warm-up to the sample that "
        f"saw the last event. **Flat**: the slope is at most {threshold:g} MB per million events (about "
        f"{threshold:g} bytes per event), in every round. For scale: a leak of one small object (about 100 bytes) "
        f"per event shows as about 100 MB per million events; one per batch of {args.batch} (about "
        f"{100 / args.batch:.2f}) is below what runs this long can tell from the allocator, whose resident set "
        f"creeps by a few hundred KB at a time while live Python memory stays the same (`--tracemalloc` tells "
        f"the two apart). MB is 2^20 bytes. Events/s is from the first sample with an event to the last event, "
        f"and shares the machine with the producer, the emulator and Azurite.",
        "",
        "What grows over AMQP: azure-eventhub's AMQP link adds the tag of every delivery it receives to a set that "
        "only a settlement empties, and azure-eventhub never settles one, so a receiver that stays open keeps about "
        "100 bytes per event (`tracemalloc`: `_pyamqp/aio/_receiver_async.py:74` and the tags from "
        "`_pyamqp/_decode.py:149`). `EventHubSource` drops the tags after each read "
        "(`tests/test_eventhub_source.py`); the official consumer keeps them.",
    ]
    if args.quick:
        lines += ["", "A `--quick` run is a smoke test: its runs are too short for the verdicts to mean much."]
    return "\n".join(lines)


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("soak", __doc__, prog)
    parser.add_argument("--memory-events", type=program.at_least_one, default=5_000_000,
                        help="Events through the subject over InMemoryEventSource. [default: %(default)s]")
    parser.add_argument("--emulator-events", type=program.at_least_one, default=1_000_000,
                        help="Events through each subject over the Event Hubs emulator (the same for both). "
                             "[default: %(default)s]")
    parser.add_argument("--budget-seconds", type=float, default=540.0,
                        help="Bound on all subjects' runs together (start-up aside); a subject still running when its "
                             "share is spent is stopped and reported as cut short. [default: %(default)s]")
    parser.add_argument("--rounds", type=program.at_least_one, default=1,
                        help="Rounds of every subject; the median and the range are reported. [default: %(default)s]")
    parser.add_argument("--subjects", default=",".join(SUBJECTS),
                        help=f"Comma-separated, from {', '.join(SUBJECTS)}. [default: %(default)s]")
    parser.add_argument("--partitions", type=program.at_least_one, default=8,
                        help="Partitions of the hub. [default: %(default)s]")
    parser.add_argument("--body", type=int, default=32, help="Event size in bytes. [default: %(default)s]")
    parser.add_argument("--batch", type=program.at_least_one, default=300,
                        help="Max batch size of every subject. [default: %(default)s]")
    parser.add_argument("--prefetch", type=int, default=300,
                        help="Prefetch of every subject. [default: %(default)s]")
    parser.add_argument("--checkpoint-events", type=program.at_least_one, default=1000,
                        help="Each partition is checkpointed once this many of its events were delivered. "
                             "[default: %(default)s]")
    parser.add_argument("--backlog", type=int, default=24_000, help="Events the producer keeps ahead, in all. "
                                                                    "[default: %(default)s]")
    parser.add_argument("--interval", type=float, default=1.0, help="Load-balancing interval, seconds. "
                                                                    "[default: %(default)s]")
    parser.add_argument("--expiry", type=float, default=10.0, help="Ownership expiration, seconds. "
                                                                   "[default: %(default)s]")
    parser.add_argument("--sample-interval", type=float, default=0.5, help="Seconds between RSS samples. "
                                                                           "[default: %(default)s]")
    parser.add_argument("--warmup", type=float, default=0.2, help="Fraction of each run's events that is warm-up. "
                                                                  "[default: %(default)s]")
    parser.add_argument("--flat-mb-per-million", type=float, default=2.0,
                        help="The verdict's bound on the slope after warm-up, MB per million events. "
                             "[default: %(default)s]")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="Print the allocation sites that grew after warm-up (slow; never recorded).")
    parser.add_argument("--tracemalloc-frames", type=int, default=1,
                        help="With --tracemalloc: frames per allocation site (1 is a few times slower, 10 many "
                             "times). [default: %(default)s]")
    parser.add_argument("--samples-csv", metavar="PATH",
                        help="Also write every RSS sample (subject, round, seconds, events, RSS bytes) to this CSV.")
    parser.add_argument("--quick", action="store_true", help="A small smoke run for CI, about 30 s (never recorded).")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the soak and print its table; ``--record`` writes it to RESULTS.md.

    Example::

        python -m benchmarks.soak --memory-events 5000000 --emulator-events 1500000 --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        args.subjects = [s.strip() for s in args.subjects.split(",") if s.strip()]
        unknown = sorted(set(args.subjects) - set(SUBJECTS))
        if unknown or not args.subjects:
            parser.error(f"--subjects takes {', '.join(SUBJECTS)}; got {', '.join(unknown) or 'none'}")
        if args.quick:
            if args.record:
                parser.error("--quick runs are partial: they are never recorded")
            args.memory_events, args.emulator_events = 300_000, 40_000
            args.sample_interval, args.backlog, args.budget_seconds = 0.2, 8_000, 60.0
        if args.tracemalloc and args.record:
            parser.error("--tracemalloc slows the subjects down many times: its runs are never recorded")
        if args.backlog < args.partitions or args.budget_seconds <= 0 or args.sample_interval <= 0:
            parser.error("--backlog must be at least --partitions; --budget-seconds and --sample-interval positive")
        if not 0 < args.warmup < 1:
            parser.error("--warmup is a fraction of each run's events, between 0 and 1")
        return _run(args, run)

    return program.run("soak", parser, body, argv, unrecorded=("--samples-csv",))


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with services.logs("soak", None) as log_dir:
        if any(s in args.subjects for s in ("ours", "official")):
            emulator_limit = max(100_000, 4 * args.backlog // args.partitions)
            hubs = {f"bench-{index}": args.partitions for index in range(2 * args.rounds)}
            with services.azurite_and_emulator(["--max-events-per-partition", str(emulator_limit)],
                                               hubs=hubs) as (emulator, azurite):
                runs = asyncio.run(Soak(args, emulator.connection_string, azurite.connection_string, log_dir).run())
        else:
            runs = asyncio.run(Soak(args, None, None, log_dir).run())
    run.report(render(runs, args, run.header()))
    if args.tracemalloc:
        _print_traced(runs)
    if args.samples_csv:
        _write_samples(runs, args.samples_csv)
    return 0


def _write_samples(runs: list[Run], path: str) -> None:
    import csv

    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["subject", "round", "seconds", "events", "rss_bytes"])
        for run in runs:
            start = run.samples[0][0]
            writer.writerows([run.subject, run.round_, f"{t - start:.3f}", events, rss]
                             for t, events, rss in run.samples)
    print(f"samples written to {path}", file=sys.stderr)


def _print_traced(runs: list[Run]) -> None:
    print("\n### Allocation sites that grew after warm-up (tracemalloc; innermost frame first)\n")
    for run in runs:
        print(f"{LABELS[run.subject]}, round {run.round_}:")
        for record in run.traced[:15]:
            frames = " <- ".join(frame.rsplit("/", 2)[-1] if "site-packages" not in frame else frame.split(
                "site-packages/", 1)[1] for frame in record["traceback"][:5])
            print(f"  {record['size_diff'] / 1024:+9.1f} KiB {record['count_diff']:+7d} objects "
                  f"over {record['events']:,} events: {frames}")
        print()


if __name__ == "__main__":
    sys.exit(main())
