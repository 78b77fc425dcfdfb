"""``spark.readStream.format("eventhubs")``: the PySpark data source classes.

Spark (4.2 or later) runs them in Python workers: the data source and its options are
created at ``load()`` (the options are checked there), the stream reader's offset
methods run in one long-lived worker on the driver (on the Spark Connect server over
Connect), and ``read`` runs in executor tasks, one per Event Hubs partition of a batch
(or per sequence range with ``minPartitions``). The reader is pickled to the executors:
it holds only its options; clients are made where they are used.

Example::

    from eventprocessor.spark import EventHubsDataSource

    spark.dataSource.register(EventHubsDataSource)
    events = (spark.readStream.format("eventhubs")
              .option("eventhubs.connectionString", conn)       # with EntityPath=<hub>
              .option("maxEventsPerTrigger", 10000)
              .load())
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.types import BinaryType, LongType, MapType, StringType, StructField, StructType, TimestampType

try:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows, SupportsTriggerAvailableNow
except ImportError as error:  # pragma: no cover - depends on the installed pyspark
    import pyspark

    raise ImportError(
        f"eventprocessor.spark.EventHubsDataSource needs pyspark 4.2 or later (admission control and "
        f"Trigger.AvailableNow for Python data sources); this is pyspark {pyspark.__version__}") from error

from ...errors import ConfigurationError
from ...stores.records import partition_sort_key
from .checkpoints import CheckpointWriter
from .executor import read_range
from .hub import DriverHub
from .offsets import (
    DataLossError,
    HubOffset,
    PartitionPosition,
    ReadRange,
    data_loss,
    end_position,
    plan_latest,
    plan_ranges,
)
from .options import SourceOptions

__all__ = ["EventHubsDataSource", "EventHubsStreamReader", "EventHubsBatchReader", "EventHubsPartition", "SCHEMA"]

logger = logging.getLogger(__name__)

SCHEMA = StructType([
    StructField("body", BinaryType()),
    StructField("partition", StringType()),
    StructField("offset", StringType()),
    StructField("sequenceNumber", LongType()),
    StructField("enqueuedTime", TimestampType()),
    StructField("publisher", StringType()),
    StructField("partitionKey", StringType()),
    StructField("properties", MapType(StringType(), StringType()), True),
    StructField("systemProperties", MapType(StringType(), StringType()), True),
])
"""The Microsoft connector's columns (see :mod:`eventprocessor.spark.source.rows`)."""

DEFAULT_EVENTS_PER_PARTITION = 1000
"""Without ``maxEventsPerTrigger`` a micro-batch takes at most this many events per
partition of the hub, as the Microsoft connector does."""

_IDLE_POLL = 0.25  # seconds between hub polls while a stream has nothing new
_STOP_SECONDS = 10.0  # what stop() may spend releasing the query's partitions


class EventHubsPartition(InputPartition):
    """One Spark task: a :class:`~eventprocessor.spark.source.offsets.ReadRange`."""

    def __init__(self, read: ReadRange) -> None:
        super().__init__(read)
        self.read = read


