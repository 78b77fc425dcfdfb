"""The processor's options, validated once.

:class:`ProcessorOptions` is every argument of :class:`~eventprocessor.EventProcessor`,
checked and normalised, so that the parts of the processor read plain values and never
validate. The arguments are checked group by group, each in one place: the timing model
(:func:`~eventprocessor._runtime.timing.timing_from_arguments`), what is processed, where
it starts, how it is delivered, how partitions are balanced, and the hooks and injected
clock and randomness; the policy objects check themselves when they are made
(:mod:`eventprocessor.policies`) and are only checked for their type here.
"""
from __future__ import annotations

import concurrent.futures
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..events import EventPosition
from ..partition import PartitionContext, PartitionProcessor
from ..policies import (
    ConcurrencyPolicy,
    FailurePolicy,
    LoadBalancingStrategy,
    LoadPolicy,
    Ordering,
    StatePolicy,
    int_at_least,
    positive_seconds,
)
from ..sources.base import EventSource
from ..stores.contract import CheckpointStore
from .clock import Clock, SystemClock
from .timing import Timing, timing_from_arguments

if TYPE_CHECKING:  # in annotations only
    from ..policies import HandlerExecutor

RENEWAL_MODES = ("auto", "member", "partition")
"""``ownership_renewal``: ``member`` (one heartbeat per processor keeps its partitions;
ticks read ownership records only on change), ``partition`` (every record is rewritten
every renewal age and listed every tick, as azure-eventhub's processor does), ``auto``
(``member`` until a foreign owner is seen). See :mod:`eventprocessor._ownership.liveness`."""

__all__ = ["ProcessorOptions", "ErrorHandler", "PartitionProcessorFactory"]

PartitionProcessorFactory = type | Callable[[], PartitionProcessor]
ErrorHandler = Callable[[Exception, PartitionContext | None], Awaitable[None] | None]


def _positions(value: Any) -> EventPosition | Mapping[str, EventPosition]:
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


def _what_and_where(source: Any, checkpoint_store: Any, partition_processor: Any, consumer_group: Any,
                    owner_id: Any) -> str:
    """Check what is processed, from where, into which store, as whom; return the owner id."""
    if not isinstance(consumer_group, str) or not consumer_group:
        raise ConfigurationError(f"consumer_group must be a non-empty string, got {consumer_group!r}")
    if owner_id is not None and (not isinstance(owner_id, str) or not owner_id.strip()):
        raise ConfigurationError(f"owner_id must be a non-empty string (or None for a random one), "
                                 f"got {owner_id!r}")
    if isinstance(partition_processor, type):
        if not issubclass(partition_processor, PartitionProcessor):
            raise ConfigurationError("partition_processor must be a PartitionProcessor subclass or a factory "
                                     f"returning one, got the class {partition_processor.__name__}")
    elif not callable(partition_processor):
        raise ConfigurationError("partition_processor must be a PartitionProcessor subclass or a factory "
                                 f"returning one, got {type(partition_processor).__name__}")
    if not isinstance(source, EventSource):
        raise ConfigurationError(f"source must be an EventSource (for example InMemoryEventSource or "
                                 f"EventHubSource), got {type(source).__name__}")
    if not isinstance(checkpoint_store, CheckpointStore):
        raise ConfigurationError(f"checkpoint_store must be a CheckpointStore (for example "
                                 f"InMemoryCheckpointStore or BlobCheckpointStore), got "
                                 f"{type(checkpoint_store).__name__}")
    return owner_id or str(uuid.uuid4())


def _starting_points(initial_event_position: Any, default_event_position: Any, override_checkpoints: Any
                     ) -> tuple[EventPosition | Mapping[str, EventPosition], bool | frozenset[str]]:
    """Check where partitions start: (initial positions, the checkpoints to override)."""
    initial = _positions(initial_event_position)
    if not isinstance(default_event_position, EventPosition):
        raise ConfigurationError(f"default_event_position must be an EventPosition, got "
                                 f"{type(default_event_position).__name__} {default_event_position!r}")
    if isinstance(override_checkpoints, bool):
        return initial, override_checkpoints
    if isinstance(override_checkpoints, str) or not isinstance(override_checkpoints, Iterable) \
            or not all(isinstance(p, str) for p in override_checkpoints):
        raise ConfigurationError(f"override_checkpoints must be True/False or a collection of partition id "
                                 f"strings, got {override_checkpoints!r}")
    return initial, frozenset(override_checkpoints)


def _delivery(max_batch_size: Any, max_wait_time: Any, prefetch: Any, handler_executor: Any,
              failure_policy: Any) -> float | None:
    """Check how events are delivered; return ``max_wait_time`` in seconds (or None)."""
    int_at_least("max_batch_size", max_batch_size, 1)
    max_wait = positive_seconds("max_wait_time", max_wait_time, allow_none=True)
    int_at_least("prefetch", prefetch, 0)
    if handler_executor is not None and handler_executor != "thread" and not (
            isinstance(handler_executor, concurrent.futures.Executor)
            and not isinstance(handler_executor, concurrent.futures.ProcessPoolExecutor)):
        raise ConfigurationError(
            f"handler_executor must be None (handlers run on the event loop), \"thread\" (a worker thread per "
            f"owned partition) or a thread-based concurrent.futures.Executor, got {handler_executor!r}")
    _policy("failure_policy", failure_policy, FailurePolicy)
    return max_wait


