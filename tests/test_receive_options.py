"""The receive options users tune, on EventProcessor itself (the drop-in's official names are
in tests/test_consumer_client.py), on the virtual clock: starting positions by partition
with a default, inclusive and exclusive starts, a checkpoint resuming after its event,
overriding checkpoints on purpose (once per partition), ``max_batch_size``,
``max_wait_time`` (an empty batch on the timer, and never a delay for events that are
there), ``prefetch`` reaching the receiver, and lag from
``track_last_enqueued_event_properties`` (``lag()``, the context, and the
``eventprocessor.partition.lag`` gauge moving up and back to 0)."""
from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import replace

import pytest

from eventprocessor import EventPosition, EventProcessor, PartitionProcessor
from eventprocessor._ownership.liveness import LEASE_PROPERTY, MEMBER_LEASES, NUDGE_PROPERTY, encode_nudge
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import Member
from eventprocessor.testing import run_virtual, virtual_utc_clock

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=10.0)


class Recording(PartitionProcessor):
    """Records each batch as (virtual time, partition, sequence numbers); checkpoints."""

    batches: list[tuple[float, str, list[int]]] = []
    checkpoint = True

    async def process_events(self, events, context):
        Recording.batches.append((asyncio.get_running_loop().time(), context.partition_id,
                                  [e.sequence_number for e in events]))
        if events and Recording.checkpoint:
            await context.update_checkpoint()


def _delivered(batches=None) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for _t, pid, seqs in batches if batches is not None else Recording.batches:
        out[pid].extend(seqs)
    return dict(out)


def _world(partitions: int, per_partition: int):
    clock = virtual_utc_clock()
    source = InMemoryEventSource(partitions, clock=clock)
    for i in range(partitions * per_partition):
        source.append(f"e{i}", partition_id=str(i % partitions))
    return source, InMemoryCheckpointStore(clock=clock)


@pytest.fixture(autouse=True)
def _reset():
    Recording.batches = []
    Recording.checkpoint = True


async def _run(source, store, seconds: float = 3.0, **options) -> EventProcessor:
    processor = EventProcessor(source, store, Recording, **{**OPTIONS, **options})
    async with processor:
        await asyncio.sleep(seconds)
    return processor


def test_positions_by_partition_with_a_default_and_inclusive_or_exclusive_starts():
    async def scenario():
        source, store = _world(4, 10)
        await _run(source, store, initial_event_position={
            "0": EventPosition.from_sequence_number(4),                  # after 4
            "1": EventPosition.from_sequence_number(4, inclusive=True),  # at 4
            "2": EventPosition.latest(),                                 # only new events
        }, default_event_position=EventPosition.from_offset(source.events("3")[7].offset, inclusive=True))

    run_virtual(scenario())
    assert _delivered() == {"0": [5, 6, 7, 8, 9], "1": [4, 5, 6, 7, 8, 9], "3": [7, 8, 9]}


def test_a_checkpoint_resumes_after_its_event_and_override_checkpoints_starts_over_once():
    async def scenario():
        source, store = _world(2, 6)
        await _run(source, store)  # checkpoints at 5 on both
        first = _delivered()
        Recording.batches = []
        source.append("new", partition_id="0")
        await _run(source, store)  # resumes after the checkpoint, whatever the initial position
        resumed = _delivered()
        Recording.batches = []
        source.append("new", partition_id="1")
        processor = EventProcessor(source, store, Recording, override_checkpoints={"1"},
                                   initial_event_position=EventPosition.from_sequence_number(2, inclusive=True),
                                   **OPTIONS)
        async with processor:
            await asyncio.sleep(3)
            overridden = _delivered()
            Recording.batches = []
            # the same processor loses and re-claims partition 1: its checkpoint counts now.
            # The other "owner" announces its claim and nudges the owner it took it from,
            # as every processor does after taking a partition (one that does neither is
            # seen at the safety-net listing: tests/test_member_leases.py).
            scope = (source.fully_qualified_namespace, source.eventhub_name, "$default")
            listing = await store.list_ownership(*scope)
            taken = await store.claim_ownership([replace(r, owner_id="someone-else", epoch=r.epoch + 1)
                                                 for r in listing.ownerships if r.partition_id == "1"])
            assert len(taken) == 1
            await store.announce_change(*scope)
            await store.write_member(Member(*scope, "someone-else", properties={
                LEASE_PROPERTY: MEMBER_LEASES, NUDGE_PROPERTY: encode_nudge(1, {processor.owner_id})}))
            await asyncio.sleep(15)  # the other "owner" never renews: expires, claimed back
            again = _delivered()
            lost, owned = processor.stats.lost, set(processor.owned_partitions)
        assert lost == 1 and owned == {"0", "1"}
        return first, resumed, overridden, again

    first, resumed, overridden, again = run_virtual(scenario())
    assert first == {"0": list(range(6)), "1": list(range(6))}
    assert resumed == {"0": [6]}
    assert overridden == {"1": [2, 3, 4, 5, 6]}  # partition 0 keeps its checkpoint: nothing new there
    assert again == {}  # the re-claim resumed from the checkpoint (6), not from 2 again


