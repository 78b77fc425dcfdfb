"""The benchmark programs run end to end at small sizes (no timing assertions), and
write benchmarks/RESULTS.md only when asked to with --record."""
from __future__ import annotations

import asyncio
import math
import re
import subprocess
import sys

import pytest

from benchmarks import convergence, decode, results, scale, throughput


@pytest.fixture
def results_file(tmp_path, monkeypatch):
    """Point every benchmark's RESULTS.md (and plots) at a scratch copy."""
    path = tmp_path / "RESULTS.md"
    monkeypatch.setattr(results, "RESULTS", path)
    monkeypatch.setattr(convergence, "RESULTS_DIR", tmp_path / "results")
    return path


async def test_throughput_processor_and_bare_loop_each_see_every_event_once():
    source = throughput.fill(4, 700)
    bare = await throughput.measure_bare(source, 4 * 700, "bare")
    processed = await throughput.measure_processor(source, 4 * 700, "processor")
    assert bare.events == 4 * 700
    # Only events dispatched after the processor owned every partition are counted.
    assert 0 < processed.events <= 4 * 700
    assert processed.seconds > 0 and bare.seconds > 0


def test_throughput_prints_the_ratio_and_writes_nothing_by_default(capsys, results_file):
    assert throughput.main(["--events-per-partition", "300", "--rounds", "1"]) == 0
    assert "median per-round ratio" in capsys.readouterr().out
    assert not results_file.exists()


def test_decode_compares_every_contestant_on_messages_as_the_client_decodes_them(capsys, results_file):
    messages = decode.received_messages(3, "data3")
    assert [m.data for m in messages] == [[b"x" * 10, b"x" * 10, b"x" * 12]] * 3
    assert decode.previous_message_to_event(messages[0]).body == b"x" * 32  # the old join
    assert decode.main(["--events", "200", "--rounds", "2"]) == 0
    out = capsys.readouterr().out
    for row in ("floor", "previous `message_to_event`", "current `message_to_event`", "EventData._from_message",
                "three data sections", "one sequence section", "an amqp-value"):
        assert row in out
    assert not results_file.exists()


def test_record_writes_the_section_with_the_command_that_reproduces_it(capsys, results_file):
    results_file.write_text("# Benchmark results\n\n<!-- BEGIN other -->\nkept\n<!-- END other -->\n")
    assert throughput.main(["--events-per-partition", "300", "--rounds", "1", "--record"]) == 0
    text = results_file.read_text()
    assert "Command: `python -m benchmarks.throughput --events-per-partition 300 --rounds 1 --record`" in text
    assert "<!-- BEGIN throughput -->" in text and "median per-round ratio" in text
    assert "<!-- BEGIN other -->\nkept\n<!-- END other -->" in text


def test_convergence_quick_run_prints_every_table_with_both_implementations(capsys, results_file):
    assert convergence.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for heading in ("### Targets", "### Cold start", "### Crash and failover", "### Rolling restart", "### Standbys",
                    "### Static assignment and balance factor", "### Steady state", "### Failover at equal cost",
                    "### Clock skew"):
        assert heading in out
    assert "| cold start P=12 N=3 | staggered | balanced | 4 |" in out  # limit column: ceil(12/3)
    # Duplicates are measured for both SDKs: the official's stop cancels batches in flight.
    scale_in = next(line for line in out.splitlines()
                    if line.startswith("| graceful scale in P=12 N=4->3 | staggered | greedy |"))
    ours_duplicates, official_duplicates = scale_in.split(" | ")[16:18]
    assert ours_duplicates == "0" and int(official_duplicates) > 0
    assert "| official, defaults | 30 / 180 / 30 |" in out
    assert not results_file.exists()


def test_a_quick_run_refuses_to_record(capsys, results_file):
    with pytest.raises(SystemExit) as exit_info:
        convergence.main(["--quick", "--record"])
    assert exit_info.value.code == 2
    assert "--record needs a full run" in capsys.readouterr().err
    assert not results_file.exists()


@pytest.mark.azurite
def test_scale_quick_run_starts_both_sides_as_processes_and_checks_ownership_in_the_store(capsys, results_file,
                                                                                         azurite):
    """A smoke run: 8 partitions x 2 processes per side on the session's Azurite. Timing
    figures are not asserted (they are the benchmark's to record); the table's shape is."""
    code = scale.main(["--quick"], azurite=azurite)
    out = capsys.readouterr().out
    assert code in (0, 1), out  # 1: a side missed a check, which the table says
    assert "| 8 x 2 |" in out  # the sizing row: measured listing cost, I and E
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in out.splitlines()
            if line.startswith("| ") and line.count(" | ") == 2}
    for label in ("seconds to balanced (from the common start)", "missed renewals (must be 0)",
                  "every partition owned by exactly one live processor at the end",
                  "requests/s to balanced (all processors)",
                  "CPU per processor to balanced, mean (max), % of a core"):
        assert label in rows and all(cell.strip(" |") not in ("", "-") for cell in rows[label]), (label, out)
    # the final check listed the store and counted, for each side, the partitions owned once
    owned_once = rows["every partition owned by exactly one live processor at the end"]
    assert all(re.search(r"\(\d+/8\)", cell) for cell in owned_once)
    assert not results_file.exists()
    with pytest.raises(SystemExit):
        scale.main(["--quick", "--record"], azurite=azurite)
    assert "never recorded" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.eventhubs
