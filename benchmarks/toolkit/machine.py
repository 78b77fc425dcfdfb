"""How busy the machine is while a benchmark measures: the one reader of Linux's ``/proc``
the benchmarks share.

On a shared 2-core machine a figure measured while other work takes a core measures
that work as much as the code, and the load average alone cannot tell: it counts the
run's own processes too (a consumer at 100 % of a core, the emulator, Azurite). So the
CPU the machine spent (``/proc/stat``) is set against the CPU of the run's own
processes (``/proc/<pid>/stat``); the difference is what *other* work took, in cores.
A window in which that exceeds :data:`BUSY_OTHER_CORES` is flagged busy.

Two ways to measure a window:

* :class:`LoadWindow`: from its creation to each :meth:`~LoadWindow.reading`, the run's
  own processes being the benchmark's process tree (its children, Azurite and Spark
  included) and the services it started that daemonized (:data:`RUN_MARK`), each
  followed while it lives, so that one that ends unreaped by the run (Spark's executors
  and Python workers when an application stops) still counts as the run's own;
* :class:`CpuMeter`: samples a few times a second, so that a window can be chosen
  afterwards (from timestamps a worker reported), with the CPU of named processes in it.

Example::

    window = LoadWindow()
    ...  # measure
    reading = window.reading()
    print(reading.describe())   # 'other processes 0.05 cores on average (the benchmark's own 1.10) ...'
    if reading.busy:
        ...  # flag the figures (report.busy_flag)
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["BUSY_OTHER_CORES", "RUN_MARK", "CpuMeter", "LoadReading", "LoadWindow", "Window", "idle_cores",
           "load_average", "machine_cpu_seconds", "process_cpu_seconds"]

BUSY_OTHER_CORES = 0.25
"""Other processes' mean CPU (cores) above which a window is flagged as taken on a busy
machine. A quarter of a core is an eighth of this 2-core machine: enough to move a ratio
by several per cent on a run that keeps both cores busy itself."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (state first), or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of one process, all its threads, or None (no such
    process, no ``/proc``, or no pid)."""
    fields = None if pid is None else _stat(pid)
    try:
        return None if fields is None else (int(fields[11]) + int(fields[12])) / _TICK
    except (IndexError, ValueError):
        return None


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, total) CPU seconds of all cores since boot (``/proc/stat``), or None. Busy
    is all but idle and iowait; steal (time another guest took) counts as busy."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    total = sum(values)
    return (total - values[3] - values[4]) / _TICK, total / _TICK


def _process_table() -> dict[int, tuple[int, int, float]]:
    """pid -> (parent pid, start time in clock ticks since boot, CPU seconds of the process
    and of its reaped children)."""
    found: dict[int, tuple[int, int, float]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat(name)  # None: gone meanwhile
        try:
            if fields is not None:  # ppid at 1; utime, stime, cutime, cstime at 11..14; starttime at 19
                found[int(name)] = (int(fields[1]), int(fields[19]), sum(int(v) for v in fields[11:15]) / _TICK)
        except (IndexError, ValueError):
            continue
    return found


def _uptime_ticks() -> int:
    try:
        with open("/proc/uptime") as handle:
            return int(float(handle.read().split()[0]) * _TICK)
    except (OSError, ValueError, IndexError):
        return 0


RUN_MARK = "EVENTPROCESSOR_BENCHMARK_RUN"
"""Set in the environment of every process a benchmark starts (to the pid of the run's
first process): a service that daemonizes (``pg_ctl``'s postgres, Spark's master and
worker) leaves the benchmark's process tree but keeps its environment, so it still counts
as the run's own."""
os.environ.setdefault(RUN_MARK, str(os.getpid()))


