"""Each part of the processor on its own: the task scope, the ownership
writer, the lease table, the store history, the releaser, membership, the dispatcher's
drain at stop, the watchdog's arithmetic, the reporter's throttle, the taker's halt and
the assembly that wires them. The processor tests cover them together; these
say what each promises alone. Virtual time, the in-memory store."""
from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest

from eventprocessor import EventPosition, FailurePolicy, LoadPolicy
from eventprocessor._assembly import assemble
from eventprocessor._delivery.dispatcher import Dispatcher
from eventprocessor._delivery.watchdog import Watchdog
from eventprocessor._ownership.lease import LeaseEnd, LeaseState, Snapshot
from eventprocessor._ownership.lease_table import LeaseTable
from eventprocessor._ownership.load_plan import LOAD_PROPERTY, decode_load
from eventprocessor._ownership.membership import Membership
from eventprocessor._ownership.releaser import Releaser
from eventprocessor._ownership.store_history import StoreHistory, went_back
from eventprocessor._ownership.writer import OwnershipWriter
from eventprocessor._runtime.options import ProcessorOptions
from eventprocessor._runtime.reporting import Reporter, Throttle
from eventprocessor._runtime.stats import ProcessorStats
from eventprocessor._runtime.tasks import TaskScope
from eventprocessor._runtime.telemetry import Telemetry
from eventprocessor._runtime.timing import Timing
from eventprocessor.errors import CheckpointStoreError, ConfigurationError
from eventprocessor.partition import PartitionProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import Checkpoint, Member, MemberListing, Ownership, OwnershipListing
from eventprocessor.testing import VIRTUAL_EPOCH, FaultyStore, run_virtual, virtual_utc_clock

SCOPE = ("memory.local", "hub", "$default")
TIMING = Timing.derive(interval=1.0, expiration=12.0, renewal_age=None, store_timeout=None, shutdown_timeout=5.0,
                       handler_timeout=None)


class LoopClock:
    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def record(pid: str, owner: str = "me", epoch: int = 1, etag=None) -> Ownership:
    return Ownership(*SCOPE, pid, owner, epoch=epoch, etag=etag)


def table(released: list = None, **kwargs) -> LeaseTable:
    return LeaseTable(owner_id="me", eventhub_name="hub", consumer_group="$default", describe="me", clock=LoopClock(),
                      timing=TIMING, stats=ProcessorStats(), telemetry=Telemetry(eventhub_name="hub",
                      consumer_group="$default", owner_id="me"),
                      on_released=(released.extend if released is not None else lambda leases: None),
                      on_refreshed=lambda: None, **kwargs)


