"""``python -m benchmarks.soak`` runs as a program (its quick mode: about 30 s, starting its
own Event Hubs emulator and Azurite) and prints every column for every subject. No figure
is asserted: the benchmark records them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = ("Subject", "events", "events/s", "RSS at warm-up end (MB)", "RSS at end (MB)", "max RSS (MB)",
           "growth after warm-up (MB)", "slope (MB per million events)", "slope (MB per hour)", "verdict")
SUBJECTS = ("ours, InMemoryEventSource", "ours, emulator", "official, emulator")


def _soak(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, "-m", "benchmarks.soak", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.azurite
@pytest.mark.eventhubs
@pytest.mark.slow
def test_the_quick_soak_prints_every_column_for_every_subject_and_writes_nothing():
    results = (ROOT / "benchmarks" / "RESULTS.md").read_bytes()
    run = _soak("--quick")
    if run.returncode == 2 and "could not start" in run.stderr:
        from tests.conftest import unavailable

        unavailable(f"the soak's services did not start: {run.stderr.strip()[-300:]}")
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    header = next(line for line in out.splitlines() if line.startswith("| Subject |"))
    assert [cell.strip() for cell in header.strip("|").split("|")] == list(COLUMNS)
    rows = {line.split("|")[1].strip(): [cell.strip() for cell in line.strip().strip("|").split("|")[1:]]
            for line in out.splitlines() if line.startswith("| ") and not line.startswith("| Subject")}
    assert set(rows) == set(SUBJECTS), out
    number = re.compile(r"^[+-]?[\d,]+(\.\d+)?$")
    for subject in SUBJECTS:
        cells = rows[subject]
        assert len(cells) == len(COLUMNS) - 1, (subject, cells)
        assert all(number.match(cell) for cell in cells[:-1]), (subject, cells)  # one round: plain numbers
        assert re.match(r"^(\*\*flat\*\*|\*\*grows\*\* in 1/1 rounds|too short to fit)$", cells[-1]), cells
    events = {subject: int(rows[subject][0].replace(",", "")) for subject in SUBJECTS}
    assert events == {"ours, InMemoryEventSource": 300_000, "ours, emulator": 40_000, "official, emulator": 40_000}
    assert re.search(r"Load: other processes [\d.]+ cores on average .* 1-minute load average [\d.]+/[\d.]+ at "
                     r"start/end\.", out), out
    assert "**Flat**: the slope is at most 2 MB per million events" in out
    assert (ROOT / "benchmarks" / "RESULTS.md").read_bytes() == results, "a run without --record wrote RESULTS.md"


def test_a_quick_soak_refuses_to_record():
    run = _soak("--quick", "--record", timeout=60)
    assert run.returncode == 2
    assert "--quick runs are partial: they are never recorded" in run.stderr
