"""What the demo is asked to do, what it found, and what its handlers saw."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from eventprocessor import LoadBalancingStrategy

__all__ = ["DemoConfig", "DemoResult", "Ledger"]


@dataclass
class DemoConfig:
    partitions: int = 16
    processors: int = 4
    strategy: LoadBalancingStrategy = LoadBalancingStrategy.GREEDY
    interval: float = 0.5
    expiration: float = 4.0
    rate: float = 400.0
    store: str = "memory"
    source: str = "memory"
    timeout: float = 60.0


@dataclass
class DemoResult:
    produced: int = 0
    processed: int = 0
    deliveries: int = 0
    lost: int = 0
    duplicates: int = 0
    time_to_balance: float | None = None
    ticks_to_balance: int | None = None
    scale_in_seconds: float | None = None
    failover_seconds: float | None = None
    store_location: str = "in-memory"
    source_location: str = "in-memory"
    phases: list[str] = field(default_factory=list)


class Ledger:
    """What the demo's handlers saw, shared by all processors."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.deliveries = 0
        self.per_owner: Counter = Counter()