# ----------------------------------------------------------------------------- TaskScope
def test_a_task_scope_awaits_or_cancels_every_task_it_started():
    async def scenario():
        scope = TaskScope("t")
        ran: list[str] = []

        async def forever(name):
            try:
                await asyncio.Event().wait()
            finally:
                ran.append(name)

        async def job():
            await asyncio.sleep(1)
            ran.append("job")

        scope.start_loop("a", forever("a"))
        with pytest.raises(RuntimeError, match="already running"):
            scope.start_loop("a", forever("again"))
        scope.spawn("write", job())
        await scope.wait_for("write")
        assert ran == ["job"] and scope.running("a")
        await scope.stop_loop("a")
        assert ran == ["job", "a"] and not scope.running("a")
        scope.start_loop("b", forever("b"))
        scope.spawn("write", forever("c"))
        await asyncio.sleep(0)  # both started
        await scope.close()
        return ran, [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    ran, left = run_virtual(scenario())
    assert sorted(ran) == ["a", "b", "c", "job"] and left == []


# ----------------------------------------------------------------------------- OwnershipWriter
def test_the_writer_tells_won_lost_and_failed_apart():
    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        store = FaultyStore(memory)
        writer = OwnershipWriter(store)
        won = await writer.write([record("0"), record("1")])
        assert won.won_ids == {"0", "1"} and not won.lost and not won.failed and won.answered
        stale = await writer.write([record("0")])  # create-if-absent on a record that exists: lost
        assert stale.lost == {"0"} and not stale.won and stale.error is None
        store.down = True
        failed = await writer.write([won.by_partition()["1"]])
        assert not failed.answered and set(failed.failed) == {"1"}
        assert isinstance(failed.error, CheckpointStoreError)
        assert (await writer.write([])).won == []

    run_virtual(scenario())


# ----------------------------------------------------------------------------- LeaseTable
def test_the_lease_table_follows_one_claim_through_its_life(caplog):
    released: list = []

    async def scenario():
        leases = table(released)
        lease = leases.claiming(record("3"))
        assert leases.states() == {"3": LeaseState.CLAIMING} and leases.owned() == frozenset()
        now = asyncio.get_running_loop().time()
        leases.confirm(lease, replace(record("3"), etag="e1"), sent_at=now, answered_at=now)
        assert lease.deadline == now + TIMING.lease_length and lease.renew_at == now + TIMING.renewal_age

        class Pump:  # what the table needs of a pump
            alive = True
            stopped = None

            def stop(self, reason):
                Pump.stopped = reason

        leases.started(lease, Pump())
        assert leases.owned() == {"3"}
        leases.end(lease, LeaseEnd.SHUTDOWN, "stopping", release_to="")
        assert lease.state is LeaseState.RELEASING and Pump.stopped is not None
        Pump.alive = False
        leases.reconcile()
        return leases

    with caplog.at_level(logging.INFO, logger="eventprocessor"):
        leases = run_virtual(scenario())
    assert len(leases) == 0 and [load.partition_id for load in released] == ["3"]
    assert [getattr(r, "eventprocessor.reason") for r in caplog.records if hasattr(r, "eventprocessor.reason")] == \
        ["released"]


def test_a_lease_that_is_not_renewed_self_fences_at_its_deadline():
    async def scenario():
        leases = table()
        lease = leases.claiming(record("0"))
        now = asyncio.get_running_loop().time()
        leases.confirm(lease, record("0"), sent_at=now, answered_at=now)

        class Pump:
            alive = True

            def stop(self, reason):
                self.reason = reason

        leases.started(lease, Pump())
        await asyncio.sleep(TIMING.lease_length)
        leases.reconcile()
        return lease

    lease = run_virtual(scenario())
    assert lease.state is LeaseState.RELEASING and lease.end is LeaseEnd.EXPIRED


class _Pump:
    """What the table needs of a pump."""

    def __init__(self):
        self.alive, self.reason = True, None

    def stop(self, reason):
        self.reason = reason


def _owning_with_requests(leases: LeaseTable, pids) -> tuple:
    """Leases of ``pids`` confirmed and pumping now, their pumps, and a function that
    lists their records each with a handoff request (a newer etag)."""
    loop = asyncio.get_running_loop()
    pumps = {}
    for pid in pids:
        lease = leases.claiming(record(pid, etag="e0"))
        leases.confirm(lease, record(pid, etag="e0"), sent_at=loop.time(), answered_at=loop.time())
        leases.started(lease, pumps.setdefault(pid, _Pump()))
    asked = {pid: replace(record(pid, etag="e1"), requested_by=f"taker-{pid}") for pid in pids}
    return pumps, lambda: Snapshot(records=asked, server_time=datetime.now(timezone.utc), sent_at=loop.time())


def test_a_paced_lease_table_answers_one_handoff_request_per_interval_after_the_last_one_was_written():
    """Balancing by load, every planner ticks on its own, so two of them can ask one busy
    processor for a partition within one interval (recorded by benchmarks.load: 2 moves
    out of one process in one interval). Paced at (1, interval), the table answers one
    request; the other keeps its request (and the record's etag) until one interval after
    the first handoff's record was written."""
    released: list = []

    async def scenario():
        loop = asyncio.get_running_loop()
        leases = table(released, handoff_pace=(1, TIMING.interval))
        pumps, snapshot = _owning_with_requests(leases, ("0", "1"))
        await asyncio.sleep(0.1)
        leases.reconcile(snapshot())
        first = leases.states()
        assert leases.handoffs_allowed(loop.time()) == 0
        handing = next(pid for pid, state in first.items() if state is LeaseState.HANDING_OFF)
        waiting = "1" if handing == "0" else "0"
        assert leases.get(waiting).record.etag == "e1" and leases.get(waiting).record.requested_by  # kept
        pumps[handing].alive = False
        leases.reconcile(snapshot())  # the pump is gone: released, its record to be written
        assert [load.partition_id for load in released] == [handing] and leases.handoffs_allowed(loop.time()) == 0
        await asyncio.sleep(0.5)
        leases.reconcile(snapshot())  # still being written: the other waits
        second = leases.get(waiting).state
        leases.handoff_written()
        written_at = loop.time()
        await asyncio.sleep(TIMING.interval * 0.9)
        leases.reconcile(snapshot())
        third = leases.get(waiting).state
        await asyncio.sleep(TIMING.interval * 0.2)
        leases.reconcile(snapshot())
        return first, second, third, leases.get(waiting).state, loop.time() - written_at

    first, second, third, last, after = run_virtual(scenario())
    assert sorted(first.values(), key=str) == sorted([LeaseState.HANDING_OFF, LeaseState.OWNED], key=str)
    assert second is LeaseState.OWNED and third is LeaseState.OWNED
    assert last is LeaseState.HANDING_OFF and after >= TIMING.interval


def test_an_unpaced_lease_table_answers_every_handoff_request_at_once():
    async def scenario():
        leases = table()
        _pumps, snapshot = _owning_with_requests(leases, ("0", "1"))
        await asyncio.sleep(0.1)
        leases.reconcile(snapshot())
        return leases.states(), leases.handoffs_allowed(asyncio.get_running_loop().time())

    states, allowed = run_virtual(scenario())
    assert set(states.values()) == {LeaseState.HANDING_OFF} and allowed is None


# ----------------------------------------------------------------------------- StoreHistory
def test_the_store_history_reports_vanished_records_and_epochs_that_went_down_once():
    history = StoreHistory()
    listing = OwnershipListing(ownerships=(record("0", epoch=3), record("1", epoch=2)), server_time=VIRTUAL_EPOCH)
    assert history.check(listing, history.epochs(), held=set(), ended_at={}, now=0, expiration=12) is None
    assert history.above_seen(record("0", epoch=1)).epoch == 4
    later = OwnershipListing(ownerships=(record("0", epoch=1),), server_time=VIRTUAL_EPOCH)
    what, partitions = history.check(later, history.epochs(), held={"1"}, ended_at={}, now=0, expiration=12)
    assert partitions == ["1", "0"] and "vanished" in what and "went backwards" in what
    assert history.lost_mine == {"1"}
    assert history.check(later, history.epochs(), held=set(), ended_at={}, now=0, expiration=12) is None
    assert history.above_seen(record("0", epoch=1)).epoch == 4  # epochs seen never go down


def test_a_checkpoint_known_is_missed_when_it_vanishes_or_comes_back_older():
    known = Checkpoint(*SCOPE, "0", sequence_number=10, offset="10", owner_id="me", epoch=4)
    assert went_back(known, None) and went_back(known, replace(known, epoch=3))
    assert not went_back(known, replace(known, epoch=5, sequence_number=2))  # a later owner may rewind
    history = StoreHistory()
    history.knew("0", known)
    assert history.checkpoint_went_back("0", None) is known
    assert history.checkpoint_went_back("0", known) is None


# ----------------------------------------------------------------------------- Releaser
def test_a_release_is_written_once_and_a_handoff_with_the_next_epoch():
    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        won = {r.partition_id: r for r in await memory.claim_ownership([record("0"), record("1")])}
        leases, history, stats, scope = table(), StoreHistory(), ProcessorStats(), TaskScope("t")
        options = _options(memory)
        releaser = Releaser(options=options, store=memory, writer=OwnershipWriter(memory), table=leases,
                            history=history, stats=stats, scope=scope, describe="me")
        lease0, lease1 = leases.claiming(won["0"]), leases.claiming(won["1"])
        lease0.release_to, lease1.release_to = "", "other"
        releaser.schedule([lease0, lease1])
        await releaser.wait()
        await releaser.write([lease0])  # release_to was cleared: nothing is written twice
        listing = await memory.list_ownership(*SCOPE)
        return {r.partition_id: (r.owner_id, r.epoch) for r in listing.ownerships}, stats

    stored, stats = run_virtual(scenario())
    assert stored == {"0": ("", 1), "1": ("other", 2)}
    assert (stats.released, stats.handed_off) == (1, 1)


def _options(store, *, source=None, factory=PartitionProcessor, **overrides) -> ProcessorOptions:
    return ProcessorOptions.validate(
        source or InMemoryEventSource(2), store, factory, consumer_group="$default", owner_id="me",
        load_balancing_strategy="greedy", load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0,
        ownership_renewal_age=None, store_timeout=None, shutdown_timeout=5.0, handler_timeout=None,
        handler_executor=None, initial_event_position=EventPosition.earliest(), max_batch_size=10,
        max_wait_time=None, prefetch=10, track_last_enqueued_event_properties=False,
        default_event_position=EventPosition.earliest(), override_checkpoints=False,
        failure_policy=FailurePolicy(), refuse_checkpoint_rewind=False, handoff_timeout=30.0, balance_factor=1,
        ordinal=None, replica_count=None, clock=LoopClock(), rng=random.Random(0),
        **{"error_handler": None, "load_policy": None, "stateful": False, **overrides})


# ----------------------------------------------------------------------------- Membership
def test_membership_counts_members_heard_from_within_half_the_expiration():
    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        reporter = Reporter(describe="me", clock=LoopClock(), period=30, error_handler=None, table=table(),
                            scope=TaskScope("t"))
        membership = Membership(options=_options(memory), store=memory, reporter=reporter, describe="me",
                                on_fatal=lambda error: None, table=table())
        assert membership.live(None) is None  # not joined yet: nobody is counted
        await membership.join()
        now = VIRTUAL_EPOCH + timedelta(seconds=asyncio.get_running_loop().time())
        listing = MemberListing(members=(Member(*SCOPE, "me", last_modified_time=now),
                                         Member(*SCOPE, "old", last_modified_time=now - timedelta(seconds=7))),
                                server_time=now)
        live = membership.live(listing)
        await membership.leave()
        return live, membership.state, (await memory.list_members(*SCOPE)).members

    live, state, left = run_virtual(scenario())
    assert set(live) == {"me"} and state is None and left == ()


# ----------------------------------------------------------------------------- Watchdog and Reporter
def test_the_watchdog_names_the_leases_a_stall_ran_out_and_those_it_delayed():
    async def scenario():
        leases = table()
        reporter = Reporter(describe="me", clock=LoopClock(), period=30, error_handler=None, table=leases,
                            scope=TaskScope("t"))
        watchdog = Watchdog(table=leases, pumps=lambda: [], clock=LoopClock(), timing=TIMING, reporter=reporter,
                            telemetry=Telemetry(eventhub_name="hub", consumer_group="$default", owner_id="me"),
                            describe="me")

        class Pump:
            alive = True

            def stop(self, reason):
                pass

        for pid, age in (("0", 0.0), ("1", TIMING.lease_length - 1.0)):
            lease = leases.claiming(record(pid))
            leases.confirm(lease, record(pid), sent_at=-age, answered_at=-age)
            leases.started(lease, Pump())
        return watchdog.leases_hit(0.0, 2.0), watchdog.leases_hit(TIMING.renewal_age - 1, TIMING.renewal_age + 1)

    short, long = run_virtual(scenario())
    assert short == (["1"], [])  # partition 1's lease ended 1 s into the stall
    assert long == ([], ["0"])  # partition 0's renewal came due during it


def test_the_throttle_reports_a_recurring_failure_once_per_period_and_says_when_it_ended():
    async def scenario():
        throttle = Throttle(LoopClock(), period=30)
        first = throttle.failed("store")
        await asyncio.sleep(10)
        again = throttle.failed("store")
        await asyncio.sleep(25)
        later = throttle.failed("store")
        return first, again, later, throttle.recovered("store"), throttle.recovered("store")

    assert run_virtual(scenario()) == ((True, 0), (False, 1), (True, 1), 1, None)


def test_the_final_sweep_releases_what_names_this_processor_within_its_bound_or_not_at_all(caplog):
    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        store = FaultyStore(memory)
        await memory.claim_ownership([record("0"), record("1", owner="other")])
        releaser = Releaser(options=_options(store), store=store, writer=OwnershipWriter(store), table=table(),
                            history=StoreHistory(), stats=ProcessorStats(), scope=TaskScope("t"), describe="me")
        await releaser.sweep(set(), within=0.0)  # no time left: nothing is listed or written
        untouched = {r.partition_id: r.owner_id for r in (await memory.list_ownership(*SCOPE)).ownerships}
        store.hang = True
        started = asyncio.get_running_loop().time()
        await releaser.sweep(set(), within=3.0)
        waited = asyncio.get_running_loop().time() - started
        store.hang = False
        await releaser.sweep(set(), within=3.0)
        swept = {r.partition_id: r.owner_id for r in (await memory.list_ownership(*SCOPE)).ownerships}
        return untouched, waited, swept, store.calls

    with caplog.at_level(logging.WARNING, logger="eventprocessor"):
        untouched, waited, swept, calls = run_virtual(scenario())
    assert untouched == {"0": "me", "1": "other"}
    assert waited == pytest.approx(3.0) and "did not finish within stop()'s bound" in caplog.text
    assert swept == {"0": "", "1": "other"}


# ----------------------------------------------------------------------------- Membership, Dispatcher, Taker
def test_a_member_record_carries_the_measured_load_when_balancing_by_load():
    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        reporter = Reporter(describe="me", clock=LoopClock(), period=30, error_handler=None, table=table(),
                            scope=TaskScope("t"))

        def member(**overrides):
            return Membership(options=_options(memory, **overrides), store=memory, reporter=reporter, describe="me",
                              on_fatal=lambda error: None, table=table()).record().properties

        return member(), member(load_policy=LoadPolicy(meter=lambda: 0.25))

    by_count, by_load = run_virtual(scenario())
    assert LOAD_PROPERTY not in by_count
    assert decode_load(by_load[LOAD_PROPERTY]).utilization == pytest.approx(0.25)


def test_the_dispatcher_drains_pumps_at_stop_and_leaves_the_records_of_hung_ones_to_expire(caplog):
    class HangsOnPartitionOne(PartitionProcessor):  # a handler that never returns on one partition
        async def process_events(self, events, context):
            if context.partition_id == "1":
                await asyncio.sleep(1e9)

    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        source = InMemoryEventSource(2)
        for pid in ("0", "1"):
            await source.send("event", partition_id=pid)
        leases = table()
        reporter = Reporter(describe="me", clock=LoopClock(), period=30, error_handler=None, table=leases,
                            scope=TaskScope("t"))
        dispatcher = Dispatcher(
            options=_options(memory, source=source, factory=HangsOnPartitionOne), store=memory, table=leases,
            history=StoreHistory(), reporter=reporter,
            telemetry=Telemetry(eventhub_name="hub", consumer_group="$default", owner_id="me"), describe="me",
            on_loop_blocked=lambda *args: None, on_pump_ended=lambda: None, on_fatal=lambda error: None,
            on_started=lambda: None)
        for pid in ("0", "1"):
            lease = leases.claiming(record(pid))
            now = asyncio.get_running_loop().time()
            leases.confirm(lease, record(pid), sent_at=now, answered_at=now)
            dispatcher.start(lease, None)
        await asyncio.sleep(1.0)  # partition 1's handler is in its batch
        pumps = {pid: dispatcher.pump(pid) for pid in ("0", "1")}
        assert pumps["1"].dispatching and not pumps["0"].dispatching
        leases.end_all(release=True)
        started = asyncio.get_running_loop().time()
        left = await dispatcher.drain(5.0)
        return left, asyncio.get_running_loop().time() - started, leases, pumps

    with caplog.at_level(logging.ERROR, logger="eventprocessor"):
        left, waited, leases, pumps = run_virtual(scenario())
    assert left == {"1"} and waited == pytest.approx(5.0)
    assert not pumps["0"].alive and not pumps["1"].alive
    assert leases.get("0").release_to == "" and leases.get("1").release_to is None  # "1" is left to expire
    assert "['1'] did not finish within shutdown_timeout=5 s" in caplog.text


def test_assemble_wires_every_part_to_one_table_store_and_scope_and_a_halt_stops_the_taker_once(caplog):
    async def scenario():
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        parts = assemble(_options(memory), memory)
        assert parts.store.inner is memory
        # table -> releaser -> store: a claim that ends with its pump gone is released.
        won = (await memory.claim_ownership([record("0")]))[0]
        lease = parts.table.claiming(won)
        now = asyncio.get_running_loop().time()
        parts.table.confirm(lease, won, sent_at=now, answered_at=now)
        pump = SimpleNamespace(alive=True, stop=lambda reason: None)
        parts.table.started(lease, pump)
        parts.table.end(lease, LeaseEnd.SHUTDOWN, "stopping", release_to="")
        pump.alive = False
        parts.table.reconcile()
        await parts.releaser.wait()
        released = {r.partition_id: r.owner_id for r in (await memory.list_ownership(*SCOPE)).ownerships}
        parts.taker.halt(ConfigurationError("the factory makes no PartitionProcessor"))
        parts.taker.halt(ConfigurationError("a second error"))
        await asyncio.wait_for(parts.taker.run(), 1.0)  # halted: returns at once
        await parts.scope.close()
        return released, parts.taker.fatal

    with caplog.at_level(logging.ERROR, logger="eventprocessor"):
        released, fatal = run_virtual(scenario())
    assert released == {"0": ""}
    assert str(fatal) == "the factory makes no PartitionProcessor" and "a second error" not in caplog.text
