"""Many events in flight per partition: key-ordered concurrency with exact checkpoints.

Each test is a row of the issue's table or of its "done when", on virtual time over the
in-memory source and store, counted from what the handlers received:

* 4 partitions, 4,000 events over 200 keys, 20 ms per event: one event at a time is
  capped at partitions / latency; 64 in flight per partition gets near 64 times that;
* the ``asyncio.gather`` workaround's failures: one slow event holds the partition up,
  a key's events run out of order, a failure redelivers the whole batch;
* per-key order under random delays on many seeds, and no two calls of one key overlap;
* a planned move delivers nothing twice; a crash delivers again only what was not done;
* a poison key does not stall the others.
"""
from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict

import pytest

from eventprocessor import (
    ConcurrencyPolicy,
    ConfigurationError,
    EventProcessor,
    FailurePolicy,
    InvalidCheckpointError,
    Ordering,
    PartitionProcessor,
    PoisonEventsError,
)
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import FaultyStore, run_virtual, virtual_utc_clock

FAST = dict(load_balancing_interval=0.5, partition_ownership_expiration_interval=6.0)


async def until(condition, *, timeout: float = 120.0, what: str = "condition") -> float:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} virtual seconds waiting for {what}")
        await asyncio.sleep(0.01)
    return loop.time()


def _world(partitions: int = 1):
    clock = virtual_utc_clock()
    return InMemoryEventSource(partitions, clock=clock), InMemoryCheckpointStore(clock=clock)


def _skewed_keys(count: int, keys: int, rng: random.Random) -> list[str]:
    """``count`` partition keys out of ``keys``, Zipf-like: key k weighs 1 / (k + 1)."""
    weights = [1 / (k + 1) for k in range(keys)]
    return [f"k{k}" for k in rng.choices(range(keys), weights=weights, k=count)]


class Log:
    """What the handlers of one test received: calls (partition, key, events, start,
    end, claim), every delivery of every event, and how many ran at once."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.delivered: dict[tuple[str, int], int] = defaultdict(int)
        self.running: dict[str, int] = defaultdict(int)
        self.most_running: dict[str, int] = defaultdict(int)
        self.errors: list[Exception] = []

    def begin(self, context, events) -> dict:
        call = {"partition": context.partition_id, "keys": {e.partition_key for e in events},
                "seqs": [e.sequence_number for e in events], "start": asyncio.get_running_loop().time(),
                "end": None, "owner": context.owner_id}
        self.calls.append(call)
        for event in events:
            self.delivered[(context.partition_id, event.sequence_number)] += 1
        self.running[context.partition_id] += 1
        self.most_running[context.partition_id] = max(self.most_running[context.partition_id],
                                                      self.running[context.partition_id])
        return call

    def end(self, context, call) -> None:
        call["end"] = asyncio.get_running_loop().time()
        self.running[context.partition_id] -= 1

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.delivered.values() if n > 1)


def handler(log: Log, *, delay=0.02, rng: random.Random | None = None, checkpoint: bool = False,
            fail=lambda event, attempt: False, per_event: bool = True) -> type:
    attempts: dict[tuple[str, int], int] = defaultdict(int)

    class Handler(PartitionProcessor):
        async def process_events(self, events, context):
            call = log.begin(context, events)
            try:
                for event in events if per_event else events[:1]:
                    attempts[(context.partition_id, event.sequence_number)] += 1
                    wait = delay(event) if callable(delay) else delay
                    await asyncio.sleep(rng.uniform(0, 2 * wait) if rng is not None else wait)
                    if fail(event, attempts[(context.partition_id, event.sequence_number)]):
                        raise ValueError(f"cannot handle event {event.sequence_number}")
            finally:
                log.end(context, call)
            if checkpoint:
                await context.update_checkpoint()

        async def process_error(self, error, context):
            log.errors.append(error)

    return Handler


async def _send(source: InMemoryEventSource, keys: list[str]) -> dict[str, list[tuple[str, int]]]:
    """Send one event per key in ``keys``; return each key's (partition, sequence number)s in order."""
    sent: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for key in keys:
        event = await source.send(b"x", partition_key=key)
        sent[key].append((event.partition_id, event.sequence_number))
    return sent


# ---------------------------------------------------------------------- the options


