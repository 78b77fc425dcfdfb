"""What one e2e run measured, and how it is kept (:func:`save_run`, :func:`load_run`)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = ["CONSUMERS", "FLOORS", "SCALE_OUT_SIDES", "SIDES", "Fill", "Phase", "Results", "load_run", "save_run"]

# The bare receive loops (harness/worker/floor.py): on this SDK's lean receive path's
# frame reading (the floor the target is judged against), and on azure-eventhub's own.
FLOORS = ("floor-lean", "floor")
SIDES = (*FLOORS, "ours", "official")
CONSUMERS = ("ours", "official")
SCALE_OUT_SIDES = ("ours", "official", "official-as-documented")


@dataclass
class Fill:
    rate: float = 0.0
    producer_us: float = 0.0
    emulator_us: float | None = None


@dataclass
class Phase:
    """One side reading the pre-filled hub once: the figures of its steady window."""

    side: str
    prefetch: int
    events: int
    rate: float  # events/s
    cpu_us: float  # the consumer process's CPU µs per event
    emulator_us: float | None  # the emulator's CPU µs per event
    others_cores: float | None  # cores other processes of the machine used meanwhile
    load: float  # 1-minute load average at the end
    startup: float  # seconds from the process start to every partition flowing

    def busy(self, threshold: float) -> bool:
        return self.others_cores is not None and self.others_cores > threshold


@dataclass
class Results:
    fill: Fill = field(default_factory=Fill)
    sweep: list[Phase] = field(default_factory=list)
    prefetch: dict[str, int] = field(default_factory=dict)  # the sweep's choice per side
    rounds: list[dict[str, Phase]] = field(default_factory=list)
    failover: dict[str, list[float]] = field(default_factory=lambda: {i: [] for i in CONSUMERS})
    failover_lost: dict[str, int] = field(default_factory=lambda: {i: 0 for i in CONSUMERS})
    # per side, per round: duplicates after the scale-out, lost, partitions moved, seconds to settle
    scale_out: dict[str, list[tuple[int, int, int, float]]] = field(
        default_factory=lambda: {i: [] for i in SCALE_OUT_SIDES})


def save_run(path: str, results: Results, command: str, seconds: float) -> None:
    """Write a run's figures as JSON (``--save-json``), for ``--from-json`` to print again."""
    Path(path).write_text(json.dumps({"command": command, "seconds": seconds, "results": asdict(results)}, indent=1))


def load_run(path: str) -> tuple[Results, str, float]:
    """A run saved by ``--save-json`` (or written by hand: the keys of :class:`Results`,
    any of them left out): its results, its command and its duration. Raises
    ``ValueError`` naming what is wrong."""
    try:
        saved = json.loads(Path(path).read_text())
        raw = saved["results"]
        results = Results(fill=Fill(**raw.get("fill", {})), sweep=[Phase(**p) for p in raw.get("sweep", [])],
                          prefetch={side: int(p) for side, p in raw.get("prefetch", {}).items()},
                          rounds=[{side: Phase(**p) for side, p in phases.items()} for phases in raw.get("rounds", [])])
        results.failover.update(raw.get("failover", {}))
        results.failover_lost.update(raw.get("failover_lost", {}))
        results.scale_out.update({side: [tuple(r) for r in rounds]
                                  for side, rounds in raw.get("scale_out", {}).items()})
        return results, str(saved.get("command", "(command not saved)")), float(saved.get("seconds", 0.0))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"--from-json {path}: not a run saved by --save-json ({type(error).__name__}: {error})") \
            from None
