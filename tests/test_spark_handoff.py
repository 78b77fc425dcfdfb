"""The Spark sink's handoff-under-load scenario for real, on the session's Spark cluster
(``spark_cluster`` in ``tests/spark_fixtures.py``), over a classic ``spark://`` session
and over Spark Connect at once: ``python -m harness.spark_handoff`` in two processes,
each running its scenarios a few at a time. Every scenario's table is read back against
what was produced (every event exactly once) and against the commit log (every commit
entry names exactly the files the table holds for it).

The same scenario runs on virtual time, many seeds, in ``tests/test_spark_sink_states.py``.
``SPARK_HANDOFF_SCENARIOS=100 pytest tests/test_spark_handoff.py`` runs more real ones
(per session kind); the first seed is drawn per run and printed, so runs cover new timings.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = int(os.environ.get("SPARK_HANDOFF_SCENARIOS", "10"))

pytestmark = pytest.mark.spark


async def _run(flag: str, url: str, first_seed: int, tmp_path: Path) -> tuple[list[dict[str, Any]], dict, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable,
               TMPDIR=str(tmp_path))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "harness.spark_handoff", flag, url, "--scenarios", str(SCENARIOS),
        "--first-seed", str(first_seed), "--concurrency", "4", "--json", cwd=str(ROOT), env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120 + 30 * SCENARIOS)
    lines = [json.loads(line) for line in out.decode().splitlines() if line.startswith("{")]
    outcomes = [line["outcome"] for line in lines if "outcome" in line]
    summary = next((line["summary"] for line in lines if "summary" in line), {})
    return outcomes, summary, err.decode(errors="replace")[-3000:]


async def test_handoffs_under_load_on_the_cluster_write_each_event_once(spark_cluster, tmp_path):
    first_seed = random.randrange(1_000_000)
    started = time.monotonic()
    runs = await asyncio.gather(_run("--master", spark_cluster.master_url, first_seed, tmp_path),
                                _run("--remote", spark_cluster.connect_url, first_seed, tmp_path))
    took = time.monotonic() - started
    for kind, (outcomes, summary, stderr) in zip(("classic", "Connect"), runs, strict=True):
        failed = [o for o in outcomes if o["missing"] or o["duplicates"] or o["extra"] or o["problems"]]
        assert not failed, f"{kind}, first seed {first_seed}: " + "; ".join(
            f"seed {o['seed']}: {o['rows']} rows for {o['produced']} events, {o['missing']} missing, "
            f"{o['duplicates']} duplicated, {o['extra']} unknown, problems {o['problems'][:3]}, "
            f"actions {o['actions']}" for o in failed)
        assert len(outcomes) == SCENARIOS, f"{kind}: {len(outcomes)} of {SCENARIOS} scenarios ran: {stderr}"
        assert all(o["produced"] == o["rows"] > 0 for o in outcomes)
        print(f"{kind}: {SCENARIOS} scenarios from seed {first_seed}, {sum(o['rows'] for o in outcomes)} rows in "
              f"{sum(o['batches'] for o in outcomes)} batches, 0 lost, 0 duplicated, {summary.get('seconds')} s")
    print(f"both session kinds side by side: {took:.0f} s")