def test_the_options_refuse_what_cannot_work_and_say_why():
    source, store = _world()
    with pytest.raises(ConfigurationError, match="ordering='partition' runs one call at a time"):
        EventProcessor(source, store, PartitionProcessor, max_concurrency=8)
    with pytest.raises(ConfigurationError, match="one call's rollback would undo another's"):
        EventProcessor(source, store, PartitionProcessor, max_concurrency=8, ordering="key", stateful=True)
    with pytest.raises(ConfigurationError, match="unknown ordering 'keys'"):
        EventProcessor(source, store, PartitionProcessor, max_concurrency=8, ordering="keys")
    with pytest.raises(ConfigurationError, match="not both"):
        EventProcessor(source, store, PartitionProcessor, max_concurrency=8,
                       concurrency=ConcurrencyPolicy(max_concurrency=8, ordering="key"))
    with pytest.raises(ConfigurationError, match="max_pending must be an int of at least 64"):
        ConcurrencyPolicy(max_concurrency=64, ordering="key", max_pending=10)
    policy = ConcurrencyPolicy(max_concurrency=64, ordering="key")
    assert policy.ordering is Ordering.KEY and policy.max_pending == 4096
    EventProcessor(source, store, PartitionProcessor, max_concurrency=1, ordering="key", stateful=False)


# ---------------------------------------------------------------------- the table


def _run_table_row(max_concurrency: int, ordering: str) -> tuple[float, Log, dict]:
    async def scenario():
        source, store = _world(4)
        rng = random.Random(36)
        keys = [f"k{rng.randrange(200)}" for _ in range(4000)]
        sent = await _send(source, keys)
        log = Log()
        kwargs = {} if max_concurrency == 1 else dict(max_concurrency=max_concurrency, ordering=ordering)
        async with EventProcessor(source, store, handler(log), **kwargs, **FAST):
            start = asyncio.get_running_loop().time()
            done = await until(lambda: len(log.delivered) == 4000, timeout=600, what="all 4,000 events")
        return 4000 / (done - start), log, sent

    return run_virtual(scenario())


def test_one_event_at_a_time_is_capped_and_64_in_flight_per_partition_goes_over_ten_times_as_fast():
    """Row 1: 4 partitions, 4,000 events over 200 keys, 20 ms per event. In turn: at
    most partitions / latency = 200 events/s. 64 in flight per partition: the limit is
    4 x 64 / 20 ms = 12,800 events/s; with about 50 keys per partition, and each key's
    events in turn, at most about 50 run at once per partition."""
    sequential, _, _ = _run_table_row(1, "partition")
    assert sequential <= 250  # 200 while all four run, counted from the start of the last calls
    concurrent, log, sent = _run_table_row(64, "key")
    assert concurrent >= 10 * sequential, (sequential, concurrent)
    assert max(log.most_running.values()) <= 64
    assert log.duplicates() == 0


def test_one_slow_event_holds_up_only_its_own_key():
    """Row 2, the gather workaround: one event in 500 takes 1 s, and the whole partition
    waited for it. Here the other keys go on while it runs."""
    async def scenario():
        source, store = _world(1)
        keys = _skewed_keys(1000, 50, random.Random(7))
        await _send(source, keys)
        log = Log()
        slow = {500}
        delays = lambda event: 1.0 if event.sequence_number in slow else 0.02  # noqa: E731
        async with EventProcessor(source, store, handler(log, delay=delays), max_concurrency=64, ordering="key",
                                  **FAST):
            await until(lambda: any(500 in c["seqs"] for c in log.calls), what="the slow event")
            slow_started = next(c["start"] for c in log.calls if 500 in c["seqs"])
            await until(lambda: len(log.delivered) == 1000, what="every event")
        during = [c for c in log.calls if slow_started < c["start"] < slow_started + 0.9]
        return during

    during = run_virtual(scenario())
    assert len(during) >= 20  # calls of other keys started while the slow event ran


