"""CPU quotas for test and benchmark processes: each process in a cgroup of its own with
a CPU quota, as a small VM or a container with ``cpu.max`` would be.

A 2-core machine cannot run four processes that are each CPU-bound; four processes
capped at a quarter of a core each can be, and a processor that needs more than its
quota falls behind exactly as it would on a small machine. The cap is the kernel's (CFS
bandwidth control), so everything in the process is capped, its AMQP client included,
and the processor measures its utilisation against the quota the way it would in a
container (:func:`eventprocessor._ownership.load_meter.available_cores` reads the process's cgroup).

Needs a writable cgroup ``cpu`` controller: cgroup v1 (``/sys/fs/cgroup/cpu``) or v2
(``/sys/fs/cgroup`` with ``cpu`` among its controllers), usually as root.
:func:`unavailable` says why not, in a sentence.

Example::

    quotas = CpuQuotas(cores=0.25)
    try:
        worker = await spawn_worker(...)
        quotas.cap(worker.process.pid, "p0")     # p0 may use a quarter of a core from now on
        ...
    finally:
        quotas.remove()                          # once the processes ended
"""
from __future__ import annotations

import os
import uuid
from pathlib import Path

__all__ = ["CpuQuotas", "unavailable", "PERIOD_US"]

PERIOD_US = 100_000
"""The CFS period: a process capped at q cores runs q x 100 ms of every 100 ms."""

_ROOT = Path("/sys/fs/cgroup")


def _controller(root: Path = _ROOT) -> tuple[Path | None, str, str]:
    """(the cpu controller's mount, "v1" or "v2", why not if no mount)."""
    for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        if (root / name / "cpu.cfs_quota_us").exists():
            return root / name, "v1", ""
    for mount in (root, root / "unified"):
        try:
            if "cpu" in (mount / "cgroup.controllers").read_text().split():
                return mount, "v2", ""
        except OSError:
            continue
    return None, "", f"no cgroup cpu controller under {root}"


def unavailable(root: Path = _ROOT) -> str | None:
    """None when processes can be capped here, else why not (one sentence)."""
    mount, version, why = _controller(root)
    if mount is None:
        return why
    probe = mount / f"eventprocessor-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError as error:
        return (f"cannot create a cgroup under {mount} ({error.strerror}): capping processes at a CPU quota needs "
                "a writable cgroup cpu controller (root on a machine or VM, not an unprivileged container)")
    try:
        if version == "v2" and not (probe / "cpu.max").exists():
            return (f"the cgroup v2 cpu controller is not enabled for children of {mount}: "
                    f"echo +cpu > {mount}/cgroup.subtree_control")
        return None
    finally:
        probe.rmdir()


class CpuQuotas:
    """Cgroups capped at ``cores`` each (changeable per group), one per process.

    Every group lives under one parent made for this object; :meth:`remove` deletes them
    (after their processes ended: the kernel refuses to delete a group in use)."""

    def __init__(self, cores: float, *, root: Path = _ROOT) -> None:
        if cores <= 0:
            raise ValueError(f"cores must be > 0, not {cores!r}")
        mount, version, why = _controller(root)
        if mount is None:
            raise RuntimeError(why)
        self.cores = cores
        self._version = version
        self.parent = mount / f"eventprocessor-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.parent.mkdir()
        if version == "v2":  # the groups below the parent get the cpu controller too
            (self.parent / "cgroup.subtree_control").write_text("+cpu")
        self.groups: dict[str, Path] = {}

    def cap(self, pid: int, name: str, cores: float | None = None) -> Path:
        """Move process ``pid`` into the group ``name`` (made at the first call) capped at
        ``cores`` (default: the object's)."""
        group = self.groups.get(name)
        if group is None:
            group = self.parent / name
            group.mkdir()
            self.groups[name] = group
        self.set(name, cores if cores is not None else self.cores)
        (group / "cgroup.procs").write_text(str(pid))
        return group

    def set(self, name: str, cores: float) -> None:
        """Change the quota of group ``name``."""
        group = self.groups[name]
        quota = max(1000, int(cores * PERIOD_US))
        if self._version == "v1":
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        else:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")

    def throttled(self, name: str) -> float:
        """Seconds the group's processes were held back by the quota so far."""
        try:
            fields = dict(line.split() for line in (self.groups[name] / "cpu.stat").read_text().splitlines())
        except (OSError, ValueError):
            return 0.0
        if "throttled_usec" in fields:
            return int(fields["throttled_usec"]) / 1e6
        return int(fields.get("throttled_time", 0)) / 1e9

    def remove(self) -> list[str]:
        """Delete every group (and the parent); returns the groups still in use (kept)."""
        kept = []
        for name, group in list(self.groups.items()):
            try:
                group.rmdir()
                del self.groups[name]
            except OSError:
                kept.append(name)
        if not kept:
            try:
                self.parent.rmdir()
            except OSError:
                pass
        return kept
