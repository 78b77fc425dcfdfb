"""Properties of the claim life cycle and of :func:`eventprocessor._ownership.lease.reconcile`.

``reconcile`` is the one pure function that lines the local leases up with the clock and
a store snapshot. A hypothesis state machine drives real
:class:`~eventprocessor._ownership.lease.Lease` objects through random histories (claims, renewals,
pumps that end, leases that run out, listings that are stale or fresh, records taken,
requested, vanished, gone back or unreadable) and applies what ``reconcile`` says the way
the processor does. After every step:

* a lease whose pump has ended is never renewable, and after reconciling no lease is
  ``OWNED`` or ``HANDING_OFF`` without a live pump;
* no lease is dispatchable past its deadline;
* leases move only along the life cycle (``Lease.move`` refuses anything else);
* a listing sent before a lease's last write was answered never ends that lease;
* records are adopted only when they name this processor, are live, and no active lease
  holds them; handoffs go to the processor that asked.
"""
from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from eventprocessor._ownership.lease import ALLOWED, Lease, LeaseEnd, LeaseState, Snapshot, reconcile
from eventprocessor.stores.records import Ownership

ME = "me"
OTHERS = ["other-1", "other-2"]
PARTITIONS = [str(i) for i in range(4)]
LEASE_LENGTH = 10.0
RENEWAL_AGE = 5.0
EXPIRATION = 12.0
EPOCH_ZERO = datetime(2026, 1, 1, tzinfo=timezone.utc)


class FakePump:
    """What a lease needs of a pump: is it still running?"""

    def __init__(self) -> None:
        self.alive = True
        self.stopped_with: object | None = None

    def stop(self, reason: object) -> None:
        self.stopped_with = reason  # the pump ends later, on its own task


def record(pid: str, owner: str, epoch: int, etag: str, *, requested_by: str = "",
           modified: datetime | None = None) -> Ownership:
    return Ownership("ns", "hub", "$default", pid, owner, last_modified_time=modified or EPOCH_ZERO, etag=etag,
                     epoch=epoch, requested_by=requested_by)


