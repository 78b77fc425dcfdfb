"""The exact checkpoint of a partition with many events in flight, as properties
(hypothesis) over any order in which calls end, and its record in the store.

* the checkpoint never passes an event not done, and the record of events done beyond
  it names only events done;
* a new owner that resumes from the record skips exactly the events it names;
* the record reads back as written from every store, fits in one field, and a fence
  keeps it with the position it goes with; a reader that ignores it resumes after the
  checkpoint (at least once).
"""
from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from eventprocessor._delivery.progress import Progress
from eventprocessor.events import Event
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import MAX_DONE_TEXT, Checkpoint, DoneBeyond, Ownership
from eventprocessor.testing import run_virtual

WHEN = datetime(2026, 1, 1, tzinfo=timezone.utc)


def _event(seq: int) -> Event:
    return Event(b"x", seq, str(seq * 10), WHEN, partition_id="0")


@st.composite
def _runs(draw):
    """Events ``start..start+n-1``, received in chunks, finished in any order."""
    start = draw(st.integers(0, 1000))
    count = draw(st.integers(1, 120))
    events = [_event(start + i) for i in range(count)]
    order = draw(st.permutations(range(count)))
    finished = draw(st.integers(0, count))
    chunk = draw(st.integers(1, 40))
    return start, events, list(order[:finished]), chunk


@settings(max_examples=120, deadline=None)
@given(_runs(), st.booleans())
def test_the_checkpoint_never_passes_an_event_not_done(run, resumed):
    start, events, finished, chunk = run
    progress = Progress(Checkpoint("ns", "hub", "$default", "0", start - 1, offset="0") if resumed and start else None)
    for index in range(0, len(events), chunk):
        progress.receive(events[index:index + chunk])
    done: set[int] = set()
    for index in finished:
        progress.finish([events[index]])
        done.add(events[index].sequence_number)
        position = progress.position()
        first_not_done = min((e.sequence_number for e in events if e.sequence_number not in done), default=None)
        if position is None:
            assert not (resumed and start) and (start in done) is False
            continue
        seq, _offset, beyond = position
        if first_not_done is not None:
            assert seq < first_not_done  # never past an event not done
            assert seq == first_not_done - 1 or (seq == start - 1)
        recorded = {n for first, last in beyond.ranges for n in range(first, last + 1)}
        assert recorded <= done and all(n > seq for n in recorded)
        assert recorded == {n for n in done if n > seq}  # exact: every event done beyond it
        assert DoneBeyond.decode(beyond.encode(seq), seq) == beyond


@settings(max_examples=80, deadline=None)
@given(_runs())
def test_a_new_owner_skips_exactly_what_the_record_names(run):
    start, events, finished, chunk = run
    if not finished:
        return
    first = Progress(None)
    first.receive(events)
    first.finish([events[i] for i in finished])
    position = first.position()
    if position is None:
        return
    seq, offset, beyond = position
    second = Progress(Checkpoint("ns", "hub", "$default", "0", seq, offset=offset, done_beyond=beyond))
    redelivered: list[int] = []
    later = [e for e in events if e.sequence_number > seq]  # where a receiver resumes
    for index in range(0, len(later), chunk):
        redelivered += [e.sequence_number for e in second.receive(later[index:index + chunk])]
    not_done = [e.sequence_number for e in later if e.sequence_number not in {events[i].sequence_number
                                                                              for i in finished}]
    assert redelivered == not_done  # in flight or not reached: those, and nothing else


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.integers(0, 5000)), max_size=400), st.integers(0, 2**40))
def test_the_record_fits_one_field_and_leaves_out_only_its_tail(gaps, after):
    ranges, previous = [], after
    for gap, length in gaps:
        first = previous + 1 + gap
        ranges.append((first, first + length))
        previous = first + length
    done = DoneBeyond(tuple(ranges))
    text = done.encode(after)
    assert len(text) <= MAX_DONE_TEXT and text.isascii() and text == text.strip()
    back = DoneBeyond.decode(text, after)
    assert back.ranges == done.ranges[:len(back.ranges)]  # a prefix: what it leaves out is delivered again


def test_the_store_keeps_the_record_and_a_fence_keeps_it_with_its_position():
    async def scenario():
        store = InMemoryCheckpointStore()
        [won] = await store.claim_ownership([Ownership("ns", "hub", "$default", "0", "a", epoch=1)])
        await store.fence_checkpoint(won)
        done = DoneBeyond(((43, 50), (60, 60), (1000, 1200)))
        await store.update_checkpoint(Checkpoint("ns", "hub", "$default", "0", 41, offset="410", done_beyond=done),
                                      owner_id="a", epoch=1)
        [written] = await store.list_checkpoints("ns", "hub", "$default")
        [taken] = await store.claim_ownership([Ownership("ns", "hub", "$default", "0", "b", etag=won.etag,
                                                         epoch=2)])
        resumed = await store.fence_checkpoint(taken)
        [fenced] = await store.list_checkpoints("ns", "hub", "$default")
        return done, written, resumed, fenced

    done, written, resumed, fenced = run_virtual(scenario())
    assert written.done_beyond == done and written.sequence_number == 41
    assert resumed.done_beyond == done and resumed.sequence_number == 41
    assert fenced.done_beyond == done and fenced.sequence_number == 41 and fenced.epoch == 2


@st.composite
def _schedules(draw):
    """Events over a few keys, and a random interleaving of adding them, taking calls and
    ending calls."""
    keys = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=80))
    steps = draw(st.lists(st.tuples(st.sampled_from(["add", "take", "end"]), st.integers(0, 50)), max_size=200))
    return keys, steps


@settings(max_examples=150, deadline=None)
@given(_schedules(), st.integers(1, 8))
def test_calls_of_one_key_come_out_in_order_never_two_at_once_oldest_first_and_none_is_lost(schedule, batch):
    from eventprocessor._delivery.progress import CallQueue
    from eventprocessor.policies import Ordering

    keys, steps = schedule
    events = [Event(b"x", seq, str(seq), WHEN, partition_key=key, partition_id="0") for seq, key in enumerate(keys)]
    queue = CallQueue(Ordering.KEY, batch)
    added, running, out, taken_seqs = 0, {}, [], set()
    for action, amount in steps + [("add", len(events))] + [("drain", 0)] * (2 * len(events) + 2):
        if action == "add":
            chunk = events[added:added + amount + 1]
            queue.add(chunk)
            added += len(chunk)
        elif action == "take" or action == "drain":
            ready = [e.sequence_number for e in events[:added]
                     if e.sequence_number not in taken_seqs and e.partition_key not in running]
            taken = queue.take(8)
            if taken is not None:
                key, got = taken
                assert key not in running and len(got) <= batch and {e.partition_key for e in got} == {key}
                assert got[0].sequence_number == min(ready)  # the oldest event that may run goes first
                running[key] = got
                out += got
                taken_seqs.update(e.sequence_number for e in got)
            else:
                assert not ready
        if (action == "end" or action == "drain") and running:
            key = sorted(running)[amount % len(running)]
            del running[key]
            queue.finished(key)
    assert sorted(e.sequence_number for e in out) == list(range(len(events)))  # none lost, none twice
    for key in set(keys):
        mine = [e.sequence_number for e in out if e.partition_key == key]
        assert mine == sorted(mine)  # each key's events in order
