"""SparkSink: the micro-batcher, the writers and the Spark session. See the package
docstring (:mod:`eventprocessor.spark`) for the contract."""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union

import pyarrow as pa

from ..errors import ConfigurationError, OwnershipLostError
from ..events import Event
from ..partition import CloseReason, PartitionContext, PartitionProcessor
from .arrow import Decoder, add_user_columns, events_to_table
from .commit_log import BatchRefused, CommitLog, PartitionRange, COMMITTED, ABORTED

__all__ = ["SparkSink", "MicroBatch", "spark_session", "STAGING_DIR", "COMMITS_DIR"]

logger = logging.getLogger(__name__)

STAGING_DIR = "_eventprocessor_staging"
COMMITS_DIR = "_eventprocessor_commits"

ForeachBatch = Callable[..., Any]


@dataclass(frozen=True)
class MicroBatch:
    """What a micro-batch holds, for an idempotent ``foreach_batch``.

    ``batch_id`` is the batch's version in the commit log: unique across every
    processor writing to the same log, and always the same data. ``ranges`` maps each
    partition id to its inclusive sequence-number range, with the claim that read it.

    Example::

        def foreach_batch(df, batch_id, batch):
            for pid, r in batch.ranges.items():
                print(pid, r.first_sequence_number, r.last_sequence_number)
            df.write.mode("overwrite").parquet(f"/data/out/batch_id={batch_id}")
    """

    batch_id: int
    ranges: Mapping[str, PartitionRange]
    event_count: int
    byte_count: int


