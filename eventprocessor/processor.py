"""EventProcessor: balances partitions with its peers and runs one pump per partition.

Three kinds of task, none of which waits for another's work:

* the **balancing loop** (:meth:`EventProcessor.balance_once`, every
  ``load_balancing_interval``): read the partition ids, list ownership, reconcile the
  local leases with the listing (:func:`~eventprocessor.lease.reconcile`), ask the pure
  balancer (:func:`~eventprocessor.balancer.decide`) what to claim, claim it, fence each
  won partition's checkpoint and start its pump;
* the **renewer** (:class:`~eventprocessor.renewer.LeaseRenewer`): rewrites each owned
  record once it is ``ownership_renewal_age`` old, on its own schedule;
* one **pump** per owned partition (:class:`~eventprocessor.pump.PartitionPump`),
  where all user code runs.

Every store call is bounded by ``store_timeout`` (:class:`~eventprocessor.bounded_store.
BoundedStore`). Leases are measured on the local monotonic clock from the moment the
write the store accepted was *sent*, and end ``expiration - safety margin`` later, before
any other processor could judge the record expired on the store's clock (self-fencing).
The timing model and how to size it are in the README ("Timing").
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import math
import random
import uuid
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import (Any, Awaitable, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Set, Tuple, Type,
                    Union)

from .backoff import Congestion, TickBackoff
from .balancer import HANDOFF_PROPERTY, ORDINAL_PROPERTY, LoadBalancingStrategy, decide
from .bounded_store import BATCH, BoundedStore
from .checkpoint_store import CheckpointStore
from .clock import Clock, SystemClock
from .delivery import PoisonPolicy, RetryPolicy
from .errors import (CheckpointStoreError, ClaimOwnershipError, ConfigurationError, EventSourceError,
                     OwnershipLostError, StaleEpochError, StoreDataLostError)
from .events import EventPosition
from .lease import Lease, LeaseEnd, LeaseState, Reconciliation, Snapshot, reconcile
from .partition import CloseReason, PartitionContext, PartitionProcessor
from .pump import DeadLetter, PartitionPump
from .records import (MAX_EPOCH, Checkpoint, Member, MemberListing, Ownership, OwnershipListing,
                      partition_sort_key)
from .renewer import LeaseRenewer
from .sources.base import EventSource
from .telemetry import Telemetry
from .usercode import BLOCK_THRESHOLD, HandlerExecutor

__all__ = ["EventProcessor", "BalanceReport", "Timing", "ProcessorStats", "OWNERSHIP_LOG_FIELDS", "OWNERSHIP_REASONS"]

logger = logging.getLogger(__name__)

PartitionProcessorFactory = Union[Type[PartitionProcessor], Callable[[], PartitionProcessor]]
ErrorHandler = Callable[[Exception, Optional[PartitionContext]], Union[Awaitable[None], None]]


@dataclass(frozen=True)
class BalanceReport:
    """What one balancing tick did. For logs, tests and the convergence benchmark."""

    owned: FrozenSet[str]
    claimed: FrozenSet[str]
    renewed: FrozenSet[str]
    stolen: Mapping[str, str]
    lost: FrozenSet[str]
    failed_claims: FrozenSet[str]
    requests: Mapping[str, int] = field(default_factory=dict)
    error: Optional[Exception] = None
    duration: float = 0.0


@dataclass
class ProcessorStats:
    """Counters since the processor was created (read :attr:`EventProcessor.stats`).

    ``self_fenced`` counts leases that ran out before a renewal succeeded (a missed
    renewal); ``lost`` counts claims ended because another processor took the partition.
    """

    ticks: int = 0
    overruns: int = 0
    last_tick_duration: float = 0.0
    max_tick_duration: float = 0.0
    claims_won: int = 0
    claims_lost: int = 0
    steals: int = 0
    adopted: int = 0
    renewals: int = 0
    failed_renewals: int = 0
    self_fenced: int = 0
    lost: int = 0
    released: int = 0
    handed_off: int = 0
    handoffs_requested: int = 0
    store_data_lost: int = 0
    backed_off_ticks: int = 0
    backoff_level: int = 0


STALL_WATCH_PERIOD = 1.0
"""How often the processor measures its event loop's lag (seconds)."""

RENEWAL_WINDOW = 15.0
"""Seconds of lease left when an owned record is rewritten by default (see
:meth:`Timing.default_renewal_age`)."""


@dataclass(frozen=True)
class Timing:
    """The processor's timing model, derived from its arguments (all in seconds).

    ``lease_length = expiration - safety_margin``: how long a write the store accepted
    lets this processor dispatch, from the moment it was sent. ``renewal_age``: a record
    is rewritten once it is this old. ``renewal_retry``: how soon a failed renewal is
    tried again. ``store_timeout``: the longest any store call may take; three of them
    fit between the renewal age and the end of the lease, so a black-holed store still
    gets three renewal attempts before the lease self-fences.
    """

    interval: float
    expiration: float
    safety_margin: float
    lease_length: float
    renewal_age: float
    renewal_retry: float
    store_timeout: float
    shutdown_timeout: float
    handler_timeout: Optional[float]

    @property
    def heartbeat(self) -> float:
        """How often a member rewrites its member record: a quarter of the expiration."""
        return self.expiration / 4

    @property
    def member_expiration(self) -> float:
        """A member record older than this (half the expiration) is a gone member."""
        return self.expiration / 2

    @staticmethod
    def safety_margin_for(expiration: float) -> float:
        """``max(2 s, E/10)``, or ``E/4`` below 8 s: covers the store's one-second
        timestamps and clock drift."""
        return max(2.0, 0.1 * expiration) if expiration > 8.0 else expiration / 4

    @staticmethod
    def default_renewal_age(expiration: float) -> float:
        """A record is rewritten when ``RENEWAL_WINDOW`` (15 s) of its lease remain, or
        at half its expiration if that is later (short expirations): long leases are
        rewritten rarely, and three store calls still fit before a lease could lapse."""
        lease_length = expiration - Timing.safety_margin_for(expiration)
        return max(expiration / 2, lease_length - RENEWAL_WINDOW)

    @staticmethod
    def derive(*, interval: float, expiration: float, renewal_age: Optional[float],
               store_timeout: Optional[float], shutdown_timeout: float,
               handler_timeout: Optional[float]) -> "Timing":
        margin = Timing.safety_margin_for(expiration)
        lease_length = expiration - margin
        if renewal_age is None:
            renewal_age = Timing.default_renewal_age(expiration)
        if renewal_age >= lease_length:
            raise ConfigurationError(
                f"ownership_renewal_age={renewal_age:g} must be shorter than the lease "
                f"(partition_ownership_expiration_interval - safety margin = {expiration:g} - {margin:g} = "
                f"{lease_length:g} s); otherwise every lease runs out before it is renewed")
        window = lease_length - renewal_age
        if store_timeout is None:
            store_timeout = window / 3
        elif store_timeout > window:
            raise ConfigurationError(
                f"store_timeout={store_timeout:g} must not exceed the time between renewal and the end of the lease "
                f"({window:g} s = lease {lease_length:g} - renewal age {renewal_age:g}); a renewal that takes "
                "longer could never be retried before the lease ends")
        return Timing(interval=interval, expiration=expiration, safety_margin=margin, lease_length=lease_length,
                      renewal_age=renewal_age, renewal_retry=min(interval, window / 4), store_timeout=store_timeout,
                      shutdown_timeout=shutdown_timeout, handler_timeout=handler_timeout)


def _positive_number(name: str, value: Any, *, allow_none: bool = False) -> Optional[float]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


