"""Taker: one balancing tick, and the loop that runs it.

A tick (:meth:`Taker.tick`): read the partition ids; list the members (with the change
notice) and stop there when nothing changed (:mod:`.liveness`); else list ownership and
members in one call, check the store's history, reconcile the lease table, ask the pure
balancer (:func:`~eventprocessor._ownership.balancer.decide`) what to claim, ask owners for
handoffs, and let the :class:`~eventprocessor._ownership.claimer.Claimer` claim, fence and
report each won claim (``on_won``: the dispatcher starts its pump). The loop
(:meth:`Taker.run`) ticks every ``load_balancing_interval``, jittered, sooner while waiting
on a handoff, and backs off while store calls time out (:mod:`eventprocessor._runtime.backoff`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from .._runtime.backoff import Congestion, TickBackoff, TimeoutLedger
from .._runtime.bounded_store import BoundedStore
from .._runtime.clock import sleep_or_wake
from .._runtime.options import ProcessorOptions
from .._runtime.reporting import Reporter
from .._runtime.stats import ProcessorStats
from .._runtime.telemetry import Telemetry
from ..stores.records import Checkpoint, MemberListing, Ownership, OwnershipListing
from .balancer import BalanceDecision, BalanceReport, decide, heirs
from .claimer import Claimer
from .lease import Lease, LeaseState, Reconciliation, Snapshot
from .lease_table import LeaseTable, sorted_ids
from .liveness import ChangeWatch, RenewalMode, heartbeats, next_expiry, with_heartbeats
from .load_plan import published_loads
from .membership import Membership
from .overrun import overrun_cause, renewals_note
from .partition_ids import PartitionIds
from .store_history import StoreHistory
from .store_loss import StoreLoss
from .warmup import Warmup
from .writer import OwnershipWriter

__all__ = ["Taker", "BalanceReport"]

logger = logging.getLogger(__name__)


class Taker:
    """Claims what the balancer says this processor should own.

    ``on_won(lease, checkpoint)`` is called with each claim won and fenced, and the
    checkpoint it resumes from (the dispatcher starts its pump). ``last_stall()`` says
    when the event loop was last held by a handler (start, end), if it was: a tick that
    overran names it as the cause."""

    def __init__(self, *, options: ProcessorOptions, store: BoundedStore, writer: OwnershipWriter,
                 table: LeaseTable, history: StoreHistory, membership: Membership,
                 on_won: Callable[[Lease, Checkpoint | None], None],
                 last_stall: Callable[[], tuple[float, float] | None], reporter: Reporter, stats: ProcessorStats,
                 telemetry: Telemetry, describe: str, warmup: Warmup | None = None) -> None:
        self._options = options
        self._timing = options.timing
        self._clock = options.clock
        self._rng = options.rng
        self._store = store
        self._writer = writer
        self._table = table
        self._history = history
        self._membership = membership
        self._last_stall = last_stall
        self._reporter = reporter
        self._stats = stats
        self._telemetry = telemetry
        self._describe = describe
        self._warmup = warmup
        self._waited = 0.0  # seconds of this tick spent waiting for the group to form
        self.fatal: Exception | None = None
        """The error that halted balancing (see :meth:`halt`), or None."""
        self._wake = asyncio.Event()
        self._store_answered = asyncio.Event()  # set by a prompt, successful store call while backing off
        self._backoff = TickBackoff(interval=self._timing.interval,
                                    cap=max(self._timing.interval, self._timing.expiration), rng=self._rng)
        self._timeouts = TimeoutLedger(self._clock, self._timing.store_timeout)
        # How long the last tick's first listing took (None: no answer): the member listing,
        # small whatever P, where the tick made one, so that it measures the store's queue
        # rather than the size of the ownership listing; else the ownership listing.
        self._listing_seconds: float | None = None
        self._paused = False  # the last tick was followed by a backed-off pause, not the usual interval
        self._slowest_call: tuple[str, float, BaseException | None] | None = None  # during this tick
        self._partition_ids = PartitionIds(options.source, clock=self._clock, reporter=reporter)
        self._watch = ChangeWatch(expiration=self._timing.expiration, member_expiration=self._timing.member_expiration,
                                  rng=self._rng, watch_properties=options.balance_by_load or options.stateful,
                                  owner_id=options.owner_id)
        self.renewal = RenewalMode(mode=options.ownership_renewal, expiration=self._timing.expiration,
                                   now=self._clock.monotonic, describe=describe,
                                   members=lambda: membership.state, announcing=lambda: writer.announcing)
        self.requests_made: dict = {}
        """Partition -> local time this processor asked its owner for it (a handoff)."""
        self.store_loss = StoreLoss(options=options, history=history, table=table, reporter=reporter, stats=stats,
                                    describe=describe)
        self._claimer = Claimer(options=options, store=store, writer=writer, table=table, history=history,
                                reporter=reporter, clock=self._clock, describe=describe, on_won=on_won,
                                store_lost=self.store_loss.report)
        store.observers.append(self._note_prompt_answer)

    def wake(self) -> None:
        """List now (a renewal lost its conditional write)."""
        self._watch.invalidate()
        self._wake.set()

    @property
    def announcements(self) -> int:
        """Change notices this processor wrote."""
        return self._writer.announcements

    def halt(self, error: Exception) -> None:
        """No claim can ever work (the factory does not make a ``PartitionProcessor``, the
        static strategy without member records): say so once and stop balancing. The
        processor's ``run()`` raises ``error``; its ``stop()`` stops the rest."""
        if self.fatal is not None:
            return
        self.fatal = error
        logger.error("processor %s: %s; stopping", self._describe, error)
        self._reporter.report(error, [])
        self.wake()

    # ----------------------------------------------------------------- the loop
    async def run(self) -> None:
        """Tick until cancelled (or until the processor halts on a fatal error)."""
        interval = self._timing.interval
        if self._membership.state is None:
            await self._membership.join()
        while self.fatal is None:
            self._wake.clear()
            started = self._clock.monotonic()
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as error:  # never let one bad tick end the loop
                logger.exception("processor %s: load-balancing tick failed", self._describe)
                self._reporter.report(error, [])
            if self.fatal is not None:
                return
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
                await sleep_or_wake(self._clock, backed_off - elapsed, self._store_answered)
                if self._store_answered.is_set():
                    await self._clock.sleep(interval * self._rng.uniform(0.0, 1.0))
                continue
            if self.requests_made:
                # Waiting on a handoff: look again soon, to take the partition as soon as
                # its owner writes it over (a few extra listings, during moves only).
                pause = min(pause, interval / 4)
            await sleep_or_wake(self._clock, pause - elapsed, self._wake)

    def _note_prompt_answer(self, operation: str, seconds: float, error: BaseException | None) -> None:
        # Runs after every store call: the cheap tests first; only a backing-off loop waits on it.
        if self._slowest_call is None or seconds > self._slowest_call[1]:
            self._slowest_call = (operation, seconds, error)  # an overrun tick names it
        self._timeouts.observe(seconds, error)
        if self._backoff.backing_off and error is None and seconds < self._timing.store_timeout / 4 \
                and not self._table.owned():
            self._store_answered.set()

    def _back_off_if_store_timed_out(self) -> float | None:
        """After a tick: the pause before the next one while the store times out (see
        :mod:`eventprocessor._runtime.backoff`), or None for the usual interval."""
        timed_out = self._timeouts.since_last_tick()
        level = self._backoff.level
        seen = Congestion.of(timed_out=timed_out > 0, listing_seconds=self._listing_seconds,
                             store_timeout=self._timing.store_timeout)
        pause = self._backoff.after_tick(seen)
        self._stats.backoff_level = self._backoff.level
        quiet = logger.debug if self._reporter.outage.ongoing else logger.warning  # an outage is told once
        if pause is None:
            # Said once, when the pauses end: the level comes down one step per tick that
            # kept up, and every one of those ticks already runs at the usual interval.
            if level and self._paused:
                logger.warning("processor %s: the checkpoint store %r answers in time again; balancing every %g s "
                               "again", self._describe, self._store.inner, self._timing.interval)
            self._paused = False
            return None
        self._paused = True
        self._stats.backed_off_ticks += 1
        self._telemetry.backed_off()
        if self._backoff.level > level:
            quiet(
                "processor %s: %d checkpoint-store call(s) timed out since the last tick (its first listing: %s; "
                "store_timeout=%g s): the store is saturated or unreachable. Backing off so that it can drain: "
                "the next tick in %.1f s "
                "instead of %g s (level %d of %d); renewals keep "
                "their own schedule. If this persists, the store cannot serve this many processors and partitions "
                "at this interval: raise load_balancing_interval (docs/concepts/timing.md, \"Sizing\").",
                self._describe, timed_out,
                "no answer" if self._listing_seconds is None else f"answered in {self._listing_seconds:.1f} s",
                self._timing.store_timeout, pause, self._timing.interval, self._backoff.level,
                self._backoff.max_level)
        return pause

    # ----------------------------------------------------------------- one tick
    async def tick(self) -> BalanceReport:
        """Run one load-balancing tick: list, reconcile, decide, claim, fence, start pumps.

        Store and source failures are logged (first at once, then at a bounded rate) and
        reported to ``error_handler``; the processor keeps running, and its leases are
        kept by the renewer or run out on their own if the store stays unreachable.
        """
        stats = self._stats
        stats.ticks += 1
        started = self._clock.monotonic()
        self._slowest_call = None
        in_store_before = self._store.patient_seconds
        report = await self._tick()
        duration, self._waited = self._clock.monotonic() - started - self._waited, 0.0
        stats.last_tick_duration = duration
        stats.max_tick_duration = max(stats.max_tick_duration, duration)
        stats.claims_won += len(report.claimed)
        stats.claims_lost += len(report.failed_claims)
        stats.steals += len(report.stolen)
        self._telemetry.tick(duration, duration > self._timing.interval)
        self._telemetry.claims_lost_race(len(report.failed_claims))
        if duration > self._timing.interval:
            self._overran(started, duration, self._store.patient_seconds - in_store_before)
        return replace(report, duration=duration)

    def _overran(self, started: float, duration: float, in_store: float) -> None:
        self._stats.overruns += 1
        late = self._clock.monotonic() - self._timing.renewal_retry
        cause = overrun_cause(started=started, duration=duration, stall=self._last_stall(), slowest=self._slowest_call,
                              in_store=in_store, store_timeout=self._timing.store_timeout)
        report, suppressed = self._reporter.throttle.failed("overrun")
        if self._reporter.outage.ongoing or not report:  # an outage is told once; overruns at a bounded rate
            logger.debug("processor %s: a load-balancing tick took %.2f s: %s", self._describe, duration, cause)
            return
        leases = renewals_note(sorted_ids(lease.partition_id for lease in self._table.in_state(LeaseState.OWNED)
                                          if self.renewal.per_partition and lease.renew_at < late))
        logger.warning(
            "processor %s: a load-balancing tick took %.2f s, longer than load_balancing_interval=%g s "
            "(expiration %g s, %d partitions owned)%s: %s. Balancing is slower than configured: %s.",
            self._describe, duration, self._timing.interval, self._timing.expiration, len(self._table),
            f"; {suppressed} more ticks overran since the last report" if suppressed else "", leases, cause)

    async def _tick(self) -> BalanceReport:
        table = self._table
        owned_before = table.owned()
        partition_ids = await self._partition_ids.read()
        if isinstance(partition_ids, Exception):
            return self._empty_report(error=partition_ids)
        if self._membership.joining:  # after the source answered; not timed as the tick
            self._waited = await self._membership.form_group(halted=lambda: self.fatal is not None, wake=self._wake)
        members: MemberListing | None = None
        if not self.renewal.per_partition:
            read = await self._list_members()
            if isinstance(read, Exception):
                return self._empty_report(error=read)
            members = read
            if self.store_loss.check_members(members):
                self._watch.invalidate()
            if not table.hung_past_expiry() and self._watch.unchanged(members, partition_ids, self._clock.monotonic(),
                                                                      table.dispatch_view()):
                self._stats.skipped_listings += 1
                table.reconcile()  # follow the pumps; the store has nothing new to say
                return BalanceReport(table.owned(), frozenset(), frozenset(), {}, owned_before - table.owned(),
                                     frozenset(), requests={"list_members": 1})
        listed = await self._list()
        if isinstance(listed, Exception):
            self._watch.invalidate()
            return self._empty_report(error=listed)
        listing, member_listing, snapshot, seen_before = listed
        if member_listing is not None and self.store_loss.check_members(member_listing):
            self._watch.invalidate()
        self.renewal.note(listing, member_listing)
        self.store_loss.check_listing(listing, seen_before)
        reconciliation = table.reconcile(snapshot)
        self._hand_over_hung(listing, member_listing)
        lost = owned_before - table.owned()
        decision = self._decide(listing, member_listing, partition_ids)
        # The claims first: a replica being claimed is marked before the asks' write
        # gives the replicas' refresh a chance to drop what this tick no longer asks for.
        claims, adoptions = self._claims_to_write(decision, reconciliation, snapshot, partition_ids)
        await self._ask_for_handoffs(decision, listing)
        won, failed, claim_error = await self._claimer.take(claims, adoptions, taken_from=decision.stolen_from,
                                                            go_on=self._below_ceiling(decision))
        if self._warmup is not None:
            self._warmup.not_claimed({r.partition_id for r in claims + adoptions} - set(won))
        claimed, stolen = self._say_won(won, {r.partition_id for r in adoptions}, decision, reconciliation.reclaim)
        requests = {"list_ownership": 1, "claim_ownership": len(claims) + len(adoptions)}
        if members is not None or member_listing is not None:
            held_back = bool(decision.claims) and self.store_loss.claims_own_only
            work_left = bool(claims or adoptions or failed or claim_error or decision.handoff_requests
                             or decision.awaiting_handoff or reconciliation.transitions or lost or held_back)
            expires_in = next_expiry(listing, heartbeats(member_listing), self._timing.expiration)
            settled = (self._options.plans_by_counts and decision.ceiling is not None
                       and len(table.owned()) == decision.ceiling and not failed
                       and claim_error is None and not decision.handoff_requests and not decision.awaiting_handoff
                       and not lost and not reconciliation.transitions and not table.hung_past_expiry())
            self._watch.listed(members or member_listing, partition_ids,  # type: ignore[arg-type]
                               self._clock.monotonic(), work_left=work_left, owned=table.dispatch_view(),
                               expires_in=expires_in, settled=settled)
        if members is not None:
            requests["list_members"] = 1
        return BalanceReport(table.owned(), claimed, frozenset(), stolen, frozenset(lost), frozenset(failed),
                             requests=requests, error=claim_error)

    async def _list_members(self) -> MemberListing | Exception:
        """The members and the group's change notice: all a tick reads when nothing changed."""
        listed_at = self._clock.monotonic()
        self._listing_seconds = None
        try:
            with self._store.patient():
                members = await self._store.list_members(*self._options.scope)
        except Exception as error:
            self._reporter.tick_failed("store", error)
            self._watch.invalidate()
            return error
        self._listing_seconds = self._clock.monotonic() - listed_at
        self._reporter.tick_recovered("store")
        return members

    async def _list(self) -> tuple[OwnershipListing, MemberListing | None, Snapshot, dict[str, int]] | Exception:
        """List ownership and members in one store call: the listings, the snapshot the
        lease table is reconciled with, and the epochs known when the listing was sent.
        Or the error the listing raised, reported."""
        listed_at = self._clock.monotonic()
        # A slow listing shows the store as it was when it was sent: compare it with the
        # epochs known then, not with what this processor wrote meanwhile (a handoff).
        seen_before = self._history.epochs()
        timed = self.renewal.per_partition  # else the member listing before it was timed
        if timed:
            self._listing_seconds = None
        try:
            with self._store.patient():
                listing, member_listing = await self._store.list_ownership_and_members(*self._options.scope)
        except Exception as error:
            self._reporter.tick_failed("store", error)
            return error
        if timed:
            self._listing_seconds = self._clock.monotonic() - listed_at
        self._reporter.tick_recovered("store")
        # A record is live while its owner's heartbeat is, when that heartbeat keeps it.
        listing = with_heartbeats(listing, heartbeats(member_listing))
        snapshot = Snapshot(records={r.partition_id: r for r in listing.ownerships}, server_time=listing.server_time,
                            sent_at=listed_at, unreadable=frozenset(u.partition_id for u in listing.unreadable))
        return listing, member_listing, snapshot, seen_before

    def _hand_over_hung(self, listing: OwnershipListing, member_listing: MemberListing | None) -> None:
        """Hand each lease that ran out under a handler that never returned to a live peer
        (:func:`~eventprocessor._ownership.balancer.heirs`): this processor cannot claim
        what its hung pump holds, and its heartbeat would keep that record live for good."""
        hung = {lease.partition_id: lease for lease in self._table.hung_past_expiry()}
        if hung:
            self._table.hand_over_hung(hung, heirs(hung, listing, self._options.owner_id,
                                                   expiration_interval=self._timing.expiration,
                                                   members=self._membership.live(member_listing)))

    def _decide(self, listing: OwnershipListing, member_listing: MemberListing | None,
                partition_ids: list[str]) -> BalanceDecision:
        """Ask the pure balancer what to claim and whom to ask for a handoff."""
        options, source, warmup = self._options, self._options.source, self._warmup
        now = self._clock.monotonic()
        members = self._membership.live(member_listing)
        preferred = warmup.plan(listing, members, self._table.held()) if warmup is not None else None
        return decide(
            listing, partition_ids, options.owner_id,
            fully_qualified_namespace=source.fully_qualified_namespace, eventhub_name=source.eventhub_name,
            consumer_group=options.consumer_group, strategy=options.strategy,
            expiration_interval=self._timing.expiration, rng=self._rng,
            members=members, balance_factor=options.balance_factor, preferred=preferred,
            load_policy=options.load_policy, loads=published_loads(members) if options.balance_by_load else None,
            handoff_timeout=options.handoff_timeout,
            requests_made={pid: now - at for pid, at in self.requests_made.items()},
            replica_count=options.replica_count,
        )

    def _below_ceiling(self, decision: BalanceDecision) -> Callable[[], Awaitable[bool]] | None:
        """Between a tick's batches of claims, whether to go on, by the members listed again
        (one small request). The first of a group starting together to list sees a few and
        would claim ``P / few``, which the others take back by handoffs: it stops once more
        members are live than it planned with (and plans again at once), or at the plan's
        ceiling. None when the plan is not by counts alone (docs/concepts/balancing.md)."""
        if decision.ceiling is None or not self._options.plans_by_counts or self._membership.state is not True:
            return None
        scope, owner_id, ceiling = self._options.scope, self._options.owner_id, decision.ceiling

        async def below_ceiling() -> bool:
            try:
                with self._store.patient():
                    members = await self._store.list_members(*scope)
            except Exception:  # the plan stands: the tick's own listing read the members
                return True
            joined = len(set(self._membership.live(members) or {}) | {owner_id}) > decision.active_owners
            if joined:
                self._wake.set()  # members joined since the plan: plan again with them, now
            return not joined and len(self._table.held()) < ceiling

        return below_ceiling

    def _claims_to_write(self, decision: BalanceDecision, reconciliation: Reconciliation, snapshot: Snapshot,
                         partition_ids: list[str]) -> tuple[list[Ownership], list[Ownership]]:
        """The claims (above every epoch seen, one batch while backing off, plus reclaims
        after a store lost data) and the adoptions of records that name this processor."""
        held = self._table.held()
        reclaims = [self._history.above_seen(r) for r in reconciliation.reclaim if r.partition_id not in held]
        reclaimed = {r.partition_id for r in reclaims}
        after_loss = self.store_loss.reclaims(reconciliation, snapshot, held | reclaimed, partition_ids)
        # After a store lost data, a tick claims back only what this processor held: its
        # peers get the same chance before anything that looks unowned is claimed as new.
        own_only = after_loss or self.store_loss.claims_own_only
        claims = [] if own_only else [self._history.above_seen(c) for c in decision.claims
                                        if c.partition_id not in held | reclaimed]
        claims += reclaims + after_loss
        adoptions = [r for r in reconciliation.adopt if r.partition_id not in held]
        if self._warmup is not None:
            self._warmup.claiming({r.partition_id for r in claims + adoptions})
        return claims, adoptions

    def _say_won(self, won: list[str], adopted: set[str], decision: BalanceDecision, reclaimed: Iterable[Ownership]
                 ) -> tuple[frozenset[str], dict[str, str]]:
        """One line per partition won, saying how; returns those claimed (not adopted) and those stolen, from whom."""
        table, ended = self._table, {r.partition_id: r.epoch - 1 for r in reclaimed}
        claimed = frozenset(won) - adopted
        self._stats.adopted += len(set(won) & adopted)
        stolen = {pid: owner for pid, owner in decision.stolen_from.items() if pid in claimed}
        expired = set(decision.expired)
        for pid in sorted_ids(won):
            lease = table.get(pid)
            epoch = lease.epoch if lease is not None else 0
            if pid in adopted:
                table.changed("adopted", pid, epoch, "the record names this processor (handed over to it, or a "
                                                     "claim whose answer was lost)")
            elif pid in ended:
                table.changed("claimed", pid, epoch, f"the record still named its ended claim (epoch {ended[pid]})")
            elif pid in stolen:
                table.changed("stolen", pid, epoch, f"taken from {stolen[pid]} to balance the load")
            elif pid in expired:
                table.changed("expired", pid, epoch, "its previous owner's record had expired")
            else:
                table.changed("claimed", pid, epoch, "it had no owner")
        return claimed, stolen

    def _empty_report(self, *, error: Exception) -> BalanceReport:
        return BalanceReport(self._table.owned(), frozenset(), frozenset(), {}, frozenset(), frozenset(),
                             requests={}, error=error)

    def records_vanished(self, partition_id: str) -> None:
        """A checkpoint of this processor's claim found its records gone from the store:
        reported, and listed now, so that this processor claims the partition back before
        a peer that never knew its checkpoint takes it as new (:mod:`.store_loss`)."""
        self.store_loss.records_vanished(partition_id)
        self.wake()

    # ----------------------------------------------------------------- handoffs
    async def _ask_for_handoffs(self, decision: BalanceDecision, listing: OwnershipListing) -> None:
        """Mark records as requested by this processor (their owners hand them over), and
        remember when, to steal only if an owner does not answer within handoff_timeout.
        A stateful partition is asked for only once its state is warm here (KIP-441)."""
        requests: Iterable[Ownership] = decision.handoff_requests
        if self._warmup is not None:
            requests = self._warmup.asking(requests, decision.awaiting_handoff, listing)
        pending = set(decision.awaiting_handoff)
        for pid in list(self.requests_made):
            if pid not in pending:
                del self.requests_made[pid]
        asks = list(requests)
        if not asks:
            return
        now = self._clock.monotonic()
        with self._store.patient():
            written = await self._writer.write(asks)
        if not written.answered:
            logger.warning("processor %s: asking for partitions %s failed: %r", self._describe,
                           sorted_ids(r.partition_id for r in asks), written.error)
            return
        for record in written.won:
            self.requests_made.setdefault(record.partition_id, now)
            self._stats.handoffs_requested += 1
        if written.won:
            logger.info("processor %s asked for partitions %s (owners: %s)", self._describe,
                        sorted_ids(r.partition_id for r in written.won), sorted({r.owner_id for r in written.won}))
