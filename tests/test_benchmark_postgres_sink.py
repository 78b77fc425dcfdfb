"""The PostgreSQL sink benchmark runs end to end at a small size (no timing assertions):
every path writes every event, the table of rows/s, the ratio to the floor and the
checkpoint stores are printed, and nothing is recorded."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent


def test_a_quick_run_measures_every_path_and_both_postgres_stores_and_records_nothing(postgres, tmp_path):
    results = tmp_path / "RESULTS.md"
    env = dict(os.environ, EVENTPROCESSOR_BENCH_RESULTS=str(results), EVENTPROCESSOR_PG_DSN=postgres.dsn)
    out = subprocess.run([sys.executable, "-m", "benchmarks.postgres_sink", "--quick", "--no-blob", "--kill-rounds",
                          "0", "--events", "2000", "--batch", "500", "--checkpoint-ops", "128"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    for row in ("| floor |", "| processor, COPY only |", "| insert then checkpoint |", "| exactly once |",
                "| ours postgres (fenced) |", "| floor: bare conditional UPDATE |"):
        assert row in out.stdout, out.stdout
    assert "$EVENTPROCESSOR_PG_DSN" in out.stdout
    # One round: its ratio, and a verdict that says what that round shows, never more.
    line = next(line for line in out.stdout.splitlines() if line.startswith("Exactly once / floor, per round: "))
    ratio = float(line.split(": ", 1)[1].split(" ", 1)[0])
    verdict = "meets the target of 0.8 in every round" if ratio >= 0.8 else "below the target of 0.8 in 1 of 1 round(s)"
    assert line.endswith(f"({verdict})."), line
    assert not results.exists()
    refused = subprocess.run([sys.executable, "-m", "benchmarks.postgres_sink", "--quick", "--record"], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "cannot --record" in refused.stderr

