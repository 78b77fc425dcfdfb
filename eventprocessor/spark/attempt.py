"""A micro-batch on its way into the output, as explicit states, and the steps that
move it from one state to the next.

::

    cut ──plan──▶ planned ──write──▶ written ──commit──▶ committed ──publish──▶ published ──checkpoint──▶ checkpointed
     │               │                  │
     └───────────────┴──────────────────┴──▶ aborted   (a newer claim fenced a partition, or the batch was given up)

* **cut**: events taken off the partitions' buffers.
* **planned**: the plan is in the commit log; its version is the ``batch_id``.
* **written**: the Parquet writer staged the data (and listed its files), or
  ``foreach_batch`` returned.
* **committed**: the commit entry is in the commit log. This is the commit point: from
  here on the batch is never written again, only rolled forward.
* **published**: the files are in the table and in ``_spark_metadata`` (nothing to do
  for ``foreach_batch``).
* **checkpointed**: the store checkpoints of its partitions were written (or refused
  because the claim ended: harmless, the next owner skips the batch through the log).
* **aborted**: the plan was aborted or given up; staged files are deleted and the
  events go back to the partitions' next owner (or, after a poison policy, to
  ``dead_letter``).

Each step is a method of :class:`BatchSteps`. The :class:`~eventprocessor.spark.SparkSink`
decides what to do when one fails (retry, refuse, poison policy).
"""
from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import OwnershipLostError
from ..events import Event
from .arrow import Decoder, add_user_columns, events_to_table
from .commit_log import ABORTED, BatchRefused, CommitLog, Manifest, PartitionRange
from .output import StepHook, Writer
from .session import create_dataframe

if TYPE_CHECKING:  # pragma: no cover
    from .claims import Claim

__all__ = ["AttemptState", "Attempt", "MicroBatch", "BatchSteps", "Offload"]

logger = logging.getLogger(__name__)

Offload = Callable[..., Awaitable[Any]]
"""Runs a blocking call away from the event loop: ``await offload(function, *args)``
(``asyncio.to_thread`` by default; a virtual-time test passes one that takes virtual time)."""


class AttemptState(enum.Enum):
    CUT = "cut"
    PLANNED = "planned"
    WRITTEN = "written"
    COMMITTED = "committed"
    PUBLISHED = "published"
    CHECKPOINTED = "checkpointed"
    ABORTED = "aborted"


_MOVES = {
    AttemptState.CUT: {AttemptState.PLANNED, AttemptState.ABORTED},
    AttemptState.PLANNED: {AttemptState.WRITTEN, AttemptState.COMMITTED, AttemptState.ABORTED},
    AttemptState.WRITTEN: {AttemptState.COMMITTED, AttemptState.ABORTED},
    AttemptState.COMMITTED: {AttemptState.PUBLISHED},
    AttemptState.PUBLISHED: {AttemptState.CHECKPOINTED},
    AttemptState.CHECKPOINTED: set(),
    AttemptState.ABORTED: set(),
}


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