@pytest.mark.parametrize("seed", range(12))
def test_each_keys_events_arrive_in_order_and_calls_of_one_key_never_overlap(seed):
    """Per-key order under random delays (many seeds), and one call per key at a time."""
    async def scenario():
        rng = random.Random(seed)
        source, store = _world(2)
        sent = await _send(source, _skewed_keys(600, 30, rng))
        log = Log()
        policy = ConcurrencyPolicy(max_concurrency=rng.choice([4, 16, 64]), ordering="key",
                                   max_pending=rng.choice([64, 200, 1024]))
        async with EventProcessor(source, store, handler(log, rng=rng, delay=0.05), concurrency=policy,
                                  max_batch_size=rng.choice([1, 5, 50]), **FAST):
            await until(lambda: len(log.delivered) == 600, what="every event")
        return sent, log, policy

    sent, log, policy = run_virtual(scenario())
    assert log.duplicates() == 0
    by_key: dict[str, list[int]] = defaultdict(list)
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for call in sorted(log.calls, key=lambda c: c["start"]):
        assert len(call["keys"]) == 1, call  # one key per call
        key = next(iter(call["keys"]))
        by_key[key].extend(call["seqs"])
        spans[key].append((call["start"], call["end"]))
    for key, order in by_key.items():
        assert order == [seq for _, seq in sent[key]], key
        for (_, end), (start, _) in zip(spans[key], spans[key][1:], strict=False):
            assert start >= end, key  # the key's next call starts after its previous one ended
    assert max(log.most_running.values()) <= policy.max_concurrency


def test_ordering_none_runs_any_events_at_once():
    async def scenario():
        source, store = _world(1)
        await _send(source, ["same"] * 200)  # one key: under ordering="key" one call at a time
        log = Log()
        async with EventProcessor(source, store, handler(log), max_concurrency=16, ordering="none",
                                  max_batch_size=5, **FAST):
            await until(lambda: len(log.delivered) == 200, what="every event")
        return log

    log = run_virtual(scenario())
    assert log.most_running["0"] == 16 and log.duplicates() == 0


def test_the_processor_wide_cap_holds_over_partitions():
    async def scenario():
        source, store = _world(4)
        await _send(source, _skewed_keys(800, 100, random.Random(3)))
        log = Log()
        total = {"now": 0, "most": 0}

        class Counted(handler(log)):  # type: ignore[misc]
            async def process_events(self, events, context):
                total["now"] += 1
                total["most"] = max(total["most"], total["now"])
                try:
                    await super().process_events(events, context)
                finally:
                    total["now"] -= 1

        policy = ConcurrencyPolicy(max_concurrency=32, ordering="key", max_in_flight=40)
        async with EventProcessor(source, store, Counted, concurrency=policy, **FAST):
            await until(lambda: len(log.delivered) == 800, what="every event")
        return total["most"]

    assert run_virtual(scenario()) == 40


def test_partitions_take_turns_for_the_processor_wide_cap():
    """A call's task runs the partition's next calls while no other partition waits for a
    slot; once one does, slots pass to it as calls end, so a busy partition cannot keep
    the processor-wide cap to itself."""
    async def scenario():
        source, store = _world(2)
        for index in range(4000):
            source.append(b"x", partition_key=f"k{index % 400}")
        starts: list[tuple[float, str]] = []
        loop = asyncio.get_running_loop()

        class Timed(PartitionProcessor):
            async def process_events(self, events, context):
                starts.append((loop.time(), context.partition_id))
                await asyncio.sleep(0.01)

        policy = ConcurrencyPolicy(max_concurrency=8, ordering="key", max_in_flight=8)
        async with EventProcessor(source, store, Timed, concurrency=policy, **FAST):
            await until(lambda: {p for _, p in starts} == {"0", "1"}, what="both partitions")
            await asyncio.sleep(1.0)
        return starts

    starts = run_virtual(scenario())
    first_partition = starts[0][1]
    second = min(t for t, p in starts if p != first_partition)  # when the second partition was claimed
    later = [p for t, p in starts if second + 0.1 <= t <= second + 1.0]
    assert later.count(first_partition) >= len(later) / 4, "the first partition kept the slots to itself"
    assert len(later) - later.count(first_partition) >= len(later) / 4, "the second partition got no slots"


# ---------------------------------------------------------------------- failures per key


