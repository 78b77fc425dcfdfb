"""What the pump hands to user code when the source or the handler fails.

Each test is a row of the issue's table, on virtual time over the in-memory source and
store, counted from what the handler received:

* a receiver reopened within a claim starts right after the last event it received,
  never at the claim's starting position (``latest`` lost events, ``earliest`` replayed
  the partition);
* nothing is handed to a claim that has ended: not a retry, not a poison isolation step,
  not an empty ``max_wait_time`` batch;
* a batch whose handler raises on one event delivers the events before it at most once
  more, within a documented stall, and every failure is logged (its traceback once).
"""
from __future__ import annotations

import asyncio
import logging
from collections import Counter

import pytest

from eventprocessor import (
    CloseReason,
    EventPosition,
    EventProcessor,
    FailurePolicy,
    OwnershipLostError,
    PartitionProcessor,
    PoisonEventsError,
)
from eventprocessor.errors import EventSourceError
from eventprocessor.policies import RetryPolicy
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.sources.base import EventSource, PartitionReceiver
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import DeliveryRecorder, recording_handler, run_virtual, virtual_utc_clock

FAST = dict(load_balancing_interval=0.5, partition_ownership_expiration_interval=6.0)


async def until(condition, *, timeout: float = 60.0, what: str = "condition") -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} virtual seconds waiting for {what}")
        await asyncio.sleep(0.01)
    return loop.time()


