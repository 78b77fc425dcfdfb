"""Store and handler faults, each as a test on virtual time with real processors, the real
in-memory store and real faults injected around it (``tests/faults.py``).

The same scenarios run against Azurite through a TCP fault proxy in
``tests/test_faults_azurite.py``.
"""
from __future__ import annotations

import asyncio
import logging
import os

import pytest

from eventprocessor import CloseReason, EventProcessor, PartitionProcessor, StoreDataLostError
from eventprocessor._ownership.lease import LeaseState
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import Cluster, run_virtual

QUICK = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0)


def test_slow_store_for_20_s_then_normal_leaves_no_partition_owned_without_a_live_pump():
    """Every store call delayed 1.5 s for 20 s: a lease whose pump has ended must not be
    renewed, or its events are never processed."""

    async def scenario():
        cluster = Cluster(8, seed=11, work=0.05, **QUICK)
        a, b = cluster.add(), cluster.add()
        await a.start()
        await b.start()
        producer = asyncio.ensure_future(cluster.produce_for(80, rate=40))
        await cluster.wait_until(lambda: cluster.settled([a, b]), timeout=30)
        cluster.store.latency = 1.5
        await asyncio.sleep(20)
        cluster.store.clear()
        await producer
        healed = await cluster.wait_until(lambda: cluster.settled([a, b]), timeout=60)
        owners = cluster.live_pumps()
        await a.stop()
        await b.stop()
        return cluster, healed, owners

    cluster, healed, owners = run_virtual(scenario())
    assert healed is not None, f"not every partition had one live pump and every event processed: {dict(owners)}"
    assert set(cluster.produced) <= cluster.ledger.processed()
    assert len(cluster.produced) > 3000


def test_a_pump_that_ends_on_its_own_releases_its_lease_and_is_never_renewed():
    """After a pump ends, the lease is released (not renewed)
    and the partition is dispatched again at once."""

    async def scenario():
        cluster = Cluster(4, seed=3, **QUICK)
        a = cluster.add(load_balancing_strategy="greedy")
        await a.start()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 4, timeout=10)
        victim = a.pump("2")
        epoch_before = victim.context.epoch
        victim.task.cancel()  # the pump dies for a reason of its own
        await asyncio.sleep(0)
        renewals_before = a.stats.renewals
        back = await cluster.wait_until(lambda: a.pump("2") is not None and a.pump("2") is not victim
                                        and a.pump("2").alive, timeout=5)
        listing = await cluster.memory.list_ownership("memory.local", "hub", "$default")
        record = {r.partition_id: r for r in listing.ownerships}["2"]
        await a.stop()
        return back, epoch_before, record, renewals_before

    back, epoch_before, record, _ = run_virtual(scenario())
    assert back is not None and back <= 5 + 2.0  # within about one tick
    assert record.epoch > epoch_before  # released and claimed again: a new claim, not a renewal


def test_listing_slower_than_the_interval_is_logged_and_never_costs_a_lease(caplog):
    """Ticks overran the renewal window and nothing was logged. Now renewals run
    apart from ticks, and an overrun is a WARNING naming duration, interval, expiration."""

    async def scenario():
        cluster = Cluster(16, seed=5, load_balancing_interval=1.0, partition_ownership_expiration_interval=30.0,
                          load_balancing_strategy="greedy", ownership_renewal="partition")
        a = cluster.add()
        await a.start()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 16, timeout=10)
        cluster.store.only = {"list_ownership"}
        cluster.store.latency = 4.0  # every listing takes 4 intervals
        fenced: list[float] = []
        loop = asyncio.get_running_loop()
        for _ in range(600):  # 5 minutes, ten expirations
            await asyncio.sleep(0.5)
            if len(a.owned_partitions) < 16:
                fenced.append(loop.time())
        overruns = a.overruns
        renewals = a.stats.renewals
        await a.stop()
        return fenced, overruns, renewals

    with caplog.at_level(logging.WARNING, logger="eventprocessor"):
        fenced, overruns, renewals = run_virtual(scenario())
    assert fenced == []
    assert overruns > 10
    assert renewals >= 16 * 9  # every lease renewed every 15 s throughout
    warning = next(r.getMessage() for r in caplog.records if "tick took" in r.getMessage())
    assert "load_balancing_interval=1 s" in warning and "expiration 30 s" in warning