@pytest.mark.parametrize("on_poison", ["skip", "park"])
def test_a_poison_key_does_not_stall_the_other_keys(on_poison):
    """Key "bad" fails on every attempt. Its later events never overtake the failing one;
    the other keys' events are all delivered while it is retried (skip) or parked (park)."""
    async def scenario():
        source, store = _world(1)
        keys = ["bad"] + [f"k{i % 20}" for i in range(300)] + ["bad", "bad"]
        sent = await _send(source, keys)
        log = Log()
        failing = handler(log, delay=0.01, fail=lambda event, attempt: event.partition_key == "bad"
                          and event.sequence_number == 0)
        policy = FailurePolicy(max_delivery_attempts=3, on_poison=on_poison)
        async with EventProcessor(source, store, failing, max_concurrency=8, ordering="key",
                                  failure_policy=policy, **FAST):
            others = {seq for key, where in sent.items() if key != "bad" for _, seq in where}
            done_at = await until(lambda: others <= {seq for _, seq in log.delivered}, what="the other keys")
            await asyncio.sleep(10)
        return sent, log, done_at

    sent, log, done_at = run_virtual(scenario())
    bad = [c for c in log.calls if c["keys"] == {"bad"}]
    assert bad[0]["seqs"][0] == 0
    first_ok = [c for c in bad if any(s != 0 for s in c["seqs"])]
    poisoned = [e for e in log.errors if isinstance(e, PoisonEventsError)]
    assert len(poisoned) == 1 and poisoned[0].events[0].sequence_number == 0
    if on_poison == "skip":
        assert first_ok and first_ok[0]["seqs"] == [s for _, s in sent["bad"][1:]]  # in order, after it
    else:
        assert not first_ok  # parked: the key's later events wait, never overtake
    assert done_at < 3.0  # the others did not wait for the retries (0.5 + 1 s of backoff)
    bad_seqs = {seq for _, seq in sent["bad"]}
    assert all(count == 1 for (_, seq), count in log.delivered.items() if seq not in bad_seqs)  # none redelivered


# ---------------------------------------------------------------------- checkpoints and moves


def test_a_call_checkpoints_its_own_events_and_the_record_names_those_done_beyond():
    """Event 1 is slow; 0, 2, 3, 4 are quick and each call checkpoints. The checkpoint
    stays at 0 (the last event before the first not done) and records 2-4 as done beyond
    it; once the slow call returns, it moves to 4. A call cannot checkpoint another's event."""
    async def scenario():
        source, store = _world(1)
        await _send(source, ["first", "slow", "a", "b", "c"])
        log = Log()
        delays = lambda event: 5.0 if event.partition_key == "slow" else 0.01  # noqa: E731
        calls: list = []
        scope = (source.fully_qualified_namespace, source.eventhub_name, "$default")

        class Checkpointing(handler(log, delay=delays)):  # type: ignore[misc]
            async def process_events(self, events, context):
                await super().process_events(events, context)
                if calls and events[0].partition_key == "c":
                    with pytest.raises(InvalidCheckpointError, match="not an event of this call"):
                        await context.update_checkpoint(calls[0][0])
                await context.update_checkpoint()
                calls.append(events)

        async with EventProcessor(source, store, Checkpointing, max_concurrency=4, ordering="key", **FAST):
            await until(lambda: len(calls) == 4, what="four quick calls")
            [early] = await store.list_checkpoints(*scope)
            await until(lambda: len(calls) == 5, what="the slow call")
            [late] = await store.list_checkpoints(*scope)
        return early, late

    early, late = run_virtual(scenario())
    assert early.sequence_number == 0 and early.done_beyond.ranges == ((2, 4),)
    assert late.sequence_number == 4 and not late.done_beyond.ranges


def test_a_planned_move_delivers_nothing_twice():
    """A second processor asks for half the partitions while calls are in flight: the
    first drains its calls, checkpoints exactly, and the second skips what was done."""
    async def scenario():
        source, store = _world(4)
        rng = random.Random(11)
        keys = _skewed_keys(2000, 80, rng)
        log = Log()
        Handler = handler(log, rng=rng, delay=0.05)
        first = EventProcessor(source, store, Handler, max_concurrency=32, ordering="key", owner_id="a", **FAST)
        second = EventProcessor(source, store, Handler, max_concurrency=32, ordering="key", owner_id="b", **FAST)
        async with first:
            await _send(source, keys[:1000])
            await until(lambda: len(log.delivered) > 300, what="first deliveries")
            async with second:
                await _send(source, keys[1000:])
                await until(lambda: len(log.delivered) == 2000, what="every event")
                await until(lambda: len(second.owned_partitions) == 2, what="the move")
        return log

    log = run_virtual(scenario())
    assert {c["owner"] for c in log.calls} == {"a", "b"}
    assert log.duplicates() == 0


