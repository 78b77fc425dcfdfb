"""The command line's Event Hubs parts, as a user runs them: ``eventprocessor emulator``
and ``eventprocessor demo --source emulator``."""
from __future__ import annotations

import asyncio
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
