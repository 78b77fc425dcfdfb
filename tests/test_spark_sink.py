"""The Spark sink end to end: real Spark (one session for the run), real Parquet, the
in-memory event source and store, and real processes killed with SIGKILL."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import pyarrow as pa
import pytest

from eventprocessor import CloseReason, EventProcessor, LoadBalancingStrategy
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.spark import EVENT_SCHEMA, STAGING_DIR, MicroBatch, SparkSink, events_to_table, json_body
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import ManualClock
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "spark_sink_worker.py"

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark():
    """One SparkSession for the whole test run (starting one takes ~8 s)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        unavailable("pyspark is not installed")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        unavailable("Java is not installed (PySpark needs it)")
    from eventprocessor.spark import spark_session

    try:
        session = spark_session("local[2]", {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2"})
    except Exception as error:  # the JVM did not start
        unavailable(f"Spark could not start: {error!r}")
        raise
    yield session
    session.stop()


async def wait_until(condition: Callable[[], bool], what: str, timeout: float = 90.0,
                     refresh: Callable[[], Awaitable[object]] | None = None) -> None:
    """A safety bound, not a speed assertion: fails only if the condition never holds.
    ``refresh`` is awaited before each look (e.g. to read the commit log)."""
    deadline = time.monotonic() + timeout
    while True:
        if refresh is not None:
            await refresh()
        if condition():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await asyncio.sleep(0.05)


def read_rows(spark, path) -> list[tuple[str, int, bytes]]:
    rows = spark.read.parquet(str(path)).select("partition_id", "sequence_number", "body").collect()
    return [(str(r.partition_id), int(r.sequence_number), bytes(r.body)) for r in rows]


def assert_exactly_once(rows, expected: dict[tuple[str, int], bytes]) -> None:
    counts = Counter((pid, seq) for pid, seq, _ in rows)
    duplicates = {k: n for k, n in counts.items() if n > 1}
    assert not duplicates, f"{len(duplicates)} events written more than once, e.g. {sorted(duplicates)[:5]}"
    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} events missing, e.g. {sorted(missing)[:5]}"
    assert len(rows) == len(expected)
    for pid, seq, body in rows:
        assert body == expected[(pid, seq)]


def fill(source: InMemoryEventSource, per_partition: int, start: int = 0) -> dict[tuple[str, int], bytes]:
    expected = {}
    for i in range(start, start + per_partition):
        for p in range(source.partition_count):
            event = source.append(json.dumps({"p": p, "i": i}), partition_id=str(p), properties={"i": i})
            expected[(str(p), event.sequence_number)] = event.body
    return expected


# ---------------------------------------------------------------- no Spark needed


def test_events_become_arrow_columns_with_the_documented_schema():
    source = InMemoryEventSource(2)
    a = source.append(b"\x00\x01", partition_id="0", properties={"n": 1, "b": b"x", "s": "y"})
    b = source.append("hi", partition_key="device-7")
    table = events_to_table([("0", [a]), (source.partition_for_key("device-7"), [b])])
    assert table.schema == EVENT_SCHEMA
    assert table.num_rows == 2
    assert table["body"].to_pylist() == [b"\x00\x01", b"hi"]
    assert table["partition_key"].to_pylist() == [None, "device-7"]
    assert dict(table["properties"][0].as_py()) == {"n": "1", "b": "x", "s": "y"}
    assert table["properties"][1].as_py() is None
    assert table["sequence_number"].to_pylist() == [a.sequence_number, b.sequence_number]


def test_bodies_with_bytes_fill_the_body_column_and_the_others_are_refused_by_name():
    """Several data sections are joined (as ``Event.body``), a binary or text AMQP value
    is its bytes; a sequence body or another value has no bytes form: a TypeError naming
    the event, never an empty or made-up body."""
    source = InMemoryEventSource(1)
    events = [source.append([b"aa", b"bb"]), source.append(value_body=b"bin"), source.append(value_body="text"),
              source.append(value_body=None)]
    assert events_to_table([("0", events)])["body"].to_pylist() == [b"aabb", b"bin", b"text", b""]
    for body, what in [({"sequence_body": [b"message", 123.456, True]}, "a sequence body"),
                       ({"value_body": {b"key": [-123, b"data", False]}}, r"an AMQP value body \(dict\)"),
                       ({"value_body": 7}, r"an AMQP value body \(int\)")]:
        odd = source.append(**body)
        with pytest.raises(TypeError, match=f"event {odd.sequence_number} of partition 0 has {what}, which has no "
                                            "bytes form.*send data bodies"):
            events_to_table([("0", events + [odd])])


def test_json_body_decodes_columns_or_a_struct_in_one_pass():
    source = InMemoryEventSource(1)
    events = [source.append(json.dumps({"user": f"u{i}", "amount": i / 2}, indent=2)) for i in range(3)]
    table = events_to_table([("0", events)])
    schema = pa.schema([("user", pa.string()), ("amount", pa.float64()), ("absent", pa.int64())])
    columns = json_body(schema)(table)
    assert columns["user"].to_pylist() == ["u0", "u1", "u2"]
    assert columns["amount"].to_pylist() == [0.0, 0.5, 1.0]
    assert columns["absent"].to_pylist() == [None, None, None]
    struct = json_body(schema, column="payload")(table)["payload"]
    assert struct[1].as_py() == {"user": "u1", "amount": 0.5, "absent": None}


def test_bad_configuration_is_named():
    from eventprocessor.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="foreach_batch needs commit_log"):
        SparkSink(foreach_batch=lambda df, batch_id: None)
    with pytest.raises(ConfigurationError, match="needs log_name"):
        SparkSink(foreach_batch=lambda df, batch_id: None, commit_log=InMemoryCheckpointStore())
    with pytest.raises(ConfigurationError, match="max_events"):
        SparkSink("/tmp/x", max_events=0)
    with pytest.raises(ConfigurationError, match="not a local path: pass commit_log"):
        SparkSink("s3a://bucket/table")
    with pytest.raises(ConfigurationError, match="POSIX"):
        SparkSink("s3a://bucket/table", commit_log="s3a://bucket/log")
    with pytest.raises(ConfigurationError, match="either path"):
        SparkSink("/tmp/x", foreach_batch=lambda df, batch_id: None, commit_log="/tmp/y")
    with pytest.raises(ConfigurationError, match="either master"):
        SparkSink("/tmp/x", master="local[1]", remote="sc://127.0.0.1:1")
    with pytest.raises(ConfigurationError, match="on_poison"):
        SparkSink("/tmp/x", on_poison="ignore")
    # A remote output with the commit log in the store is fine, and touches nothing yet.
    sink = SparkSink("abfss://lake@account.dfs.core.windows.net/events", commit_log=InMemoryCheckpointStore())
    assert sink.log_name is not None and sink.log_name.startswith("spark-sink-")


