"""The command line's Event Hubs parts, as a user runs them: ``eventprocessor emulator``
and ``eventprocessor demo --source emulator``."""
from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventprocessor.cli import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("args", [["emulator"], ["bench", "e2e"]])
def test_the_new_commands_have_help(args):
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "usage" in result.output.lower()


def test_emulator_rejects_a_bad_config_naming_the_problem(tmp_path):
    bad = tmp_path / "Config.json"
    bad.write_text('{"UserConfig": {"NamespaceConfig": []}}')
    result = CliRunner().invoke(main, ["emulator", "--port", "0", "--config", str(bad)])
    assert result.exit_code != 0 and "exactly one namespace" in result.output


async def test_emulator_prints_a_connection_string_the_official_clients_use_unchanged():
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubConsumerClient, EventHubProducerClient

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "eventprocessor.cli", "emulator", "--port", "0", "--eventhub", "hub", "--partitions", "4",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL, env=env,
        cwd=ROOT)
    try:
        assert process.stdout is not None
        line = (await asyncio.wait_for(process.stdout.readline(), 30)).decode().strip()
        assert line.startswith("Endpoint=sb://127.0.0.1:") and line.endswith("UseDevelopmentEmulator=true")
        producer = EventHubProducerClient.from_connection_string(line, eventhub_name="hub")
        async with producer:
            assert await producer.get_partition_ids() == ["0", "1", "2", "3"]
            await producer.send_batch([EventData("from the CLI emulator")], partition_id="2")
        consumer = EventHubConsumerClient.from_connection_string(line, consumer_group="$default", eventhub_name="hub")
        got = asyncio.get_running_loop().create_future()

        async def on_event(_context, event):
            if not got.done():
                got.set_result(event.body_as_str())

        async with consumer:
            task = asyncio.create_task(consumer.receive(on_event, partition_id="2", starting_position="-1"))
            try:
                assert await asyncio.wait_for(got, 20) == "from the CLI emulator"
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 20)
    assert code == 0



