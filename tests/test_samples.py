"""Every sample runs as a user runs it: ``python samples/<name>.py`` from the repository
root, in a fresh process, bounded in time, and prints what it says it does.

Samples that need Azurite or an event hub get the session's Azurite and a fresh hub of
the session's Event Hubs emulator through the environment variables they document
(``STORAGE_CONNECTION_STRING``, ``EVENTHUB_CONNECTION_STRING``), so no extra service is
started; ``eventhub_consumer.py`` starts its own emulator in its process, as it does for
a user with no connection string.

``samples/spark_consumer.py`` is run elsewhere: it needs the session's Spark cluster, and
``tests/test_spark_cluster.py`` runs it both ways (``--master spark://`` and ``--remote
sc://``) and reads each table back (see ``RUN_ELSEWHERE``). A new sample fails
``test_every_sample_is_run_or_says_why_not`` until it is added here.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "samples"
TIMEOUT = 180  # seconds per sample, far above what each takes (2-25 s)

RUN = {"basic_consumer.py", "checkpoint_every_n.py", "callback_consumer.py", "eventhub_consumer.py",
       "multiprocess_azurite.py", "migrate_from_azure_eventhub.py"}
RUN_ELSEWHERE = {
    "spark_consumer.py": "tests/test_spark_cluster.py::test_the_sample_runs_unchanged_on_the_cluster_both_ways"}


def run_sample(name: str, *args: str, env: dict[str, str] | None = None) -> str:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("EVENTHUB_", "STORAGE_"))}
    environment["PYTHONPATH"] = os.pathsep.join([str(ROOT), environment.get("PYTHONPATH", "")])
    environment.update(env or {})
    try:
        out = subprocess.run([sys.executable, str(SAMPLES / name), *args], capture_output=True, text=True,
                             timeout=TIMEOUT, env=environment, cwd=ROOT)
    except subprocess.TimeoutExpired as expired:  # subprocess.run kills it
        pytest.fail(f"{name} did not finish within {TIMEOUT} s; output so far:\n{expired.stdout}\n{expired.stderr}")
    assert out.returncode == 0, f"{name} exited {out.returncode}\n{out.stdout}\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out.stdout


def test_every_sample_is_run_or_says_why_not():
    present = {path.name for path in SAMPLES.glob("*.py")}
    assert present == RUN | set(RUN_ELSEWHERE), \
        f"not run and not explained: {sorted(present - RUN - set(RUN_ELSEWHERE))}"
    for sample, test in RUN_ELSEWHERE.items():
        path, name = test.split("::")
        assert f"def {name}(" in (ROOT / path).read_text() and sample in (ROOT / path).read_text(), \
            f"{sample}: {test} does not exist or does not run it"


def test_subclass_sample_shares_partitions_between_three_processors():
    out = run_sample("basic_consumer.py")
    owns = re.findall(r"^(worker-\d) owns \[(.*)\]$", out, re.M)
    assert len(owns) == 3 and sorted(pid for _w, line in owns for pid in re.findall(r"'(\d+)'", line)) == \
        sorted(str(p) for p in range(8))
    assert re.search(r"total: 3000$", out, re.M), out


def test_checkpoint_every_n_sample_replays_fewer_than_n_after_a_crash_and_nothing_after_a_stop():
    out = run_sample("checkpoint_every_n.py", "--every", "10")
    assert "replayed after the graceful stop: 0" in out
    replayed = re.search(r"replayed after the crash: (\d+) \((.*) per partition, at most 9 each\)", out)
    assert replayed, out
    assert all(int(n) <= 9 for n in re.findall(r": (\d+)", replayed.group(2)))
    assert out.rstrip().endswith("ok")


@pytest.mark.eventhubs
def test_emulator_sample_starts_its_own_emulator_and_receives_every_event():
    out = run_sample("eventhub_consumer.py", "--events", "200", "--seconds", "5")
    assert "started an Event Hubs emulator" in out
    assert re.search(r"^received 200 events", out, re.M), out


@pytest.mark.eventhubs
@pytest.mark.azurite
def test_callback_sample_runs_the_drop_in_with_blob_checkpoints(eventhubs_emulator, azurite):
    hub = eventhubs_emulator.fresh_hub(4)
    out = run_sample("callback_consumer.py", "--eventhub", hub, "--events", "120",
                     env={"EVENTHUB_CONNECTION_STRING": eventhubs_emulator.connection_string,
                          "STORAGE_CONNECTION_STRING": azurite.connection_string})
    assert "checkpoints in Blob storage" in out
    assert sorted(re.findall(r"^partition (\d): receiving", out, re.M)) == ["0", "1", "2", "3"]
    assert sorted(re.findall(r"^partition (\d): closed \(SHUTDOWN\)", out, re.M)) == ["0", "1", "2", "3"]
    assert re.search(r"^received 120 of 120 events", out, re.M), out


@pytest.mark.eventhubs
@pytest.mark.azurite
def test_multiprocess_sample_shares_a_hub_between_processes_through_azurite(eventhubs_emulator, azurite):
    hub = eventhubs_emulator.fresh_hub(8)
    out = run_sample("multiprocess_azurite.py", "--eventhub", hub, "--events", "400",
                     env={"EVENTHUB_CONNECTION_STRING": eventhubs_emulator.connection_string,
                          "STORAGE_CONNECTION_STRING": azurite.connection_string})
    assert re.search(r"^balanced: worker-1=\d, worker-2=\d, worker-3=\d$", out, re.M), out
    assert "second half: every partition checkpointed at its last event (400 events sent)" in out
    assert re.search(r"^rebalanced: worker-2=\d, worker-3=\d$", out, re.M), out
    assert "total 400 for 400 events sent (0 delivered twice)" in out


@pytest.mark.eventhubs
@pytest.mark.azurite
def test_migration_sample_resumes_the_official_client_s_checkpoints(eventhubs_emulator, azurite):
    pytest.importorskip("azure.eventhub.extensions.checkpointstoreblobaio")
    hub = eventhubs_emulator.fresh_hub(4)
    out = run_sample("migrate_from_azure_eventhub.py", "--eventhub", hub,
                     env={"EVENTHUB_CONNECTION_STRING": eventhubs_emulator.connection_string,
                          "STORAGE_CONNECTION_STRING": azurite.connection_string})
    assert "azure-eventhub received 100 events (0: 0-24, 1: 0-24, 2: 0-24, 3: 0-24)" in out
    assert "eventprocessor received 60 events (0: 25-39, 1: 25-39, 2: 25-39, 3: 25-39)" in out
    assert "nothing missed, nothing received twice" in out
