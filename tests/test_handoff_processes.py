"""Planned moves without duplicates with real processes and real storage.

Each processor is an OS process (``python -m harness.worker``): an ``EventProcessor`` with
``EventHubSource`` reading the session's Event Hubs emulator over AMQP and
``BlobCheckpointStore`` on the session's Azurite. The test process produces a steady
stream with the official producer the whole time, scales, restarts or kills workers, then
waits until every produced event was delivered. The scenarios and their measurements are
:mod:`harness.group` and :mod:`harness.move_scenarios`; ``python -m benchmarks.moves`` also runs them
for the official processor.

Duplicates and losses are counted from what the handlers received: each worker prints a
line per delivered batch *before* it checkpoints. A graceful stop is SIGTERM (the worker
calls ``EventProcessor.stop()``: finish the batch, checkpoint it, release); a crash is
SIGKILL. The workers checkpoint every 10 batches and spend 30 ms on each, so a move
without duplicates rests on the old owner finishing the batch in flight and
checkpointing it as it lets the partition go.

1. Scale 2 -> 4 -> 2 processes on 8 partitions: 0 duplicates, 0 lost.
2. Rolling restart of 4 processes on 8 partitions (each stopped and started again in
   turn): 0 duplicates, 0 lost; the time each partition was paused is printed.
3. 8 processes on 4 partitions: 4 owners and 4 standbys; the owner of a partition is
   SIGKILLed and a standby claims it within the expiration plus one tick and the
   store's one-second timestamp resolution (plus slack), and delivers about a second
   later (opening a receiver).

Each worker also reports its processor's ownership changes with their reasons (from the
structured fields of its log records): planned moves must be handoffs and releases only,
never a steal or a claim after expiry. Pauses are printed and bounded only loosely (the
machine is shared).
"""
from __future__ import annotations

import pytest

from harness.group import CLAIM_BOUND, EXPIRY, TAKEOVER_BOUND, Group, Outcome
from harness.move_scenarios import SCENARIOS, rolling_restart, scale_2_4_2, standby_takeover

pytestmark = [pytest.mark.azurite, pytest.mark.eventhubs, pytest.mark.slow]


async def _run(scenario, name: str, azurite, eventhubs_emulator, tmp_path) -> Outcome:
    partitions = SCENARIOS[name][0]
    group = Group(impl="ours", hub=eventhubs_emulator.fresh_hub(partitions), partitions=partitions,
                  hub_connection_string=eventhubs_emulator.connection_string,
                  storage_connection_string=azurite.connection_string, log_dir=str(tmp_path))
    try:
        outcome = await scenario(group)
    finally:
        await group.close()  # stops every worker; the timeline stays in tmp_path
    print("\n" + outcome.summary())
    return outcome


# Ownership changes that a planned move must never cause.
NOT_PLANNED = ("expired", "stolen", "lost", "self_fenced", "store_lost")


def _no_duplicates_and_no_loss(outcome: Outcome, moves: int) -> None:
    assert outcome.lost == 0, f"{outcome.lost} events were never delivered"
    assert outcome.duplicates == 0, f"{outcome.duplicates} events were delivered twice"
    assert outcome.moves >= moves
    # Every move was a handoff or a release, never a steal or a wait for an expiration.
    assert not {reason for reason in outcome.changes if reason in NOT_PLANNED}, outcome.changes
    assert outcome.changes.get("handed_off", 0) + outcome.changes.get("released", 0) >= moves
    assert max(outcome.longest.values()) < 2 * EXPIRY  # a sanity bound only: the pauses are printed


async def test_scaling_2_to_4_to_2_processes_while_events_flow_has_no_duplicates_and_no_loss(
        azurite, eventhubs_emulator, tmp_path):
    outcome = await _run(scale_2_4_2, "scale", azurite, eventhubs_emulator, tmp_path)
    _no_duplicates_and_no_loss(outcome, moves=8)  # 4 partitions out to the new processes, 4 back


async def test_rolling_restart_of_4_processes_has_no_duplicates_and_no_loss_and_reports_pauses(
        azurite, eventhubs_emulator, tmp_path):
    outcome = await _run(rolling_restart, "rolling", azurite, eventhubs_emulator, tmp_path)
    _no_duplicates_and_no_loss(outcome, moves=8)  # every partition moved at least once
    assert all(outcome.total[pid] > 0 for pid in outcome.total), "a partition never moved"


async def test_8_processes_on_4_partitions_leave_4_standbys_that_take_over_after_a_crash(
        azurite, eventhubs_emulator, tmp_path):
    outcome = await _run(standby_takeover, "standby", azurite, eventhubs_emulator, tmp_path)
    assert outcome.taker_was_standby, "the crashed owner's partition went to a process that owned one already"
    assert outcome.claimed is not None and outcome.claimed <= CLAIM_BOUND
    assert outcome.takeover is not None and outcome.takeover <= TAKEOVER_BOUND
    assert outcome.lost == 0, f"{outcome.lost} events were never delivered"
    assert outcome.changes.get("expired") == 1 and "stolen" not in outcome.changes, outcome.changes
    assert outcome.shares_after == [0, 0, 0, 1, 1, 1, 1], "the survivors did not settle at 4 owners and 3 standbys"
