"""SparkSink: the partition-processor factory that turns a processor's partitions into
micro-batches, and runs each through the states of :mod:`~eventprocessor.spark.attempt`.
See the package docstring (:mod:`eventprocessor.spark`) for the contract."""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any

from .._runtime.backoff import Backoff
from .._sink_handler import SinkHandler
from ..errors import ConfigurationError, OwnershipLostError, PoisonEventsError
from ..events import Event
from ..partition import PartitionContext, PartitionProcessor, claim_of
from ..policies import CloseReason, DeadLetter, PoisonPolicy, RetryPolicy
from ..stores.contract import CheckpointStore
from .arrow import Decoder
from .attempt import BatchSteps, MicroBatch, Offload
from .claims import Buffers, Claim, ClaimState, Limits
from .commit_log import PLANNED, CommitLog
from .output import ForeachBatch, OutputLocation, StepHook, Writer
from .pipeline import BatchPipeline, SinkStats
from .session import spark_session
from .sink_output import SinkOutput

__all__ = ["SparkSink", "WRITE_RETRY_POLICY"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 30.0

WRITE_RETRY_POLICY = RetryPolicy(max_delivery_attempts=8, retry_backoff=1.0, max_retry_backoff=60.0)
"""How often a failing batch write is tried by default: 8 attempts, 1 s backoff doubling
up to 60 s (about two minutes of retries) before the poison policy applies."""


class SparkSink:
    """Hands the events of every partition a processor owns to Spark as micro-batches,
    exactly once.

    The sink is the processor's partition-processor factory: each claim gets a handler
    feeding one shared set of buffers. A batch is cut at ``max_events`` events,
    ``max_bytes`` of bodies, or ``max_interval`` seconds after its first event,
    whichever comes first. Each batch becomes one DataFrame (see
    :data:`~eventprocessor.spark.EVENT_SCHEMA`, plus ``decode``'s columns) built from
    Arrow, and goes to ``foreach_batch(df, batch_id[, batch])`` or, by default, is
    appended as Parquet to ``path`` partitioned by ``partition_by`` and published in
    Spark's ``_spark_metadata`` log, so that ``spark.read.parquet(path)`` sees whole
    batches only.

    * ``path``: where the table goes: a local or mounted path, or any URI Spark writes
      (``abfss://``, ``s3a://``, ``hdfs://``; see ``filesystem``).
    * ``commit_log``: where the commit log lives. A :class:`CheckpointStore` (the one the
      processors share: Blob, Table or in-memory) keeps it as entries of log
      ``log_name`` (default: derived from ``path``): processors on different hosts
      need nothing mounted. A directory (a path) keeps it as files on a POSIX file
      system all processors share. Default: the directory
      ``<path>/_eventprocessor_commits`` for a local ``path``; required otherwise.
    * ``filesystem``: the :class:`pyarrow.fs.FileSystem` the sink uses for its own file
      operations on ``path`` (listing staged files, moving them, ``_spark_metadata``);
      by default made from ``path``'s URI.
    * ``partition_by``: column(s) of the table's directories, e.g. ``"partition_id"``,
      ``"enqueued_date"`` or a column of ``decode``; ``None`` for none.
    * ``decode``: Arrow table of the batch -> extra columns (see :func:`json_body`).
    * ``spark``, or ``master``/``remote`` and ``spark_conf``: the session (see
      :func:`~eventprocessor.spark.spark_session`): classic or Spark Connect; the sink
      uses only the DataFrame API, so both work the same.
    * ``write_options``: options of the Parquet writer (e.g. ``{"compression": "zstd"}``).
    * ``retry_policy``, ``on_poison``, ``dead_letter``: a batch whose write fails (a Spark
      error, a raising ``foreach_batch`` or ``decode``) is written again with the same
      ``batch_id`` after ``retry_policy``'s backoff, up to its
      ``max_delivery_attempts`` (default :data:`WRITE_RETRY_POLICY`: 8 attempts over about
      two minutes, long enough for a cluster to restart); then the poison policy
      applies, as for handler errors:
      :attr:`PoisonPolicy.PARK` (the default here) gives the batch up and parks its
      partitions (their events are neither written nor checkpointed until the processor
      restarts); :attr:`PoisonPolicy.SKIP` awaits ``dead_letter(events, error, context)``
      per partition, then commits the batch without data, so the checkpoints move past it.
      ``last_error`` keeps the last error; ``parked`` the parked partitions.
    * ``log_retention``: seconds the commit log keeps entries below a snapshot (see
      :class:`~eventprocessor.spark.CommitLog`).
    * ``step_hook``: called with the name of each step a batch reaches: ``after_plan``;
      ``after_write`` (data staged, not committed); ``after_commit``; ``mid_publish`` (one
      file moved into the table); ``after_publish`` (before the store checkpoints);
      ``after_checkpoint``. For fault-injection tests and tracing; it runs on the event
      loop or in the sink's worker threads, so keep it quick.
    * ``offload``: how the sink runs its blocking calls (Spark, ``decode``,
      ``foreach_batch``, its file operations): ``await offload(function, *args)``.
      Default ``asyncio.to_thread``; a test on virtual time passes one that takes
      virtual time.

    One sink serves one event loop and one event hub/consumer group; several processors
    (in one or many processes, on one or many hosts) may write to the same ``path``.

    Example::

        sink = SparkSink("abfss://lake@account.dfs.core.windows.net/events", commit_log=store,
                         remote="sc://spark-connect:15002", partition_by="enqueued_date")
        async with EventProcessor(source, store, sink):
            await asyncio.sleep(60)
        await sink.close()
    """

    def __init__(
        self,
        path: str | os.PathLike | None = None,
        *,
        foreach_batch: ForeachBatch | None = None,
        commit_log: str | os.PathLike | CheckpointStore | None = None,
        log_name: str | None = None,
        filesystem: Any = None,
        partition_by: str | Sequence[str] | None = "partition_id",
        max_events: int = 10_000,
        max_bytes: int = 64 * 1024 * 1024,
        max_interval: float = 5.0,
        decode: Decoder | None = None,
        spark: Any = None,
        master: str | None = None,
        remote: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
        write_options: Mapping[str, str] | None = None,
        retry_policy: RetryPolicy | None = None,
        on_poison: PoisonPolicy | str = PoisonPolicy.PARK,
        dead_letter: DeadLetter | None = None,
        log_retention: float = 900.0,
        step_hook: StepHook | None = None,
        offload: Offload | None = None,
    ) -> None:
        if max_events < 1:
            raise ConfigurationError(f"max_events must be at least 1, got {max_events}")
        if max_bytes < 1:
            raise ConfigurationError(f"max_bytes must be at least 1, got {max_bytes}")
        if max_interval <= 0:
            raise ConfigurationError(f"max_interval must be positive, got {max_interval}")
        if decode is not None and not callable(decode):
            raise ConfigurationError("decode must be a callable taking a pyarrow Table")
        if spark is not None and (master is not None or remote is not None or spark_conf):
            raise ConfigurationError("pass either spark or master/remote/spark_conf, not both")
        if master is not None and remote is not None:
            raise ConfigurationError("pass either master (a classic session) or remote (Spark Connect), not both")
        try:
            self.on_poison = PoisonPolicy(on_poison)
        except ValueError:
            raise ConfigurationError(f"unknown on_poison {on_poison!r}; use 'skip' or 'park'") from None
        if dead_letter is not None and not callable(dead_letter):
            raise ConfigurationError("dead_letter must be an async callable (events, error, context)")
        if step_hook is not None and not callable(step_hook):
            raise ConfigurationError("step_hook must be callable with the name of a step")
        if offload is not None and not callable(offload):
            raise ConfigurationError("offload must be an async callable: await offload(function, *args)")
        self.partition_by = [partition_by] if isinstance(partition_by, str) else list(partition_by or [])
        self._hook: StepHook = step_hook or (lambda _step: None)
        output = SinkOutput.choose(path=path, foreach_batch=foreach_batch, commit_log=commit_log, log_name=log_name,
                                   filesystem=filesystem, partition_by=self.partition_by,
                                   write_options=write_options, step_hook=self._hook)
        self._output = output
        self.location: OutputLocation | None = output.location
        self.log_name: str | None = output.log_name
        self._writer: Writer = output.writer
        self._limits = Limits(int(max_events), int(max_bytes), float(max_interval))
        self.decode = decode
        self.retry_policy = retry_policy or WRITE_RETRY_POLICY
        self.dead_letter = dead_letter
        self.log_retention = float(log_retention)
        self._offload: Offload = offload or asyncio.to_thread
        self._spark = spark
        self._master = master
        self._remote = remote
        self._spark_conf = dict(spark_conf or {})
        self._spark_lock = threading.Lock()
        self._log: CommitLog | None = None
        self._buffers: Buffers | None = None
        self._pipeline: BatchPipeline | None = None
        self._open_claims = 0
        self.stats = SinkStats()

    def __repr__(self) -> str:
        target = self.location.spark_root if self.location is not None else "foreach_batch"
        return (f"SparkSink(target={target!r}, max_events={self.max_events}, max_bytes={self.max_bytes}, "
                f"max_interval={self.max_interval})")

    # ------------------------------------------------------------------ settings
    @property
    def max_events(self) -> int:
        return self._limits.max_events

    @max_events.setter
    def max_events(self, value: int) -> None:
        self._limits.max_events = int(value)

    @property
    def max_bytes(self) -> int:
        return self._limits.max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._limits.max_bytes = int(value)

    @property
    def max_interval(self) -> float:
        return self._limits.max_interval

    @max_interval.setter
    def max_interval(self, value: float) -> None:
        self._limits.max_interval = float(value)

    # ------------------------------------------------------------------ what it did
    @property
    def batches_committed(self) -> int:
        return self.stats.batches_committed

    @property
    def events_committed(self) -> int:
        return self.stats.events_committed

    @property
    def last_batch(self) -> MicroBatch | None:
        return self.stats.last_batch

    @property
    def last_error(self) -> BaseException | None:
        """The last error of a write, the commit log or a publication (kept after recovery)."""
        return self.stats.last_error

    @property
    def parked(self) -> dict[str, PoisonEventsError]:
        """Partitions parked by the poison policy, with the error that parked them."""
        return self.stats.parked

    @property
    def step_timings(self) -> deque[dict[str, float]]:
        """Seconds each step took, per committed batch (the last 10,000)."""
        return self.stats.step_timings

    # ------------------------------------------------------------------ public API
    def __call__(self) -> PartitionProcessor:
        """One handler per partition claim; the processor calls this."""
        return SinkHandler(self, Claim)

    @property
    def spark(self) -> Any:
        """The SparkSession the sink writes with (created on first use)."""
        with self._spark_lock:
            if self._spark is None:
                self._spark = spark_session(self._master, self._spark_conf, remote=self._remote)
            return self._spark

    @property
    def commit_log(self) -> CommitLog | None:
        """The commit log (``None`` until the first claim starts)."""
        return self._log

    def committed_high_water_marks(self) -> dict[str, int]:
        """The highest committed sequence number of each partition, as this sink last
        read the commit log (its own commits included)."""
        return self._log.known_high_water_marks() if self._log is not None else {}

    async def high_water_marks(self) -> dict[str, int]:
        """The highest committed sequence number of each partition, read from the commit
        log now (every processor's commits)."""
        return await self._log.high_water_marks() if self._log is not None else {}

    async def flush(self) -> None:
        """Write everything buffered now, and wait until every batch is committed,
        published and checkpointed."""
        if self._pipeline is not None:
            await self._pipeline.flush()

    async def close(self) -> None:
        """Flush and stop the background tasks. The sink can be used again later."""
        await self.flush()
        if self._pipeline is not None:
            await self._pipeline.stop()
        if self._log is not None:
            await self._log.aclose()

    async def __aenter__(self) -> SparkSink:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ------------------------------------------------------------------ tasks
    def _ensure_running(self) -> Buffers:
        if self._buffers is None or self._pipeline is None:
            self._buffers = Buffers(self._limits)
            self._pipeline = BatchPipeline(self._buffers, self, self.stats, policy=self.retry_policy,
                                           on_poison=self.on_poison, dead_letter=self.dead_letter)
            if self._log is not None:
                self._pipeline.steps = self._steps_for(self._log)
        self._pipeline.start()
        return self._buffers

    def _steps_for(self, log: CommitLog) -> BatchSteps:
        return BatchSteps(log, self._writer, lambda: self.spark, self.decode, self.partition_by, self._hook,
                          self._offload)

    async def _log_for(self, ctx: PartitionContext) -> CommitLog:
        if self._log is None:
            self._log = self._output.open_log(ctx, self.log_retention)
            if self._pipeline is not None:
                self._pipeline.steps = self._steps_for(self._log)
        return self._log

    # ------------------------------------------------------------------ claims
    async def _open(self, claim: Claim) -> None:
        buffers = self._ensure_running()
        buffers.register(claim)
        self._open_claims += 1
        await self._fence(claim)

    async def _fence(self, claim: Claim) -> None:
        """Fence the claim in the commit log (retrying a failing log while the claim
        lasts), then roll forward what needs it. A stale claim ends at once."""
        ctx = claim.context
        retry = Backoff(0.5, cap=_MAX_BACKOFF)
        while claim.state is ClaimState.FENCING:
            try:
                log = await self._log_for(ctx)
                result = await log.fence(ctx.partition_id, owner_id=ctx.owner_id, epoch=ctx.epoch,
                                         claim_token=claim.token)
            except OwnershipLostError as stale:
                logger.error("sink: owner %s cannot start partition %s of %s/%s: %s. The claim ends now, so that "
                             "the partition's current owner goes on. (If no other processor owns it, the commit "
                             "log is older than the checkpoint store: use a new output or log_name.)",
                             ctx.owner_id, ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, stale)
                self.end(claim, fenced_out=True)
                return
            except Exception as error:
                self.stats.last_error = error
                if not ctx.is_owned:
                    self.end(claim)
                    return
                delay = retry.next()
                logger.warning("sink: fencing partition %s of %s/%s in the commit log failed (%r); retrying in "
                               "%.1f s", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error, delay)
                await asyncio.sleep(delay)
                continue
            claim.committed_high_water_mark = result.high_water_mark
            claim.last_sequence_number = -1 if result.high_water_mark is None else result.high_water_mark
            claim.cut_through = claim.last_sequence_number
            claim.state = ClaimState.ACTIVE
            logger.info("sink: owner %s starts partition %s of %s/%s (epoch %s) after committed sequence number %s",
                        ctx.owner_id, ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, ctx.epoch,
                        result.high_water_mark)
            await self._recover(log, result.aborted)

    async def _recover(self, log: CommitLog, aborted: Sequence[int]) -> None:
        """Roll committed batches forward into the table and clear staged files of
        batches that are over. Failures are logged; the next fence tries again."""
        try:
            for batch_id in aborted:
                await self._offload(self._writer.discard, batch_id)
            publications = log.unpublished()
            if publications:
                published, moved = await self._offload(self._writer.publish, publications)
                log.mark_published(publications[-1].number)
                if published:
                    logger.info("sink: rolled committed batch(es) %s forward into %s (%d files moved)", published,
                                self.location.spark_root if self.location else "-", moved)
            for batch_id in await self._offload(self._writer.staged_batches):
                if batch_id >= log.next_version or log.outcome(batch_id) == PLANNED:
                    continue  # planned (or newer than what was read): its writer or a later fence decides
                if log.is_resolved_and_published(batch_id):
                    await self._offload(self._writer.discard, batch_id)
                    logger.info("sink: removed the staged files of finished batch %s (%s)", batch_id,
                                log.outcome(batch_id) or "compacted")
        except Exception as error:
            self.stats.last_error = error
            logger.warning("sink: rolling batches forward failed (%r); the next claim tries again", error)

    async def _add(self, claim: Claim, events: list[Event]) -> None:
        if claim.state is ClaimState.FENCING:
            await self._fence(claim)
        if not claim.accepting or not events:
            return  # ended or parked: the events belong to the partition's next claim
        if events[0].sequence_number > claim.last_sequence_number:
            fresh = events  # the common case: nothing to skip, nothing to copy
        else:
            fresh = [e for e in events if e.sequence_number > claim.last_sequence_number]
            await self._catch_up_checkpoint(claim, events)
        if not fresh:
            return
        claim.last_sequence_number = fresh[-1].sequence_number
        assert self._buffers is not None
        self._buffers.add(claim, fresh)
        await self._buffers.wait_for_space(claim)

    async def _catch_up_checkpoint(self, claim: Claim, events: list[Event]) -> None:
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
                    logger.info("sink: owner %s moved the checkpoint of partition %s of %s/%s up to the committed "
                                "sequence number %s", ctx.owner_id, ctx.partition_id, ctx.eventhub_name,
                                ctx.consumer_group, hwm)
                except OwnershipLostError:
                    self.end(claim)
                except Exception as error:
                    logger.warning("sink: checkpoint of partition %s of %s/%s by %s failed: %r", ctx.partition_id,
                                   ctx.eventhub_name, ctx.consumer_group, ctx.owner_id, error)
                return

    def end(self, claim: Claim, *, fenced_out: bool = False) -> None:
        """The claim takes nothing more; its buffered events are dropped (its partition's
        next claim reads them again). ``fenced_out``: the commit log names a newer claim,
        so the processor is told to stop the claim now rather than when its lease ends."""
        if claim.state is not ClaimState.PARKED:
            claim.state = ClaimState.ENDED
        dropped = self._buffers.drop(claim) if self._buffers is not None else 0
        if dropped:
            logger.info("sink: dropping %d buffered events of partition %s (epoch %s): the claim ended", dropped,
                        claim.partition_id, claim.context.epoch)
        if fenced_out:
            claim_of(claim.context).fence_lost()

    def park(self, claim: Claim, error: PoisonEventsError) -> None:
        """The poison policy gave the claim's batch up: nothing more of it is written or
        checkpointed until the processor restarts (it keeps the partition)."""
        claim.state = ClaimState.PARKED
        self.stats.parked[claim.partition_id] = error
        if self._buffers is not None:
            self._buffers.drop(claim)
        ctx = claim.context
        logger.error("sink: partition %s of %s/%s is parked: its events are neither written nor checkpointed until "
                     "the processor restarts", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group)

    async def _close(self, claim: Claim, reason: CloseReason) -> None:
        """A stop or a handoff commits what the claim buffered, while it still holds its
        lease, and the last one stops the background tasks. A lost claim only drops what
        it buffered: it never waits for Spark (its batches in flight finish on their own,
        and the commit log decides whether they count)."""
        graceful = reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF)
        try:
            if graceful and claim.accepting:
                await self.flush()
        finally:
            self.end(claim)
            self._open_claims -= 1
            if graceful and self._open_claims <= 0 and self._pipeline is not None and \
                    (self._buffers is None or not self._buffers.events):
                await self._pipeline.stop()
