"""The choices a processor leaves to its user: the enums and the policy objects.

* :class:`LoadBalancingStrategy`: how a processor takes its share of the partitions;
* :class:`CloseReason`: why a handler's claim ended;
* :class:`FailurePolicy` (with :class:`PoisonPolicy`): what happens when
  ``process_events`` raises: how often and how fast a batch is delivered again, and what
  becomes of an event that fails every attempt;
* :class:`LoadPolicy`: balance by measured load instead of partition counts, and the
  knobs of that plan;
* :class:`StatePolicy`: per-partition state that moves with ownership, and its warm
  replicas.

Each policy is a frozen value that checks itself when it is made: a bad field raises
:class:`~eventprocessor.errors.ConfigurationError` naming the field, the value and what
would be valid.

Example::

    EventProcessor(source, store, Handler,
                   failure_policy=FailurePolicy(max_delivery_attempts=3, on_poison="park"),
                   load_policy=LoadPolicy(max_moves=2),
                   stateful=StatePolicy(num_standbys=1))
"""
from __future__ import annotations

import concurrent.futures
import enum
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError
from .events import Event

__all__ = ["LoadBalancingStrategy", "CloseReason", "PoisonPolicy", "RetryPolicy", "FailurePolicy", "LoadPolicy",
           "StatePolicy", "HandlerExecutor", "DeadLetter", "positive_seconds", "int_at_least"]


