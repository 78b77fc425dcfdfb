"""Many events in flight per partition: how a pump dispatches under ``ordering="key"``
or ``"none"`` (:class:`~eventprocessor.policies.ConcurrencyPolicy`).

The pump's task receives and dispatches continuously, without a batch barrier: up to
``max_concurrency`` ``process_events`` calls of the partition run at once (and at most
``max_in_flight`` over the processor), picked by
:class:`~eventprocessor._delivery.progress.CallQueue`. A call runs on a task, which goes
on with the partition's next call when it ends, unless another partition waits for a
slot of ``max_in_flight`` (then the slot passes to it): a task and a wake of the
dispatching loop per call cost more than a short call itself. The partition holds at most
``max_pending`` events beyond its checkpoint; past that it stops receiving until the
oldest is done, so memory, prefetch and what a crash delivers again stay bounded.

Each call gets a context of its own (:class:`CallContext`): its ``update_checkpoint()``
marks the call's events done and writes the exact checkpoint
(:class:`~eventprocessor._delivery.progress.Progress`); so does a checkpoint every
``checkpoint_interval`` seconds, and a graceful end, once the calls in flight returned.
A call that raises is delivered again one event at a time under the failure policy, on
its own task, so other keys go on while a key's later events wait behind it; past the
policy its event is skipped (dead-lettered) or its key is parked. Nothing is handed to
a claim that has ended: every delivery checks the claim first.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from typing import Protocol

from .._runtime.clock import Clock
from ..errors import InvalidCheckpointError, OwnershipLostError
from ..events import Event
from ..partition import PartitionContext, write_checkpoint
from ..policies import CloseReason, ConcurrencyPolicy, DeadLetter, PoisonPolicy, RetryPolicy
from ..stores.records import Checkpoint
from .progress import CallQueue, Position, Progress
from .receiving import ClaimReceiver
from .retries import DeliveryStopped, Poison, dead_letter, redeliver, report_poison

__all__ = ["ConcurrentDelivery", "CallContext", "InFlightLimit"]

logger = logging.getLogger(__name__)


class PartitionPump(Protocol):
    """What this module uses of the pump it dispatches for (:mod:`~eventprocessor._delivery.pump`)."""

    context: PartitionContext
    _stop_reason: CloseReason | None
    _dispatching: bool
    last_completed: Event | None
    _receiving: ClaimReceiver
    _now: Callable[[], float]
    _clock: Clock
    _retry_policy: RetryPolicy
    _on_poison: PoisonPolicy

    async def _handle(self, batch: list[Event], context: PartitionContext) -> None: ...
    def _lost_in_handler(self, lost: OwnershipLostError) -> None: ...
    def _count(self, batch: list[Event]) -> None: ...
    async def _failed(self, error: Exception, batch: list[Event], attempt: int) -> None: ...
    _dead_letter: DeadLetter | None

    async def _report(self, error: Exception) -> None: ...
    async def _taken_over(self, error: OwnershipLostError) -> None: ...


class InFlightLimit:
    """The most calls in flight over all partitions of one processor; partitions that
    found it full are woken when a call ends, and try again."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiting: dict[int, asyncio.Event] = {}

    def try_acquire(self, wake: asyncio.Event) -> bool:
        if self.in_flight < self.limit:
            self.in_flight += 1
            return True
        self._waiting[id(wake)] = wake
        return False

    @property
    def waiting(self) -> bool:
        """True while a partition waits for a slot."""
        return bool(self._waiting)

    def release(self) -> None:
        self.in_flight -= 1
        if self._waiting:  # every partition that waits tries again (one that ended meanwhile does not)
            waiting, self._waiting = self._waiting, {}
            for wake in waiting.values():
                wake.set()