class EventHubsDataSource(DataSource):
    """Azure Event Hubs (and the local emulator) as a Spark source, short name ``eventhubs``.

    Streaming (``spark.readStream``) and batch (``spark.read``), with the Microsoft
    connector's options and columns; see the README section "Spark Structured
    Streaming" for the options, the offsets and the exactly-once contract.

    Example::

        spark.dataSource.register(EventHubsDataSource)
        df = (spark.read.format("eventhubs").option("eventhubs.connectionString", conn)
              .option("eventhubs.startingPosition", json.dumps({"offset": "-1", "seqNo": -1,
                                                                "enqueuedTime": None, "isInclusive": True}))
              .load())
    """

    @classmethod
    def name(cls) -> str:
        return "eventhubs"

    def schema(self) -> StructType:
        self._parsed()  # a bad option fails load(), once, naming it
        return SCHEMA

    def _parsed(self) -> SourceOptions:
        return SourceOptions.parse(self.options)

    def _check_schema(self, schema: StructType) -> None:
        mine = [(f.name, f.dataType) for f in SCHEMA.fields]
        given = [(f.name, f.dataType) for f in schema.fields]
        if given != mine:
            raise ConfigurationError(
                "the eventhubs source has a fixed schema (the Microsoft connector's columns: "
                f"{', '.join(f.name for f in SCHEMA.fields)}); drop .schema(...) from the query")

    def streamReader(self, schema: StructType) -> EventHubsStreamReader:
        self._check_schema(schema)
        options = self._parsed()
        if options.ending_positions or options.ending_position.kind != "end":
            logger.warning("eventhubs.endingPosition(s) bound batch reads only; a streaming query ignores them")
        return EventHubsStreamReader(options)

    def reader(self, schema: StructType) -> EventHubsBatchReader:
        self._check_schema(schema)
        return EventHubsBatchReader(self._parsed())


def _starting(options: SourceOptions, hub: DriverHub, writer: CheckpointWriter | None,
              properties: dict[str, Any]) -> HubOffset:
    """Where a new query (or a batch read) starts: the store's checkpoints where it
    has them, else the starting positions."""
    stored: dict[str, PartitionPosition] = {}
    if writer is not None:
        stored = {pid: p for pid, p in hub.run(writer.starting_positions).items() if pid in properties}
        for pid, position in stored.items():
            last = properties[pid].last_enqueued_sequence_number
            if position.sequence_number > last + 1:
                raise ConfigurationError(
                    f"the checkpoint store's checkpoint of partition {pid} (sequence number "
                    f"{position.sequence_number - 1}) is past the partition's last event ({last}): the store holds "
                    "checkpoints of another hub; point eventhubs.checkpointStore.* at this hub's store")
    rest = {pid: options.starting(pid) for pid in properties if pid not in stored}
    resolved = hub.starting_positions(rest, {pid: properties[pid] for pid in rest}) if rest else {}
    if stored:
        logger.info("starting from the checkpoint store for partitions %s", sorted(stored, key=partition_sort_key))
    return HubOffset(options.eventhub_name, {**resolved, **stored})