def positive_seconds(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    """``value`` as a positive, finite number of seconds, or a ConfigurationError naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number of seconds, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigurationError(f"{name} must be a positive, finite number of seconds, got {value!r}")
    return float(value)


def int_at_least(name: str, value: Any, minimum: int, *, what: str = "") -> int:
    """``value`` as an int of at least ``minimum``, or a ConfigurationError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        kind = "a non-negative int" if minimum == 0 else f"an int of at least {minimum}"
        raise ConfigurationError(f"{name} must be {kind}{what}, got {value!r}")
    return value


class LoadBalancingStrategy(str, enum.Enum):
    """How a processor takes its share.

    ``GREEDY`` (the default) claims up to its whole fair share in one tick. ``BALANCED``
    claims at most one new partition per tick (the seed's protocol: smooth, few
    conflicts). ``STATIC`` gives each processor a fixed share by its ``ordinal`` out of
    ``replica_count`` (StatefulSet style); a missing member's share is spread over the
    others only once that member's record has expired, and moves back when it returns.
    """

    BALANCED = "balanced"
    GREEDY = "greedy"
    STATIC = "static"


class CloseReason(enum.Enum):
    """Why a partition stopped being processed here."""

    SHUTDOWN = "shutdown"
    """``EventProcessor.stop()`` was called; ownership is released."""
    OWNERSHIP_LOST = "ownership_lost"
    """Another processor took the partition, a renewal failed, the receiver was
    disconnected by a higher owner level, or the lease ran out (self-fencing)."""
    HANDOFF = "handoff"
    """Another processor asked for the partition (rebalancing, scale-out): this claim
    finished its batch and hands the partition over. ``update_checkpoint`` still works
    inside ``close``, and the next owner resumes from the last checkpoint."""


class PoisonPolicy(str, enum.Enum):
    """What to do with an event that fails every delivery attempt."""

    SKIP = "skip"
    """Hand it to ``dead_letter`` (if set) and ``process_error``, checkpoint past it, go on."""
    PARK = "park"
    """Stop dispatching the partition (keeping it) until the processor restarts."""


HandlerExecutor = None | str | concurrent.futures.Executor
"""``None`` (run handlers on the event loop), ``"thread"`` (one worker thread per owned
partition) or a :class:`concurrent.futures.Executor` whose threads run them."""

DeadLetter = Callable[[list[Event], Exception, Any], Awaitable[None]]
"""The hook a skipped poison event is handed to: ``await dead_letter(events, error, context)``,
``context`` being the partition's :class:`~eventprocessor.PartitionContext` (typed loosely
here: the handler's context is built on these policies, not the other way round)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast a failing batch is delivered again."""

    max_delivery_attempts: int = 5
    retry_backoff: float = 0.5
    max_retry_backoff: float = 30.0

    def delay(self, failed_attempts: int) -> float:
        """The pause after ``failed_attempts`` failures (1, 2, ...)."""
        return min(self.retry_backoff * (2 ** (failed_attempts - 1)), self.max_retry_backoff)

    def stall_bound(self) -> float:
        """The longest a poison event holds its partition up, besides the handler's own
        time: the pauses before its attempts 2 to ``max_delivery_attempts``."""
        return sum(self.delay(k) for k in range(1, self.max_delivery_attempts))


@dataclass(frozen=True)
class FailurePolicy:
    """What the processor does when ``process_events`` raises (see
    docs/concepts/errors.md): the batch goes to ``process_error`` and is delivered again,
    one event at a time after ``retry_backoff`` seconds (doubling), until an event has
    been delivered ``max_delivery_attempts`` times in all. Then it is poison, and
    ``on_poison`` decides: :attr:`PoisonPolicy.SKIP` awaits ``dead_letter(events, error,
    context)`` (when set) and checkpoints past it; :attr:`PoisonPolicy.PARK` stops
    dispatching the partition, keeping it, until the processor restarts.

    Example::

        FailurePolicy(max_delivery_attempts=3, on_poison="skip", dead_letter=park_in_a_queue)
    """

    max_delivery_attempts: int = 5
    retry_backoff: float = 0.5
    on_poison: PoisonPolicy = PoisonPolicy.SKIP
    dead_letter: DeadLetter | None = None

    def __post_init__(self) -> None:
        int_at_least("max_delivery_attempts", self.max_delivery_attempts, 1)
        object.__setattr__(self, "retry_backoff", positive_seconds("retry_backoff", self.retry_backoff))
        try:
            object.__setattr__(self, "on_poison", PoisonPolicy(self.on_poison))
        except ValueError:
            raise ConfigurationError(f"unknown on_poison {self.on_poison!r}; use 'skip' or 'park'") from None
        if self.dead_letter is not None and not callable(self.dead_letter):
            raise ConfigurationError(f"dead_letter must be an async callable (events, error, context), got "
                                     f"{type(self.dead_letter).__name__}")

    @property
    def retry_policy(self) -> RetryPolicy:
        """The redelivery schedule this policy asks for."""
        return RetryPolicy(max_delivery_attempts=self.max_delivery_attempts, retry_backoff=self.retry_backoff)


@dataclass(frozen=True)
class LoadPolicy:
    """Balance by measured load (docs/concepts/load-balancing.md), with the knobs of the plan.

    ``threshold``: act on a processor above ``mean * (1 + threshold)`` only (a dead band
    against noise). ``damping``: move at most this fraction of a processor's excess per
    round. ``max_moves``: at most this many partitions leave one processor per round.
    ``cooldown``: seconds a moved partition stays. ``floor``: utilisation below which
    nobody is busy enough to move anything. ``meter``: returns this process's CPU
    utilisation (0 to 1) when called; by default its CPU time over the cores its cgroup
    allows.

    Example::

        EventProcessor(source, store, Handler, load_policy=LoadPolicy(max_moves=2))
    """

    threshold: float = 0.25
    damping: float = 0.5
    max_moves: int = 1
    cooldown: float = 300.0
    floor: float = 0.1
    meter: Callable[[], float] | None = None

    def __post_init__(self) -> None:
        if self.meter is not None and not callable(self.meter):
            raise ConfigurationError(f"LoadPolicy meter must be a callable returning the CPU utilisation (0 to 1), "
                                     f"got {type(self.meter).__name__}")


@dataclass(frozen=True)
class StatePolicy:
    """Per-partition state that moves with ownership (docs/concepts/stateful.md).

    ``num_standbys``: how many other processors keep a warm replica of each partition's
    state, so that a crashed owner's partition goes to one that is caught up.
    ``acceptable_recovery_lag``: how many events behind the owner's last checkpoint a
    replica may be and still count as warm (a planned move waits until it is).
    ``stateful=True`` is ``StatePolicy()``.

    Example::

        EventProcessor(source, store, Handler, stateful=StatePolicy(num_standbys=1))
    """

    num_standbys: int = 0
    acceptable_recovery_lag: int = 10_000

    def __post_init__(self) -> None:
        int_at_least("num_standbys", self.num_standbys, 0)
        int_at_least("acceptable_recovery_lag", self.acceptable_recovery_lag, 0, what=" (events)")