def test_importing_eventprocessor_does_not_import_pyspark():
    code = "import sys, eventprocessor, eventprocessor.stores; assert 'pyspark' not in sys.modules; print('ok')"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "ok", result.stderr


# ---------------------------------------------------------------- with Spark


async def test_four_partitions_into_parquet_every_event_exactly_once(spark, tmp_path):
    source = InMemoryEventSource(4)
    expected = fill(source, 150)
    out = tmp_path / "table"
    sink = SparkSink(out, spark=spark, max_events=250, max_interval=0.3,
                     decode=json_body(pa.schema([("p", pa.int64()), ("i", pa.int64())])))
    store = InMemoryCheckpointStore()
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=5, max_batch_size=50)
    await processor.start()
    await wait_until(lambda: sink.events_committed >= len(expected), "all events committed")
    expected.update(fill(source, 20, start=150))  # more while running
    await wait_until(lambda: sink.events_committed >= len(expected), "the late events committed")
    await processor.stop()
    await sink.close()

    assert_exactly_once(read_rows(spark, out), expected)
    df = spark.read.parquet(str(out))
    assert {f.name: f.dataType.simpleString() for f in df.schema.fields} == {
        "sequence_number": "bigint", "offset": "string", "enqueued_time": "timestamp", "partition_key": "string",
        "body": "binary", "properties": "map<string,string>", "p": "bigint", "i": "bigint",
        "partition_id": "string"}
    sample = df.where("partition_id = '2' AND i = 7").collect()[0]
    assert (sample.p, sample.properties["i"]) == (2, "7")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith("_")) == [
        f"partition_id={p}" for p in range(4)]
    assert not any((out / STAGING_DIR).iterdir())
    # Checkpoints advanced to the end of every partition, only through committed batches.
    checkpoints = {c.partition_id: c.sequence_number for c in await store.list_checkpoints(
        source.fully_qualified_namespace, source.eventhub_name, "$default")}
    assert checkpoints == {str(p): source.last_sequence_number(str(p)) for p in range(4)}
    assert sink.committed_high_water_marks() == checkpoints