def _marked(pid: int, mark: str) -> bool:
    """Whether process ``pid`` carries this run's :data:`RUN_MARK` in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as handle:
            return f"{RUN_MARK}={mark}".encode() in handle.read().split(b"\0")
    except OSError:
        return False


class _OwnCpu:
    """CPU seconds the run's own processes spent since this object was made, from a look at
    every process each ``interval`` seconds (a daemon thread; it ends with the object).

    Two snapshots of the live process tree miss every process that ended between them
    without one of the run's own reaping it: its CPU goes to init's reaped total. Spark's
    executors, their Python workers and the source's reader processes end with each
    application that way. So each own process is followed while it lives: its CPU since
    the window began (all of it when it was born later) counts up to the last look at it.
    When one the run's own reaped disappears, the reaper's reaped-children total takes its
    count over, so its last-seen total is subtracted once. Missed: what a process spent
    after the last look before it ended unreaped by the run (at most an interval of it),
    and processes born and gone between two looks that the run did not reap."""

    def __init__(self, root: int, mark: str | None, interval: float = 0.5) -> None:
        self._root, self._mark = root, mark
        self._born_after = _uptime_ticks()
        self._lock = threading.Lock()
        self._own: dict[tuple[int, int], list[float]] = {}  # (pid, start) -> [parent, base, last]
        self._foreign: set[tuple[int, int]] = set()
        self._ended = 0.0  # own processes gone: their CPU in the window, less what a reaper of ours took over
        self._first = True
        self.sample()
        self._first = False
        threading.Thread(target=_sample_while_alive, args=(weakref.ref(self), interval), daemon=True,
                         name="benchmark-load-window").start()

    def sample(self) -> None:
        with self._lock:
            try:
                table = _process_table()
            except OSError:
                return
            own_now = {pid for (pid, start) in self._own if table.get(pid, (0, -1))[1] == start}
            for pid, (parent, start, cpu) in sorted(table.items(), key=lambda item: item[1][1]):
                key = (pid, start)
                if key in self._own:
                    self._own[key][0], self._own[key][2] = parent, cpu
                    continue
                if key in self._foreign:
                    continue
                if pid == self._root or parent in own_now or (self._mark is not None and _marked(pid, self._mark)):
                    base = 0.0 if not self._first and start >= self._born_after else cpu
                    self._own[key] = [parent, base, cpu]
                    own_now.add(pid)
                else:
                    self._foreign.add(key)
            for key in [key for key in self._own if table.get(key[0], (0, -1))[1] != key[1]]:
                reaper, base, last = self._own.pop(key)
                self._ended += last - base - (last if int(reaper) in own_now else 0.0)
            self._foreign &= {(pid, start) for pid, (_parent, start, _cpu) in table.items()}

    def seconds(self) -> float:
        """CPU seconds of the run's own processes since this object was made, up to a look now."""
        self.sample()
        with self._lock:
            return max(0.0, self._ended + sum(last - base for _parent, base, last in self._own.values()))


def _sample_while_alive(tracker: weakref.ref[_OwnCpu], interval: float) -> None:
    while True:
        time.sleep(interval)
        found = tracker()
        if found is None:
            return
        found.sample()
        del found


async def idle_cores(seconds: float) -> float | None:
    """How many cores the machine left idle over the next ``seconds``, or None."""
    before = machine_cpu_seconds()
    await asyncio.sleep(seconds)
    after = machine_cpu_seconds()
    if before is None or after is None or after[1] <= before[1]:
        return None
    idle = (after[1] - after[0]) - (before[1] - before[0])
    return (os.cpu_count() or 1) * idle / (after[1] - before[1])


# --------------------------------------------------------------------------- a window from now on


@dataclass(frozen=True)
class _Snapshot:
    wall: float
    machine: float | None
    load: float | None

    @classmethod
    def take(cls) -> _Snapshot:
        machine = machine_cpu_seconds()
        return cls(time.monotonic(), None if machine is None else machine[0], load_average())


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
        """One clause: ``other processes 0.05 cores on average (the benchmark's own 1.10) over
        12 s; 1-minute load average 0.8/1.2 at start/end``."""
        other = "n/a" if self.other_cores is None else f"{self.other_cores:.2f}"
        own = "n/a" if self.own_cores is None else f"{self.own_cores:.2f}"
        load = "/".join("n/a" if v is None else f"{v:.1f}" for v in (self.load_start, self.load_end))
        return (f"other processes {other} cores on average (the benchmark's own {own}) over {self.seconds:.0f} s; "
                f"1-minute load average {load} at start/end")


