"""Rebalancing scenarios of real processors on virtual time: joins, crashes, graceful
stops, partition growth, standbys, STATIC ordinals, balance_factor; what the store saw
and what the handlers received.

Every processor is an :class:`~eventprocessor.EventProcessor` of an
:class:`eventprocessor.testing.Cluster`, started with ``start(balancing=False)``: the
test ticks every running processor once per round (``balance_once()``, the real taker),
a round every ``INTERVAL`` virtual seconds, so ticks are counted exactly; its renewer,
heartbeat and pumps run on their own. Each processor reaches the store through its own
link (a :class:`~eventprocessor.testing.FaultyStore`, switched off when it crashes: a
dead process sends nothing) in front of a :class:`~eventprocessor.testing.LedgerStore`,
so the :class:`~eventprocessor.testing.OwnershipLedger` counts every request and tells
claims, handoffs, steals and releases apart from the store's side. Duplicates, overlaps
and losses come from what the handlers received (:class:`~eventprocessor.testing.
DeliveryRecorder`). The convergence benchmark runs the same scenarios beside
azure-eventhub's processor (``python -m benchmarks.convergence``).
"""
from __future__ import annotations

import asyncio
import math

import pytest

from eventprocessor import EventProcessor, Timing
from eventprocessor.testing import Cluster, FaultyStore, LedgerStore, OwnershipLedger, recording_handler, run_virtual

INTERVAL = 10.0
EXPIRATION = 60.0
SETTLE = int(EXPIRATION / INTERVAL) + 2  # rounds balanced in a row before a scenario counts as settled
WORK = 0.05  # seconds a handler spends on a batch
STEP = 1.0  # the producer sends EVENTS to every partition every STEP seconds, half-way through each
EVENTS = 4