async def test_foreach_batch_gets_batches_cut_by_events_bytes_and_interval(spark, tmp_path):
    source = InMemoryEventSource(1)
    for _i in range(250):
        source.append(b"x" * 100, partition_id="0")
    seen: list[tuple[int, int, MicroBatch]] = []

    def foreach_batch(df, batch_id, batch):
        seen.append((batch_id, df.count(), batch))

    sink = SparkSink(foreach_batch=foreach_batch, commit_log=tmp_path / "log", spark=spark,
                     max_events=100, max_interval=1.5)
    processor = EventProcessor(source, InMemoryCheckpointStore(), sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=5, max_batch_size=50)
    await processor.start()
    await wait_until(lambda: sink.events_committed >= 250, "250 events")
    # Then max_bytes alone (the interval is longer than the test may wait): at most
    # 25 bodies of 100 bytes per batch, delivered 50 at a time.
    sink.max_events, sink.max_interval, sink.max_bytes = 10_000, 600.0, 2500
    for _i in range(100):
        source.append(b"y" * 100, partition_id="0")
    await wait_until(lambda: sink.events_committed >= 350, "350 events")
    await processor.stop()
    await sink.close()

    assert [count for _, count, _ in seen] == [100, 100, 50, 25, 25, 25, 25]
    assert [batch.event_count for _, _, batch in seen] == [100, 100, 50, 25, 25, 25, 25]
    batch_ids = [batch_id for batch_id, _, _ in seen]
    assert batch_ids == sorted(set(batch_ids))
    ranges = [(b.ranges["0"].first_sequence_number, b.ranges["0"].last_sequence_number) for _, _, b in seen]
    assert ranges == [(0, 99), (100, 199), (200, 249), (250, 274), (275, 299), (300, 324), (325, 349)]


async def test_two_processors_with_one_stopped_mid_stream_write_each_event_once(spark, tmp_path):
    source = InMemoryEventSource(4)
    expected = fill(source, 100)
    out = tmp_path / "table"
    store = InMemoryCheckpointStore()

    def make(owner: str) -> tuple[EventProcessor, SparkSink]:
        sink = SparkSink(out, spark=spark, max_events=120, max_interval=0.2)
        return EventProcessor(source, store, sink, owner_id=owner, load_balancing_interval=0.2,
                              partition_ownership_expiration_interval=3, max_batch_size=20), sink

    first, first_sink = make("first")
    second, second_sink = make("second")
    await first.start()
    await wait_until(lambda: len(first.owned_partitions) == 4, "the first processor to own everything")
    await second.start()  # steals half of the partitions, possibly mid-batch
    producing = True

    async def produce() -> None:
        i = 100
        while producing and i < 400:
            expected.update(fill(source, 5, start=i))
            i += 5
            await asyncio.sleep(0.05)

    producer = asyncio.create_task(produce())
    await wait_until(lambda: len(second.owned_partitions) == 2 and len(first.owned_partitions) == 2,
                     "a balanced split")
    await wait_until(lambda: first_sink.events_committed > 0 and second_sink.events_committed > 0,
                     "both processors to commit")
    await first.stop(release=False)  # like a crash: its records have to expire first
    await wait_until(lambda: len(second.owned_partitions) == 4, "the second processor to take over")
    producing = False
    await producer
    total = len(expected)
    await wait_until(lambda: sum(second_sink.committed_high_water_marks().get(str(p), -1) + 1
                                 for p in range(4)) == total, "everything committed",
                     refresh=second_sink.high_water_marks)
    await second.stop()
    await first_sink.close()
    await second_sink.close()
    assert_exactly_once(read_rows(spark, out), expected)