class LoadWindow:
    """Measures the machine's load from its creation to each :meth:`reading`; the run's own
    processes are ``root`` (this process by default) and its descendants, and the
    processes that carry this run's :data:`RUN_MARK` (services that daemonized)."""

    def __init__(self, threshold: float = BUSY_OTHER_CORES, root: int | None = None) -> None:
        self.threshold = threshold
        self._root = os.getpid() if root is None else root
        self._mark = os.environ.get(RUN_MARK)
        self._start = _Snapshot.take()
        self._own = _OwnCpu(self._root, self._mark) if os.path.isdir("/proc") else None

    def reading(self) -> LoadReading:
        own_seconds = None if self._own is None else self._own.seconds()
        end = _Snapshot.take()
        start = self._start
        seconds = end.wall - start.wall
        other = own = None
        # CPU times tick at 10 ms: a window under a second says nothing about the machine.
        if seconds >= 1.0 and own_seconds is not None:
            own = own_seconds / seconds
            if start.machine is not None and end.machine is not None:
                other = max(0.0, (end.machine - start.machine) / seconds - own)
        return LoadReading(seconds, other, own, start.load, end.load, self.threshold)


# --------------------------------------------------------------------------- windows chosen afterwards


@dataclass
class _Sample:
    t: float
    machine: float | None
    processes: dict[str, float | None]
    load: float | None


@dataclass
class Window:
    """What the machine did between two sampled moments."""

    seconds: float
    own: dict[str, float] = field(default_factory=dict)  # CPU seconds of each tracked process
    others_cores: float | None = None  # cores used by everything else, on average
    load: float = 0.0  # the 1-minute load average at the end

    def cpu(self, name: str) -> float | None:
        return self.own.get(name)


class CpuMeter:
    """Samples the machine and the run's named processes every ``interval`` seconds.

    Example::

        meter = CpuMeter({"emulator": emulator_pid, "benchmark": os.getpid()})
        async with meter.sampling():
            meter.track("consumer", worker_pid)
            ...  # run the phase
        window = meter.window(started_at, ended_at)   # wall-clock times (time.time())
        print(window.others_cores, window.cpu("emulator"), window.load)
    """

    def __init__(self, processes: dict[str, int], interval: float = 0.25) -> None:
        self._pids = dict(processes)
        self._interval = interval
        self._samples: list[_Sample] = []

    def track(self, name: str, pid: int) -> None:
        """Count ``pid`` as one of the run's own processes from now on (a new consumer)."""
        self._pids[name] = pid

    def forget(self, name: str) -> None:
        self._pids.pop(name, None)

    def sample(self) -> None:
        machine = machine_cpu_seconds()
        self._samples.append(_Sample(time.time(), None if machine is None else machine[0],
                                     {name: process_cpu_seconds(pid) for name, pid in self._pids.items()},
                                     load_average()))
        del self._samples[:-20_000]

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[CpuMeter]:
        async def loop() -> None:
            while True:
                self.sample()
                await asyncio.sleep(self._interval)

        task = asyncio.create_task(loop())
        try:
            yield self
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self.sample()

    def window(self, start: float, end: float) -> Window:
        """The samples nearest ``start`` (at or before it) and ``end`` (at or after it)."""
        before = [s for s in self._samples if s.t <= start] or self._samples[:1]
        after = [s for s in self._samples if s.t >= end] or self._samples[-1:]
        if not before or not after:
            return Window(max(0.0, end - start))
        first, last = before[-1], after[0]
        seconds = max(1e-9, last.t - first.t)
        own: dict[str, float] = {}
        for name, value in last.processes.items():
            earlier = first.processes.get(name)
            if value is not None and earlier is not None:
                own[name] = value - earlier
        others = None
        if first.machine is not None and last.machine is not None:
            others = max(0.0, (last.machine - first.machine - sum(own.values())) / seconds)
        return Window(seconds, own, others, last.load or 0.0)
