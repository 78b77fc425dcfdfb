"""The eventhubs Spark source on the session's standalone cluster, reading the session's
Event Hubs emulator while the official producer sends.

* A streaming query to Parquet whose driver is SIGKILLed in the middle of a micro-batch
  and restarted writes every event exactly once: a classic driver process on
  ``spark://`` (restarted as another one), and a Spark Connect server of its own (the
  driver over Connect; the query restarts on the session's Connect server).
* ``Trigger.AvailableNow`` with ``maxEventsPerTrigger`` reads what was there, in
  batches no larger than the limit, and stops; a second run reads only what came since
  (over Connect, and in a classic driver process on ``spark://``).
* A batch read between per-partition starting and ending positions, with the
  connector's columns (both ways too).
* A bad option fails at ``load()`` (at the first analysis over Connect), naming it.
* One consumer group, two engines (Blob store on Azurite): the query starts after an
  ``EventProcessor``'s checkpoints and writes its own; azure-eventhub's consumer and an
  ``EventProcessor`` both resume exactly after them; a partition a live owner holds is
  left alone (the query over Connect, and in a classic driver process).
* Without Spark: the driver's management link, the workers' kept receivers, the
  reader limit of a partition, a partition added to the hub.

Tables are read back with the test process's own Spark Connect session.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from eventprocessor.errors import EventSourceError

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "spark_source_worker.py"

pytestmark = [pytest.mark.spark, pytest.mark.eventhubs]

START = json.dumps({"offset": "-1", "seqNo": -1, "enqueuedTime": None, "isInclusive": True})


def hub_connection(emulator: Any, hub: str) -> str:
    return emulator.process.connection_string_for(hub)


async def send(conn: str, per_partition: dict[str, int], start: dict[str, int], *,
               properties: dict[str, Any] | None = None) -> dict[tuple[str, int], bytes]:
    """Send ``per_partition[pid]`` events to each partition with the official producer;
    return {(partition, sequence number): body}, sequence numbers counted from ``start``."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    sent: dict[tuple[str, int], bytes] = {}
    producer = EventHubProducerClient.from_connection_string(conn)
    async with producer:
        for pid, count in per_partition.items():
            first = start.get(pid, 0)
            for chunk in range(0, count, 100):
                batch = []
                for i in range(first + chunk, first + min(count, chunk + 100)):
                    event = EventData(f"{pid}:{i}")
                    if properties:
                        event.properties = dict(properties)
                    batch.append(event)
                    sent[(pid, i)] = f"{pid}:{i}".encode()
                await producer.send_batch(batch, partition_id=pid)
    return sent


def read_table(spark: Any, path: Path) -> list[tuple[str, int, bytes]]:
    rows = spark.read.parquet(str(path)).select("partition", "sequenceNumber", "body").collect()
    return [(r.partition, int(r.sequenceNumber), bytes(r.body)) for r in rows]


def assert_exactly_once(rows: list[tuple[str, int, bytes]], expected: dict[tuple[str, int], bytes]) -> None:
    counts = Counter((pid, seq) for pid, seq, _ in rows)
    duplicates = sorted(k for k, n in counts.items() if n > 1)
    assert not duplicates, f"{len(duplicates)} events written more than once, e.g. {duplicates[:5]}"
    missing = sorted(set(expected) - set(counts))
    assert not missing, f"{len(missing)} events missing, e.g. {missing[:5]}"
    extra = sorted(set(counts) - set(expected))
    assert not extra, f"{len(extra)} events nobody sent, e.g. {extra[:5]}"
    assert all(body == expected[(pid, seq)] for pid, seq, body in rows)