async def test_an_owner_that_lost_its_partition_mid_batch_writes_none_of_it(spark, tmp_path):
    """The zombie: its own clock says it still owns the partition (no self-fencing
    yet), but another processor has claimed it. Its batch is blocked in the middle
    until the new owner has fenced and written; then it must not commit."""
    source = InMemoryEventSource(1)
    expected = fill(source, 100)
    out = tmp_path / "table"
    store = InMemoryCheckpointStore()
    entered, release = threading.Event(), threading.Event()

    def stall_first_batch(table: pa.Table) -> dict:
        entered.set()
        release.wait(60)
        return {}

    zombie_sink = SparkSink(out, spark=spark, decode=stall_first_batch, max_events=1000, max_interval=0.1)
    zombie = EventProcessor(source, store, zombie_sink, owner_id="zombie", clock=ManualClock(),
                            load_balancing_interval=0.5, partition_ownership_expiration_interval=1.5)
    await zombie.balance_once()  # claims the partition and never renews it
    await wait_until(entered.is_set, "the zombie's batch to start")

    sink = SparkSink(out, spark=spark, max_events=1000, max_interval=0.1)
    successor = EventProcessor(source, store, sink, owner_id="successor", load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=1.5,
                               load_balancing_strategy=LoadBalancingStrategy.GREEDY)
    await successor.start()
    await wait_until(lambda: sink.events_committed == 100, "the successor to commit everything")
    release.set()
    await zombie_sink.close()  # waits for the zombie's batch to end
    assert zombie_sink.batches_committed == 0
    assert sink.committed_high_water_marks() == {"0": 99}
    await successor.stop()
    await zombie.stop(release=False)
    await sink.close()
    assert_exactly_once(read_rows(spark, out), expected)
    assert not any((out / STAGING_DIR).iterdir())


async def test_a_zombie_whose_foreach_batch_ran_cannot_commit_after_the_new_owner_fenced(spark, tmp_path, caplog):
    """The commit itself is conditional. The zombie is the sink's handler driven the way
    a pump drives it, by a claim that never learns it was taken over (a paused process:
    ``is_owned`` stays true). Its foreach_batch returns after the successor has fenced
    the partition and written it; the commit log refuses the zombie's commit."""
    from eventprocessor import PartitionContext
    from eventprocessor.stores.records import Ownership

    caplog.set_level(logging.INFO, logger="eventprocessor.spark.pipeline")  # a handoff's give-up is INFO
    source = InMemoryEventSource(1)
    fill(source, 50)
    store = InMemoryCheckpointStore()
    log_dir = tmp_path / "log"
    [record] = await store.claim_ownership([Ownership(source.fully_qualified_namespace, source.eventhub_name,
                                                      "$default", "0", "zombie", epoch=1)])
    entered, release = threading.Event(), threading.Event()
    zombie_calls: list[int] = []

    def zombie_foreach_batch(df, batch_id):
        zombie_calls.append(batch_id)
        entered.set()
        release.wait(60)

    zombie_sink = SparkSink(foreach_batch=zombie_foreach_batch, commit_log=log_dir, spark=spark,
                            max_events=1000, max_interval=0.1)
    context = PartitionContext(fully_qualified_namespace=source.fully_qualified_namespace,
                               eventhub_name=source.eventhub_name, consumer_group="$default", partition_id="0",
                               owner_id="zombie", epoch=record.epoch, checkpoint_store=store,
                               is_owned=lambda: True)
    handler = zombie_sink()
    await handler.initialize(context)
    await handler.process_events(source.events("0"), context)
    await wait_until(entered.is_set, "the zombie's foreach_batch to start")

    committed: list[tuple[int, int, int]] = []

    def successor_foreach_batch(df, batch_id, batch):
        r = batch.ranges["0"]
        committed.append((batch_id, r.first_sequence_number, r.last_sequence_number))

    sink = SparkSink(foreach_batch=successor_foreach_batch, commit_log=log_dir, spark=spark,
                     max_events=1000, max_interval=0.1)
    successor = EventProcessor(source, store, sink, owner_id="successor", load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=1.5)
    await successor.start()  # claims the partition once the zombie's record expires
    await wait_until(lambda: sink.events_committed == 50, "the successor to commit everything")
    release.set()
    await zombie_sink.flush()  # the zombie's batch ends: refused
    await handler.close(CloseReason.OWNERSHIP_LOST, context)
    await zombie_sink.close()
    await successor.stop()
    await sink.close()

    assert zombie_sink.batches_committed == 0
    assert f"batch {zombie_calls[0]} was aborted (partitions ['0'] fenced by a newer claim)" in caplog.text
    assert zombie_calls and len(set(zombie_calls)) == 1
    outcomes = {batch_id: outcome for batch_id, outcome, _ranges in await sink.commit_log.batches()}
    assert outcomes[zombie_calls[0]] == "aborted"
    assert [(first, last) for _, first, last in committed] == [(0, 49)]
    assert outcomes[committed[0][0]] == "committed"
    checkpoints = await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name, "$default")
    assert [(c.owner_id, c.sequence_number) for c in checkpoints] == [("successor", 49)]