def test_emulator_prints_a_connection_string_per_hub_with_its_entity_path():
    """``eventprocessor emulator`` printed only the namespace's string, without EntityPath,
    which the Spark source and ``eventprocessor status`` need."""
    from azure.eventhub import parse_connection_string

    from eventprocessor.emulators.eventhubs import connection_string

    process = subprocess.Popen(
        [sys.executable, "-m", "eventprocessor.cli", "emulator", "--port", "0", "--eventhub", "telemetry",
         "--eventhub", "orders"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        assert process.stdout is not None
        fd, out = process.stdout.fileno(), b""
        deadline = time.monotonic() + 30
        while out.count(b"\n") < 3 and select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            out += chunk
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    lines = out.decode().split()
    assert [parse_connection_string(line).eventhub_name for line in lines] == [None, "telemetry", "orders"], lines
    port = int(lines[0].split(";")[0].rsplit(":", 1)[1])
    hubs = [connection_string("127.0.0.1", port, eventhub_name=hub) for hub in ("telemetry", "orders")]
    assert lines == [connection_string("127.0.0.1", port), *hubs], lines
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "emulator", "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert "one per event hub, with its EntityPath" in " ".join(out.stdout.split()), out.stdout

def test_demo_over_the_emulator_loses_nothing():
    out = subprocess.run(
        [sys.executable, "-m", "eventprocessor.cli", "demo", "--source", "emulator", "--partitions", "4",
         "--processors", "3", "--interval", "0.3", "--expiration", "2", "--rate", "200", "--timeout", "60"],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Event Hubs emulator at 127.0.0.1:" in out.stdout
    assert "crashed" in out.stdout and "taken over" in out.stdout
    lost_line = next(line for line in out.stdout.splitlines() if "events lost" in line)
    assert lost_line.split()[-2] == "0"
    produced_line = next(line for line in out.stdout.splitlines() if "events produced" in line)
    assert int(produced_line.split()[-2]) > 0


# --------------------------------------------------------------------------- eventprocessor send


async def _received(conn: str, hub: str, want: int, timeout: float = 30) -> list[tuple[str, str | None, str]]:
    """(partition, partition key, body) of the first ``want`` events of every partition of
    ``hub``, in each partition's order, read with the official consumer."""
    from azure.eventhub.aio import EventHubConsumerClient

    got: list[tuple[str, str | None, str]] = []
    enough = asyncio.Event()

    async def on_event(context, event):
        key = event.partition_key.decode() if isinstance(event.partition_key, bytes) else event.partition_key
        got.append((context.partition_id, key, event.body_as_str()))
        if len(got) >= want:
            enough.set()

    consumer = EventHubConsumerClient.from_connection_string(conn, consumer_group="$default", eventhub_name=hub)
    async with consumer:
        task = asyncio.create_task(consumer.receive(on_event, starting_position="-1"))
        try:
            await asyncio.wait_for(enough.wait(), timeout)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return got


def _send(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "eventprocessor.cli", "send", *args], capture_output=True, text=True,
                          timeout=120, input=stdin, cwd=ROOT, env={**os.environ, **(env or {})})


async def test_send_sends_templated_events_keyed_to_one_partition_each(eventhubs_emulator):
    hub = eventhubs_emulator.fresh_hub(4)
    conn = eventhubs_emulator.connection_string
    out = _send("--eventhub", hub, "--count", "12", "--partition-key", "device-{i}", "--body", "reading {i}",
                env={"EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING": conn})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"sent 12 events to {hub} on 127.0.0.1:{eventhubs_emulator.port}"]
    assert out.stderr == ""
    got = await _received(conn, hub, 12)
    assert sorted(body for _, _, body in got) == sorted(f"reading {i}" for i in range(12))
    assert all(key == f"device-{body.split()[1]}" for _, key, body in got), got
    assert len({pid for pid, _, _ in got}) > 1, "twelve keys spread over the partitions"


async def test_send_sends_each_line_and_keys_it_by_its_json_fields(eventhubs_emulator):
    hub = eventhubs_emulator.fresh_hub(4)
    conn = eventhubs_emulator.process.connection_string_for(hub)  # the hub from EntityPath
    readings = [json.dumps({"device": device, "n": n}) for n in range(3) for device in ("boiler", "chiller")]
    out = _send("--eventhub-connection-string", conn, "--lines", "-", "--partition-key", "{device}", "--rate", "50",
                stdin="\n".join(readings) + "\n\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"sent 6 events to {hub} on 127.0.0.1:{eventhubs_emulator.port}"]
    got = await _received(conn, hub, 6)
    for device in ("boiler", "chiller"):
        mine = [(pid, body) for pid, key, body in got if key == device]
        assert len({pid for pid, _ in mine}) == 1, mine  # one partition per key
        assert [json.loads(body)["n"] for _, body in mine] == [0, 1, 2]  # in order


def test_send_plans_its_events_at_the_rate_and_fills_its_templates():
    import io

    from eventprocessor.cli.send import SendOptions, planned_events

    def at_noon():
        from datetime import datetime, timezone

        return datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)

    planned = list(planned_events(SendOptions(count=3, rate=4, body="{i} at {time}", partition_key="k{i}"), at_noon))
    assert [(e.body, e.partition_key, e.due) for e in planned] == [
        ("0 at 2026-01-31T12:00:00.000+00:00", "k0", 0.0), ("1 at 2026-01-31T12:00:00.000+00:00", "k1", 0.25),
        ("2 at 2026-01-31T12:00:00.000+00:00", "k2", 0.5)]
    lines = io.StringIO('{"device": "boiler"}\nplain text\n\n')
    planned = list(planned_events(SendOptions(lines=lines, partition_key="{i}-{line}"), at_noon))
    assert [(e.body, e.partition_key, e.due) for e in planned] == [
        ('{"device": "boiler"}', '0-{"device": "boiler"}', 0.0), ("plain text", "1-plain text", 0.0)]


@pytest.mark.parametrize("args, said", [
    (["--body", "reading {n}"], "--body 'reading {n}' names {n}, which an event does not have; the fields are {i}, "
                                "{time}"),
    (["--body", "{"], "--body '{' is not a template"),
    (["--partition-key", "k", "--partition-id", "0"], "--partition-key and --partition-id cannot go together"),
    (["--eventhub-connection-string", "nonsense"], "the Event Hubs connection string is malformed (value not shown)"),
    (["--eventhub-connection-string", "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=secret;"
      "UseDevelopmentEmulator=true"], "which event hub? pass --eventhub"),
    (["--eventhub-connection-string", "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=k;SharedAccessKey=secret;"
      "EntityPath=a;UseDevelopmentEmulator=true", "--eventhub", "b"], "EntityPath is 'a' and --eventhub is 'b'"),
])
def test_send_refuses_what_cannot_work_in_one_line_before_sending(args, said):
    out = _send(*args)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.splitlines()
    assert said in line and "secret" not in line, line


def test_send_to_a_hub_that_does_not_exist_is_one_line(eventhubs_emulator):
    out = _send("--eventhub", "no-such-hub", env={"EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING":
                                                  eventhubs_emulator.connection_string})
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith(f"Error: cannot send to no-such-hub on 127.0.0.1:{eventhubs_emulator.port}: "), line
    assert "SAS_KEY_VALUE" not in line
