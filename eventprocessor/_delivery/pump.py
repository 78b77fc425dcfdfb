"""PartitionPump: one task per owned partition, from receiver to handler.

The factory, ``initialize``, ``process_events`` and ``close`` run on the pump's own task
(``process_error`` on tasks of its own), never on the balancing or renewal tasks: a slow
or hung handler delays nothing but its own partition.

It receives with the claim's owner level (:mod:`~eventprocessor._delivery.receiving`: a
failed receiver is reopened right after the last event received: no loss, no replay),
checks before every delivery (first ones, redeliveries, empty ``max_wait_time`` batches)
that the claim may still dispatch, and stops when it may not. A batch in the handler is
finished, never interrupted, unless the pump is cancelled (a hung handler at shutdown).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from operator import attrgetter

from .._runtime.backoff import Backoff
from .._runtime.clock import Clock, SystemClock
from .._runtime.telemetry import Telemetry
from ..errors import ConfigurationError, HandlerTimeoutError, OwnershipLostError, PoisonEventsError
from ..events import Event, EventPosition
from ..partition import PartitionContext, PartitionProcessor, already_logged, claim_of
from ..policies import CloseReason, ConcurrencyPolicy, FailurePolicy, HandlerExecutor, PoisonPolicy
from ..sources.base import EventSource
from ..state import StateKeeper, StateUnreadableError
from ..stores.records import Checkpoint
from .concurrent import ConcurrentDelivery, InFlightLimit
from .receiving import ClaimReceiver
from .retries import DeliveryStopped, Poison, dead_letter, redeliver, report_poison
from .usercode import BLOCK_THRESHOLD, UserCode

__all__ = ["PartitionPump"]

logger = logging.getLogger(__name__)

LoopBlocked = Callable[["PartitionPump", str, float, float], None]  # (pump, what, started, ended)

_BODY = attrgetter("body")


class PartitionPump:
    """Moves events of one partition claim to one :class:`PartitionProcessor`."""

    def __init__(
        self,
        *,
        context: PartitionContext,
        factory: Callable[[], PartitionProcessor],
        source: EventSource,
        starting_position: EventPosition,
        max_batch_size: int,
        max_wait_time: float | None,
        prefetch: int,
        clock: Clock,
        handler_timeout: float | None = None,
        failure_policy: FailurePolicy = FailurePolicy(),
        on_user_code_error: Callable[[str, Exception], None] | None = None,
        track_last_enqueued_event_properties: bool = False,
        telemetry: Telemetry | None = None,
        handler_executor: HandlerExecutor = None,
        on_loop_blocked: LoopBlocked | None = None,
        block_threshold: float = BLOCK_THRESHOLD,
        state: StateKeeper | None = None,
        checkpoint: Checkpoint | None = None,
        concurrency: ConcurrencyPolicy | None = None,
        in_flight_limit: InFlightLimit | None = None,
        on_received: Callable[[Exception | None], None] | None = None,
    ) -> None:
        self.context = context
        self.claim = claim_of(context)
        """The claim this pump delivers for (see :mod:`eventprocessor._claim`)."""
        self.processor: PartitionProcessor | None = None
        self._processor: PartitionProcessor = PartitionProcessor()  # the made one, once the factory ran
        self._factory = factory
        self._clock = clock
        self._handler_timeout = handler_timeout
        self._retry_policy = failure_policy.retry_policy
        self._on_poison = failure_policy.on_poison
        self._dead_letter = failure_policy.dead_letter
        self._on_user_code_error = on_user_code_error
        self._telemetry = telemetry
        self._on_loop_blocked = on_loop_blocked
        self._keeper = state
        self._resumed_from = checkpoint
        self._now: Callable[[], float] = clock.monotonic
        concurrent = concurrency is not None and concurrency.concurrent
        self._user = UserCode(monotonic=clock.monotonic, on_block=self._blocked, executor=handler_executor,
                              threshold=block_threshold, name=f"handler-{context.partition_id}",
                              threads=concurrency.max_concurrency if concurrency is not None and concurrent else 1)
        self._process_events_name = "process_events"
        self._receiving = ClaimReceiver(
            context=context, claim=self.claim, source=source, starting_position=starting_position,
            max_batch_size=max_batch_size, max_wait_time=max_wait_time, prefetch=prefetch,
            track_last_enqueued=track_last_enqueued_event_properties, clock=clock, report=self._report,
            on_received=on_received)
        self.parked: PoisonEventsError | None = None
        """Set when the partition was parked on a poison event (``on_poison=PARK``)."""
        self._stop_reason: CloseReason | None = None
        self._dispatching = False
        self._error_tasks: set[asyncio.Task] = set()
        self._early_errors: list[Exception] = []
        self.batches_dispatched = 0
        self.events_dispatched = 0
        self.bytes_dispatched = 0
        """Bytes of event bodies dispatched, estimated from every 16th batch (for load)."""
        self.batch_started: float | None = None
        """When the ``process_events`` call in progress started (None between calls)."""
        self._batch_reported = False
        self.last_completed: Event | None = None
        """The last event of the last batch ``process_events`` completed."""
        self.failure: BaseException | None = None
        """Why the pump ended by itself (factory failed, takeover), if it did."""
        self.close_reason: CloseReason | None = None
        self.task: asyncio.Task | None = None
        self.concurrent: ConcurrentDelivery | None = None
        """Many events in flight (``ordering="key"`` or ``"none"``): how they are dispatched."""
        if concurrent:
            assert concurrency is not None
            self.concurrent = ConcurrentDelivery(self, concurrency, in_flight_limit, checkpoint, max_batch_size)

    def __repr__(self) -> str:
        return f"PartitionPump(partition_id={self.context.partition_id!r}, epoch={self.context.epoch})"

    @property
    def alive(self) -> bool:
        """True until the pump's task has finished (``close`` included)."""
        return self.task is not None and not self.task.done()

    @property
    def stopping(self) -> bool:
        return self._stop_reason is not None

    @property
    def dispatching(self) -> bool:
        """True while a batch is in the handler."""
        return self._dispatching

    def in_flight(self) -> tuple[int, int, Event | None] | None:
        """With many events in flight: (calls in flight, events held beyond the
        checkpoint, the oldest event not done); None for one batch at a time."""
        concurrent = self.concurrent
        if concurrent is None:
            return None
        return concurrent.in_flight, concurrent.progress.held, concurrent.progress.first_not_done

    def start(self) -> asyncio.Task:
        self.task = asyncio.create_task(self._run(), name=f"pump-{self.context.partition_id}")
        return self.task

    def stop(self, reason: CloseReason) -> None:
        """Stop dispatching now. A batch already in the handler finishes; a pending
        receive is abandoned. ``close(reason)`` is then called once."""
        if self._stop_reason is None:
            self._stop_reason = reason
        if self.concurrent is not None:
            self.concurrent.stop()  # the calls in flight finish, then the pump ends
        elif self.task is not None and not self._dispatching and not self.task.done():
            self.task.cancel()

    def cancel(self) -> None:
        """Cancel the task even in the middle of a batch (a handler that does not return)."""
        if self._stop_reason is None:
            self._stop_reason = CloseReason.SHUTDOWN
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def report_error(self, error: Exception) -> None:
        """Hand ``error`` to the handler's ``process_error`` on a task of its own, so that
        the caller (the balancing or renewal task) never waits for user code."""
        if self.processor is None:
            if self.task is not None and not self.task.done():
                self._early_errors.append(error)  # delivered once the handler exists
            return
        task = asyncio.get_running_loop().create_task(self._report(error),
                                                      name=f"process-error-{self.context.partition_id}")
        self._error_tasks.add(task)
        task.add_done_callback(self._error_tasks.discard)

    def _blocked(self, what: str, started: float, ended: float) -> None:
        if self._on_loop_blocked is not None:
            self._on_loop_blocked(self, what, started, ended)
        else:
            logger.warning("partition %s of %s/%s: %s blocked the event loop for %.1f s", self.context.partition_id,
                           self.context.eventhub_name, self.context.consumer_group, what, ended - started)

    def _what(self, method: str) -> str:
        return f"{type(self._processor).__name__}.{method}"

    async def _report(self, error: Exception) -> None:
        if self.processor is None:
            return
        try:
            await self._user.call(self._what("process_error"), self.processor.process_error, error, self.context)
        except Exception as failure:  # user code must not kill the pump
            self._user_code_failed("process_error", failure)

    def _user_code_failed(self, where: str, failure: Exception) -> None:
        """``process_error`` or ``close`` raised: tell the processor (which reports it to
        ``error_handler``, once per kind), never as a traceback per call."""
        if self._on_user_code_error is not None:
            self._on_user_code_error(where, failure)
        else:
            logger.warning("%s raised for partition %s of %s/%s: %r", where, self.context.partition_id,
                           self.context.eventhub_name, self.context.consumer_group, failure)

    def _make_processor(self) -> PartitionProcessor:
        processor = self._factory()
        if not isinstance(processor, PartitionProcessor):
            raise ConfigurationError(
                f"the partition processor factory returned {type(processor).__name__}, not a PartitionProcessor")
        return processor

    def overdue(self, now: float) -> HandlerTimeoutError | None:
        """The processor's watchdog asks, every few seconds: has ``process_events`` been
        running longer than ``handler_timeout``? Returns the error to report, once per
        batch (the handler is not interrupted; other partitions are not held up)."""
        started, limit = self.batch_started, self._handler_timeout
        if limit is not None and self.concurrent is not None:
            started = self.concurrent.overdue_call(now, limit)
            if started is None:
                return None
        elif started is None or limit is None or self._batch_reported or now - started < limit:
            return None
        self._batch_reported = True
        ctx = self.context
        return HandlerTimeoutError(
            f"process_events for partition {ctx.partition_id} of {ctx.eventhub_name}/{ctx.consumer_group} has "
            f"not returned after {limit:g} s (batch from sequence number "
            f"{ctx.last_event.sequence_number if ctx.last_event else '-'}); still waiting for it",
            partition_id=ctx.partition_id)

    async def _deliver(self, batch: list[Event]) -> None:
        """One delivery of ``batch`` to the handler, the hot path: the claim checked first
        (:class:`DeliveryStopped` once it ended), timed for the watchdog and OpenTelemetry. A
        handler told the claim is lost (by its checkpoint) ends it; no redelivery."""
        ctx = self.context
        if self._stop_reason is not None or not self.claim.may_dispatch():
            raise DeliveryStopped()
        if batch:
            ctx.last_event = batch[-1]  # what update_checkpoint() defaults to: this delivery's last
        self.batch_started = self._now()
        self._batch_reported = False
        keeper = self._keeper
        if keeper is not None:
            keeper.state.begin_batch()
        try:
            telemetry = self._telemetry
            if telemetry is not None and telemetry.active:
                with telemetry.batch(ctx.partition_id, batch):
                    await self._user.call(self._process_events_name, self._processor.process_events, batch, ctx)
            else:  # no wrapper coroutine on the hot path: one frame fewer per batch
                await self._user.call(self._process_events_name, self._processor.process_events, batch, ctx)
        except OwnershipLostError as lost:
            if keeper is not None:
                keeper.state.roll_back_batch()
            self._lost_in_handler(lost)
            raise DeliveryStopped() from lost
        except BaseException:
            if keeper is not None:  # the batch is delivered again (or not at all): undo what it changed
                keeper.state.roll_back_batch()
            raise
        finally:
            self.batch_started = None
        if keeper is not None:
            keeper.state.end_batch()
        self._count(batch)

    async def _handle(self, batch: list[Event], context: PartitionContext) -> None:
        """``process_events`` on ``batch`` (in a span with OpenTelemetry); _deliver inlines it."""
        telemetry = self._telemetry
        if telemetry is not None and telemetry.active:
            with telemetry.batch(context.partition_id, batch):
                await self._user.call(self._process_events_name, self._processor.process_events, batch, context)
        else:
            await self._user.call(self._process_events_name, self._processor.process_events, batch, context)

    def _count(self, batch: list[Event]) -> None:
        """Count a delivered batch (load, status, ``last_completed``). Every 16th counts the
        bytes of all 16 from ~16 bodies spread over it (summing all 300 cost a fifth of this)."""
        if not self.batches_dispatched & 15 and batch:
            size = len(batch)
            sample = batch[::size // 16 or 1]
            self.bytes_dispatched += 16 * size * sum(map(len, map(_BODY, sample))) // len(sample)
        self.batches_dispatched += 1
        self.events_dispatched += len(batch)
        if batch:
            self.last_completed = batch[-1]

    def _lost_in_handler(self, lost: OwnershipLostError) -> None:
        """The handler found the claim lost (its checkpoint was refused): end the claim."""
        ctx = self.context
        self.failure = lost
        self.claim.fence_lost()
        logger.info("partition %s of %s/%s: the handler found the claim lost (%s); owner %s stops without "
                    "delivering the batch again", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, lost,
                    ctx.owner_id)

    async def _failed(self, error: Exception, batch: list[Event], attempt: int) -> None:
        """Log one handler failure (its traceback on the first attempt only: the retries of
        the same events are a line each) and hand it to ``process_error``."""
        ctx = self.context
        logger.warning("partition %s of %s/%s: handler failed on %d event(s) from sequence number %s (attempt %d of "
                       "%d): %r", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, len(batch),
                       batch[0].sequence_number if batch else "-", attempt, self._retry_policy.max_delivery_attempts,
                       error, exc_info=error if attempt == 1 else None)
        already_logged(error)
        await self._report(error)

    async def _recover(self, events: list[Event], first_failure: Exception) -> bool:
        """The handler raised on ``events``: redeliver under the retry and poison policy
        (:mod:`eventprocessor._delivery.retries`). Returns True when the partition must park."""
        await self._failed(first_failure, events, 1)
        checkpoint = self.context.last_checkpoint
        if checkpoint is not None:  # events the handler checkpointed before it failed are done
            events = [event for event in events if event.sequence_number > checkpoint.sequence_number]
        if not events:  # an empty max_wait_time batch, or all checkpointed: nothing to redeliver
            return False
        outcome = await redeliver(self._deliver, events, policy=self._retry_policy, clock=self._clock,
                                  report=self._failed, on_poison=self._poisoned)
        return outcome.parked

    async def _restore_state(self) -> bool:
        """Load this claim's state before anything is dispatched. A state that cannot be
        read (or does not go with the checkpoint) is reported loudly and tried again with
        backoff while the claim lasts: the partition is never run on an empty state.
        False when the claim ended first."""
        keeper, ctx = self._keeper, self.context
        assert keeper is not None
        retry = Backoff(1.0, cap=30.0)
        while self._stop_reason is None and ctx.is_owned:
            try:
                restored = await keeper.restore(self._resumed_from)
                logger.debug("partition %s of %s/%s: state restored at %s (%d keys, %d entries, %d bytes)",
                             ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, restored.head,
                             len(restored.texts), restored.entries_read, restored.bytes_read)
                return True
            except Exception as error:
                delay = retry.next()
                unreadable = isinstance(error, StateUnreadableError)
                logger.error("partition %s of %s/%s: its state %s (%r); it is not dispatched, trying again in %g s",
                             ctx.partition_id, ctx.eventhub_name, ctx.consumer_group,
                             "cannot be read for its checkpoint" if unreadable else "could not be loaded", error,
                             delay)
                already_logged(error)
                await self._report(error)
                await self._clock.sleep(delay)
        return False

    async def _poisoned(self, poison: Poison) -> bool:
        """An event failed every attempt: report it, then skip it (True) or park (False)."""
        ctx = self.context
        poisoned = await report_poison(ctx, poison, self._on_poison, self._report, self._dead_letter)
        if self._on_poison is PoisonPolicy.PARK or not await self._skip(poison.event, poisoned):
            self.parked = poisoned
            logger.error("partition %s of %s/%s is parked at sequence number %d: it is not dispatched until the "
                         "processor restarts, which delivers that event again", ctx.partition_id, ctx.eventhub_name,
                         ctx.consumer_group, poison.event.sequence_number)
            return False
        return True

    async def _skip(self, event: Event, error: PoisonEventsError) -> bool:
        """Dead-letter ``event`` (if a hook is set) and checkpoint past it. False if it
        cannot be skipped safely (the hook failed)."""
        if not await dead_letter(self.context, event, error, self._dead_letter, self._report):
            return False
        ctx = self.context
        try:
            await ctx.update_checkpoint(event)
        except Exception as checkpoint_error:
            logger.warning("partition %s: could not checkpoint past the skipped event %d: %r", ctx.partition_id,
                           event.sequence_number, checkpoint_error)
        return True

    async def _wait_parked(self) -> None:
        """A parked partition keeps its claim and waits, idle, to be stopped."""
        await self._receiving.close()
        while self._stop_reason is None:
            self._dispatching = False
            await self._clock.sleep(3600)

    async def _run(self) -> None:
        self.claim.home_loop = loop = asyncio.get_running_loop()
        if type(self._clock) is SystemClock:  # the same clock, read without asking for the loop each time
            self._user.use_clock(loop.time)
            self._now = loop.time
        reason = CloseReason.SHUTDOWN
        try:
            ended = await self._begin()
            if ended is not None:
                reason = ended
            elif self.concurrent is not None:
                reason = await self.concurrent.run()
            else:
                reason = await self._pump_batches()
        except asyncio.CancelledError:
            reason = self._stop_reason or CloseReason.SHUTDOWN
            if self._stop_reason is None:
                raise
        finally:
            self.close_reason = reason
            await self._end(reason)

    async def _begin(self) -> CloseReason | None:
        """Make the handler, restore the claim's state and call ``initialize``: None when
        the claim goes on, else the reason it ends with."""
        try:
            self.processor = self._make_processor()
        except Exception as error:
            self.failure = error  # the processor reports it (once per kind) when the pump ends
            return CloseReason.SHUTDOWN
        processor = self._processor = self.processor
        self._process_events_name = self._what("process_events")
        for early in self._early_errors:
            self.report_error(early)
        self._early_errors.clear()
        if self._keeper is not None and not await self._restore_state():
            return self._stop_reason or CloseReason.OWNERSHIP_LOST
        try:
            await self._user.call(self._what("initialize"), processor.initialize, self.context)
        except Exception as error:
            await self._report(error)
        return None

    async def _pump_batches(self) -> CloseReason:
        """Receive and deliver until the claim ends; return why it ended."""
        ctx, receiving = self.context, self._receiving
        while True:
            if self._stop_reason is not None:
                return self._stop_reason
            if not receiving.open and not ctx.is_owned:
                return CloseReason.OWNERSHIP_LOST
            try:
                events = await receiving.next_batch()
            except OwnershipLostError as error:
                await self._taken_over(error)
                return CloseReason.OWNERSHIP_LOST
            if events is None:
                continue
            self._dispatching = True
            try:
                await self._deliver(events)
            except DeliveryStopped:
                # The claim ended before this batch could be handed over (or the handler
                # found it lost): never dispatch then.
                if self._stop_reason is None:
                    return CloseReason.OWNERSHIP_LOST
            except Exception as failure:
                if await self._recover(events, failure):
                    reason = self._stop_reason or CloseReason.SHUTDOWN
                    await self._wait_parked()
                    return self._stop_reason or reason
            finally:
                self._dispatching = False

    async def _taken_over(self, error: OwnershipLostError) -> None:
        """A newer claim's receiver took the partition over: this claim ends now."""
        ctx = self.context
        self.failure = error
        self.claim.fence_lost()
        logger.info("partition %s of %s/%s: receiver taken over (%s); owner %s stops",
                    ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error, ctx.owner_id)
        await self._report(error)

    async def _end(self, reason: CloseReason) -> None:
        """Close the receiver and the handler (``close``), checkpoint a graceful end, and
        let the claim's state and worker thread go."""
        ctx = self.context
        await self._receiving.close()
        if self.processor is not None:
            try:
                await self._user.call(self._what("close"), self.processor.close, reason, ctx)
            except Exception as failure:
                self._user_code_failed("close", failure)
            if reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF):
                if self.concurrent is None:
                    await self._checkpoint_on_release(self.processor)
                elif getattr(self.processor, "checkpoint_on_release", True):
                    await self.concurrent.checkpoint_on_release()
        if self._keeper is not None:
            await self._keeper.close(wait=reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF))
        self._user.close()

    async def _checkpoint_on_release(self, processor: PartitionProcessor) -> None:
        """A graceful end: checkpoint what ``process_events`` completed, so the next owner
        starts right after it (see ``PartitionProcessor.checkpoint_on_release``)."""
        done, ctx = self.last_completed, self.context
        if done is None or not getattr(processor, "checkpoint_on_release", True):
            return
        last = ctx.last_checkpoint
        if last is not None and last.epoch == ctx.epoch and last.sequence_number >= done.sequence_number \
                and (self._keeper is None or not self._keeper.state.changed):
            return
        try:
            await ctx.update_checkpoint(done)
        except Exception as error:
            logger.warning("partition %s of %s/%s: the checkpoint on release failed (%r); the next owner resumes "
                           "from the previous one", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error)