async def test_a_reader_sees_whole_batches_only_across_compactions(spark, tmp_path):
    """While a batch's files are being moved into the table, a plain
    ``spark.read.parquet`` still sees exactly the batches before it: Spark reads what
    ``_spark_metadata`` lists, and a batch is listed only once all its files are in place.
    21 batches: the metadata log is compacted twice on the way."""
    source = InMemoryEventSource(2)
    expected = fill(source, 420)
    out = tmp_path / "table"
    seen_mid_publish: list[tuple[int, int]] = []

    def look(step: str) -> None:
        if step == "mid_publish":  # one file of the batch moved, its metadata entry not written yet
            seen_mid_publish.append((sink.events_committed, spark.read.parquet(str(out)).count()
                                     if (out / "_spark_metadata").exists() else 0))

    sink = SparkSink(out, spark=spark, max_events=40, max_interval=0.2, step_hook=look)
    processor = EventProcessor(source, InMemoryCheckpointStore(), sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=10, max_batch_size=20, prefetch=40)
    await processor.start()
    await wait_until(lambda: sink.events_committed >= len(expected), "every event committed", timeout=240)
    await processor.stop()
    await sink.close()
    assert sink.batches_committed == 21
    assert len(seen_mid_publish) == 21
    assert all(visible == committed for committed, visible in seen_mid_publish), seen_mid_publish
    assert {"9.compact", "19.compact", "20"} <= {p.name for p in (out / "_spark_metadata").iterdir()}
    assert_exactly_once(read_rows(spark, out), expected)


