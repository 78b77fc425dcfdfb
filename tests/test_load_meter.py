"""What a processor measures for the load-aware plan: the CPU it may use (its
cgroup's quota), its utilisation of it.

The cgroup trees here are directories laid out as the kernel lays out ``/sys/fs/cgroup``
(the files the meter reads, with the kernel's formats); the last test caps a real
process with a real cgroup where the machine allows it."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from eventprocessor._ownership.load_meter import CpuMeter, available_cores
from harness.cpu_quota import CpuQuotas, unavailable

AFFINITY = float(len(os.sched_getaffinity(0)))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _v1(root: Path, group: str, quota: int, period: int = 100_000) -> None:
    directory = root / "cpu" / group.strip("/")
    _write(directory / "cpu.cfs_quota_us", f"{quota}\n")
    _write(directory / "cpu.cfs_period_us", f"{period}\n")


def _membership(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proc-self-cgroup"
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def test_a_process_in_a_capped_v1_group_below_the_root_sees_its_groups_quota(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "/", -1)  # the root: no quota
    _v1(root, "/bench/p0", 25_000)
    membership = _membership(tmp_path, """
        4:memory:/
        2:cpuacct:/
        1:cpu:/bench/p0
        0::/
    """)
    assert available_cores(root, membership) == pytest.approx(min(AFFINITY, 0.25))


def test_a_quota_on_an_ancestor_limits_a_v2_group_below_it(tmp_path):
    root = tmp_path / "cgroup"
    _write(root / "cpu.max", "max 100000\n")
    _write(root / "system.slice" / "cpu.max", "50000 100000\n")  # the slice: half a core
    _write(root / "system.slice" / "app.service" / "cpu.max", "max 100000\n")
    membership = _membership(tmp_path, "0::/system.slice/app.service\n")
    assert available_cores(root, membership) == pytest.approx(min(AFFINITY, 0.5))


def test_a_container_sees_its_own_quota_at_the_mounts_root(tmp_path):
    # The path /proc shows is the host's; inside the container only the root exists.
    root = tmp_path / "cgroup"
    _write(root / "cpu.max", "150000 100000\n")
    membership = _membership(tmp_path, "0::/kubepods/burstable/pod1234/abcdef\n")
    assert available_cores(root, membership) == pytest.approx(min(AFFINITY, 1.5))


def test_without_any_quota_the_process_may_use_the_cores_it_is_allowed_to_run_on(tmp_path):
    root = tmp_path / "cgroup"
    _v1(root, "/", -1)
    _write(root / "cpu.max", "max 100000\n")
    membership = _membership(tmp_path, "1:cpu,cpuacct:/\n0::/\n")
    assert available_cores(root, membership) == AFFINITY
    assert available_cores(tmp_path / "nothing", tmp_path / "no-such-file") == AFFINITY


def test_the_cpu_meter_divides_cpu_time_by_wall_time_and_the_cores():
    cpu, wall = [0.0], [100.0]
    meter = CpuMeter(cpu_time=lambda: cpu[0], wall=lambda: wall[0], cores=0.25)
    cpu[0], wall[0] = 0.5, 104.0  # half a CPU second in 4 s: an eighth of a core, half the quota
    assert meter() == pytest.approx(0.5)
    assert meter() == 0.0  # no time passed


@pytest.mark.skipif(unavailable() is not None, reason=f"no CPU quota here: {unavailable()}")
def test_a_process_capped_at_a_quarter_core_measures_its_busy_loop_against_the_quota():
    """A real cgroup: the process reads its own quota and, spinning, is about 100 % busy
    (a 2-core machine without the quota would say 50 % or less)."""
    quotas = CpuQuotas(0.25)
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent("""
                import sys, time
                sys.stdin.readline()  # wait until the parent capped this process
                from eventprocessor._ownership.load_meter import CpuMeter, available_cores
                meter = CpuMeter()
                end = time.monotonic() + 1.5
                while time.monotonic() < end:
                    pass
                print(available_cores(), meter())
            """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent),
                                                              os.environ.get("PYTHONPATH", "")])})
        quotas.cap(child.pid, "spinner")
        out, _ = child.communicate("go\n", timeout=60)
        cores, utilization = map(float, out.split())
        assert cores == pytest.approx(0.25)
        assert 0.7 < utilization <= 1.15, utilization  # the kernel enforces the quota over 100 ms periods
        assert quotas.throttled("spinner") > 0.5
    finally:
        assert quotas.remove() == []
