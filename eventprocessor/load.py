"""LoadMeter: what this processor's partitions cost it, measured for the load-aware plan.

Sampled every heartbeat, never on the hot path: the pumps already count the events they
dispatch (and, every 16th batch, their bytes), so a sample only takes differences.
Rates and utilisation are smoothed with an exponential moving average. CPU utilisation
is this process's CPU time over the CPU it may use: the cgroup's quota when it has one
(a container's ``cpu.max``), else the cores it is allowed to run on.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

from .lease import LeaseState
from .lease_table import LeaseTable
from .load_plan import MemberLoad, PartitionLoad

__all__ = ["LoadMeter", "CpuMeter", "available_cores"]

SMOOTHING = 0.3
"""Weight of the newest sample in the moving averages."""


def available_cores(root: Path = Path("/sys/fs/cgroup")) -> float:
    """The CPUs this process may use: the cgroup v2 (or v1) quota, else its affinity."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(0.01, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    try:
        quota_v1 = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        period_v1 = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        if quota_v1 > 0:
            return max(0.01, quota_v1 / period_v1)
    except (OSError, ValueError):
        pass
    try:
        return float(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        return float(os.cpu_count() or 1)


class CpuMeter:
    """This process's CPU utilisation since the last call (0 to 1 of what it may use).

    Example::

        meter = CpuMeter()
        ...
        meter()        # 0.42: 42 % of the cores the cgroup gives this process
    """

    def __init__(self, *, cpu_time: Callable[[], float] = time.process_time,
                 wall: Callable[[], float] = time.monotonic, cores: Optional[float] = None) -> None:
        self._cpu_time, self._wall = cpu_time, wall
        self._cores = cores if cores is not None else available_cores()
        self._last = (cpu_time(), wall())

    def __call__(self) -> float:
        cpu, now = self._cpu_time(), self._wall()
        (last_cpu, last_wall), self._last = self._last, (cpu, now)
        elapsed = now - last_wall
        return 0.0 if elapsed <= 0 else max(0.0, (cpu - last_cpu) / (elapsed * self._cores))


class LoadMeter:
    """Samples the load of the partitions in ``table`` (their pumps' counters) and the
    process's utilisation (``utilization()``), smoothed."""

    def __init__(self, *, table: LeaseTable, clock_now: Callable[[], float],
                 utilization: Callable[[], float]) -> None:
        self._table = table
        self._now = clock_now
        self._utilization = utilization
        self._last: Dict[str, Tuple[float, int, int]] = {}  # partition -> (time, events, bytes) at the last sample
        self._rates: Dict[str, Tuple[float, float]] = {}
        self._smoothed_utilization: Optional[float] = None
        self.current: Optional[MemberLoad] = None

    def sample(self) -> MemberLoad:
        now = self._now()
        sampled = self._utilization()
        util = sampled if self._smoothed_utilization is None else \
            SMOOTHING * sampled + (1 - SMOOTHING) * self._smoothed_utilization
        self._smoothed_utilization = util
        partitions: Dict[str, PartitionLoad] = {}
        for lease in self._table.in_state(LeaseState.OWNED):
            pump = lease.pump
            if pump is None:
                continue
            pid = lease.partition_id
            events, nbytes = pump.events_dispatched, pump.bytes_dispatched
            last = self._last.get(pid)
            eps, bps = self._rates.get(pid, (0.0, 0.0))
            if last is not None and now > last[0] and events >= last[1]:
                dt = now - last[0]
                eps = SMOOTHING * (events - last[1]) / dt + (1 - SMOOTHING) * eps
                bps = SMOOTHING * (nbytes - last[2]) / dt + (1 - SMOOTHING) * bps
            self._last[pid] = (now, events, nbytes)
            self._rates[pid] = (eps, bps)
            lag = pump.context.lag or 0
            partitions[pid] = PartitionLoad(eps, bps, lag, max(0.0, now - lease.claimed_at))
        for pid in [pid for pid in self._last if pid not in partitions]:
            del self._last[pid]
            self._rates.pop(pid, None)
        self.current = MemberLoad(util, partitions)
        return self.current
