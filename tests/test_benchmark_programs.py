"""The benchmark programs run end to end at small sizes (no timing assertions), and
write benchmarks/RESULTS.md only when asked to with --record.

They run as programs (``python -m benchmarks.NAME``), never imported. A run that
records writes to a scratch copy named by ``EVENTPROCESSOR_BENCH_RESULTS``."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REAL_RESULTS = ROOT / "benchmarks" / "RESULTS.md"


def bench(*args: str, results_path: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run ``python -m benchmarks.<args>`` with its results (and plots) pointed at ``results_path``."""
    env = dict(os.environ, EVENTPROCESSOR_BENCH_RESULTS=str(results_path))
    return subprocess.run([sys.executable, "-m", f"benchmarks.{args[0]}", *args[1:]], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@pytest.fixture
def results_file(tmp_path):
    """A scratch RESULTS.md for the programs (``EVENTPROCESSOR_BENCH_RESULTS``)."""
    path = tmp_path / "RESULTS.md"
    before = REAL_RESULTS.read_bytes()
    yield path
    assert REAL_RESULTS.read_bytes() == before, "a test run wrote benchmarks/RESULTS.md"


def test_throughput_counts_every_event_on_both_sides_prints_the_ratio_and_writes_nothing_by_default(results_file):
    out = bench("throughput", "--events-per-partition", "300", "--rounds", "1", results_path=results_file)
    assert out.returncode == 0, out.stderr
    assert "median per-round ratio" in out.stdout
    # The program checks its own counts (check_counts): every bare round counted all
    # 32 x 300 events once, the processor some and never more.
    counted = re.search(r"every bare round counted all (\d+) events; the processor counted (\d+)-(\d+)", out.stderr)
    assert counted, out.stderr
    total, low, high = map(int, counted.groups())
    assert total == 32 * 300 and 0 < low <= high <= total
    assert not results_file.exists()


def test_decode_compares_every_contestant_on_messages_as_the_client_decodes_them(results_file):
    out = bench("decode", "--events", "200", "--rounds", "2", results_path=results_file)
    assert out.returncode == 0, out.stderr
    # Checked by the program before timing (check_inputs): the messages are what the
    # client's codec gives, and this SDK's conversion gives what azure-eventhub's does.
    assert ("decode: inputs checked: three data sections arrive as 10, 10 and 12 bytes; message_to_event gives what "
            "azure-eventhub's EventData gives for one data section, three data sections, one sequence section, "
            "an amqp-value (a map)") in out.stderr
    for row in ("floor", "**`message_to_event`** (this SDK)", "EventData._from_message", "three data sections",
                "one sequence section", "an amqp-value"):
        assert row in out.stdout
    assert not results_file.exists()


def test_record_writes_the_section_with_the_command_that_reproduces_it(results_file):
    results_file.write_text("# Benchmark results\n\n<!-- BEGIN other -->\nkept\n<!-- END other -->\n")
    out = bench("throughput", "--events-per-partition", "300", "--rounds", "1", "--record", results_path=results_file)
    assert out.returncode == 0, out.stderr
    text = results_file.read_text()
    assert "Command: `python -m benchmarks.throughput --events-per-partition 300 --rounds 1 --record`" in text
    assert "<!-- BEGIN throughput -->" in text and "median per-round ratio" in text
    assert "<!-- BEGIN other -->\nkept\n<!-- END other -->" in text


def test_convergence_quick_run_prints_every_table_with_both_implementations(results_file):
    out = bench("convergence", "--quick", results_path=results_file)
    assert out.returncode == 0, out.stderr
    for heading in ("### Targets", "### Cold start", "### Crash and failover", "### Rolling restart", "### Standbys",
                    "### Static assignment and balance factor", "### Steady state", "### Failover at equal cost",
                    "### Clock skew"):
        assert heading in out.stdout
    assert "| cold start P=12 N=3 | staggered | balanced | 4 |" in out.stdout  # limit column: ceil(12/3)
    # Duplicates are measured for both SDKs: the official's stop cancels batches in flight.
    scale_in = next(line for line in out.stdout.splitlines()
                    if line.startswith("| graceful scale in P=12 N=4->3 | staggered | greedy |"))
    ours_duplicates, official_duplicates = scale_in.split(" | ")[16:18]
    assert ours_duplicates == "0" and int(official_duplicates) > 0
    assert "| official, defaults | 30 / 180 / 30 |" in out.stdout
    # Both sides choose from the same candidates within the official's budget; each side's
    # best is marked and its configuration stated.
    assert "**(the official's best)**" in out.stdout and "**(chosen: this SDK's best)**" in out.stdout
    assert re.search(r"the official processor at interval \d+ s, expiration \d+ s, renewing every record every "
                     r"tick \(official, I=\d+ s E=\d+ s\)", out.stdout), out.stdout
    assert not results_file.exists() and not (results_file.parent / "results").exists()


def test_a_quick_run_refuses_to_record(results_file):
    out = bench("convergence", "--quick", "--record", results_path=results_file)
    assert out.returncode == 2
    assert "--record needs a full run" in out.stderr
    assert not results_file.exists()


def _cgroups_unavailable() -> str:
    from harness.cpu_quota import unavailable

    return unavailable() or ""


@pytest.mark.skipif(bool(_cgroups_unavailable()), reason=_cgroups_unavailable())
def test_load_quick_run_measures_a_side_from_its_processes_and_never_records(results_file):
    """A smoke run of the skewed scenario: this SDK by load, 4 capped processes on the
    emulator and Azurite the program starts. Timing figures are not asserted (they are
    the benchmark's to record); the table's shape and the handlers' counts are."""
    out = bench("load", "--quick", "--sides", "load", results_path=results_file, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |").split(" | ")[1:] for line in out.stdout.splitlines()
            if line.startswith("| ")}
    assert rows[""] == ["ours, by load"]  # the header: one column, the side that ran
    for label in ("skew: max/mean utilisation", "slowed: max/mean utilisation", "skew: total lag at the end, events",
                  "slowed: lag growth, events/s", "duplicates", "lost", "events produced"):
        assert label in rows and rows[label][0] not in ("", "n/a"), (label, out.stdout)
    # Four processes measured, each from its own CPU time, under its quota.
    shares = [float(u) for u in rows["skew: utilisation per process (last round)"][0].split(" / ")]
    assert len(shares) == 4 and all(0 < u < 1.5 for u in shares), shares
    summary = re.search(r"^load: (\d+) events, duplicates (\d+), lost (\d+)", out.stderr, re.MULTILINE)
    assert summary, out.stderr[-3000:]
    produced, duplicates, lost = map(int, summary.groups())
    assert produced > 0 and rows["events produced"] == [str(produced)] and rows["duplicates"] == [str(duplicates)]
    assert rows["lost"] == [str(lost)]
    assert not results_file.exists()
    refused = bench("load", "--quick", "--record", results_path=results_file)
    assert refused.returncode == 2 and "never recorded" in refused.stderr


@pytest.mark.azurite
@pytest.mark.eventhubs
@pytest.mark.slow
def _state_sections(stdout: str) -> dict:
    """The state benchmark's tables by their ``### `` heading: each a list of rows (cells)."""
    sections: dict = {}
    heading = None
    for line in stdout.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
            sections[heading] = []
        elif heading and line.startswith("| ") and not line.startswith("| state "):
            sections[heading].append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return sections


def test_state_quick_run_moves_a_partition_on_both_sides_with_exact_counts_and_records_its_command(results_file):
    """A smoke run at 50 kB of state, one round: the program starts its own emulator and
    Azurite, moves one partition per side, SIGKILLs its first owner, measures checkpoints,
    and checks the counts against the hub's events itself. Times are not asserted (they
    are the benchmark's to record); what each side restored and wrote is: the warm-up
    side from its replica, the naive side by reading its blob; a checkpoint of ours
    writes the change, the naive one the whole state."""
    out = bench("state", "--sizes", "0.05", "--rounds", "1", "--record", results_path=results_file, timeout=500)
    assert out.returncode == 0, out.stderr
    sections = _state_sections(out.stdout)
    assert set(sections) == {"Planned move", "Failover after SIGKILL", "Checkpoint cost"}, out.stdout
    warm_label, naive_label = "warm-up (`stateful=True`)", "naive (one blob, restored at the claim)"
    rows = {cells[1]: cells for cells in sections["Planned move"] if cells[0] == "0.05 MB"}
    assert set(rows) == {warm_label, naive_label}, out.stdout
    warm, naive = rows[warm_label], rows[naive_label]
    assert warm[5] == "yes" and naive[5] == "no"  # b restored warm
    assert int(naive[6].replace(",", "")) > 50_000  # the naive new owner read its whole blob at the claim
    for cells in rows.values():
        assert cells[9:12] == ["0", "0", "yes"], cells  # duplicates, lost, counts exact
    failovers = {cells[1]: cells for cells in sections["Failover after SIGKILL"] if cells[0] == "0.05 MB"}
    assert set(failovers) == {warm_label, naive_label}, out.stdout
    warm, naive = failovers[warm_label], failovers[naive_label]
    assert float(warm[2]) > 0 and float(naive[2]) > 0  # both delivered the dead owner's partition
    assert warm[5] == "yes" and naive[5] == "no"  # the standby restored warm
    assert int(warm[6].replace(",", "")) < int(naive[6].replace(",", "")) and int(naive[6].replace(",", "")) > 50_000
    assert warm[8:10] == ["0", "yes"] and naive[8] == "0", (warm, naive)  # lost, counts exact
    # (the naive way's counts may differ: a SIGKILL between its blob and its checkpoint double-counts)
    costs = {cells[1]: cells for cells in sections["Checkpoint cost"]}
    assert set(costs) == {"5 counters", "1 KB + counters"}, out.stdout
    def median(cell: str) -> int:  # "12,345" or "12,345 (12,001-12,400)"
        return int(cell.split()[0].replace(",", ""))

    for cells in costs.values():
        ours_requests, ours_bytes, naive_requests, naive_bytes = (median(cells[i]) for i in (2, 3, 6, 7))
        assert ours_requests >= 2 and naive_requests >= 2, cells  # the change (or blob), the checkpoint record
        assert naive_bytes > 50_000 and ours_bytes < naive_bytes / 10, cells
    assert median(costs["1 KB + counters"][3]) > 1000 > median(costs["5 counters"][3]), costs
    text = results_file.read_text()
    assert "Command: `python -m benchmarks.state --sizes 0.05 --rounds 1 --record`" in text
    assert "<!-- BEGIN state -->" in text


def test_state_refuses_a_size_of_nothing_before_it_starts_anything(results_file):
    out = bench("state", "--sizes", "0", results_path=results_file, timeout=120)
    assert out.returncode == 2
    assert "every --sizes value above 0 MB" in out.stderr
    assert not results_file.exists()


@pytest.mark.parametrize("module", ["convergence", "throughput", "store_bench", "spark_sink", "scale", "moves",
                                    "faults", "decode", "e2e", "load", "state", "spark_source", "postgres_sink"])
def test_every_benchmark_has_the_same_record_and_debug_flags(module):
    command = module.replace("_", "-")
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "bench", command, "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    assert f"usage: eventprocessor bench {command}" in out.stdout
    assert "--record" in out.stdout and "--debug" in out.stdout
    assert "--no-write" not in out.stdout and "--no-record" not in out.stdout


@pytest.mark.eventhubs
def test_e2e_quick_run_reads_the_hub_with_both_floors_and_both_consumers(results_file, tmp_path):
    """A smoke run with its own emulator and Azurite: every side reads every event (a
    side that does not fails the run), the sweep and the ratio table are printed; the
    run saved with --save-json prints the same tables again."""
    options = ["--quick", "--events", "120000", "--sweep", "100,300"]
    saved = tmp_path / "e2e.json"
    run = bench("e2e", *options, "--save-json", str(saved), results_path=results_file, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    out = run.stdout
    for row in ("| floor, our receive path (`floor-lean`) | ", "| floor, azure-eventhub's receive path (`floor`) | ",
                "| ours | ", "| official | ", "| ours/floor (our receive path) | **",
                "| ours/floor (azure-eventhub's receive path) | **",
                "| official/floor (azure-eventhub's receive path) | **", "| ours/official | **"):
        assert any(line.startswith(row) for line in out.splitlines()), (row, out)
    assert "### Prefetch sweep" in out and "Ours at **" in out
    again = bench("e2e", *options, "--from-json", str(saved), results_path=results_file, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split("### Prefetch sweep")[1] == out.split("### Prefetch sweep")[1]
    assert not results_file.exists()


def _e2e_round(lean: float | None, floor: float, ours: float, official: float, others=(0.1, 0.1, 0.1, 0.1)):
    """One saved round; ``lean`` None: a run saved before the lean floor existed."""
    return {side: {"side": side, "prefetch": 300, "events": 100_000, "rate": rate, "cpu_us": 1e6 / rate,
                   "emulator_us": 1.0, "others_cores": busy, "load": 1.5, "startup": 2.0}
            for side, rate, busy in zip(("floor-lean", "floor", "ours", "official"), (lean, floor, ours, official),
                                        others, strict=True) if rate is not None}


def _e2e_render(tmp_path, results_file, rounds, prefetch) -> str:
    """The tables ``--from-json`` prints for ``rounds`` saved as a run would be."""
    path = tmp_path / f"e2e-{len(rounds)}-{len(rounds[0])}.json"
    path.write_text(json.dumps({"command": "python -m benchmarks.e2e", "seconds": 1.0,
                                "results": {"rounds": rounds, "prefetch": prefetch}}))
    out = bench("e2e", "--from-json", str(path), "--events", "100000", "--sweep-events", "50000",
                results_path=results_file, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_e2e_states_ratios_from_quiet_rounds_only_and_flags_a_busy_run(results_file, tmp_path):
    """A round in which other processes took the machine (here: 0.9 cores during ours)
    is left out of the ratios; with too few quiet rounds the run says it is not a result.
    The target is judged against the floor of our receive path; the ratios to
    azure-eventhub's floor are shown beside it. The program prints saved rounds again
    (``--from-json``) without running anything."""
    def round_(lean: float, ours: float, official: float, others=(0.1, 0.1, 0.1, 0.1)):
        return _e2e_round(lean, lean * 2 / 3, ours, official, others)

    rounds = [round_(30_000, 27_000, 15_000), round_(30_000, 12_000, 15_000, others=(0.1, 0.1, 0.9, 0.1)),
              round_(32_000, 28_800, 16_000), round_(29_000, 26_100, 14_500)]
    prefetch = {"floor-lean": 1000, "floor": 300, "ours": 300, "official": 1000}
    quiet = _e2e_render(tmp_path, results_file, rounds, prefetch)
    # Rounds 0, 2 and 3 are quiet and counted; the busy round 1 (ours at 0.40) is not.
    assert "3 of 4 rounds were quiet (other processes used at most 0.3 cores in every phase)" in quiet
    assert "| ours/floor (our receive path) | **0.90** | 0.90-0.90 |" in quiet
    assert "| ours/floor (azure-eventhub's receive path) | **1.35** | 1.35-1.35 |" in quiet
    assert "| official/floor (azure-eventhub's receive path) | **0.75** | 0.75-0.75 |" in quiet
    assert "| ours/official | **1.80** | 1.80-1.80 |" in quiet
    assert ("Ours at **0.90x** of the events/s of the floor of our receive path, median of 3 rounds (range "
            "0.90-0.90; target >= 0.85: met), and 1.35x of azure-eventhub's") in quiet and "not a result" not in quiet
    assert "| floor, our receive path (`floor-lean`) | 1000 | 30,000 |" in quiet
    assert "| 1 | 30,000; 33.3; 0.10 | 20,000; 50.0; 0.10 | 12,000; 83.3; 0.90 busy | 15,000; 66.7; 0.10 | 0.40 | " \
           "0.60 | 0.75 |" in quiet

    busy = _e2e_render(tmp_path, results_file, rounds[:2], prefetch)
    assert "**Busy machine: in 1 of 2 rounds other processes used more than 0.3 cores, so this run is not a " \
           "result.**" in busy and "busy machine: not a result" in busy
    assert not results_file.exists()


def test_e2e_prints_a_run_saved_before_the_lean_floor_without_judging_the_target(results_file, tmp_path):
    """A run saved with only azure-eventhub's floor prints its figures, a dash where the
    floor of our receive path would be, and no verdict on the target."""
    rounds = [_e2e_round(None, 30_000, 27_000, 15_000), _e2e_round(None, 32_000, 28_800, 16_000)]
    out = _e2e_render(tmp_path, results_file, rounds, {"floor": 300, "ours": 300, "official": 1000})
    assert "| ours/floor (azure-eventhub's receive path) | **0.90** | 0.90-0.90 |" in out
    assert "| ours/floor (our receive path) | **n/a** | n/a |" in out
    assert "target >= 0.85: not judged, this run has no floor of our receive path" in out
    assert "| 0 | - | 30,000; 33.3; 0.10 | 27,000; 37.0; 0.10 | 15,000; 66.7; 0.10 | - | 0.90 | 0.50 |" in out
    assert not results_file.exists()


def test_e2e_refuses_a_file_that_is_no_saved_run_and_never_records_one(results_file, tmp_path):
    path = tmp_path / "not-a-run.json"
    path.write_text(json.dumps({"rounds": []}))
    out = bench("e2e", "--from-json", str(path), results_path=results_file, timeout=120)
    assert out.returncode == 2 and "not a run saved by --save-json (KeyError: 'results')" in out.stderr
    out = bench("e2e", "--from-json", str(path), "--record", results_path=results_file, timeout=120)
    assert out.returncode == 2 and "never recorded" in out.stderr
    assert not results_file.exists()


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.eventhubs
def test_spark_source_quick_run_reads_every_event_on_every_path_and_writes_nothing(results_file):
    """``python -m benchmarks.spark_source`` at a small size: its own emulator and
    standalone cluster, one round. The program fails unless every path read every event
    and the source's Parquet table holds exactly the rows its batches read; no timing is
    asserted, the table's shape is."""
    run = bench("spark_source", "--events", "2000", "--partitions", "2", "--rounds", "1", "--cores", "1",
                "--batch", "1000", "--rate", "200", "--latency-seconds", "3", results_path=results_file, timeout=900)
    out = run.stdout
    assert run.returncode == 0, out + run.stderr[-3000:]
    for path in ("ceiling", "receive", "floor-1", "source-1", "sink"):
        assert f"round 1 {path}: " in out
    table = out[out.index("| path | rows/s"):out.index("Median milliseconds")]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| path")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| ceiling: azure-eventhub's consumer alone (1 process, no Spark)",
        "| the read alone: `EventHubSource` receivers (1 process, no Spark)",
        "| floor: a trivial Python source, 1 executor core(s)",
        "| **source, 1 executor core(s)**",
        "| sink path: `EventProcessor` + `SparkSink` into Parquet (2 executor cores)"]
    assert rows[0].split(" | ")[4].startswith("**1.00**")  # the ceiling's ratio to itself
    assert rows[3].split(" | ")[3].startswith("**") and rows[3].split(" | ")[4].startswith("**")
    steps = out[out.index("| path | `latestOffset`"):]
    assert "| floor: a trivial Python source, 1 executor core(s) | " in steps
    assert "| **source, 1 executor core(s)** | " in steps
    assert "2,000 events of ~100 bytes" in out and "at the start of each round: " in out
    assert "600 events in " in out, "the latency phase measured every event of the steady stream"
    assert not results_file.exists()



def test_faults_counts_the_wiped_stores_reports_after_the_processors_ticked_and_refusing_rewind_replays_little(
        results_file):
    """The wipe's rows say how often the processors reported the data loss. They report
    at their next tick (up to an interval after the wipe), so the count is taken when the
    run is over: counted one virtual second after the wipe it read 0. And with
    refuse_checkpoint_rewind each owner claims its partitions back from the checkpoint it
    knew: the run of 2026-11-29 10:22 had 313 duplicates there (two partitions claimed
    afresh by the other processor, from no checkpoint)."""
    run = bench("faults", results_path=results_file, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = [line.split("|") for line in run.stdout.splitlines() if line.startswith("| store wiped")]
    assert len(rows) == 2, run.stdout[-3000:]
    for row in rows:
        reported = int(re.search(r"reported (\d+) times", row[10]).group(1))
        assert reported >= 2, row  # each of the two processors noticed
        assert int(row[7]) == 0, row  # lost
    refusing = next(row for row in rows if "refuse_checkpoint_rewind" in row[1])
    assert int(refusing[8]) <= 8, refusing  # duplicates: at most the batches in hand at the wipe