class Rounds:
    """Processors on one cluster, ticked by the test: one round = every running processor
    ticks once, in order (``lockstep``: all at once), then ``INTERVAL`` seconds pass."""

    def __init__(self, partitions: int, *, strategy: str = "balanced", seed: int = 0, work: float = WORK,
                 lockstep: bool = False, **options: object) -> None:
        self.cluster = Cluster(partitions, seed=seed, load_balancing_strategy=strategy,
                               load_balancing_interval=INTERVAL, partition_ownership_expiration_interval=EXPIRATION,
                               **options)
        self.handler = recording_handler(self.cluster.ledger, work=work)  # every batch takes exactly ``work``
        self.ledger = OwnershipLedger(expiration=EXPIRATION)
        self.running: list[EventProcessor] = []
        self.links: dict[str, FaultyStore] = {}
        self.lockstep = lockstep
        self.rounds = 0
        self._producer: asyncio.Task[None] | None = None

    @property
    def deliveries(self):
        return self.cluster.ledger

    @property
    def partition_ids(self) -> list[str]:
        return [str(i) for i in range(self.cluster.source.partition_count)]

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    async def add(self, **overrides: object) -> EventProcessor:
        name = f"p{len(self.cluster.processors)}"
        link = FaultyStore(LedgerStore(self.cluster.memory, self.ledger, writer=name))
        processor = self.cluster.add(name, store=link, handler=self.handler, **overrides)
        self.links[name] = link
        await processor.start(balancing=False)
        await processor.join()  # its member record is written before its first tick
        self.running.append(processor)
        return processor

    async def tick(self) -> None:
        if self.lockstep:
            await asyncio.gather(*(p.balance_once() for p in self.running))
        else:
            for p in list(self.running):
                await p.balance_once()
        self.rounds += 1
        await asyncio.sleep(INTERVAL)

    def counts(self) -> dict[str, int]:
        """Partitions per running processor, by the store's live records."""
        return self.ledger.counts(self.partition_ids, [p.owner_id for p in self.running], self.now())

    def sorted_counts(self) -> list[int]:
        return sorted(self.counts().values())

    def owner_map(self) -> dict[str, str | None]:
        return {pid: self.ledger.live_owner(pid, self.now()) for pid in self.partition_ids}

    def balanced(self, tolerance: int = 1) -> bool:
        names = {p.owner_id for p in self.running}
        if any(owner not in names for owner in self.owner_map().values()):
            return False
        counts = self.counts().values()
        return max(counts) - min(counts) <= tolerance

    async def until_balanced(self, max_rounds: int, *, settle: int = SETTLE, tolerance: int = 1) -> int | None:
        """Tick until balanced for ``settle`` rounds in a row (or ``max_rounds``); return the
        round, counted from this call, that began the final balanced stretch (None if the
        group is not balanced at the end)."""
        began: int | None = None
        stable = 0
        for k in range(1, max_rounds + 1):
            await self.tick()
            if self.balanced(tolerance):
                began = began or k
                stable += 1
                if stable >= settle:
                    break
            else:
                began, stable = None, 0
        return began

    def mark(self) -> dict:
        return self.ledger.snapshot()

    def since(self, mark: dict) -> dict:
        now = self.ledger.snapshot()
        return {key: now[key] - mark[key] for key in now}

    # ---- traffic

    def start_traffic(self) -> None:
        async def produce() -> None:
            loop = asyncio.get_running_loop()
            await asyncio.sleep(math.floor(loop.time() / STEP) * STEP + STEP / 2 - loop.time())
            while True:
                for pid in self.partition_ids:
                    for _ in range(EVENTS):
                        event = await self.cluster.source.send(b"x", partition_id=pid)
                        self.cluster.produced.append((pid, event.sequence_number))
                await asyncio.sleep(STEP)

        self._producer = asyncio.ensure_future(produce())

    async def to_mid_batch(self) -> None:
        """To half a handler's work after the next production: every owned partition is
        inside a batch (the worst moment for a crash or a stop)."""
        now = self.now()
        upcoming = math.floor(now / STEP) * STEP + STEP / 2
        if upcoming <= now + 1e-9:
            upcoming += STEP
        await asyncio.sleep(upcoming + WORK / 2 - now)

    def undelivered(self, grace: float = 5.0) -> list[tuple]:
        """Events produced more than ``grace`` seconds ago that no handler was given."""
        old = self.cluster.produced[:max(0, len(self.cluster.produced) - int(grace / STEP + 1) * EVENTS
                                        * len(self.partition_ids))]
        return self.deliveries.missing(old)

    # ---- endings

    async def crash(self, processor: EventProcessor) -> None:
        """Die now: nothing more reaches the store, handlers stop mid-batch, nothing is released."""
        self.links[processor.owner_id].down = True
        self.running.remove(processor)
        for pid in processor.owned_partitions:
            pump = processor.pump(pid)
            if pump is not None:
                pump.cancel()
        await processor.stop(release=False)

    async def stop(self, processor: EventProcessor) -> None:
        self.running.remove(processor)
        await processor.stop()

    async def close(self) -> None:
        if self._producer is not None:
            self._producer.cancel()
        for p in list(self.running):
            await p.stop()


def scenario(body):
    """Run ``body(group)`` on a fresh virtual loop; the group is closed afterwards."""
    def run(**kwargs):
        async def main():
            group = Rounds(**kwargs)
            try:
                return await body(group)
            finally:
                await group.close()
        return run_virtual(main())
    return run


# ----------------------------------------------------------------- where balancing ends


def test_5_partitions_1_then_6_processors_ends_with_one_idle():
    async def body(group: Rounds) -> None:
        await group.add()
        assert await group.until_balanced(20) == 5  # one partition per tick, alone
        for _ in range(5):
            await group.add()
        assert await group.until_balanced(40) is not None
        assert group.sorted_counts() == [0, 1, 1, 1, 1, 1]
        mark = group.mark()
        for _ in range(10):  # with N >= P nothing moves any more
            await group.tick()
        assert group.since(mark)["owner_changes"] == 0

    scenario(body)(partitions=5, seed=3)


