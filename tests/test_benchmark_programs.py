"""The benchmark programs run end to end at small sizes (no timing assertions), and
write benchmarks/RESULTS.md only when asked to with --record."""
from __future__ import annotations

import pytest

from benchmarks import convergence, decode, results, throughput


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


@pytest.mark.parametrize("module", ["convergence", "throughput"])
def test_every_benchmark_has_the_same_record_and_debug_flags(module, capsys):
    import importlib

    program = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit):
        program.main(["--help"], prog=f"eventprocessor bench {module.replace('_', '-')}")
    text = capsys.readouterr().out
    assert f"usage: eventprocessor bench {module.replace('_', '-')}" in text
    assert "--record" in text and "--debug" in text
    assert "--no-write" not in text and "--no-record" not in text
