"""LoadMeter: what this processor's partitions cost it, measured for the load-aware plan.

Sampled every heartbeat, never on the hot path: the pumps already count the events they
dispatch (and, every 16th batch, their bytes) and know their lag, so a sample only takes
differences.
Rates and utilisation are smoothed with an exponential moving average. CPU utilisation
is this process's CPU time over the CPU it may use: the cgroup's quota when it has one
(a container's ``cpu.max``), else the cores it is allowed to run on.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from .lease import LeaseState, Pump
from .lease_table import LeaseTable
from .load_plan import MemberLoad, PartitionLoad

__all__ = ["LoadMeter", "CpuMeter", "available_cores"]

SMOOTHING = 0.3
"""Weight of the newest sample in the moving averages."""


def available_cores(root: Path = Path("/sys/fs/cgroup"), membership: Path = Path("/proc/self/cgroup")) -> float:
    """The CPUs this process may use: the tightest CPU quota of its cgroup and the
    cgroup's ancestors (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), else its affinity.

    The process's own cgroup comes from ``/proc/self/cgroup``: a container sees its own
    cgroup at the mount's root, but a systemd slice, a nested group or a host process in
    a capped group does not, and a quota set on any ancestor limits it too."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not on Linux
        cores = float(os.cpu_count() or 1)
    return min([cores, *_cgroup_quotas(root, membership)])


def _cgroup_quotas(root: Path, membership: Path) -> list[float]:
    """Every CPU quota (in cores) on the path from this process's cgroups up to the root."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        lines = []
    # (controller mount, the process's path in it, how one directory's quota is read)
    hierarchies: list[tuple[Path, str, Callable[[Path], float | None]]] = []
    for line in lines:
        _id, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if controllers == "":
            hierarchies.append((root, path, _quota_v2))
        elif "cpu" in controllers.split(","):
            for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
                if (root / name).is_dir():
                    hierarchies.append((root / name, path, _quota_v1))
                    break
    if not hierarchies:  # no /proc (or an unusual one): the mount roots, as a container sees them
        hierarchies = [(root, "/", _quota_v2), (root / "cpu", "/", _quota_v1)]
    quotas = []
    for mount, path, read in hierarchies:
        directory = mount.joinpath(*[part for part in path.split("/") if part and part != ".."])
        while True:
            # A container's own cgroup is its mount's root: the path /proc names from the
            # host's side does not exist in it, and the walk up reaches the root.
            if directory.is_dir():
                quota = read(directory)
                if quota is not None:
                    quotas.append(quota)
            if directory == mount:
                break
            directory = directory.parent
    return quotas


def _quota_v2(directory: Path) -> float | None:
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(0.01, int(quota) / int(period))
    except (OSError, ValueError):
        return None


def _quota_v1(directory: Path) -> float | None:
    try:
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return max(0.01, quota / period) if quota > 0 and period > 0 else None
    except (OSError, ValueError):
        return None


class CpuMeter:
    """This process's CPU utilisation since the last call (0 to 1 of what it may use).

    Example::

        meter = CpuMeter()
        ...
        meter()        # 0.42: 42 % of the cores the cgroup gives this process
    """

    def __init__(self, *, cpu_time: Callable[[], float] = time.process_time,
                 wall: Callable[[], float] = time.monotonic, cores: float | None = None) -> None:
        self._cpu_time, self._wall = cpu_time, wall
        self._cores = cores if cores is not None else available_cores()
        self._last = (cpu_time(), wall())

    def __call__(self) -> float:
        cpu, now = self._cpu_time(), self._wall()
        (last_cpu, last_wall), self._last = self._last, (cpu, now)
        elapsed = now - last_wall
        return 0.0 if elapsed <= 0 else max(0.0, (cpu - last_cpu) / (elapsed * self._cores))


def _backlog(pump: Pump) -> int | None:
    """Events enqueued after the last one the partition's handler finished (None while
    unknown). Not ``context.lag``, which counts from the last event handed to the
    handler: a saturated processor's backlog waits in ever larger batches in its
    handlers, and that lag stays near 0 while it falls behind."""
    newest = pump.context.last_enqueued_event_properties
    if newest is None:
        return None
    done = pump.last_completed
    if done is None:
        return pump.context.lag
    return max(0, newest.sequence_number - done.sequence_number)


def _smooth(new: float, old: float) -> float:
    return SMOOTHING * new + (1 - SMOOTHING) * old


class LoadMeter:
    """Samples the load of the partitions in ``table`` (their pumps' counters and lags) and
    the process's utilisation (``utilization()``), smoothed.

    A partition's lag growth (events/s) is what tells demand from use: utilisation stops
    at 1.0, a saturated processor's lags keep growing. It needs the lag, so the processor
    tracks the last enqueued event's properties when balancing by load."""

    def __init__(self, *, table: LeaseTable, clock_now: Callable[[], float],
                 utilization: Callable[[], float]) -> None:
        self._table = table
        self._now = clock_now
        self._utilization = utilization
        # partition -> (time, events, bytes, lag) at the last sample; lag None while unknown
        self._last: dict[str, tuple[float, int, int, int | None]] = {}
        self._rates: dict[str, tuple[float, float, float]] = {}  # partition -> (events/s, bytes/s, lag growth/s)
        self._smoothed_utilization: float | None = None
        self.current: MemberLoad | None = None

    def sample(self) -> MemberLoad:
        now = self._now()
        sampled = self._utilization()
        util = sampled if self._smoothed_utilization is None else _smooth(sampled, self._smoothed_utilization)
        self._smoothed_utilization = util
        partitions: dict[str, PartitionLoad] = {}
        for lease in self._table.in_state(LeaseState.OWNED):
            pump = lease.pump
            if pump is None:
                continue
            pid = lease.partition_id
            events, nbytes, lag = pump.events_dispatched, pump.bytes_dispatched, _backlog(pump)
            last = self._last.get(pid)
            rates = self._rates.get(pid)
            if last is not None and now > last[0] and events >= last[1]:
                dt = now - last[0]
                measured = ((events - last[1]) / dt, (nbytes - last[2]) / dt,
                            (lag - last[3]) / dt if lag is not None and last[3] is not None else 0.0)
                # The first rates measured on a claim are taken whole: blending them with zeros
                # would show a partition just taken over as lighter than it is for a minute.
                if rates is None:
                    rates = measured
                else:
                    rates = (_smooth(measured[0], rates[0]), _smooth(measured[1], rates[1]),
                             _smooth(measured[2], rates[2]))
                self._rates[pid] = rates
            self._last[pid] = (now, events, nbytes, lag)
            eps, bps, growth = rates if rates is not None else (0.0, 0.0, 0.0)
            partitions[pid] = PartitionLoad(eps, bps, lag or 0, max(0.0, now - lease.claimed_at), growth)
        for pid in [pid for pid in self._last if pid not in partitions]:
            del self._last[pid]
            self._rates.pop(pid, None)
        self.current = MemberLoad(util, partitions)
        return self.current
