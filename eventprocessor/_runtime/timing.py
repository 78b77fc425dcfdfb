"""The processor's timing model: one frozen value derived from its arguments, with
actionable errors (how to size it: docs/concepts/timing.md)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from ..policies import positive_seconds

__all__ = ["Timing", "RENEWAL_WINDOW", "timing_from_arguments"]

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
    gets three renewal attempts before the lease self-fences. A balancing tick's own
    calls and heartbeats wait longer (:attr:`balancing_timeout`, :attr:`heartbeat_timeout`).

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
    def balancing_timeout(self) -> float:
        """The longest a balancing tick's own store calls (its listings, claims, fences and
        handoff requests) may take: ``max(store_timeout, expiration / 4)``.

        They keep no lease alive, so they can wait for a store that is slow but answering
        (one emulator thread serving the first listings of a whole group): a call given up
        on is still served by the store, and the next tick would only send it again behind
        it. Renewals and checkpoints keep ``store_timeout``, heartbeats their own
        (:attr:`heartbeat_timeout`). A lease runs from its claim's send time, so a claim
        answered this late still has at least ``lease_length - expiration / 4`` of it left,
        and the next heartbeat (every ``expiration / 4``) or renewal extends it."""
        return max(self.store_timeout, self.expiration / 4)

    @property
    def heartbeat_timeout(self) -> float:
        """The longest a heartbeat (the member record's rewrite) may take:
        ``max(store_timeout, (lease_length - heartbeat) / 3)``, 16.25 s at the defaults.
        Three attempts fit between a heartbeat falling due and the end of the leases it
        keeps, as three renewals fit in ``store_timeout``'s rule; a heartbeat answered
        late extends the leases from when it was sent, never more. A store whose queue
        holds every call for 5-15 s (one emulator thread under a whole group's cold start)
        then does not make a processor that is being served self-fence."""
        return max(self.store_timeout, (self.lease_length - self.heartbeat) / 3)

    @property
    def member_expiration(self) -> float:
        """A member record older than this (half the expiration) is a gone member."""
        return self.expiration / 2

    @property
    def full_listing_interval(self) -> float:
        """How often a processor that skips ownership listings at rest lists every record
        anyway, in case a change notice was lost (see :meth:`full_listing_interval_for`)."""
        return Timing.full_listing_interval_for(self.expiration)

    @staticmethod
    def full_listing_interval_for(expiration: float) -> float:
        """``max(4·E, 60 s)`` (5 min with the default E of 75 s), jittered down by up to a
        quarter: the safety net behind the change notices."""
        return max(4.0 * expiration, 60.0)

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


def timing_from_arguments(load_balancing_interval: Any, partition_ownership_expiration_interval: Any,
            ownership_renewal_age: Any, store_timeout: Any, shutdown_timeout: Any, handler_timeout: Any) -> Timing:
    """The timing model of :class:`~eventprocessor.EventProcessor`'s timing arguments, or a
    ConfigurationError naming the first bad one."""
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
