"""Consumer processes seen from their parent, and the planned-move scenarios they run.

This module gathers, under the names importers have always used, what lives in
:mod:`.worker_process` (spawning and reading one worker), :mod:`.group` (a group of
workers on one hub, its timings and :class:`Outcome`), :mod:`.move_scenarios` (the
planned moves) and :mod:`.state_scenarios` (stateful groups).

:func:`spawn_worker` starts ``python -m eventprocessor.testing.worker`` (this SDK's
processor or azure-eventhub's, one OS process each) and returns a
:class:`WorkerHandle` that reads what it reports: every delivered batch, the partitions
it dispatches, its ownership changes with their reasons, CPU and memory.

:class:`Group` runs such workers of one implementation on one hub and one blob
container while it produces a steady stream with the official producer, and tells
when they share the hub fairly; :func:`scale_2_4_2`, :func:`rolling_restart` and
:func:`standby_takeover` are the scenarios of ``tests/test_handoff_processes.py`` and
``python -m benchmarks.moves``. Duplicates and losses come from what the handlers
received (each worker prints a line per batch *before* it checkpoints, so a SIGKILL
never hides a delivery). A *pause* is the time from the last batch one process
delivered of a partition to the first batch the next process delivered of it.

Needs the ``[eventhub]`` and ``[blob]`` extras, an Event Hubs endpoint (the project's
emulator) and a storage account (Azurite); nothing here is imported by ``import
eventprocessor.testing``'s other modules.

Example::

    group = Group(impl="ours", hub=hub, partitions=8, hub_connection_string=hub_conn,
                  storage_connection_string=azurite_conn, log_dir=str(tmp_path))
    try:
        outcome = await scale_2_4_2(group)
    finally:
        await group.close()
    assert outcome.duplicates == 0 and outcome.lost == 0
"""
from __future__ import annotations

from .group import (BATCH, CHECKPOINT_EVERY, CLAIM_BOUND, EXPIRY, INTERVAL, PERIOD, TAKEOVER_BOUND, WORK, Failover,
                    Group, Outcome, fair_shares)
from .move_scenarios import SCENARIOS, rolling_restart, scale_2_4_2, standby_takeover
from .state_scenarios import count_mismatches, hub_bodies, standby_replicas, stateful_failover, stored_states
from .worker_process import WorkerHandle, create_container, spawn_worker

__all__ = ["WorkerHandle", "spawn_worker", "create_container", "Group", "Outcome", "SCENARIOS", "CLAIM_BOUND",
           "TAKEOVER_BOUND", "EXPIRY", "INTERVAL", "CHECKPOINT_EVERY", "WORK", "PERIOD", "BATCH", "fair_shares",
           "scale_2_4_2", "rolling_restart", "standby_takeover", "Failover", "stateful_failover", "hub_bodies",
           "stored_states", "standby_replicas", "count_mismatches"]