def test_18_partitions_3_to_4_processors_ends_4_4_5_5_with_minimal_moves_by_handoff():
    async def body(group: Rounds) -> None:
        for _ in range(3):
            await group.add()
        assert await group.until_balanced(30) is not None
        assert group.sorted_counts() == [6, 6, 6]
        mark = group.mark()
        await group.add()
        assert await group.until_balanced(30) is not None
        assert group.sorted_counts() == [4, 4, 5, 5]
        phase = group.since(mark)
        # The newcomer takes exactly what it needs (4, the fewest moves to a balanced
        # assignment), each partition handed over by its owner.
        assert phase["moves"] == 4 and phase["handoffs"] == 4 and phase["steals"] == 0, phase
        assert phase["requests"]["request"] == 4  # one handoff request per move
        assert phase["requests"]["fence_checkpoint"] == 4  # one checkpoint fence per claim won

    scenario(body)(partitions=18, seed=3)


def test_20_partitions_4_to_3_after_a_crash_ends_6_7_7_without_steals():
    async def body(group: Rounds) -> None:
        for _ in range(4):
            await group.add()
        assert await group.until_balanced(30) is not None
        mark = group.mark()
        await group.crash(group.running[-1])
        assert await group.until_balanced(30) is not None
        assert group.sorted_counts() == [6, 7, 7]
        phase = group.since(mark)
        assert phase["steals"] == 0  # orphans are taken once expired, never stolen
        assert phase["moves"] == 5

    scenario(body)(partitions=20, seed=3)


def test_20_to_25_partitions_with_4_processors_ends_6_6_6_7_without_moving_any():
    async def body(group: Rounds) -> None:
        for _ in range(4):
            await group.add()
        assert await group.until_balanced(30) is not None
        mark = group.mark()
        group.cluster.source.add_partitions(5)
        assert await group.until_balanced(30) is not None
        assert group.sorted_counts() == [6, 6, 6, 7]
        phase = group.since(mark)
        assert phase["moves"] == 0 and phase["steals"] == 0

    scenario(body)(partitions=20, seed=3)


def test_a_graceful_stop_releases_so_the_survivors_take_over_at_once_without_steals():
    async def body(group: Rounds) -> None:
        for _ in range(5):
            await group.add()
        assert await group.until_balanced(30) is not None
        leaving = group.running[0]
        held = group.counts()[leaving.owner_id]
        mark = group.mark()
        await group.stop(leaving)
        assert group.since(mark)["requests"]["release"] == held
        rounds = await group.until_balanced(30)
        assert group.sorted_counts() == [4, 4, 4, 4]
        assert group.since(mark)["steals"] == 0
        # Released records are claimable at once: no waiting for expiry.
        assert rounds is not None and rounds <= 3

    scenario(body)(partitions=16, seed=5)


@pytest.mark.parametrize("lockstep", [False, True])
def test_a_greedy_cold_start_takes_one_tick_because_members_join_first(lockstep):
    async def body(group: Rounds) -> None:
        mark = group.mark()
        for _ in range(4):
            await group.add()
        assert await group.until_balanced(20) == 1
        phase = group.since(mark)
        assert phase["requests"]["claim"] == 32 and phase["steals"] == 0 and phase["failed_claims"] == 0, phase
        assert group.sorted_counts() == [8, 8, 8, 8]

    scenario(body)(partitions=32, strategy="greedy", seed=4, lockstep=lockstep)


@pytest.mark.parametrize("factor, moves, counts", [(1, 3, [3, 3, 3]), (3, 1, [1, 4, 4])])
def test_balance_factor_leaves_a_small_imbalance_alone(factor, moves, counts):
    async def body(group: Rounds) -> None:
        for _ in range(2):
            await group.add()
        assert await group.until_balanced(20, tolerance=factor) is not None
        mark = group.mark()
        await group.add()
        assert await group.until_balanced(20, tolerance=factor) is not None
        phase = group.since(mark)
        assert phase["moves"] == moves and phase["handoffs"] == moves and phase["steals"] == 0, phase
        assert group.sorted_counts() == counts

    scenario(body)(partitions=9, strategy="greedy", seed=4, balance_factor=factor)


