"""EventProcessor: the thin loop around the pure balancer.

Each tick (``balance_once``): read the partition ids from the source, list ownership
from the store, ask :func:`~eventprocessor.balancer.decide` what to do, make the claims,
then start or stop :class:`~eventprocessor.pump.PartitionPump` tasks to match what the
store says this processor owns.

Leases and self-fencing: a claim or renewal that the store accepted at local
(monotonic) time ``t`` is good until ``t + expiration - safety_margin``. Local elapsed
time is skew-free, and ``t`` is taken *before* the request is sent, so the lease always
ends before any other processor could see the record as expired on the store's clock.
If renewals keep failing (store unreachable), the pump stops dispatching when the lease
ends, before another processor can legally take the partition.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import random
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import (Awaitable, Callable, Dict, FrozenSet, List, Mapping, Optional, Set, Tuple, Type, Union)

from .balancer import BalanceDecision, LoadBalancingStrategy, decide
from .checkpoint_store import CheckpointStore
from .clock import Clock, SystemClock
from .errors import ClaimOwnershipError, ConfigurationError
from .events import EventPosition
from .partition import CloseReason, PartitionContext, PartitionProcessor
from .pump import PartitionPump
from .records import Ownership
from .sources.base import EventSource

__all__ = ["EventProcessor", "BalanceReport"]

logger = logging.getLogger(__name__)

PartitionProcessorSpec = Union[Type[PartitionProcessor], Callable[[], PartitionProcessor]]
ErrorHandler = Callable[[Exception, Optional[PartitionContext]], Awaitable[None]]


@dataclass(frozen=True)
class BalanceReport:
    """What one tick did. For logs, tests and the convergence benchmark."""

    owned: FrozenSet[str]
    claimed: FrozenSet[str]
    renewed: FrozenSet[str]
    stolen: Mapping[str, str]
    lost: FrozenSet[str]
    failed_claims: FrozenSet[str]
    requests: Mapping[str, int] = field(default_factory=dict)
    error: Optional[Exception] = None


class _Lease:
    """One claim of one partition by this processor: the record, until when it may be
    dispatched, and its pump."""

    def __init__(self, record: Ownership, deadline: float, clock: Clock) -> None:
        self.record = record
        self.deadline = deadline
        self.lost = False
        self.pump: Optional[PartitionPump] = None
        self._clock = clock

    @property
    def epoch(self) -> int:
        return self.record.epoch

    def valid(self) -> bool:
        return not self.lost and self._clock.monotonic() < self.deadline

    def mark_lost(self) -> None:
        self.lost = True


class EventProcessor:
    """Consumes the partitions this process owns, balancing ownership with its peers.

    Example::

        class Printer(PartitionProcessor):
            async def process_events(self, events, context):
                for event in events:
                    print(context.partition_id, event.sequence_number, event.body_as_str())
                await context.update_checkpoint()

        source = MemoryEventSource(8)
        async with EventProcessor(source, InMemoryCheckpointStore(), Printer):
            await asyncio.sleep(30)

    Defaults: a 10 s load-balancing interval and a 60 s ownership expiration, the
    same 1:6 ratio as azure-eventhub's 30 s / 180 s but three times faster to converge
    and to fail over. Ownership is renewed only once a record is half expired
    (or three intervals before expiry, whichever is sooner), which keeps storage
    traffic low while leaving at least two renewal attempts before the lease ends.
    ``prefetch`` 300 matches ``max_batch_size`` so a full batch is usually ready.
    ``max_wait_time=None`` calls the handler only with events; set it to get empty
    batches as a heartbeat.
    """

    def __init__(
        self,
        source: EventSource,
        checkpoint_store: CheckpointStore,
        partition_processor: PartitionProcessorSpec,
        *,
        consumer_group: str = "$default",
        owner_id: Optional[str] = None,
        load_balancing_strategy: LoadBalancingStrategy = LoadBalancingStrategy.BALANCED,
        load_balancing_interval: float = 10.0,
        partition_ownership_expiration_interval: float = 60.0,
        initial_event_position: Union[EventPosition, Mapping[str, EventPosition]] = EventPosition.earliest(),
        max_batch_size: int = 300,
        max_wait_time: Optional[float] = None,
        prefetch: int = 300,
        ownership_renewal_age: Optional[float] = None,
        clock: Optional[Clock] = None,
        rng: Optional[random.Random] = None,
        error_handler: Optional[ErrorHandler] = None,
    ) -> None:
        if load_balancing_interval <= 0:
            raise ConfigurationError(f"load_balancing_interval must be positive, got {load_balancing_interval}")
        if partition_ownership_expiration_interval <= load_balancing_interval:
            raise ConfigurationError(
                "partition_ownership_expiration_interval must be longer than load_balancing_interval "
                f"(got {partition_ownership_expiration_interval} <= {load_balancing_interval}); "
                "otherwise ownership expires between ticks")
        if max_batch_size < 1:
            raise ConfigurationError(f"max_batch_size must be at least 1, got {max_batch_size}")
        if max_wait_time is not None and max_wait_time <= 0:
            raise ConfigurationError(f"max_wait_time must be positive or None, got {max_wait_time}")
        if prefetch < 0:
            raise ConfigurationError(f"prefetch must not be negative, got {prefetch}")
        if not consumer_group:
            raise ConfigurationError("consumer_group must not be empty")
        try:
            strategy = LoadBalancingStrategy(load_balancing_strategy)
        except ValueError:
            raise ConfigurationError(
                f"unknown load_balancing_strategy {load_balancing_strategy!r}; use 'balanced' or 'greedy'") from None
        if isinstance(partition_processor, type):
            if not issubclass(partition_processor, PartitionProcessor):
                raise ConfigurationError("partition_processor must be a PartitionProcessor subclass or a factory")
        elif not callable(partition_processor):
            raise ConfigurationError("partition_processor must be a PartitionProcessor subclass or a factory")
        self._source = source
        self._store = checkpoint_store
        self._factory: Callable[[], PartitionProcessor] = partition_processor
        self._consumer_group = consumer_group
        self._owner_id = owner_id or str(uuid.uuid4())
        self._strategy = strategy
        self._interval = float(load_balancing_interval)
        self._expiration = float(partition_ownership_expiration_interval)
        # Self-fencing margin: covers the store clock's 1 s resolution and request latency.
        self._safety_margin = max(2.0, 0.1 * self._expiration) if self._expiration > 4.0 else self._expiration / 4
        if ownership_renewal_age is None:
            ownership_renewal_age = max(0.0, min(self._expiration / 2, self._expiration - 3 * self._interval))
        self._renewal_age = float(ownership_renewal_age)
        self._initial_position = initial_event_position
        self._max_batch_size = max_batch_size
        self._max_wait_time = max_wait_time
        self._prefetch = prefetch
        self._clock: Clock = clock or SystemClock()
        self._rng = rng or random.Random()
        self._error_handler = error_handler
        self._leases: Dict[str, _Lease] = {}
        self._closing: Set[asyncio.Task] = set()
        self._loop_task: Optional[asyncio.Task] = None
        self._ticks = 0

    def __repr__(self) -> str:
        return (f"EventProcessor(owner_id={self._owner_id!r}, eventhub_name={self._source.eventhub_name!r}, "
                f"consumer_group={self._consumer_group!r}, strategy={self._strategy.value})")

    # ----------------------------------------------------------------- properties
    @property
    def owner_id(self) -> str:
        return self._owner_id

    @property
    def owned_partitions(self) -> FrozenSet[str]:
        """The partitions this processor currently dispatches (claim current, lease valid)."""
        return frozenset(pid for pid, lease in self._leases.items() if lease.valid())

    @property
    def ticks(self) -> int:
        return self._ticks

    @property
    def is_running(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    def pump(self, partition_id: str) -> Optional[PartitionPump]:
        lease = self._leases.get(partition_id)
        return lease.pump if lease is not None else None

    # ----------------------------------------------------------------- life cycle
    async def start(self) -> None:
        """Start balancing and processing in the background. Idempotent."""
        if self.is_running:
            return
        self._loop_task = asyncio.create_task(self._run_loop(), name=f"balancer-{self._owner_id}")
        logger.info("processor %s started on %s/%s/%s", self._owner_id, self._source.fully_qualified_namespace,
                    self._source.eventhub_name, self._consumer_group)

    async def stop(self, *, release: bool = True) -> None:
        """Stop: finish in-flight batches, ``close(SHUTDOWN)`` every partition, then
        release ownership (conditional on the etag) so others can claim it at once.

        ``release=False`` leaves the records to expire, as a crash would.
        """
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
            self._loop_task = None
        leases = list(self._leases.items())
        self._leases = {}
        for _pid, lease in leases:
            if lease.pump is not None:
                lease.pump.stop(CloseReason.SHUTDOWN)
        tasks = [lease.pump.task for _pid, lease in leases if lease.pump is not None and lease.pump.task is not None]
        tasks += list(self._closing)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        self._closing.clear()
        if release:
            await self._release([lease.record for _pid, lease in leases if not lease.lost])
        logger.info("processor %s stopped (released=%s)", self._owner_id, release)

    async def run(self) -> None:
        """Run until cancelled, then stop gracefully (releasing ownership)."""
        await self.start()
        try:
            await asyncio.shield(self._loop_task)  # type: ignore[arg-type]
        finally:
            await self.stop()

    async def __aenter__(self) -> "EventProcessor":
        await self.start()
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.stop()

    async def _release(self, records: List[Ownership]) -> None:
        for record in records:
            try:
                released = await self._store.release_ownership(record)
                logger.debug("processor %s released partition %s: %s", self._owner_id, record.partition_id, released)
            except Exception as error:
                logger.warning("processor %s could not release partition %s: %r", self._owner_id,
                               record.partition_id, error)

    async def _run_loop(self) -> None:
        while True:
            try:
                await self.balance_once()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never let one bad tick end the loop
                logger.exception("processor %s: load-balancing tick failed", self._owner_id)
                await self._report(error, None)
            await self._clock.sleep(self._interval * self._rng.uniform(0.9, 1.1))

    # ----------------------------------------------------------------- one tick
    async def balance_once(self) -> BalanceReport:
        """Run one load-balancing tick: list, decide, claim, start or stop pumps.

        Store failures are logged and reported (``error_handler`` and the
        ``process_error`` of the partitions at risk); the processor keeps running and
        its leases run out on their own if the failures last.
        """
        self._ticks += 1
        self._expire_leases()
        report = await self._balance()
        if not self._leases and report.failed_claims and not report.claimed and report.error is None:
            # Every claim of a processor that owns nothing lost a race: it is still
            # invisible to the others. Look again now instead of a tick later.
            retry = await self._balance()
            report = BalanceReport(
                owned=retry.owned, claimed=retry.claimed, renewed=report.renewed | retry.renewed,
                stolen=dict(retry.stolen), lost=report.lost | retry.lost,
                failed_claims=report.failed_claims | retry.failed_claims,
                requests={k: report.requests.get(k, 0) + retry.requests.get(k, 0)
                          for k in set(report.requests) | set(retry.requests)},
                error=retry.error)
        return report

    async def _balance(self) -> BalanceReport:
        started = self._clock.monotonic()
        try:
            partition_ids = await self._source.get_partition_ids()
            listing = await self._store.list_ownership(
                self._source.fully_qualified_namespace, self._source.eventhub_name, self._consumer_group)
        except Exception as error:
            logger.warning("processor %s: listing ownership of %s/%s failed: %r", self._owner_id,
                           self._source.eventhub_name, self._consumer_group, error)
            await self._report(error, None)
            return BalanceReport(self.owned_partitions, frozenset(), frozenset(), {}, frozenset(), frozenset(),
                                 error=error)
        decision = decide(
            listing, partition_ids, self._owner_id,
            fully_qualified_namespace=self._source.fully_qualified_namespace,
            eventhub_name=self._source.eventhub_name, consumer_group=self._consumer_group,
            strategy=self._strategy, expiration_interval=self._expiration, renew_after=self._renewal_age,
            rng=self._rng,
        )
        return await self._apply(decision, listing.server_time, started)

    async def _apply(self, decision: BalanceDecision, server_time, listed_at: float) -> BalanceReport:
        requests = list(decision.renewals) + list(decision.claims)
        claim_sent_at = self._clock.monotonic()
        failures: Dict[str, Exception] = {}
        error: Optional[Exception] = None
        won: List[Ownership] = []
        if requests:
            try:
                won = await self._store.claim_ownership(requests)
            except ClaimOwnershipError as exc:
                won, failures, error = list(exc.claimed), dict(exc.failures), exc
            except Exception as exc:
                error = exc
                failures = {r.partition_id: exc for r in requests}
        won_by_pid = {r.partition_id: r for r in won}
        lease_length = self._expiration - self._safety_margin

        owned: Dict[str, Tuple[Ownership, float]] = {}
        renewing = {r.partition_id for r in decision.renewals}
        for record in decision.owned:
            pid = record.partition_id
            if pid in won_by_pid:
                owned[pid] = (won_by_pid[pid], claim_sent_at + lease_length)
            elif pid in renewing and pid not in failures:
                continue  # renewal lost a race: somebody else wrote the record
            else:
                age = (server_time - record.last_modified_time).total_seconds()
                owned[pid] = (record, listed_at + lease_length - age)
        for claim in decision.claims:
            if claim.partition_id in won_by_pid:
                owned[claim.partition_id] = (won_by_pid[claim.partition_id], claim_sent_at + lease_length)

        lost: Set[str] = set()
        for pid, lease in list(self._leases.items()):
            current = owned.get(pid)
            if current is None or current[0].epoch != lease.epoch:
                self._end_lease(pid, "claimed by another processor" if current is None else "re-claimed")
                lost.add(pid)
        now = self._clock.monotonic()
        to_start: List[Tuple[Ownership, float]] = []
        for pid, (record, deadline) in owned.items():
            existing = self._leases.get(pid)
            if existing is not None:
                existing.record = record
                existing.deadline = max(existing.deadline, deadline)
            elif deadline > now:
                to_start.append((record, deadline))
        if to_start:
            await self._start_pumps(to_start)

        for pid, failure in failures.items():
            # A failed renewal concerns that partition's handler; a failed new claim
            # concerns no handler yet, only the error handler.
            await self._report(failure, self._leases.get(pid), broadcast=False)
        if error is not None and not failures:
            await self._report(error, None)
        claimed = frozenset(c.partition_id for c in decision.claims if c.partition_id in won_by_pid)
        stolen = {pid: owner for pid, owner in decision.stolen_from.items() if pid in claimed}
        if claimed or lost:
            logger.info("processor %s on %s/%s: claimed %s%s, lost %s, owns %d", self._owner_id,
                        self._source.eventhub_name, self._consumer_group, sorted(claimed, key=_pid_key),
                        f" (stolen {stolen})" if stolen else "", sorted(lost, key=_pid_key), len(self._leases))
        return BalanceReport(
            owned=self.owned_partitions,
            claimed=claimed,
            renewed=frozenset(r.partition_id for r in decision.renewals if r.partition_id in won_by_pid),
            stolen=stolen,
            lost=frozenset(lost),
            failed_claims=frozenset(r.partition_id for r in requests
                                    if r.partition_id not in won_by_pid and r.partition_id not in failures),
            requests={"list_ownership": 1, "claim_ownership": len(requests)},
            error=error,
        )

    def _expire_leases(self) -> None:
        """Self-fencing: a lease whose renewal is overdue stops dispatching now."""
        for pid, lease in list(self._leases.items()):
            if lease.lost:
                self._end_lease(pid, "the store refused a checkpoint: another processor owns it")
            elif not lease.valid():
                self._end_lease(pid, "lease ran out before it could be renewed (self-fenced)")

    def _end_lease(self, pid: str, why: str) -> None:
        lease = self._leases.pop(pid)
        lease.lost = True
        logger.info("processor %s stops partition %s of %s/%s: %s", self._owner_id, pid,
                    self._source.eventhub_name, self._consumer_group, why)
        if lease.pump is not None:
            lease.pump.stop(CloseReason.OWNERSHIP_LOST)
            if lease.pump.task is not None and not lease.pump.task.done():
                self._closing.add(lease.pump.task)
                lease.pump.task.add_done_callback(self._closing.discard)

    async def _start_pumps(self, records: List[Tuple[Ownership, float]]) -> None:
        try:
            checkpoints = {
                c.partition_id: c for c in await self._store.list_checkpoints(
                    self._source.fully_qualified_namespace, self._source.eventhub_name, self._consumer_group)
            }
        except Exception as error:
            logger.warning("processor %s: listing checkpoints failed, not starting %d partitions this tick: %r",
                           self._owner_id, len(records), error)
            await self._report(error, None)
            return
        for record, deadline in records:
            pid = record.partition_id
            lease = _Lease(record, deadline, self._clock)
            checkpoint = checkpoints.get(pid)
            if checkpoint is not None:
                position = EventPosition.from_sequence_number(checkpoint.sequence_number)
            elif isinstance(self._initial_position, EventPosition):
                position = self._initial_position
            else:
                position = self._initial_position.get(pid, EventPosition.earliest())
            context = PartitionContext(
                fully_qualified_namespace=self._source.fully_qualified_namespace,
                eventhub_name=self._source.eventhub_name, consumer_group=self._consumer_group,
                partition_id=pid, owner_id=self._owner_id, epoch=record.epoch,
                checkpoint_store=self._store, is_owned=lease.valid, on_ownership_lost=lease.mark_lost,
            )
            context.last_checkpoint = checkpoint
            try:
                processor = self._factory()
            except Exception as error:
                logger.exception("processor %s: the partition processor factory failed for partition %s",
                                 self._owner_id, pid)
                await self._report(error, None)
                continue
            lease.pump = PartitionPump(
                context=context, processor=processor, source=self._source, starting_position=position,
                max_batch_size=self._max_batch_size, max_wait_time=self._max_wait_time,
                prefetch=self._prefetch, clock=self._clock,
            )
            self._leases[pid] = lease
            lease.pump.start()
            logger.debug("processor %s starts partition %s (epoch %d) from %s", self._owner_id, pid,
                         record.epoch, position)

    async def _report(self, error: Exception, lease: Optional[_Lease], *, broadcast: bool = True) -> None:
        """Report ``error`` to the handler of ``lease``, or with no lease (a tick-wide
        failure, such as the store being unreachable) to every handler at risk when
        ``broadcast``; then to ``error_handler``."""
        targets: List[PartitionPump] = []
        if lease is not None and lease.pump is not None:
            targets = [lease.pump]
        elif lease is None and broadcast:
            targets = [l.pump for l in self._leases.values() if l.pump is not None]
        for pump in targets:
            try:
                await pump.processor.process_error(error, pump.context)
            except Exception:
                logger.exception("process_error raised for partition %s", pump.context.partition_id)
        if self._error_handler is not None:
            try:
                result = self._error_handler(error, None if lease is None or lease.pump is None else lease.pump.context)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("error_handler raised")


def _pid_key(pid: str):
    return (0, int(pid)) if pid.isdigit() else (1, pid)