def wait_for(condition: Callable[[], bool], what: str, timeout: float, diagnostics: Callable[[], str] = str) -> float:
    """A safety bound, not a speed assertion. Returns the seconds it took."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"gave up waiting for {what} after {timeout:.0f} s{diagnostics()}")
        time.sleep(0.05)
    return time.monotonic() - began


def batch_in_flight(checkpoint: Path, at_least: int) -> bool:
    """Spark has logged the offsets of a batch (>= ``at_least``) and not yet its commit."""
    offsets = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}  # glob of a missing folder: nothing
    commits = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
    return any(batch >= at_least and batch not in commits for batch in offsets)


def committed_rows(checkpoint: Path, out: Path, spark: Any) -> int:
    if not (out / "_spark_metadata").exists():
        return 0
    return spark.read.parquet(str(out)).count()


class Driver:
    """``tests/spark_source_worker.py`` as a process group of its own."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], workdir: Path) -> None:
        self.log = workdir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.process = subprocess.Popen([sys.executable, str(WORKER), *args], env=env, cwd=str(workdir),
                                            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill(self) -> None:
        try:
            os.killpg(os.getpgid(self.process.pid), signal.SIGKILL)  # the Python driver and its JVM
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.kill()
        try:  # whatever of its group is left (a JVM the Python process started)
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


# ----------------------------------------------------------------------------- SIGKILL the driver


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["classic", "connect"])
def test_a_driver_sigkilled_mid_batch_and_restarted_writes_every_event_exactly_once(
        mode, spark_cluster, connect_spark, eventhubs_emulator, tmp_path):
    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    out, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, EVENTHUB_CONNECTION_STRING=conn)
    expected = asyncio.run(send(conn, {str(p): 150 for p in range(4)}, {}))
    drivers: list[Driver] = []
    phases: dict[str, float] = {}
    began = time.monotonic()
    servers: list[Any] = []

    if mode == "connect":  # the driver to kill: a Connect server of its own
        servers.append(spark_cluster.start_connect_server(f"first-{uuid.uuid4().hex[:8]}"))

    def start_driver(name: str, *extra: str) -> Driver:
        if mode == "classic":
            where = ["--master", spark_cluster.master_url]
        else:  # the first on its own server; the one that replaces it on the session's (another driver)
            where = ["--remote", servers[0].url if not drivers else spark_cluster.connect_url]
        driver = Driver(name, [*where, "--out", str(out), "--checkpoint", str(checkpoint), "--max-events", "200",
                               *extra], env, tmp_path)
        drivers.append(driver)
        return driver

    def diagnostics() -> str:
        logs = "".join(f"\n--- {d.log.name} ---\n{d.text()[-3000:]}" for d in drivers)
        return logs + "".join(f"\n--- connect server ---\n{s.log()[-3000:]}" for s in servers)

    go = tmp_path / "go"
    try:
        first = start_driver("first")
        # The driver that replaces it makes its session meanwhile (a JVM, or a Connect client of the
        # session's own server), and starts its query on "go". A classic one starts once the first has
        # its executors: its application then waits for the cores the kill frees.
        if mode == "classic":
            wait_for(lambda: "batch 0" in first.text(), "the first batch", 120, diagnostics)
        second = start_driver("second", "--wait-for", str(go))
        # Kill while a batch after the first is planned (its offsets logged) and not committed.
        wait_for(lambda: batch_in_flight(checkpoint, 1), "a batch in flight", 120, diagnostics)
        if mode == "classic":
            first.kill()
        else:
            servers[0].kill()  # the Connect server is the driver
            first.kill()
        phases["to the kill"] = time.monotonic() - began
        killed_in = sorted(int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*"))
        committed = sorted(int(p.name) for p in (checkpoint / "commits").glob("[0-9]*"))
        assert killed_in[-1] not in committed, "the kill hit a batch between its offsets and its commit"
        # More events while no driver runs, and after the restart.
        expected.update(asyncio.run(send(conn, {str(p): 50 for p in range(4)}, {str(p): 150 for p in range(4)})))
        go.touch()
        wait_for(lambda: "query started" in second.text(), "the restarted query", 120, diagnostics)
        phases["to the restarted query"] = time.monotonic() - began
        expected.update(asyncio.run(send(conn, {str(p): 50 for p in range(4)}, {str(p): 200 for p in range(4)})))
        wait_for(lambda: committed_rows(checkpoint, out, connect_spark) >= len(expected), "every event committed", 120,
                 diagnostics)
        phases["to every event committed"] = time.monotonic() - began
        second.stop()
        assert second.process.returncode == 0, diagnostics()
    finally:
        for driver in drivers:
            driver.stop()
        for server in servers:
            server.stop()
    assert_exactly_once(read_table(connect_spark, out), expected)
    assert (checkpoint / "commits" / str(killed_in[-1])).exists(), "the restarted query ran the killed batch again"
    print(f"\n{mode}: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items()))


# ----------------------------------------------------------------------------- in this process, over Connect


@pytest.fixture
def spark(connect_spark):
    from eventprocessor.spark import EventHubsDataSource

    connect_spark.dataSource.register(EventHubsDataSource)
    return connect_spark


def available_now(spark: Any, conn: str, out: Path, checkpoint: Path, *, timeout: float = 120.0,
                  on_first_batch: Callable[[], None] | None = None, **options: Any) -> list[int]:
    """Run a ``Trigger.AvailableNow`` query to Parquet; return each batch's input rows."""
    reader = spark.readStream.format("eventhubs").option("eventhubs.connectionString", conn)
    for key, value in options.items():
        reader = reader.option(key, value)
    query = (reader.load().writeStream.format("parquet").option("path", str(out))
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    try:
        if on_first_batch is not None:
            wait_for(lambda: query.lastProgress is not None or not query.isActive, "the first batch", timeout)
            on_first_batch()
        assert query.awaitTermination(timeout), f"the AvailableNow query did not stop within {timeout:.0f} s"
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise AssertionError(f"the query failed: {query.exception()}")
    return [p.numInputRows for p in query.recentProgress if p.numInputRows]


def available_now_classic(spark_cluster: Any, conn: str, out: Path, checkpoint: Path, workdir: Path, name: str, *,
                          on_first_batch: Callable[[], None] | None = None, timeout: float = 180.0,
                          **options: Any) -> list[int]:
    """The same query in a classic driver process of its own on the standalone master
    (``tests/spark_source_worker.py --available-now``); return each batch's input rows.
    Without ``eventhubs.startingPosition`` in ``options`` it starts from the store."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, EVENTHUB_CONNECTION_STRING=conn)
    arguments = ["--master", spark_cluster.master_url, "--out", str(out), "--checkpoint", str(checkpoint),
                 "--available-now"]
    if "eventhubs.startingPosition" not in options:
        arguments.append("--from-store")
    for key, value in options.items():
        arguments += ["--option", f"{key}={value}"]
    driver = Driver(name, arguments, env, workdir)

    def diagnostics() -> str:
        return f"\n--- {driver.log.name} ---\n{driver.text()[-3000:]}"

    try:
        if on_first_batch is not None:
            wait_for(lambda: "batch " in driver.text() or driver.process.poll() is not None, "the first batch",
                     timeout, diagnostics)
            on_first_batch()
        wait_for(lambda: driver.process.poll() is not None, "the AvailableNow query to stop", timeout, diagnostics)
    finally:
        driver.stop()
    assert driver.process.returncode == 0, diagnostics()
    [line] = [line for line in driver.text().splitlines() if line.startswith("batches ")]
    return json.loads(line[len("batches "):])


@pytest.mark.parametrize("mode", ["connect", "classic"])
def test_available_now_reads_what_was_there_in_batches_of_max_events_then_stops(mode, spark, spark_cluster,
                                                                                  eventhubs_emulator, tmp_path):
    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    expected = asyncio.run(send(conn, {"0": 400, "1": 250, "2": 100, "3": 0}, {}))
    out, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    late: dict[tuple[str, int], bytes] = {}

    def send_late() -> None:  # after the trigger fixed its target: for the next run
        late.update(asyncio.run(send(conn, {str(p): 20 for p in range(4)}, {"0": 400, "1": 250, "2": 100})))

    def run(name: str, on_first_batch: Callable[[], None] | None = None) -> list[int]:
        if mode == "classic":  # a driver process on spark://, its executors on the cluster's worker
            return available_now_classic(spark_cluster, conn, out, checkpoint, tmp_path, name, maxEventsPerTrigger=300,
                                         on_first_batch=on_first_batch, **{"eventhubs.startingPosition": START})
        return available_now(spark, conn, out, checkpoint, on_first_batch=on_first_batch, maxEventsPerTrigger=300,
                             **{"eventhubs.startingPosition": START})

    batches = run("first", send_late)
    assert batches == [300, 300, 150], "AvailableNow in batches of at most maxEventsPerTrigger, then done"
    assert_exactly_once(read_table(spark, out), expected)
    again = run("again")
    assert again == [80], "the next run reads only what came since"
    assert_exactly_once(read_table(spark, out), {**expected, **late})


@pytest.mark.parametrize("mode", ["connect", "classic"])
def test_a_batch_read_between_starting_and_ending_positions_has_the_connectors_columns(mode, spark, spark_cluster,
                                                                                       eventhubs_emulator, tmp_path):
    from tests.spark_source_worker import batch_read

    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    asyncio.run(send(conn, {str(p): 100 for p in range(4)}, {}, properties={"kind": "reading", "n": 7}))
    # The positions below name events by their offsets: read them first (over Connect).
    offsets = {(r.partition, r.sequenceNumber): r.offset
               for r in spark.read.format("eventhubs").option("eventhubs.connectionString", conn)
               .option("eventhubs.startingPosition", START).load().select("partition", "sequenceNumber", "offset")
               .collect()}

    def key(pid: int) -> str:
        return json.dumps({"ehName": hub, "partitionId": pid})

    starting = json.dumps({
        key(0): {"offset": None, "seqNo": 10, "enqueuedTime": None, "isInclusive": True},
        key(1): {"offset": offsets[("1", 20)], "seqNo": -1, "enqueuedTime": None, "isInclusive": True},
        key(2): {"offset": offsets[("2", 20)], "seqNo": -1, "enqueuedTime": None, "isInclusive": False}})
    ending = json.dumps({
        key(0): {"offset": None, "seqNo": 50, "enqueuedTime": None, "isInclusive": True},
        key(1): {"offset": offsets[("1", 60)], "seqNo": -1, "enqueuedTime": None, "isInclusive": True},
        key(3): {"offset": "-1", "seqNo": -1, "enqueuedTime": None, "isInclusive": True}})
    if mode == "connect":
        read = batch_read(spark, conn, starting, ending)
    else:  # a classic driver process on spark://, its executors on the cluster's worker
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                   SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable, EVENTHUB_CONNECTION_STRING=conn)
        driver = Driver("batch-read", ["--master", spark_cluster.master_url, "--batch-read", "--starting-positions",
                                       starting, "--ending-positions", ending], env, tmp_path)
        try:
            wait_for(lambda: driver.process.poll() is not None, "the batch reads", 180,
                     lambda: f"\n--- {driver.log.name} ---\n{driver.text()[-3000:]}")
        finally:
            driver.stop()
        assert driver.process.returncode == 0, driver.text()[-3000:]
        [line] = [line for line in driver.text().splitlines() if line.startswith("read ")]
        read = json.loads(line[len("read "):])
    assert read["schema"] == [
        ["body", "binary"], ["partition", "string"], ["offset", "string"], ["sequenceNumber", "bigint"],
        ["enqueuedTime", "timestamp"], ["publisher", "string"], ["partitionKey", "string"],
        ["properties", "map<string,string>"], ["systemProperties", "map<string,string>"]]
    rows = read["rows"]
    assert len(rows) == 400
    assert {(r["partition"], r["sequenceNumber"]): r["offset"] for r in rows} == offsets
    first = next(r for r in rows if r["partition"] == "1" and r["sequenceNumber"] == 0)
    assert (first["body"], first["publisher"], first["partitionKey"]) == ("1:0", None, None)
    assert first["properties"] == {"kind": '"reading"', "n": "7"}, "property values are JSON, as the connector's"
    got: dict[str, list[int]] = {}
    for pid, seq in read["bounded"]:
        got.setdefault(pid, []).append(seq)
    assert {pid: sorted(seqs) for pid, seqs in got.items()} == {
        "0": list(range(10, 50)),   # a sequence number starts at it and ends before it
        "1": list(range(20, 60)),   # an offset, inclusive: from that event, to the one before the ending offset
        "2": list(range(21, 100)),  # an offset, exclusive: after it; no ending position: the end of the partition
    }, "partition 3 ends at its start: nothing"


def test_a_bad_option_fails_the_first_analysis_naming_it(spark, eventhubs_emulator):
    conn = hub_connection(eventhubs_emulator, "pool4-0")
    df = spark.readStream.format("eventhubs").option("eventhubs.connectionString", conn) \
        .option("maxEventsPerTriger", "100").option("eventhubs.startingPosition", "{").load()
    with pytest.raises(Exception) as error:
        _ = df.schema  # over Spark Connect, load() is lazy: the server analyses here
    text = str(error.value)
    assert "did you mean maxEventsPerTrigger" in text and "eventhubs.startingPosition is not JSON" in text
    assert "SAS_KEY_VALUE" not in text


# ----------------------------------------------------------------------------- one group, two engines


async def _run_processor(conn: str, store: Any, group: str, owner: str, want: int) -> Any:
    """An EventProcessor on ``group`` until its handlers received ``want`` events (and a
    second more, for anything it should not get); it checkpoints every batch and
    releases its partitions when it stops."""
    from eventprocessor import EventProcessor
    from eventprocessor.sources.eventhub import EventHubSource
    from eventprocessor.testing import DeliveryRecorder, recording_handler

    recorder = DeliveryRecorder()
    source = EventHubSource.from_connection_string(conn)
    processor = EventProcessor(source, store, recording_handler(recorder), consumer_group=group, owner_id=owner,
                               load_balancing_interval=0.5, partition_ownership_expiration_interval=6)
    await processor.start()
    try:
        began = time.monotonic()
        while sum(recorder.received.values()) < want:
            assert time.monotonic() - began < 60, f"{owner} received {sum(recorder.received.values())} of {want}"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
    finally:
        await processor.stop()
        await source.close()
    return recorder


async def _run_official_consumer(conn: str, storage: str, container: str, group: str,
                                 want: int) -> dict[tuple[str, int], int]:
    """azure-eventhub's own consumer with its own blob checkpoint store (it resumes from
    a checkpoint's *offset*), until it received ``want`` events and a second more."""
    from azure.eventhub.aio import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore as OfficialStore

    received: dict[tuple[str, int], int] = Counter()

    async def on_batch(context: Any, events: list[Any]) -> None:
        for event in events:
            received[(context.partition_id, event.sequence_number)] += 1

    store = OfficialStore.from_connection_string(storage, container)
    client = EventHubConsumerClient.from_connection_string(conn, consumer_group=group, checkpoint_store=store,
                                                           load_balancing_interval=0.5)
    task = asyncio.create_task(client.receive_batch(on_batch, starting_position="-1", max_wait_time=0.5))
    try:
        began = time.monotonic()
        while sum(received.values()) < want:
            assert time.monotonic() - began < 60 and not task.done(), f"the official consumer got {dict(received)}"
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
    finally:
        await client.close()
        await asyncio.gather(task, return_exceptions=True)
        await store.close()
    return received


@pytest.mark.azurite
@pytest.mark.parametrize("mode", ["connect", "classic"])
async def test_one_consumer_group_two_engines_checkpoints_carry_over_both_ways(mode, spark, spark_cluster,
                                                                              eventhubs_emulator, azurite, tmp_path):
    """EventProcessor -> query -> azure-eventhub's consumer and EventProcessor, each
    resuming exactly after the other's checkpoints (Blob store on Azurite); a partition
    a live owner holds is left alone and no checkpoint ever moves back."""
    from eventprocessor.spark.source.options import SourceOptions
    from eventprocessor.stores import BlobCheckpointStore
    from eventprocessor.stores.records import Ownership

    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    group, container = "cg1", f"spark-source-{uuid.uuid4().hex[:10]}"
    store = BlobCheckpointStore.from_connection_string(azurite.connection_string, container)
    scope = (SourceOptions.parse({"eventhubs.connectionString": conn}).fully_qualified_namespace, hub, group)
    out, checkpoint = tmp_path / "table", tmp_path / "checkpoint"
    options = {"eventhubs.consumerGroup": group, "maxEventsPerTrigger": 70,
               "eventhubs.checkpointStore.connectionString": azurite.connection_string,
               "eventhubs.checkpointStore.container": container,
               "eventhubs.checkpointStore.ownershipExpiration": 6}

    async def stored() -> dict[str, Any]:
        return {c.partition_id: c for c in await store.list_checkpoints(*scope)}

    runs = iter(range(1, 3))

    def query(**given: Any) -> list[int]:  # AvailableNow over Connect, or in a classic driver process
        if mode == "classic":
            return available_now_classic(spark_cluster, conn, out, checkpoint, tmp_path, f"query-{next(runs)}",
                                         **given)
        return available_now(spark, conn, out, checkpoint, **given)

    try:
        # 1. An EventProcessor reads the first 100 of each partition and checkpoints them.
        await send(conn, {str(p): 100 for p in range(4)}, {})
        first = await _run_processor(conn, store, group, "processor-1", 400)
        assert sorted(first.processed()) == sorted((str(p), s) for p in range(4) for s in range(100))
        assert {pid: c.sequence_number for pid, c in (await stored()).items()} == {str(p): 99 for p in range(4)}

        # 2. The query starts after those checkpoints (no startingPosition given) and writes its own,
        #    with the offset string of each partition's last event (the batches are rate-limited).
        second = await send(conn, {str(p): 50 for p in range(4)}, {str(p): 100 for p in range(4)})
        batches = await asyncio.to_thread(query, **options)
        assert sum(batches) == 200 and max(batches) <= 70
        assert_exactly_once(read_table(spark, out), second)
        offsets = {(r.partition, r.sequenceNumber): r.offset
                   for r in spark.read.parquet(str(out)).select("partition", "sequenceNumber", "offset").collect()}
        after_query = await stored()
        assert {pid: (c.sequence_number, c.offset) for pid, c in after_query.items()} == \
            {str(p): (149, offsets[(str(p), 149)]) for p in range(4)}
        owner = after_query["0"].owner_id
        assert owner and owner.startswith("spark-")
        released = False
        for _ in range(100):  # Spark stops the reader's process as the query ends, a moment after
            released = all(o.is_released for o in (await store.list_ownership(*scope)).ownerships)
            if released:
                break
            await asyncio.sleep(0.1)
        assert released, "the stopped query released its partitions"

        # 3. azure-eventhub's consumer (it resumes from offsets) and an EventProcessor (from sequence
        #    numbers) each take over exactly after the query's checkpoints.
        third = await send(conn, {str(p): 30 for p in range(4)}, {str(p): 150 for p in range(4)})
        official = await _run_official_consumer(conn, azurite.connection_string, container, group, 120)
        assert dict(official) == {key: 1 for key in third}, "azure-eventhub's consumer resumed after the query"
        ours = await _run_processor(conn, store, group, "processor-2", 120)
        assert sorted(ours.processed()) == sorted(third) and ours.duplicates() == 0, \
            "the EventProcessor resumed after the query"

        # 4. A live owner keeps partition 0 (it renews its record every second, as a processor does);
        #    the query, behind the store on every partition now, never moves a checkpoint back and
        #    writes again only past the stored ones.
        [held] = [o for o in (await store.list_ownership(*scope)).ownerships if o.partition_id == "0"]
        [live] = await store.claim_ownership([Ownership(*scope, "0", "processor-live", etag=held.etag,
                                                        epoch=held.epoch + 1)])
        fourth = await send(conn, {str(p): 40 for p in range(4)}, {str(p): 180 for p in range(4)})
        seen: dict[str, list[int]] = {}
        running = True

        async def watch_and_renew() -> None:
            nonlocal live
            while running:
                for pid, c in (await stored()).items():
                    seen.setdefault(pid, []).append(c.sequence_number)
                if (await store.list_ownership(*scope)).server_time - live.last_modified_time > timedelta(seconds=1):
                    [live] = await store.claim_ownership([live])
                await asyncio.sleep(0.05)

        watcher = asyncio.create_task(watch_and_renew())
        try:
            batches = await asyncio.to_thread(query, **{**options, "maxEventsPerTrigger": 40})
        finally:
            running = False
            await watcher
        assert sum(batches) == 4 * 70
        for pid, history in seen.items():
            assert history == sorted(history), f"partition {pid}'s checkpoint moved back: {history}"
        final = await stored()
        assert final["0"].sequence_number == 179 and final["0"].owner_id == "processor-2", \
            "the live owner's partition was left alone"
        assert {pid: final[pid].sequence_number for pid in "123"} == {pid: 219 for pid in "123"}
        assert_exactly_once(read_table(spark, out), {**second, **third, **fourth})
    finally:
        await store.close()


# ----------------------------------------------------------------------------- the hub calls, without Spark


def test_the_drivers_management_link_answers_as_the_public_calls_and_reopens_after_a_drop(eventhubs_emulator):
    """The driver reaches the hub through a TCP fault proxy on its own loop (which runs
    whenever the driver calls the hub), so its kept link's connection can be reset while
    idle, as a dropped connection would be."""
    from eventprocessor.emulators.eventhubs import connection_string
    from eventprocessor.emulators.fault_proxy import TcpFaultProxy
    from eventprocessor.emulators.ports import free_ports
    from eventprocessor.spark.source.hub import DriverHub, ManagementLink
    from eventprocessor.spark.source.options import SourceOptions

    assert ManagementLink.supported(), "the installed azure-eventhub lost the pieces the management link uses"
    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    asyncio.run(send(conn, {"0": 30, "2": 5}, {}))
    proxy = TcpFaultProxy("127.0.0.1", eventhubs_emulator.port)
    proxy.port = free_ports(1)[0]
    proxied = connection_string("127.0.0.1", proxy.port, eventhub_name=hub)

    async def reset() -> int:
        dropped = proxy.reset_all()
        await asyncio.sleep(0.5)  # the client's side sees the reset while its link is idle
        return dropped

    with DriverHub(SourceOptions.parse({"eventhubs.connectionString": proxied})) as driver:
        driver.run(proxy.start)  # on the driver's loop, which runs while the driver calls the hub
        try:
            assert driver.management_link is None
            kept = driver.properties()
            public = driver.run(lambda: asyncio.gather(*(driver.source.get_partition_properties(str(p))
                                                         for p in range(4))))
            assert kept == {p.partition_id: p for p in public}
            assert kept["0"].last_enqueued_sequence_number == 29 and kept["1"].is_empty
            link = driver.management_link
            assert link is not None and link.is_open, "the link stays open between calls"
            opened = proxy.accepted
            assert driver.run(reset) >= 1  # the connection drops while idle
            asyncio.run(send(conn, {"1": 3}, {}))
            again = driver.properties()  # answered by the public calls; the next call opens a new link
            assert again["1"].last_enqueued_sequence_number == 2 and driver.management_link is None
            assert not link.is_open, "the failed link was closed"
            assert driver.properties() == again and driver.management_link is not None
            assert driver.management_link.is_open and driver.management_link is not link
            assert proxy.accepted > opened
        finally:
            driver.run(proxy.stop)


def test_readers_are_kept_for_the_next_range_read_ahead_and_skip_forward(eventhubs_emulator):
    """A reader kept after a range goes on receiving past it: the next range of its
    partition is already received and decoded when its task starts. A range further on
    (another worker read the ones between) drops what is below it; a range behind every
    kept reader gets a new one; a task that stops early does not leave its reader."""
    from eventprocessor.spark.source.executor import WorkerReaders, read_range
    from eventprocessor.spark.source.offsets import ReadRange
    from eventprocessor.spark.source.options import SourceOptions

    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    sent = asyncio.run(send(conn, {"0": 300, "1": 10}, {}))
    options = SourceOptions.parse({"eventhubs.connectionString": conn})
    readers = WorkerReaders(idle=30.0)
    pool = readers.pool

    def read(pid: str, begin: int, until: int) -> list[tuple[int, bytes]]:
        rows = [row for batch in read_range(options, ReadRange(pid, begin, until), readers=readers)
                for row in batch.to_pylist()]
        assert all(row["partition"] == pid for row in rows)
        return [(row["sequenceNumber"], row["body"]) for row in rows]

    def buffered(pid: str) -> int:
        return sum(r.buffered for (_c, _g, p, *_rest), rs in pool._kept.items() if p == pid for r in rs)

    assert read("0", 0, 100) == [(s, sent[("0", s)]) for s in range(100)]
    deadline = time.monotonic() + 30
    while buffered("0") < 200 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert buffered("0") == 200, "the rest of the partition was received ahead (up to the prefetch, 500)"
    assert read("0", 100, 150) == [(s, sent[("0", s)]) for s in range(100, 150)]
    assert read("0", 200, 300) == [(s, sent[("0", s)]) for s in range(200, 300)], "skipping what another worker read"
    assert (pool.opened, pool.reused) == (1, 2)
    assert read("0", 10, 20) == [(s, sent[("0", s)]) for s in range(10, 20)], "behind the kept reader: a new one"
    assert read("1", 0, 10) == [(s, sent[("1", s)]) for s in range(10)]
    assert (pool.opened, pool.kept()) == (3, 3)
    partial = read_range(options, ReadRange("1", 0, 10), readers=readers)
    next(partial)
    partial.close()  # a task that stops early: its reader is not kept
    assert (pool.opened, pool.kept()) == (4, 3)


def test_a_range_received_ahead_is_one_record_batch_of_exactly_its_events_in_order(eventhubs_emulator):
    """What a kept reader received ahead in several receives reaches the task as one
    record batch (one frame, one Arrow batch for Spark): exactly the planned sequence
    numbers, in order, nothing before or after; a range whose reader is gone is
    received from the hub again, the same rows."""
    from eventprocessor.spark.source.executor import WorkerReaders, read_range
    from eventprocessor.spark.source.offsets import ReadRange
    from eventprocessor.spark.source.options import SourceOptions
    from eventprocessor.spark.source.rows import ARROW_SCHEMA

    hub = eventhubs_emulator.fresh_hub(2)
    conn = hub_connection(eventhubs_emulator, hub)
    sent = asyncio.run(send(conn, {"0": 1200}, {}))
    options = SourceOptions.parse({"eventhubs.connectionString": conn, "eventhubs.prefetchCount": "100"})
    readers = WorkerReaders(idle=30.0)
    pool = readers.pool

    def batches(begin: int, until: int) -> list:
        return list(read_range(options, ReadRange("0", begin, until), readers=readers))

    def rows(read: list) -> list[tuple[int, bytes]]:
        return [(r["sequenceNumber"], r["body"]) for b in read for r in b.to_pylist()]

    try:
        assert rows(batches(0, 100)) == [(s, sent[("0", s)]) for s in range(100)]
        [[reader]] = pool._kept.values()

        async def leave_as_a_task_of_1000_events() -> None:
            # on the readers' loop, where the pool calls it: this thread may have no loop
            reader.ahead = 1000
            reader.read_ahead()

        readers.run(leave_as_a_task_of_1000_events())
        deadline = time.monotonic() + 30
        while reader.buffered < 1000 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(reader._batches) > 1, "received in several receives (prefetch 100)"
        read = batches(103, 1050)
        assert len(read) == 1 and read[0].schema == ARROW_SCHEMA
        assert rows(read) == [(s, sent[("0", s)]) for s in range(103, 1050)], "exactly the range, in order"
        readers.run(pool.close())  # the reader is gone: the range comes from the hub again
        assert rows(batches(1050, 1200)) == [(s, sent[("0", s)]) for s in range(1050, 1200)]
        assert rows(batches(1000, 1100)) == [(s, sent[("0", s)]) for s in range(1000, 1100)], "behind: a new one"
        assert pool.opened == 3
    finally:
        readers.run(pool.close())


def test_any_worker_gets_its_range_from_the_partitions_reader_process_received_ahead(eventhubs_emulator):
    """Spark runs a partition's next task in whichever Python worker is free. The
    partition's receiver lives in the executor's reader process for it, not in a worker:
    a range read here and the next one read by another process (another worker) are
    served by one receiver, and the second was received while nobody asked."""
    from eventprocessor.spark.source.executor import read_range
    from eventprocessor.spark.source.offsets import ReadRange
    from eventprocessor.spark.source.options import SourceOptions
    from eventprocessor.spark.source.reader_service import service_call

    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    sent = asyncio.run(send(conn, {"0": 400}, {}))
    options = SourceOptions.parse({"eventhubs.connectionString": conn})
    other_worker = ("import json, sys; from eventprocessor.spark.source.executor import read_range; "
                    "from eventprocessor.spark.source.offsets import ReadRange; "
                    "from eventprocessor.spark.source.options import SourceOptions; "
                    "o = SourceOptions.parse({'eventhubs.connectionString': sys.argv[1]}); "
                    "print(json.dumps([r['sequenceNumber'] for b in read_range(o, ReadRange('0', 200, 400)) "
                    "for r in b.to_pylist()]))")
    try:
        first = [(r["sequenceNumber"], r["body"]) for b in read_range(options, ReadRange("0", 0, 200))
                 for r in b.to_pylist()]
        assert first == [(s, sent[("0", s)]) for s in range(200)]
        deadline = time.monotonic() + 30
        while (service_call(options, "0", "stats") or {}).get("received", 0) < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service_call(options, "0", "stats") == {"opened": 1, "reused": 0, "kept": 1, "received": 400,
                                                       "dropped": 0}, "the next 200 were received ahead"
        out = subprocess.run([sys.executable, "-c", other_worker, conn], capture_output=True, text=True,
                             timeout=120, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)))
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout) == list(range(200, 400))
        assert service_call(options, "0", "stats") == {"opened": 1, "reused": 1, "kept": 1, "received": 400,
                                                       "dropped": 0}
    finally:
        service_call(options, "0", "stop")