class _DetachableReceiver(PartitionReceiver):
    def __init__(self, inner: PartitionReceiver, source: DetachableSource) -> None:
        self._inner, self._source = inner, source

    async def receive(self, max_batch_size, max_wait_time):
        detach = asyncio.ensure_future(self._source.detach.wait())
        receive = asyncio.ensure_future(self._inner.receive(max_batch_size, max_wait_time))
        try:
            await asyncio.wait({detach, receive}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            detach.cancel()
        if self._source.detach.is_set():
            receive.cancel()
            await asyncio.gather(receive, return_exceptions=True)
            self._source.detach.clear()
            self._source.detached += 1
            raise EventSourceError("the link was detached (amqp:link:detach-forced)", reason="disconnected")
        return receive.result()

    async def close(self):
        await self._inner.close()


class DetachableSource(EventSource):
    """The in-memory source, whose open receivers fail once when ``detach`` is set (a
    detached link), as a waiting Event Hubs receiver does."""

    def __init__(self, inner: InMemoryEventSource) -> None:
        self.inner = inner
        self.fully_qualified_namespace = inner.fully_qualified_namespace
        self.eventhub_name = inner.eventhub_name
        self.detach = asyncio.Event()
        self.detached = 0
        self.opened: list[EventPosition] = []

    async def get_partition_ids(self):
        return await self.inner.get_partition_ids()

    async def get_partition_properties(self, partition_id):
        return await self.inner.get_partition_properties(partition_id)

    async def open_receiver(self, partition_id, **kwargs):
        self.opened.append(kwargs["starting_position"])
        return _DetachableReceiver(await self.inner.open_receiver(partition_id, **kwargs), self)


def _world(partitions: int = 1):
    memory = InMemoryEventSource(partitions, clock=virtual_utc_clock())
    return memory, DetachableSource(memory), InMemoryCheckpointStore(clock=virtual_utc_clock())


@pytest.mark.parametrize("events_before", [0, 3])
def test_with_latest_and_no_checkpoint_events_sent_while_the_link_is_down_are_delivered(events_before):
    """``EventPosition.latest()`` (the drop-in's default), no checkpoint yet; the
    receiver fails once while 5 events arrive: those 5 were never delivered."""
    recorder = DeliveryRecorder()
    produced: list[tuple] = []

    async def scenario():
        memory, source, store = _world()
        processor = EventProcessor(source, store, recording_handler(recorder, checkpoint=False),
                                   initial_event_position=EventPosition.latest(), **FAST)
        async with processor:
            await until(lambda: processor.owned_partitions == {"0"} and source.opened, what="the claim")
            await asyncio.sleep(0.5)  # the receiver waits at "latest"
            for i in range(events_before):
                produced.append(("0", (await memory.send(f"before {i}")).sequence_number))
            await until(lambda: len(recorder.received) == events_before, what="the first events")
            source.detach.set()
            await asyncio.sleep(0)  # the waiting receive fails now; the pump backs off
            for i in range(5):
                produced.append(("0", (await memory.send(f"during {i}")).sequence_number))
            await until(lambda: len(recorder.received) == len(produced), timeout=30, what="every event")
            await asyncio.sleep(5)
        return source.detached

    assert run_virtual(scenario()) == 1
    assert recorder.missing(produced) == []
    assert recorder.duplicates_within_claims() == 0


def test_with_earliest_and_no_checkpoint_a_reconnect_does_not_replay_the_partition():
    """The same with ``earliest``: the whole partition was delivered again."""
    recorder = DeliveryRecorder()

    async def scenario():
        memory, source, store = _world()
        for i in range(3):
            await memory.send(f"event {i}")
        processor = EventProcessor(source, store, recording_handler(recorder, checkpoint=False), **FAST)
        async with processor:
            await until(lambda: len(recorder.received) == 3, what="the first events")
            source.detach.set()
            await asyncio.sleep(0)
            await memory.send("after the reconnect")
            await until(lambda: len(recorder.received) == 4, timeout=30, what="the new event")
            await asyncio.sleep(5)
        return source.opened

    opened = run_virtual(scenario())
    assert recorder.duplicates_within_claims() == 0, dict(Counter(recorder.in_claim))
    assert recorder.duplicates() == 0
    assert opened[1] == EventPosition.from_sequence_number(2)


def test_a_reconnect_before_anything_arrived_keeps_the_claims_position():
    """A reconnect before the first event reopens where the claim started (the
    checkpoint), not at ``latest`` and not at the start of the partition."""
    recorder = DeliveryRecorder()

    async def scenario():
        memory, source, store = _world()
        for i in range(4):
            await memory.send(f"old {i}")
        first = EventProcessor(source, store, recording_handler(recorder), **FAST)
        async with first:
            await until(lambda: len(recorder.received) == 4, what="the old events")
        second = EventProcessor(source, store, recording_handler(recorder),
                                initial_event_position=EventPosition.latest(), **FAST)
        async with second:
            await until(lambda: second.owned_partitions == {"0"}, what="the second claim")
            await asyncio.sleep(0.5)
            source.detach.set()
            await asyncio.sleep(0)
            await memory.send("new")
            await until(lambda: len(recorder.received) == 5, timeout=30, what="the new event")
            await asyncio.sleep(2)
        return source.opened

    opened = run_virtual(scenario())
    assert recorder.duplicates() == 0
    assert opened[-1] == EventPosition.from_sequence_number(3)


def test_a_handler_that_blocks_past_its_lease_is_not_handed_the_batch_again():
    """A handler blocks the event loop past the lease (CPU-bound code, a sync HTTP
    call): its ``update_checkpoint`` raises ``OwnershipLostError``; the pump then handed
    the same batch to the handler again while the partition was no longer owned."""
    deliveries: list[tuple] = []
    closes: list[CloseReason] = []
    after_end: list[int] = []

    class Blocking(PartitionProcessor):
        async def process_events(self, events, context):
            deliveries.append((context.epoch, events[0].sequence_number, events[-1].sequence_number))
            if not context.is_owned:
                after_end.append(events[0].sequence_number)
            if len(deliveries) == 1:
                asyncio.get_running_loop().advance(10.0)  # blocks the loop for 10 s (lease: 4.5 s)
            await context.update_checkpoint()

        async def close(self, reason, context):
            closes.append(reason)

    async def scenario():
        memory, source, store = _world()
        for i in range(6):
            await memory.send(f"event {i}")
        processor = EventProcessor(source, store, Blocking, **FAST)
        async with processor:
            await until(lambda: len(closes) >= 1, what="the claim to end")
            await asyncio.sleep(10)
        return processor

    run_virtual(scenario())
    assert after_end == []
    epochs = Counter(epoch for epoch, _first, _last in deliveries)
    assert all(count == 1 for count in epochs.values()), deliveries  # no claim was handed its batch twice
    assert closes[0] is CloseReason.OWNERSHIP_LOST


def test_a_blocked_event_loop_is_reported_once_naming_the_partition_handler_and_leases_at_risk(caplog):
    """One WARNING names the partition and the handler that held the
    loop, and the leases it put at risk (here: both partitions' leases ran out); the
    tick-overrun warning no longer says that no lease was at risk."""
    blocked_once: list[str] = []

    class Blocking(PartitionProcessor):
        async def process_events(self, events, context):
            if context.partition_id == "1" and not blocked_once:
                blocked_once.append(context.partition_id)
                asyncio.get_running_loop().advance(10.0)
            try:
                await context.update_checkpoint()
            except OwnershipLostError:
                pass

    async def scenario():
        memory, source, store = _world(2)
        processor = EventProcessor(source, store, Blocking, **FAST)
        async with processor:
            await until(lambda: processor.owned_partitions == {"0", "1"}, what="both claims")
            await memory.send("x", partition_id="1")
            await until(lambda: bool(blocked_once), what="the block")
            await asyncio.sleep(3)

    with caplog.at_level(logging.WARNING, logger="eventprocessor"):
        run_virtual(scenario())
    stalls = [r for r in caplog.records if "blocked the event loop" in r.getMessage()]
    assert len(stalls) == 1, [r.getMessage() for r in caplog.records]
    text = stalls[0].getMessage()
    assert "partition 1" in text and "Blocking.process_events" in text and "10.0 s" in text
    assert "ran out" in text and "['0', '1']" in text
    assert "handler_executor" in text  # says the fix
    assert not any("none is at risk" in r.getMessage() for r in caplog.records)


def test_a_failing_event_in_a_batch_of_six_costs_at_most_one_more_delivery_of_the_others(caplog):
    """A handler raises on one event in a batch of 6: 15 s of stall (5 attempts
    on the batch, then 5 on the single event), the 5 good events before it delivered 6
    times, and log lines without a traceback."""
    seen: Counter = Counter()
    poisoned: list[PoisonEventsError] = []
    progress: dict[str, float | None] = {"failed_at": None, "next_at": None}

    class Picky(PartitionProcessor):
        async def process_events(self, events, context):
            loop = asyncio.get_running_loop()
            for event in events:
                seen[event.sequence_number] += 1
                if event.sequence_number == 5:
                    if progress["failed_at"] is None:
                        progress["failed_at"] = loop.time()
                    raise ValueError("cannot parse event 5")
                if event.sequence_number == 6 and progress["next_at"] is None:
                    progress["next_at"] = loop.time()
            await context.update_checkpoint()

        async def process_error(self, error, context):
            if isinstance(error, PoisonEventsError):
                poisoned.append(error)

    async def scenario():
        memory, source, store = _world()
        for i in range(6):
            await memory.send(f"event {i}")
        processor = EventProcessor(source, store, Picky, **FAST)
        async with processor:
            await until(lambda: poisoned, what="the poison event")
            await memory.send("event 6")
            await until(lambda: seen[6] == 1, what="the next event")
            await asyncio.sleep(30)

    with caplog.at_level(logging.WARNING, logger="eventprocessor"):
        run_virtual(scenario())
    policy = RetryPolicy()
    assert all(seen[i] <= 2 for i in range(5)), seen  # at most once more
    assert seen[5] == policy.max_delivery_attempts
    assert poisoned[0].events[0].sequence_number == 5 and poisoned[0].attempts == policy.max_delivery_attempts
    stall_bound = sum(policy.delay(k) for k in range(1, policy.max_delivery_attempts))
    assert stall_bound == 7.5
    failures = [r for r in caplog.records if "handler failed" in r.getMessage() and "(attempt " in r.getMessage()]
    assert len(failures) == policy.max_delivery_attempts  # once per attempt
    assert failures[0].exc_info and failures[0].exc_info[0] is ValueError  # one traceback, then a line each
    assert not any(r.exc_info for r in failures[1:])
    # The default process_error does not log the same failure a second time.
    assert not any("cannot parse event 5" in r.getMessage() and "error on partition" in r.getMessage()
                   for r in caplog.records)


def test_the_stall_of_a_poison_event_stays_within_the_documented_bound():
    seen: Counter = Counter()
    times: dict[str, float] = {}

    class Picky(PartitionProcessor):
        async def process_events(self, events, context):
            loop = asyncio.get_running_loop()
            for event in events:
                seen[event.sequence_number] += 1
                if event.sequence_number == 2:
                    times.setdefault("failed", loop.time())
                    raise ValueError("poison")
            if events[-1].sequence_number >= 3:
                times.setdefault("resumed", loop.time())
            await context.update_checkpoint()

    async def scenario():
        memory, source, store = _world()
        for i in range(4):
            await memory.send(f"event {i}")
        async with EventProcessor(source, store, Picky, **FAST):
            await until(lambda: "resumed" in times, what="the events after the poison one")

    run_virtual(scenario())
    policy = RetryPolicy()
    bound = sum(policy.delay(k) for k in range(1, policy.max_delivery_attempts))
    assert times["resumed"] - times["failed"] <= bound + 1e-6
    assert seen[0] == 2 and seen[1] == 2  # once more each
    assert seen[3] == 1  # the handler never reached it in the failed batch


def test_a_claim_that_ends_during_retries_gets_no_further_delivery():
    """No retry is handed to a claim that has ended (here: the lease runs out while the
    failing batch waits for its next attempt)."""
    deliveries: list[tuple] = []

    class Failing(PartitionProcessor):
        async def process_events(self, events, context):
            deliveries.append((context.is_owned, events[0].sequence_number))
            asyncio.get_running_loop().advance(1.5)  # slow, blocking work: the lease is 4.5 s
            raise RuntimeError("downstream unavailable")

    async def scenario():
        memory, source, store = _world()
        await memory.send("event")
        processor = EventProcessor(source, store, Failing,
                                   failure_policy=FailurePolicy(retry_backoff=1.0, max_delivery_attempts=10), **FAST)
        async with processor:
            await asyncio.sleep(20)

    run_virtual(scenario())
    assert deliveries and all(owned for owned, _seq in deliveries), deliveries


def test_an_empty_max_wait_time_batch_is_not_handed_to_an_ended_claim():
    calls: list[bool] = []

    class Ticking(PartitionProcessor):
        async def process_events(self, events, context):
            calls.append(context.is_owned)
            if len(calls) == 2:
                asyncio.get_running_loop().advance(8.0)  # the lease runs out meanwhile

    async def scenario():
        memory, source, store = _world()
        async with EventProcessor(source, store, Ticking, max_wait_time=0.2, **FAST):
            await asyncio.sleep(6)

    run_virtual(scenario())
    assert calls and all(calls), calls


def test_a_lost_claim_ends_the_pump_instead_of_retrying():
    """A handler whose checkpoint says the claim is lost (another owner took it) ends
    the pump: the batch is not retried, close gets OWNERSHIP_LOST."""
    deliveries: list[int] = []
    closes: list[CloseReason] = []

    class Checkpointing(PartitionProcessor):
        async def process_events(self, events, context):
            deliveries.append(id(context))
            if len(deliveries) == 1:
                raise OwnershipLostError("the store says another processor owns it", partition_id="0")

        async def close(self, reason, context):
            closes.append(reason)

    async def scenario():
        memory, source, store = _world()
        await memory.send("event")
        async with EventProcessor(source, store, Checkpointing, **FAST):
            await until(lambda: closes, what="the close")
            await asyncio.sleep(2)

    run_virtual(scenario())
    assert closes[0] is CloseReason.OWNERSHIP_LOST
    assert Counter(deliveries)[deliveries[0]] == 1


def test_the_drop_in_client_at_its_default_latest_loses_nothing_across_a_reconnect():
    """Through the drop-in ``EventHubConsumerClient`` (default start ``@latest``, as
    azure-eventhub's): events sent while the link is down are received after it."""
    pytest.importorskip("azure.eventhub", reason="the drop-in needs the [eventhub] extra")
    from eventprocessor.consumer_client import EventHubConsumerClient

    received: list[int] = []

    async def scenario():
        memory, source, store = _world()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, load_balancing_interval=0.5,
                                                    partition_ownership_expiration_interval=6.0)

        async def on_event_batch(context, events):
            received.extend(event.sequence_number for event in events)

        task = asyncio.ensure_future(client.receive_batch(on_event_batch))
        await until(lambda: source.opened, what="the receiver")
        await asyncio.sleep(0.5)
        await memory.send("before")
        await until(lambda: received == [0], what="the first event")
        source.detach.set()
        await asyncio.sleep(0)
        for i in range(5):
            await memory.send(f"during {i}")
        await until(lambda: len(received) == 6, timeout=30, what="the events sent during the reconnect")
        await client.close()
        await task

    run_virtual(scenario())
    assert received == list(range(6))