def test_stop_returns_within_shutdown_timeout_when_a_handler_never_returns():
    """``process_events`` that never returns for one partition made ``stop()``
    hang forever."""

    closes = []

    class Hangs(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "0":
                await asyncio.Event().wait()

        async def close(self, reason, context):
            closes.append((context.partition_id, reason))

    async def scenario():
        cluster = Cluster(2, **QUICK)
        p = EventProcessor(cluster.source, cluster.store, Hangs, load_balancing_strategy="greedy",
                           shutdown_timeout=5.0, **QUICK)
        await p.start()
        await cluster.wait_until(lambda: len(p.owned_partitions) == 2, timeout=10)
        await cluster.produce(4)
        await asyncio.sleep(2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await p.stop()
        took = loop.time() - started
        listing = await cluster.memory.list_ownership("memory.local", "hub", "$default")
        return took, p.timing, {r.partition_id: r.owner_id for r in listing.ownerships}

    took, timing, owners = run_virtual(scenario())
    assert took <= timing.shutdown_timeout + timing.store_timeout + 1.0
    assert owners["1"] == ""  # the healthy partition was released at once
    assert owners["0"] != ""  # the hung one was left to expire: its pump may still be running
    assert ("1", CloseReason.SHUTDOWN) in closes


def test_a_handler_slower_than_handler_timeout_is_reported_without_stalling_others(caplog):
    reported = []

    class Slow(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "0":
                await asyncio.sleep(100)

        async def process_error(self, error, context):
            reported.append((context.partition_id, type(error).__name__))

    async def scenario():
        cluster = Cluster(2, **QUICK)
        p = EventProcessor(cluster.source, cluster.store, Slow, load_balancing_strategy="greedy",
                           handler_timeout=10.0, **QUICK)
        await p.start()
        await cluster.wait_until(lambda: len(p.owned_partitions) == 2, timeout=10)
        await cluster.produce(2)
        await asyncio.sleep(12)
        await cluster.produce(2)
        await asyncio.sleep(1)
        other = p.pump("1").events_dispatched
        await p.stop()
        return other

    with caplog.at_level(logging.WARNING):
        other = run_virtual(scenario())
    assert ("0", "HandlerTimeoutError") in reported
    assert other == 2
    assert any("has not returned after 10 s" in r.getMessage() for r in caplog.records)


def test_a_black_holed_store_self_fences_before_the_records_could_expire():
    """A store that accepts connections and never answers. Every call now ends
    after store_timeout; dispatch stops before any other processor could see the
    record expired, and the processor takes the partitions again once the store answers."""

    async def scenario():
        cluster = Cluster(2, **QUICK)
        a = cluster.add(load_balancing_strategy="greedy")
        await a.start()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 2, timeout=10)
        asyncio.get_running_loop()
        cluster.store.hang = True
        listing = await cluster.memory.list_ownership("memory.local", "hub", "$default")
        last_write = max(r.last_modified_time for r in listing.ownerships)
        fenced_at = await cluster.wait_until(lambda: not a.owned_partitions, timeout=60, step=0.05)
        server_at_fence = cluster.memory.now()
        calls_blocked = cluster.store.injected["hang"]
        timeouts = sum(a.store_calls.timeouts.values())
        cluster.store.clear()
        back = await cluster.wait_until(lambda: len(a.owned_partitions) == 2, timeout=60)
        await a.stop()
        return (server_at_fence - last_write).total_seconds(), fenced_at, back, calls_blocked, timeouts, a.timing

    age_at_fence, fenced_at, back, blocked, timeouts, timing = run_virtual(scenario())
    assert fenced_at is not None and back is not None
    assert age_at_fence < timing.expiration  # nobody could have judged the record expired yet
    assert blocked > 0 and timeouts >= blocked - 2  # every hung call ended by the processor's deadline


def test_store_wiped_mid_run_is_reported_loudly_and_can_refuse_to_rewind(caplog):
    """Azurite restarted empty mid-run: events processed again, no warning. Now an
    ERROR and StoreDataLostError; with refuse_checkpoint_rewind=True nothing is redone."""

    def run(refuse: bool):
        async def scenario():
            cluster = Cluster(4, seed=2, refuse_checkpoint_rewind=refuse, load_balancing_strategy="greedy",
                              **QUICK)
            a = cluster.add()
            await a.start()
            await cluster.produce(400)
            await cluster.wait_until(lambda: cluster.settled([a]), timeout=30)
            delivered_before = sum(cluster.ledger.received.values())
            # The storage is wiped (an emulator restarted without persistence).
            cluster.memory.wipe()
            await asyncio.sleep(20)
            await cluster.produce(40)
            await asyncio.sleep(20)
            settled = cluster.settled([a])
            await a.stop()
            return cluster, delivered_before, settled

        return run_virtual(scenario())

    with caplog.at_level(logging.ERROR):
        cluster, before, settled = run(refuse=False)
    assert settled
    assert any(isinstance(e, StoreDataLostError) for e in cluster.errors)
    assert any(isinstance(e, StoreDataLostError) for _o, _p, e in cluster.ledger.errors)
    assert any("data loss" in r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR)
    assert cluster.ledger.duplicates() >= 400  # restarted from the start: the default, reported above

    cluster, before, settled = run(refuse=True)
    assert settled
    assert cluster.ledger.duplicates() == 0  # resumed from the last checkpoint it knew
    assert set(cluster.produced) <= cluster.ledger.processed()


def test_slow_initialize_and_close_delay_no_renewal_and_no_other_partition():
    """A slow initialize/close was awaited inside the balancing tick."""

    class SlowStart(PartitionProcessor):
        async def initialize(self, context):
            if context.partition_id == "0":
                await asyncio.sleep(300)

        async def close(self, reason, context):
            if context.partition_id == "1":
                await asyncio.sleep(300)

    async def scenario():
        cluster = Cluster(8, **QUICK)
        p = EventProcessor(cluster.source, cluster.store, SlowStart, load_balancing_strategy="greedy",
                           shutdown_timeout=400, ownership_renewal="partition", **QUICK)
        await p.start()
        await cluster.wait_until(lambda: len(p.owned_partitions) == 8, timeout=10)
        gaps = []
        loop = asyncio.get_running_loop()
        for _ in range(120):
            await asyncio.sleep(1)
            gaps.append(len(p.owned_partitions))
        ticks = p.ticks
        renewals = p.stats.renewals
        started = loop.time()
        await p.stop()
        return gaps, ticks, renewals, loop.time() - started

    gaps, ticks, renewals, stop_took = run_virtual(scenario())
    assert set(gaps) == {8}  # no lease lapsed while partition 0's initialize slept
    assert ticks >= 100  # the balancing loop kept ticking once a second
    assert renewals >= 8 * 15  # every lease renewed every 6 s
    assert stop_took >= 300  # close() of partition 1 really was awaited, on its pump


def test_a_claim_whose_answer_was_lost_is_adopted_not_left_to_expire():
    """At the processor: a claim applied by the store whose answer never came back.
    The next listing shows the record naming this processor: it is taken at once."""

    async def scenario():
        cluster = Cluster(4, **QUICK)
        a = cluster.add(load_balancing_strategy="greedy")
        cluster.store.only = {"claim_ownership"}
        cluster.store.lost_answer_rate = 1.0
        await a.start()
        await asyncio.sleep(1.5)  # first tick: every claim lands, every answer is lost
        cluster.store.clear()
        owned_at = await cluster.wait_until(lambda: len(a.owned_partitions) >= 1, timeout=30, step=0.1)
        await a.stop()
        return owned_at, cluster.store.injected["lost_answer"]

    owned_at, lost = run_virtual(scenario())
    assert lost >= 1
    assert owned_at is not None and owned_at < QUICK["partition_ownership_expiration_interval"]


def test_leases_move_only_along_the_life_cycle():
    """Every state a lease is ever seen in, sampled on every step of a faulty run."""

    async def scenario():
        cluster = Cluster(6, seed=4, work=0.2, **QUICK)
        ps = [cluster.add() for _ in range(3)]
        for p in ps:
            await p.start()
        producer = asyncio.ensure_future(cluster.produce_for(60, rate=30))
        cluster.store.error_rate = 0.2
        cluster.store.latency = 0.5
        cluster.store.jitter = True
        seen = set()
        for _ in range(600):
            await asyncio.sleep(0.1)
            for p in ps:
                for pid, state in p.leases.items():
                    seen.add(state)
                    if state is LeaseState.OWNED:
                        pump = p.pump(pid)
                        assert pump is not None and (pump.alive or not p.leases), pid
        cluster.store.clear()
        await producer
        await asyncio.sleep(30)
        for p in ps:
            await p.stop()
        return seen

    seen = run_virtual(scenario())
    assert LeaseState.OWNED in seen


@pytest.mark.parametrize("fields", [{"ownerid": "someone", "epoch": "not a number"},
                                    {"note": "written by another program"},
                                    {"ownerid": "someone", "epoch": str(2**63)}],
                         ids=["corrupted", "foreign", "epoch 2**63"])
def test_an_unreadable_ownership_record_is_claimed_over_once_it_has_expired(fields, caplog):
    """A corrupted, foreign or out-of-range record (an epoch of 2**63): its partition
    waits for the record to expire, like a crashed owner's, then is claimed over (a write
    conditional on the bad record's etag) at an epoch in range, and the warning is logged
    once, not every tick."""

    async def scenario():
        cluster = Cluster(4, **QUICK)
        source = cluster.source
        cluster.memory.plant_record("ownership", source.fully_qualified_namespace, source.eventhub_name,
                                    "$default", "2", fields)
        a = cluster.add(load_balancing_strategy="greedy")
        await a.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 3, timeout=10, step=0.1)
        assert "2" not in a.owned_partitions
        at = await cluster.wait_until(lambda: "2" in a.owned_partitions, timeout=60, step=0.1)
        await cluster.produce(8)
        await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=10)
        epoch = a.pump("2").context.epoch
        await a.stop()
        return None if at is None else at - started, epoch, cluster

    caplog.set_level(logging.WARNING)
    took, epoch, cluster = run_virtual(scenario())
    expiration = QUICK["partition_ownership_expiration_interval"]
    assert took is not None, "the partition of the unreadable record was never claimed"
    assert expiration <= took <= expiration + 1.0 + 2 * 1.1 * QUICK["load_balancing_interval"]
    assert 1 <= epoch < 2**63
    assert set(cluster.produced) <= cluster.ledger.processed()
    bad = [r for r in caplog.records if r.levelno == logging.WARNING and "'2'" in r.getMessage()
           and "ownership record" in r.getMessage()]
    assert len(bad) == 1, [r.getMessage() for r in bad]


