"""``python -m benchmarks.spark_sink`` runs as a program on a local session: the sink, its floor
(Spark's own path for the same batches, pipelined as the sink is) and the references, with
per-round ratios and the machine's load. No figure is asserted: the benchmark records them."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _spark_sink(*args: str, timeout: float = 400) -> subprocess.CompletedProcess:
    path = [str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p), SPARK_LOCAL_IP="127.0.0.1")
    return subprocess.run([sys.executable, "-m", "benchmarks.spark_sink", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.xdist_group("spark")  # one Spark at a time under xdist, as tests/conftest.py does for test_spark*
def test_a_small_local_run_reports_the_sink_against_its_pipelined_floor_round_by_round():
    results = (ROOT / "benchmarks" / "RESULTS.md").read_bytes()
    run = _spark_sink("--master", "local[2]", "--events", "4000", "--batch", "1000", "--partitions", "2",
                      "--rounds", "2")
    if run.returncode == 2 and ("Java" in run.stderr or "pyspark" in run.stderr):
        from tests.conftest import unavailable

        unavailable(run.stderr.strip()[-300:])
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    header = next(line for line in out.splitlines() if line.startswith("| session | floor"))
    columns = [cell.strip() for cell in header.strip().strip("|").split("|")]
    row = next(line for line in out.splitlines() if line.startswith("| classic `local[2]` |") and "x (" in line)
    cells = dict(zip(columns, (cell.strip() for cell in row.strip().strip("|").split("|")), strict=False))
    assert len(cells) == len(columns) == 9
    span = re.compile(r"^[\d,]+ \([\d,]+-[\d,]+\)$")  # two rounds: the median and its range
    assert span.match(cells["floor: Spark pipelined rows/s, median (range)"]), cells
    assert span.match(cells["sink rows/s, median (range)"]), cells
    assert re.match(r"^\*\*\d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\)\*\* \((meets|misses)(, \d\.\d{3})?\)$",
                    cells["**sink / floor, median (range) of per-round ratios**"]), cells
    assert re.match(r"^\d+\.\d\d, \d+\.\d\d$", cells["per round"]), cells
    assert re.match(r"^[\d.]+ \([\d.]+-[\d.]+\)$|^n/a$", cells["other processes, cores per round"]), cells
    # each round printed its three reference figures and the load beside them
    assert len(re.findall(r"round \d: Spark pipelined [\d,]+ rows/s, sink [\d,]+ rows/s, ratio \d+\.\d\d; "
                          r"Spark serial [\d,]+, write only [\d,]+ rows/s; other processes", out)) == 2
    assert "| classic `local[2]` | 0 |" in out or re.search(r"\| classic `local\[2\]` \| \d+ \| \d+ \|", out)
    assert (ROOT / "benchmarks" / "RESULTS.md").read_bytes() == results, "a run without --record wrote RESULTS.md"


def test_bad_sizes_are_rejected_and_help_has_the_flags_every_benchmark_has():
    run = _spark_sink("--events", "10", "--batch", "100", timeout=60)
    assert run.returncode == 2 and "need events >= batch >= partitions" in run.stderr
    run = _spark_sink("--help", timeout=60)
    assert run.returncode == 0
    assert "usage: python -m benchmarks.spark_sink" in run.stdout
    assert "--record" in run.stdout and "--debug" in run.stdout
    assert "--no-write" not in run.stdout and "--no-record" not in run.stdout