class CallContext(PartitionContext):
    """The context of one ``process_events`` call among many in flight: the partition's
    context, whose ``last_event`` is this call's last and whose ``update_checkpoint()``
    checkpoints this call's events (the partition's checkpoint moves as far as every
    earlier event is done; the later ones done are recorded with it)."""

    def __init__(self, parent: PartitionContext, events: list[Event], delivery: ConcurrentDelivery) -> None:
        self.__dict__.update(parent.__dict__)
        self._parent = parent
        self._events = events
        self._delivery = delivery
        self.last_event = events[-1] if events else None

    @property  # type: ignore[override]
    def last_checkpoint(self) -> Checkpoint | None:
        return self._parent.last_checkpoint

    @last_checkpoint.setter
    def last_checkpoint(self, checkpoint: Checkpoint | None) -> None:
        self._parent.last_checkpoint = checkpoint

    async def update_checkpoint(self, event: Event | None = None, *, allow_rewind: bool = False) -> None:
        """Mark this call's events (up to ``event``, default all) done and write the
        partition's checkpoint. Raises :class:`OwnershipLostError` when the claim ended."""
        home = self._claim.home_loop
        if home is not None and home is not asyncio.get_running_loop():
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
                self.update_checkpoint(event, allow_rewind=allow_rewind), home))
        events = self._events
        if event is not None:
            if not any(mine is event or mine.sequence_number == event.sequence_number for mine in events):
                raise InvalidCheckpointError(
                    f"update_checkpoint on partition {self.partition_id} with sequence number "
                    f"{getattr(event, 'sequence_number', event)!r}, which is not an event of this call: with "
                    "max_concurrency > 1 a call checkpoints only its own events")
            events = [mine for mine in events if mine.sequence_number <= event.sequence_number]
        await self._delivery.checkpoint(self._delivery.progress.finish(events))


