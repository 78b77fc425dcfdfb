"""The Spark sink's states on virtual time: no Spark, no threads. ``ArrowSession`` stands
in for Spark (it writes each batch's Parquet with pyarrow, laid out as Spark lays it
out) and ``VirtualOffload`` gives every blocking call of the sink a seeded duration, so
whole handoff scenarios run in well under a second each, the same way every time.

The table is read back against the commit log after each scenario
(``harness.spark_files.audit_table``): every event exactly once, and every commit entry
naming exactly the files the table holds for it. The same scenario runs for real on the
test cluster in ``tests/test_spark_handoff.py``.

``SPARK_HANDOFF_SEEDS=500 pytest tests/test_spark_sink_states.py`` runs more seeds.
"""
from __future__ import annotations

import asyncio
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from eventprocessor import CloseReason, PartitionContext
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.spark import CommitLog, SparkSink
from eventprocessor.spark.claims import Buffers, Limits
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import Ownership
from eventprocessor.testing import run_virtual
from harness.spark_files import audit_table
from harness.spark_handoff import ArrowSession, VirtualOffload, run_handoff

SEEDS = int(os.environ.get("SPARK_HANDOFF_SEEDS", "24"))


@pytest.fixture
def table_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory for the tables: in memory where the machine has /dev/shm (the sink
    fsyncs every file it stages and publishes; on a disk that is most of a scenario)."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        with tempfile.TemporaryDirectory(dir=shm, prefix="spark-states-") as directory:
            yield Path(directory)
    else:
        yield tmp_path


def test_a_batch_due_within_a_rounding_error_is_cut_now():
    """``first_at + max_interval - now`` can be a few ulps above zero at the instant the
    interval ends; waiting that long ends at the same instant, and on virtual time the
    cutter would wait so for ever."""
    async def main() -> float | None:
        buffers = Buffers(Limits(max_events=100, max_bytes=1 << 20, max_interval=0.3))
        source = InMemoryEventSource(1)
        claim = type("C", (), {"events": [], "nbytes": 0})()
        buffers.add(claim, [source.append("x", partition_id="0")])  # type: ignore[arg-type]
        await asyncio.sleep(0.8)
        buffers.first_at = asyncio.get_running_loop().time() - 0.3 + 4.4e-16
        return buffers.seconds_until_due()

    assert run_virtual(main(), start=1.1) == 0.0


async def _claim(sink: SparkSink, store: InMemoryCheckpointStore, source: InMemoryEventSource,
                 pid: str) -> tuple[object, PartitionContext]:
    [record] = await store.claim_ownership([Ownership(source.fully_qualified_namespace, source.eventhub_name,
                                                      "$default", pid, "a", epoch=1)])
    context = PartitionContext(fully_qualified_namespace=source.fully_qualified_namespace,
                               eventhub_name=source.eventhub_name, consumer_group="$default", partition_id=pid,
                               owner_id="a", epoch=record.epoch, checkpoint_store=store, is_owned=lambda: True)
    handler = sink()
    await handler.initialize(context)
    return handler, context


async def _deliver(handler, context: PartitionContext, events) -> None:
    context.last_event = events[-1]  # as the pump does before each delivery
    await handler.process_events(events, context)


def test_a_close_cancelled_mid_flush_leaves_no_batch_behind(table_dir):
    """A processor cancels a handler's ``close`` when the claim ends a second way while
    it runs (a handoff, then the processor's stop). The close was flushing: its batch
    was planned in the commit log when the cancellation came. That batch must still be
    written and committed (or its partitions' claims end); a later batch of the same
    partitions must never commit past it, which would move the high-water mark and the
    checkpoints over events the table does not hold."""
    async def main() -> None:
        source = InMemoryEventSource(2)
        for i in range(20):
            for pid in "01":
                source.append(f'{{"p": {pid}, "i": {i}}}', partition_id=pid)
        store = InMemoryCheckpointStore()
        closing: list[asyncio.Task[None]] = []

        def cancel_the_close(step: str) -> None:
            if step == "after_plan" and closing and not closing[0].done():
                closing[0].cancel()

        sink = SparkSink(table_dir / "table", spark=ArrowSession(), commit_log=store, log_name="t",
                         max_events=1000, max_interval=3600, step_hook=cancel_the_close,
                         offload=VirtualOffload(random.Random(1)))
        (h0, c0), (h1, c1) = [await _claim(sink, store, source, pid) for pid in "01"]
        await _deliver(h0, c0, source.events("0")[:10])
        await _deliver(h1, c1, source.events("1")[:10])
        closing.append(asyncio.ensure_future(h0.close(CloseReason.SHUTDOWN, c0)))
        await asyncio.gather(closing[0], return_exceptions=True)
        await _deliver(h1, c1, source.events("1")[10:])
        await sink.flush()
        await h1.close(CloseReason.SHUTDOWN, c1)
        await sink.close()

        log = CommitLog.in_store(store, "t", fully_qualified_namespace=source.fully_qualified_namespace,
                                 eventhub_name=source.eventhub_name, consumer_group="$default")
        marks = await log.high_water_marks()
        audit = await audit_table(table_dir / "table", log)
        assert not audit.problems, audit.problems
        below_marks = {(pid, seq) for pid, mark in marks.items() for seq in range(mark + 1)}
        assert audit.missing(below_marks) == [], f"committed high-water marks {marks}, events missing below them"
        assert audit.duplicates() == 0
        assert marks == {"0": 9, "1": 19}, "every event given to the sink is committed"

    run_virtual(main())


@pytest.mark.parametrize("seed", range(SEEDS))
def test_handoffs_under_load_lose_and_duplicate_nothing(seed, table_dir):
    """Three processors start, stop and stop without releasing while events arrive
    (times, batch sizes and intervals from the seed; every blocking call of each sink a
    seeded duration): the table holds every event once and agrees with the commit log."""
    outcome = run_virtual(run_handoff(ArrowSession(), table_dir / "table", seed=seed, virtual=True,
                                      offload=VirtualOffload(random.Random(seed))))
    assert outcome.ok, outcome.describe()
    assert outcome.produced == outcome.rows == 800