class _Throttle:
    """Reports a recurring failure loudly the first time and then at most once per
    ``period`` seconds, and says when it has recovered."""

    def __init__(self, clock: Clock, period: float) -> None:
        self._clock = clock
        self._period = period
        self._state: Dict[str, Tuple[float, int]] = {}  # kind -> (last report, failures since)

    def failed(self, kind: str) -> Tuple[bool, int]:
        """Should this failure be reported? Returns (report, failures suppressed so far)."""
        now = self._clock.monotonic()
        last, count = self._state.get(kind, (-math.inf, 0))
        if now - last >= self._period:
            self._state[kind] = (now, 0)
            return True, count
        self._state[kind] = (last, count + 1)
        return False, count + 1

    def recovered(self, kind: str) -> Optional[int]:
        """The failure stopped: returns how many went by, or None if none was pending."""
        state = self._state.pop(kind, None)
        return None if state is None else state[1] + 1


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

    The timing arguments and how to size them are described in the README ("Timing") and
    in :class:`Timing`, which :attr:`timing` returns.
    """

    def __init__(
        self,
        source: EventSource,
        checkpoint_store: CheckpointStore,
        partition_processor: PartitionProcessorFactory,
        *,
        consumer_group: str = "$default",
        owner_id: Optional[str] = None,
        load_balancing_strategy: Union[LoadBalancingStrategy, str] = LoadBalancingStrategy.GREEDY,
        load_balancing_interval: float = 15.0,
        partition_ownership_expiration_interval: float = 75.0,
        ownership_renewal_age: Optional[float] = None,
        store_timeout: Optional[float] = None,
        shutdown_timeout: float = 30.0,
        handler_timeout: Optional[float] = 60.0,
        handler_executor: HandlerExecutor = None,
        initial_event_position: Union[EventPosition, Mapping[str, EventPosition]] = EventPosition.earliest(),
        max_batch_size: int = 300,
        max_wait_time: Optional[float] = None,
        prefetch: int = 300,
        track_last_enqueued_event_properties: bool = False,
        default_event_position: EventPosition = EventPosition.earliest(),
        override_checkpoints: Union[bool, Iterable[str]] = False,
        max_delivery_attempts: int = 5,
        retry_backoff: float = 0.5,
        on_poison: Union[PoisonPolicy, str] = PoisonPolicy.SKIP,
        dead_letter: Optional[DeadLetter] = None,
        refuse_checkpoint_rewind: bool = False,
        handoff_timeout: Optional[float] = 30.0,
        balance_factor: int = 1,
        ordinal: Optional[int] = None,
        replica_count: Optional[int] = None,
        clock: Optional[Clock] = None,
        rng: Optional[random.Random] = None,
        error_handler: Optional[ErrorHandler] = None,
        meter_provider: Any = None,
        tracer_provider: Any = None,
    ) -> None:
        interval = _positive_number("load_balancing_interval", load_balancing_interval)
        expiration = _positive_number("partition_ownership_expiration_interval",
                                      partition_ownership_expiration_interval)
        assert interval is not None and expiration is not None
        if expiration <= interval:
            raise ConfigurationError(
                "partition_ownership_expiration_interval must be longer than load_balancing_interval "
                f"(got {expiration:g} <= {interval:g}); otherwise ownership expires between ticks")
        renewal = None
        if ownership_renewal_age is not None:
            if isinstance(ownership_renewal_age, bool) or not isinstance(ownership_renewal_age, (int, float)) \
                    or not math.isfinite(ownership_renewal_age) or ownership_renewal_age <= 0:
                raise ConfigurationError(
                    f"ownership_renewal_age must be a positive number of seconds (how old a record gets before it "
                    f"is rewritten), got {ownership_renewal_age!r}")
            renewal = float(ownership_renewal_age)
        self._timing = Timing.derive(
            interval=interval, expiration=expiration, renewal_age=renewal,
            store_timeout=_positive_number("store_timeout", store_timeout, allow_none=True),
            shutdown_timeout=_positive_number("shutdown_timeout", shutdown_timeout) or 0.0,
            handler_timeout=_positive_number("handler_timeout", handler_timeout, allow_none=True))
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ConfigurationError(f"max_batch_size must be an int of at least 1, got {max_batch_size!r}")
        max_wait = _positive_number("max_wait_time", max_wait_time, allow_none=True)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigurationError(f"prefetch must be a non-negative int, got {prefetch!r}")
        if not isinstance(consumer_group, str) or not consumer_group:
            raise ConfigurationError(f"consumer_group must be a non-empty string, got {consumer_group!r}")
        if owner_id is not None and (not isinstance(owner_id, str) or not owner_id.strip()):
            raise ConfigurationError(f"owner_id must be a non-empty string (or None for a random one), "
                                     f"got {owner_id!r}")
        try:
            strategy = LoadBalancingStrategy(load_balancing_strategy)
        except ValueError:
            raise ConfigurationError(
                f"unknown load_balancing_strategy {load_balancing_strategy!r}; use 'balanced' or 'greedy'") from None
        if isinstance(partition_processor, type):
            if not issubclass(partition_processor, PartitionProcessor):
                raise ConfigurationError("partition_processor must be a PartitionProcessor subclass or a factory "
                                         f"returning one, got the class {partition_processor.__name__}")
        elif not callable(partition_processor):
            raise ConfigurationError("partition_processor must be a PartitionProcessor subclass or a factory "
                                     f"returning one, got {type(partition_processor).__name__}")
        if not isinstance(source, EventSource):
            raise ConfigurationError(f"source must be an EventSource (for example MemoryEventSource or "
                                     f"EventHubSource), got {type(source).__name__}")
        if not isinstance(checkpoint_store, CheckpointStore):
            raise ConfigurationError(f"checkpoint_store must be a CheckpointStore (for example "
                                     f"InMemoryCheckpointStore or BlobCheckpointStore), got "
                                     f"{type(checkpoint_store).__name__}")
        self._initial_position = self._check_positions(initial_event_position)
        if not isinstance(default_event_position, EventPosition):
            raise ConfigurationError(f"default_event_position must be an EventPosition, got "
                                     f"{type(default_event_position).__name__} {default_event_position!r}")
        self._default_position = default_event_position
        if isinstance(override_checkpoints, bool):
            self._override: Union[bool, FrozenSet[str]] = override_checkpoints
        elif isinstance(override_checkpoints, str) or not all(isinstance(p, str) for p in override_checkpoints):
            raise ConfigurationError(f"override_checkpoints must be True/False or a collection of partition id "
                                     f"strings, got {override_checkpoints!r}")
        else:
            self._override = frozenset(override_checkpoints)
        self._overridden: Set[str] = set()
        self._track_last_enqueued = bool(track_last_enqueued_event_properties)
        if error_handler is not None and not callable(error_handler):
            raise ConfigurationError(f"error_handler must be callable, got {type(error_handler).__name__}")
        if dead_letter is not None and not callable(dead_letter):
            raise ConfigurationError(f"dead_letter must be an async callable (events, error, context), got "
                                     f"{type(dead_letter).__name__}")
        if isinstance(max_delivery_attempts, bool) or not isinstance(max_delivery_attempts, int) \
                or max_delivery_attempts < 1:
            raise ConfigurationError(f"max_delivery_attempts must be an int of at least 1, got "
                                     f"{max_delivery_attempts!r}")
        backoff = _positive_number("retry_backoff", retry_backoff)
        assert backoff is not None
        try:
            poison_policy = PoisonPolicy(on_poison)
        except ValueError:
            raise ConfigurationError(f"unknown on_poison {on_poison!r}; use 'skip' or 'park'") from None
        if isinstance(balance_factor, bool) or not isinstance(balance_factor, int) or balance_factor < 1:
            raise ConfigurationError(f"balance_factor must be an int of at least 1, got {balance_factor!r}")
        self._handoff_timeout = _positive_number("handoff_timeout", handoff_timeout, allow_none=True)
        if strategy is LoadBalancingStrategy.STATIC:
            if isinstance(replica_count, bool) or not isinstance(replica_count, int) or replica_count < 1:
                raise ConfigurationError(f"the static strategy needs replica_count, an int of at least 1, got "
                                         f"{replica_count!r}")
            if isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal < replica_count:
                raise ConfigurationError(f"the static strategy needs ordinal, an int from 0 to replica_count - 1 = "
                                         f"{replica_count - 1}, got {ordinal!r}")
        elif ordinal is not None or replica_count is not None:
            raise ConfigurationError(f"ordinal and replica_count are only used by load_balancing_strategy='static', "
                                     f"not {strategy.value!r}")
        self._balance_factor = balance_factor
        self._ordinal = ordinal
        self._replica_count = replica_count or 0
        if handler_executor is not None and handler_executor != "thread" and not (
                isinstance(handler_executor, concurrent.futures.Executor)
                and not isinstance(handler_executor, concurrent.futures.ProcessPoolExecutor)):
            raise ConfigurationError(
                f"handler_executor must be None (handlers run on the event loop), \"thread\" (a worker thread per "
                f"owned partition) or a thread-based concurrent.futures.Executor, got {handler_executor!r}")
        self._handler_executor = handler_executor
        self._retry_policy = RetryPolicy(max_delivery_attempts=max_delivery_attempts, retry_backoff=backoff)
        self._on_poison = poison_policy
        self._dead_letter = dead_letter

        if clock is not None and not (callable(getattr(clock, "monotonic", None))
                                      and callable(getattr(clock, "sleep", None))):
            raise ConfigurationError(f"clock must have monotonic() and async sleep(seconds) (see "
                                     f"eventprocessor.clock.Clock), got {type(clock).__name__}")
        if rng is not None and not isinstance(rng, random.Random):
            raise ConfigurationError(f"rng must be a random.Random, got {type(rng).__name__}")
        self._source = source
        self._clock: Clock = clock or SystemClock()
        self._store = BoundedStore(checkpoint_store, timeout=self._timing.store_timeout, clock=self._clock)
        self._factory: Callable[[], PartitionProcessor] = partition_processor
        self._consumer_group = consumer_group
        self._owner_id = owner_id or str(uuid.uuid4())
        self._strategy = strategy
        self._max_batch_size = max_batch_size
        self._max_wait_time = max_wait
        self._prefetch = prefetch
        self._refuse_rewind = bool(refuse_checkpoint_rewind)
        self._rng = rng or random.Random()
        self._error_handler = error_handler
        self._leases: Dict[str, Lease] = {}
        self._renewer = LeaseRenewer(
            store=self._store, leases=self._leases, clock=self._clock, renewal_age=self._timing.renewal_age,
            lease_length=self._timing.lease_length, retry_interval=self._timing.renewal_retry,
            on_contested=self._wake_balancer, on_error=lambda error, lease: self._report(error, [lease]),
            describe=self._owner_id)
        self._tasks: Dict[str, asyncio.Task] = {}
        self._side_tasks: Set[asyncio.Task] = set()
        self._balancer_wake = asyncio.Event()
        self._store_answered = asyncio.Event()  # set by a prompt, successful store call
        self._keeper_wake = asyncio.Event()
        self._throttle = _Throttle(self._clock, max(30.0, self._timing.expiration))
        self._backoff = TickBackoff(interval=self._timing.interval,
                                    cap=max(self._timing.interval, self._timing.expiration), rng=self._rng)
        self._timeouts_seen = 0
        self._listing_seconds: Optional[float] = None  # how long the last tick's listing took (None: no answer)
        self._seen_epochs: Dict[str, int] = {}
        self._known_checkpoints: Dict[str, Checkpoint] = {}
        self._stats = ProcessorStats()
        self._telemetry = Telemetry(eventhub_name=source.eventhub_name, consumer_group=consumer_group,
                                    owner_id=self._owner_id, meter_provider=meter_provider,
                                    tracer_provider=tracer_provider)
        self._telemetry.observe(owned=lambda: len(self.owned_partitions), lag=self.lag)
        if self._telemetry.enabled:
            self._store.observers.append(self._telemetry.store_call)
        self._store.observers.append(self._note_prompt_answer)
        self._fatal: Optional[Exception] = None
        self._member: Optional[Member] = None
        self._membership: Optional[bool] = None  # None: not known yet; False: the store keeps no members
        self._requests_made: Dict[str, float] = {}  # partition -> local time this processor asked for it
        self._ended_at: Dict[str, float] = {}  # partition -> local time this processor's last claim of it ended
        self._lost_mine: Set[str] = set()  # partitions whose records vanished while (or just after) it held them
        self._listed: Set[str] = set()  # partitions that had a record in the last listing
        self._reported_backwards: Dict[str, int] = {}
        self._last_stall: Optional[Tuple[float, float]] = None  # the last stall of the loop a handler caused

    @staticmethod
    def _check_positions(value: Any) -> Union[EventPosition, Mapping[str, EventPosition]]:
        if isinstance(value, EventPosition):
            return value
        if isinstance(value, Mapping):
            for key, position in value.items():
                if not isinstance(key, str) or not isinstance(position, EventPosition):
                    raise ConfigurationError(
                        "initial_event_position as a mapping must map partition id strings to EventPosition, "
                        f"got {key!r}: {type(position).__name__}")
            return dict(value)
        raise ConfigurationError(
            f"initial_event_position must be an EventPosition (for example EventPosition.earliest()) or a "
            f"mapping of partition id to EventPosition, got {type(value).__name__} {value!r}")

    def __repr__(self) -> str:
        return (f"EventProcessor(owner_id={self._owner_id!r}, eventhub_name={self._source.eventhub_name!r}, "
                f"consumer_group={self._consumer_group!r}, strategy={self._strategy.value})")

    # ----------------------------------------------------------------- properties
    @property
    def owner_id(self) -> str:
        return self._owner_id

    @property
    def timing(self) -> Timing:
        """The timing model in effect (see :class:`Timing`)."""
        return self._timing

    @property
    def owned_partitions(self) -> FrozenSet[str]:
        """The partitions this processor may dispatch right now (claim owned, lease valid)."""
        now = self._clock.monotonic()
        return frozenset(pid for pid, lease in self._leases.items() if lease.dispatchable(now))

    @property
    def leases(self) -> Mapping[str, LeaseState]:
        """The state of every lease this processor holds, by partition."""
        return {pid: lease.state for pid, lease in self._leases.items()}

    @property
    def ticks(self) -> int:
        return self._stats.ticks

    @property
    def overruns(self) -> int:
        return self._stats.overruns

    @property
    def stats(self) -> ProcessorStats:
        """Counters: ticks and overruns, claims, renewals, self-fenced leases, ..."""
        self._stats.renewals = self._renewer.renewals
        self._stats.failed_renewals = self._renewer.failed_renewals
        return self._stats

    @property
    def is_running(self) -> bool:
        task = self._tasks.get("balancer")
        return task is not None and not task.done()

    @property
    def store_calls(self) -> BoundedStore:
        """The bounded store wrapper: call counts, failures, time-outs and latency."""
        return self._store

    def pump(self, partition_id: str) -> Optional[PartitionPump]:
        lease = self._leases.get(partition_id)
        return lease.pump if lease is not None else None

    @property
    def _describe(self) -> str:
        return f"{self._owner_id} on {self._source.eventhub_name}/{self._consumer_group}"

    # ----------------------------------------------------------------- life cycle
    async def start(self) -> None:
        """Start balancing, renewing and processing in the background. Idempotent."""
        if self.is_running:
            return
        self._start_background(balancing=True)
        logger.info("processor %s started on %s/%s/%s", self._owner_id, self._source.fully_qualified_namespace,
                    self._source.eventhub_name, self._consumer_group)

    def _start_background(self, *, balancing: bool) -> None:
        """Start the renewer, the lease keeper and the member heartbeat, and the balancing
        loop when asked (the convergence simulator ticks ``balance_once`` itself)."""
        loop = asyncio.get_running_loop()
        if balancing:
            self._tasks["balancer"] = loop.create_task(self._balancing_loop(), name=f"balancer-{self._owner_id}")
        self._tasks["renewer"] = loop.create_task(self._renewer.run(), name=f"renewer-{self._owner_id}")
        self._tasks["keeper"] = loop.create_task(self._keeper_loop(), name=f"keeper-{self._owner_id}")
        self._tasks["stall-watch"] = loop.create_task(self._stall_watch_loop(), name=f"stall-watch-{self._owner_id}")
        self._tasks["heartbeat"] = loop.create_task(self._heartbeat_loop(), name=f"heartbeat-{self._owner_id}")

    def _member_record(self) -> Member:
        properties = {"strategy": self._strategy.value, HANDOFF_PROPERTY: "1" if self._handoff_timeout else "0"}
        if self._ordinal is not None:
            properties[ORDINAL_PROPERTY] = str(self._ordinal)
        return Member(self._source.fully_qualified_namespace, self._source.eventhub_name, self._consumer_group,
                      self._owner_id, properties=properties)

    async def _join(self) -> None:
        """Write this processor's member record, so that its peers count it in their
        plans even while it owns nothing. A store that keeps no member records is fine
        (except for the static strategy): the processor then makes itself visible by
        claiming one partition first."""
        if self._membership is False:
            return
        try:
            self._member = await self._store.write_member(self._member_record())
            if not self._membership:
                logger.debug("processor %s joined (member record written)", self._describe)
            self._membership = True
        except NotImplementedError:
            self._membership = False
            if self._strategy is LoadBalancingStrategy.STATIC:
                error = ConfigurationError(f"the static strategy needs a checkpoint store that keeps member "
                                           f"records; {type(self._store.inner).__name__} does not")
                self._fatal = error
                self._report(error, [])
                self._spawn(self.stop(), f"fatal-stop-{self._owner_id}")
            else:
                logger.info("processor %s: %s keeps no member records; a processor that owns nothing claims one "
                            "partition first to be seen", self._describe, type(self._store.inner).__name__)
        except Exception as error:
            report, _suppressed = self._throttle.failed("member")
            if report:
                logger.warning("processor %s: writing its member record failed: %r", self._describe, error)

    async def _heartbeat_loop(self) -> None:
        """Rewrite the member record every ``ownership_renewal_age``, like a lease."""
        while True:
            if self._membership is False:
                return
            await self._join()
            pause = self._timing.heartbeat if self._membership else self._timing.renewal_retry
            await self._clock.sleep(pause)

    def _live_members(self, listing: Optional[MemberListing]) -> Optional[Dict[str, Mapping[str, str]]]:
        """The live member records (id → properties), or None when the store keeps none."""
        if not self._membership or listing is None:
            return None
        live: Dict[str, Mapping[str, str]] = {}
        for member in listing.members:
            modified = member.last_modified_time
            # A member is live for half the expiration (it heartbeats every quarter): a
            # crashed member leaves the plans no later than its partitions' records expire.
            if modified is not None and (listing.server_time - modified).total_seconds() <= \
                    self._timing.member_expiration:
                live[member.owner_id] = dict(member.properties)
        return live

    async def stop(self, *, release: bool = True) -> None:
        """Stop within ``shutdown_timeout`` plus one ``store_timeout``.

        Balancing stops at once; every pump finishes the batch it is in and calls
        ``close(SHUTDOWN)`` while the renewer keeps the leases fresh. A pump still busy
        after ``shutdown_timeout`` is cancelled and logged. Then each partition whose pump
        is gone is released (cleared, conditional on the etag) so others can claim it at
        once; one whose pump would not end is left to expire. ``release=False`` leaves
        every record to expire, as a crash would.
        """
        balancer = self._tasks.pop("balancer", None)
        if balancer is not None:
            await self._cancel(balancer)
        started = self._clock.monotonic()
        for lease in list(self._leases.values()):
            if lease.state in (LeaseState.OWNED, LeaseState.HANDING_OFF, LeaseState.CLAIMING):
                self._end(lease, LeaseEnd.SHUTDOWN, "the processor is stopping", release_to="" if release else None)
            if not release:
                lease.release_to = None
        pumps = [lease.pump for lease in self._leases.values() if lease.pump is not None and lease.pump.alive]
        hung = await self._wait_for_pumps(pumps, self._timing.shutdown_timeout)
        if hung:
            logger.error("processor %s: %d partition(s) %s did not finish within shutdown_timeout=%g s (a handler "
                         "that does not return); cancelling them, their records are left to expire",
                         self._describe, len(hung), sorted(p.context.partition_id for p in hung),
                         self._timing.shutdown_timeout)
            for pump in hung:
                pump.cancel()
                hung_lease = self._leases.get(pump.context.partition_id)
                if hung_lease is not None:
                    hung_lease.release_to = None
            still = await self._wait_for_pumps(hung, 1.0)
            if still:
                logger.error("processor %s: partitions %s ignored cancellation; they may still run",
                             self._describe, sorted(p.context.partition_id for p in still))
        for name in ("renewer", "keeper", "heartbeat", "stall-watch"):
            task = self._tasks.pop(name, None)
            if task is not None:
                await self._cancel(task)
        self._reconcile()
        # Release writes are bounded by store_timeout each; wait for them.
        releasing = [t for t in self._side_tasks if t.get_name().startswith("release-") and not t.done()]
        if releasing:
            await asyncio.gather(*releasing, return_exceptions=True)
        for lease in list(self._leases.values()):
            if not lease.pump_alive:
                self._leases.pop(lease.partition_id, None)
        remaining = started + self._timing.shutdown_timeout + self._timing.store_timeout - self._clock.monotonic()
        if release and remaining > 0:
            try:  # within the documented bound, or not at all
                await asyncio.wait_for(self._leave_nothing_behind({p.context.partition_id for p in hung}), remaining)
            except asyncio.TimeoutError:
                logger.warning("processor %s: its last listing did not finish within stop()'s bound; records that "
                               "still name it will expire", self._describe)
        if release and self._member is not None:
            try:
                await self._store.delete_member(self._member)
            except Exception as error:
                logger.warning("processor %s: deleting its member record failed: %r; it expires instead",
                               self._describe, error)
            self._member = None
            self._membership = None
        side = [t for t in self._side_tasks if not t.done() and t is not asyncio.current_task()]
        for task in side:
            task.cancel()
        if side:
            await asyncio.gather(*side, return_exceptions=True)
        logger.info("processor %s stopped in %.2f s (released=%s)", self._describe,
                    self._clock.monotonic() - started, release)

    async def _leave_nothing_behind(self, left_to_expire: Set[str]) -> None:
        """The last step of a graceful stop: one listing, then release every record that
        names this processor but that it does not hold (a claim the store applied while
        the stopping tick waited for its answer, a partition handed over to it meanwhile)
        and withdraw its own handoff requests, so that nobody waits for an expiration
        because of a processor that is gone. A handoff written after this listing still
        expires (it needs an owner that saw the request before the stop and wrote later),
        and so do the partitions in ``left_to_expire`` (their handlers would not end)."""
        scope = (self._source.fully_qualified_namespace, self._source.eventhub_name, self._consumer_group)
        try:
            listing = await self._store.list_ownership(*scope)
        except Exception as error:
            logger.warning("processor %s: listing ownership as it stops failed: %r; records that still name it "
                           "will expire", self._describe, error)
            return
        held = {pid for pid, lease in self._leases.items() if lease.pump_alive} | left_to_expire
        writes = [replace(record, owner_id="", requested_by="") if record.owner_id == self._owner_id
                  else replace(record, requested_by="")
                  for record in listing.ownerships if record.partition_id not in held
                  and (record.owner_id == self._owner_id or record.requested_by == self._owner_id)]
        if not writes:
            return
        try:
            written = await self._store.claim_ownership(writes)
        except ClaimOwnershipError as error:
            written = list(error.claimed)
        except Exception as error:
            logger.warning("processor %s: releasing partitions %s as it stops failed: %r; they will expire",
                           self._describe, _sorted(r.partition_id for r in writes), error)
            return
        released = _sorted(r.partition_id for r in written if not r.owner_id)
        withdrawn = _sorted(r.partition_id for r in written if r.owner_id)
        self._stats.released += len(released)
        if released or withdrawn:
            logger.info("processor %s: as it stopped, released partitions %s that named it without its holding "
                        "them and withdrew its requests for %s", self._describe, released, withdrawn)

    async def _wait_for_pumps(self, pumps: List[PartitionPump], timeout: float) -> List[PartitionPump]:
        """Wait up to ``timeout`` for ``pumps`` to end; return those still running."""
        tasks = [p.task for p in pumps if p.task is not None and not p.task.done()]
        if tasks:
            waiting = asyncio.ensure_future(asyncio.wait(tasks))
            timer = asyncio.ensure_future(self._clock.sleep(timeout))
            await asyncio.wait({waiting, timer}, return_when=asyncio.FIRST_COMPLETED)
            timer.cancel()
            waiting.cancel()
        return [p for p in pumps if p.alive]

    @staticmethod
    async def _cancel(task: asyncio.Task) -> None:
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        except Exception:
            logger.exception("background task %s failed", task.get_name())

    async def run(self) -> None:
        """Run until cancelled, then stop gracefully (releasing ownership).

        Raises the configuration error that stopped the processor by itself, if one did
        (a factory that does not return a ``PartitionProcessor``)."""
        await self.start()
        try:
            await asyncio.shield(self._tasks["balancer"])
        except asyncio.CancelledError:
            if self._fatal is None:
                raise
        finally:
            await self.stop()
        if self._fatal is not None:
            raise self._fatal

    async def __aenter__(self) -> "EventProcessor":
        await self.start()
        return self

    async def __aexit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                        tb: Optional[TracebackType]) -> None:
        await self.stop()

    # ----------------------------------------------------------------- background loops
    def _wake_balancer(self) -> None:
        self._balancer_wake.set()

    async def _sleep_or_wake(self, seconds: float, wake: asyncio.Event) -> None:
        if seconds <= 0:
            return
        waiter = asyncio.ensure_future(wake.wait())
        timer = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            timer.cancel()

    async def _balancing_loop(self) -> None:
        interval = self._timing.interval
        if self._membership is None:
            await self._join()
        while True:
            self._balancer_wake.clear()
            started = self._clock.monotonic()
            try:
                await self.balance_once()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never let one bad tick end the loop
                logger.exception("processor %s: load-balancing tick failed", self._describe)
                self._report(error, [])
            elapsed = self._clock.monotonic() - started
            pause = interval * self._rng.uniform(0.9, 1.1)
            backed_off = self._back_off_if_store_timed_out()
            if backed_off is not None:
                # A saturated store drains only if its callers slow down. But a processor
                # that owns nothing (its leases ran out in an outage) and sees a store call
                # answered promptly meanwhile (a heartbeat) ticks within one jittered
                # interval instead of waiting out the whole pause: the outage is over.
                # (One that owns partitions keeps them through its renewals, and waits.)
                self._store_answered.clear()
                await self._sleep_or_wake(backed_off - elapsed, self._store_answered)
                if self._store_answered.is_set():
                    await self._clock.sleep(interval * self._rng.uniform(0.0, 1.0))
                continue
            if self._requests_made:
                # Waiting on a handoff: look again soon, to take the partition as soon as
                # its owner writes it over (a few extra listings, during moves only).
                pause = min(pause, interval / 4)
            await self._sleep_or_wake(pause - elapsed, self._balancer_wake)

    def _note_prompt_answer(self, operation: str, seconds: float, error: Optional[BaseException]) -> None:
        # Runs after every store call: the cheap tests first; only a backing-off loop waits on it.
        if self._backoff.backing_off and error is None and seconds < self._timing.store_timeout / 4 \
                and not self.owned_partitions:
            self._store_answered.set()

    def _back_off_if_store_timed_out(self) -> Optional[float]:
        """After a tick: the pause before the next one while the store times out (see
        :mod:`eventprocessor.backoff`), or None for the usual interval."""
        timeouts = sum(self._store.timeouts.values())
        timed_out = timeouts - self._timeouts_seen
        self._timeouts_seen = timeouts
        level = self._backoff.level
        seen = Congestion.of(timed_out=timed_out > 0, listing_seconds=self._listing_seconds,
                             store_timeout=self._timing.store_timeout)
        pause = self._backoff.after_tick(seen)
        self._stats.backoff_level = self._backoff.level
        if pause is None:
            if level:
                logger.warning("processor %s: the checkpoint store answers in time again; balancing every %g s "
                               "again", self._describe, self._timing.interval)
            return None
        self._stats.backed_off_ticks += 1
        self._telemetry.backed_off()
        if self._backoff.level > level:
            logger.warning(
                "processor %s: %d checkpoint-store call(s) timed out since the last tick (its listing: %s; "
                "store_timeout=%g s): the store is saturated or unreachable. Backing off so that it can drain: "
                "the next tick in %.1f s "
                "instead of %g s (level %d of %d), claiming at most %d partitions per tick; renewals keep "
                "their own schedule. If this persists, the store cannot serve this many processors and partitions "
                "at this interval: raise load_balancing_interval (README, \"Timing\").", self._describe, timed_out,
                "no answer" if self._listing_seconds is None else f"answered in {self._listing_seconds:.1f} s",
                self._timing.store_timeout, pause, self._timing.interval, self._backoff.level,
                self._backoff.max_level, BATCH)
        return pause

    async def _keeper_loop(self) -> None:
        """Ends leases on time (wakes at the next deadline or when a pump ends) and
        watches handlers (every quarter of ``handler_timeout``)."""
        watch = self._timing.handler_timeout
        while True:
            self._keeper_wake.clear()
            self._reconcile()
            now = self._clock.monotonic()
            self._watch_handlers(now)
            deadlines = [lease.deadline for lease in self._leases.values() if lease.state is LeaseState.OWNED]
            if watch is not None and self._leases:
                deadlines.append(now + watch / 4)
            pause = min(deadlines, default=now + self._timing.lease_length) - now
            await self._sleep_or_wake(max(pause, 0.001), self._keeper_wake)

    def _watch_handlers(self, now: float) -> None:
        for lease in self._leases.values():
            overdue = lease.pump.overdue(now) if lease.pump is not None else None
            if overdue is not None:
                logger.warning("processor %s: %s", self._describe, overdue)
                lease.pump.report_error(overdue)  # type: ignore[union-attr]

    # ----------------------------------------------------------------- a blocked event loop
    def _leases_hit(self, started: float, ended: float) -> Tuple[List[str], List[str]]:
        """The leases a stall of the event loop from ``started`` to ``ended`` hurt: those
        that ran out meanwhile (self-fenced: their partitions move, their batches are not
        retried), and those whose renewal came due meanwhile and was delayed."""
        live = [lease for lease in self._leases.values() if lease.state in (LeaseState.OWNED, LeaseState.HANDING_OFF)]
        ran_out = _sorted(lease.partition_id for lease in live if started < lease.deadline <= ended)
        delayed = _sorted(lease.partition_id for lease in live if lease.deadline > ended and lease.renew_at < ended)
        return ran_out, delayed

    def _loop_blocked(self, pump: PartitionPump, what: str, started: float, ended: float) -> None:
        """A pump's user code held the event loop (one step without an ``await``)."""
        self._last_stall = (started, ended)
        ctx = pump.context
        self._stall_reported(f"partition {ctx.partition_id}'s handler {what} blocked the event loop for "
                             f"{ended - started:.1f} s without awaiting", started, ended,
                             f"stall:{ctx.partition_id}:{what}")

    def _stall_reported(self, what: str, started: float, ended: float, kind: str) -> None:
        ran_out, delayed = self._leases_hit(started, ended)
        self._telemetry.loop_blocked(ended - started)
        report, suppressed = self._throttle.failed(kind)
        if not report:
            logger.debug("processor %s: %s (again)", self._describe, what)
            return
        harm = []
        if ran_out:
            harm.append(f"the leases of partitions {ran_out} ran out meanwhile (self-fenced: their partitions move "
                        "to other processors and their handlers' checkpoints fail)")
        if delayed:
            harm.append(f"the renewals of partitions {delayed} were delayed (at risk if it happens again)")
        logger.warning(
            "processor %s: %s%s. Meanwhile no lease was renewed, no balancing tick ran and no other partition was "
            "dispatched: %s. Run blocking or CPU-heavy handlers off the event loop with EventProcessor(..., "
            "handler_executor=\"thread\") (README, \"Errors and guarantees\").", self._describe, what,
            f" ({suppressed} more times since the last report)" if suppressed else "",
            "; ".join(harm) if harm else "no lease was at risk yet")

    async def _stall_watch_loop(self) -> None:
        """Measures the event loop's lag once a second: a stall not caused by one of this
        processor's handlers (other code on the loop) is reported the same way."""
        period = STALL_WATCH_PERIOD
        while True:
            before = self._clock.monotonic()
            await self._clock.sleep(period)
            after = self._clock.monotonic()
            lag = after - before - period
            if lag <= BLOCK_THRESHOLD:
                continue
            last = self._last_stall
            if last is not None and last[1] > before:
                continue  # a handler's stall, already reported
            self._stall_reported(f"the event loop was blocked for {lag:.1f} s by code that is not one of its "
                                 "handlers' steps (another task on this loop, or synchronous work elsewhere)",
                                 after - lag, after, "stall:loop")

    def _spawn(self, coro: Awaitable[Any], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._side_tasks.add(task)
        task.add_done_callback(self._side_tasks.discard)

    # ----------------------------------------------------------------- one tick
    async def balance_once(self) -> BalanceReport:
        """Run one load-balancing tick: list, reconcile, decide, claim, fence, start pumps.

        Store and source failures are logged (first at once, then at a bounded rate) and
        reported to ``error_handler``; the processor keeps running, and its leases are
        kept by the renewer or run out on their own if the store stays unreachable.
        """
        stats = self._stats
        stats.ticks += 1
        started = self._clock.monotonic()
        report = await self._tick()
        duration = self._clock.monotonic() - started
        stats.last_tick_duration = duration
        stats.max_tick_duration = max(stats.max_tick_duration, duration)
        stats.claims_won += len(report.claimed)
        stats.claims_lost += len(report.failed_claims)
        stats.steals += len(report.stolen)
        self._telemetry.tick(duration, duration > self._timing.interval)
        self._telemetry.claims_lost_race(len(report.failed_claims))
        if duration > self._timing.interval:
            stats.overruns += 1
            now = self._clock.monotonic()
            stall = self._last_stall
            if stall is not None and stall[1] > started:
                cause = (f"the event loop was blocked for {stall[1] - stall[0]:.1f} s during it by a handler (see the "
                         "warning about it)")
            else:
                cause = ("the store or this machine's CPU cannot keep up with this many partitions and processors "
                         "per process; raise the interval or run fewer processors per process")
            overdue = _sorted(pid for pid, lease in self._leases.items()
                              if lease.state is LeaseState.OWNED and lease.renew_at < now - self._timing.renewal_retry)
            leases = (f"the renewals of partitions {overdue} are overdue" if overdue
                      else "leases are renewed apart from ticks and none is overdue")
            logger.warning(
                "processor %s: a load-balancing tick took %.2f s, longer than load_balancing_interval=%g s "
                "(expiration %g s, %d partitions owned): %s. Balancing is slower than configured: %s.",
                self._describe, duration, self._timing.interval, self._timing.expiration, len(self._leases), leases,
                cause)
        return replace(report, duration=duration)

    async def _tick(self) -> BalanceReport:
        owned_before = self.owned_partitions
        try:
            partition_ids = await self._source.get_partition_ids()
        except Exception as error:
            failure = error if isinstance(error, EventSourceError) else EventSourceError(
                f"reading the partition ids of {self._source.fully_qualified_namespace}/"
                f"{self._source.eventhub_name} failed: {error!r}",
                fully_qualified_namespace=self._source.fully_qualified_namespace,
                eventhub_name=self._source.eventhub_name)
            self._tick_failed("source", failure)
            return self._empty_report(error=failure)
        self._tick_recovered("source")
        listed_at = self._clock.monotonic()
        # A slow listing shows the store as it was when it was sent: compare it with the
        # epochs known then, not with what this processor wrote meanwhile (a handoff).
        seen_before = dict(self._seen_epochs)
        self._listing_seconds = None
        try:
            listing, member_listing = await self._store.list_ownership_and_members(
                self._source.fully_qualified_namespace, self._source.eventhub_name, self._consumer_group)
        except Exception as error:
            self._tick_failed("store", error)
            return self._empty_report(error=error)
        self._listing_seconds = self._clock.monotonic() - listed_at
        self._tick_recovered("store")

        snapshot = Snapshot(records={r.partition_id: r for r in listing.ownerships}, server_time=listing.server_time,
                            sent_at=listed_at, unreadable=frozenset(u.partition_id for u in listing.unreadable))
        self._check_store_history(listing, seen_before)
        reconciliation = self._reconcile(snapshot)
        lost = owned_before - self.owned_partitions

        members = self._live_members(member_listing)
        now = self._clock.monotonic()
        decision = decide(
            listing, partition_ids, self._owner_id,
            fully_qualified_namespace=self._source.fully_qualified_namespace,
            eventhub_name=self._source.eventhub_name, consumer_group=self._consumer_group,
            strategy=self._strategy, expiration_interval=self._timing.expiration, rng=self._rng,
            members=members, balance_factor=self._balance_factor, handoff_timeout=self._handoff_timeout,
            requests_made={pid: now - at for pid, at in self._requests_made.items()},
            replica_count=self._replica_count,
        )
        await self._ask_for_handoffs(decision.handoff_requests, decision.awaiting_handoff)
        held = {pid for pid, lease in self._leases.items() if lease.state is not LeaseState.RELEASED}
        claims = [self._above_seen_epochs(c) for c in decision.claims if c.partition_id not in held]
        if self._backoff.backing_off:
            claims = claims[:BATCH]  # one batch at a time while the store drains
        claims += self._reclaims_after_store_loss(reconciliation, snapshot, held | {c.partition_id for c in claims},
                                                  partition_ids)
        adoptions = [r for r in reconciliation.adopt if r.partition_id not in held]
        won, failed, claim_error = await self._take(claims, adoptions)
        adopted = {r.partition_id for r in adoptions}
        claimed = frozenset(won) - adopted
        self._stats.adopted += len(set(won) & adopted)
        stolen = {pid: owner for pid, owner in decision.stolen_from.items() if pid in claimed}
        expired = set(decision.expired)
        for pid in _sorted(won):
            lease = self._leases.get(pid)
            epoch = lease.epoch if lease is not None else 0
            if pid in adopted:
                self._ownership_changed("adopted", pid, epoch, "the record names this processor (handed over to "
                                        "it, or a claim whose answer was lost)")
            elif pid in stolen:
                self._ownership_changed("stolen", pid, epoch, f"taken from {stolen[pid]} to balance the load")
            elif pid in expired:
                self._ownership_changed("expired", pid, epoch, "its previous owner's record had expired")
            else:
                self._ownership_changed("claimed", pid, epoch, "it had no owner")
        requests = {"list_ownership": 1, "claim_ownership": len(claims) + len(adoptions)}
        return BalanceReport(owned=self.owned_partitions, claimed=claimed, renewed=frozenset(), stolen=stolen,
                             lost=frozenset(lost), failed_claims=frozenset(failed), requests=requests,
                             error=claim_error)

    def _reclaims_after_store_loss(self, reconciliation: Reconciliation, snapshot: Snapshot, taken: Set[str],
                                   partition_ids: Iterable[str]) -> List[Ownership]:
        """With ``refuse_checkpoint_rewind``, a partition whose record vanished from under
        this processor's lease is claimed back by it at once (it notices first, through
        its failing renewal), so that the checkpoint it knew is the one restored; the
        balance is restored later by handoffs."""
        if not self._refuse_rewind:
            return []
        existing = set(partition_ids)
        mine, self._lost_mine = self._lost_mine | set(reconciliation.store_lost), set()
        return [self._above_seen_epochs(Ownership(
                    self._source.fully_qualified_namespace, self._source.eventhub_name, self._consumer_group,
                    pid, self._owner_id, epoch=1))
                for pid in sorted(mine, key=partition_sort_key)
                if pid not in taken and pid in existing and pid not in snapshot.records
                and pid not in snapshot.unreadable and pid in self._known_checkpoints]

    async def _ask_for_handoffs(self, requests: Iterable[Ownership], awaiting: Iterable[str]) -> None:
        """Mark records as requested by this processor (their owners hand them over), and
        remember when, to steal only if an owner does not answer within handoff_timeout."""
        pending = set(awaiting)
        for pid in list(self._requests_made):
            if pid not in pending:
                del self._requests_made[pid]
        asks = list(requests)
        if not asks:
            return
        now = self._clock.monotonic()
        try:
            written = await self._store.claim_ownership(asks)
        except ClaimOwnershipError as error:
            written = list(error.claimed)
        except Exception as error:
            logger.warning("processor %s: asking for partitions %s failed: %r", self._describe,
                           _sorted(r.partition_id for r in asks), error)
            return
        for record in written:
            self._requests_made.setdefault(record.partition_id, now)
            self._stats.handoffs_requested += 1
        if written:
            logger.info("processor %s asked for partitions %s (owners: %s)", self._describe,
                        _sorted(r.partition_id for r in written), sorted({r.owner_id for r in written}))

    def _empty_report(self, *, error: Exception) -> BalanceReport:
        return BalanceReport(self.owned_partitions, frozenset(), frozenset(), {}, frozenset(), frozenset(),
                             requests={}, error=error)

    def _tick_failed(self, kind: str, error: Exception) -> None:
        report, suppressed = self._throttle.failed(kind)
        what = "reading partition ids from the event source" if kind == "source" else "listing ownership"
        if report:
            logger.error("processor %s: %s failed%s: %r", self._describe, what,
                         f" ({suppressed} more times since the last report)" if suppressed else "", error)
            self._report(error, [] if kind == "source" else self._leases_at_risk())
        else:
            logger.debug("processor %s: %s failed again: %r", self._describe, what, error)

    def _tick_recovered(self, kind: str) -> None:
        failures = self._throttle.recovered(kind)
        if failures:
            logger.warning("processor %s: %s works again after %d failed attempts", self._describe,
                           "the event source" if kind == "source" else "the checkpoint store", failures)

    def _leases_at_risk(self) -> List[Lease]:
        return [lease for lease in self._leases.values() if lease.state is LeaseState.OWNED]

    def _above_seen_epochs(self, claim: Ownership) -> Ownership:
        """Epochs only rise: a claim is above every epoch this processor has seen for the
        partition, even if the store forgot it."""
        floor = self._seen_epochs.get(claim.partition_id, 0) + 1
        if claim.epoch >= floor:
            return claim
        return replace(claim, epoch=floor)

    # ----------------------------------------------------------------- store history
    def _check_store_history(self, listing: OwnershipListing, seen_before: Mapping[str, int]) -> None:
        """Records seen before must not vanish, and epochs must not go down: either means
        the store lost data (restored, wiped, an emulator restarted). Each is reported
        once; the epochs this processor has seen never go down, so its next claims of
        those partitions are still above every epoch they had. ``seen_before``: the
        epochs known when the listing was sent (a write of this processor answered since
        may be newer than the listing)."""
        current = {r.partition_id: r.epoch for r in listing.ownerships}
        unreadable = {u.partition_id for u in listing.unreadable}
        vanished = sorted(pid for pid in self._listed if pid not in current and pid not in unreadable)
        backwards = sorted(pid for pid, epoch in current.items() if epoch < seen_before.get(pid, 0)
                           and self._reported_backwards.get(pid) != epoch)
        self._listed = set(current) | unreadable
        for pid in backwards:
            self._reported_backwards[pid] = current[pid]
        if vanished or backwards:
            now = self._clock.monotonic()
            self._lost_mine = {pid for pid in vanished + backwards if pid in self._leases
                               or now - self._ended_at.get(pid, -math.inf) < self._timing.expiration}
            parts = []
            if vanished:
                parts.append(f"the ownership records of partitions {vanished} vanished")
            if backwards:
                parts.append(f"the epochs of partitions {backwards} went backwards")
            self._store_lost(" and ".join(parts), vanished + backwards)
        for pid, epoch in current.items():
            self._seen_epochs[pid] = max(epoch, self._seen_epochs.get(pid, 0))

    def _store_lost(self, what: str, partition_ids: List[str]) -> None:
        error = StoreDataLostError(
            f"checkpoint store data loss on {self._source.eventhub_name}/{self._consumer_group}: {what}. The store "
            "was restored, wiped or restarted empty; partitions whose checkpoints are gone restart from "
            + ("the last checkpoint this processor knew (refuse_checkpoint_rewind=True)" if self._refuse_rewind
               else "initial_event_position, so their events are processed again"),
            partition_ids=tuple(partition_ids))
        logger.error("processor %s: %s", self._describe, error)
        self._stats.store_data_lost += 1
        affected = [self._leases[pid] for pid in partition_ids if pid in self._leases]
        self._report(error, affected, to_every_handler=not affected)

    # ----------------------------------------------------------------- reconciling
    def _reconcile(self, snapshot: Optional[Snapshot] = None) -> Reconciliation:
        """Run the pure :func:`reconcile` over the lease table and carry out what it says."""
        result = Reconciliation()
        for _round in range(3):  # a pump found gone can end its lease in the same call
            now = self._clock.monotonic()
            result = reconcile([lease.view() for lease in self._leases.values()], now=now, owner_id=self._owner_id,
                               snapshot=snapshot, expiration=self._timing.expiration)
            for record in result.refresh:
                stale = self._leases.get(record.partition_id)
                if stale is not None:
                    stale.record = replace(stale.record, etag=record.etag, requested_by=record.requested_by)
                    if stale.state is LeaseState.HANDING_OFF and stale.release_to \
                            and record.requested_by != stale.release_to:
                        logger.info("processor %s: %s withdrew its request for partition %s (it stopped); "
                                    "releasing it instead", self._describe, stale.release_to, stale.partition_id)
                        stale.release_to = ""
                    self._renewer.wake()
            released = []
            for transition in result.transitions:
                found = self._leases.get(transition.partition_id)
                if found is None:
                    continue
                lease = found
                if transition.to is LeaseState.RELEASED:
                    lease.move(LeaseState.RELEASED)
                    released.append(lease)
                elif transition.to is LeaseState.HANDING_OFF:
                    assert transition.end is not None
                    lease.move(LeaseState.HANDING_OFF)
                    lease.end, lease.end_detail, lease.release_to = transition.end, transition.detail, \
                        transition.release_to
                    if lease.pump is not None:
                        lease.pump.stop(CloseReason.HANDOFF)
                else:
                    assert transition.end is not None
                    self._end(lease, transition.end, transition.detail, release_to=transition.release_to)
            if released:
                for lease in released:
                    self._leases.pop(lease.partition_id, None)
                to_write = [lease for lease in released if lease.release_to is not None]
                if to_write:
                    self._spawn(self._write_releases(to_write), f"release-{self._owner_id}")
            if not result.transitions:
                break
            snapshot = None  # the snapshot has been applied; later rounds only follow pumps
        return result

    def _end(self, lease: Lease, end: LeaseEnd, detail: str, *, release_to: Optional[str]) -> None:
        """Move ``lease`` to RELEASING and stop its pump."""
        if lease.state is LeaseState.CLAIMING:
            lease.move(LeaseState.RELEASED)
            lease.end, lease.end_detail, lease.release_to = end, detail, None
            return
        if lease.state is LeaseState.RELEASING or lease.state is LeaseState.RELEASED:
            return
        lease.move(LeaseState.RELEASING)
        self._ended_at[lease.partition_id] = self._clock.monotonic()
        if end is LeaseEnd.EXPIRED:
            self._stats.self_fenced += 1
        elif end is LeaseEnd.LOST:
            self._stats.lost += 1
        if lease.end is not LeaseEnd.HANDOFF or end is not LeaseEnd.HANDOFF:
            lease.end, lease.end_detail = end, detail
            lease.release_to = release_to
        withdrawn = lease.end is LeaseEnd.HANDOFF and lease.release_to == ""  # its requester stopped
        self._ownership_changed("released" if withdrawn else _END_REASONS[lease.end or end], lease.partition_id,
                                lease.epoch, detail,
                                level=logging.INFO if end in (LeaseEnd.SHUTDOWN, LeaseEnd.HANDOFF) else logging.WARNING)
        if lease.pump is not None:
            lease.pump.stop(end.close_reason)

    def _ownership_changed(self, reason: str, partition_id: str, epoch: int, detail: str,
                           level: int = logging.INFO) -> None:
        """One log line and one metric per ownership change, saying why. The structured
        fields (:data:`OWNERSHIP_LOG_FIELDS`: ``eventprocessor.owner_id``, ``.partition_id``,
        ``.epoch``, ``.reason``, ``.eventhub_name``, ``.consumer_group``) are attributes of
        the log record, for JSON formatters and OpenTelemetry's logging handler."""
        logger.log(level, "processor %s: partition %s %s (epoch %d): %s", self._describe, partition_id,
                   _REASON_WORDS.get(reason, reason), epoch, detail,
                   extra={"eventprocessor.owner_id": self._owner_id, "eventprocessor.partition_id": partition_id,
                          "eventprocessor.epoch": epoch, "eventprocessor.reason": reason,
                          "eventprocessor.eventhub_name": self._source.eventhub_name,
                          "eventprocessor.consumer_group": self._consumer_group})
        self._telemetry.ownership_changed(reason, partition_id)

    async def _write_releases(self, leases: List[Lease]) -> None:
        """Write the records of ended claims over: to nobody, or to a handoff's claimer.
        Each write is conditional on the last etag this processor wrote, so it cannot undo
        another processor's claim."""
        records = []
        for lease in leases:
            if lease.release_to is None:
                continue
            handing_over = bool(lease.release_to)
            records.append(replace(lease.record, owner_id=lease.release_to, requested_by="",
                                   epoch=lease.record.epoch + (1 if handing_over else 0)))
            lease.release_to = None
        if not records:
            return
        failed: Set[str] = set()
        try:
            written = await self._store.claim_ownership(records)
        except ClaimOwnershipError as error:
            written, failed = list(error.claimed), set(error.failures)
            logger.warning("processor %s: releasing partitions %s failed: %s; they will expire instead",
                           self._describe, _sorted(error.failures), error)
        except Exception as error:
            written, failed = [], {r.partition_id for r in records}
            logger.warning("processor %s: releasing partitions %s failed: %r; they will expire instead",
                           self._describe, _sorted(r.partition_id for r in records), error)
        done = {r.partition_id for r in written}
        lost = [r for r in records if r.partition_id not in done and r.partition_id not in failed]
        if lost:
            written += await self._write_releases_again(lost)
        for record in written:
            if record.owner_id:
                self._stats.handed_off += 1
            else:
                self._stats.released += 1
            self._seen_epochs[record.partition_id] = max(record.epoch, self._seen_epochs.get(record.partition_id, 0))
            logger.debug("processor %s released partition %s to %s", self._describe, record.partition_id,
                         record.owner_id or "nobody")

    async def _write_releases_again(self, lost: List[Ownership]) -> List[Ownership]:
        """Release writes that lost their condition. When the stored record still names
        this processor with the claim's epoch, the write that beat them kept this claim:
        this processor's own renewal in flight (it changes the etag), or a handoff request
        mark. Write them once more on the current etag, unless this processor holds the
        partition again. Otherwise another processor owns the partition now."""
        try:
            listing = await self._store.list_ownership(self._source.fully_qualified_namespace,
                                                       self._source.eventhub_name, self._consumer_group)
        except Exception as error:
            logger.warning("processor %s: releasing partitions %s lost to another write and listing them failed: "
                           "%r; they will expire instead", self._describe, _sorted(r.partition_id for r in lost), error)
            return []
        stored = {r.partition_id: r for r in listing.ownerships}
        again = []
        for record in lost:
            current = stored.get(record.partition_id)
            claim_epoch = record.epoch - (1 if record.owner_id else 0)
            held = self._leases.get(record.partition_id)
            if current is None or current.owner_id != self._owner_id or current.epoch != claim_epoch \
                    or (held is not None and held.state is not LeaseState.RELEASED):
                logger.debug("processor %s: partition %s changed hands before its release was written",
                             self._describe, record.partition_id)
                continue
            if record.owner_id and current.requested_by != record.owner_id:
                # The requester withdrew (it stopped): release to nobody instead.
                logger.info("processor %s: %s withdrew its request for partition %s; releasing it instead",
                            self._describe, record.owner_id, record.partition_id)
                record = replace(record, owner_id="", epoch=claim_epoch)
            again.append(replace(record, etag=current.etag, last_modified_time=current.last_modified_time))
        if not again:
            return []
        try:
            return await self._store.claim_ownership(again)
        except ClaimOwnershipError as error:
            return list(error.claimed)
        except Exception as error:
            logger.warning("processor %s: releasing partitions %s failed: %r; they will expire instead",
                           self._describe, _sorted(r.partition_id for r in again), error)
            return []

    # ----------------------------------------------------------------- claiming
    async def _take(self, claims: List[Ownership], adoptions: List[Ownership]
                    ) -> Tuple[List[str], List[str], Optional[Exception]]:
        """Write ``claims`` (new owners) and ``adoptions`` (records naming us, rewritten as
        they are), fence each won partition's checkpoint and start its pump. Returns the
        partitions now dispatched, those whose claim was not won, and a store error."""
        records = claims + adoptions
        error: Optional[Exception] = None
        not_written: Set[str] = set()
        failed: List[str] = []
        started: List[Optional[str]] = []
        # BATCH at a time (see bounded_store.BATCH): claimed in one call, then fenced
        # together, before the next batch is claimed. A lease runs from its claim, so a
        # claim never waits long for its fence, and each call's deadline covers its own
        # requests only.
        for first in range(0, len(records), BATCH):
            batch = records[first:first + BATCH]
            now = self._clock.monotonic()
            leases = {r.partition_id: Lease(r, now=now) for r in batch}
            for lease in leases.values():
                self._leases[lease.partition_id] = lease
            unanswered = False
            try:
                won = await self._store.claim_ownership(batch)
            except ClaimOwnershipError as exc:
                won, error = list(exc.claimed), exc
                not_written |= set(exc.failures)
            except Exception as exc:
                won, error, unanswered = [], exc, True
                not_written |= {r.partition_id for r in records[first:]}
            answered_at = self._clock.monotonic()
            won_by_pid = {r.partition_id: r for r in won}
            fences = []
            for pid, lease in leases.items():
                record = won_by_pid.get(pid)
                if record is None or lease.state is not LeaseState.CLAIMING:
                    failed.append(pid)
                    self._drop(lease)
                    continue
                self._seen_epochs[pid] = max(record.epoch, self._seen_epochs.get(pid, 0))
                lease.confirm(record, sent_at=now, answered_at=answered_at, lease_length=self._timing.lease_length,
                              renewal_age=self._timing.renewal_age)
                fences.append(self._fence_and_start(lease))
            started += await asyncio.gather(*fences)
            if unanswered:  # the store did not answer: the rest waits for the next tick
                failed += [r.partition_id for r in records[first + BATCH:]]
                break
        if error is not None:
            logger.warning("processor %s: claiming partitions %s failed: %r", self._describe,
                           _sorted(not_written or (r.partition_id for r in records)), error)
            self._report(error, [])
        return [pid for pid in started if pid is not None], failed, error

    def _drop(self, lease: Lease) -> None:
        if self._leases.get(lease.partition_id) is lease:
            del self._leases[lease.partition_id]
        if lease.state is LeaseState.CLAIMING:
            lease.move(LeaseState.RELEASED)

    async def _fence_and_start(self, lease: Lease) -> Optional[str]:
        """Fence the checkpoint of a won claim and start its pump. On a stale epoch (the
        record had lost its epoch), claim once more above the stored one."""
        pid = lease.partition_id
        for attempt in (1, 2):
            try:
                checkpoint = await self._store.fence_checkpoint(lease.record)
                break
            except StaleEpochError as stale:
                if attempt == 2 or stale.stored_epoch >= MAX_EPOCH:
                    logger.error("processor %s: partition %s: %s", self._describe, pid, stale)
                    self._report(stale, [])
                    self._drop(lease)
                    return None
                logger.warning("processor %s: partition %s: the checkpoint carries epoch %d, not below the claim's "
                               "%d (the ownership record lost its epoch); claiming again above it", self._describe,
                               pid, stale.stored_epoch, lease.epoch)
                sent_at = self._clock.monotonic()
                try:
                    won = await self._store.claim_ownership([replace(lease.record, epoch=stale.stored_epoch + 1)])
                except Exception as claim_error:
                    self._report(claim_error, [])
                    won = []
                if not won or lease.state is not LeaseState.CLAIMING:
                    self._drop(lease)
                    return None
                lease.confirm(won[0], sent_at=sent_at, answered_at=self._clock.monotonic(),
                              lease_length=self._timing.lease_length, renewal_age=self._timing.renewal_age)
                self._seen_epochs[pid] = max(won[0].epoch, self._seen_epochs.get(pid, 0))
            except OwnershipLostError as error:
                logger.info("processor %s: partition %s was taken before its checkpoint was fenced: %s",
                            self._describe, pid, error)
                self._drop(lease)
                return None
            except Exception as error:
                # The claim is won but the checkpoint could not be fenced: do not dispatch.
                # The record names us, so the next tick adopts it and tries again.
                logger.warning("processor %s: fencing the checkpoint of partition %s failed: %r", self._describe,
                               pid, error)
                self._report(error, [])
                self._drop(lease)
                return None
        if lease.state is not LeaseState.CLAIMING:
            return None
        known = self._known_checkpoints.get(pid)
        if known is not None and _went_back(known, checkpoint):
            found = "none" if checkpoint is None else \
                f"sequence number {checkpoint.sequence_number} (epoch {checkpoint.epoch})"
            if self._refuse_rewind:
                checkpoint = await self._restore_checkpoint(lease, known)
            self._start_pump(lease, checkpoint)
            self._store_lost(f"the checkpoint of partition {pid} was at sequence number {known.sequence_number} "
                             f"(epoch {known.epoch}) and is now {found}", [pid])
            return pid
        self._start_pump(lease, checkpoint)
        return pid

    async def _restore_checkpoint(self, lease: Lease, known: Checkpoint) -> Checkpoint:
        """refuse_checkpoint_rewind: resume from the checkpoint this processor knew and
        write it back, so that later owners do not rewind either."""
        restored = replace(known, owner_id=self._owner_id, epoch=lease.epoch)
        try:
            await self._store.update_checkpoint(restored, owner_id=self._owner_id, epoch=lease.epoch)
            logger.warning("processor %s: restored the checkpoint of partition %s at sequence number %d",
                           self._describe, lease.partition_id, known.sequence_number)
        except Exception as error:
            logger.error("processor %s: could not write back the checkpoint of partition %s (%r); resuming from "
                         "it all the same", self._describe, lease.partition_id, error)
        return restored

    def _starting_position(self, pid: str, checkpoint: Optional[Checkpoint]) -> EventPosition:
        """The checkpoint, unless there is none or this processor was told to override
        it (once per partition in its life); then the initial position."""
        initial = self._initial_position if isinstance(self._initial_position, EventPosition) else \
            self._initial_position.get(pid, self._default_position)
        overriding = self._override is True or (isinstance(self._override, frozenset) and pid in self._override)
        if overriding and pid not in self._overridden:
            self._overridden.add(pid)
            if checkpoint is not None:
                logger.warning("processor %s: partition %s starts at %s, not at its checkpoint (sequence number %d), "
                               "as override_checkpoints asks", self._describe, pid, initial,
                               checkpoint.sequence_number)
            return initial
        if checkpoint is not None:
            return EventPosition.from_sequence_number(checkpoint.sequence_number)
        return initial

    def lag(self) -> Dict[str, Optional[int]]:
        """Events behind per owned partition: the newest enqueued sequence number minus
        the last delivered one (None until known; needs
        ``track_last_enqueued_event_properties=True``)."""
        return {pid: (lease.pump.context.lag if lease.pump is not None else None)
                for pid, lease in self._leases.items() if lease.state is LeaseState.OWNED}

    def _start_pump(self, lease: Lease, checkpoint: Optional[Checkpoint]) -> None:
        pid = lease.partition_id
        if checkpoint is not None:
            self._known_checkpoints[pid] = checkpoint
        position = self._starting_position(pid, checkpoint)
        clock = self._clock

        def lost() -> None:
            lease.lost = True
            self._keeper_wake.set()

        def remember(written: Checkpoint) -> None:
            self._known_checkpoints[pid] = written

        context = PartitionContext(
            fully_qualified_namespace=self._source.fully_qualified_namespace,
            eventhub_name=self._source.eventhub_name, consumer_group=self._consumer_group,
            partition_id=pid, owner_id=self._owner_id, epoch=lease.epoch,
            checkpoint_store=self._store, is_owned=lambda: lease.dispatchable(clock.monotonic()),
            may_checkpoint=lambda: lease.may_checkpoint(clock.monotonic()), on_ownership_lost=lost,
            on_checkpoint=remember,
        )
        context.last_checkpoint = checkpoint
        pump = PartitionPump(
            context=context, factory=self._factory, source=self._source, starting_position=position,
            max_batch_size=self._max_batch_size, max_wait_time=self._max_wait_time, prefetch=self._prefetch,
            clock=self._clock, handler_timeout=self._timing.handler_timeout, retry_policy=self._retry_policy,
            on_poison=self._on_poison, dead_letter=self._dead_letter, on_user_code_error=self._user_code_failed,
            track_last_enqueued_event_properties=self._track_last_enqueued, telemetry=self._telemetry,
            handler_executor=self._handler_executor, on_loop_blocked=self._loop_blocked,
        )
        lease.pump = pump
        lease.move(LeaseState.OWNED)
        task = pump.start()
        task.add_done_callback(lambda _task: self._pump_ended(lease))
        self._renewer.wake()
        self._keeper_wake.set()
        logger.debug("processor %s starts partition %s (epoch %d) from %s", self._describe, pid, lease.epoch,
                     position)

    def _pump_ended(self, lease: Lease) -> None:
        pump = lease.pump
        failure = pump.failure if pump is not None else None
        if isinstance(failure, Exception) and not isinstance(failure, OwnershipLostError):
            if isinstance(failure, ConfigurationError) and self._fatal is None:
                # The factory returned something that is not a PartitionProcessor: no claim
                # can ever work. Say so once and stop, rather than fail on every claim.
                self._fatal = failure
                logger.error("processor %s: %s; stopping", self._describe, failure)
                self._report(failure, [])
                self._spawn(self.stop(), f"fatal-stop-{self._owner_id}")
            elif not isinstance(failure, ConfigurationError):
                self._user_code_failed("the partition processor factory", failure)
        self._keeper_wake.set()

    def _user_code_failed(self, where: str, failure: Exception) -> None:
        """User code outside ``process_events`` raised: report it to ``error_handler``
        once per kind (then at a bounded rate), never as a traceback per call."""
        report, suppressed = self._throttle.failed(f"user:{where}:{type(failure).__name__}")
        if report:
            logger.warning("processor %s: %s raised %r%s", self._describe, where, failure,
                           f" ({suppressed} more times since the last report)" if suppressed else "")
            self._report(failure, [])
        else:
            logger.debug("processor %s: %s raised again: %r", self._describe, where, failure)

    # ----------------------------------------------------------------- errors
    def _report(self, error: Exception, leases: Iterable[Lease], *, to_every_handler: bool = False) -> None:
        """Tell the handlers of ``leases`` (``process_error``) and ``error_handler``,
        each on a task of its own: the caller never waits for user code."""
        targets = list(leases)
        if to_every_handler:
            targets = list(self._leases.values())
        context: Optional[PartitionContext] = None
        for lease in targets:
            if lease.pump is not None:
                lease.pump.report_error(error)
                context = lease.pump.context if len(targets) == 1 else None
        if self._error_handler is not None:
            self._spawn(self._call_error_handler(error, context), f"error-handler-{self._owner_id}")

    async def _call_error_handler(self, error: Exception, context: Optional[PartitionContext]) -> None:
        assert self._error_handler is not None
        try:
            result = self._error_handler(error, context)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("processor %s: error_handler raised", self._describe)


_END_REASONS = {
    LeaseEnd.SHUTDOWN: "released",
    LeaseEnd.HANDOFF: "handed_off",
    LeaseEnd.LOST: "lost",
    LeaseEnd.EXPIRED: "self_fenced",
    LeaseEnd.PUMP_ENDED: "released",
    LeaseEnd.STORE_LOST: "store_lost",
}
OWNERSHIP_LOG_FIELDS = ("eventprocessor.reason", "eventprocessor.owner_id", "eventprocessor.partition_id",
                        "eventprocessor.epoch", "eventprocessor.eventhub_name", "eventprocessor.consumer_group")
"""The attributes every ownership-change log record carries (read them with ``getattr``).
``eventprocessor.reason`` is one of :data:`OWNERSHIP_REASONS`."""
OWNERSHIP_REASONS = ("claimed", "expired", "stolen", "adopted", "released", "handed_off", "lost", "self_fenced",
                     "store_lost")
_REASON_WORDS = {
    "claimed": "claimed", "expired": "claimed after expiry", "stolen": "stolen", "adopted": "taken over",
    "released": "released", "handed_off": "handed over", "lost": "lost", "self_fenced": "self-fenced",
    "store_lost": "dropped",
}


def _went_back(known: Checkpoint, found: Optional[Checkpoint]) -> bool:
    """Did a checkpoint this processor knew vanish, or get replaced by one of an earlier
    epoch? (A later owner may rewind on purpose; an earlier epoch cannot come back.)"""
    if found is None:
        return True
    return found.epoch is not None and known.epoch is not None and found.epoch < known.epoch


def _sorted(pids: Iterable[str]) -> List[str]:
    return sorted(pids, key=partition_sort_key)
