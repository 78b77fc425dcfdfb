"""The Event Hubs guide's example (docs/howto/eventhubs.md) runs as written, against the
local emulator and Azurite.

The block between ``<!-- BEGIN eventhubs-example -->`` and ``<!-- END eventhubs-example -->``
is extracted and run as a program, with the connection settings a reader would set
for this project's emulator. Its Microsoft Entra ID branch cannot reach the emulator
(the official client uses TLS whenever no connection string says otherwise), so that
branch is checked for what it builds, with a stand-in credential.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import docs_pages

ROOT = Path(__file__).resolve().parent.parent


def _example() -> str:
    return docs_pages.eventhubs_example()


@pytest.mark.eventhubs
@pytest.mark.azurite
async def test_the_docs_example_consumes_a_hub_on_the_local_emulator(eventhubs_emulator, azurite, tmp_path):
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    hub = eventhubs_emulator.fresh_hub(4)
    producer = EventHubProducerClient.from_connection_string(eventhubs_emulator.connection_string, eventhub_name=hub)
    async with producer:
        for pid in range(4):
            await producer.send_batch([EventData(f"reading {pid}-{i}") for i in range(5)], partition_id=str(pid))
    program = tmp_path / "eventhubs_example.py"
    program.write_text(_example())
    env = {key: value for key, value in os.environ.items() if not key.startswith(("EVENTHUB_", "STORAGE_"))}
    env.update(EVENTHUB_CONNECTION_STRING=eventhubs_emulator.connection_string, EVENTHUB_NAME=hub,
               STORAGE_CONNECTION_STRING=azurite.connection_string, RUN_SECONDS="14",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=90, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {tuple(line.split(" ", 2)) for line in out.stdout.splitlines() if line.strip()}
    assert lines == {(str(pid), str(i), f"reading {pid}-{i}") for pid in range(4) for i in range(5)}


def test_the_docs_entra_id_branch_builds_a_source_and_store_on_the_credential(monkeypatch):
    import azure.identity.aio

    class StandInCredential:
        """The example passes DefaultAzureCredential(); any async token credential fits."""

        async def get_token(self, *scopes, **kwargs):  # pragma: no cover - no network here
            raise AssertionError("no token is needed to build the clients")

        async def close(self):
            pass

    monkeypatch.setattr(azure.identity.aio, "DefaultAzureCredential", StandInCredential)
    for key in [k for k in os.environ if k.startswith("EVENTHUB_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("EVENTHUB_NAMESPACE", "contoso.servicebus.windows.net")
    monkeypatch.setenv("STORAGE_ACCOUNT_URL", "https://contoso.blob.core.windows.net")
    namespace: dict = {"__name__": "readme_example"}
    exec(compile(_example().replace("asyncio.run(main())", ""), "docs/howto/eventhubs.md", "exec"), namespace)
    source, store = namespace["connect"]()
    assert source.fully_qualified_namespace == "contoso.servicebus.windows.net"
    assert source.eventhub_name == "telemetry"
    assert isinstance(source.credential, StandInCredential)
    assert "contoso" in repr(store)
