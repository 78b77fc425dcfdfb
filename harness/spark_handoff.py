"""The Spark sink's handoff-under-load scenario, run many times with different timings.

Up to three processors, each with a :class:`~eventprocessor.spark.SparkSink` of its own,
write one hub's events into one Parquet table while events arrive: processors start
(and take partitions from the busy ones), stop gracefully (handing theirs over) and stop
without releasing (their records expire), at times drawn from the seed, with each
incarnation's batch size, batch interval and read size drawn too. At the end the table is
read back: every produced event exactly once, and every commit-log entry naming exactly
the files the table holds for it (:func:`harness.spark_files.audit_table`).

The same scenario runs two ways:

* on virtual time (:class:`~eventprocessor.testing.VirtualTimeLoop`), with
  :class:`ArrowSession` standing in for Spark (it writes the batch's Parquet with pyarrow,
  laid out as Spark's writer lays it out) and :class:`VirtualOffload` giving every
  blocking call of the sink a seeded duration: the sink's whole state machine, many
  seeds a second;
* for real, on any SparkSession (classic or Spark Connect) and the real clock.

``python -m harness.spark_handoff`` runs real scenarios on a cluster (its own, or the
one ``--master``/``--remote`` names) and prints one JSON line per scenario; the tests
run it for their real scenarios (``tests/test_spark_handoff.py``).

Example::

    outcome = run_virtual(run_handoff(ArrowSession(), tmp / "t", seed=7, virtual=True,
                                      offload=VirtualOffload(random.Random(7))))
    assert outcome.ok, outcome.problems
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from eventprocessor import EventProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.spark import CommitLog, SparkSink
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import virtual_utc_clock
from harness.spark_files import audit_table

__all__ = ["ArrowSession", "VirtualOffload", "HandoffOutcome", "run_handoff", "main"]

logger = logging.getLogger(__name__)

LOG_NAME = "handoff"
SLOTS = 3
REAL_BATCH_SIZES = (100, 200, 400)
REAL_INTERVALS = (0.3, 0.6, 1.0)


# ----------------------------------------------------------------------------- Spark's stand-in on virtual time


class ArrowSession:
    """Stands in for a SparkSession where the sink's states are tested on virtual time:
    ``createDataFrame`` keeps the Arrow table, and ``df.write...parquet(path)`` writes
    it with pyarrow the way Spark's writer lays a table out (``partition_id=0/part-*.parquet``
    under the path; ``mode("overwrite")`` replaces what a failed attempt left)."""

    version = "4.3.0"

    def createDataFrame(self, table: Any) -> ArrowFrame:  # noqa: N802 - Spark's name
        return ArrowFrame(table)


class ArrowFrame:
    def __init__(self, table: Any) -> None:
        self.table = table
        self._mode = "error"
        self._columns: list[str] = []

    @property
    def write(self) -> ArrowFrame:
        return self

    def count(self) -> int:
        return int(self.table.num_rows)

    def mode(self, mode: str) -> ArrowFrame:
        self._mode = mode
        return self

    def partitionBy(self, *columns: str) -> ArrowFrame:  # noqa: N802 - Spark's name
        self._columns = list(columns)
        return self

    def options(self, **_options: str) -> ArrowFrame:
        return self

    def parquet(self, path: str) -> None:
        import pyarrow.dataset as ds

        local = Path(path[len("file://"):] if path.startswith("file://") else path)
        if self._mode == "overwrite":
            shutil.rmtree(local, ignore_errors=True)
        ds.write_dataset(self.table, local, format="parquet", partitioning=self._columns or None,
                         partitioning_flavor="hive" if self._columns else None,
                         basename_template=f"part-{{i}}-{uuid.uuid4()}.c000.snappy.parquet",
                         existing_data_behavior="overwrite_or_ignore")


class VirtualOffload:
    """The sink's ``offload`` on virtual time: each blocking call takes a seeded random
    number of virtual seconds (``low`` to ``high``), then runs. Like a worker thread, a
    call goes on to the end when the task that awaits it is cancelled."""

    def __init__(self, rng: random.Random, low: float = 0.005, high: float = 1.0) -> None:
        self.rng = rng
        self.low, self.high = low, high
        self.calls = 0
        self._running: set[asyncio.Task[Any]] = set()

    async def __call__(self, function: Callable[..., Any], *args: Any) -> Any:
        delay = self.rng.uniform(self.low, self.high)
        self.calls += 1

        async def later() -> Any:
            await asyncio.sleep(delay)
            return function(*args)

        task = asyncio.ensure_future(later())
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        return await asyncio.shield(task)


# ----------------------------------------------------------------------------- the scenario


@dataclass
class HandoffOutcome:
    """One scenario: what was produced, what the table holds, and what disagreed."""

    seed: int
    produced: int
    rows: int
    missing: int
    duplicates: int
    extra: int
    batches: int
    seconds: float
    actions: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.duplicates or self.extra or self.problems)

    def describe(self) -> str:
        state = "ok" if self.ok else "FAILED"
        text = (f"seed {self.seed}: {state}: {self.rows} rows for {self.produced} events ({self.missing} missing, "
                f"{self.duplicates} duplicated, {self.extra} unknown), {self.batches} batches, {self.seconds:.1f} s; "
                f"{'; '.join(self.actions)}")
        return text + "".join(f"\n  {p}" for p in self.problems[:10])


@dataclass
class _Slot:
    owner_id: str
    processor: EventProcessor | None = None
    sink: SparkSink | None = None


def _plan(rng: random.Random, duration: float) -> list[tuple[float, str, int]]:
    """(time, action, slot): slot 0 starts at once; then 3 to 5 starts and stops."""
    running = {0}
    plan = [(0.0, "start", 0)]
    for at in sorted(rng.uniform(0.1, duration) for _ in range(rng.randint(3, 5))):
        stopped = [s for s in range(SLOTS) if s not in running]
        if stopped and (len(running) < 2 or rng.random() < 0.5):
            slot = rng.choice(stopped)
            running.add(slot)
            plan.append((at, "start", slot))
        else:
            slot = rng.choice(sorted(running))
            running.discard(slot)
            plan.append((at, rng.choice(["stop", "stop-unreleased"]), slot))
    if not running:
        plan.append((duration, "start", rng.randrange(SLOTS)))
    return plan


async def run_handoff(spark: Any, root: Path, *, seed: int, virtual: bool, offload: Any = None,
                      events: int = 800, partitions: int = 4, duration: float = 2.0, expiration: float = 2.0,
                      batch_sizes: tuple[int, ...] = (40, 100, 250), intervals: tuple[float, ...] = (0.1, 0.3, 0.6),
                      timeout: float = 120.0) -> HandoffOutcome:
    """Run the scenario of ``seed`` into the table at ``root`` (a new directory) and read
    the table back. ``virtual``: the running loop is a VirtualTimeLoop (the store's and
    the source's clocks follow it). Each sink's ``max_events`` is one of ``batch_sizes``
    and its ``max_interval`` one of ``intervals`` (on a real cluster each batch is a
    Spark job: fewer, larger batches keep a scenario short)."""
    rng = random.Random(seed)
    loop = asyncio.get_running_loop()
    began = loop.time()
    clock = virtual_utc_clock() if virtual else None
    source = InMemoryEventSource(partitions, clock=clock) if clock else InMemoryEventSource(partitions)
    store = InMemoryCheckpointStore(clock=clock) if clock else InMemoryCheckpointStore()
    slots = [_Slot(f"p{i}") for i in range(SLOTS)]
    sinks: list[SparkSink] = []
    stopping: list[asyncio.Task[None]] = []
    actions: list[str] = []
    errors: list[str] = []

    async def on_error(error: Exception, context: Any) -> None:
        errors.append(f"{type(error).__name__}: {error}")

    async def start(slot: _Slot) -> None:
        sink = SparkSink(root, spark=spark, commit_log=store, log_name=LOG_NAME, offload=offload,
                         max_events=rng.choice(batch_sizes), max_interval=rng.choice(intervals))
        sinks.append(sink)
        slot.sink = sink
        slot.processor = EventProcessor(source, store, sink, owner_id=slot.owner_id, load_balancing_interval=0.25,
                                        partition_ownership_expiration_interval=expiration,
                                        max_batch_size=rng.choice([10, 50, 200]), rng=random.Random(rng.random()),
                                        error_handler=on_error)
        await slot.processor.start()

    def stop(slot: _Slot, release: bool) -> None:
        processor, slot.processor = slot.processor, None
        if processor is not None:
            stopping.append(asyncio.ensure_future(processor.stop(release=release)))

    produced: list[tuple[str, int]] = []

    async def produce() -> None:
        step = 10
        for i in range(0, events, step):
            for j in range(i, min(events, i + step)):
                pid = str(j % partitions)
                event = await source.send(json.dumps({"i": j}), partition_id=pid)
                produced.append((pid, event.sequence_number))
            await asyncio.sleep(duration * step / events)

    producer = asyncio.ensure_future(produce())
    for at, action, index in _plan(rng, duration):
        await asyncio.sleep(max(0.0, began + at - loop.time()))
        actions.append(f"{loop.time() - began:.2f} s {action} {slots[index].owner_id}")
        if action == "start":
            await start(slots[index])
        else:
            stop(slots[index], release=action == "stop")
    await producer
    log = CommitLog.in_store(store, LOG_NAME, fully_qualified_namespace=source.fully_qualified_namespace,
                             eventhub_name=source.eventhub_name, consumer_group="$default")
    want = {pid: source.last_sequence_number(pid) for pid in map(str, range(partitions)) if source.events(pid)}
    problems = await _until_committed(log, want, timeout)
    for slot in slots:
        stop(slot, release=True)
    await asyncio.gather(*stopping)
    for sink in sinks:
        await sink.close()
    audit = await audit_table(root, log)
    problems = errors + problems + audit.problems
    return HandoffOutcome(seed=seed, produced=len(produced), rows=sum(audit.rows.values()),
                          missing=len(audit.missing(produced)), duplicates=audit.duplicates(),
                          extra=len(audit.extra(produced)), batches=audit.batches, seconds=loop.time() - began,
                          actions=actions, problems=problems)


async def _until_committed(log: CommitLog, want: dict[str, int], timeout: float) -> list[str]:
    """Wait until the commit log's high-water marks are ``want``; the problem if not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await log.high_water_marks() != want:
        if loop.time() > deadline:
            return [f"not every event was committed within {timeout:g} s: high-water marks "
                    f"{log.known_high_water_marks()}, produced up to {want}"]
        await asyncio.sleep(0.25)
    return []


# ----------------------------------------------------------------------------- the command


def _session(args: argparse.Namespace) -> Any:
    from eventprocessor.spark import spark_session

    if args.remote:
        return spark_session(remote=args.remote)
    return spark_session(args.master, {"spark.cores.max": "1", "spark.executor.memory": "512m",
                                       "spark.ui.showConsoleProgress": "false",
                                       "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})


async def _scenarios(spark: Any, args: argparse.Namespace, workdir: Path) -> int:
    """Run the scenarios, ``args.concurrency`` at a time (each its own hub, store and
    table; their Spark jobs share the session)."""
    seeds = iter(range(args.first_seed, args.first_seed + args.scenarios))
    failed = 0

    async def worker() -> None:
        nonlocal failed
        for seed in seeds:
            root = workdir / f"seed-{seed}"
            outcome = await run_handoff(spark, root, seed=seed, virtual=False, events=args.events,
                                        duration=args.duration, expiration=args.expiration,
                                        batch_sizes=REAL_BATCH_SIZES, intervals=REAL_INTERVALS)
            failed += not outcome.ok
            print(json.dumps({"outcome": asdict(outcome)}) if args.json else outcome.describe(), flush=True)
            if outcome.ok:
                shutil.rmtree(root, ignore_errors=True)
            elif not args.json:
                print(f"  the table is kept at {root}", flush=True)

    await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.spark_handoff", description=__doc__.split("\n")[0])
    session = parser.add_mutually_exclusive_group()
    session.add_argument("--master", help="a standalone master spark://host:port (classic session)")
    session.add_argument("--remote", help="a Spark Connect URL sc://host:port")
    parser.add_argument("--scenarios", type=int, default=50)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=3, help="scenarios at a time")
    parser.add_argument("--events", type=int, default=400)
    parser.add_argument("--duration", type=float, default=1.5, help="seconds over which events arrive")
    parser.add_argument("--expiration", type=float, default=2.0, help="ownership expiration, seconds")
    parser.add_argument("--json", action="store_true", help="one JSON line per scenario")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    cluster = None
    if not args.master and not args.remote:
        from eventprocessor.emulators.spark_cluster import start_spark_cluster

        cluster = start_spark_cluster()
        args.remote = cluster.connect_url
    workdir = Path(tempfile.mkdtemp(prefix="spark-handoff-"))
    began = time.monotonic()
    try:
        spark = _session(args)
        # A first write starts the executor and warms the session up: not a scenario's cost.
        spark.createDataFrame([(1,)], "n INT").write.mode("overwrite").parquet(str(workdir / "warm-up"))
        started = time.monotonic()
        failed = asyncio.run(_scenarios(spark, args, workdir))
    finally:
        if cluster is not None:
            cluster.stop()
    seconds = time.monotonic() - started
    summary = {"scenarios": args.scenarios, "failed": failed, "seconds": round(seconds, 1),
               "session_seconds": round(started - began, 1)}
    print(json.dumps({"summary": summary}) if args.json else
          f"{args.scenarios} scenarios, {failed} failed, {seconds:.0f} s (the session's start and warm-up "
          f"{started - began:.0f} s)", flush=True)
    if failed == 0:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
