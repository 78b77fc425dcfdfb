"""A row of the "Faults" table and the table itself: what ``benchmarks/faults.py`` (the
virtual rows) and ``benchmarks/faults_azurite.py`` (the Azurite rows) both produce."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Row", "table"]


@dataclass
class Row:
    fault: str
    transport: str
    bound: str
    bound_seconds: float
    recovered: float | None
    produced: int
    lost: int
    duplicates: int
    overlap: float
    note: str = ""

    @property
    def within(self) -> bool:
        return self.recovered is not None and self.recovered <= self.bound_seconds and self.lost == 0


def table(rows: list[Row]) -> str:
    lines = ["| Fault | Transport | Bound | Bound (s) | Recovered after (s) | Events | Lost | Duplicates "
             "| Overlap (s) | Note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        recovered = "never" if r.recovered is None else f"{r.recovered:.1f}"
        lines.append(f"| {r.fault} | {r.transport} | {r.bound} | {r.bound_seconds:.1f} | {recovered} | {r.produced} "
                     f"| {r.lost} | {r.duplicates} | {r.overlap:.2f} | {r.note} |")
    return "\n".join(lines)
