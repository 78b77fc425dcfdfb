"""The deterministic source fault harness: real EventProcessors on virtual time, random
faults between them and the event source (:class:`~eventprocessor.testing.FaultySource`),
on many seeds (hypothesis). The twin of ``tests/test_fault_harness.py``, which faults the
store.

Faults, at random times and overlapping: receive errors (at a rate, or the next few
calls), detached links (at a rate, or every open link at once every 2 s: connection
resets), stalled receives, a black hole (every call hangs; hung receives fail when it
ends, as the AMQP client's idle timeout reports a dead connection), server-busy
throttling with a retry-after, failing ``open_receiver`` and ``get_partition_ids``, a
partition that disappears and comes back, and (so that claims end while handlers work)
one processor's renewals black-holed for longer than its lease (its checkpoints still
answer, so handlers meet the end of the claim in ``update_checkpoint``).

Handlers checkpoint every batch, every tenth batch, or never (the processor still
checkpoints on a graceful release: without that, ``latest`` would lose what arrives
while a partition is handed over, by design); some let the
``OwnershipLostError`` of ``update_checkpoint`` escape, as code that does not expect it
does. Processors start from ``earliest`` or ``latest``.

Invariants, counted from what the handlers received
(:class:`~eventprocessor.testing.DeliveryRecorder`):

* nothing lost: every event is processed: for ``earliest`` every event produced, for
  ``latest`` every event after the newest one when its partition's first receiver opened;
* nothing delivered twice to one claim (``duplicates_within_claims() == 0``): a claim
  reads on from where it got to, whatever the source did;
* nothing handed to a claim that had ended (``after_end`` empty);
* recovery: after the last fault ends, every partition is dispatched by exactly one live
  pump and every event is processed within :func:`recovery_bound`.

What it caught. On the pump of 4a72d89 (before the source-side fixes of 080501b), 200
random runs: 95 delivered events twice to one claim, 21 lost events, 21 did not recover in time,
4 handed a batch to an ended claim; every failure one of the three known bugs: a receiver
reopened after an error started at the last checkpoint or at the claim's start, not after
the last event received (``earliest``, or a checkpoint some batches back: the partition
replayed within the claim; ``latest`` without a checkpoint: everything that arrived
meanwhile skipped, so those runs never recovered either); a handler whose
``update_checkpoint`` raised ``OwnershipLostError`` was handed its batch again after the
claim ended (the ``store_cut`` runs whose handlers let that error escape; while the claim
was still dispatchable the same redelivery counted as a duplicate within the claim).
With the fixes: 0 failures in 1,350 runs.

CI runs ``SOURCE_FAULT_SEEDS`` examples (default 100, ~15 s). A longer soak is one command::

    SOURCE_FAULT_SEEDS=1000 pytest tests/test_source_fault_harness.py -q
"""
from __future__ import annotations

import asyncio
import math
import os
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from eventprocessor import EventPosition
from eventprocessor.testing import Cluster, FaultySource, recording_handler, run_virtual

INTERVAL = 1.0
EXPIRATION = 12.0
WORK = 0.2  # longest a handler spends on one batch (virtual seconds)
RATE = 20.0  # events per virtual second, round robin over the partitions that exist
MAX_BATCH = 100
FAULT_WINDOW = 40.0  # faults start in [0, FAULT_WINDOW) after the cluster settled
CALL_TIMEOUT = 10.0  # how long a call sent into the black hole takes to fail (EventHubSource's operation_timeout)
PUMP_MAX_BACKOFF = 5.0  # the partition pump's reconnect backoff cap (eventprocessor/_delivery/receiving.py)
RESET_EVERY = 2.0
SEEDS = int(os.environ.get("SOURCE_FAULT_SEEDS", "100"))

KINDS = ["receive_errors", "fail_next", "detach", "resets", "stall", "black_hole", "throttle", "open_errors",
         "ids_errors", "remove", "store_cut"]


@dataclass(frozen=True)
class Fault:
    kind: str
    target: int  # which partition (remove) or processor (store_cut)
    start: float
    duration: float
    level: float


faults = st.builds(
    Fault,
    kind=st.sampled_from(KINDS),
    target=st.integers(0, 7),
    start=st.floats(0, FAULT_WINDOW - 5),
    duration=st.floats(0.5, 20),
    level=st.floats(0.05, 1.0),
)


