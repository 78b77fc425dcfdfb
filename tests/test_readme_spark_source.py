"""The README's Spark Structured Streaming example runs as written: on the session's Spark
cluster over Spark Connect (``SPARK_REMOTE``), reading a hub of the local emulator that
the official producer filled with the readings the README describes, and it prints the
table the README shows."""
from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = [pytest.mark.spark, pytest.mark.eventhubs]


def _blocks() -> tuple:
    text = (ROOT / "docs" / "howto" / "spark-streaming.md").read_text()
    match = re.search(r"<!-- BEGIN spark-source-example -->\s*(?:<!--.*?-->\s*)?```python\n(.*?)```\s*"
                      r"<!-- END spark-source-example -->(.*?)```text\n(.*?)```", text, re.S)
    assert match, "docs/howto/spark-streaming.md has no spark-source-example block followed by its output"
    return match.group(1), match.group(3)


async def _send_readings(conn: str) -> None:
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    readings = [{"device": device, "temperature": base + minute + second / 100,
                 "time": f"2026-01-31T12:0{minute}:{second}Z"}
                for minute in range(3) for second in (10, 40) for device, base in (("boiler", 70.0), ("chiller", 6.0))]
    readings.append({"device": "boiler", "temperature": 80.0, "time": "2026-01-31T12:05:00Z"})  # moves the watermark
    producer = EventHubProducerClient.from_connection_string(conn)
    async with producer:
        for i, reading in enumerate(readings):
            await producer.send_batch([EventData(json.dumps(reading))], partition_id=str(i % 4))


def test_the_readme_example_runs_over_spark_connect_and_prints_what_the_readme_shows(spark_cluster,
                                                                                      eventhubs_emulator, tmp_path):
    code, claimed = _blocks()
    hub = eventhubs_emulator.fresh_hub(4)
    conn = eventhubs_emulator.process.connection_string_for(hub)
    asyncio.run(_send_readings(conn))
    program = tmp_path / "spark_source_example.py"
    program.write_text(code)
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_REMOTE", "MASTER")}
    env.update(EVENTHUB_CONNECTION_STRING=conn, SPARK_REMOTE=spark_cluster.connect_url, OUTPUT=str(tmp_path / "out"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])))
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=240, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    printed = [line for line in out.stdout.splitlines() if line.startswith(("+", "|"))]
    assert printed == [line for line in claimed.splitlines() if line.strip()], out.stdout