def test_the_drop_in_per_event_callback_stops_mid_batch_once_the_claim_has_ended():
    """``receive(on_event)`` hands a batch over one event at a time: once the claim ends
    (here its lease runs out while ``on_event`` blocks), the rest of the batch is not
    handed to the callback of the ended claim."""
    pytest.importorskip("azure.eventhub", reason="the drop-in needs the [eventhub] extra")
    from eventprocessor.consumer_client import EventHubConsumerClient

    calls: list[tuple] = []

    async def scenario():
        memory, source, store = _world()
        for i in range(3):
            await memory.send(f"event {i}")
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, load_balancing_interval=0.5,
                                                    partition_ownership_expiration_interval=6.0)

        async def on_event(context, event):
            calls.append((context.is_owned, event.sequence_number))
            if len(calls) == 1:
                asyncio.get_running_loop().advance(8.0)  # blocks past the 4.5 s lease

        task = asyncio.ensure_future(client.receive(on_event, starting_position="-1"))
        await asyncio.sleep(20)
        await client.close()
        await task

    run_virtual(scenario())
    assert calls[0] == (True, 0)
    assert all(owned for owned, _seq in calls), calls


def test_a_throttled_hub_is_left_alone_for_the_time_it_asked():
    """Event Hubs answers server-busy with a retry-after: the pump waits that long before
    it opens the partition again, instead of its own shorter backoff."""
    from eventprocessor.testing import FaultySource

    recorder = DeliveryRecorder()

    async def scenario():
        memory = InMemoryEventSource(2, clock=virtual_utc_clock())
        source = FaultySource(memory)
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        async with EventProcessor(source, store, recording_handler(recorder), **FAST) as processor:
            await until(lambda: processor.owned_partitions == {"0", "1"}, what="the claims")
            await asyncio.sleep(0.5)
            source.throttle(10.0, retry_after=4.0)
            for i in range(10):
                await memory.send(f"e{i}", partition_id=str(i % 2))
            await until(lambda: len(recorder.received) == 10, timeout=60, what="every event")
        return source.injected

    injected = run_virtual(scenario())
    assert injected["server_busy"] >= 2
    assert injected["ignored_retry_after"] == 0, injected