@dataclass
class Attempt:
    """One micro-batch and where it stands. ``events`` holds, per claim, the events cut
    for it (each a prefix of what the claim had buffered, in order); ``after``, per
    claim, the sequence number they continue (see :class:`PartitionRange`)."""

    events: dict[Claim, list[Event]]
    byte_count: int
    after: dict[Claim, int] = field(default_factory=dict)
    state: AttemptState = AttemptState.CUT
    batch_id: int | None = None
    batch: MicroBatch | None = None
    df: Any = None
    manifest: Manifest | None = None
    publication: int | None = None
    skipped: bool = False
    failures: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    def __repr__(self) -> str:
        return (f"Attempt(batch_id={self.batch_id}, state={self.state.value}, "
                f"partitions={sorted(c.partition_id for c in self.events)}, events={self.event_count})")

    @property
    def event_count(self) -> int:
        return sum(len(events) for events in self.events.values())

    @property
    def partition_ids(self) -> frozenset[str]:
        return frozenset(c.partition_id for c in self.events)

    def move(self, state: AttemptState) -> None:
        if state not in _MOVES[self.state]:
            raise RuntimeError(f"{self!r} cannot go from {self.state.value} to {state.value}")
        self.state = state

    def ranges(self) -> list[PartitionRange]:
        return [PartitionRange(partition_id=claim.partition_id, first_sequence_number=events[0].sequence_number,
                               last_sequence_number=events[-1].sequence_number, last_offset=events[-1].offset,
                               count=len(events), owner_id=claim.context.owner_id, epoch=claim.context.epoch,
                               claim_token=claim.token, after=self.after.get(claim))
                for claim, events in self.events.items()]

    def without(self, partition_ids: Iterable[str]) -> Attempt:
        """A new attempt (state cut) with the events of the other partitions."""
        gone = set(partition_ids)
        events = {c: e for c, e in self.events.items() if c.partition_id not in gone}
        nbytes = sum(len(e.body) for batch in events.values() for e in batch)
        return Attempt(events=events, byte_count=nbytes, after={c: a for c, a in self.after.items() if c in events})

    def timed(self, step: str, started: float) -> None:
        self.timings[step] = self.timings.get(step, 0.0) + time.perf_counter() - started


