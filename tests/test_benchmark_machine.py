"""The benchmarks' load window counts a service the run started that daemonized (left
the process tree, as ``pg_ctl``'s postgres or Spark's daemons do) as the run's own,
through the mark it inherited, and an unmarked process as other work. Run as a program,
as every benchmark's machinery is tested."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROGRAM = r'''
import json, os, subprocess, sys, time
from benchmarks.toolkit.machine import RUN_MARK, LoadWindow

# The middle process starts a busy loop in a new session and exits at once: the loop is
# reparented away from this process's tree, as a daemon is.
DAEMONIZE = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import sys, time\\nend = time.time() + float(sys.argv[1])\\n"
    "while time.time() < end: pass', sys.argv[1]], start_new_session=True, "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"
)


def own_cores_with(env):
    window = LoadWindow()
    out = subprocess.run([sys.executable, "-c", DAEMONIZE, "10"], env=env, capture_output=True, text=True,
                         check=True, timeout=30)
    pid = int(out.stdout.strip())
    try:
        time.sleep(1.5)
        reading = window.reading()  # while the daemon lives: a reaped one's CPU is its new parent's
    finally:
        os.kill(pid, 9)
    return reading.own_cores


print(json.dumps({"mark": os.environ.get(RUN_MARK),
                  "marked": own_cores_with(dict(os.environ)),
                  "unmarked": own_cores_with({k: v for k, v in os.environ.items() if k != RUN_MARK})}))
'''


def test_a_daemonized_service_with_the_runs_mark_counts_as_its_own_and_one_without_as_other():
    run = subprocess.run([sys.executable, "-c", PROGRAM], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["mark"]  # importing the toolkit marks the run
    # the busy loop takes most of a core when the machine has one for it; the program sleeps
    assert found["marked"] >= 0.3, found
    assert found["unmarked"] <= 0.15, found
