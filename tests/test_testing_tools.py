"""The testing package's own tools: the virtual loop's instants and idle callbacks, the
store-side ownership ledger, the store wrapper's one hook, and reading a Spark file
sink's log per batch."""
from __future__ import annotations

import asyncio

import pytest

from eventprocessor import EventProcessor
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.contract import StoreWrapper
from eventprocessor.testing import (
    LedgerStore,
    OwnershipLedger,
    VirtualTimeLoop,
    recording_handler,
    run_virtual,
    virtual_utc_clock,
)
from eventprocessor.testing.recorder import DeliveryRecorder
from harness.spark_files import batch_files


def test_idle_callbacks_run_once_per_instant_after_everything_due_then_time_moves_on():
    loop = VirtualTimeLoop()
    seen: list[tuple] = []
    log: list[str] = []

    def idle() -> None:
        seen.append((loop.time(), tuple(log)))

    async def worker(name: str, at: float) -> None:
        await asyncio.sleep(at)
        log.append(f"{name}@{loop.time():g}")
        await asyncio.sleep(0)  # still busy at the same instant
        log.append(f"{name} again")

    async def main() -> None:
        loop.add_idle_callback(idle)
        await asyncio.gather(worker("a", 2.0), worker("b", 2.0), worker("c", 5.0))
        await asyncio.sleep(1)

    try:
        loop.run_until_complete(main())
        loop.remove_idle_callback(idle)
        loop.run_until_complete(asyncio.sleep(10))  # removed: not called
    finally:
        loop.close()
    times = [t for t, _ in seen]
    assert times == [0.0, 2.0, 5.0]  # once per instant at which anything ran; 6 ended the run first
    assert seen[1][1] == ("a@2", "b@2", "a again", "b again")  # after everything due at 2
    assert seen[2][1][-2:] == ("c@5", "c again")


def test_an_idle_callback_that_makes_something_runnable_runs_it_at_the_same_instant():
    loop = VirtualTimeLoop()
    future = loop.create_future()
    calls: list[float] = []

    def idle() -> None:
        calls.append(loop.time())
        if loop.time() >= 3 and not future.done():
            future.set_result(loop.time())  # runs the waiter at this same instant

    async def main() -> float:
        await asyncio.sleep(3)
        return await future

    loop.add_idle_callback(idle)
    try:
        assert loop.run_until_complete(main()) == 3.0
        assert loop.time() == 3.0
    finally:
        loop.close()
    assert calls == [0.0, 3.0]  # at 3: the future resolved there, and its waiter ended the run


@pytest.mark.parametrize("first, then", [(0.2, 0.9), (0.4, 1.7), (0.6, 1.7)])
def test_a_timer_runs_at_exactly_its_own_time(first, then):
    """The loop moves to a timer's own time, not by ``when - now``, which lands a rounding
    error off (0.4 then 1.7 would give 1.7000000000000002) and runs timers meant for one
    instant apart."""

    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(first)
        fired = loop.create_future()
        loop.call_at(then, lambda: fired.set_result(loop.time()))
        return await fired

    assert run_virtual(main()) == then


def test_the_ownership_ledger_tells_moves_steals_handoffs_requests_renewals_and_releases_apart():
    ledger = OwnershipLedger(expiration=60.0)
    ledger.write("0", "a", True, 0.0)  # first claim: not a move
    ledger.write("0", "a", True, 30.0)  # renewal
    ledger.write("0", "b", True, 40.0)  # live record taken: a steal
    ledger.write("0", "", True, 50.0)  # release by b
    ledger.write("0", "c", True, 55.0)  # released record taken: a move, no steal
    ledger.write("0", "d", False, 56.0)  # lost race: a 412
    ledger.write("0", "d", True, 200.0)  # expired record taken: a move, no steal
    ledger.write("0", "d", True, 201.0, writer="e")  # e asks d for it (marks the live record)
    ledger.write("0", "e", True, 202.0, writer="d")  # d hands it over to e: a move, no steal
    assert ledger.moves == 4
    assert ledger.steals == 1
    assert ledger.handoffs == 1
    assert ledger.failed_claims == 1
    assert ledger.requests == {"claim": 5, "renew": 1, "release": 1, "request": 1, "handoff": 1}
    assert ledger.live_owner("0", 202.0 + 60.0) == "e" and ledger.live_owner("0", 202.0 + 60.5) is None


def test_a_ledger_store_sees_claims_fences_heartbeats_a_handoff_and_the_releases_at_stop():
    async def main() -> OwnershipLedger:
        ledger = OwnershipLedger(expiration=20.0)
        memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        handler = recording_handler(DeliveryRecorder())
        options = dict(load_balancing_interval=2.0, partition_ownership_expiration_interval=20.0,
                       load_balancing_strategy="greedy")
        first = EventProcessor(source, LedgerStore(memory, ledger, writer="a"), handler, owner_id="a", **options)
        await first.start(balancing=False)
        await first.join()
        await first.balance_once()
        assert ledger.requests["claim"] == 4 and ledger.requests["fence_checkpoint"] == 4
        assert ledger.counts([str(p) for p in range(4)], ["a"], asyncio.get_running_loop().time()) == {"a": 4}
        second = EventProcessor(source, LedgerStore(memory, ledger, writer="b"), handler, owner_id="b", **options)
        await second.start(balancing=False)
        await second.join()
        for _ in range(4):
            await second.balance_once()
            await first.balance_once()
            await asyncio.sleep(2.0)
        await first.stop()
        await second.stop()
        return ledger

    ledger = run_virtual(main())
    assert ledger.handoffs == 2 and ledger.steals == 0  # b asked for its share, a handed it over
    assert ledger.requests["request"] == 2 and ledger.requests["handoff"] == 2
    assert ledger.requests["release"] == 4  # each stop released what it owned
    assert set(ledger.members) == {"a", "b"} and ledger.requests["write_member"] >= 2
    # Every tick lists the members (with the change notice); ownership only while something changed.
    assert ledger.requests["list_members"] == 9 and 1 <= ledger.requests["list_ownership"] < 9
    assert ledger.requests["announce_change"] >= 5  # the claims, the requests, the handoffs, the releases


def test_a_store_wrapper_sees_every_call_through_its_forward_hook():
    class New(StoreWrapper):
        calls: list[str] = []

        async def forward(self, operation, call, units=1):
            self.calls.append(operation)
            return await call()

    async def main() -> list[str]:
        store = New(InMemoryCheckpointStore())
        await store.list_checkpoints("ns", "hub", "$default")
        await store.list_ownership("ns", "hub", "$default")
        return New.calls

    assert run_virtual(main()) == ["list_checkpoints", "list_ownership"]


def test_batch_files_takes_each_file_once_at_the_batch_that_wrote_it(tmp_path):
    """A compacted entry (9.compact lists batches 0-9) must not count every earlier
    batch's files again at batch 9 (that would give 32,450 latencies for 20,000 events)."""
    def line(path):
        return f'{{"path":"file:///t/{path}","size":1,"isDir":false,"modificationTime":1,"blockReplication":1,' \
               '"blockSize":1,"action":"add"}'

    for batch in range(9):
        (tmp_path / str(batch)).write_text(f"v1\n{line(f'part-{batch}')}")
    (tmp_path / "9.compact").write_text("v1\n" + "\n".join(line(f"part-{b}") for b in range(10)))
    (tmp_path / "10").write_text(f"v1\n{line('part-10')}")
    assert batch_files(tmp_path) == {b: [f"file:///t/part-{b}"] for b in range(11)}