async def test_a_failing_foreach_batch_is_retried_a_bounded_number_of_times_then_parked(spark, tmp_path):
    """The retry policy of handler errors, for batches: the same batch_id and data each
    time, exponential backoff, ``max_delivery_attempts`` in all; then (PARK, the sink's
    default) the batch is given up and its partition parked: nothing is checkpointed past
    it, nothing after it is written, and nothing waits forever."""
    from eventprocessor.errors import PoisonEventsError
    from eventprocessor.policies import RetryPolicy

    source = InMemoryEventSource(2)
    fill(source, 30)
    store = InMemoryCheckpointStore()
    calls: list[tuple[int, str]] = []

    def broken_for_partition_1(df, batch_id, batch):
        calls.append((batch_id, ",".join(sorted(batch.ranges))))
        if "1" in batch.ranges:
            raise ValueError("cannot write partition 1")

    sink = SparkSink(foreach_batch=broken_for_partition_1, commit_log=tmp_path / "log", spark=spark, max_events=30,
                     max_interval=0.2, retry_policy=RetryPolicy(max_delivery_attempts=3, retry_backoff=0.05))
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=10, max_batch_size=30)
    await processor.start()
    await wait_until(lambda: "1" in sink.parked, "partition 1 to be parked")
    await wait_until(lambda: sink.committed_high_water_marks().get("0") == 29, "partition 0 written")
    source.append("more", partition_id="1")
    source.append("more", partition_id="0")
    await wait_until(lambda: sink.committed_high_water_marks().get("0") == 30, "partition 0 goes on")
    await processor.stop()
    await sink.close()
    failing = [batch_id for batch_id, partitions in calls if "1" in partitions.split(",")]
    assert len(failing) == 3 and len(set(failing)) == 1, "three attempts of the same batch"
    assert isinstance(sink.parked["1"], PoisonEventsError) and isinstance(sink.last_error, PoisonEventsError)
    assert sink.parked["1"].attempts == 3
    assert "1" not in sink.committed_high_water_marks()
    checkpoints = {c.partition_id: c.sequence_number for c in await store.list_checkpoints(
        source.fully_qualified_namespace, source.eventhub_name, "$default") if c.sequence_number >= 0}
    assert checkpoints == {"0": 30}, "nothing of the parked partition is checkpointed"


async def test_a_poison_batch_is_skipped_through_dead_letter_when_the_policy_says_so(spark, tmp_path):
    from eventprocessor.policies import RetryPolicy

    source = InMemoryEventSource(1)
    fill(source, 20)
    store = InMemoryCheckpointStore()
    written: list[int] = []
    dead: list[tuple[str, int, int]] = []

    def first_batch_breaks(df, batch_id, batch):
        if batch.ranges["0"].first_sequence_number == 0:
            raise RuntimeError("poison")
        written.append(df.count())

    async def dead_letter(events, error, context):
        dead.append((context.partition_id, events[0].sequence_number, len(events)))

    sink = SparkSink(foreach_batch=first_batch_breaks, commit_log=tmp_path / "log", spark=spark, max_events=10,
                     max_interval=0.2, retry_policy=RetryPolicy(max_delivery_attempts=2, retry_backoff=0.05),
                     on_poison="skip", dead_letter=dead_letter)
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=10, max_batch_size=10)
    await processor.start()
    await wait_until(lambda: sink.committed_high_water_marks().get("0") == 19, "both batches through")
    await processor.stop()
    await sink.close()
    assert dead == [("0", 0, 10)]
    assert written == [10]
    assert sink.events_committed == 10, "a skipped batch is not counted as written"
    checkpoints = await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name, "$default")
    assert [c.sequence_number for c in checkpoints] == [19]


async def test_a_batch_with_a_value_body_fails_by_name_and_the_poison_policy_sets_it_aside(spark, tmp_path):
    """Nothing of a body without bytes reaches the table: its batch fails with the
    TypeError, is retried, then goes to dead_letter (on_poison="skip"); the batches
    around it are written."""
    from eventprocessor.policies import RetryPolicy

    source = InMemoryEventSource(1)
    for i in range(25):
        if i == 13:
            source.append(value_body={b"key": [-123, b"data", False]}, partition_id="0")
        else:
            source.append(f"event {i}", partition_id="0")
    store = InMemoryCheckpointStore()
    written: list[tuple[int, int]] = []
    dead: list[tuple[str, int, int, str]] = []

    def record(df, batch_id, batch):
        written.append((batch.ranges["0"].first_sequence_number, df.count()))

    async def dead_letter(events, error, context):
        dead.append((context.partition_id, events[0].sequence_number, len(events), repr(error.__cause__)))

    sink = SparkSink(foreach_batch=record, commit_log=tmp_path / "log", spark=spark, max_events=10,
                     max_interval=0.2, retry_policy=RetryPolicy(max_delivery_attempts=2, retry_backoff=0.05),
                     on_poison="skip", dead_letter=dead_letter)
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=10, max_batch_size=10)
    await processor.start()
    await wait_until(lambda: sink.committed_high_water_marks().get("0") == 24, "every batch through")
    await processor.stop()
    await sink.close()
    assert len(dead) == 1
    partition, first, count, cause = dead[0]
    assert partition == "0" and first <= 13 < first + count
    assert "TypeError" in cause and "event 13 of partition 0 has an AMQP value body (dict)" in cause
    assert sum(n for _first, n in written) == 25 - count, "every other event was written"