def test_max_batch_size_caps_batches_and_max_wait_time_never_delays_events_that_are_there():
    async def scenario():
        source, store = _world(1, 1000)
        # A long max_wait_time (15 s) must not hold back events that are already there.
        await _run(source, store, seconds=2.0, max_batch_size=10, max_wait_time=15.0)

    run_virtual(scenario())
    sizes = [len(seqs) for _t, _pid, seqs in Recording.batches if seqs]
    assert sum(sizes) == 1000 and max(sizes) == 10
    first, last = Recording.batches[0][0], Recording.batches[-1][0]
    assert last - first < 1.0, "1000 events in batches of 10 took a second of virtual time or more"


def test_max_wait_time_delivers_an_empty_batch_on_the_timer_and_none_without_it():
    async def scenario(max_wait_time: float | None):
        source, store = _world(1, 0)
        processor = EventProcessor(source, store, Recording, max_wait_time=max_wait_time, **OPTIONS)
        async with processor:
            await asyncio.sleep(10)
            source.append("one", partition_id="0")
            await asyncio.sleep(0.5)

    run_virtual(scenario(2.0))
    empties = [t for t, _pid, seqs in Recording.batches if not seqs]
    assert 3 <= len(empties) <= 5, Recording.batches  # every 2 s while idle, after the claim
    assert all(1.9 <= b - a <= 2.5 for a, b in zip(empties, empties[1:], strict=False)), empties
    assert _delivered() == {"0": [0]}
    Recording.batches = []
    run_virtual(scenario(None))
    assert [seqs for _t, _pid, seqs in Recording.batches] == [[0]]


class PrefetchRecording(InMemoryEventSource):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.opened: list[tuple[str, int, bool]] = []

    async def open_receiver(self, partition_id, **kwargs):
        self.opened.append((partition_id, kwargs["prefetch"], kwargs.get("track_last_enqueued_event_properties",
                                                                         False)))
        return await super().open_receiver(partition_id, **kwargs)


def test_prefetch_and_tracking_reach_the_receiver():
    async def scenario():
        source = PrefetchRecording(2)
        await _run(source, InMemoryCheckpointStore(), prefetch=42, track_last_enqueued_event_properties=True)
        return source.opened

    assert sorted(run_virtual(scenario())) == [("0", 42, True), ("1", 42, True)]


def test_lag_from_last_enqueued_properties_goes_up_while_behind_and_back_to_zero():
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    gate = asyncio.Event()

    class Slow(PartitionProcessor):
        async def process_events(self, events, context):
            await gate.wait()
            await context.update_checkpoint()

    def gauge() -> dict[str, float]:
        data = reader.get_metrics_data()
        points: dict[str, float] = {}
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == "eventprocessor.partition.lag":
                        for point in metric.data.data_points:
                            points[point.attributes["messaging.destination.partition.id"]] = point.value
        return points

    async def scenario():
        source, store = _world(1, 0)
        processor = EventProcessor(source, store, Slow, track_last_enqueued_event_properties=True, max_batch_size=5,
                                   meter_provider=MeterProvider(metric_readers=[reader]), **OPTIONS)
        async with processor:
            await asyncio.sleep(2)
            for i in range(21):
                source.append(f"e{i}", partition_id="0")
            await asyncio.sleep(0.5)  # the handler holds the first batch (0-4); 20 is the newest
            behind = (processor.lag(), gauge())
            gate.set()
            await asyncio.sleep(2)
            caught_up = (processor.lag(), gauge(), processor.pump("0").context.last_enqueued_event_properties)
        return behind, caught_up

    (lag, points), (lag_after, points_after, newest) = run_virtual(scenario())
    assert lag == {"0": 16} and points == {"0": 16}
    assert lag_after == {"0": 0} and points_after == {"0": 0} and newest.sequence_number == 20
