"""How busy the machine is while a benchmark measures: the CPU used by the processes of
the run itself and by everything else, read from Linux's ``/proc``.

The load average counts the run's own processes (a consumer at 100 % of a core, the
emulator, Azurite), so on its own it cannot tell a quiet machine from a shared one. A
:class:`CpuMeter` samples the machine's busy CPU time (``/proc/stat``) and that of the
run's processes (``/proc/<pid>/stat``) a few times a second; the difference over a
timed window is the CPU that *other* work took from the machine meanwhile, in cores.
A window in which others used more than a threshold is flagged busy.

Example::

    meter = CpuMeter({"emulator": emulator_pid, "benchmark": os.getpid()})
    async with meter.sampling():
        meter.track("consumer", worker_pid)
        ...  # run the phase
    window = meter.window(started_at, ended_at)   # wall-clock times (time.time())
    print(window.others_cores, window.cpu("emulator"), window.load)
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

__all__ = ["CpuMeter", "Window", "process_cpu_seconds", "machine_busy_seconds"]

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process, all its threads (Linux), or None."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK
    except (OSError, IndexError, ValueError):
        return None


def machine_busy_seconds() -> float | None:
    """CPU seconds all cores spent busy since boot (everything but idle and iowait), or None."""
    try:
        with open("/proc/stat") as handle:
            values = [int(v) for v in handle.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    # user nice system idle iowait irq softirq steal [guest guest_nice: already in user]
    busy = values[0] + values[1] + values[2] + sum(values[5:8])
    return busy / _TICK


@dataclass
class _Sample:
    t: float
    machine: float | None
    processes: dict[str, float | None]
    load: float


@dataclass
class Window:
    """What the machine did between two moments."""

    seconds: float
    own: dict[str, float] = field(default_factory=dict)  # CPU seconds of each tracked process
    others_cores: float | None = None  # cores used by everything else, on average
    load: float = 0.0  # the 1-minute load average at the end

    def cpu(self, name: str) -> float | None:
        return self.own.get(name)


class CpuMeter:
    """Samples the machine and the run's processes every ``interval`` seconds."""

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
        self._samples.append(_Sample(time.time(), machine_busy_seconds(),
                                     {name: process_cpu_seconds(pid) for name, pid in self._pids.items()},
                                     os.getloadavg()[0]))
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
        return Window(seconds, own, others, last.load)
