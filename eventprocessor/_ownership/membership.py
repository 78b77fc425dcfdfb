"""Membership: this processor's heartbeat record, and who else is alive.

A member record lets peers count a processor in their plans even while it owns nothing.
It is rewritten every quarter of the expiration and is judged gone after half of it, so
a crashed member leaves every plan before its partitions' records expire. It also keeps
every partition the processor owns (``lease=member``, see :mod:`.liveness`): a
heartbeat the store accepted extends each live lease as a renewal of its record would.
A failed heartbeat is retried every ``renewal_retry``; one waits up to
``Timing.heartbeat_timeout`` for its answer (three fit before the leases end). A store that
keeps no member records is fine (except for the static strategy): the processor then
makes itself visible by claiming one partition first.

**A group forming** (Kafka's ``group.initial.rebalance.delay``, on member records): a
processor that starts where every live member is itself still joining (a cold start, or
a whole group restarted) waits for the member set to settle before its first claims, so
that every processor of a group started together plans with all of them and claims its
final share at once, instead of claiming by a partial view and moving partitions to each
late joiner by handoffs. While it waits its record carries ``joining=1``; it lists the
members every quarter of ``group_join_delay`` and stops waiting once the set has not
changed for ``group_join_delay`` (at most three times that after it joined), or at once
when some live member is not joining (a running group: it is asked for partitions by
handoffs as before), when the store keeps no member records, with the static strategy,
or with ``group_join_delay=None``.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .._runtime.clock import Clock, sleep_or_wake
from .._runtime.options import ProcessorOptions
from .._runtime.reporting import Reporter
from ..errors import ConfigurationError
from ..policies import LoadBalancingStrategy
from ..stores.contract import OwnershipStore
from ..stores.records import Member, MemberListing
from .lease_table import LeaseTable
from .liveness import LEASE_PROPERTY, MEMBER_LEASES, NUDGE_PROPERTY, encode_nudge
from .load_meter import CpuMeter, LoadMeter
from .load_plan import LOAD_PROPERTY, MemberLoad, encode_load
from .strategies import HANDOFF_PROPERTY, ORDINAL_PROPERTY

if TYPE_CHECKING:  # pragma: no cover
    from .warmup import Warmup

__all__ = ["Membership", "IN_FLIGHT_PROPERTY", "JOINING_PROPERTY", "JOIN_MAX_FACTOR", "encode_in_flight",
           "decode_in_flight"]

JOINING_PROPERTY = "joining"
"""The member-record property of a processor still waiting for its group to form."""
JOIN_MAX_FACTOR = 3.0
"""A processor of a forming group claims at most this many ``group_join_delay`` after it
joined, however long members keep joining."""

IN_FLIGHT_PROPERTY = "inflight"
"""The member-record property a processor with many events in flight per partition
publishes them in: ``pid=calls/held/oldest,...``, ``oldest`` the enqueued time (whole
Unix seconds, -1: none) of the partition's oldest event not done."""


def encode_in_flight(partitions: Mapping[str, tuple[int, int, float | None]]) -> str:
    return ",".join(f"{pid}={calls}/{held}/{-1 if oldest is None else int(oldest)}"
                    for pid, (calls, held, oldest) in sorted(partitions.items()))


def decode_in_flight(text: str | None) -> dict[str, tuple[int, int, float | None]]:
    """What :func:`encode_in_flight` wrote (items that do not read are left out)."""
    found: dict[str, tuple[int, int, float | None]] = {}
    for item in filter(None, (text or "").split(",")):
        pid, _, fields = item.partition("=")
        parts = fields.split("/")
        if len(parts) == 3 and all(part.lstrip("-").isdigit() for part in parts):
            oldest = int(parts[2])
            found[pid] = (int(parts[0]), int(parts[1]), None if oldest < 0 else float(oldest))
    return found

logger = logging.getLogger(__name__)