def test_spark_source_quick_run_reads_every_event_on_every_path_and_writes_nothing(capsys, results_file):
    """``python -m benchmarks.spark_source`` at a small size: its own emulator and
    standalone cluster, one round. The program fails unless every path read every event
    and the source's Parquet table holds exactly the rows its batches read; no timing is
    asserted, the table's shape is."""
    from benchmarks import spark_source

    code = spark_source.main(["--events", "2000", "--partitions", "2", "--rounds", "1", "--cores", "1",
                              "--batch", "1000", "--rate", "200", "--latency-seconds", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    for path in ("ceiling", "receive", "source-1", "sink"):
        assert f"round 1 {path}: " in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| path")]
    assert [row.split(" | ")[0] for row in rows] == [
        "| ceiling: azure-eventhub's consumer alone (1 process, no Spark)",
        "| floor of the read: `EventHubSource` receivers alone (1 process, no Spark)",
        "| **source, 1 executor core(s)**",
        "| sink path: `EventProcessor` + `SparkSink` into Parquet (2 executor cores)"]
    assert rows[0].split(" | ")[3] == "**1.00**"  # the ratio column is to the ceiling
    assert "2,000 events of ~100 bytes" in out and "at the start of each round: " in out
    assert "600 events in " in out, "the latency phase measured every event of the steady stream"
    assert not results_file.exists()


def test_spark_source_latency_takes_each_file_once_at_the_batch_that_wrote_it(tmp_path):
    """Before: the compacted entry (9.compact lists batches 0-9) counted every earlier
    batch's files again at batch 9 (32,450 latencies for 20,000 events in a recorded run)."""
    from benchmarks.spark_source import batch_files

    def line(path):
        return '{"path":"file:///t/%s","size":1,"isDir":false,"modificationTime":1,"blockReplication":1,' \
               '"blockSize":1,"action":"add"}' % path

    for batch in range(9):
        (tmp_path / str(batch)).write_text(f"v1\n{line(f'part-{batch}')}")
    (tmp_path / "9.compact").write_text("v1\n" + "\n".join(line(f"part-{b}") for b in range(10)))
    (tmp_path / "10").write_text(f"v1\n{line('part-10')}")
    assert batch_files(tmp_path) == {b: [f"file:///t/part-{b}"] for b in range(11)}


@pytest.mark.parametrize("module", ["convergence", "throughput", "store_bench", "spark_sink", "spark_source", "scale"])
def test_every_benchmark_has_the_same_record_and_debug_flags(module, capsys):
    import importlib

    program = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit):
        program.main(["--help"], prog=f"eventprocessor bench {module.replace('_', '-')}")
    text = capsys.readouterr().out
    assert f"usage: eventprocessor bench {module.replace('_', '-')}" in text
    assert "--record" in text and "--debug" in text
    assert "--no-write" not in text and "--no-record" not in text


def test_the_sizing_rule_counts_the_stores_one_thread_and_the_start_up_burst():
    # 4096 x 32 as measured here: 2.23 s CPU per listing (0.64 s of it Azurite's), 2 cores.
    client_bound = scale.choose_timing(2.23, 32, 2.0, store_listing=0.64, store_write=0.0015, partitions=4096)
    assert (client_bound.interval, client_bound.bound_by) == (72.0, "client CPU")
    assert client_bound.store_load == pytest.approx(32 * 0.64 / 72)
    assert client_bound.burst == pytest.approx(32 * 0.64 + 2 * 4096 * 0.0015)
    # A store that costs more than the clients (a slow emulator, a remote account): it sets I.
    store_bound = scale.choose_timing(0.5, 16, 2.0, store_listing=0.4, store_write=0.001, partitions=1024)
    assert store_bound.bound_by == "the store's thread" and store_bound.interval == 13.0  # ⌈16·0.4/0.5⌉
    assert store_bound.store_load <= 0.5
    burst_bound = scale.choose_timing(0.5, 16, 2.0, store_listing=0.1, store_write=0.01, partitions=1024)
    assert burst_bound.bound_by == "the start-up burst" and burst_bound.interval == math.ceil(1.5 * (1.6 + 20.48))
    assert burst_bound.store_timeout >= burst_bound.burst  # the burst fits in one store timeout


@pytest.mark.azurite
def test_a_store_that_does_not_go_idle_is_reported_not_crashed_on(capsys, azurite, tmp_path):
    """Before: a saturated Azurite made the benchmark crash on the next side's container
    (ServiceRequestTimeoutError) and nothing was recorded. Now each side waits for the
    store to go idle, and one that does not is reported in the table."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # stands in for a saturated Azurite
    try:
        args = scale._parser(None).parse_args(["--drain-timeout", "2", "--sizes", "8x2", "--idle-sample", "0.5",
                                               "--calibration-listings", "2", "--impls", "ours"])
        args.sizes, args.impls, args.unmeasured = [(8, 2)], ["ours"], []
        results = asyncio.run(scale.run_sizes(args, azurite.connection_string, busy.pid))
    finally:
        busy.kill()
        busy.wait()
    [size] = results
    assert size.sides == {} and "ours: Azurite was still at" in size.error and "given up on" in size.error
    markdown = scale.render(results, args, "python -m benchmarks.scale", 1.0, "n/a")
    assert "**Failed**: ours: Azurite was still at" in markdown
    assert "8 x 2: ours did not run (ours: Azurite was still at" in markdown