def test_a_new_owner_after_a_crash_delivers_again_only_what_was_not_done():
    """The first owner stops dead (nothing it writes lands any more) with a slow call in
    flight and every later call done and checkpointed by the cadence: the next owner
    delivers the slow event again, and none of the 100 recorded done beyond the checkpoint."""
    async def scenario():
        source, store = _world(1)
        await _send(source, ["first", "slow"] + [f"k{i % 10}" for i in range(100)])
        log = Log()
        delays = lambda event: 20.0 if event.partition_key == "slow" else 0.01  # noqa: E731
        policy = ConcurrencyPolicy(max_concurrency=8, ordering="key", checkpoint_interval=1.0)
        link = FaultyStore(store)
        first = EventProcessor(source, link, handler(log, delay=delays), concurrency=policy, owner_id="a",
                               store_timeout=1.0, **FAST)
        await first.start()
        await until(lambda: sum(1 for c in log.calls if c["end"] is not None) == len(log.calls) - 1
                    and len(log.delivered) == 102, what="all but the slow call done")
        await asyncio.sleep(1.5)  # a periodic checkpoint records them
        link.down = True  # the first owner is gone: nothing it writes lands any more
        crashed_at = len(log.calls)
        second = EventProcessor(source, store, handler(log, delay=delays), concurrency=policy, owner_id="b",
                                **FAST)
        async with second:
            await until(lambda: any(c["owner"] == "b" for c in log.calls), what="the next owner")
            await asyncio.sleep(5)
            await first.stop()
        return log, crashed_at

    log, crashed_at = run_virtual(scenario())
    again = [seq for call in log.calls[crashed_at:] if call["owner"] == "b" for seq in call["seqs"]]
    assert again == [1]  # the slow event, in flight at the crash; nothing done is delivered again


# ---------------------------------------------------------------------- the drop-in client


@pytest.mark.parametrize("batch", [True, False])
def test_the_drop_in_client_runs_calls_of_other_keys_at_once_and_keeps_each_keys_order(batch):
    """``receive_batch``/``receive`` with ``max_concurrency`` and ``ordering="key"``: calls of
    different keys overlap; a key's events arrive in order; each callback's context
    checkpoints its own events; a failing event is redelivered without the ones before it."""
    from eventprocessor import EventHubConsumerClient

    async def scenario():
        source, store = _world(1)
        sent = await _send(source, [f"k{i % 8}" for i in range(160)])
        seen: dict[str, list[int]] = defaultdict(list)
        running = {"now": 0, "most": 0}
        failed: set[int] = set()
        client = EventHubConsumerClient.from_source(source, checkpoint_store=store, **FAST)

        async def work(context, events):
            running["now"] += 1
            running["most"] = max(running["most"], running["now"])
            try:
                await asyncio.sleep(0.05)
                if any(data.sequence_number == 40 for data in events) and not failed:
                    failed.add(40)
                    raise ValueError("once")  # the whole call is delivered again
                for data in events:
                    key = data.partition_key
                    seen[key.decode() if isinstance(key, bytes) else key].append(data.sequence_number)
            finally:
                running["now"] -= 1
            await context.update_checkpoint()

        async def on_event(context, event):
            await work(context, [event])

        receiving = asyncio.ensure_future(
            client.receive_batch(work, max_concurrency=8, ordering="key", starting_position="-1") if batch else
            client.receive(on_event, max_concurrency=8, ordering="key", starting_position="-1"))
        await until(lambda: sum(map(len, seen.values())) >= 160, what="every event")
        await client.close()
        await receiving
        [checkpoint] = await store.list_checkpoints(source.fully_qualified_namespace, source.eventhub_name,
                                                    "$default")
        return sent, seen, running["most"], checkpoint

    sent, seen, most, checkpoint = run_virtual(scenario())
    assert most == 8
    for key, order in seen.items():
        assert order == [seq for _, seq in sent[key]], key  # in order, each once
    assert checkpoint.sequence_number == 159


# ---------------------------------------------------------------------- what status shows