def recovery_bound(partitions: int, timing, longest_fault: float, store_cut: bool) -> float:
    """After the last fault ends, how long until every partition is dispatched by one
    live pump again and every event is processed, in virtual seconds.

    * A call sent into the black hole just before it ended fails ``CALL_TIMEOUT`` after
      it was sent (a hung receive fails at once when the black hole ends);
    * a pump whose receive or open failed sleeps its reconnect backoff, at most
      ``PUMP_MAX_BACKOFF`` (5 s, the pump's cap), then reopens; the reopen succeeds and
      the first receive returns at once what is waiting;
    * a claim that ended while its processor was cut off from the store (``store_cut``)
      is taken over as in ``tests/test_fault_harness.py``: its record expires
      ``expiration`` (+ the store clock's 1 s) after the last renewal, then one jittered
      tick (``1.1·interval``) and a store call (``store_timeout``) later the new owner's
      pump starts; the store cut is longer than the lease, so that window starts before
      the fault ends and at most the expiration plus a tick is left after it;
    * then the backlog: at most ``RATE/P·(longest fault + CALL_TIMEOUT + backoff)``
      events per partition, in batches of ``MAX_BATCH``, each up to ``WORK`` seconds,
      plus one batch in flight;
    * and the mark recovery is measured against: the first event each partition gets after
      the faults, ``P/RATE`` seconds of production.
    """
    reopen = CALL_TIMEOUT + PUMP_MAX_BACKOFF
    takeover = timing.expiration + 1.0 + 2 * 1.1 * timing.interval + timing.store_timeout
    backlog = RATE / partitions * (longest_fault + reopen + takeover)
    catch_up = (math.ceil(backlog / MAX_BATCH) + 1) * WORK
    return (max(reopen, takeover) if store_cut else reopen) + catch_up + partitions / RATE + 0.5


@dataclass
class Result:
    expected: int
    missing: list[tuple[str, int]]
    duplicates_within_claims: int
    after_end: int
    recovered_after: float | None
    bound: float
    injected: dict[str, int] = field(default_factory=dict)
    duplicates: int = 0

    def explain(self) -> str:
        return (f"expected {self.expected}, missing {len(self.missing)} (first {self.missing[:5]}), duplicates within "
                f"a claim {self.duplicates_within_claims}, after a claim ended {self.after_end}, recovered after "
                f"{self.recovered_after} (bound {self.bound:.1f}), injected {self.injected}")


# No shrinking: a failing run prints its example as drawn (shrinking a scenario of
# processors and overlapping faults takes minutes and rarely makes it simpler).
@settings(max_examples=SEEDS, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
          database=None, phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False)
@given(seed=st.integers(0, 2**31), partitions=st.integers(2, 6), processors=st.integers(1, 3),
       position=st.sampled_from(["earliest", "latest"]), checkpoint_every=st.sampled_from([1, 10, 0]),
       catch_ownership_lost=st.booleans(), schedule=st.lists(faults, min_size=1, max_size=5))
def test_source_faults_lose_nothing_duplicate_nothing_and_recover(seed, partitions, processors, position,
                                                                  checkpoint_every, catch_ownership_lost, schedule):
    result = run_virtual(run_scenario(seed, partitions, processors, position, checkpoint_every,
                                      catch_ownership_lost, schedule))
    assert not result.missing, f"events lost: {result.explain()}"
    assert result.duplicates_within_claims == 0, f"events delivered twice to one claim: {result.explain()}"
    assert result.after_end == 0, f"batches handed to claims that had ended: {result.explain()}"
    assert result.recovered_after is not None and result.recovered_after <= result.bound, \
        f"not recovered in time: {result.explain()}"


def expected_events(cluster: Cluster, source: FaultySource, position: str) -> set[tuple[str, int]]:
    if position == "earliest":
        return set(cluster.produced)
    # latest: what was enqueued after the partition's first receiver opened
    return {(pid, seq) for pid, seq in cluster.produced if seq > source.first_open_sequence.get(pid, math.inf)}


def dispatched(cluster: Cluster, running) -> bool:
    pumps = cluster.live_pumps()
    names = {p.owner_id for p in running}
    return all(len([o for o in pumps.get(str(i), []) if o in names]) == 1
               for i in range(cluster.source.partition_count))


def balanced(running) -> bool:
    counts = [len(p.owned_partitions) for p in running]
    return max(counts) - min(counts) <= 1