def _balancing(load_balancing_strategy: Any, balance_factor: Any, handoff_timeout: Any, ordinal: Any,
               replica_count: Any, load_policy: Any) -> tuple[LoadBalancingStrategy, float | None]:
    """Check how partitions are balanced; return the strategy and the handoff timeout."""
    try:
        strategy = LoadBalancingStrategy(load_balancing_strategy)
    except ValueError:
        raise ConfigurationError(
            f"unknown load_balancing_strategy {load_balancing_strategy!r}; use 'balanced' or 'greedy'") from None
    int_at_least("balance_factor", balance_factor, 1)
    handoff = positive_seconds("handoff_timeout", handoff_timeout, allow_none=True)
    if strategy is LoadBalancingStrategy.STATIC:
        int_at_least("replica_count", replica_count, 1, what=" (the static strategy needs it)")
        if isinstance(ordinal, bool) or not isinstance(ordinal, int) or not 0 <= ordinal < replica_count:
            raise ConfigurationError(f"the static strategy needs ordinal, an int from 0 to replica_count - 1 = "
                                     f"{replica_count - 1}, got {ordinal!r}")
    elif ordinal is not None or replica_count is not None:
        raise ConfigurationError(f"ordinal and replica_count are only used by load_balancing_strategy='static', "
                                 f"not {strategy.value!r}")
    if load_policy is not None:
        _policy("load_policy", load_policy, LoadPolicy)
    return strategy, handoff


def _hooks(error_handler: Any, clock: Any, rng: Any) -> None:
    """Check the error handler and what is injected (the clock, the randomness)."""
    if error_handler is not None and not callable(error_handler):
        raise ConfigurationError(f"error_handler must be callable, got {type(error_handler).__name__}")
    if clock is not None and not (callable(getattr(clock, "monotonic", None))
                                  and callable(getattr(clock, "sleep", None))):
        raise ConfigurationError(f"clock must have monotonic() and async sleep(seconds) (see "
                                 f"eventprocessor.Clock), got {type(clock).__name__}")
    if rng is not None and not isinstance(rng, random.Random):
        raise ConfigurationError(f"rng must be a random.Random, got {type(rng).__name__}")


def _state(stateful: Any) -> StatePolicy | None:
    """``stateful``: False (None), True (the default :class:`StatePolicy`) or a StatePolicy."""
    if isinstance(stateful, StatePolicy):
        return stateful
    if not isinstance(stateful, bool):
        raise ConfigurationError(f"stateful must be True, False or an eventprocessor.StatePolicy, got {stateful!r}")
    return StatePolicy() if stateful else None


def _concurrency(concurrency: Any, max_concurrency: Any, ordering: Any, stateful: Any) -> ConcurrencyPolicy:
    """``concurrency`` (a :class:`ConcurrencyPolicy`) or its two common fields given flat."""
    if concurrency is None:
        concurrency = ConcurrencyPolicy(max_concurrency=max_concurrency if max_concurrency is not None else 1,
                                        ordering=ordering if ordering is not None else Ordering.PARTITION)
    else:
        _policy("concurrency", concurrency, ConcurrencyPolicy)
        if max_concurrency is not None or ordering is not None:
            raise ConfigurationError("give max_concurrency and ordering either flat or in concurrency="
                                     "ConcurrencyPolicy(...), not both")
    if concurrency.concurrent and stateful is not False:
        raise ConfigurationError(
            f"stateful partitions commit one state with the partition's position, and roll a call's changes back "
            f"when it fails; with ordering={concurrency.ordering.value!r} calls of different keys run at once, so "
            "one call's rollback would undo another's changes. Use max_concurrency=1 with ordering='partition' for "
            "stateful=True, or keep per-key state in your own store, keyed by partition key")
    return concurrency


def _policy(name: str, value: Any, kind: type) -> None:
    if not isinstance(value, kind):
        raise ConfigurationError(f"{name} must be an eventprocessor.{kind.__name__}, got {type(value).__name__}")


