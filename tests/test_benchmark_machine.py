"""The benchmarks' load window counts a service the run started that daemonized (left
the process tree, as ``pg_ctl``'s postgres or Spark's daemons do) as the run's own,
through the mark it inherited, and an unmarked process as other work."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks.toolkit.machine import RUN_MARK, LoadWindow

# The middle process starts a busy loop in a new session and exits at once: the loop is
# reparented away from this process's tree, as a daemon is.
DAEMONIZE = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import sys, time\\nend = time.time() + float(sys.argv[1])\\n"
    "while time.time() < end: pass', sys.argv[1]], start_new_session=True, "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
)


def _busy_daemon(seconds: float, env: dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", DAEMONIZE, str(seconds)],
                         env=env, capture_output=True, text=True, check=True, timeout=30)
    return int(out.stdout.strip())


def _own_cores_with(env: dict[str, str]) -> float:
    window = LoadWindow()
    pid = _busy_daemon(10.0, env)
    try:
        time.sleep(1.5)
        reading = window.reading()  # while the daemon lives: a reaped one's CPU is its new parent's
    finally:
        os.kill(pid, 9)
    assert reading.own_cores is not None
    return reading.own_cores


def test_a_daemonized_service_with_the_runs_mark_counts_as_its_own_and_one_without_as_other():
    assert os.environ.get(RUN_MARK)  # importing the toolkit marks this run
    marked = _own_cores_with(dict(os.environ))
    unmarked = _own_cores_with({k: v for k, v in os.environ.items() if k != RUN_MARK})
    # the busy loop takes most of a core when the machine has one for it; this process sleeps
    assert marked >= 0.3, marked
    assert unmarked <= 0.15, unmarked
