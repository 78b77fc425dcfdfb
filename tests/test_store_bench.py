"""``python -m benchmarks.store_bench`` runs as a program: it counts requests at the transport,
renders its tables and writes RESULTS.md only with ``--record``.

Small counts only, and no figure asserted: the numbers live in benchmarks/RESULTS.md. The
Azurite runs start their own emulator, as the benchmark does for a user.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--partitions", "6", "--concurrency", "3", "--checkpoint-ops", "12", "--phase-ops", "6", "--list-repeats", "2",
         "--rounds", "1"]


def _store_bench(*args: str, root: Path = ROOT, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run the benchmark from ``root`` (a checkout, or a copy of its ``benchmarks`` package)."""
    path = [str(root), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    return subprocess.run([sys.executable, "-m", "benchmarks.store_bench", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _on_azurite(*args: str, raw: Path) -> dict:
    run = _store_bench(*args, "--raw", str(raw))
    if run.returncode == 2 and "Azurite could not start" in run.stderr:
        from tests.conftest import unavailable

        unavailable(run.stderr.strip()[-300:])
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(raw.read_text())


def _rows(out: str, store: str) -> list:
    return [[cell.strip() for cell in line.strip().strip("|").split("|")]
            for line in out.splitlines() if line.startswith(f"| {store} |")]


def test_dry_run_on_the_memory_store_renders_every_column(tmp_path):
    # A copy of the benchmarks package: --record writes the copy's RESULTS.md, never the checkout's.
    shutil.copytree(ROOT / "benchmarks", tmp_path / "benchmarks",
                    ignore=shutil.ignore_patterns("results", "__pycache__", "RESULTS.md"))
    results = tmp_path / "benchmarks" / "RESULTS.md"
    results.write_text("# Benchmark results\n\n<!-- BEGIN other -->\nkept\n<!-- END other -->\n")
    checkout = (ROOT / "benchmarks" / "RESULTS.md").read_bytes()
    run = _store_bench("--stores", "memory", "--partitions", "4,9", "--checkpoint-ops", "12", "--list-repeats", "3",
                       "--rounds", "2", "--record", root=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    recorded = results.read_text()
    table = recorded.split("<!-- BEGIN store_bench -->\n")[1].split("<!-- END store_bench -->")[0]
    assert table in run.stdout
    assert "<!-- BEGIN other -->\nkept\n<!-- END other -->" in recorded
    assert (ROOT / "benchmarks" / "RESULTS.md").read_bytes() == checkout
    header = next(line for line in table.splitlines() if line.startswith("| Store |"))
    columns = [cell.strip() for cell in header.strip().strip("|").split("|")]
    rows = _rows(table, "ours in-memory (fenced)")
    assert [row[1] for row in rows] == ["4", "9"]
    assert all(len(row) == len(columns) for row in rows)
    # The in-memory store bills one request per record written or listing.
    for row in rows:
        cells = dict(zip(columns, row, strict=False))
        assert (cells["req/create"], cells["req/re-claim"], cells["req/checkpoint"], cells["req/list"]) == \
            ("1.00", "1.00", "1.00", "1.0")
        assert cells["req/fence"] == "3.00"  # read ownership, read checkpoint, write
        # two rounds: a median and its range
        assert " (" in cells["checkpoints/s"] and " (" in cells["client CPU ms/checkpoint"]
    # re-claims repeat over the partitions up to --phase-ops (1024 by default): 4 x 256, 9 x 114
    assert [row[2] for row in rows] == ["4 / 1024 / 1024 / 12", "9 / 1026 / 1026 / 12"]
    assert "Concurrency: 16" in table and "2 round(s)" in table
    assert "python -m benchmarks.store_bench --stores memory" in table
    assert "Load: other processes" in table and "Load per round" in table
    assert "**Headline" not in table  # no peer and no floor measured: nothing to compare


def test_bad_arguments_are_rejected_with_the_option_named():
    run = _store_bench("--stores", "nosuchstore", timeout=60)
    assert run.returncode == 2 and "nosuchstore" in run.stderr and "bare-blob" in run.stderr
    run = _store_bench("--rounds", "0", timeout=60)
    assert run.returncode == 2 and "--rounds" in run.stderr


def test_help_has_the_flags_every_benchmark_has():
    run = _store_bench("--help", timeout=60)
    assert run.returncode == 0
    assert "usage: python -m benchmarks.store_bench" in run.stdout
    assert "--record" in run.stdout and "--debug" in run.stdout and "--raw" in run.stdout
    assert "--no-write" not in run.stdout and "--no-record" not in run.stdout


@pytest.mark.azurite
def test_official_store_costs_are_counted_at_the_transport(tmp_path):
    data = _on_azurite("--stores", "official-blob", *SMALL, raw=tmp_path / "raw.json")
    [result] = data["rounds"]
    assert result["kind"] == "official-blob"
    assert result["create"]["failures"] == result["reclaim"]["failures"] == 0
    # The official store tries set_blob_metadata first (404 on a new blob), then uploads.
    assert result["create"]["requests_per_op"] == 2.0
    assert result["reclaim"]["requests_per_op"] == 1.0
    assert result["fence"] is None, "the official store does not fence"
    assert result["checkpoint"]["requests_per_op"] == 1.0
    assert result["list_requests"] == 1.0
    assert len(result["list_ms"]) == 2


@pytest.mark.azurite
def test_our_blob_store_runs_through_the_contract_adapter(tmp_path):
    data = _on_azurite("--stores", "ours-blob", *SMALL, raw=tmp_path / "raw.json")
    [result] = data["rounds"]
    assert result["create"]["failures"] == result["reclaim"]["failures"] == 0
    # A real create-if-absent is one request; the fence three (two reads and a write), after
    # which a fenced checkpoint is one conditional write.
    assert result["create"]["requests_per_op"] == 1.0
    assert result["fence"] is not None and result["fence"]["requests_per_op"] == 3.0
    assert result["fence"]["methods"] == {"HEAD": 12, "PUT": 6}
    assert result["checkpoint"]["requests_per_op"] == 1.0 and result["checkpoint"]["methods"] == {"PUT": 12}


@pytest.mark.azurite
def test_the_floors_and_the_comparisons_round_by_round(tmp_path):
    """Every store and both floors in one run of two rounds: each floor is one conditional PUT
    per checkpoint and nothing else, and every comparison has a ratio for each round."""
    raw = tmp_path / "raw.json"
    run = _store_bench("--stores", "ours-blob,official-blob,ours-table,bare-blob,bare-table", *SMALL[:-1], "2",
                       "--raw", str(raw))
    if run.returncode == 2 and "Azurite could not start" in run.stderr:
        from tests.conftest import unavailable

        unavailable(run.stderr.strip()[-300:])
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(raw.read_text())
    assert sorted({(r["kind"], r["round"]) for r in data["rounds"]}) == sorted(
        (kind, i) for kind in ("ours-blob", "official-blob", "ours-table", "bare-blob", "bare-table") for i in (0, 1))
    for floor in (r for r in data["rounds"] if r["kind"].startswith("bare-")):
        assert floor["create"] is floor["reclaim"] is floor["fence"] is None and floor["list_ms"] == []
        assert floor["checkpoint"]["methods"] == {"PUT": 12}  # If-Match set_blob_metadata / update_entity
    assert len(data["load"]) == 2 and all("other_cores" in window for window in data["load"])
    out = run.stdout
    for meaning in ("fencing cost on the same backend: our Blob store vs the official Blob store",
                    "our Blob store vs its floor, a bare conditional Blob write",
                    "the official Blob store vs the same floor",
                    "our Table store vs its floor, a bare conditional Table update",
                    "backend comparison, not a peer: our Table store vs our Blob store"):
        [row] = _rows(out, meaning)
        assert row[1:3] == ["6", "2"], row  # partitions, rounds with both sides
        assert row[3].endswith(")") and "x (" in row[3], row  # median and range of the per-round ratios
    assert "floor: bare conditional Blob write" in out and "floor: bare conditional Table update" in out
    # The headline states only the comparisons' medians and ranges, each with its peer named and configured.
    [headline] = [line for line in out.splitlines() if line.startswith("**Headline")]
    assert "medians of 2 per-round ratio(s)" in headline
    ratio = r"at \d+\.\d\dx \(\d+\.\d\d-\d+\.\d\d\) the checkpoints/s of "
    assert re.search("At 6 partitions: our fenced Blob store " + ratio + r"the official Blob store "
                     r"\(azure-eventhub-checkpointstoreblob-aio [\d.]+ at its defaults, unfenced", headline), headline
    assert re.search("our fenced Blob store " + ratio + r"its floor \(a bare conditional Blob write\)", headline)
    assert re.search("our fenced Table store " + ratio + r"its floor \(a bare conditional Table update\)", headline)
    assert headline.startswith("**Headline (busy machine, not a result)**") == ("**Busy machine" in out)
