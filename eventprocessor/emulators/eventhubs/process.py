"""Run the emulator in its own OS process, for test sessions, benchmarks and demos.

The child is ``python -m eventprocessor.emulators.eventhubs`` on a free loopback port; its first line
on stdout is the connection string (one per event hub follows). It is stopped by PID (SIGTERM, then SIGKILL).

Example::

    with start_emulator_process(["--eventhub", "telemetry", "--partitions", "4"]) as hub:
        print(hub.connection_string)
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

__all__ = ["EmulatorProcess", "EmulatorUnavailable", "start_emulator_process"]

logger = logging.getLogger(__name__)

_ROOT = Path(__file__).resolve().parents[3]  # the folder that holds the package


class EmulatorUnavailable(RuntimeError):
    """The emulator process did not start; the message says why (with its stderr)."""


@dataclass
class EmulatorProcess:
    """A running emulator process and its connection string."""

    connection_string: str
    process: subprocess.Popen = field(repr=False)
    stderr_path: Path | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def port(self) -> int:
        endpoint = self.connection_string.split(";", 1)[0]
        return int(endpoint.rsplit(":", 1)[1])

    def connection_string_for(self, eventhub_name: str) -> str:
        return self.connection_string.replace("UseDevelopmentEmulator=true",
                                              f"EntityPath={eventhub_name};UseDevelopmentEmulator=true")

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout``; returns the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()
        return self.process.returncode

    def __enter__(self) -> EmulatorProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_emulator_process(args: Sequence[str] = (), *, timeout: float = 30.0,
                           stderr: IO[bytes] | None = None, python: str | None = None) -> EmulatorProcess:
    """Start ``python -m eventprocessor.emulators.eventhubs --port 0 ARGS`` and wait for its connection string."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    command: list[str] = [python or sys.executable, "-m", "eventprocessor.emulators.eventhubs", "--host", "127.0.0.1",
                          "--port", "0", *args]
    # Its log goes to a file, never to a pipe nobody reads (a full pipe would block it).
    log = stderr if stderr is not None else tempfile.TemporaryFile()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env,
                               start_new_session=True)
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    line = b""
    try:
        while b"\n" not in line:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or process.poll() is not None:
                break
            if selector.select(timeout=min(remaining, 0.2)):
                chunk = os.read(process.stdout.fileno(), 4096)
                if not chunk:
                    break
                line += chunk
    finally:
        selector.close()
    text = line.split(b"\n", 1)[0].decode(errors="replace").strip()
    if not text.startswith("Endpoint=sb://"):
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        errors = ""
        if stderr is None:
            log.seek(0)
            errors = log.read().decode(errors="replace").strip()[-1500:]
            log.close()
        raise EmulatorUnavailable(
            f"the Event Hubs emulator did not start within {timeout:.0f}s (exit code {process.returncode}): "
            f"{errors or text or 'no output'}")
    if stderr is None:
        log.close()  # the child keeps its own descriptor of the (unlinked) file
    logger.info("Event Hubs emulator started (pid %d): %s", process.pid, text.split(";", 1)[0])
    return EmulatorProcess(text, process)