class BatchSteps:
    """The steps that move an :class:`Attempt` between states (see the module docstring).

    ``spark`` is a function returning the session (made lazily, in a worker thread).
    Spark calls and file operations go through ``offload`` (worker threads by default);
    the event loop only awaits them, so ownership renewals never wait for Spark.
    """

    def __init__(self, log: CommitLog, writer: Writer, spark: Callable[[], Any], decode: Decoder | None,
                 partition_by: list[str], step_hook: StepHook, offload: Offload = asyncio.to_thread) -> None:
        self.log = log
        self.writer = writer
        self._spark = spark
        self.decode = decode
        self.partition_by = partition_by
        self.hook = step_hook
        self.offload = offload

    async def plan(self, attempt: Attempt) -> None:
        """cut -> planned. Raises :class:`BatchRefused` for partitions fenced by a newer claim."""
        started = time.perf_counter()
        ranges = attempt.ranges()
        attempt.batch_id = await self.log.begin(ranges)
        attempt.batch = MicroBatch(batch_id=attempt.batch_id, ranges={r.partition_id: r for r in ranges},
                                   event_count=sum(r.count for r in ranges), byte_count=attempt.byte_count)
        attempt.move(AttemptState.PLANNED)
        attempt.timed("plan", started)
        self.hook("after_plan")

    def _dataframe(self, attempt: Attempt) -> Any:
        started = time.perf_counter()
        table = events_to_table([(claim.partition_id, events) for claim, events in attempt.events.items()])
        table = add_user_columns(table, self.decode, self.partition_by)
        converted = time.perf_counter()
        attempt.timings["arrow"] = converted - started
        df = create_dataframe(self._spark(), table)
        attempt.timings["dataframe"] = time.perf_counter() - converted
        return df

    async def prepare(self, attempt: Attempt) -> None:
        """Build the planned batch's DataFrame ahead of its write (in a worker thread).
        A failure is left for :meth:`write`, which builds it again and reports it."""
        try:
            attempt.df = await self.offload(self._dataframe, attempt)
        except Exception as error:
            logger.debug("sink: preparing batch %s failed; the write retries it: %r", attempt.batch_id, error)
            attempt.df = None

    def _write_blocking(self, attempt: Attempt) -> Manifest | None:
        assert attempt.batch_id is not None and attempt.batch is not None, "a planned attempt has a batch"
        if attempt.df is None:
            attempt.df = self._dataframe(attempt)
        started = time.perf_counter()
        self.writer.write(attempt.df, attempt.batch_id, attempt.batch)
        listed = time.perf_counter()
        attempt.timings["write"] = listed - started
        manifest = self.writer.manifest(attempt.batch_id)
        attempt.timings["list"] = time.perf_counter() - listed
        return manifest

    async def write(self, attempt: Attempt) -> None:
        """planned -> written. Spark writes (or ``foreach_batch`` runs). A failure is
        raised as is, unless the batch was aborted meanwhile (a newer claim fenced one of
        its partitions and may have removed its staging directory): then
        :class:`BatchRefused`."""
        assert attempt.batch_id is not None
        try:
            attempt.manifest = await self.offload(self._write_blocking, attempt)
        except Exception as error:
            attempt.df = None
            await self.log.refresh()
            if self.log.outcome(attempt.batch_id) == ABORTED:
                lost = await self.log.lost_partitions(attempt.ranges()) or attempt.partition_ids
                raise BatchRefused(f"batch {attempt.batch_id} was aborted by a newer claim while it was written",
                                   lost) from error
            raise
        attempt.move(AttemptState.WRITTEN)
        self.hook("after_write")

    async def commit(self, attempt: Attempt, *, skipped: bool = False) -> None:
        """written -> committed (or planned -> committed for a batch skipped by the
        poison policy: no data, the high-water marks still advance). The commit point.
        Raises :class:`BatchRefused` when a newer claim fenced one of its partitions first."""
        assert attempt.batch_id is not None
        started = time.perf_counter()
        files = None if skipped else attempt.manifest
        attempt.publication = await self.log.commit(attempt.batch_id, files)
        attempt.skipped = skipped
        attempt.df = None
        attempt.move(AttemptState.COMMITTED)
        attempt.timed("commit", started)
        self.hook("after_commit")

    async def publish(self, attempt: Attempt) -> int:
        """committed -> published: every committed batch up to this one's publication
        number goes into the table and ``_spark_metadata``. Returns the files moved."""
        started = time.perf_counter()
        moved = 0
        if attempt.publication is not None:
            publications = self.log.unpublished(through=attempt.publication)
            published, moved = await self.offload(self.writer.publish, publications)
            self.log.mark_published(attempt.publication)
            others = [batch_id for batch_id in published if batch_id != attempt.batch_id]
            if others:
                logger.info("sink: rolled committed batch(es) %s of other writers forward before publishing batch %s",
                            others, attempt.batch_id)
        elif attempt.skipped and attempt.batch_id is not None:
            await self.offload(self.writer.discard, attempt.batch_id)
        attempt.move(AttemptState.PUBLISHED)
        attempt.timed("publish", started)
        self.hook("after_publish")
        return moved

    async def checkpoint(self, attempt: Attempt) -> None:
        """published -> checkpointed: one fenced store checkpoint per partition. A
        refusal (the claim ended, another owner fenced) is harmless: the new owner skips
        these events through the commit log's high-water mark."""
        started = time.perf_counter()
        for claim, events in attempt.events.items():
            ctx = claim.context
            try:
                await ctx.update_checkpoint(events[-1])
            except OwnershipLostError as error:
                logger.info("sink: checkpoint of partition %s of %s/%s after batch %s refused (%s); the next owner "
                            "skips the batch through the commit log", ctx.partition_id, ctx.eventhub_name,
                            ctx.consumer_group, attempt.batch_id, error)
            except Exception as error:
                logger.warning("sink: checkpoint of partition %s of %s/%s by %s after batch %s failed: %r",
                               ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, ctx.owner_id,
                               attempt.batch_id, error)
        attempt.move(AttemptState.CHECKPOINTED)
        attempt.timed("checkpoint", started)
        self.hook("after_checkpoint")

    async def abort(self, attempt: Attempt) -> None:
        """Any state before committed -> aborted: the plan (if any) is given up and the
        staged files deleted. If the commit won after all, the attempt stays committed."""
        if attempt.batch_id is not None:
            if not await self.log.abort(attempt.batch_id):
                logger.info("sink: batch %s was committed before it could be given up", attempt.batch_id)
                attempt.publication = self.log.publication_of(attempt.batch_id)
                attempt.move(AttemptState.COMMITTED)
                return
            await self.offload(self.writer.discard, attempt.batch_id)
        attempt.df = None
        attempt.move(AttemptState.ABORTED)