async def run_scenario(seed: int, partitions: int, processors: int, position: str, checkpoint_every: int,
                       catch_ownership_lost: bool, schedule: list[Fault]) -> Result:
    start_at = EventPosition.earliest() if position == "earliest" else EventPosition.latest()
    cluster = Cluster(partitions, seed=seed, source_faults=True, load_balancing_interval=INTERVAL,
                      partition_ownership_expiration_interval=EXPIRATION, shutdown_timeout=5.0,
                      initial_event_position=start_at, max_batch_size=MAX_BATCH)
    source = cluster.faulty_source
    assert source is not None
    source.call_timeout = CALL_TIMEOUT
    handler = recording_handler(cluster.ledger, work=WORK, rng=cluster.rng, checkpoint_every=checkpoint_every,
                                catch_ownership_lost=catch_ownership_lost)
    links = [cluster.link() for _ in range(processors)]
    running = [cluster.add(f"p{i}", store=links[i], handler=handler) for i in range(processors)]
    loop = asyncio.get_running_loop()
    await cluster.produce(3 * partitions)  # history before the processors start
    for p in running:
        await p.start()
    stop_producing = asyncio.Event()

    async def produce() -> None:
        turn = 0
        while not stop_producing.is_set():
            pid = str(turn % partitions)
            turn += 1
            if pid not in source.removed:  # a partition that does not exist receives nothing
                event = await cluster.source.send(f"e{len(cluster.produced)}", partition_id=pid)
                cluster.produced.append((pid, event.sequence_number))
            await asyncio.sleep(1.0 / RATE)

    await cluster.wait_until(lambda: dispatched(cluster, running) and balanced(running), timeout=60)
    producer = asyncio.ensure_future(produce())
    await asyncio.sleep(2.0)

    # A store cut of a processor that could then lose every partition it has, with
    # "latest" and no checkpoints, loses events by design (the next owner starts at the
    # newest event): those runs get no store cut.
    store_cuts = processors > 1 and not (position == "latest" and checkpoint_every == 0)

    async def apply(fault: Fault) -> None:
        await asyncio.sleep(fault.start)
        end = loop.time() + fault.duration
        if fault.kind == "receive_errors":
            source.receive_error_rate = fault.level
        elif fault.kind == "fail_next":
            source.fail_next("receive", 1 + int(fault.level * 5))
        elif fault.kind == "detach":
            source.detach_rate = fault.level
        elif fault.kind == "resets":
            while loop.time() < end:
                source.detach_all()
                await asyncio.sleep(RESET_EVERY)
        elif fault.kind == "stall":
            source.stall = 3.0 * fault.level
        elif fault.kind == "black_hole":
            source.set_black_hole(True)
        elif fault.kind == "throttle":
            source.throttle(fault.duration, retry_after=1.0 + 4.0 * fault.level)
        elif fault.kind == "open_errors":
            source.open_error_rate = fault.level
        elif fault.kind == "ids_errors":
            source.ids_error_rate = fault.level
        elif fault.kind == "remove":
            source.remove(str(fault.target % partitions))
        elif fault.kind == "store_cut":
            if not store_cuts:
                return
            end = loop.time() + max(fault.duration, running[0].timing.lease_length + 2.0)
            link = links[fault.target % processors]
            # Its renewals and listings hang, its checkpoints still answer: the lease runs
            # out on the processor's clock while handlers work and checkpoint.
            link.only, link.hang = {"list_ownership", "claim_ownership", "list_members", "write_member",
                                    "fence_checkpoint", "release_ownership"}, True
        await asyncio.sleep(max(0.0, end - loop.time()))
        if fault.kind == "receive_errors":
            source.receive_error_rate = 0.0
        elif fault.kind == "detach":
            source.detach_rate = 0.0
        elif fault.kind == "stall":
            source.stall = 0.0
        elif fault.kind == "black_hole":
            source.set_black_hole(False)
        elif fault.kind == "open_errors":
            source.open_error_rate = 0.0
        elif fault.kind == "ids_errors":
            source.ids_error_rate = 0.0
        elif fault.kind == "remove":
            source.restore(str(fault.target % partitions))
        elif fault.kind == "store_cut":
            links[fault.target % processors].clear()

    started = loop.time()
    await asyncio.gather(*(apply(f) for f in schedule))
    source.clear()
    for link in links:
        link.clear()
    faults_over = loop.time()
    cut = store_cuts and any(f.kind == "store_cut" for f in schedule)
    bound = recovery_bound(partitions, running[0].timing, faults_over - started, cut)

    # Recovered: every partition dispatched by one live pump, and every event produced up
    # to the first one each partition got after the faults processed. (A fixed mark:
    # "every event produced so far" races the producer, on virtual time in lockstep.)
    await asyncio.sleep(partitions / RATE + 0.01)
    mark = expected_events(cluster, source, position)

    def recovered() -> bool:
        return dispatched(cluster, running) and mark <= cluster.ledger.processed()

    recovered_at = await cluster.wait_until(recovered, timeout=bound + 30, step=0.1)
    await asyncio.sleep(5.0)
    stop_producing.set()
    await producer
    await cluster.wait_until(lambda: expected_events(cluster, source, position) <= cluster.ledger.processed(),
                             timeout=bound)
    for p in running:
        await p.stop()
    expected = expected_events(cluster, source, position)
    ledger = cluster.ledger
    return Result(
        expected=len(expected),
        missing=sorted(expected - ledger.processed()),
        duplicates_within_claims=ledger.duplicates_within_claims(),
        after_end=len(ledger.after_end),
        recovered_after=None if recovered_at is None else recovered_at - faults_over,
        bound=bound,
        injected=dict(source.injected),
        duplicates=ledger.duplicates(),
    )


