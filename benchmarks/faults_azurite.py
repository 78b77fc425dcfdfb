"""The Azurite rows of ``python -m benchmarks.faults --azurite``: the store fault
scenarios of :mod:`harness.azurite_faults` at full length (the Blob store
on a real Azurite, through a loopback TCP fault proxy, in real time)."""
from __future__ import annotations

import asyncio

from eventprocessor.emulators.azurite import start_azurite
from harness.azurite_faults import (
    PROCESSORS,
    AzuriteRun,
    black_hole,
    resets,
    restarted_empty,
    run_fault_scenario,
    slow_store,
)

from .fault_rows import Row

__all__ = ["SCENARIOS", "run_azurite_rows"]

SCENARIOS = [
    ("slow store (every request +1.5 s, 20 s)", slow_store(20.0)),
    ("black-holed store (30 s)", black_hole(30.0)),
    ("connections reset (20 s)", resets(20.0)),
]


def run_azurite_rows() -> list[Row]:
    """The benchmark's Azurite rows (``python -m benchmarks.faults --azurite``)."""

    async def everything() -> list[AzuriteRun]:
        azurite = start_azurite()
        try:
            runs = [await run_fault_scenario(name, inject, azurite) for name, inject in SCENARIOS]
        finally:
            azurite.stop()
        for processors in (1, PROCESSORS):
            runs.append(await restarted_empty(refuse=False, processors=processors))
            runs.append(await restarted_empty(refuse=True, processors=processors))
        return runs

    rows = []
    for run in asyncio.run(everything()):
        rows.append(Row(fault=run.name, transport="azurite", bound="E + 1 s + (⌈P/N⌉+2)·1.1·I + T + 5 s",
                        bound_seconds=run.bound, recovered=run.recovered_after, produced=run.produced, lost=run.lost,
                        duplicates=run.duplicates, overlap=run.overlap, note=run.note))
    return rows
