"""InMemoryEventSource: positions, keys, round-robin, partitions added, owner levels."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from eventprocessor import ConfigurationError, EventPosition, ReceiverDisconnectedError
from eventprocessor.sources import InMemoryEventSource


class Ticking:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=timezone.utc)

    def __call__(self) -> datetime:
        self.now += timedelta(seconds=1)
        return self.now


async def _read_all(source, pid, position, group="$default", level=None):
    receiver = await source.open_receiver(pid, consumer_group=group, starting_position=position,
                                          owner_level=level, prefetch=10)
    events = await receiver.receive(1000, 0.01)
    await receiver.close()
    return events


async def test_sequence_numbers_offsets_and_enqueued_times_per_partition():
    source = InMemoryEventSource(2, clock=Ticking())
    sent = [await source.send(f"event-{i}".encode(), partition_id="1") for i in range(3)]
    assert [e.sequence_number for e in sent] == [0, 1, 2]
    assert [int(e.offset) for e in sent] == sorted(int(e.offset) for e in sent) and len({e.offset for e in sent}) == 3
    assert sent[0].enqueued_time < sent[1].enqueued_time < sent[2].enqueued_time
    assert source.events("0") == []
    got = await _read_all(source, "1", EventPosition.earliest())
    assert got == sent and got[1].body_as_str() == "event-1"


async def test_starting_positions():
    source = InMemoryEventSource(1, clock=Ticking())
    sent = [await source.send(str(i)) for i in range(6)]
    seqs = lambda events: [e.sequence_number for e in events]  # noqa: E731
    assert seqs(await _read_all(source, "0", EventPosition.latest())) == []
    assert seqs(await _read_all(source, "0", EventPosition.from_sequence_number(2))) == [3, 4, 5]
    assert seqs(await _read_all(source, "0", EventPosition.from_sequence_number(2, inclusive=True))) == [2, 3, 4, 5]
    assert seqs(await _read_all(source, "0", EventPosition.from_offset(sent[4].offset))) == [5]
    assert seqs(await _read_all(source, "0", EventPosition.from_offset(sent[4].offset, inclusive=True))) == [4, 5]
    assert seqs(await _read_all(source, "0", EventPosition.from_enqueued_time(sent[3].enqueued_time))) == [4, 5]
    assert seqs(await _read_all(source, "0", EventPosition.from_enqueued_time(sent[3].enqueued_time,
                                                                             inclusive=True))) == [3, 4, 5]


async def test_latest_sees_only_new_events_and_receive_waits_for_them():
    source = InMemoryEventSource(1)
    await source.send("old")
    receiver = await source.open_receiver("0", consumer_group="g", starting_position=EventPosition.latest(),
                                          owner_level=None, prefetch=0)
    pending = asyncio.create_task(receiver.receive(10, None))
    await asyncio.sleep(0.01)
    assert not pending.done()
    await source.send("new")
    events = await asyncio.wait_for(pending, 5)
    assert [e.body for e in events] == [b"new"]
    assert await receiver.receive(10, 0.01) == []


async def test_partition_key_is_stable_and_round_robin_spreads():
    source = InMemoryEventSource(4)
    keyed = {(await source.send("x", partition_key="device-7")).sequence_number for _ in range(5)}
    assert keyed == {0, 1, 2, 3, 4}
    assert len(source.events(source.partition_for_key("device-7"))) == 5
    source2 = InMemoryEventSource(4)
    for i in range(8):
        await source2.send(str(i))
    assert [len(source2.events(p)) for p in await source2.get_partition_ids()] == [2, 2, 2, 2]


async def test_add_partitions_and_bad_input():
    source = InMemoryEventSource(2)
    assert source.add_partitions(3) == ["2", "3", "4"]
    assert await source.get_partition_ids() == ["0", "1", "2", "3", "4"]
    with pytest.raises(ConfigurationError, match="partition '9' does not exist"):
        await source.send("x", partition_id="9")
    with pytest.raises(ConfigurationError):
        InMemoryEventSource(0)
    with pytest.raises(TypeError):
        await source.send(123)  # type: ignore[arg-type]


async def test_higher_owner_level_disconnects_lower_and_lower_cannot_open():
    source = InMemoryEventSource(1)
    old = await source.open_receiver("0", consumer_group="g", starting_position=EventPosition.earliest(),
                                     owner_level=1, prefetch=0)
    waiting = asyncio.create_task(old.receive(10, None))
    await asyncio.sleep(0.01)
    new = await source.open_receiver("0", consumer_group="g", starting_position=EventPosition.earliest(),
                                     owner_level=2, prefetch=0)
    with pytest.raises(ReceiverDisconnectedError, match="owner level 2"):
        await asyncio.wait_for(waiting, 5)
    with pytest.raises(ReceiverDisconnectedError, match="owner level 2 is open"):
        await source.open_receiver("0", consumer_group="g", starting_position=EventPosition.earliest(),
                                   owner_level=1, prefetch=0)
    # other consumer groups are independent
    other = await source.open_receiver("0", consumer_group="other", starting_position=EventPosition.earliest(),
                                       owner_level=1, prefetch=0)
    await source.send("e")
    assert len(await new.receive(10, 1)) == 1 and len(await other.receive(10, 1)) == 1


async def test_retention_keeps_the_newest_events_of_each_partition():
    source = InMemoryEventSource(2, clock=Ticking(), max_events_per_partition=5)
    sent = [await source.send(f"e{i}", partition_id="0") for i in range(12)]
    assert [e.sequence_number for e in sent] == list(range(12))
    assert [e.sequence_number for e in source.events("0")] == [7, 8, 9, 10, 11]
    properties = await source.get_partition_properties("0")
    assert (properties.beginning_sequence_number, properties.last_enqueued_sequence_number) == (7, 11)
    assert source.last_sequence_number("0") == 11
    seqs = lambda events: [e.sequence_number for e in events]  # noqa: E731
    assert seqs(await _read_all(source, "0", EventPosition.earliest())) == [7, 8, 9, 10, 11]
    # A position older than what is retained starts at the oldest retained event.
    assert seqs(await _read_all(source, "0", EventPosition.from_sequence_number(2))) == [7, 8, 9, 10, 11]
    assert seqs(await _read_all(source, "0", EventPosition.from_sequence_number(9))) == [10, 11]
    assert seqs(await _read_all(source, "0", EventPosition.from_offset(sent[8].offset))) == [9, 10, 11]
    assert seqs(await _read_all(source, "0", EventPosition.from_enqueued_time(sent[9].enqueued_time))) == [10, 11]
    assert seqs(await _read_all(source, "0", EventPosition.latest())) == []
    assert source.events("1") == [] and (await source.get_partition_properties("1")).is_empty


async def test_a_receiver_that_falls_behind_retention_goes_on_from_the_oldest_retained_event():
    source = InMemoryEventSource(1, max_events_per_partition=4)
    for i in range(3):
        await source.send(str(i))
    receiver = await source.open_receiver("0", consumer_group="g", starting_position=EventPosition.earliest(),
                                          owner_level=None, prefetch=0)
    assert [e.sequence_number for e in await receiver.receive(2, 0.01)] == [0, 1]
    for i in range(3, 3000):  # past the point where the log compacts its list
        await source.send(str(i))
    assert [e.sequence_number for e in await receiver.receive(10, 0.01)] == [2996, 2997, 2998, 2999]
    await source.send("next")
    assert [e.sequence_number for e in await receiver.receive(10, 0.01)] == [3000]
    await receiver.close()


async def test_retention_frees_the_events_it_drops():
    """What a soak needs: a producer that runs for hours keeps the process bounded."""
    import gc
    import weakref

    source = InMemoryEventSource(1, max_events_per_partition=10)
    first = weakref.ref(await source.send("first"))
    for i in range(5000):
        await source.send(str(i))
    gc.collect()
    assert first() is None
    assert len(source.events("0")) == 10


def test_retention_must_be_a_positive_count():
    for bad in (0, -1, 2.5, True, "10"):
        with pytest.raises(ConfigurationError, match="max_events_per_partition must be an int of at least 1"):
            InMemoryEventSource(1, max_events_per_partition=bad)