def test_static_shares_by_ordinal_and_a_returning_ordinal_gets_its_share_back_by_handoff():
    async def body(group: Rounds) -> None:
        members = [await group.add(ordinal=k, replica_count=4) for k in range(4)]
        assert await group.until_balanced(20) is not None
        owners = group.owner_map()
        assert {pid: owners[pid] for pid in ("0", "4", "2", "6")} == {
            "0": members[0].owner_id, "4": members[0].owner_id, "2": members[2].owner_id, "6": members[2].owner_id}
        group.start_traffic()
        await group.tick()
        await group.to_mid_batch()
        crashed_at = group.now()
        member_expiry = group.ledger.member_expiry(members[2].owner_id)
        await group.crash(members[2])
        for _ in range(15):
            await group.tick()
        taken = [d.started for d in group.deliveries.deliveries
                 if d.partition_id in ("2", "6") and d.started >= crashed_at]
        # Ordinal 2's share is taken only once its member record expired.
        assert taken and member_expiry is not None and min(taken) >= member_expiry
        mark = group.mark()
        duplicates = group.deliveries.duplicates()
        back = await group.add(ordinal=2, replica_count=4)
        for _ in range(6):
            await group.tick()
        assert group.owner_map()["2"] == back.owner_id and group.owner_map()["6"] == back.owner_id
        phase = group.since(mark)
        assert phase["handoffs"] == 2 and phase["steals"] == 0, phase
        assert group.deliveries.duplicates() == duplicates  # the return replays nothing

    scenario(body)(partitions=8, strategy="static", seed=2)


# ----------------------------------------------------------------- what the handlers received


def test_a_scale_out_hands_partitions_over_with_no_duplicate_and_no_overlap():
    async def body(group: Rounds) -> None:
        for _ in range(3):
            await group.add()
        assert await group.until_balanced(40) is not None
        group.start_traffic()
        await asyncio.sleep(3.0)
        mark = group.mark()
        await group.add()
        assert await group.until_balanced(20) is not None
        phase = group.since(mark)
        assert phase["moves"] == 3 and phase["handoffs"] == 3 and phase["steals"] == 0, phase
        assert group.deliveries.duplicates() == 0
        assert group.deliveries.overlaps() == []
        assert group.undelivered() == []

    scenario(body)(partitions=12, strategy="greedy", seed=1, work=0.5)


def test_a_crash_costs_exactly_the_batches_in_flight_and_the_dead_processor_sends_nothing():
    async def body(group: Rounds) -> None:
        for _ in range(3):
            await group.add()
        assert await group.until_balanced(40) is not None
        group.start_traffic()
        await asyncio.sleep(3.0)
        await group.to_mid_batch()
        victim = group.running[-1]
        in_flight = [d for d in group.deliveries.deliveries if d.owner_id == victim.owner_id and d.ended is None]
        assert len(in_flight) == 4  # every partition of the victim is half-way through a batch
        heartbeat = group.ledger.members.get(victim.owner_id)
        requests = sum(group.ledger.requests.values())
        crashed_at = group.now()
        await group.crash(victim)
        assert sum(group.ledger.requests.values()) == requests  # a dead process sends nothing
        for _ in range(10):
            await group.tick()
        assert all(d.ended is None for d in in_flight)  # its handlers stopped mid-batch
        assert group.deliveries.duplicates() == sum(d.last - d.first + 1 for d in in_flight)
        assert not [d for d in group.deliveries.deliveries if d.owner_id == victim.owner_id
                    and d.started > crashed_at]
        assert group.ledger.members.get(victim.owner_id) == heartbeat  # no heartbeat after death
        orphans = {d.partition_id for d in in_flight}
        assert all(group.owner_map()[pid] in {p.owner_id for p in group.running} for pid in orphans)
        assert group.undelivered() == []

    scenario(body)(partitions=12, strategy="greedy", seed=3)


