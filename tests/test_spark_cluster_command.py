"""``python -m eventprocessor.emulators.spark_cluster``, the command that starts a test
cluster by hand: a SIGTERM while it is still starting stops what it started (a
JVM left behind holds ports, memory and a CPU on a shared machine until someone finds it)."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.spark


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sigterm_while_the_cluster_starts_stops_the_pieces_already_started(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT), SPARK_LOCAL_IP="127.0.0.1", TMPDIR=str(tmp_path))
    command = subprocess.Popen([sys.executable, "-m", "eventprocessor.emulators.spark_cluster", "--no-connect",
                                "--worker-cores", "1", "--worker-memory", "512m"], cwd=str(ROOT), env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    master = None
    try:
        assert command.stdout is not None
        for line in command.stdout:
            found = re.search(r"Spark master starting \(pid (\d+)\)", line)
            if found:
                master = int(found.group(1))
                break
        assert master is not None, "the command never started a master"
        command.send_signal(signal.SIGTERM)
        command.wait(timeout=60)
        deadline = time.monotonic() + 30  # a bound, not a speed assertion: the JVM's own shutdown
        while _alive(master) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(master), "the master JVM outlived the command that started it"
    finally:
        command.kill()
        command.wait()
        if master is not None and _alive(master):
            os.killpg(master, signal.SIGKILL)
