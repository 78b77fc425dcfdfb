"""Stateful partitions with real processes and real storage: a per-key counter in
``context.state`` stays exact through planned moves and a SIGKILL.

Each processor is an OS process (``python -m harness.worker --stateful``): an
``EventProcessor(stateful=True)`` with ``EventHubSource`` on the session's Event Hubs
emulator and ``BlobCheckpointStore`` on the session's Azurite, whose handler counts events
per key (the body, one of 5 keys drawn at random by the producer) in ``context.state`` and
checkpoints every 10 batches. The test process produces a steady stream the whole time.

The counts are checked against the hub, not against the SDK: after the scenario the
workers are stopped, every event is read back from the hub with azure-eventhub's consumer,
and

* every state a claim restored (each worker reports it before its first batch, with the
  checkpoint it resumed from) equals the per-key count of the hub's events up to that
  checkpoint: no event counted twice, none missing, at every move and after the crash;
* the state a new owner would restore from the store at the end (this SDK's own restore,
  run by the test) equals the per-key count of every event of the partition.

1. Scale 2 -> 4 -> 2 on 8 partitions: the moves are handoffs after a warm-up (the new
   owner loaded the state before it asked), 0 duplicates, 0 lost, counts exact.
2. 3 processes on 4 partitions with ``num_standbys=1``: once every partition has a
   caught-up standby (published in the member records), the owner of the most partitions
   is SIGKILLed; each of its partitions goes to its standby, restored from the warm
   replica, one to each survivor and no move after; the crash replays events (the
   handlers see duplicates), the counts stay exact.
"""
from __future__ import annotations

import pytest

from harness.group import EXPIRY, TAKEOVER_BOUND, Group, Outcome
from harness.move_scenarios import scale_2_4_2
from harness.state_scenarios import count_mismatches, hub_bodies, stateful_failover, stored_states

pytestmark = [pytest.mark.azurite, pytest.mark.eventhubs, pytest.mark.slow]

KEYS = 5


async def _run(scenario, partitions: int, options, azurite, eventhubs_emulator, tmp_path):
    group = Group(impl="ours", hub=eventhubs_emulator.fresh_hub(partitions), partitions=partitions,
                  hub_connection_string=eventhubs_emulator.connection_string,
                  storage_connection_string=azurite.connection_string, log_dir=str(tmp_path), keys=KEYS,
                  worker_options=["--stateful", *options])
    try:
        outcome: Outcome = await scenario(group)
    finally:
        await group.close()  # SIGTERM to every worker: each releases with a last checkpoint
    bodies = await hub_bodies(eventhubs_emulator.connection_string, group.hub)
    states = await stored_states(group)
    print("\n" + outcome.summary())
    restores = [r for w in group.workers for r in w.restores]
    print(f"{len(restores)} restores ({sum(1 for r in restores if r['warm'])} warm); final states "
          + ", ".join(f"{pid}: {seq + 1} events {counts}" for pid, (seq, counts) in states.items()))
    return group, outcome, bodies, states


async def test_scaling_2_to_4_to_2_stateful_processes_keeps_every_per_key_count_exact(
        azurite, eventhubs_emulator, tmp_path):
    group, outcome, bodies, states = await _run(scale_2_4_2, 8, [], azurite, eventhubs_emulator, tmp_path)
    assert outcome.lost == 0 and outcome.duplicates == 0, outcome.summary()
    assert not count_mismatches(group, bodies, states)
    assert sum(len(b) for b in bodies.values()) == outcome.produced > 0
    assert all(counts for _seq, counts in states.values())  # every partition counted something
    assert not {"expired", "stolen", "lost", "self_fenced"} & set(outcome.changes), outcome.changes
    # The 4 partitions that moved out to the new processes were handed off after a warm-up:
    # their new owners restored from a warm replica, reading only the changes since.
    restores = [r for w in group.workers for r in w.restores]
    handed_off = outcome.changes.get("handed_off", 0)
    assert handed_off >= 4
    assert sum(1 for r in restores if r["warm"]) >= handed_off
    assert max(outcome.longest.values()) < 2 * EXPIRY  # a sanity bound only: the pauses are printed


async def test_a_sigkilled_stateful_owner_fails_over_to_its_warm_standbys_and_counts_stay_exact(
        azurite, eventhubs_emulator, tmp_path):
    group, outcome, bodies, states = await _run(stateful_failover, 4, ["--standbys", "1"], azurite,
                                                eventhubs_emulator, tmp_path)
    assert outcome.lost == 0, outcome.summary()
    assert not count_mismatches(group, bodies, states)
    assert outcome.failovers, "the victim owned nothing"
    for failover in outcome.failovers:
        assert failover.standbys, f"partition {failover.partition} had no caught-up standby before the kill"
        assert failover.taker in failover.standbys, outcome.summary()
        assert failover.warm is True, outcome.summary()
        assert failover.takeover is not None and failover.takeover <= TAKEOVER_BOUND, outcome.summary()
        # The plan spreads one owner's standbys over the survivors: each takes its part in
        # one move, and no handoff follows (a second pause, to a processor maybe cold).
        assert failover.owners == [failover.taker], outcome.summary()
    assert len({f.taker for f in outcome.failovers}) == len(outcome.failovers), outcome.summary()
    assert outcome.changes.get("expired", 0) == len(outcome.failovers), outcome.changes
    assert outcome.shares_after == [2, 2], outcome.summary()