def test_a_recreated_hub_is_reported_and_read_from_its_beginning_instead_of_waiting_for_old_positions(caplog):
    """An emulator restarted empty (or a hub deleted and recreated) starts its sequence
    numbers at 0 again: the pump's position after the events it received is past the new
    end and refused until the hub catches up, so the new hub's first events were never
    delivered. It now says so and reads the new hub from its beginning."""
    recorder = DeliveryRecorder()

    async def scenario():
        memory = InMemoryEventSource(1, clock=virtual_utc_clock())
        store = InMemoryCheckpointStore(clock=virtual_utc_clock())
        for i in range(5):
            await memory.send(f"old {i}")
        async with EventProcessor(memory, store, recording_handler(recorder, checkpoint=False), **FAST):
            await until(lambda: len(recorder.received) == 5, what="the old events")
            memory.recreate()
            for i in range(3):
                await memory.send(f"new {i}")
            await until(lambda: len(recorder.deliveries) >= 2 and recorder.deliveries[-1].first == 0, timeout=30,
                        what="the new hub's events")
            await asyncio.sleep(2)
        return [(d.first, d.last) for d in recorder.deliveries]

    with caplog.at_level(logging.ERROR, logger="eventprocessor"):
        deliveries = run_virtual(scenario())
    assert deliveries[-1] == (0, 2)
    assert any("lost its events" in r.getMessage() for r in caplog.records)