def _stop_on_sigterm() -> None:
    """Let Spark's own ``finally: reader.stop()`` run when the query ends.

    Spark ends a stream reader's worker process with SIGTERM, whose default action
    kills Python before any ``finally``, so ``stop()`` (which releases the query's
    partitions in the checkpoint store) would never run. In that dedicated process,
    SIGTERM becomes ``SystemExit``. Nothing is changed in a thread other than the main
    one, nor where someone already handles SIGTERM.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return

    def exit_cleanly(signum: int, _frame: Any) -> None:
        # Spark sends SIGTERM twice in a row; the second must not cut stop() short
        # (stop() bounds itself: _STOP_SECONDS).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, exit_cleanly)


class EventHubsStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The micro-batch reader (one per query run, on the driver; pickled to executors)."""

    def __init__(self, options: SourceOptions, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._options = options
        self._clock = clock
        self._hub: DriverHub | None = None
        self._writer: CheckpointWriter | None = None
        self._target: HubOffset | None = None
        self._target_properties: dict[str, Any] = {}
        self._latest: HubOffset | None = None
        self._idle_since: float | None = None
        self._published: HubOffset | None = None
        self._published_at = float("-inf")

    def __getstate__(self) -> dict[str, Any]:
        # Executors get the options only: clients, loops and the store stay on the driver.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"EventHubsStreamReader(eventhub={self._options.eventhub_name!r}, " \
               f"consumer_group={self._options.consumer_group!r})"

    @property
    def hub(self) -> DriverHub:
        if self._hub is None:
            self._hub = DriverHub(self._options)
        return self._hub

    @property
    def writer(self) -> CheckpointWriter | None:
        if self._writer is None and self._options.store is not None:
            _stop_on_sigterm()
            o = self._options
            self._writer = CheckpointWriter(o.store, o.fully_qualified_namespace, o.eventhub_name,  # type: ignore[arg-type]
                                            o.consumer_group)
            logger.info("query writes Event Hubs checkpoints as owner %s to %s", self._writer.owner_id,
                        o.store.where)  # type: ignore[union-attr]
        return self._writer

    # ------------------------------------------------------------------ offsets

    def initialOffset(self) -> dict:
        properties = self.hub.properties()
        start = _starting(self._options, self.hub, self.writer, properties)
        logger.info("new query on %s: starting at %s", self._options.eventhub_name,
                    {pid: p.sequence_number for pid, p in start.partitions.items()})
        return start.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self._options.max_events_per_trigger is not None:
            return ReadMaxRows(self._options.max_events_per_trigger)
        partitions = len(self.hub.properties())
        return ReadMaxRows(DEFAULT_EVENTS_PER_PARTITION * max(1, partitions))

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = HubOffset.from_json(start, self._options.eventhub_name)
        # Spark asks for the next batch only once every batch up to ``start`` is committed
        # (its sink and commit log written): ``start`` is what the query has consumed.
        self._publish(begin)
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        if not isinstance(limit, (ReadMaxRows, ReadAllAvailable)):
            logger.warning("the eventhubs source does not know read limit %r; reading all available", limit)
        if self._target is not None:
            end = plan_latest(begin, self._target_properties, max_rows=max_rows, target=self._target)
        else:
            now = self._clock()
            if self._idle_since is not None and now - self._idle_since < _IDLE_POLL:
                return start  # nothing was new a moment ago: spare the hub a poll per 10 ms
            properties = self.hub.properties()
            self._check_data_loss(begin, properties)
            self._latest = plan_latest(begin, properties)
            end = plan_latest(begin, properties, max_rows=max_rows)
            self._idle_since = now if end == begin else None
        if end == begin:
            return start
        return self._with_offsets(begin, end).to_json()

    def _check_data_loss(self, begin: HubOffset, properties: dict[str, Any]) -> None:
        lost = data_loss(begin, properties)
        if not lost:
            return
        text = "; ".join(d.message() for d in lost)
        if self._options.fail_on_data_loss:
            raise DataLossError(f"{text}. Set failOnDataLoss=false to go on from the earliest events",
                                fully_qualified_namespace=self._options.fully_qualified_namespace,
                                eventhub_name=self._options.eventhub_name, reason="refused")
        logger.warning("%s; going on from the earliest events (failOnDataLoss=false)", text)

    def _with_offsets(self, begin: HubOffset, end: HubOffset) -> HubOffset:
        """Learn the offset strings of rate-limited ends when checkpoints are written
        (a checkpoint needs the offset of its event); otherwise leave them null."""
        if self.writer is None:
            return end
        missing = {pid: p.sequence_number - 1 for pid, p in end.partitions.items()
                   if p.offset is None and pid in begin.partitions
                   and p.sequence_number > begin.partitions[pid].sequence_number}
        if not missing:
            return end
        found = self.hub.offsets_of(missing)
        positions = dict(end.partitions)
        for pid, offset in found.items():
            positions[pid] = PartitionPosition(positions[pid].sequence_number, offset)
        return HubOffset(end.eventhub_name, positions)

    def reportLatestOffset(self) -> dict | None:
        return None if self._latest is None else self._latest.to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        properties = self.hub.properties()
        self._target_properties = properties
        self._target = HubOffset(self._options.eventhub_name,
                                 {pid: end_position(props) for pid, props in properties.items()})
        logger.info("Trigger.AvailableNow: reading up to %s", self._target.sequence_numbers())

    # ------------------------------------------------------------------ reading

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        name = self._options.eventhub_name
        ranges = plan_ranges(HubOffset.from_json(start, name), HubOffset.from_json(end, name),
                             self._options.min_partitions)
        planned_at = self._clock()
        return [EventHubsPartition(replace(r, planned_at=planned_at)) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, EventHubsPartition):
            return iter(())  # Spark's stand-in for an empty batch
        return read_range(self._options, partition.read)

    # ------------------------------------------------------------------ commits

    def commit(self, end: dict) -> None:
        # Spark calls this for batch N-1 once batch N is planned: never newer than what
        # latestOffset already published, but it keeps the ownership records renewed.
        self._publish(HubOffset.from_json(end, self._options.eventhub_name))

    def _publish(self, consumed: HubOffset) -> None:
        """Write ``consumed`` to the checkpoint store (when one is named): at most once per
        position, and again every third of the ownership expiration to stay a live owner."""
        writer = self.writer
        if writer is None:
            return
        now = self._clock()
        renew_every = writer.options.ownership_expiration / 3
        if consumed == self._published and now - self._published_at < renew_every:
            return
        try:
            report = self.hub.run(lambda: writer.commit(consumed))
        except Exception as error:  # the store is advisory: Spark's checkpoint is what the query resumes from
            logger.warning("query %s: writing Event Hubs checkpoints failed (%s: %s); the next batch tries again",
                           writer.owner_id, type(error).__name__, error)
            return
        self._published, self._published_at = consumed, now
        if report.written or report.held_by_others or report.behind:
            logger.info("query %s checkpointed %s; left to live owners %s; not moved back %s", writer.owner_id,
                        report.written, report.held_by_others, report.behind)

    def stop(self) -> None:
        hub, writer = self._hub, self._writer
        self._hub, self._writer = None, None
        if hub is None:
            return
        try:
            if writer is not None:
                hub.run(lambda: asyncio.wait_for(writer.release(), _STOP_SECONDS))
                hub.run(lambda: asyncio.wait_for(writer.close(), _STOP_SECONDS))
        except Exception as error:
            logger.info("closing the checkpoint store failed (%s: %s); the query's records expire on their own",
                        type(error).__name__, error)
        finally:
            hub.close()


class EventHubsBatchReader(DataSourceReader):
    """``spark.read.format("eventhubs")``: from the starting positions (or the store's
    checkpoints) to ``eventhubs.endingPosition(s)`` (default: the end of each
    partition when the read is planned)."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def __repr__(self) -> str:
        return f"EventHubsBatchReader(eventhub={self._options.eventhub_name!r})"

    def partitions(self) -> list[InputPartition]:
        options = self._options
        writer = None
        if options.store is not None:
            writer = CheckpointWriter(options.store, options.fully_qualified_namespace, options.eventhub_name,
                                      options.consumer_group)
        with DriverHub(options) as hub:
            try:
                properties = hub.properties()
                start = _starting(options, hub, writer, properties)
                ends = hub.ending_sequence_numbers({pid: options.ending(pid) for pid in properties}, properties)
            finally:
                if writer is not None:
                    hub.run(writer.close)
        lost = data_loss(start, properties)
        if lost and options.fail_on_data_loss:
            raise DataLossError("; ".join(d.message() for d in lost) + ". Set failOnDataLoss=false to read from the "
                                "earliest events", fully_qualified_namespace=options.fully_qualified_namespace,
                                eventhub_name=options.eventhub_name, reason="refused")
        begins = {pid: max(p.sequence_number, properties[pid].beginning_sequence_number)
                  for pid, p in start.partitions.items()}
        end = HubOffset(options.eventhub_name, {pid: PartitionPosition(max(ends[pid], begins[pid]))
                                                for pid in start.partitions})
        begin = HubOffset(options.eventhub_name, {pid: PartitionPosition(seq) for pid, seq in begins.items()})
        return [EventHubsPartition(r) for r in plan_ranges(begin, end, options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, EventHubsPartition):
            return iter(())
        return read_range(self._options, partition.read)