def test_a_rolling_restart_hands_every_partition_over_without_duplicates():
    async def body(group: Rounds) -> None:
        for _ in range(2):
            await group.add()
        assert await group.until_balanced(40) is not None
        group.start_traffic()
        await asyncio.sleep(3.0)
        moved = group.mark()
        for old in list(group.running):
            await group.to_mid_batch()
            await group.stop(old)
            await group.add()
            assert await group.until_balanced(20, settle=2) is not None
        assert group.since(moved)["steals"] == 0
        assert group.deliveries.duplicates() == 0
        assert group.undelivered() == []

    scenario(body)(partitions=8, strategy="greedy", seed=5)


def test_standbys_own_nothing_and_one_takes_over_once_the_crashed_records_expired():
    async def body(group: Rounds) -> None:
        for _ in range(8):
            await group.add()
        assert await group.until_balanced(40) is not None
        group.start_traffic()
        await asyncio.sleep(3.0)
        counts = group.counts()
        assert sorted(counts.values()) == [0, 0, 0, 0, 1, 1, 1, 1]
        standbys = {owner for owner, count in counts.items() if count == 0}
        victim = next(p for p in group.running if counts[p.owner_id])
        orphan = next(pid for pid, owner in group.owner_map().items() if owner == victim.owner_id)
        # The victim's heartbeat keeps its records: they expire E after the later of
        # their write and its last heartbeat.
        record_expiry = group.ledger.alive_at(group.ledger.records[orphan]) + EXPIRATION
        member_expiry = group.ledger.member_expiry(victim.owner_id)
        crashed_at = group.now()
        await group.crash(victim)
        for _ in range(15):
            await group.tick()
        first = next(d for d in group.deliveries.deliveries if d.partition_id == orphan and d.started > crashed_at)
        assert first.owner_id in standbys
        assert record_expiry <= first.started
        # While the crashed processor's member record is live it still counts in the plans
        # (and may be dealt the orphan): takeover comes within a round of the later expiry.
        assert first.started <= max(record_expiry, member_expiry or 0.0) + INTERVAL

    scenario(body)(partitions=4, strategy="greedy", seed=1)


def test_partitions_added_later_are_claimed_and_their_events_delivered():
    async def body(group: Rounds) -> None:
        for _ in range(2):
            await group.add()
        assert await group.until_balanced(40) is not None
        group.start_traffic()
        await asyncio.sleep(3.0)
        group.cluster.source.add_partitions(2)
        for _ in range(10):
            await group.tick()
        assert sum(group.counts().values()) == 6
        assert group.undelivered() == []

    scenario(body)(partitions=4, strategy="greedy", seed=2)


# ----------------------------------------------------------------- what it costs


def test_steady_requests_per_hour_follow_the_formula_members_included():
    """At rest a tick lists the members only (N / I); no record is rewritten; each member
    record every quarter expiration (4N / E); a full listing per processor only as the
    safety net (every 0.75-1 x max(4E, 60 s)), plus the announcements of nothing."""

    async def body(group: Rounds) -> None:
        for _ in range(3):
            await group.add()
        assert await group.until_balanced(20) is not None
        for _ in range(3):  # the balancing ticks' own listings are over
            await group.tick()
        mark, started, rounds = group.mark(), group.now(), group.rounds
        for _ in range(200):
            await group.tick()
        requests = group.since(mark)["requests"]
        ticks = 3 * (group.rounds - rounds)
        seconds = group.now() - started
        hours = seconds / 3600
        safety_net = Timing.full_listing_interval_for(EXPIRATION)
        assert requests["list_members"] == ticks
        assert 3 * math.floor(seconds / safety_net) <= requests["list_ownership"] <= 3 * math.ceil(
            seconds / (0.75 * safety_net))
        assert not requests.get("renew") and not requests.get("claim") and not requests.get("announce_change")
        coordination = sum(n for kind, n in requests.items() if kind != "update_checkpoint")
        expected = 3600 * (3 / INTERVAL + 4 * 3 / EXPIRATION) + requests["list_ownership"] / hours
        assert coordination / hours == pytest.approx(expected, rel=0.03)

    scenario(body)(partitions=12, strategy="greedy", seed=8)
