"""The benchmark programs run end to end at small sizes (no timing assertions)."""
from __future__ import annotations

from benchmarks import convergence, throughput


async def test_throughput_processor_and_bare_loop_each_see_every_event_once():
    source = throughput.fill(4, 700)
    bare = await throughput.measure_bare(source, 4 * 700, "bare")
    processed = await throughput.measure_processor(source, 4 * 700, "processor")
    assert bare.events == 4 * 700
    # Only events dispatched after the processor owned every partition are counted.
    assert 0 < processed.events <= 4 * 700
    assert processed.seconds > 0 and bare.seconds > 0


def test_throughput_main_prints_the_ratio_without_writing(capsys):
    assert throughput.main(["--events-per-partition", "300", "--rounds", "1", "--no-write"]) == 0
    assert "median per-round ratio" in capsys.readouterr().out


def test_convergence_quick_run_prints_every_table_with_both_implementations(capsys):
    assert convergence.main(["--quick", "--no-write"]) == 0
    out = capsys.readouterr().out
    for heading in ("### Targets", "### Cold start", "### Crash and failover", "### Steady state", "### Clock skew"):
        assert heading in out
    assert "| cold start P=32 N=4 | staggered | balanced | 8 |" in out  # limit column: ceil(32/4)
