"""The worker program (``python -m harness.worker``) without a hub or a store account: what
the scale benchmark and the multi-process tests rely on, checked in seconds.

A worker on partitions without events (``--source none``) with the in-memory store owns
every partition, reports state lines (ownership, ticks, heartbeats) and stops by itself at
``--lifetime``; with ``--wait-for-go`` it says ``ready`` and starts nothing before the
parent's line, and stops when its parent goes away; options that do not go together are
refused with a reason. The runs on Azurite and the emulator are the process tests
(``tests/test_multiprocess.py``, ``tests/test_handoff_processes.py``) and the benchmarks'.
"""
from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from harness.worker import spawn_worker

ROOT = Path(__file__).resolve().parent.parent
ALONE = ["--source", "none", "--store", "memory", "--partitions", "4", "--interval", "0.2", "--expiry", "2",
         "--stats-interval", "0", "--no-ownership-lines"]


async def _exited(worker, timeout: float = 60.0) -> None:
    await asyncio.wait_for(worker.process.wait(), timeout)
    assert worker.reader is not None
    await asyncio.wait_for(worker.reader, 10)


async def test_a_worker_without_a_hub_owns_every_partition_reports_state_lines_and_stops_at_its_lifetime(tmp_path):
    worker = await spawn_worker("alone", hub="h", container=None, hub_connection_string=None,
                                storage_connection_string=None, log_dir=str(tmp_path),
                                extra=[*ALONE, "--state-every", "0.2", "--lifetime", "3"])
    try:
        await _exited(worker)
    finally:
        await worker.stop()
    assert worker.process.returncode == 0, worker.diagnostics()
    assert worker.started is not None and worker.started["namespace"] == "scale.servicebus.windows.net"
    assert worker.owned_set == {"0", "1", "2", "3"}, worker.diagnostics()
    last = worker.last
    assert last["count"] == 4 and last["ticks"] > 1 and last["claims"] == 4 and last["missed_renewals"] == 0
    # its leases were kept by its member heartbeat, with no rewrite of its ownership records
    # at rest (steady-state writes do not grow with partitions); no HTTP store to count
    assert last["heartbeats"] > 0 and last["renewals"] == 0 and last["requests"] == 0
    assert [s["t"] for s in worker.states] == sorted(s["t"] for s in worker.states)
    assert worker.at(worker.states[0]["t"]) == worker.states[0]
    assert worker.stopped


async def test_a_worker_that_waits_for_go_starts_nothing_before_it_and_stops_when_its_parent_goes(tmp_path):
    worker = await spawn_worker("waits", hub="h", container=None, hub_connection_string=None,
                                storage_connection_string=None, log_dir=str(tmp_path),
                                extra=[*ALONE, "--state-every", "0.2"], wait_for_go=True)
    try:
        for _ in range(300):
            if worker.ready:
                break
            await asyncio.sleep(0.1)
        assert worker.ready, worker.diagnostics()
        await asyncio.sleep(1.0)
        assert not worker.states and not worker.owned, "it started before go"
        worker.go()
        for _ in range(300):
            if worker.owned_set == {"0", "1", "2", "3"}:
                break
            await asyncio.sleep(0.1)
        assert worker.owned_set == {"0", "1", "2", "3"}, worker.diagnostics()
        assert worker.process.stdin is not None
        worker.process.stdin.close()  # the parent goes away
        await _exited(worker)
    finally:
        await worker.stop()
    assert worker.process.returncode == 0 and worker.stopped, worker.diagnostics()


def test_the_worker_refuses_options_that_do_not_go_together():
    def refused(*options: str) -> str:
        run = subprocess.run([sys.executable, "-m", "harness.worker", "--hub", "h", "--owner-id", "w", *options],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, run.stderr
        return run.stderr.strip().splitlines()[-1]

    assert refused("--impl", "official", "--source", "memory").endswith(
        "--source memory: this SDK's processor only (--impl ours)")
    assert refused("--impl", "floor", "--source", "none").endswith(
        "--impl floor reads a hub (--source eventhub) and reports batches, not state")
    assert refused("--impl", "floor-lean", "--state-every", "1").endswith(
        "--impl floor-lean reads a hub (--source eventhub) and reports batches, not state")
    assert refused("--source", "none").endswith("--container is required with --store blob")
    assert refused("--standbys", "1").endswith("--standbys keeps replicas of partition state: it needs --stateful")
