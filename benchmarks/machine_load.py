"""How busy the machine was while a benchmark ran, apart from the benchmark itself.

On a shared 2-core machine, a figure measured while other work takes a core is a
measurement of that work as much as of the code. Every benchmark that uses this reports,
beside its figures, the 1-minute load average and the CPU that processes *outside* its
own process tree used meanwhile (the machine's busy time from ``/proc/stat`` minus the
benchmark's own process, its children and theirs, Azurite and Spark included). A run in
which that exceeds :data:`BUSY_OTHER_CORES` on average is flagged as taken on a busy
machine: its figures are shown, not a result.

Example::

    window = LoadWindow()
    ...  # measure
    reading = window.reading()
    print(reading.describe())   # 'other processes 0.05 cores on average; 1-min load average 1.2 -> 2.3'
    if reading.busy:
        ...  # flag the figures
"""
from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["BUSY_OTHER_CORES", "LoadReading", "LoadWindow", "busy_flag", "load_average", "process_cpu_seconds"]

BUSY_OTHER_CORES = 0.25
"""Other processes' mean CPU (cores) above which a run is flagged as taken on a busy machine.
A quarter of a core is an eighth of this 2-core machine: enough to move a ratio by several
per cent on a run that keeps both cores busy itself."""


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of one process (Linux ``/proc``), or None elsewhere or once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def _machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent not idle since boot (``/proc/stat``), or None."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal: steal is time another guest took.
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def _processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, CPU seconds of the process and of its reaped children)."""
    tick = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        try:
            # fields[0] is the state; ppid, then utime, stime, cutime, cstime at 11..14
            found[int(name)] = (int(fields[1]), sum(int(v) for v in fields[11:15]) / tick)
        except (IndexError, ValueError):
            continue
    return found


def _tree_seconds(root: int) -> float | None:
    """CPU seconds of ``root`` and every live descendant (a reaped one is in its parent's)."""
    try:
        processes = _processes()
    except OSError:
        return None
    if root not in processes:
        return None
    children: dict[int, list[int]] = {}
    for pid, (parent, _cpu) in processes.items():
        children.setdefault(parent, []).append(pid)
    total, stack = 0.0, [root]
    while stack:
        pid = stack.pop()
        total += processes[pid][1]
        stack.extend(children.get(pid, ()))
    return total


@dataclass(frozen=True)
class _Snapshot:
    wall: float
    machine: float | None
    own: float | None
    load: float | None

    @classmethod
    def take(cls, root: int) -> _Snapshot:
        return cls(time.monotonic(), _machine_busy_seconds(), _tree_seconds(root), load_average())


@dataclass(frozen=True)
class LoadReading:
    """The machine's load over one window: the benchmark's own CPU and everyone else's."""

    seconds: float
    other_cores: float | None  # mean cores used by processes outside the benchmark's tree
    own_cores: float | None  # mean cores used by the benchmark's tree
    load_start: float | None
    load_end: float | None
    threshold: float = BUSY_OTHER_CORES

    @property
    def busy(self) -> bool:
        return self.other_cores is not None and self.other_cores > self.threshold

    def describe(self) -> str:
        other = "n/a" if self.other_cores is None else f"{self.other_cores:.2f}"
        own = "n/a" if self.own_cores is None else f"{self.own_cores:.2f}"
        load = "/".join("n/a" if v is None else f"{v:.1f}" for v in (self.load_start, self.load_end))
        return (f"other processes {other} cores on average (the benchmark's own {own}) over {self.seconds:.0f} s; "
                f"1-minute load average {load} at start/end")


class LoadWindow:
    """Measures the machine's load from its creation to each :meth:`reading`."""

    def __init__(self, threshold: float = BUSY_OTHER_CORES, root: int | None = None) -> None:
        self.threshold = threshold
        self._root = os.getpid() if root is None else root
        self._start = _Snapshot.take(self._root)

    def reading(self) -> LoadReading:
        end = _Snapshot.take(self._root)
        start = self._start
        seconds = end.wall - start.wall
        other = own = None
        # CPU times tick at 10 ms: a window under a second says nothing about the machine.
        if seconds >= 1.0 and None not in (start.own, end.own):
            own = max(0.0, (end.own - start.own) / seconds)  # type: ignore[operator]
            if None not in (start.machine, end.machine):
                other = max(0.0, (end.machine - start.machine) / seconds - own)  # type: ignore[operator]
        return LoadReading(seconds, other, own, start.load, end.load, self.threshold)


def busy_flag(readings: Iterable[LoadReading], what: str = "these figures") -> list[str]:
    """Markdown lines that flag a busy run (empty when the machine was quiet)."""
    readings = list(readings)
    busy = [r for r in readings if r.busy]
    if not busy:
        return []
    worst = max(r.other_cores or 0.0 for r in busy)
    return [f"**Busy machine, not a result**: other processes used more than {busy[0].threshold:g} cores on average "
            f"in {len(busy)} of {len(readings)} measured window(s) (up to {worst:.2f} cores), so {what} measure "
            f"that work as much as the code. Re-run on a quiet machine before quoting them.", ""]