class Membership:
    """Writes, renews and deletes this processor's member record.

    ``state``: None (not known yet), True (the record is kept), False (the store keeps
    none). ``on_fatal(error)`` is called when the processor cannot run at all (the static
    strategy on a store without member records). Besides the basics the record carries
    the replicas' lags of ``warmup`` (a stateful processor) and, with
    a ``load_policy``, the load measured over the partitions of ``table``.
    """

    def __init__(self, *, options: ProcessorOptions, store: OwnershipStore, reporter: Reporter, describe: str,
                 on_fatal: Callable[[Exception], None], table: LeaseTable,
                 warmup: Warmup | None = None) -> None:
        self._options = options
        self._store = store
        self._reporter = reporter
        self._describe = describe
        self._on_fatal = on_fatal
        self._clock: Clock = options.clock
        self._table = table
        self.state: bool | None = None
        self.member: Member | None = None
        self.joining = options.group_join_delay is not None
        """Waiting for a forming group to settle (see the module docstring)."""
        self._warmup = warmup
        self._table = table
        self._nudge: str | None = None  # the NUDGE_PROPERTY value, once this processor nudged
        self._nudges = 0
        self._writing = asyncio.Lock()  # one write at a time: a slow heartbeat cannot undo a nudge
        self._load: LoadMeter | None = None
        if options.load_policy is not None:
            self._load = LoadMeter(table=table, clock_now=self._clock.monotonic,
                                   utilization=options.load_policy.meter or CpuMeter())

    @property
    def load(self) -> MemberLoad | None:
        """The load last measured and published (None when balancing by count or before
        the first sample)."""
        return self._load.current if self._load is not None else None

    def in_flight(self) -> dict[str, tuple[int, int, float | None]]:
        """Per owned partition with many events in flight: calls in flight, events held,
        the enqueued time (Unix seconds) of the oldest not done."""
        found: dict[str, tuple[int, int, float | None]] = {}
        for lease in self._table:
            reported = lease.pump.in_flight() if lease.pump is not None else None
            if reported is not None:
                calls, held, oldest = reported
                found[lease.partition_id] = (calls, held, oldest.enqueued_time.timestamp() if oldest else None)
        return found

    def record(self) -> Member:
        options = self._options
        properties = {"strategy": options.strategy.value, HANDOFF_PROPERTY: "1" if options.handoff_timeout else "0",
                      LEASE_PROPERTY: MEMBER_LEASES}
        if options.ordinal is not None:
            properties[ORDINAL_PROPERTY] = str(options.ordinal)
        if self.joining:
            properties[JOINING_PROPERTY] = "1"
        if self._warmup is not None:
            properties.update(self._warmup.member_properties())
        if self._load is not None:
            properties[LOAD_PROPERTY] = encode_load(self._load.sample())
        if options.concurrency.concurrent:
            properties[IN_FLIGHT_PROPERTY] = encode_in_flight(self.in_flight())
        if self._nudge is not None:
            properties[NUDGE_PROPERTY] = self._nudge
        return Member(*options.scope, options.owner_id, properties=properties)

    async def nudge(self, owners: set[str]) -> None:
        """Name ``owners`` in the member record and write it now (see :mod:`.liveness`):
        an ownership write of this processor concerns them."""
        if self.state is not True:
            return  # no member records: every processor lists at every change notice
        self._nudges += 1
        self._nudge = encode_nudge(self._nudges, owners)
        async with self._writing:
            if self.state is True:  # not left meanwhile (a release written as the processor stops)
                await self._write()

    async def join(self) -> bool:
        """Write the member record (once more each heartbeat); whether the store took it."""
        if self.state is False:
            return False
        async with self._writing:
            return await self._write()

    async def _write(self) -> bool:
        try:
            sent_at = self._clock.monotonic()
            self.member = await self._store.write_member(self.record())
            self._table.heartbeat_accepted(sent_at=sent_at)
            if not self.state:
                logger.debug("processor %s joined (member record written)", self._describe)
            self.state = True
            return True
        except NotImplementedError:
            self.state = False
            if self._options.strategy is LoadBalancingStrategy.STATIC:
                self._on_fatal(ConfigurationError(
                    f"the static strategy needs a checkpoint store that keeps member records; "
                    f"{type(getattr(self._store, 'inner', self._store)).__name__} does not"))
            else:
                logger.info("processor %s: %s keeps no member records; a processor that owns nothing claims one "
                            "partition first to be seen", self._describe,
                            type(getattr(self._store, "inner", self._store)).__name__)
        except Exception as error:
            report, _suppressed = self._reporter.throttle.failed("member")
            if report and not self._reporter.outage.ongoing:  # an outage is told once, by the reporter
                logger.warning("processor %s: writing its member record failed: %r", self._describe, error)
        return False

    async def form_group(self, *, halted: Callable[[], bool], wake: asyncio.Event) -> float:
        """Before the first claims: wait while the group is forming (see the module
        docstring); return at once when ``halted()`` (checked whenever ``wake`` is set).
        Returns the seconds waited."""
        options, clock = self._options, self._clock
        delay = options.group_join_delay
        started = changed_at = clock.monotonic()
        seen: frozenset[str] | None = None
        try:
            if delay is None or not self.state or options.strategy is LoadBalancingStrategy.STATIC:
                return 0.0
            while not halted():
                try:
                    live = self.live(await self._store.list_members(*options.scope))
                except Exception as error:  # the first tick says what the store does
                    logger.debug("processor %s: listing members to join failed: %r", self._describe, error)
                    break
                if live is None or any(properties.get(JOINING_PROPERTY) != "1"
                                       for member, properties in live.items() if member != options.owner_id):
                    break  # no member records, or a running group
                now = clock.monotonic()
                if frozenset(live) != seen:
                    seen, changed_at = frozenset(live), now
                if now - changed_at >= delay or now - started >= JOIN_MAX_FACTOR * delay:
                    logger.debug("processor %s: the group formed with %d members in %.2f s", self._describe,
                                 len(seen), now - started)
                    break
                wake.clear()
                await sleep_or_wake(clock, delay / 4, wake)
            return clock.monotonic() - started
        finally:
            if self.joining:
                self.joining = False
                if self.state and not halted():
                    await self.join()  # the record without ``joining``: others stop waiting at once

    async def run(self) -> None:
        """Rewrite the member record every heartbeat, like a lease."""
        timing = self._options.timing
        while True:
            if self.state is False:
                return
            written = await self.join()
            await self._clock.sleep(timing.heartbeat if written else timing.renewal_retry)

    def live(self, listing: MemberListing | None) -> dict[str, Mapping[str, str]] | None:
        """The live member records (id -> properties), or None when the store keeps none."""
        if not self.state or listing is None:
            return None
        live: dict[str, Mapping[str, str]] = {}
        limit = self._options.timing.member_expiration
        for member in listing.members:
            modified = member.last_modified_time
            if modified is not None and (listing.server_time - modified).total_seconds() <= limit:
                live[member.owner_id] = dict(member.properties)
        return live

    async def leave(self) -> None:
        """Delete the member record (a graceful stop)."""
        if self.member is None:
            return
        async with self._writing:  # a nudge or heartbeat in flight lands first, not after the delete
            await self._delete()

    async def _delete(self) -> None:
        assert self.member is not None
        try:
            await self._store.delete_member(self.member)
        except Exception as error:
            logger.warning("processor %s: deleting its member record failed: %r; it expires instead",
                           self._describe, error)
        self.member = None
        self.state = None