def test_status_reports_the_calls_in_flight_and_the_oldest_event_not_done_per_partition():
    """The processor publishes, per partition, the calls in flight and the enqueued time
    of the oldest event not done in its member record; ``eventprocessor status`` shows them."""
    from rich.console import Console

    from eventprocessor.cli.status import read_status, render

    async def scenario():
        source, store = _world(2)
        await _send(source, ["slow"] + [f"k{i % 20}" for i in range(200)])
        log = Log()
        delays = lambda event: 40.0 if event.partition_key == "slow" else 1.0  # noqa: E731
        async with EventProcessor(source, store, handler(log, delay=delays), max_concurrency=8, ordering="key",
                                  **FAST) as processor:
            await until(lambda: len(log.calls) >= 16, what="calls in flight")
            await asyncio.sleep(30)  # a heartbeat publishes them
            mine = processor.in_flight()
            status = await read_status(store, source.fully_qualified_namespace, source.eventhub_name,
                                       "$default", source=source)
            return mine, status, source.partition_for_key("slow")

    mine, status, slow_partition = run_virtual(scenario())
    assert set(mine) == {"0", "1"} and all(calls <= 8 for calls, _held, _oldest in mine.values())
    rows = {row.partition_id: row for row in status.partitions}
    assert rows[slow_partition].in_flight is not None and rows[slow_partition].in_flight >= 1
    assert rows[slow_partition].oldest_in_flight_age >= 25  # the slow event, since it was enqueued
    console = Console(width=200, record=True)
    console.print(render(status))
    shown = console.export_text()
    assert "in flight" in shown and "oldest" in shown


# ---------------------------------------------------------------------- claims, fairness, threads


@pytest.mark.parametrize("seed", range(4))
def test_no_call_is_handed_to_a_claim_that_has_ended(seed):
    """The store goes down while calls are in flight: the lease runs out, the claim
    ends (self-fencing), and no call starts once the claim may no longer dispatch; the
    calls in flight finish. When the store returns, the partition is taken again and
    every event is delivered."""
    async def scenario():
        rng = random.Random(seed)
        source, store = _world(2)
        sent = await _send(source, _skewed_keys(400, 40, rng))
        link = FaultyStore(store)
        after_end: list = []
        log = Log()

        class Watching(handler(log, rng=rng, delay=0.3)):  # type: ignore[misc]
            async def process_events(self, events, context):
                if not context.is_owned:
                    after_end.append(events[0].sequence_number)
                await super().process_events(events, context)

        async with EventProcessor(source, link, Watching, max_concurrency=16, ordering="key", store_timeout=1.0,
                                  **FAST) as processor:
            await until(lambda: len(log.delivered) > 60, what="calls in flight")
            link.down = True
            await until(lambda: not processor.owned_partitions, what="the claims to end")
            await asyncio.sleep(rng.uniform(1, 5))
            link.down = False
            total = sum(len(v) for v in sent.values())
            await until(lambda: len(log.delivered) == total, what="every event", timeout=300)
        return after_end

    assert run_virtual(scenario()) == []


def test_a_hot_key_does_not_starve_the_others():
    """Half the events share one key: it gets one call at a time like every other key,
    so the other keys finish long before it does."""
    async def scenario():
        source, store = _world(1)
        keys = [("hot" if i % 2 else f"k{i % 50}") for i in range(1000)]
        await _send(source, keys)
        log = Log()
        async with EventProcessor(source, store, handler(log, delay=0.02), max_concurrency=8, ordering="key",
                                  max_batch_size=10, **FAST):
            await until(lambda: len(log.delivered) == 1000, what="every event", timeout=600)
        return log

    log = run_virtual(scenario())
    ends: dict[str, float] = defaultdict(float)
    starts: dict[str, float] = {}
    for call in log.calls:
        key = next(iter(call["keys"]))
        ends[key] = max(ends[key], call["end"])
        starts.setdefault(key, call["start"])
    others = max(end for key, end in ends.items() if key != "hot")
    assert others < 0.3 * ends["hot"]  # 500 events of 20 ms in turn: 10 s for the hot key
    assert starts["hot"] == min(starts.values())


