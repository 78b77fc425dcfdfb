"""The processor's options, validated once: the timing model and everything else.

:class:`Timing` is the whole timing model as one frozen value, derived from the
arguments with actionable errors. :class:`ProcessorOptions` is every other argument of
:class:`~eventprocessor.EventProcessor`, checked and normalised, so that the parts of
the processor read plain values and never validate.
"""
from __future__ import annotations

import concurrent.futures
import math
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .._ownership.load_plan import BALANCE_BY
from ..errors import ConfigurationError
from ..events import EventPosition
from ..partition import PartitionContext, PartitionProcessor
from ..policies import (
    HandlerExecutor,
    LoadBalancingStrategy,
    LoadPolicy,
    PoisonPolicy,
    RetryPolicy,
    int_at_least,
    positive_seconds,
)
from ..sources.base import EventSource
from ..stores.contract import CheckpointStore
from .clock import Clock, SystemClock

__all__ = ["Timing", "ProcessorOptions", "RENEWAL_WINDOW"]

PartitionProcessorFactory = type | Callable[[], PartitionProcessor]
ErrorHandler = Callable[[Exception, PartitionContext | None], Awaitable[None] | None]
DeadLetter = Callable[..., Awaitable[None]]

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

    Example::

        timing = Timing.derive(interval=15, expiration=75, renewal_age=None, store_timeout=None,
                               shutdown_timeout=30, handler_timeout=60)
        timing.lease_length, timing.renewal_age, timing.store_timeout   # 67.5, 52.5, 5.0
    """

    interval: float
    expiration: float
    safety_margin: float
    lease_length: float
    renewal_age: float
    renewal_retry: float
    store_timeout: float
    shutdown_timeout: float
    handler_timeout: float | None

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
    def derive(*, interval: float, expiration: float, renewal_age: float | None,
               store_timeout: float | None, shutdown_timeout: float,
               handler_timeout: float | None) -> Timing:
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


def _timing(load_balancing_interval: Any, partition_ownership_expiration_interval: Any,
            ownership_renewal_age: Any, store_timeout: Any, shutdown_timeout: Any, handler_timeout: Any) -> Timing:
    interval = positive_seconds("load_balancing_interval", load_balancing_interval)
    expiration = positive_seconds("partition_ownership_expiration_interval", partition_ownership_expiration_interval)
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
    return Timing.derive(
        interval=interval, expiration=expiration, renewal_age=renewal,
        store_timeout=positive_seconds("store_timeout", store_timeout, allow_none=True),
        shutdown_timeout=positive_seconds("shutdown_timeout", shutdown_timeout) or 0.0,
        handler_timeout=positive_seconds("handler_timeout", handler_timeout, allow_none=True))


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
    retry_policy: RetryPolicy
    on_poison: PoisonPolicy
    dead_letter: DeadLetter | None
    refuse_rewind: bool
    handoff_timeout: float | None
    balance_factor: int
    ordinal: int | None
    replica_count: int
    clock: Clock
    rng: random.Random
    error_handler: ErrorHandler | None
    stateful: bool = False
    num_standbys: int = 0
    acceptable_recovery_lag: int = 10_000
    balance_by: str = "count"
    load_policy: LoadPolicy = LoadPolicy()
    load_meter: Callable[[], float] | None = None

    @property
    def scope(self) -> tuple[str, str, str]:
        """(namespace, event hub, consumer group): the arguments of every store listing."""
        return (self.source.fully_qualified_namespace, self.source.eventhub_name, self.consumer_group)

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
                 max_batch_size: Any, max_wait_time: Any, prefetch: Any, track_last_enqueued_event_properties: Any,
                 default_event_position: Any, override_checkpoints: Any, max_delivery_attempts: Any,
                 retry_backoff: Any, on_poison: Any, dead_letter: Any, refuse_checkpoint_rewind: Any,
                 handoff_timeout: Any, balance_factor: Any, ordinal: Any, replica_count: Any, clock: Any,
                 rng: Any, error_handler: Any, stateful: Any = False, num_standbys: Any = 0,
                 acceptable_recovery_lag: Any = 10_000, balance_by: Any = "count", load_policy: Any = None,
                 load_meter: Any = None) -> ProcessorOptions:
        """Check every argument; raise a ConfigurationError naming the first bad one,
        the value and what would be valid."""
        timing = _timing(load_balancing_interval, partition_ownership_expiration_interval, ownership_renewal_age,
                         store_timeout, shutdown_timeout, handler_timeout)
        int_at_least("max_batch_size", max_batch_size, 1)
        max_wait = positive_seconds("max_wait_time", max_wait_time, allow_none=True)
        int_at_least("prefetch", prefetch, 0)
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
        initial = _positions(initial_event_position)
        if not isinstance(default_event_position, EventPosition):
            raise ConfigurationError(f"default_event_position must be an EventPosition, got "
                                     f"{type(default_event_position).__name__} {default_event_position!r}")
        override: bool | frozenset[str]
        if isinstance(override_checkpoints, bool):
            override = override_checkpoints
        elif isinstance(override_checkpoints, str) or not isinstance(override_checkpoints, Iterable) \
                or not all(isinstance(p, str) for p in override_checkpoints):
            raise ConfigurationError(f"override_checkpoints must be True/False or a collection of partition id "
                                     f"strings, got {override_checkpoints!r}")
        else:
            override = frozenset(override_checkpoints)
        if error_handler is not None and not callable(error_handler):
            raise ConfigurationError(f"error_handler must be callable, got {type(error_handler).__name__}")
        if dead_letter is not None and not callable(dead_letter):
            raise ConfigurationError(f"dead_letter must be an async callable (events, error, context), got "
                                     f"{type(dead_letter).__name__}")
        int_at_least("max_delivery_attempts", max_delivery_attempts, 1)
        backoff = positive_seconds("retry_backoff", retry_backoff)
        assert backoff is not None
        try:
            poison_policy = PoisonPolicy(on_poison)
        except ValueError:
            raise ConfigurationError(f"unknown on_poison {on_poison!r}; use 'skip' or 'park'") from None
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
        if handler_executor is not None and handler_executor != "thread" and not (
                isinstance(handler_executor, concurrent.futures.Executor)
                and not isinstance(handler_executor, concurrent.futures.ProcessPoolExecutor)):
            raise ConfigurationError(
                f"handler_executor must be None (handlers run on the event loop), \"thread\" (a worker thread per "
                f"owned partition) or a thread-based concurrent.futures.Executor, got {handler_executor!r}")
        if clock is not None and not (callable(getattr(clock, "monotonic", None))
                                      and callable(getattr(clock, "sleep", None))):
            raise ConfigurationError(f"clock must have monotonic() and async sleep(seconds) (see "
                                     f"eventprocessor._runtime.clock.Clock), got {type(clock).__name__}")
        if rng is not None and not isinstance(rng, random.Random):
            raise ConfigurationError(f"rng must be a random.Random, got {type(rng).__name__}")
        if not isinstance(stateful, bool):
            raise ConfigurationError(f"stateful must be True or False, got {stateful!r}")
        int_at_least("num_standbys", num_standbys, 0)
        int_at_least("acceptable_recovery_lag", acceptable_recovery_lag, 0, what=" (events)")
        if num_standbys and not stateful:
            raise ConfigurationError("num_standbys keeps warm replicas of partition state: it needs stateful=True")
        if balance_by not in BALANCE_BY:
            raise ConfigurationError(f"balance_by must be one of {BALANCE_BY} (partition counts or measured load), "
                                     f"got {balance_by!r}")
        if load_policy is not None and not isinstance(load_policy, LoadPolicy):
            raise ConfigurationError(f"load_policy must be an eventprocessor.LoadPolicy, got "
                                     f"{type(load_policy).__name__}")
        if load_meter is not None and not callable(load_meter):
            raise ConfigurationError(f"load_meter must be a callable returning the CPU utilisation (0 to 1), got "
                                     f"{type(load_meter).__name__}")
        return ProcessorOptions(
            source=source, checkpoint_store=checkpoint_store, factory=partition_processor,
            consumer_group=consumer_group, owner_id=owner_id or str(uuid.uuid4()), strategy=strategy, timing=timing,
            handler_executor=handler_executor, initial_position=initial, default_position=default_event_position,
            override_checkpoints=override, max_batch_size=max_batch_size, max_wait_time=max_wait,
            prefetch=prefetch, track_last_enqueued=bool(track_last_enqueued_event_properties) or balance_by == "load",
            retry_policy=RetryPolicy(max_delivery_attempts=max_delivery_attempts, retry_backoff=backoff),
            on_poison=poison_policy, dead_letter=dead_letter, refuse_rewind=bool(refuse_checkpoint_rewind),
            handoff_timeout=handoff, balance_factor=balance_factor, ordinal=ordinal,
            replica_count=replica_count or 0, clock=clock or SystemClock(), rng=rng or random.Random(),
            error_handler=error_handler, stateful=stateful, num_standbys=num_standbys,
            acceptable_recovery_lag=acceptable_recovery_lag, balance_by=balance_by,
            load_policy=load_policy or LoadPolicy(), load_meter=load_meter)
