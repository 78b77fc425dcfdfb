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


EXITED = r'''
import json, os, subprocess, sys, time
from benchmarks.toolkit.machine import RUN_MARK, LoadWindow

# A busy loop reports the CPU it used, then exits. Started in a new session by a middle
# process that exits at once, it is reaped by init, not by this run: the way Spark's
# executors, Python workers and the source's reader processes end with their application.
# Started as a plain child, this process reaps it and its CPU is in our own total once.
LOOP = ("import sys, time\nend = time.time() + float(sys.argv[1])\nwhile time.time() < end: pass\n"
        "print(time.process_time(), flush=True)")
DAEMONIZE = (
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', sys.argv[2], sys.argv[1]], start_new_session=True, "
    "stdout=open(sys.argv[3], 'w'), stderr=subprocess.DEVNULL); print(p.pid)"
)


def daemonized(env, out):
    window = LoadWindow()
    subprocess.run([sys.executable, "-c", DAEMONIZE, "2.5", LOOP, out], env=env, check=True, timeout=30,
                   capture_output=True)
    deadline = time.time() + 30
    while time.time() < deadline and not open(out).read().strip():
        time.sleep(0.1)
    time.sleep(1.0)  # gone, and reaped by init, before the reading
    reading = window.reading()
    return reading.own_cores * reading.seconds, float(open(out).read().strip())


def child(env):
    window = LoadWindow()
    done = subprocess.run([sys.executable, "-c", LOOP, "2.5"], env=env, check=True, timeout=30,
                          capture_output=True, text=True)
    reading = window.reading()
    return reading.own_cores * reading.seconds, float(done.stdout.strip())


unmarked = {k: v for k, v in os.environ.items() if k != RUN_MARK}
print(json.dumps({"marked": daemonized(dict(os.environ), sys.argv[1] + ".a"),
                  "unmarked": daemonized(unmarked, sys.argv[1] + ".b"),
                  "child": child(dict(os.environ))}))
'''


def test_a_marked_process_that_ended_before_the_reading_still_counts_as_its_own_and_a_child_once(tmp_path):
    run = subprocess.run([sys.executable, "-c", EXITED, str(tmp_path / "cpu")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    own, used = found["marked"]
    assert used > 0.2, found  # the loop did run
    # CPU used after the window's last look at the process may be missed: at most a sampling interval of it
    assert 0.6 * used <= own <= used + 0.5, found
    own, used = found["unmarked"]
    assert own <= 0.2 * used + 0.1, found
    own, used = found["child"]
    assert 0.8 * used <= own <= used + 0.5, found  # once, not again through our reaped children's total