def test_the_renewer_sleeps_while_it_has_nothing_to_renew():
    """With no renewable lease the renewer waited ``renewal_age`` and looked again, and a
    renewal age near 0 made it spin on the event loop. It now waits to be woken."""
    from eventprocessor._ownership.lease_table import LeaseTable
    from eventprocessor._ownership.renewer import LeaseRenewer
    from eventprocessor._ownership.writer import OwnershipWriter
    from eventprocessor._runtime.stats import ProcessorStats
    from eventprocessor._runtime.telemetry import Telemetry
    from eventprocessor._runtime.timing import Timing

    class Counting(LeaseTable):
        rounds = 0

        def renewal_due(self, now):
            Counting.rounds += 1
            return super().renewal_due(now)

    async def scenario():
        loop = asyncio.get_running_loop()
        clock = type("LoopClock", (), {"monotonic": staticmethod(loop.time), "sleep": staticmethod(asyncio.sleep)})()
        timing = Timing.derive(interval=1.0, expiration=12.0, renewal_age=0.001, store_timeout=None,
                               shutdown_timeout=1.0, handler_timeout=None)
        table = Counting(owner_id="t", eventhub_name="hub", consumer_group="$default", describe="t", clock=clock,
                         timing=timing, stats=ProcessorStats(), telemetry=Telemetry(eventhub_name="hub",
                         consumer_group="$default", owner_id="t"), on_released=lambda leases: None,
                         on_refreshed=lambda: None)
        renewer = LeaseRenewer(table=table, writer=OwnershipWriter(InMemoryCheckpointStore()), clock=clock,
                               on_contested=lambda: None, on_error=lambda error, lease: None, describe="t")
        task = asyncio.ensure_future(renewer.run())
        await asyncio.sleep(100)
        renewer.wake()
        await asyncio.sleep(1)
        task.cancel()
        return Counting.rounds

    assert run_virtual(scenario()) <= 3


