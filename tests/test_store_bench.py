"""The store benchmark's harness: it runs, counts requests and renders its table.

Small counts only; the numbers themselves live in benchmarks/RESULTS.md.
"""
from __future__ import annotations

import uuid

import pytest

from benchmarks import store_bench


def test_dry_run_on_the_memory_store_renders_every_column(tmp_path, capsys, monkeypatch):
    from benchmarks import results

    monkeypatch.setattr(results, "RESULTS", tmp_path / "RESULTS.md")
    code = store_bench.main(
        ["--stores", "memory", "--partitions", "4,9", "--checkpoint-ops", "12", "--list-repeats", "3", "--rounds", "2",
         "--record"]
    )
    assert code == 0
    recorded = (tmp_path / "RESULTS.md").read_text()
    table = recorded.split("<!-- BEGIN store_bench -->\n")[1].split("<!-- END store_bench -->")[0]
    assert table in capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ours in-memory")]
    assert [row.split("|")[2].strip() for row in rows] == ["4", "9"]
    # The in-memory store bills one request per record written or listing.
    assert all(row.count("| 1.00 |") == 3 for row in rows)
    assert "Concurrency: 16" in table and "2 round(s)" in table
    assert "python -m benchmarks.store_bench --stores memory" in table


def test_bad_arguments_are_rejected_with_the_option_named(capsys):
    with pytest.raises(SystemExit):
        store_bench.main(["--stores", "nosuchstore"])
    assert "nosuchstore" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        store_bench.main(["--rounds", "0"])
    assert "--rounds" in capsys.readouterr().err


@pytest.mark.azurite
async def test_official_store_costs_are_counted_at_the_transport(azurite):
    adapter = store_bench.OfficialBlobStore(azurite.connection_string, f"bench-test-{uuid.uuid4().hex[:8]}")
    try:
        result = await store_bench.measure(adapter, 6, concurrency=3, checkpoint_ops=12, list_repeats=2)
    finally:
        await adapter.close()
    assert result.create.failures == result.reclaim.failures == 0
    # The official store tries set_blob_metadata first (404 on a new blob), then uploads.
    assert result.create.requests_per_op == 2.0
    assert result.reclaim.requests_per_op == 1.0
    assert result.fence is None, "the official store does not fence"
    assert result.checkpoint.requests_per_op == 1.0
    assert result.list_requests == 1.0
    assert len(result.list_ms) == 2


@pytest.mark.azurite
async def test_our_blob_store_runs_through_the_contract_adapter(azurite):
    adapter = store_bench._make("ours-blob", azurite.connection_string, 6)
    assert adapter is not None
    try:
        result = await store_bench.measure(adapter, 6, concurrency=3, checkpoint_ops=12, list_repeats=2)
    finally:
        await adapter.close()
    assert result.create.failures == result.reclaim.failures == 0
    # A real create-if-absent is one request; the fence three (two reads and a write), after
    # which a fenced checkpoint is one conditional write.
    assert result.create.requests_per_op == 1.0
    assert result.fence is not None and result.fence.requests_per_op == 3.0
    assert result.fence.methods == {"HEAD": 12, "PUT": 6}
    assert result.checkpoint.requests_per_op == 1.0 and result.checkpoint.methods == {"PUT": 12}
