"""The Spark sink on a real Spark cluster: a standalone master, one worker and a Spark
Connect server, started once for the session (``spark_cluster`` in
``tests/spark_fixtures.py``).

* In this process, over Spark Connect: both writers; a Spark call slower than the lease
  costs no lease; a stale claim ends at once and the new owner goes on.
* Processor processes (``tests/spark_cluster_worker.py``), on a classic ``spark://``
  session each and over Spark Connect: two of them read the session's Event Hubs
  emulator while events flow, one is SIGKILLed in the middle of publishing a batch, and
  the table holds every event exactly once. Ownership, checkpoints and the commit log
  are in a Blob store on Azurite: the processes share nothing but the output path.
* The sample, unchanged, with ``--master spark://...`` and with ``--remote sc://...``.

Tables are read back with the test process's own Spark Connect session: a separate
session, and a plain ``spark.read.parquet(path)``.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from eventprocessor import CloseReason, EventProcessor, PartitionContext
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.spark import METADATA_DIR, STAGING_DIR, MicroBatch, SparkSink
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import Ownership

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "spark_cluster_worker.py"

pytestmark = pytest.mark.spark


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 90.0,
                     refresh: Callable[[], Awaitable[object]] | None = None, on_timeout: str = "") -> float:
    """A safety bound, not a speed assertion. Returns the seconds it took."""
    started = time.monotonic()
    while True:
        if refresh is not None:
            await refresh()
        if condition():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise AssertionError(f"gave up waiting for {what}{on_timeout}")
        await asyncio.sleep(0.1)


def read_rows(spark: Any, path: Path) -> list[tuple[str, int, bytes]]:
    rows = spark.read.parquet(str(path)).select("partition_id", "sequence_number", "body").collect()
    return [(str(r.partition_id), int(r.sequence_number), bytes(r.body)) for r in rows]


def assert_exactly_once(rows: list[tuple[str, int, bytes]], expected: dict[tuple[str, int], bytes]) -> None:
    counts = Counter((pid, seq) for pid, seq, _ in rows)
    duplicates = {k: n for k, n in counts.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} events written more than once, e.g. {sorted(duplicates)[:5]}"
    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} events missing, e.g. {sorted(missing)[:5]}"
    extra = set(counts) - set(expected)
    assert not extra, f"{len(extra)} events nobody produced, e.g. {sorted(extra)[:5]}"
    for pid, seq, body in rows:
        assert body == expected[(pid, seq)]


def fill(source: InMemoryEventSource, per_partition: int, start: int = 0) -> dict[tuple[str, int], bytes]:
    expected = {}
    for i in range(start, start + per_partition):
        for p in range(source.partition_count):
            event = source.append(json.dumps({"p": p, "i": i}), partition_id=str(p))
            expected[(str(p), event.sequence_number)] = event.body
    return expected


# ----------------------------------------------------------------------------- in this process, over Connect


async def test_both_writers_run_unchanged_over_spark_connect(connect_spark, tmp_path):
    """The default Parquet writer and foreach_batch on a Spark Connect session (which
    raises on any use of ``_jvm`` or ``sparkContext``), the commit log in the checkpoint
    store. ``spark.read.parquet`` honours the published ``_spark_metadata`` log."""
    source = InMemoryEventSource(4)
    expected = fill(source, 100)
    store = InMemoryCheckpointStore()
    out = tmp_path / "table"
    sink = SparkSink(out, spark=connect_spark, commit_log=store, max_events=150, max_interval=0.3)
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=6, max_batch_size=50)
    await processor.start()
    await wait_until(lambda: sink.events_committed >= len(expected), "every event committed")
    await processor.stop()
    await sink.close()
    assert_exactly_once(read_rows(connect_spark, out), expected)
    entries = sorted((out / METADATA_DIR).iterdir())
    assert len(entries) == sink.batches_committed, "one _spark_metadata entry per committed batch"
    assert not any((out / STAGING_DIR).iterdir())
    assert not (out / "_eventprocessor_commits").exists(), "the commit log is in the checkpoint store"

    seen: list[tuple[int, int, MicroBatch]] = []

    def foreach_batch(df, batch_id, batch):
        seen.append((batch_id, df.count(), batch))
        df.write.mode("overwrite").parquet(str(tmp_path / "by-batch" / f"batch_id={batch_id}"))

    source2 = InMemoryEventSource(2)
    fill(source2, 60)
    store2 = InMemoryCheckpointStore()
    sink2 = SparkSink(foreach_batch=foreach_batch, commit_log=store2, log_name="by-batch", spark=connect_spark,
                      max_events=50, max_interval=0.3)
    processor2 = EventProcessor(source2, store2, sink2, load_balancing_interval=0.2,
                                partition_ownership_expiration_interval=6, max_batch_size=25)
    await processor2.start()
    await wait_until(lambda: sink2.events_committed >= 120, "120 events through foreach_batch")
    await processor2.stop()
    await sink2.close()
    assert sum(count for _, count, _ in seen) == 120
    assert [b.event_count for _, _, b in seen] == [count for _, count, _ in seen]
    assert connect_spark.read.parquet(str(tmp_path / "by-batch")).count() == 120


async def test_a_spark_call_longer_than_the_lease_costs_no_lease(connect_spark, tmp_path):
    """The first batch's foreach_batch takes three times the ownership expiration (a
    first Spark Connect query, a busy cluster). The lease is kept meanwhile (by the
    processor's heartbeat, or by renewals of the record: whichever the processor uses):
    the partition is dispatchable at every moment of the call, the record keeps its owner
    and epoch, nothing self-fences or is lost, and every batch commits once."""
    source = InMemoryEventSource(1)
    expected = fill(source, 200)
    store = InMemoryCheckpointStore()
    expiration = 3.0
    calls: list[tuple[int, int]] = []
    slow_call = {"started": threading.Event(), "ended": threading.Event()}

    def slow_then_fast(df, batch_id):
        if not calls:
            slow_call["started"].set()
            time.sleep(3 * expiration)
            slow_call["ended"].set()
        calls.append((batch_id, df.count()))

    sink = SparkSink(foreach_batch=slow_then_fast, commit_log=tmp_path / "log", spark=connect_spark,
                     max_events=100, max_interval=0.2)
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.5,
                               partition_ownership_expiration_interval=expiration, max_batch_size=100)
    await processor.start()
    await wait_until(slow_call["started"].is_set, "the slow Spark call to start", timeout=120)
    owned_during_call: list[tuple[float, frozenset[str]]] = []  # (when, what was dispatchable)
    while not slow_call["ended"].is_set():
        owned_during_call.append((time.monotonic(), frozenset(processor.owned_partitions)))
        await asyncio.sleep(0.1)
    await wait_until(lambda: sink.events_committed >= len(expected), "every event committed", timeout=120)
    stats = processor.stats
    listing = await store.list_ownership(source.fully_qualified_namespace, source.eventhub_name, "$default")
    await processor.stop()
    await sink.close()
    span = owned_during_call[-1][0] - owned_during_call[0][0]
    assert span >= 2 * expiration, f"sampled {span:.1f} s of the call: well past where an unkept lease ends"
    assert all(owned == {"0"} for _when, owned in owned_during_call), "the partition stayed owned through the call"
    assert [(r.owner_id, r.epoch) for r in listing.ownerships] == [(processor.owner_id, 1)], \
        "the record kept its owner and epoch: never expired and claimed again"
    assert (stats.self_fenced, stats.lost, stats.failed_renewals) == (0, 0, 0), stats
    assert sum(count for _, count in calls) == len(expected), "each batch written once"
    assert len({batch_id for batch_id, _ in calls}) == len(calls)
    checkpoints = await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name, "$default")
    assert [c.sequence_number for c in checkpoints] == [199]


async def test_a_batch_whose_lease_lapsed_during_spark_still_commits_when_nobody_fenced(connect_spark, tmp_path):
    """The sink does not second-guess the commit log with its lease clock: a batch whose
    claim's lease lapsed during a slow Spark call commits if no other owner fenced the
    partition (its checkpoint is then refused, harmlessly), and a new owner skips it."""
    source = InMemoryEventSource(1)
    expected = fill(source, 50)
    store = InMemoryCheckpointStore()
    [record] = await store.claim_ownership([Ownership(source.fully_qualified_namespace, source.eventhub_name,
                                                      "$default", "0", "slow", epoch=1)])
    owned = {"now": True}
    entered = threading.Event()

    def lapse_during_write(df, batch_id):
        entered.set()
        owned["now"] = False  # the lease runs out while Spark works
        df.count()

    out_log = tmp_path / "log"
    sink = SparkSink(foreach_batch=lapse_during_write, commit_log=out_log, spark=connect_spark, max_events=1000,
                     max_interval=0.1)
    context = PartitionContext(fully_qualified_namespace=source.fully_qualified_namespace,
                               eventhub_name=source.eventhub_name, consumer_group="$default", partition_id="0",
                               owner_id="slow", epoch=record.epoch, checkpoint_store=store,
                               is_owned=lambda: owned["now"])
    handler = sink()
    await handler.initialize(context)
    await handler.process_events(source.events("0"), context)
    await sink.flush()
    assert sink.batches_committed == 1 and sink.events_committed == 50
    await handler.close(CloseReason.OWNERSHIP_LOST, context)
    await sink.close()
    assert sink.committed_high_water_marks() == {"0": 49}
    assert await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name, "$default") == [], \
        "the checkpoint of a claim that lost its lease is refused"

    seen: list[int] = []
    successor_sink = SparkSink(foreach_batch=lambda df, batch_id: seen.append(df.count()), commit_log=out_log,
                               spark=connect_spark, max_events=1000, max_interval=0.1)
    successor = EventProcessor(source, store, successor_sink, owner_id="successor", load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=1.5)
    checkpoints: list[Any] = []

    async def read_checkpoints() -> None:
        checkpoints[:] = await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name,
                                                      "$default")

    await successor.start()
    await wait_until(lambda: [c.sequence_number for c in checkpoints] == [49],
                     "the successor to move the checkpoint up to the committed batch", refresh=read_checkpoints)
    source.append("late", partition_id="0")
    await wait_until(lambda: successor_sink.events_committed == 1, "the successor to write the late event")
    await successor.stop()
    await successor_sink.close()
    assert seen == [1], "the successor skipped the 50 committed events"
    assert len(expected) == 50


async def test_a_stale_claim_ends_at_once_and_the_new_owner_goes_on(connect_spark, tmp_path):
    """Two zombies of partition 0 (their claims were taken over, but nothing told their
    processors yet: ``is_owned`` stays true). One starts after the new owner fenced the
    commit log (a stale fence); one was writing a batch when it happened (a refused
    commit). Each gives its attempt up and ends its claim at once (the processor is told
    the partition is lost, instead of dispatching events to a dead handler until its
    lease runs out); nothing waits on them; the new owner writes every event once."""
    source = InMemoryEventSource(1)
    expected = fill(source, 120)
    store = InMemoryCheckpointStore()
    out = tmp_path / "table"
    scope = (source.fully_qualified_namespace, source.eventhub_name, "$default")
    [record] = await store.claim_ownership([Ownership(*scope, "0", "writing-zombie", epoch=1)])
    entered, release = threading.Event(), threading.Event()

    def stall(table):
        entered.set()
        release.wait(60)
        return {}

    lost: dict[str, float] = {}

    def zombie_context(owner: str, epoch: int) -> PartitionContext:
        return PartitionContext(fully_qualified_namespace=scope[0], eventhub_name=scope[1], consumer_group=scope[2],
                                partition_id="0", owner_id=owner, epoch=epoch, checkpoint_store=store,
                                is_owned=lambda: True,
                                on_ownership_lost=lambda: lost.setdefault(owner, time.monotonic()))

    writing_sink = SparkSink(out, spark=connect_spark, commit_log=store, decode=stall, max_events=1000,
                             max_interval=0.1)
    writing = writing_sink()
    writing_ctx = zombie_context("writing-zombie", record.epoch)
    await writing.initialize(writing_ctx)
    await writing.process_events(source.events("0")[:60], writing_ctx)
    await wait_until(entered.is_set, "the zombie's batch to be in Spark")

    sink = SparkSink(out, spark=connect_spark, commit_log=store, max_events=1000, max_interval=0.1)
    successor = EventProcessor(source, store, sink, owner_id="successor", load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=1.5)
    await successor.start()  # claims the partition once the zombie's record expires (epoch 2)
    await wait_until(lambda: sink.events_committed == len(expected), "the successor to commit everything")

    # A zombie that starts now: its fence is stale.
    late_sink = SparkSink(out, spark=connect_spark, commit_log=store, max_events=1000, max_interval=0.1)
    late = late_sink()
    late_ctx = zombie_context("late-zombie", record.epoch)
    began = time.monotonic()
    await late.initialize(late_ctx)
    await late.process_events(source.events("0"), late_ctx)  # returns at once: nothing is buffered
    await late_sink.flush()
    assert "late-zombie" in lost, "a stale fence ends the claim at once"
    assert time.monotonic() - began < 30
    assert late_sink.events_committed == 0

    release.set()
    await writing_sink.flush()  # the writing zombie's commit is refused
    await wait_until(lambda: "writing-zombie" in lost, "the refused zombie's claim to end")
    await writing.process_events(source.events("0")[60:], writing_ctx)  # nothing more is taken
    await writing_sink.flush()
    await writing.close(CloseReason.OWNERSHIP_LOST, writing_ctx)
    await late.close(CloseReason.OWNERSHIP_LOST, late_ctx)
    for zombie_sink in (writing_sink, late_sink):
        await asyncio.wait_for(zombie_sink.close(), 30)
        assert zombie_sink.batches_committed == 0
    await successor.stop()
    await sink.close()
    assert_exactly_once(read_rows(connect_spark, out), expected)
    assert not any((out / STAGING_DIR).iterdir()), "the zombie's staged files are gone"


# ----------------------------------------------------------------------------- processor processes


async def _partition_counts(conn: str, hub: str) -> dict[str, int]:
    from azure.eventhub.aio import EventHubProducerClient

    producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
    async with producer:
        return {pid: (await producer.get_partition_properties(pid))["last_enqueued_sequence_number"] + 1
                for pid in await producer.get_partition_ids()}


class Worker:
    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name, self.process, self.log = name, process, log

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def tail(self, chars: int = 4000) -> str:
        return f"\n--- {self.name} (exit {self.process.returncode}) ---\n{self.text()[-chars:]}"

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 60)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


async def spawn(name: str, *, mode: str, url: str, hub: str, container: str, path: Path, env: dict[str, str],
                workdir: Path, kill_at: str | None = None) -> Worker:
    own = workdir / name
    own.mkdir(parents=True)
    run_env = dict(env, TMPDIR=str(own))
    if kill_at:
        run_env["EVENTPROCESSOR_SPARK_KILL_AT"] = kill_at
    log = own / "worker.log"
    with open(log, "wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), "--hub", hub, "--container", container, "--path", str(path), "--mode", mode,
            "--spark", url, "--owner", name, env=run_env, cwd=str(own), stdout=out, stderr=asyncio.subprocess.STDOUT)
    return Worker(name, process, log)


@pytest.mark.slow
@pytest.mark.azurite
@pytest.mark.eventhubs
@pytest.mark.parametrize("mode", ["classic", "connect"])
async def test_two_processor_processes_one_sigkilled_write_each_event_once(mode, spark_cluster, connect_spark, azurite,
                                                                         eventhubs_emulator, tmp_path):
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    from eventprocessor.sources.eventhub import EventHubSource
    from eventprocessor.spark import CommitLog
    from eventprocessor.stores import BlobCheckpointStore

    conn = eventhubs_emulator.connection_string
    hub = eventhubs_emulator.fresh_hub(4)
    container = f"spark-cluster-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "table"
    url = spark_cluster.master_url if mode == "classic" else spark_cluster.connect_url
    assert url is not None
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               EVENTPROCESSOR_TEST_HUB=conn, EVENTPROCESSOR_TEST_STORAGE=azurite.connection_string)
    workers: list[Worker] = []
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    source = EventHubSource.from_connection_string(conn, eventhub_name=hub)
    log = CommitLog.in_store(store, str(SparkSink(str(out), commit_log=store).log_name),
                             fully_qualified_namespace=source.fully_qualified_namespace, eventhub_name=hub,
                             consumer_group="$default")
    total, rate = 2400, 300.0
    try:
        victim = await spawn("victim", mode=mode, url=url, hub=hub, container=container, path=out, env=env,
                             workdir=tmp_path, kill_at="mid_publish:3")
        survivor = await spawn("survivor", mode=mode, url=url, hub=hub, container=container, path=out, env=env,
                               workdir=tmp_path)
        workers = [victim, survivor]
        diagnostics = lambda: "".join(w.tail() for w in workers)  # noqa: E731
        await wait_until(lambda: all("starts partition" in w.text() for w in workers),
                         "both processes to start partitions", timeout=180, on_timeout=diagnostics())

        producer = EventHubProducerClient.from_connection_string(conn, eventhub_name=hub)
        sent: dict[str, int] = {str(p): 0 for p in range(4)}
        async with producer:
            started = time.monotonic()
            produced = 0
            while produced < total:
                pid = str((produced // 20) % 4)
                await producer.send_batch([EventData(f"{pid}:{sent[pid] + i}") for i in range(20)], partition_id=pid)
                sent[pid] += 20
                produced += 20
                delay = started + produced / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
        counts = await _partition_counts(conn, hub)
        assert counts == sent
        await wait_until(lambda: victim.process.returncode is not None, "the victim to die", timeout=120,
                         on_timeout=diagnostics())
        assert victim.process.returncode == -signal.SIGKILL, diagnostics()
        assert "killing this process at mid_publish:3" in victim.text()
        want = {pid: count - 1 for pid, count in counts.items()}
        await wait_until(lambda: log.known_high_water_marks() == want, "every produced event committed",
                         timeout=240, refresh=log.refresh, on_timeout=diagnostics())
        await survivor.stop()
        assert survivor.process.returncode == 0, diagnostics()
    finally:
        for worker in workers:
            await worker.stop()
        await store.close()
        await source.close()

    expected = {(pid, seq): f"{pid}:{seq}".encode() for pid, count in counts.items() for seq in range(count)}
    assert_exactly_once(read_rows(connect_spark, out), expected)
    assert "rolled committed batch" in survivor.text(), "the survivor rolled the half-published batch forward"
    assert not any((out / STAGING_DIR).iterdir())
    assert not (out / "_eventprocessor_commits").exists(), "no commit log on disk: it is in the Blob store"


# ----------------------------------------------------------------------------- the sample


@pytest.mark.slow
@pytest.mark.azurite
async def test_the_sample_runs_unchanged_on_the_cluster_both_ways(spark_cluster, connect_spark, tmp_path):
    """``samples/spark_consumer.py --store blob --master spark://...`` and ``--remote
    sc://...``, side by side; each table, read back by this process's own session, holds
    every produced event exactly once."""
    events = 4000
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               TMPDIR=str(tmp_path))

    async def run(flag: str, url: str | None) -> tuple[Path, str, int | None]:
        assert url is not None
        out = tmp_path / flag.strip("-") / "table"
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(ROOT / "samples" / "spark_consumer.py"), "--store", "blob", flag, url,
            "--output", str(out), "--events", str(events), "--max-events", "1000", cwd=str(ROOT), env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(process.communicate(), 300)
        return out, output.decode(errors="replace"), process.returncode

    for out, text, code in await asyncio.gather(run("--master", spark_cluster.master_url),
                                                run("--remote", spark_cluster.connect_url)):
        assert code == 0, text[-4000:]
        assert f"{events} distinct events, {events} produced" in text
        rows = [(str(r.partition_id), int(r.sequence_number)) for r in
                connect_spark.read.parquet(str(out)).select("partition_id", "sequence_number").collect()]
        assert len(rows) == len(set(rows)) == events
        per_partition: dict[str, list[int]] = {}
        for pid, seq in rows:
            per_partition.setdefault(pid, []).append(seq)
        for pid, seqs in per_partition.items():
            assert sorted(seqs) == list(range(len(seqs))), f"partition {pid} has gaps or duplicates"
