"""ProcessorStats: the counters a processor keeps (read them with ``EventProcessor.stats``)."""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ProcessorStats"]


@dataclass
class ProcessorStats:
    """Counters since the processor was created (read :attr:`EventProcessor.stats`).

    ``self_fenced`` counts leases that ran out before a renewal succeeded (a missed
    renewal); ``lost`` counts claims ended because another processor took the partition;
    ``skipped_listings`` counts ticks that found nothing changed and read no ownership
    record; ``announcements`` the change notices written.
    """

    ticks: int = 0
    overruns: int = 0
    last_tick_duration: float = 0.0
    max_tick_duration: float = 0.0
    claims_won: int = 0
    claims_lost: int = 0
    steals: int = 0
    adopted: int = 0
    renewals: int = 0
    failed_renewals: int = 0
    self_fenced: int = 0
    lost: int = 0
    released: int = 0
    handed_off: int = 0
    handoffs_requested: int = 0
    store_data_lost: int = 0
    backed_off_ticks: int = 0
    backoff_level: int = 0
    skipped_listings: int = 0
    announcements: int = 0