async def test_a_transient_write_failure_is_retried_with_the_same_batch_id(spark, tmp_path):
    from eventprocessor.policies import RetryPolicy

    source = InMemoryEventSource(1)
    fill(source, 10)
    calls: list[int] = []

    def flaky(df, batch_id):
        calls.append(batch_id)
        if len(calls) < 3:
            raise ConnectionError("the cluster is restarting")
        assert df.count() == 10

    sink = SparkSink(foreach_batch=flaky, commit_log=tmp_path / "log", spark=spark, max_events=10,
                     max_interval=0.2, retry_policy=RetryPolicy(max_delivery_attempts=5, retry_backoff=0.05))
    processor = EventProcessor(source, InMemoryCheckpointStore(), sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=10)
    await processor.start()
    await wait_until(lambda: sink.events_committed == 10, "the batch written")
    await processor.stop()
    await sink.close()
    assert len(calls) == 3 and len(set(calls)) == 1
    assert not sink.parked


async def test_a_claim_adopted_again_with_the_same_epoch_does_not_write_twice(spark, tmp_path):
    """The processor's lease of a partition runs out in the middle of a batch (a slow
    store), the claim ends, and the processor adopts its own ownership record again: same
    owner, same epoch, a new claim reading from the checkpoint. The first claim's batch,
    still in Spark, must not commit next to the second claim's (found on the cluster:
    200 events written twice)."""
    from eventprocessor import PartitionContext
    from eventprocessor.stores.records import Ownership

    source = InMemoryEventSource(1)
    expected = fill(source, 80)
    store = InMemoryCheckpointStore()
    [record] = await store.claim_ownership([Ownership(source.fully_qualified_namespace, source.eventhub_name,
                                                      "$default", "0", "p", epoch=1)])
    out = tmp_path / "table"
    entered, release = threading.Event(), threading.Event()
    calls = {"n": 0}

    def stall_the_first_batch(table):
        calls["n"] += 1
        if calls["n"] == 1:
            entered.set()
            release.wait(30)
        return {}

    sink = SparkSink(out, spark=spark, decode=stall_the_first_batch, max_events=50, max_interval=0.1)

    def context() -> PartitionContext:
        return PartitionContext(fully_qualified_namespace=source.fully_qualified_namespace,
                                eventhub_name=source.eventhub_name, consumer_group="$default", partition_id="0",
                                owner_id="p", epoch=record.epoch, checkpoint_store=store, is_owned=lambda: True)

    first, first_ctx = sink(), context()
    await first.initialize(first_ctx)
    await first.process_events(source.events("0")[:50], first_ctx)
    await wait_until(entered.is_set, "the first claim's batch to be in Spark")
    await first.close(CloseReason.OWNERSHIP_LOST, first_ctx)  # the lease ran out

    second, second_ctx = sink(), context()  # adopted again: same owner, same epoch
    await second.initialize(second_ctx)  # its fence is in the log before the first batch commits
    adding = asyncio.create_task(second.process_events(source.events("0"), second_ctx))
    await asyncio.sleep(0.2)
    release.set()
    await adding
    await sink.flush()
    await second.close(CloseReason.SHUTDOWN, second_ctx)
    await sink.close()
    assert_exactly_once(read_rows(spark, out), expected)
    assert sink.committed_high_water_marks() == {"0": 79}


