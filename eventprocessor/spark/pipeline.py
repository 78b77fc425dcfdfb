"""The batch pipeline: three tasks that take batches from the buffers to the table.

* the **cutter** cuts a batch when one is due (:class:`~eventprocessor.spark.claims.Buffers`),
  plans it in the commit log and builds its DataFrame, then queues it;
* the **committer** writes it (under the retry policy, then the poison policy) and
  commits it, or gives it up when a newer claim fenced one of its partitions (going on
  with the other partitions' events in a new attempt);
* the **publisher** publishes committed batches in commit order, then checkpoints them.

So while one batch is written, the next is planned and converted and the one before is
published and checkpointed; each queue holds one batch (back-pressure reaches the
handlers through the buffers). The steps themselves are
:class:`~eventprocessor.spark.attempt.BatchSteps`.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass, field
from typing import Protocol

from .._runtime.backoff import Backoff
from ..errors import PoisonEventsError
from ..policies import DeadLetter, PoisonPolicy, RetryPolicy
from .attempt import Attempt, AttemptState, BatchSteps, MicroBatch
from .claims import Buffers, Claim, ClaimState
from .commit_log import BatchRefused

__all__ = ["BatchPipeline", "SinkStats", "ClaimControl"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF = 30.0


@dataclass
class SinkStats:
    """What a sink did so far (read through :class:`~eventprocessor.spark.SparkSink`)."""

    batches_committed: int = 0
    events_committed: int = 0
    last_batch: MicroBatch | None = None
    last_error: BaseException | None = None
    parked: dict[str, PoisonEventsError] = field(default_factory=dict)
    step_timings: collections.deque[dict[str, float]] = field(default_factory=lambda: collections.deque(maxlen=10_000))


class ClaimControl(Protocol):
    """What the pipeline may do to claims: end one (``fenced_out``: a newer claim fenced
    it), or park one (the poison policy gave its batch up)."""

    def end(self, claim: Claim, *, fenced_out: bool = False) -> None: ...

    def park(self, claim: Claim, error: PoisonEventsError) -> None: ...


class BatchPipeline:
    """Runs batches through their states (see the module docstring). Lives on one event
    loop; ``steps`` is set once the commit log exists (at the first fence)."""

    def __init__(self, buffers: Buffers, claims: ClaimControl, stats: SinkStats, *, policy: RetryPolicy,
                 on_poison: PoisonPolicy, dead_letter: DeadLetter | None) -> None:
        self.buffers = buffers
        self.claims = claims
        self.stats = stats
        self.policy = policy
        self.on_poison = on_poison
        self.dead_letter = dead_letter
        self.steps: BatchSteps | None = None
        self._cut_lock = asyncio.Lock()
        self._flushes: list[asyncio.Future[None]] = []  # flush() calls waiting for the cutter
        self._queue: asyncio.Queue[Attempt] = asyncio.Queue(maxsize=1)
        self._published: asyncio.Queue[Attempt] = asyncio.Queue(maxsize=1)
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self) -> None:
        """Start (or restart) the three tasks."""
        for name, run in (("batcher", self._cut_loop), ("committer", self._commit_loop),
                          ("publisher", self._publish_loop)):
            task = self._tasks.get(name)
            if task is None or task.done():
                self._tasks[name] = asyncio.create_task(run(), name=f"spark-sink-{name}")

    async def flush(self) -> None:
        """Cut what is buffered now, and wait until every batch is through.

        The cutter task cuts, never the caller: a batch it plans is queued for the
        committer even if the caller is cancelled meanwhile (a processor may cancel a
        handler's ``close``), so no plan is left behind for a later batch of the same
        partitions to commit past."""
        cutter = self._tasks.get("batcher")
        if self.buffers.events or (cutter is not None and not cutter.done()):
            self.start()
            done = asyncio.get_running_loop().create_future()
            self._flushes.append(done)
            self.buffers.added.set()  # wakes the cutter
            await asyncio.shield(done)
        await self._queue.join()
        await self._published.join()

    async def stop(self) -> None:
        """Stop the tasks once the batches already cut are through."""
        cutter = self._tasks.pop("batcher", None)
        if cutter is not None and not cutter.done():
            async with self._cut_lock:
                cutter.cancel()  # never between cutting a batch and queueing it
            await asyncio.gather(cutter, return_exceptions=True)
        self._flushed()
        for name, queue in (("committer", self._queue), ("publisher", self._published)):
            task = self._tasks.pop(name, None)
            if task is not None and not task.done():
                await queue.join()
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    async def _cut_loop(self) -> None:
        buffers, lock = self.buffers, self._cut_lock
        try:
            while True:
                flushes = self._flushes
                wait = 0.0 if flushes else buffers.seconds_until_due()
                if wait != 0.0:
                    buffers.added.clear()
                    try:
                        await asyncio.wait_for(buffers.added.wait(), wait)
                    except asyncio.TimeoutError:
                        pass
                    continue
                self._flushes = []
                async with lock:
                    if buffers.events:
                        await self._cut_and_plan()
                    while flushes and buffers.events:
                        await self._cut_and_plan()
                self._flushed(flushes)
        finally:
            self._flushed()

    def _flushed(self, flushes: list[asyncio.Future[None]] | None = None) -> None:
        """Wake ``flushes`` (default: every waiting flush, when the cutter ends)."""
        if flushes is None:
            flushes, self._flushes = self._flushes, []
        for done in flushes:
            if not done.done():
                done.set_result(None)

    async def _cut_and_plan(self) -> None:
        """Cut a batch, plan it and build its DataFrame, and queue it for the committer.
        Batches are queued in the order they were cut, so each partition's ranges commit
        in order."""
        assert self.buffers is not None and self._queue is not None
        events, after, nbytes = self.buffers.cut()
        attempt = await self._plan(Attempt(events=events, byte_count=nbytes, after=after)) if events else None
        if attempt is None:
            return
        assert self.steps is not None
        await self.steps.prepare(attempt)
        await self._queue.put(attempt)

    async def _plan(self, attempt: Attempt) -> Attempt | None:
        """cut -> planned, dropping refused partitions; None when nothing is left. A
        failing commit log is retried (with backoff) while any of the claims lasts."""
        assert self.steps is not None
        retry = Backoff(0.5, cap=_MAX_BACKOFF)
        while True:
            attempt = self._without_parked(attempt)
            if not attempt.events:
                return None
            try:
                await self.steps.plan(attempt)
                return attempt
            except BatchRefused as refused:
                attempt = await self._refused(attempt, refused)
            except Exception as error:
                self.stats.last_error = error
                if not any(c.context.is_owned for c in attempt.events):
                    logger.warning("sink: planning a batch failed (%r) and none of its partitions is owned any "
                                   "more; its events are read again by their next owners", error)
                    for claim in attempt.events:
                        self.claims.end(claim)  # a later batch of these claims would skip the dropped events
                    return None
                delay = retry.next()
                logger.warning("sink: planning a batch in the commit log failed (%r); retrying in %.1f s", error,
                               delay)
                await asyncio.sleep(delay)

    def _without_parked(self, attempt: Attempt) -> Attempt:
        """Events of a parked partition never go in a later batch: that would commit
        past the events the poison policy gave up, and checkpoint past them."""
        parked = [c.partition_id for c in attempt.events if c.state is ClaimState.PARKED]
        return attempt.without(parked) if parked else attempt

    async def _refused(self, attempt: Attempt, refused: BatchRefused) -> Attempt:
        """Some of the attempt's partitions cannot commit (a newer claim fenced them, or
        an earlier batch of theirs did not commit): end those claims, give the batch up,
        and return a new attempt with the other partitions' events (the same ranges)."""
        assert self.steps is not None
        lost = refused.lost or attempt.partition_ids
        # A handoff's ordinary course, not a loss: INFO (nothing to act on).
        logger.info("sink: %s; the events of %s are left to the partitions' next claims, which read them again "
                    "(nothing is lost); the rest of the batch goes on", refused, sorted(lost))
        for claim in attempt.events:
            if claim.partition_id in lost:
                self.claims.end(claim, fenced_out=True)
        if attempt.state in (AttemptState.PLANNED, AttemptState.WRITTEN):
            await self.steps.abort(attempt)
        if attempt.state is AttemptState.COMMITTED:
            return attempt
        return attempt.without(lost)

    async def _commit_loop(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            attempt = await queue.get()
            try:
                await self._finish(attempt)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never lose the committer to a surprise
                self.stats.last_error = error
                logger.exception("sink: batch %s failed unexpectedly; its events are read again by the next claim",
                                 attempt.batch_id)
                for claim in attempt.events:
                    self.claims.end(claim)
            finally:
                queue.task_done()

    async def _finish(self, attempt: Attempt) -> None:
        """Write and commit one planned attempt (re-planning what is left after a
        refusal), then hand it to the publisher."""
        steps = self.steps
        assert steps is not None
        while attempt.state not in (AttemptState.COMMITTED, AttemptState.ABORTED):
            parked = [c.partition_id for c in attempt.events if c.state is ClaimState.PARKED]
            if parked:
                if attempt.state is not AttemptState.CUT:
                    await steps.abort(attempt)
                    if attempt.state is AttemptState.COMMITTED:
                        break
                attempt = attempt.without(parked)
            if not attempt.events:
                return
            try:
                if attempt.state is AttemptState.CUT:
                    planned = await self._plan(attempt)
                    if planned is None:
                        return
                    attempt = planned
                if attempt.state is AttemptState.PLANNED:
                    await self._write(attempt)
                if attempt.state is AttemptState.WRITTEN and not await self._commit(attempt):
                    return
            except BatchRefused as refused:
                attempt = await self._refused(attempt, refused)
        if attempt.state is AttemptState.COMMITTED:
            # Published and checkpointed while the next batch is written.
            assert self._published is not None
            await self._published.put(attempt)

    async def _commit(self, attempt: Attempt) -> bool:
        """written -> committed. A failing commit log is retried (a commit that landed
        is recognised as such) while any of the claims lasts; then the claims end and
        False: their next claims find the batch committed (and roll it forward) or
        abort it with their fence."""
        assert self.steps is not None
        retry = Backoff(0.5, cap=_MAX_BACKOFF)
        while True:
            try:
                await self.steps.commit(attempt)
                return True
            except BatchRefused:
                raise
            except Exception as error:
                self.stats.last_error = error
                if not any(c.context.is_owned for c in attempt.events):
                    logger.warning("sink: committing batch %s failed (%r) and none of its partitions is owned any "
                                   "more; their next owners settle it", attempt.batch_id, error)
                    for claim in attempt.events:
                        self.claims.end(claim)
                    return False
                delay = retry.next()
                logger.warning("sink: committing batch %s failed (%r); retrying in %.1f s", attempt.batch_id, error,
                               delay)
                await asyncio.sleep(delay)

    async def _publish_loop(self) -> None:
        """Committed batches, in commit order: published, then checkpointed."""
        queue = self._published
        assert queue is not None
        while True:
            attempt = await queue.get()
            try:
                assert self.steps is not None, "a committed batch has a commit log"
                moved = await self._publish(attempt)
                await self.steps.checkpoint(attempt)
                self._committed(attempt, moved)
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never lose the publisher to a surprise
                self.stats.last_error = error
                logger.exception("sink: publishing committed batch %s failed unexpectedly; the partitions' next "
                                 "claims roll it forward", attempt.batch_id)
            finally:
                queue.task_done()

    async def _write(self, attempt: Attempt) -> None:
        """planned -> written, under the retry policy; after the last attempt, the
        poison policy (the attempt ends aborted, or committed as skipped)."""
        assert self.steps is not None
        policy = self.policy
        while attempt.state is AttemptState.PLANNED:
            try:
                await self.steps.write(attempt)
                return
            except BatchRefused:
                raise
            except Exception as error:
                attempt.failures += 1
                self.stats.last_error = error
                if attempt.failures >= policy.max_delivery_attempts:
                    await self._poison(attempt, error)
                    return
                delay = policy.delay(attempt.failures)
                logger.warning("sink: writing batch %s failed (attempt %d of %d): %r; writing it again in %.1f s",
                               attempt.batch_id, attempt.failures, policy.max_delivery_attempts, error, delay)
                await asyncio.sleep(delay)

    async def _poison(self, attempt: Attempt, error: Exception) -> None:
        assert self.steps is not None
        events = [e for batch in attempt.events.values() for e in batch]
        pids = sorted(attempt.partition_ids)
        poisoned = PoisonEventsError(
            f"batch {attempt.batch_id} ({len(events)} events of partitions {pids}) failed in all {attempt.failures} "
            f"write attempts ({error!r}); policy {self.on_poison.value}", events=events, attempts=attempt.failures,
            partition_id=pids[0] if len(pids) == 1 else None)
        poisoned.__cause__ = error
        self.stats.last_error = poisoned
        logger.error("sink: %s", poisoned)
        if self.on_poison is PoisonPolicy.SKIP and await self._dead_letter(attempt, poisoned):
            await self.steps.commit(attempt, skipped=True)
            logger.error("sink: batch %s was skipped: the checkpoints of partitions %s move past it",
                         attempt.batch_id, pids)
            return
        await self.steps.abort(attempt)
        if attempt.state is AttemptState.ABORTED:
            for claim in attempt.events:
                self.claims.park(claim, poisoned)

    async def _dead_letter(self, attempt: Attempt, error: PoisonEventsError) -> bool:
        if self.dead_letter is None:
            return True
        for claim, events in attempt.events.items():
            try:
                await self.dead_letter(list(events), error, claim.context)
            except Exception as hook_error:
                logger.error("sink: the dead_letter hook failed on partition %s (%r); parking instead of skipping",
                             claim.partition_id, hook_error)
                return False
        return True

    async def _publish(self, attempt: Attempt) -> int:
        """committed -> published. It is committed: it is only ever rolled forward, so a
        failure is retried (loudly) until it works or the sink stops; the partition's
        next claim also rolls it forward."""
        assert self.steps is not None
        retry = Backoff(0.5, cap=_MAX_BACKOFF)
        while True:
            try:
                return await self.steps.publish(attempt)
            except Exception as error:
                self.stats.last_error = error
                delay = retry.next()
                logger.error("sink: publishing committed batch %s failed (%r); trying again in %.1f s",
                             attempt.batch_id, error, delay)
                await asyncio.sleep(delay)

    def _committed(self, attempt: Attempt, moved: int) -> None:
        batch = attempt.batch
        assert batch is not None
        stats = self.stats
        if not attempt.skipped:
            stats.batches_committed += 1
            stats.events_committed += batch.event_count
            stats.last_batch = batch
        stats.step_timings.append(dict(attempt.timings))
        ctx = next(iter(attempt.events)).context
        logger.info("sink: owner %s committed batch %s of %s/%s: %d events from partitions %s (%d files moved); "
                    "seconds: %s", ctx.owner_id, batch.batch_id, ctx.eventhub_name, ctx.consumer_group,
                    batch.event_count, sorted(batch.ranges), moved,
                    " ".join(f"{name} {value:.3f}" for name, value in attempt.timings.items()))