class ConcurrentDelivery:
    """Dispatches one claim's events with many calls in flight (see the module docstring)."""

    def __init__(self, pump: PartitionPump, policy: ConcurrencyPolicy, limit: InFlightLimit | None,
                 resumed: Checkpoint | None, max_batch_size: int) -> None:
        self._pump = pump
        self._policy = policy
        self._limit = limit
        self._bound = policy.pending_bound
        self.progress = Progress(resumed)
        self.calls = CallQueue(policy.ordering, max_batch_size)
        self._wake = asyncio.Event()
        self._receive: asyncio.Task | None = None
        self._tasks: dict[asyncio.Task, float] = {}  # call task -> when it started
        self._lock = asyncio.Lock()
        self._written: Position | None = None
        self._written_version = -1
        self._stalled = False
        self._reported_call: float | None = None

    # ------------------------------------------------------------------ what others read
    @property
    def in_flight(self) -> int:
        """Calls in flight now."""
        return len(self._tasks)

    @property
    def oldest_started(self) -> float | None:
        """When the oldest call in flight started (on the processor's clock)."""
        return min(self._tasks.values(), default=None)

    def overdue_call(self, now: float, limit: float) -> float | None:
        """The start of the oldest call running longer than ``limit``, once per call."""
        started = self.oldest_started
        if started is None or now - started < limit or started == self._reported_call:
            return None
        self._reported_call = started
        return started

    def stop(self) -> None:
        """Stop receiving and dispatching; the calls in flight finish."""
        if self._receive is not None:
            self._receive.cancel()
        self._wake.set()

    # ------------------------------------------------------------------ the loop
    async def run(self) -> CloseReason:
        """Receive and dispatch until the claim ends; the calls in flight finish first.
        Returns why the claim ended."""
        pump, interval = self._pump, self._policy.checkpoint_interval
        cadence = asyncio.create_task(self._cadence(interval)) if interval is not None else None
        try:
            return await self._loop()
        except asyncio.CancelledError:
            for task in self._tasks:  # the pump is cancelled (a hung handler at shutdown): so are its calls
                task.cancel()
            raise
        finally:
            if self._receive is not None:
                self._receive.cancel()
            if cadence is not None:
                cadence.cancel()
            await self._drain()
            pump._dispatching = False

    async def _loop(self) -> CloseReason:
        pump, ctx = self._pump, self._pump.context
        while True:
            if pump._stop_reason is not None:
                return pump._stop_reason
            if not ctx.is_owned:
                return CloseReason.OWNERSHIP_LOST
            self._dispatch()
            if self._receive is None and self.progress.held < self._bound:
                room = self._bound - self.progress.held
                self._receive = asyncio.create_task(pump._receiving.next_batch(room))
                self._receive.add_done_callback(lambda _task: self._wake.set())
            await self._wake.wait()
            self._wake.clear()
            receive = self._receive
            if receive is not None and receive.done():
                self._receive = None
                if receive.cancelled():
                    continue
                error = receive.exception()
                if isinstance(error, OwnershipLostError):
                    await pump._taken_over(error)
                    return CloseReason.OWNERSHIP_LOST
                if error is not None:
                    raise error
                events = receive.result()
                if events:
                    self.calls.add(self.progress.receive(events))
            self._check_stalled()

    def _dispatch(self) -> None:
        """Start calls while a key may run and there is room (here and processor-wide)."""
        calls, limit, pump = self.calls, self._limit, self._pump
        tasks = self._tasks
        while len(tasks) < self._policy.max_concurrency and calls.keys_waiting:
            if limit is not None and not limit.try_acquire(self._wake):
                return
            taken = calls.take(self._policy.max_concurrency - len(tasks))
            if taken is None:
                if limit is not None:
                    limit.release()
                return
            key, events = taken
            task = asyncio.create_task(self._call(key, events))
            tasks[task] = pump._now()
            pump._dispatching = True

    async def _call(self, key: Hashable, events: list[Event]) -> None:
        """Run a call, then, while its slot is wanted by no other partition, the next
        calls that may run, on this task: a task and a wake of the loop per call are
        much of what a short call costs beyond the handler."""
        task = asyncio.current_task()
        tasks = self._tasks
        try:
            while True:
                try:
                    await self._deliver(events)
                except DeliveryStopped:
                    return  # the claim ended: these events stay not done
                except Exception as failure:
                    if not await self._recover(key, events, failure):
                        return
                self.calls.finished(key)
                taken = self._next_call()
                if taken is None:
                    return
                key, events = taken
                tasks[task] = self._pump._now()  # type: ignore[index]
                if self._receive is None and self.progress.held < self._bound:
                    self._wake.set()  # the loop may receive again (at max_pending it may not: no wake)
        finally:
            self._tasks.pop(task, None)  # type: ignore[arg-type]
            if self._limit is not None:
                self._limit.release()
            self._pump._dispatching = bool(self._tasks)
            self._wake.set()

    def _next_call(self) -> tuple[Hashable, list[Event]] | None:
        """The next call for a task whose call just ended, or None: the pump stops, no key
        may run, or another partition waits for a slot of the processor-wide limit. (A
        claim that ended is found by the call's own check, before its handler runs.)"""
        calls = self.calls
        if not calls.keys_waiting or self._pump._stop_reason is not None:
            return None
        if self._limit is not None and self._limit.waiting:
            return None  # give the slot up: partitions take turns for it
        return calls.take(self._policy.max_concurrency - len(self._tasks) + 1)

    async def _deliver(self, events: list[Event]) -> None:
        """One call: check the claim, run the handler on a context of the call's own, and
        mark the events done when it returns."""
        pump = self._pump
        ctx = pump.context
        if pump._stop_reason is not None or not ctx.is_owned:
            raise DeliveryStopped()  # after a stop only the calls already running finish
        call_context = CallContext(ctx, events, self)
        try:
            await pump._handle(events, call_context)
        except OwnershipLostError as lost:
            pump._lost_in_handler(lost)
            raise DeliveryStopped() from lost
        self.progress.finish(events)
        pump._count(events)
        pump.last_completed = self.progress.last_before  # what the load meter's backlog counts from

    async def _recover(self, key: Hashable, events: list[Event], failure: Exception) -> bool:
        """Redeliver a failed call's events one at a time under the failure policy; True
        when they are all done (or skipped), False when the key parked or the claim ended."""
        pump = self._pump
        await pump._failed(failure, events, 1)
        left = [event for event in events if not self.progress.is_done(event)]
        if not left:
            return True
        outcome = await redeliver(self._deliver, left, policy=pump._retry_policy, clock=pump._clock,
                                  report=pump._failed, on_poison=lambda poison: self._poisoned(key, poison))
        if outcome.parked:
            self.calls.park(key)
            return False
        return not outcome.abandoned

    async def _poisoned(self, key: Hashable, poison: Poison) -> bool:
        """An event failed every attempt: skip it (done, dead-lettered) or park its key."""
        pump = self._pump
        error = await report_poison(pump.context, poison, pump._on_poison, pump._report, pump._dead_letter,
                                    parks="its key parks")
        if pump._on_poison is PoisonPolicy.SKIP and \
                await dead_letter(pump.context, poison.event, error, pump._dead_letter, pump._report):
            self.progress.finish([poison.event])
            return True
        ctx = pump.context
        logger.error("partition %s of %s/%s: partition key %r is parked on the event at sequence number %d: its "
                     "events are held, not dispatched, until the processor restarts; other keys go on until %d "
                     "events are held beyond the checkpoint (max_pending)", ctx.partition_id, ctx.eventhub_name,
                     ctx.consumer_group, poison.event.partition_key, poison.event.sequence_number, self._bound)
        return False

    def _check_stalled(self) -> None:
        """Say once when nothing can move: the held events all wait behind parked keys."""
        if self._stalled or self._tasks or self.calls.keys_waiting or self.progress.held < self._bound \
                or not self.calls.parked:
            return
        self._stalled = True
        ctx = self._pump.context
        logger.error("partition %s of %s/%s holds %d events beyond its checkpoint (max_pending), all behind parked "
                     "partition keys %s: it is not dispatched until the processor restarts", ctx.partition_id,
                     ctx.eventhub_name, ctx.consumer_group, self.progress.held,
                     sorted(map(repr, self.calls.parked))[:10])

    async def _drain(self) -> None:
        """Let the calls in flight finish (cancelled only if the pump is)."""
        tasks = list(self._tasks)
        if not tasks:
            return
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    # ------------------------------------------------------------------ checkpoints
    async def checkpoint(self, covering: int | None = None) -> None:
        """Write the exact checkpoint, unless it is written already, or one written since
        covers the events finished at version ``covering`` (one write at a time; the calls
        that ask meanwhile share the next). Raises :class:`OwnershipLostError` when the
        claim ended."""
        async with self._lock:
            if covering is not None and self._written_version >= covering:
                return
            version = self.progress.version
            position = self.progress.position()
            if position is None:
                return  # nothing before the first event not done is known yet: nothing to write
            last = self._pump.context.last_checkpoint
            if position != self._written and not (
                    last is not None and last.epoch == self._pump.context.epoch
                    and (last.sequence_number, last.offset, last.done_beyond) == position):
                await write_checkpoint(self._pump.context, *position)
            self._written, self._written_version = position, version

    async def _cadence(self, interval: float) -> None:
        clock, ctx = self._pump._clock, self._pump.context
        while True:
            await clock.sleep(interval)
            try:
                await self.checkpoint()
            except OwnershipLostError:
                return
            except Exception as error:
                logger.warning("partition %s of %s/%s: the periodic checkpoint failed (%r); trying again in %g s",
                               ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error, interval)

    async def checkpoint_on_release(self) -> None:
        """A graceful end, once the calls in flight returned: checkpoint every event done."""
        ctx = self._pump.context
        try:
            await self.checkpoint()
        except Exception as error:
            logger.warning("partition %s of %s/%s: the checkpoint on release failed (%r); the next owner resumes "
                           "from the previous one", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error)