def test_backoff_doubles_to_its_cap_and_starts_over_after_a_success():
    from eventprocessor._runtime.backoff import Backoff

    retry = Backoff(0.1, cap=0.5)
    assert [retry.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    retry.reset()
    assert retry.next() == 0.1
    with pytest.raises(ValueError):
        Backoff(0.0, cap=1.0)


@pytest.mark.parametrize("seed", range(int(os.environ.get("WIPE_SEEDS", "12"))))
def test_a_wiped_store_under_two_processors_is_reported_by_each_owner_and_refusing_rewind_replays_nothing(
        seed, caplog):
    """Two processors, 8 partitions, every batch checkpointed; the store is wiped. With
    liveness per processor nobody lists ownership in the steady state, so the owners learn
    of the wipe from their checkpoints: reported as another owner ("found another owner"),
    and the other processor, whose next tick saw the partitions unowned, claimed two of them
    afresh and replayed them from the start (313 duplicates with refuse_checkpoint_rewind).
    An owner whose checkpoint and ownership records vanished reports data loss and claims
    its partitions back at once, resuming from the checkpoint it knew, before claiming
    anything that looks unowned. (Of 200 seeds, 6 still replay a partition: the second
    processor to tick may find the notice already rewritten; see CHANGELOG.)"""

    async def scenario():
        cluster = Cluster(8, seed=seed, work=0.05, refuse_checkpoint_rewind=True, **QUICK)
        processors = [cluster.add(f"p{i}", store=cluster.link()) for i in range(2)]
        for p in processors:
            await p.start()
        producing = asyncio.ensure_future(cluster.produce_for(60, rate=40))
        await cluster.wait_until(lambda: cluster.settled(processors), timeout=60)
        await asyncio.sleep(20 + (seed % 21) / 7)  # within the 60 s of production
        cluster.memory.wipe()
        await producing
        await cluster.wait_until(lambda: set(cluster.produced) <= cluster.ledger.processed(), timeout=60)
        settled = await cluster.wait_until(lambda: cluster.settled(processors), timeout=60)
        reports = [p.stats.store_data_lost for p in processors]
        for p in processors:
            await p.stop()
        return cluster, settled, reports

    with caplog.at_level(logging.INFO):
        cluster, settled, reports = run_virtual(scenario())
    assert settled is not None
    assert set(cluster.produced) <= cluster.ledger.processed()
    # At most the batch a pump had in hand, not yet checkpointed, when its claim's records
    # vanished (none was replayed from the start: before, two partitions were, 200+ events).
    assert cluster.ledger.duplicates() <= 8
    assert all(reports), reports  # each owner said so
    assert any("records vanished from the store" in r.getMessage() for r in caplog.records)