class LifeCycle(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0
        self.leases: dict[str, Lease] = {}
        self.etags = 0
        self.history: list[tuple] = []  # (partition, from, to) of every move

    # ------------------------------------------------------------------ helpers
    def _etag(self) -> str:
        self.etags += 1
        return f"e{self.etags}"

    def _move(self, lease: Lease, to: LeaseState) -> None:
        before = lease.state
        lease.move(to)  # raises on a move the life cycle does not allow
        self.history.append((lease.partition_id, before, to))

    def _apply(self, snapshot: Snapshot | None) -> None:
        """Carry out reconcile's result the way EventProcessor._reconcile does."""
        views = [lease.view() for lease in self.leases.values()]
        result = reconcile(views, now=self.now, owner_id=ME, snapshot=snapshot, expiration=EXPIRATION)
        again = reconcile(views, now=self.now, owner_id=ME, snapshot=snapshot, expiration=EXPIRATION)
        assert result == again, "reconcile is not a function of its inputs"
        by_pid = {view.partition_id: view for view in views}
        for transition in result.transitions:
            view = by_pid[transition.partition_id]
            lease = self.leases[transition.partition_id]
            assert transition.to in ALLOWED[view.state], (view.state, transition)
            if snapshot is not None and view.confirmed_at > snapshot.sent_at and not view.lost:
                # a listing older than our last answered write cannot end the lease
                assert transition.end not in (LeaseEnd.LOST, LeaseEnd.STORE_LOST), (view, transition)
            if transition.to is LeaseState.HANDING_OFF:
                requested = snapshot.records[transition.partition_id].requested_by if snapshot else ""
                assert requested and transition.release_to == requested
                assert view.pump_alive and view.state is LeaseState.OWNED
            if transition.end is LeaseEnd.EXPIRED:
                assert self.now >= view.deadline
            if transition.to is LeaseState.RELEASED:
                assert not view.pump_alive
            self._move(lease, transition.to)
            if transition.to is LeaseState.RELEASED:
                del self.leases[transition.partition_id]
            else:
                lease.end = transition.end
                if lease.pump is not None:
                    lease.pump.stop(transition.end)
        for refreshed in result.refresh:
            lease = self.leases[refreshed.partition_id]
            assert refreshed.owner_id == ME and refreshed.epoch == lease.epoch
            lease.record = replace(lease.record, etag=refreshed.etag, requested_by=refreshed.requested_by)
        for adopted in result.adopt:
            assert snapshot is not None and adopted.owner_id == ME
            held = self.leases.get(adopted.partition_id)
            assert held is None or held.state is LeaseState.RELEASED
            assert (snapshot.server_time - adopted.last_modified_time).total_seconds() <= EXPIRATION
        if snapshot is not None:
            assert set(result.store_lost) <= {t.partition_id for t in result.transitions
                                              if t.end is LeaseEnd.STORE_LOST}

    # ------------------------------------------------------------------ rules
    @rule(pid=st.sampled_from(PARTITIONS), epoch=st.integers(1, 5))
    def claim(self, pid: str, epoch: int) -> None:
        """A claim is won and fenced: CLAIMING, then OWNED with a live pump."""
        if pid in self.leases:
            return
        lease = Lease(record(pid, ME, epoch, self._etag()), now=self.now)
        self.leases[pid] = lease
        lease.confirm(lease.record, sent_at=self.now, answered_at=self.now, lease_length=LEASE_LENGTH,
                      renewal_age=RENEWAL_AGE)
        lease.pump = FakePump()  # type: ignore[assignment]
        self._move(lease, LeaseState.OWNED)

    @rule(seconds=st.floats(0.0, 8.0))
    def time_passes(self, seconds: float) -> None:
        self.now += seconds

    @rule(pid=st.sampled_from(PARTITIONS))
    def renew(self, pid: str) -> None:
        """The renewer rewrites a record only while the lease is renewable."""
        lease = self.leases.get(pid)
        if lease is None or not lease.renewable(self.now):
            return
        assert lease.pump_alive, "a lease whose pump ended was about to be renewed"
        lease.confirm(replace(lease.record, etag=self._etag()), sent_at=self.now, answered_at=self.now + 0.1,
                      lease_length=LEASE_LENGTH, renewal_age=RENEWAL_AGE)

    @rule(pid=st.sampled_from(PARTITIONS))
    def pump_ends(self, pid: str) -> None:
        lease = self.leases.get(pid)
        if lease is not None and lease.pump is not None:
            lease.pump.alive = False  # type: ignore[misc]

    @rule(pid=st.sampled_from(PARTITIONS))
    def receiver_finds_another_owner(self, pid: str) -> None:
        lease = self.leases.get(pid)
        if lease is not None:
            lease.lost = True

    @rule()
    def keeper_tick(self) -> None:
        """The lease keeper reconciles with the clock alone."""
        self._apply(None)

    @rule(data=st.data(), age=st.floats(-2.0, 6.0))
    def listing(self, data: st.DataObject, age: float) -> None:
        """A listing arrives. ``age``: how long before now it was sent (negative values
        are clamped: a listing is never sent in the future)."""
        sent_at = max(0.0, self.now - max(age, 0.0))
        server_time = EPOCH_ZERO + timedelta(seconds=self.now + 1000)
        records: dict[str, Ownership] = {}
        unreadable = set()
        for pid in PARTITIONS:
            lease = self.leases.get(pid)
            kind = data.draw(st.sampled_from(
                ["same", "same", "requested", "other", "higher", "lower", "gone", "unreadable", "mine-fresh",
                 "mine-expired", "released"]), label=f"record {pid}")
            epoch = lease.epoch if lease is not None else data.draw(st.integers(1, 5), label=f"epoch {pid}")
            etag = lease.record.etag if lease is not None else self._etag()
            fresh = server_time - timedelta(seconds=1)
            if kind == "same":
                records[pid] = record(pid, ME, epoch, etag or "x", modified=fresh)
            elif kind == "requested":
                records[pid] = record(pid, ME, epoch, self._etag(), requested_by=data.draw(st.sampled_from(OTHERS)),
                                      modified=fresh)
            elif kind == "other":
                records[pid] = record(pid, data.draw(st.sampled_from(OTHERS)), epoch + 1, self._etag(), modified=fresh)
            elif kind == "higher":
                records[pid] = record(pid, ME, epoch + 1, self._etag(), modified=fresh)
            elif kind == "lower":
                records[pid] = record(pid, ME, max(epoch - 1, 0), self._etag(), modified=fresh)
            elif kind == "unreadable":
                unreadable.add(pid)
            elif kind == "mine-fresh":
                records[pid] = record(pid, ME, epoch, self._etag(), modified=fresh)
            elif kind == "mine-expired":
                records[pid] = record(pid, ME, epoch, self._etag(),
                                      modified=server_time - timedelta(seconds=EXPIRATION + 5))
            elif kind == "released":
                records[pid] = record(pid, "", epoch, self._etag(), modified=fresh)
        self._apply(Snapshot(records=records, server_time=server_time, sent_at=sent_at,
                             unreadable=frozenset(unreadable)))

    # ------------------------------------------------------------------ invariants
    @invariant()
    def no_renewal_without_a_live_pump(self) -> None:
        for lease in self.leases.values():
            if lease.renewable(self.now):
                assert lease.pump_alive and not lease.lost
                assert lease.state in (LeaseState.OWNED, LeaseState.HANDING_OFF)

    @invariant()
    def nothing_dispatchable_past_its_deadline_or_without_ownership(self) -> None:
        for lease in self.leases.values():
            if lease.dispatchable(self.now):
                assert lease.state is LeaseState.OWNED and self.now < lease.deadline

    @invariant()
    def only_moves_of_the_life_cycle(self) -> None:
        for _pid, before, after in self.history:
            assert after in ALLOWED[before]

    @precondition(lambda self: bool(self.leases))
    @invariant()
    def after_reconciling_no_owned_lease_without_a_live_pump(self) -> None:
        # Reconcile with the clock alone, then check: what the keeper would leave behind.
        probe = reconcile([lease.view() for lease in self.leases.values()], now=self.now, owner_id=ME)
        ending = {t.partition_id for t in probe.transitions}
        for pid, lease in self.leases.items():
            if lease.state in (LeaseState.OWNED, LeaseState.HANDING_OFF) and (not lease.pump_alive or lease.lost
                                                                             or self.now >= lease.deadline):
                assert pid in ending, f"{lease} would stay {lease.state.value} without a live, valid claim"


TestLifeCycle = LifeCycle.TestCase
TestLifeCycle.settings = settings(max_examples=300, stateful_step_count=40, deadline=None, derandomize=True,
                                  database=None, suppress_health_check=list(HealthCheck))


def test_a_lease_past_its_deadline_or_without_a_pump_ends_and_is_released_only_once_the_pump_is_gone():
    lease = Lease(record("0", ME, 1, "a"), now=0.0)
    lease.confirm(lease.record, sent_at=0.0, answered_at=0.0, lease_length=LEASE_LENGTH, renewal_age=RENEWAL_AGE)
    pump = FakePump()
    lease.pump = pump  # type: ignore[assignment]
    lease.move(LeaseState.OWNED)
    [expired] = reconcile([lease.view()], now=LEASE_LENGTH, owner_id=ME).transitions
    assert (expired.to, expired.end, expired.release_to) == (LeaseState.RELEASING, LeaseEnd.EXPIRED, None)
    lease.move(LeaseState.RELEASING)
    assert reconcile([lease.view()], now=LEASE_LENGTH, owner_id=ME).transitions == ()  # pump still running
    pump.alive = False
    [released] = reconcile([lease.view()], now=LEASE_LENGTH, owner_id=ME).transitions
    assert released.to is LeaseState.RELEASED


def test_a_pump_that_ends_while_the_lease_is_valid_releases_the_record_to_nobody():
    lease = Lease(record("0", ME, 1, "a"), now=0.0)
    lease.confirm(lease.record, sent_at=0.0, answered_at=0.0, lease_length=LEASE_LENGTH, renewal_age=RENEWAL_AGE)
    pump = FakePump()
    lease.pump = pump  # type: ignore[assignment]
    lease.move(LeaseState.OWNED)
    pump.alive = False
    assert not lease.renewable(1.0)
    [ended] = reconcile([lease.view()], now=1.0, owner_id=ME).transitions
    assert (ended.to, ended.end, ended.release_to) == (LeaseState.RELEASING, LeaseEnd.PUMP_ENDED, "")


def test_a_record_that_still_names_an_ended_claim_is_claimed_above_its_epoch_never_adopted_at_it():
    """A lease that ran out while the processor's heartbeat kept its record live: the
    record still names the processor at the ended claim's epoch. Resuming at that epoch
    would hand a batch to the ended claim's fence again; the record is claimed anew, one
    epoch up, conditional on its etag. A record naming it at a later epoch (a handoff to
    it, a claim whose answer was lost) is adopted as before."""
    snapshot = Snapshot(records={"0": record("0", ME, 3, "a", requested_by="other-1"), "1": record("1", ME, 5, "b")},
                        server_time=EPOCH_ZERO, sent_at=0.0)
    result = reconcile([], now=1.0, owner_id=ME, snapshot=snapshot, expiration=EXPIRATION,
                       ended_epochs={"0": 3, "1": 4})
    assert [(r.partition_id, r.epoch) for r in result.adopt] == [("1", 5)]
    [again] = result.reclaim
    assert (again.partition_id, again.owner_id, again.epoch, again.etag, again.requested_by) == ("0", ME, 4, "a", "")
    plain = reconcile([], now=1.0, owner_id=ME, snapshot=snapshot, expiration=EXPIRATION)
    assert [r.partition_id for r in plain.adopt] == ["0", "1"] and plain.reclaim == ()