def test_blocking_handler_code_runs_off_the_event_loop_with_calls_in_flight():
    """``handler_executor="thread"`` with ``max_concurrency``: a worker thread per call in
    flight, so blocking calls of different keys overlap and the loop is never held."""
    import threading
    import time as wall

    threads: set[str] = set()
    overlapping = {"now": 0, "most": 0, "done": 0}
    lock = threading.Lock()

    class Blocking(PartitionProcessor):
        def process_events(self, events, context):
            with lock:
                threads.add(threading.current_thread().name)
                overlapping["now"] += 1
                overlapping["most"] = max(overlapping["most"], overlapping["now"])
            wall.sleep(0.05)  # blocking I/O
            with lock:
                overlapping["now"] -= 1
                overlapping["done"] += len(events)

    async def scenario():
        source, store = InMemoryEventSource(1), InMemoryCheckpointStore()
        await _send(source, [f"k{i % 8}" for i in range(64)])
        processor = EventProcessor(source, store, Blocking, max_concurrency=4, ordering="key",
                                   handler_executor="thread", load_balancing_interval=0.2)
        async with processor:
            deadline = asyncio.get_running_loop().time() + 60
            while overlapping["done"] < 64 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)

    asyncio.run(scenario())
    assert overlapping["done"] == 64
    assert overlapping["most"] >= 2 and len(threads) >= 2 and all(name.startswith("handler-0") for name in threads)


@pytest.mark.parametrize("seed", range(6))
def test_after_failures_and_retries_each_key_is_still_handled_in_order(seed):
    """Random delays and one event in ten failing once (its call raises, the key's
    events wait for its redelivery): the order in which each key's events were handled
    successfully is the order they were sent, and none was handled twice."""
    async def scenario():
        rng = random.Random(seed)
        source, store = _world(2)
        sent = await _send(source, _skewed_keys(300, 12, rng))
        failing = set(rng.sample(range(300), 30))
        handled: dict[str, list[int]] = defaultdict(list)
        tried: set[tuple[str, int]] = set()

        class Flaky(PartitionProcessor):
            async def process_events(self, events, context):
                done = []
                for event in events:
                    await asyncio.sleep(rng.uniform(0, 0.05))
                    key = (context.partition_id, event.sequence_number)
                    if event.sequence_number in failing and key not in tried:
                        tried.add(key)
                        raise ValueError("once")
                    done.append(event)
                for event in done:  # the call succeeded: these are handled
                    handled[event.partition_key].append(event.sequence_number)

        policy = FailurePolicy(max_delivery_attempts=3, retry_backoff=0.1)
        async with EventProcessor(source, store, Flaky, max_concurrency=8, ordering="key", failure_policy=policy,
                                  max_batch_size=rng.choice([1, 4, 20]), **FAST):
            await until(lambda: sum(map(len, handled.values())) >= 300, what="every event handled")
            await asyncio.sleep(1)
        return sent, handled

    sent, handled = run_virtual(scenario())
    for key, order in handled.items():
        assert order == [seq for _, seq in sent[key]], key


def test_a_stop_waits_for_the_calls_in_flight_but_not_for_ever(caplog):
    """``stop()`` lets the calls in flight finish (a planned move drains them), and a
    handler that never returns is cancelled after ``shutdown_timeout``, as one batch at a
    time is: the stop ends within that bound, and so does the partition's task."""
    async def scenario():
        source, store = _world(1)
        await _send(source, [f"k{i}" for i in range(20)])
        finished: list[int] = []

        class Hanging(PartitionProcessor):
            async def process_events(self, events, context):
                if events[0].partition_key == "k0":
                    await asyncio.Event().wait()  # never returns
                await asyncio.sleep(1.0)
                finished.extend(e.sequence_number for e in events)

        processor = EventProcessor(source, store, Hanging, max_concurrency=8, ordering="key", shutdown_timeout=5.0,
                                   **FAST)
        await processor.start()
        while not processor.owned_partitions:  # claimed after the group's join delay
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # 8 calls in flight, k0's hung
        loop = asyncio.get_running_loop()
        started = loop.time()
        await processor.stop()
        return loop.time() - started, finished

    with caplog.at_level(logging.ERROR, logger="eventprocessor"):
        took, finished = run_virtual(scenario())
    assert len(finished) == 7  # the 7 calls in flight besides k0's finished; no new call started
    assert took < 5.0 + 2.0
    assert not [r for r in caplog.records if "ignored cancellation" in r.getMessage()]