class FlakyLogStore(InMemoryCheckpointStore):
    """A checkpoint store whose log-entry writes time out a given number of times, the
    first of them after the write landed (the answer was lost), like a store outage."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def create_entry(self, *args, **kwargs) -> bool:
        from eventprocessor.errors import StoreTimeoutError

        if self.failures > 0 and b'"commit"' in args[-1]:
            self.failures -= 1
            if self.failures % 2 == 1:
                await super().create_entry(*args, **kwargs)  # landed, but the answer was lost
            raise StoreTimeoutError("the store did not answer in time")
        return await super().create_entry(*args, **kwargs)


async def test_a_commit_log_outage_is_ridden_out_and_each_batch_committed_once(spark, tmp_path):
    source = InMemoryEventSource(2)
    expected = fill(source, 60)
    store = FlakyLogStore(failures=4)
    out = tmp_path / "table"
    sink = SparkSink(out, spark=spark, commit_log=store, max_events=40, max_interval=0.2)
    processor = EventProcessor(source, store, sink, load_balancing_interval=0.2,
                               partition_ownership_expiration_interval=10, max_batch_size=20)
    await processor.start()
    await wait_until(lambda: sink.events_committed >= len(expected), "every event committed")
    await processor.stop()
    await sink.close()
    assert store.failures == 0
    assert "did not answer" in repr(sink.last_error)
    assert_exactly_once(read_rows(spark, out), expected)


@pytest.mark.slow
@pytest.mark.azurite
async def test_sigkill_at_every_step_of_a_batch_then_restart_writes_each_event_once(spark, azurite, tmp_path):
    """Four processes die by SIGKILL in their first batch: after the data is staged
    (before the commit), after the commit with only one of the batch's files moved
    into the table, after all files moved (before the store checkpoint), and after the
    checkpoint. A fifth finishes.
    Ownership and checkpoints live in a BlobCheckpointStore on Azurite, so each
    restart is a new claim (higher epoch) resuming from the store's checkpoints. Each
    event is in the table once."""
    from eventprocessor.stores import BlobCheckpointStore

    out = tmp_path / "table"
    partitions, events = 4, 400  # 8 batches: every run finds batches left to write
    container = f"spark-kill-{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1",
               EVENTPROCESSOR_TEST_STORAGE=azurite.connection_string)
    logs = []
    for kill_at in ("after_write", "mid_publish", "after_publish", "after_checkpoint", None):
        run_env = dict(env)
        if kill_at:
            run_env["EVENTPROCESSOR_SPARK_KILL_AT"] = kill_at
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(WORKER), "--path", str(out), "--partitions", str(partitions),
            "--events", str(events), "--max-events", "200", "--container", container,
            env=run_env, cwd=ROOT, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        _out, err = await asyncio.wait_for(process.communicate(), 240)
        stderr = err.decode(errors="replace")
        logs.append(stderr)
        if kill_at:
            assert process.returncode == -9, f"expected SIGKILL at {kill_at}:\n{stderr[-3000:]}"
            assert f"killing this process at {kill_at}" in stderr
        else:
            assert process.returncode == 0, stderr[-3000:]
    assert "rolled committed batch" in logs[2], "the half-published batch was not rolled forward"
    expected = {(str(p), i): f"{p}:{i}".encode() for p in range(partitions) for i in range(events)}
    assert_exactly_once(read_rows(spark, out), expected)
    assert not any((out / STAGING_DIR).iterdir())
    # The store's checkpoints ended where the commit log did, each written by the last claim.
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    async with store:
        checkpoints = await store.list_checkpoints("memory.local", "hub", "$default")
    assert {c.partition_id: c.sequence_number for c in checkpoints} == {str(p): events - 1 for p in range(partitions)}


def test_the_benchmark_runs_end_to_end_at_a_small_size(spark, tmp_path):
    """Keeps ``python -m benchmarks.spark_sink`` working, run as a program (tests never
    import the benchmarks); no timing is asserted, nothing is recorded."""
    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, EVENTPROCESSOR_BENCH_RESULTS=str(tmp_path / "RESULTS.md"))
    run = subprocess.run([sys.executable, "-m", "benchmarks.spark_sink", "--master", "local[2]", "--events", "2000",
                          "--batch", "1000", "--rounds", "1"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    assert "ratio" in out and "round 1:" in out and "| classic `local[2]` |" in out
    assert not (tmp_path / "RESULTS.md").exists()
