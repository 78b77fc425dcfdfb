"""Start and stop the Azurite storage emulator on loopback.

Used by the test suite, ``eventprocessor azurite``, ``eventprocessor demo --store
blob`` (or ``table``), the samples and the benchmarks. Azurite is the npm package pinned in
``package.json``; ``npm ci`` (run by tox) puts it in ``node_modules/.bin/azurite``. It
is started with in-memory persistence (or in a directory) on free ports (or given
ones) bound to 127.0.0.1 only, with the flags this SDK needs (:data:`AZURITE_FLAGS`),
and stopped by PID.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_ports, port_open

__all__ = ["AZURITE_FLAGS", "Azurite", "AzuriteUnavailable", "find_azurite", "start_azurite", "DEV_ACCOUNT_NAME",
           "DEV_ACCOUNT_KEY"]

logger = logging.getLogger(__name__)

DEV_ACCOUNT_NAME = "devstoreaccount1"
# The emulator's fixed, publicly documented development key. Not a secret.
DEV_ACCOUNT_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
_HOST = "127.0.0.1"

AZURITE_FLAGS = ("--silent", "--skipApiVersionCheck", "--loose", "--disableTelemetry")
"""What every Azurite this project starts gets. ``--skipApiVersionCheck``: the current
azure-storage SDKs send an API version newer than Azurite knows, and without the flag
every call fails with ``HTTP 400 InvalidHeaderValue``. ``--loose``: Azurite ignores the
headers it does not support instead of failing the request."""


class AzuriteUnavailable(RuntimeError):
    """Azurite is not installed or did not start. The message says why."""


@dataclass
class Azurite:
    """A running Azurite: its ports and connection strings."""

    blob_port: int
    queue_port: int
    table_port: int
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def blob_endpoint(self) -> str:
        return f"http://{_HOST}:{self.blob_port}/{DEV_ACCOUNT_NAME}"

    @property
    def table_endpoint(self) -> str:
        return f"http://{_HOST}:{self.table_port}/{DEV_ACCOUNT_NAME}"

    @property
    def connection_string(self) -> str:
        """An explicit devstoreaccount1 connection string for blob, queue and table."""
        return (
            f"DefaultEndpointsProtocol=http;AccountName={DEV_ACCOUNT_NAME};AccountKey={DEV_ACCOUNT_KEY};"
            f"BlobEndpoint={self.blob_endpoint};"
            f"QueueEndpoint=http://{_HOST}:{self.queue_port}/{DEV_ACCOUNT_NAME};"
            f"TableEndpoint={self.table_endpoint};"
        )

    @property
    def account_key(self) -> str:
        return DEV_ACCOUNT_KEY

    @property
    def started_here(self) -> bool:
        return self.process is not None

    def stop(self) -> None:
        """Stop the emulator if this process started it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> Azurite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _candidates() -> list[Path]:
    roots = [Path.cwd(), *Path.cwd().parents, Path(__file__).resolve().parents[2]]
    return [root / "node_modules" / ".bin" / "azurite" for root in roots]


def find_azurite() -> Path | None:
    """The azurite executable: ``$AZURITE_BIN``, ``node_modules/.bin`` here or above, or PATH."""
    env = os.environ.get("AZURITE_BIN")
    if env:
        return Path(env)
    for candidate in _candidates():
        if candidate.exists():
            return candidate
    found = shutil.which("azurite")
    return Path(found) if found else None


def start_azurite(*, timeout: float = 30.0, executable: Path | None = None,
                  ports: tuple[int, int, int] | None = None, location: Path | None = None) -> Azurite:
    """Start Azurite on free loopback ports (or on ``ports``: blob, queue, table, to
    restart one where it was; 0 picks a free one) and wait until blob and table accept.
    Its data is kept in memory, or in the directory ``location``.

    Raises :class:`AzuriteUnavailable` with the reason (not installed, node missing,
    exited early with its output, or not listening in time).

    Example::

        with start_azurite() as azurite:
            store = BlobCheckpointStore.from_connection_string(azurite.connection_string, "checkpoints")
    """
    binary = executable or find_azurite()
    if binary is None or not Path(binary).exists():
        raise AzuriteUnavailable(
            "the azurite executable was not found (run `npm ci` in the repository root, "
            "or set AZURITE_BIN)"
        )
    if shutil.which("node") is None:
        raise AzuriteUnavailable("node is not on PATH; Azurite needs Node.js")
    last_error = ""
    for _attempt in range(3):
        free = iter(free_ports(3))
        blob, queue, table = [port or next(free) for port in (ports or (0, 0, 0))]
        persistence = ["--location", str(location)] if location is not None else ["--inMemoryPersistence"]
        args = [
            str(binary), *AZURITE_FLAGS, *persistence,
            "--blobHost", _HOST, "--queueHost", _HOST, "--tableHost", _HOST,
            "--blobPort", str(blob), "--queuePort", str(queue), "--tablePort", str(table),
        ]
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace") if process.stdout else ""
                last_error = f"azurite exited with code {process.returncode}: {output.strip()[-500:]}"
                break
            if port_open(blob) and port_open(table) and port_open(queue):
                logger.info("Azurite started (pid %s): blob %s, table %s", process.pid, blob, table)
                if process.stdout is not None:
                    process.stdout.close()
                return Azurite(blob, queue, table, process)
            time.sleep(0.1)
        else:
            process.kill()
            process.wait()
            last_error = f"azurite did not listen on 127.0.0.1:{blob}/{table} within {timeout:.0f}s"
    raise AzuriteUnavailable(last_error)
