"""The store faults that show on Azurite, on Azurite: real processors on the Blob
store, through a loopback TCP fault proxy, in real time with generous bounds (the same
scenarios run on virtual time in ``tests/test_processor_faults.py``; the scenarios are
:mod:`harness.azurite_faults`, at full length in ``python -m benchmarks.faults
--azurite``)."""
from __future__ import annotations

import pytest

from eventprocessor import StoreDataLostError
from harness.azurite_faults import black_hole, restarted_empty, run_fault_scenario, slow_store

pytestmark = [pytest.mark.azurite, pytest.mark.slow]

# Traffic goes on this long after the group recovered (every event of it must be processed
# too), rather than to the end of the scenario's traffic: the rest was waiting, not testing.
AFTER_RECOVERY = 5.0


async def test_slow_store_leaves_every_partition_with_one_live_pump_and_loses_nothing(azurite):
    run = await run_fault_scenario("slow store", slow_store(12.0), azurite, traffic=40.0,
                                   after_recovery=AFTER_RECOVERY)
    assert run.lost == 0
    assert run.recovered_after is not None and run.recovered_after <= run.bound, run
    assert run.overlap < 1.0


async def test_a_black_holed_store_self_fences_in_time_and_is_recovered_from(azurite):
    run = await run_fault_scenario("black hole", black_hole(20.0), azurite, traffic=50.0,
                                   after_recovery=AFTER_RECOVERY)
    assert run.lost == 0
    assert run.self_fenced > 0  # the leases ended on the processors' own clocks
    assert run.recovered_after is not None and run.recovered_after <= run.bound, run
    assert run.overlap < 1.0


@pytest.mark.parametrize("refuse", [False, True])
async def test_azurite_restarted_empty_is_reported_and_refuse_checkpoint_rewind_replays_little(refuse):
    run = await restarted_empty(refuse=refuse, traffic=30.0, processors=1, after_recovery=AFTER_RECOVERY)
    assert run.lost == 0
    assert any(isinstance(e, StoreDataLostError) for e in run.errors)  # loudly: error_handler (and an ERROR log)
    assert run.recovered_after is not None and run.recovered_after <= run.bound, run
    covered = run.checkpointed_before_fault  # events at or below the checkpoints listed just before the restart
    assert covered > 0, run
    if refuse:
        # What was checkpointed before the restart is never processed again: only events
        # delivered between the restart and its detection (their checkpoints failed) are.
        assert run.replayed_checkpointed == 0, run
    else:
        # The default restarts from the initial position: every checkpointed event is
        # processed again.
        assert run.replayed_checkpointed >= covered, run