@dataclass(frozen=True)
class ProcessorOptions:
    """Every argument of :class:`~eventprocessor.EventProcessor`, validated (see
    :meth:`validate`). The parts of the processor read these and never validate."""

    source: EventSource
    checkpoint_store: CheckpointStore
    factory: Callable[[], PartitionProcessor]
    consumer_group: str
    owner_id: str
    strategy: LoadBalancingStrategy
    timing: Timing
    handler_executor: HandlerExecutor
    initial_position: EventPosition | Mapping[str, EventPosition]
    default_position: EventPosition
    override_checkpoints: bool | frozenset[str]
    max_batch_size: int
    max_wait_time: float | None
    prefetch: int
    track_last_enqueued: bool
    failure_policy: FailurePolicy
    refuse_rewind: bool
    handoff_timeout: float | None
    balance_factor: int
    ordinal: int | None
    replica_count: int
    clock: Clock
    rng: random.Random
    error_handler: ErrorHandler | None
    state_policy: StatePolicy | None = None
    load_policy: LoadPolicy | None = None
    concurrency: ConcurrencyPolicy = ConcurrencyPolicy()
    source_startup_timeout: float | None = 5.0
    ownership_renewal: str = "auto"
    group_join_delay: float | None = None

    @property
    def scope(self) -> tuple[str, str, str]:
        """(namespace, event hub, consumer group): the arguments of every store listing."""
        return (self.source.fully_qualified_namespace, self.source.eventhub_name, self.consumer_group)

    @property
    def stateful(self) -> bool:
        return self.state_policy is not None

    @property
    def balance_by_load(self) -> bool:
        return self.load_policy is not None

    @property
    def plans_by_counts(self) -> bool:
        """Whether this processor's plan deals partitions by counts alone (not by load,
        warm standbys or ordinals): only such a processor settles and nudges (see
        :mod:`eventprocessor._ownership.liveness`)."""
        return not (self.balance_by_load or self.stateful or self.strategy is LoadBalancingStrategy.STATIC)

    def initial_position_of(self, partition_id: str) -> EventPosition:
        if isinstance(self.initial_position, EventPosition):
            return self.initial_position
        return self.initial_position.get(partition_id, self.default_position)

    def overrides(self, partition_id: str) -> bool:
        """Does ``override_checkpoints`` name this partition?"""
        override = self.override_checkpoints
        return override is True or (isinstance(override, frozenset) and partition_id in override)

    @staticmethod
    def validate(source: Any, checkpoint_store: Any, partition_processor: Any, *, consumer_group: Any,
                 owner_id: Any, load_balancing_strategy: Any, load_balancing_interval: Any,
                 partition_ownership_expiration_interval: Any, ownership_renewal_age: Any, store_timeout: Any,
                 shutdown_timeout: Any, handler_timeout: Any, handler_executor: Any, initial_event_position: Any,
                 default_event_position: Any, override_checkpoints: Any, max_batch_size: Any, max_wait_time: Any,
                 prefetch: Any, track_last_enqueued_event_properties: Any, failure_policy: Any,
                 refuse_checkpoint_rewind: Any, handoff_timeout: Any, balance_factor: Any, ordinal: Any,
                 replica_count: Any, load_policy: Any, stateful: Any, error_handler: Any, clock: Any,
                 rng: Any, max_concurrency: Any = None, ordering: Any = None,
                 concurrency: Any = None, source_startup_timeout: Any = 5.0,
                 ownership_renewal: Any = "auto", group_join_delay: Any = None) -> ProcessorOptions:
        """Check every argument, group by group; raise a ConfigurationError naming the
        first bad one, the value and what would be valid."""
        timing = timing_from_arguments(load_balancing_interval, partition_ownership_expiration_interval,
                                       ownership_renewal_age, store_timeout, shutdown_timeout, handler_timeout)
        max_wait = _delivery(max_batch_size, max_wait_time, prefetch, handler_executor, failure_policy)
        owner = _what_and_where(source, checkpoint_store, partition_processor, consumer_group, owner_id)
        initial, override = _starting_points(initial_event_position, default_event_position, override_checkpoints)
        strategy, handoff = _balancing(load_balancing_strategy, balance_factor, handoff_timeout, ordinal,
                                       replica_count, load_policy)
        _hooks(error_handler, clock, rng)
        concurrent = _concurrency(concurrency, max_concurrency, ordering, stateful)
        if ownership_renewal not in RENEWAL_MODES:
            raise ConfigurationError(
                f"ownership_renewal must be one of {', '.join(map(repr, RENEWAL_MODES))} (how a processor keeps its "
                f"partitions: docs/concepts/leases.md), got {ownership_renewal!r}")
        return ProcessorOptions(
            source=source, checkpoint_store=checkpoint_store, factory=partition_processor,
            consumer_group=consumer_group, owner_id=owner, strategy=strategy, timing=timing,
            handler_executor=handler_executor, initial_position=initial, default_position=default_event_position,
            override_checkpoints=override, max_batch_size=max_batch_size, max_wait_time=max_wait, prefetch=prefetch,
            track_last_enqueued=bool(track_last_enqueued_event_properties) or load_policy is not None,
            failure_policy=failure_policy, refuse_rewind=bool(refuse_checkpoint_rewind), handoff_timeout=handoff,
            balance_factor=balance_factor, ordinal=ordinal, replica_count=replica_count or 0,
            clock=clock or SystemClock(), rng=rng or random.Random(), error_handler=error_handler,
            state_policy=_state(stateful), load_policy=load_policy, concurrency=concurrent,
            source_startup_timeout=positive_seconds("source_startup_timeout", source_startup_timeout, allow_none=True),
            ownership_renewal=ownership_renewal,
            group_join_delay=positive_seconds("group_join_delay", group_join_delay, allow_none=True))