# ----------------------------------------------------------------------------- FaultySource itself

def _faulty(partitions: int = 2) -> FaultySource:
    from eventprocessor.sources import InMemoryEventSource
    from eventprocessor.testing import virtual_utc_clock

    return FaultySource(InMemoryEventSource(partitions, clock=virtual_utc_clock()))


async def _open(source: FaultySource, pid: str = "0", position: EventPosition = EventPosition.earliest()):
    return await source.open_receiver(pid, consumer_group="$default", starting_position=position, owner_level=1)


def test_a_detached_receiver_fails_at_once_even_while_waiting_and_stays_dead():
    from eventprocessor.errors import EventSourceError

    async def main():
        source = _faulty()
        receiver = await _open(source)
        waiting = asyncio.ensure_future(receiver.receive(10, None))  # nothing to read: it waits
        await asyncio.sleep(1)
        assert source.detach_all() == 1
        try:
            await waiting
        except EventSourceError as error:
            first = error
        try:
            await receiver.receive(10, 1.0)
        except EventSourceError as error:
            second = error
        fresh = await _open(source)
        await source.send(b"x", partition_id="0")
        return first, second, await fresh.receive(10, 1.0), source.injected

    first, second, events, injected = run_virtual(main())
    assert first.reason == "disconnected" and "reset" in str(first)
    assert second.reason == "disconnected" and injected["receive_on_dead"] == 1
    assert [e.body for e in events] == [b"x"]


def test_throttling_answers_server_busy_with_its_retry_after_and_counts_callers_that_ignore_it():
    from eventprocessor.errors import EventSourceError

    async def main():
        source = _faulty()
        source.throttle(10, retry_after=4)
        answers = []
        for wait in (0.0, 1.0, 5.0, 10.0):  # asks at t=0, 1 (too early), 6, 16 (throttle over)
            await asyncio.sleep(wait)
            try:
                await _open(source)
                answers.append("opened")
            except EventSourceError as error:
                answers.append((error.reason, error.retry_after))
        return answers, source.injected

    answers, injected = run_virtual(main())
    assert answers == [("server-busy", 4), ("server-busy", 4), ("server-busy", 4), "opened"]
    assert injected["server_busy"] == 3 and injected["ignored_retry_after"] == 1


def test_a_removed_partition_is_not_listed_and_not_found_until_restored():
    from eventprocessor.errors import EventSourceError

    async def main():
        source = _faulty(3)
        receiver = await _open(source, "1")
        source.remove("1")
        listed = await source.get_partition_ids()
        reasons = []
        for call in (lambda: receiver.receive(5, 1.0), lambda: _open(source, "1")):
            try:
                await call()
            except EventSourceError as error:
                reasons.append(error.reason)
        source.restore("1")
        return listed, reasons, await source.get_partition_ids()

    listed, reasons, again = run_virtual(main())
    assert listed == ["0", "2"] and again == ["0", "1", "2"]
    assert reasons == ["disconnected", "not-found"]  # the open receiver was cut, then the partition is unknown


def test_a_black_hole_swallows_receives_until_it_ends_then_they_fail():
    from eventprocessor.errors import EventSourceError

    async def main():
        source = _faulty()
        receiver = await _open(source)
        loop = asyncio.get_running_loop()
        source.set_black_hole(True)
        await source.send(b"never seen by the swallowed receive", partition_id="0")
        waiting = asyncio.ensure_future(receiver.receive(10, None))
        await asyncio.sleep(30)
        assert not waiting.done()
        source.set_black_hole(False)
        try:
            await waiting
        except EventSourceError as error:
            failed = (error.reason, loop.time())
        return failed

    reason, at = run_virtual(main())
    assert reason == "disconnected" and at == 30.0
