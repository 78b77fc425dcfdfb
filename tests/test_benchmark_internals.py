"""The benchmarks' own arithmetic, as unit tests: the rule that leaves busy rounds out of
e2e's ratios, and how spark_source reads Spark's compacted file-sink metadata. These are
pure functions that a quick run of the program would reach only on a busy machine or
after ten micro-batches; everything else of the benchmarks is tested by running them as
programs (tests/test_benchmark_programs.py). The one test file that imports them."""
from __future__ import annotations

import pytest

from benchmarks import e2e
from benchmarks.spark_source import batch_files


def _e2e_round(floor: float, ours: float, official: float, others=(0.1, 0.1, 0.1)):
    return {side: e2e.Phase(side, 300, 100_000, rate, 1e6 / rate, 1.0, busy, 1.5, 2.0)
            for side, rate, busy in zip(("floor", "ours", "official"), (floor, ours, official), others)}


def test_e2e_states_ratios_from_quiet_rounds_only_and_flags_a_busy_run():
    """A round in which other processes took the machine (here: 0.9 cores during ours)
    is left out of the ratios; with too few quiet rounds the run says it is not a result."""
    rounds = [_e2e_round(30_000, 27_000, 15_000), _e2e_round(30_000, 12_000, 15_000, others=(0.1, 0.9, 0.1)),
              _e2e_round(32_000, 28_800, 16_000), _e2e_round(29_000, 26_100, 14_500)]
    summary = e2e.summarize(rounds, busy_cores=0.3, min_quiet=3)
    assert summary.quiet == [0, 2, 3] and not summary.busy
    assert summary.ratios["ours/floor"] == pytest.approx([0.9, 0.9, 0.9])
    assert summary.ratios["ours/official"] == pytest.approx([1.8, 1.8, 1.8])

    args = e2e._parser(None).parse_args([])
    args.events, args.sweep_events = 100_000, 50_000
    results = e2e.Results(rounds=rounds, prefetch={"floor": 300, "ours": 300, "official": 1000})
    quiet = e2e.render(results, args, "python -m benchmarks.e2e", 1.0)
    assert "Ours at **0.90x** of the floor's events/s, median of 3 rounds" in quiet and "not a result" not in quiet
    assert "| 1 | 30,000; 33.3; 0.10 | 12,000; 83.3; 0.90 busy |" in quiet

    results.rounds = rounds[:2]
    busy = e2e.render(results, args, "python -m benchmarks.e2e", 1.0)
    assert e2e.summarize(rounds[:2], 0.3, 3).busy
    assert "**Busy machine: in 1 of 2 rounds other processes used more than 0.3 cores, so this run is not a " \
           "result.**" in busy and "busy machine: not a result" in busy


def test_spark_source_latency_takes_each_file_once_at_the_batch_that_wrote_it(tmp_path):
    """Before: the compacted entry (9.compact lists batches 0-9) counted every earlier
    batch's files again at batch 9 (32,450 latencies for 20,000 events in a recorded run)."""
    def line(path):
        return '{"path":"file:///t/%s","size":1,"isDir":false,"modificationTime":1,"blockReplication":1,' \
               '"blockSize":1,"action":"add"}' % path

    for batch in range(9):
        (tmp_path / str(batch)).write_text(f"v1\n{line(f'part-{batch}')}")
    (tmp_path / "9.compact").write_text("v1\n" + "\n".join(line(f"part-{b}") for b in range(10)))
    (tmp_path / "10").write_text(f"v1\n{line('part-10')}")
    assert batch_files(tmp_path) == {b: [f"file:///t/part-{b}"] for b in range(11)}
