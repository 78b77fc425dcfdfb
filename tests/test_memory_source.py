"""MemoryEventSource: positions, keys, round-robin, partitions added, owner levels."""
from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone

import pytest

from eventprocessor import ConfigurationError, EventPosition, ReceiverDisconnectedError
from eventprocessor.sources import MemoryEventSource


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
    source = MemoryEventSource(2, clock=Ticking())
    sent = [await source.send(f"event-{i}".encode(), partition_id="1") for i in range(3)]
    assert [e.sequence_number for e in sent] == [0, 1, 2]
    assert [int(e.offset) for e in sent] == sorted(int(e.offset) for e in sent) and len({e.offset for e in sent}) == 3
    assert sent[0].enqueued_time < sent[1].enqueued_time < sent[2].enqueued_time
    assert source.events("0") == []
    got = await _read_all(source, "1", EventPosition.earliest())
    assert got == sent and got[1].body_as_str() == "event-1"


async def test_starting_positions():
    source = MemoryEventSource(1, clock=Ticking())
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
    source = MemoryEventSource(1)
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
    source = MemoryEventSource(4)
    keyed = {(await source.send("x", partition_key="device-7")).sequence_number for _ in range(5)}
    assert keyed == {0, 1, 2, 3, 4}
    assert len(source.events(source.partition_for_key("device-7"))) == 5
    source2 = MemoryEventSource(4)
    for i in range(8):
        await source2.send(str(i))
    assert [len(source2.events(p)) for p in await source2.get_partition_ids()] == [2, 2, 2, 2]


async def test_add_partitions_and_bad_input():
    source = MemoryEventSource(2)
    assert source.add_partitions(3) == ["2", "3", "4"]
    assert await source.get_partition_ids() == ["0", "1", "2", "3", "4"]
    with pytest.raises(ConfigurationError, match="partition '9' does not exist"):
        await source.send("x", partition_id="9")
    with pytest.raises(ConfigurationError):
        MemoryEventSource(0)
    with pytest.raises(TypeError):
        await source.send(123)  # type: ignore[arg-type]


async def test_higher_owner_level_disconnects_lower_and_lower_cannot_open():
    source = MemoryEventSource(1)
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