def spark_session(master: Optional[str] = None, conf: Optional[Mapping[str, str]] = None,
                  app_name: str = "eventprocessor-spark-sink") -> Any:
    """The active SparkSession, or a new one.

    Without ``master`` and ``conf`` an active session is reused as is. Otherwise a
    session is built with ``master`` (default ``local[*]``). A local master binds the
    driver to 127.0.0.1. Arrow conversion is on and the UI off unless ``conf`` says
    otherwise. Nothing is downloaded: no ``spark.jars.packages`` is set.

    Example::

        spark = spark_session("spark://head:7077", {"spark.executor.memory": "4g"})
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None and master is None and not conf:
        return active
    master = master or "local[*]"
    settings: Dict[str, str] = {
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        # Read partition_id=0 back as the string it was written as, not as an int.
        "spark.sql.sources.partitionColumnTypeInference.enabled": "false",
    }
    if master.startswith("local"):
        settings.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    settings.update({str(k): str(v) for k, v in (conf or {}).items()})
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    logger.info("Spark session ready (master %s, Spark %s)", master, session.version)
    return session


def _create_dataframe(spark: Any, table: pa.Table) -> Any:
    """Arrow table to DataFrame without Python rows: Spark 4 takes Arrow directly,
    Spark 3.5 goes through pandas with Arrow enabled."""
    major = int(str(spark.version).split(".")[0])
    if major >= 4:
        return spark.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema  # type: ignore[attr-defined]

    return spark.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))


def _local_path(value: Union[str, os.PathLike], what: str) -> Path:
    text = os.fspath(value)
    if "://" in text:
        scheme, rest = text.split("://", 1)
        if scheme != "file":
            raise ConfigurationError(
                f"{what} {scheme}://... is not supported: the commit log and the default Parquet writer need a "
                "POSIX file system (local disk, NFS, a mounted volume). For other stores pass foreach_batch "
                "with a local checkpoint_location.")
        text = rest
    return Path(text).absolute()


class _Claim:
    """One partition claim as the sink sees it: the buffered events and where the
    commit log says the partition stands."""

    def __init__(self, context: PartitionContext) -> None:
        self.context = context
        self.partition_id = context.partition_id
        self.fenced = False
        self.lost = False
        self.last_sequence_number = -1  # highest sequence number accepted (committed or buffered)
        self.committed_high_water_mark: Optional[int] = None  # from the commit log, at the fence
        self.events: List[Event] = []

    def __repr__(self) -> str:
        return f"_Claim(partition_id={self.partition_id!r}, epoch={self.context.epoch}, lost={self.lost})"


class _ParquetWriter:
    """Stages a batch's Parquet under ``_eventprocessor_staging/<batch_id>`` and moves
    the files into the table once the batch is committed."""

    def __init__(self, path: Path, partition_by: Sequence[str], options: Mapping[str, str]) -> None:
        self.path = path
        self.staging = path / STAGING_DIR
        self.partition_by = list(partition_by)
        # The sink's own commit (staging + commit log) makes the Hadoop committer's
        # second round of renames redundant: task output may go straight to the staging
        # directory, which nobody reads until the batch is committed.
        self.options = {"mapreduce.fileoutputcommitter.algorithm.version": "2",
                        "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false", **dict(options)}

    def _dir(self, batch_id: int) -> Path:
        return self.staging / f"{batch_id:012d}"

    def write(self, df: Any, batch: MicroBatch) -> None:
        target = self._dir(batch.batch_id)
        shutil.rmtree(target, ignore_errors=True)  # a failed attempt of the same batch
        writer = df.write.mode("overwrite")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        if self.options:
            writer = writer.options(**self.options)
        writer.parquet(str(target))

    def publish(self, batch_id: int) -> int:
        """Move a committed batch's files into the table. Idempotent and safe to run
        concurrently with another publisher of the same batch (roll-forward)."""
        source = self._dir(batch_id)
        moved = 0
        for root, _dirs, files in os.walk(source):
            for name in files:
                if name.startswith((".", "_")):
                    continue  # checksums and _SUCCESS markers
                relative = Path(root).relative_to(source)
                destination_dir = self.path / relative
                destination_dir.mkdir(parents=True, exist_ok=True)
                try:
                    os.rename(Path(root) / name, destination_dir / f"b{batch_id:012d}-{name}")
                    moved += 1
                    if moved == 1:
                        _hook("mid_publish")
                except FileNotFoundError:
                    pass  # another publisher moved it
        shutil.rmtree(source, ignore_errors=True)
        return moved

    def discard(self, batch_id: int) -> None:
        shutil.rmtree(self._dir(batch_id), ignore_errors=True)

    def recover(self, log: CommitLog) -> None:
        """Roll committed batches forward, clear aborted ones; leave pending ones to
        their writers (or to the fence that will abort them)."""
        if not self.staging.is_dir():
            return
        log.refresh()
        for entry in sorted(self.staging.iterdir()):
            if not entry.name.isdigit():
                continue
            batch_id = int(entry.name)
            outcome = log.outcome(batch_id)
            if outcome == COMMITTED:
                moved = self.publish(batch_id)
                logger.info("rolled committed batch %s forward into %s (%d files)", batch_id, self.path, moved)
            elif outcome == ABORTED:
                self.discard(batch_id)
                logger.info("removed the staged files of aborted batch %s", batch_id)


class _ForeachBatchWriter:
    def __init__(self, function: ForeachBatch) -> None:
        self.function = function
        try:
            parameters = [p for p in inspect.signature(function).parameters.values()
                          if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            variadic = any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            parameters, variadic = [], False
        self.wants_batch = variadic or len(parameters) >= 3

    def write(self, df: Any, batch: MicroBatch) -> None:
        if self.wants_batch:
            self.function(df, batch.batch_id, batch)
        else:
            self.function(df, batch.batch_id)

    def publish(self, batch_id: int) -> int:
        return 0

    def discard(self, batch_id: int) -> None:
        pass

    def recover(self, log: CommitLog) -> None:
        pass


class _Attempt:
    """A sealed micro-batch on its way to being committed."""

    def __init__(self, events: Dict[_Claim, List[Event]]) -> None:
        self.events = events
        self.batch_id: Optional[int] = None
        self.committed: Optional[MicroBatch] = None  # set at the commit point; then only publish is left
        self.batch: Optional[MicroBatch] = None
        self.df: Any = None
        self.timings: Dict[str, float] = {}
        self.byte_count: Optional[int] = None  # of the events as sealed; None once some were dropped

    def drop(self, partition_ids) -> None:
        self.events = {c: e for c, e in self.events.items() if c.partition_id not in partition_ids}
        self.byte_count = None

    def ranges(self) -> List[PartitionRange]:
        return [
            PartitionRange(
                partition_id=claim.partition_id,
                first_sequence_number=events[0].sequence_number,
                last_sequence_number=events[-1].sequence_number,
                last_offset=events[-1].offset,
                count=len(events),
                owner_id=claim.context.owner_id,
                epoch=claim.context.epoch,
            )
            for claim, events in self.events.items()
        ]


class _SinkPartitionProcessor(PartitionProcessor):
    """The per-claim handler the sink hands the processor.

    ``process_events`` only buffers: an event is safe once its batch is committed, and
    the sink checkpoints it then. So the pump must not checkpoint "the last event whose
    ``process_events`` returned" when the claim ends; ``close`` commits what is buffered
    on a stop or a handoff instead, while the claim still holds its lease."""

    checkpoint_on_release = False

    def __init__(self, sink: "SparkSink") -> None:
        self._sink = sink
        self._claim: Optional[_Claim] = None

    async def initialize(self, context: PartitionContext) -> None:
        self._claim = _Claim(context)
        await self._sink._open(self._claim)

    async def process_events(self, events: List[Event], context: PartitionContext) -> None:
        if self._claim is None:
            self._claim = _Claim(context)
        await self._sink._add(self._claim, events)

    async def close(self, reason: CloseReason, context: PartitionContext) -> None:
        if self._claim is not None:
            await self._sink._close(self._claim, reason)


class SparkSink:
    """Hands the events of every partition a processor owns to Spark as micro-batches.

    The sink is the processor's partition-processor factory: each claim gets a
    handler feeding one shared batcher. A batch is cut at ``max_events`` events,
    ``max_bytes`` of bodies, or ``max_interval`` seconds after its first event,
    whichever comes first. Each batch becomes one DataFrame (see
    :data:`~eventprocessor.spark.EVENT_SCHEMA`, plus ``decode``'s columns) built from
    Arrow, and goes to ``foreach_batch(df, batch_id[, batch])`` or, by default, is
    appended as Parquet to ``path`` partitioned by ``partition_by``.

    * ``path``: the Parquet table (a POSIX path); or ``foreach_batch`` plus
      ``checkpoint_location`` (the commit log's directory).
    * ``partition_by``: column(s) of the table's directories, e.g. ``"partition_id"``,
      ``"enqueued_date"`` or a column of ``decode``; ``None`` for none.
    * ``decode``: Arrow table of the batch -> extra columns (see :func:`json_body`).
    * ``spark``, or ``master`` and ``spark_conf``: the session (see :func:`spark_session`).
    * ``write_options``: options of the Parquet writer (e.g. ``{"compression": "zstd"}``).
    * ``retry_interval``: a batch whose write fails (Spark error, a raising
      ``foreach_batch`` or ``decode``) is retried with the same ``batch_id`` after this
      many seconds, until it succeeds or its partitions move; ``last_error`` keeps the
      error. Events of the other partitions wait meanwhile (back-pressure).

    One sink serves one event loop and one event hub/consumer group; several
    processors (in one or many processes) may write to the same ``path``.

    Example::

        sink = SparkSink("/data/events", partition_by="enqueued_date", max_events=10_000)
        async with EventProcessor(source, store, sink):
            await asyncio.sleep(60)
        await sink.close()
    """

    def __init__(
        self,
        path: Union[str, os.PathLike, None] = None,
        *,
        foreach_batch: Optional[ForeachBatch] = None,
        checkpoint_location: Union[str, os.PathLike, None] = None,
        partition_by: Union[str, Sequence[str], None] = "partition_id",
        max_events: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        max_interval: float = 5.0,
        decode: Optional[Decoder] = None,
        spark: Any = None,
        master: Optional[str] = None,
        spark_conf: Optional[Mapping[str, str]] = None,
        write_options: Optional[Mapping[str, str]] = None,
        retry_interval: float = 1.0,
    ) -> None:
        if max_events < 1:
            raise ConfigurationError(f"max_events must be at least 1, got {max_events}")
        if max_bytes < 1:
            raise ConfigurationError(f"max_bytes must be at least 1, got {max_bytes}")
        if max_interval <= 0:
            raise ConfigurationError(f"max_interval must be positive, got {max_interval}")
        if decode is not None and not callable(decode):
            raise ConfigurationError("decode must be a callable taking a pyarrow Table")
        if spark is not None and (master is not None or spark_conf):
            raise ConfigurationError("pass either spark or master/spark_conf, not both")
        partition_columns = [partition_by] if isinstance(partition_by, str) else list(partition_by or [])
        if foreach_batch is not None:
            if not callable(foreach_batch):
                raise ConfigurationError("foreach_batch must be callable as foreach_batch(df, batch_id)")
            if path is not None:
                raise ConfigurationError("pass either path (the Parquet writer) or foreach_batch, not both")
            if checkpoint_location is None:
                raise ConfigurationError(
                    "foreach_batch needs checkpoint_location: the directory of the sink's commit log")
            self._writer: Union[_ParquetWriter, _ForeachBatchWriter] = _ForeachBatchWriter(foreach_batch)
            self.path: Optional[Path] = None
        else:
            if path is None:
                raise ConfigurationError("SparkSink needs a path for the Parquet writer, or foreach_batch")
            self.path = _local_path(path, "path")
            self._writer = _ParquetWriter(self.path, partition_columns, write_options or {})
        self.checkpoint_location = (
            _local_path(checkpoint_location, "checkpoint_location") if checkpoint_location is not None
            else self.path / COMMITS_DIR  # type: ignore[operator]
        )
        self.partition_by = partition_columns
        self.max_events = int(max_events)
        self.max_bytes = int(max_bytes)
        self.max_interval = float(max_interval)
        self.decode = decode
        self.retry_interval = float(retry_interval)
        self._spark = spark
        self._master = master
        self._spark_conf = dict(spark_conf or {})
        self._log: Optional[CommitLog] = None
        self._log_lock = threading.Lock()
        self._claims: Dict[str, _Claim] = {}
        self._open_claims = 0
        self._buffered_events = 0
        self._buffered_bytes = 0
        self._first_buffered_at = 0.0
        self._rotation = 0
        self._added: Optional[asyncio.Event] = None
        self._space: Optional[asyncio.Event] = None
        self._seal_lock: Optional[asyncio.Lock] = None
        self._queue: Optional[asyncio.Queue] = None
        self._task: Optional[asyncio.Task] = None
        self._committer: Optional[asyncio.Task] = None
        self.batches_committed = 0
        self.events_committed = 0
        self.last_batch: Optional[MicroBatch] = None
        self.last_error: Optional[BaseException] = None

    def __repr__(self) -> str:
        target = str(self.path) if self.path is not None else "foreach_batch"
        return (f"SparkSink(target={target!r}, max_events={self.max_events}, max_bytes={self.max_bytes}, "
                f"max_interval={self.max_interval})")

    # -------------------------------------------------------------- public API
    def __call__(self) -> PartitionProcessor:
        """One handler per partition claim; the processor calls this."""
        return _SinkPartitionProcessor(self)

    @property
    def spark(self) -> Any:
        """The SparkSession the sink writes with (created on first use)."""
        if self._spark is None:
            self._spark = spark_session(self._master, self._spark_conf)
        return self._spark

    @property
    def commit_log(self) -> Optional[CommitLog]:
        return self._log

    async def flush(self) -> None:
        """Write everything buffered now, and wait until every batch is committed."""
        self._ensure_primitives()
        async with self._seal_lock:  # type: ignore[union-attr]
            while self._buffered_events:
                await self._seal_and_prepare()
        await self._queue.join()  # type: ignore[union-attr]

    async def close(self) -> None:
        """Flush and stop the background batcher. The sink can be used again later."""
        if self._queue is not None:
            await self.flush()
        await self._stop_tasks()

    async def __aenter__(self) -> "SparkSink":
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.close()

    def committed_high_water_marks(self) -> Dict[str, int]:
        """The highest committed sequence number of each partition, from the commit log."""
        return self._log.high_water_marks() if self._log is not None else {}

    # -------------------------------------------------------------- claims
    def _ensure_primitives(self) -> None:
        if self._queue is None:
            self._added = asyncio.Event()
            self._space = asyncio.Event()
            self._seal_lock = asyncio.Lock()
            # One batch prepared (planned, converted) while the one before is written.
            self._queue = asyncio.Queue(maxsize=1)

    def _start_tasks(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="spark-sink-batcher")
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_loop(), name="spark-sink-committer")

    async def _stop_tasks(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            async with self._seal_lock:  # type: ignore[union-attr]
                task.cancel()  # never between sealing a batch and queueing it
            try:
                await task
            except asyncio.CancelledError:
                pass
        committer, self._committer = self._committer, None
        if committer is not None and not committer.done():
            await self._queue.join()  # type: ignore[union-attr]
            committer.cancel()
            try:
                await committer
            except asyncio.CancelledError:
                pass

    def _fence_blocking(self, claim: _Claim) -> Optional[int]:
        ctx = claim.context
        with self._log_lock:
            if self._log is None:
                self._log = CommitLog(self.checkpoint_location,
                                      fully_qualified_namespace=ctx.fully_qualified_namespace,
                                      eventhub_name=ctx.eventhub_name, consumer_group=ctx.consumer_group)
        result = self._log.fence(ctx.partition_id, owner_id=ctx.owner_id, epoch=ctx.epoch)
        for batch_id in result.aborted:
            self._writer.discard(batch_id)
        self._writer.recover(self._log)
        return result.high_water_mark

    async def _open(self, claim: _Claim) -> None:
        self._ensure_primitives()
        previous = self._claims.get(claim.partition_id)
        if previous is not None and previous is not claim:
            self._drop(previous)
        self._claims[claim.partition_id] = claim
        self._open_claims += 1
        self._start_tasks()
        await self._fence(claim)

    async def _fence(self, claim: _Claim) -> None:
        ctx = claim.context
        try:
            hwm = await asyncio.to_thread(self._fence_blocking, claim)
        except OwnershipLostError as error:
            logger.warning("sink: owner %s lost partition %s of %s/%s before starting: %s", ctx.owner_id,
                           ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error)
            claim.lost = True
            return
        claim.fenced = True
        claim.committed_high_water_mark = hwm
        claim.last_sequence_number = -1 if hwm is None else hwm
        logger.info("sink: owner %s starts partition %s of %s/%s (epoch %s) after committed sequence number %s",
                    ctx.owner_id, ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, ctx.epoch, hwm)

    async def _add(self, claim: _Claim, events: List[Event]) -> None:
        if not claim.fenced and not claim.lost:
            await self._fence(claim)  # the fence in initialize failed; raising here makes the pump retry
        if claim.lost or self._claims.get(claim.partition_id) is not claim:
            return  # a stale claim: its events belong to the new owner
        if events and events[0].sequence_number > claim.last_sequence_number:
            fresh = events  # the common case: nothing to skip, nothing to copy
        else:
            fresh = [e for e in events if e.sequence_number > claim.last_sequence_number]
        if len(fresh) < len(events):
            await self._catch_up_checkpoint(claim, events)
        if not fresh:
            return
        claim.last_sequence_number = fresh[-1].sequence_number
        if not self._buffered_events:
            self._first_buffered_at = asyncio.get_running_loop().time()
        claim.events.extend(fresh)
        self._buffered_events += len(fresh)
        self._buffered_bytes += sum(len(e.body) for e in fresh)
        self._added.set()  # type: ignore[union-attr]
        # Back-pressure: one batch buffered while the previous one is being written.
        while (self._buffered_events >= self.max_events or self._buffered_bytes >= self.max_bytes) \
                and not claim.lost:
            self._space.clear()  # type: ignore[union-attr]
            await self._space.wait()  # type: ignore[union-attr]

    async def _catch_up_checkpoint(self, claim: _Claim, events: List[Event]) -> None:
        """The store's checkpoint can trail the commit log (a crash between commit and
        checkpoint): once the committed high-water mark comes by, checkpoint it, so the
        next claim does not read those events again."""
        ctx = claim.context
        hwm = claim.committed_high_water_mark
        stored = ctx.last_checkpoint.sequence_number if ctx.last_checkpoint is not None else -1
        if hwm is None or stored >= hwm:
            return
        for event in events:
            if event.sequence_number == hwm:
                try:
                    await ctx.update_checkpoint(event)
                    logger.info("sink: owner %s moved the checkpoint of partition %s of %s/%s up to the "
                                "committed sequence number %s", ctx.owner_id, ctx.partition_id,
                                ctx.eventhub_name, ctx.consumer_group, hwm)
                except OwnershipLostError:
                    self._drop(claim)
                except Exception as error:
                    logger.warning("sink: checkpoint of partition %s of %s/%s by %s failed: %r",
                                   ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, ctx.owner_id, error)
                return

    def _drop(self, claim: _Claim) -> None:
        claim.lost = True
        if claim.events:
            logger.info("sink: dropping %d buffered events of partition %s (epoch %s): the claim ended",
                        len(claim.events), claim.partition_id, claim.context.epoch)
            self._buffered_events -= len(claim.events)
            self._buffered_bytes -= sum(len(e.body) for e in claim.events)
            claim.events = []
        if self._claims.get(claim.partition_id) is claim:
            del self._claims[claim.partition_id]
        self._space.set()  # type: ignore[union-attr]

    async def _close(self, claim: _Claim, reason: CloseReason) -> None:
        try:
            if reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF) and not claim.lost:
                await self.flush()
        finally:
            self._drop(claim)
            self._open_claims -= 1
            if self._open_claims <= 0 and not self._buffered_events:
                await self._stop_tasks()

    # -------------------------------------------------------------- batching
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while True:
                if self._buffered_events >= self.max_events or self._buffered_bytes >= self.max_bytes:
                    break
                timeout = None
                if self._buffered_events:
                    timeout = self._first_buffered_at + self.max_interval - loop.time()
                    if timeout <= 0:
                        break
                self._added.clear()  # type: ignore[union-attr]
                try:
                    await asyncio.wait_for(self._added.wait(), timeout)  # type: ignore[union-attr]
                except asyncio.TimeoutError:
                    pass
            async with self._seal_lock:  # type: ignore[union-attr]
                if self._buffered_events:
                    await self._seal_and_prepare()

    async def _seal_and_prepare(self) -> None:
        """Cut a batch, plan and convert it, and queue it for the committer. Batches
        are queued in the order they were cut, so each partition's ranges commit in order."""
        attempt = self._seal()
        if not attempt.events:
            return
        logger.debug("sink: sealed %d events of partitions %s", sum(len(e) for e in attempt.events.values()),
                     sorted(c.partition_id for c in attempt.events))
        try:
            await asyncio.to_thread(self._prepare_blocking, attempt)
            logger.debug("sink: prepared batch %s", attempt.batch_id)
        except BatchRefused as refused:
            self._refused(attempt, refused)
        except Exception as error:  # the committer prepares it again, and reports a lasting failure
            logger.debug("sink: preparing batch %s failed, the committer retries: %r", attempt.batch_id, error)
            attempt.df = None
        await self._queue.put(attempt)  # type: ignore[union-attr]

    async def _commit_loop(self) -> None:
        while True:
            attempt = await self._queue.get()  # type: ignore[union-attr]
            try:
                await self._commit(attempt)
            finally:
                self._queue.task_done()  # type: ignore[union-attr]

    def _seal(self) -> _Attempt:
        """Take at most ``max_events`` events and ``max_bytes`` of bodies off the
        buffers: a fair share of each partition first, then the rest in turn. Each
        partition gives a prefix, so its order is kept."""
        claims = [c for c in self._claims.values() if c.events]
        if claims:
            start = self._rotation % len(claims)
            claims = claims[start:] + claims[:start]
            self._rotation += 1
        take = {c: min(len(c.events), max(1, self.max_events // max(1, len(claims)))) for c in claims}
        room = self.max_events - sum(take.values())
        for claim in claims:
            extra = max(0, min(len(claim.events) - take[claim], room))
            take[claim] += extra
            room -= extra
        sealed: Dict[_Claim, List[Event]] = {}
        if self._buffered_bytes <= self.max_bytes:
            # Everything buffered fits the byte budget: no need to size each event.
            for claim in claims:
                sealed[claim] = claim.events[:take[claim]]
                del claim.events[:take[claim]]
            nbytes = sum(len(e.body) for events in sealed.values() for e in events) \
                if any(claim.events for claim in claims) else self._buffered_bytes
            return self._sealed(sealed, nbytes)
        nbytes = 0
        for claim in claims:
            count = 0
            for event in claim.events[:take[claim]]:
                size = len(event.body)
                if nbytes + size > self.max_bytes and (sealed or count):
                    break
                nbytes += size
                count += 1
            if count:
                sealed[claim] = claim.events[:count]
                del claim.events[:count]
            if count < take[claim]:
                break  # the byte budget is spent
        return self._sealed(sealed, nbytes)

    def _sealed(self, sealed: Dict[_Claim, List[Event]], nbytes: int) -> _Attempt:
        self._buffered_events -= sum(len(events) for events in sealed.values())
        self._buffered_bytes -= nbytes
        if self._buffered_events:
            self._first_buffered_at = asyncio.get_running_loop().time()
        self._space.set()  # type: ignore[union-attr]
        attempt = _Attempt(sealed)
        attempt.byte_count = nbytes
        return attempt

    def _refused(self, attempt: _Attempt, refused: BatchRefused) -> None:
        logger.warning("sink: %s; dropping the events of %s (their new owner reads them), going on with the rest",
                       refused, sorted(refused.lost))
        for claim in attempt.events:
            if claim.partition_id in refused.lost:
                claim.lost = True
        attempt.drop(refused.lost)
        attempt.batch_id = None
        attempt.df = None

    async def _commit(self, attempt: _Attempt) -> None:
        while True:
            stale = {c.partition_id for c in attempt.events if c.lost or not c.context.is_owned}
            if stale and attempt.committed is None:
                attempt.drop(stale)
                if attempt.batch_id is not None:
                    await asyncio.to_thread(self._abandon, attempt)
            if not attempt.events:
                return
            try:
                batch = await asyncio.to_thread(self._finish_blocking, attempt)
                break
            except BatchRefused as refused:
                self._refused(attempt, refused)
            except Exception as error:
                self.last_error = error
                attempt.df = None
                logger.exception("sink: writing batch %s failed; retrying in %.1f s", attempt.batch_id,
                                 self.retry_interval)
                await asyncio.sleep(self.retry_interval)
        self.batches_committed += 1
        self.events_committed += batch.event_count
        self.last_batch = batch
        for claim, events in attempt.events.items():
            ctx = claim.context
            try:
                await ctx.update_checkpoint(events[-1])
            except OwnershipLostError as error:
                # The data is committed in the commit log, so the new owner skips it anyway.
                logger.info("sink: checkpoint of partition %s of %s/%s after batch %s refused: %s",
                            ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, batch.batch_id, error)
            except Exception as error:
                logger.warning("sink: checkpoint of partition %s of %s/%s by %s after batch %s failed: %r",
                               ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, ctx.owner_id,
                               batch.batch_id, error)
        _hook("after_checkpoint")

    def _abandon(self, attempt: _Attempt) -> None:
        if attempt.batch_id is not None and self._log is not None:
            self._log.abort(attempt.batch_id)
            self._writer.discard(attempt.batch_id)
            attempt.batch_id = None
            attempt.df = None

    def _prepare_blocking(self, attempt: _Attempt) -> None:
        """Plan the batch in the commit log (once) and build its DataFrame."""
        log = self._log
        assert log is not None, "a claim is fenced before its events are buffered"
        started = time.perf_counter()
        ranges = attempt.ranges()
        if attempt.batch_id is None:
            attempt.batch_id = log.begin(ranges)
        attempt.batch = MicroBatch(
            batch_id=attempt.batch_id,
            ranges={r.partition_id: r for r in ranges},
            event_count=sum(r.count for r in ranges),
            byte_count=attempt.byte_count if attempt.byte_count is not None
            else sum(len(e.body) for events in attempt.events.values() for e in events),
        )
        planned = time.perf_counter()
        table = events_to_table([(claim.partition_id, events) for claim, events in attempt.events.items()])
        table = add_user_columns(table, self.decode, self.partition_by)
        converted = time.perf_counter()
        attempt.df = _create_dataframe(self.spark, table)
        attempt.timings = {"plan": planned - started, "arrow": converted - planned,
                           "dataframe": time.perf_counter() - converted}

    def _finish_blocking(self, attempt: _Attempt) -> MicroBatch:
        """Write, commit and publish a prepared batch (preparing it again if needed)."""
        log = self._log
        assert log is not None, "a claim is fenced before its events are buffered"
        if attempt.committed is not None:
            # Committed, but publishing failed: only roll forward, never write again.
            self._writer.publish(attempt.committed.batch_id)
            return attempt.committed
        if attempt.df is None or attempt.batch_id is None or attempt.batch is None:
            self._prepare_blocking(attempt)
        batch = attempt.batch
        assert batch is not None, "preparing a batch sets it"
        ranges = list(batch.ranges.values())
        logger.debug("sink: writing batch %s", batch.batch_id)
        started = time.perf_counter()
        try:
            self._writer.write(attempt.df, batch)
        except Exception as error:
            # A newer claim may have aborted the batch and removed its staging
            # directory under the running job: that is a refusal, not a failure.
            log.refresh()
            if log.outcome(batch.batch_id) == ABORTED:
                self._writer.discard(batch.batch_id)
                lost = log.lost_partitions(ranges) or [r.partition_id for r in ranges]
                raise BatchRefused(f"batch {batch.batch_id} was aborted by a newer claim while it was written",
                                   lost) from error
            raise
        written = time.perf_counter()
        _hook("after_write")
        # Last cheap check before the commit point; the commit log is the real fence.
        stale = [c.partition_id for c in attempt.events if not c.context.is_owned]
        if stale:
            self._abandon(attempt)
            raise BatchRefused(f"partitions {stale} are no longer owned", stale)
        if not log.commit(batch.batch_id):
            self._writer.discard(batch.batch_id)
            lost = log.lost_partitions(ranges) or [r.partition_id for r in ranges]
            raise BatchRefused(f"batch {batch.batch_id} was aborted by a newer claim", lost)
        attempt.committed = batch
        _hook("after_commit")
        moved = self._writer.publish(batch.batch_id)
        _hook("after_publish")
        steps = dict(attempt.timings, write=written - started, commit=time.perf_counter() - written)
        ctx = next(iter(attempt.events)).context
        logger.info("sink: owner %s committed batch %s of %s/%s: %d events from partitions %s (%d files); "
                    "seconds: %s", ctx.owner_id, batch.batch_id, ctx.eventhub_name, ctx.consumer_group,
                    batch.event_count, sorted(batch.ranges), moved,
                    " ".join(f"{name} {value:.3f}" for name, value in steps.items()))
        return batch


#: Fault-injection point for tests: called with the name of each step of a batch
#: (``after_write``: data staged, not committed; ``after_commit``; ``mid_publish``: one
#: file moved into the table; ``after_publish``: before the store checkpoints;
#: ``after_checkpoint``). ``None`` in normal use. The kill tests set it to a function
#: that SIGKILLs the process at one of them.
fault_hook: Optional[Callable[[str], None]] = None


def _hook(point: str) -> None:
    if fault_hook is not None:
        fault_hook(point)