async def test_a_partition_added_to_the_hub_is_read_from_its_first_event_at_the_next_batch():
    """The stream reader's own offset methods and read(), without Spark, on an emulator in
    this process whose hub grows from 2 to 3 partitions between two batches."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from eventprocessor.emulators.eventhubs import EventHubsEmulator
    from eventprocessor.spark.source.datasource import EventHubsStreamReader
    from eventprocessor.spark.source.options import SourceOptions

    async with EventHubsEmulator(eventhubs=["growing"], partitions=2) as emulator:
        conn = emulator.connection_string_for("growing")
        sent = await send(conn, {"0": 5, "1": 5}, {})
        reader = EventHubsStreamReader(SourceOptions.parse({"eventhubs.connectionString": conn,
                                                            "eventhubs.startingPosition": START}))

        def batch(start: dict) -> tuple[dict, list[tuple[str, int, bytes]]]:
            end = reader.latestOffset(start, ReadAllAvailable())
            rows = [(r["partition"], r["sequenceNumber"], r["body"]) for part in reader.partitions(start, end)
                    for b in reader.read(part) for r in b.to_pylist()]
            return end, rows

        try:
            start = await asyncio.to_thread(reader.initialOffset)
            first_end, first = await asyncio.to_thread(batch, start)
            assert sorted(first) == sorted((pid, seq, body) for (pid, seq), body in sent.items())
            emulator.namespace.hub("growing").add_partitions(3)
            late = await send(conn, {"2": 4, "0": 1}, {"0": 5})
            second_end, second = await asyncio.to_thread(batch, first_end)
            assert sorted(second) == sorted((pid, seq, body) for (pid, seq), body in late.items())
            assert second_end["partitions"]["2"]["seqNo"] == 4
        finally:
            await asyncio.to_thread(reader.stop)


async def test_a_task_refused_for_the_partitions_reader_limit_waits_for_a_free_slot(eventhubs_emulator):
    """Event Hubs lets 5 receivers without an owner level read a partition per consumer
    group, and the workers' kept receivers count. A task the hub refuses for that waits
    for one to close, up to eventhubs.receiverTimeout, and then fails naming the limit."""
    from eventprocessor.events import EventPosition
    from eventprocessor.sources.eventhub import EventHubSource
    from eventprocessor.spark.source.executor import WorkerReaders, read_range
    from eventprocessor.spark.source.offsets import ReadRange
    from eventprocessor.spark.source.options import SourceOptions

    hub = eventhubs_emulator.fresh_hub(4)
    conn = hub_connection(eventhubs_emulator, hub)
    sent = await send(conn, {"0": 20}, {})
    others = EventHubSource.from_connection_string(conn)
    readers = []
    for _ in range(5):  # other readers hold every slot of partition 0
        reader = await others.open_receiver("0", consumer_group="$Default", owner_level=None, prefetch=10,
                                            starting_position=EventPosition.earliest())
        await reader.receive(1, 5)
        readers.append(reader)
    options = SourceOptions.parse({"eventhubs.connectionString": conn, "eventhubs.receiverTimeout": "3"})

    def read() -> list[tuple[int, bytes]]:
        return [(r["sequenceNumber"], r["body"]) for b in read_range(options, ReadRange("0", 0, 20),
                                                                     readers=WorkerReaders())
                for r in b.to_pylist()]

    try:
        with pytest.raises(EventSourceError, match="already has the 5 readers without an owner level"):
            await asyncio.to_thread(read)
        waiting = asyncio.create_task(asyncio.to_thread(read))
        await asyncio.sleep(1.0)
        assert not waiting.done(), "the task waits for a slot"
        await readers.pop().close()
        assert await asyncio.wait_for(waiting, 30) == [(s, sent[("0", s)]) for s in range(20)]
    finally:
        for reader in readers:
            await reader.close()
        await others.close()
