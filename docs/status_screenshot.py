"""Retake ``docs/status-watch.png``: ``eventprocessor status --watch`` in a real terminal.

Needs Xvfb, xterm and xwd (Debian: ``apt-get install xvfb xterm x11-apps``), Pillow,
Azurite (``npm ci``) and the ``[blob]`` extra. Run from the checkout root::

    python docs/status_screenshot.py [--out docs/status-watch.png]

What it does: starts Azurite on free loopback ports and four worker processes
(``tests/status_worker.py``: EventProcessor on the Blob store, 8 partitions, slow
handlers so that checkpoints move), waits until they share the partitions, SIGKILLs one
worker, and runs ``eventprocessor status --watch`` in an xterm on a virtual display.
Once the killed worker's records have expired on the store's clock (and before the
survivors take them over), it captures the screen. Everything it started is stopped by
PID at the end.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NS, HUB, GROUP = "contoso.servicebus.windows.net", "orders", "$default"
CONTAINER = "checkpoints"
EXPIRY = 15.0
DISPLAY = ":57"
TITLE = "eventprocessor status"


def xwd_to_png(xwd: Path, png: Path) -> None:
    """Convert an X window dump (TrueColor, 24/32 bits per pixel, as Xvfb makes) to PNG."""
    import struct

    from PIL import Image

    data = xwd.read_bytes()
    header = struct.unpack(">25I", data[:100])
    header_size, width, height, byte_order = header[0], header[4], header[5], header[7]
    bits_per_pixel, bytes_per_line, colors = header[11], header[12], header[19]
    if bits_per_pixel != 32:
        raise ValueError(f"{xwd}: {bits_per_pixel} bits per pixel; only 32 is supported")
    start = header_size + 12 * colors
    mode = "BGRX" if byte_order == 0 else "XRGB"
    image = Image.frombuffer("RGB", (width, height), data[start:start + bytes_per_line * height], "raw", mode,
                             bytes_per_line, 1)
    image.save(png, optimize=True)


def _wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.2)


async def _status():
    from eventprocessor_cli.status import read_status
    from stores.blob import BlobCheckpointStore

    async with BlobCheckpointStore.from_connection_string(os.environ["EVENTPROCESSOR_STORE_CONNECTION_STRING"],
                                                          CONTAINER) as store:
        return await read_status(store, NS, HUB, GROUP, expiration=EXPIRY)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "status-watch.png"))
    args = parser.parse_args()
    for tool in ("Xvfb", "xterm", "xwd"):
        if shutil.which(tool) is None:
            print(f"{tool} is not installed (apt-get install xvfb xterm x11-apps)", file=sys.stderr)
            return 2
    from emulators.azurite import start_azurite

    started: List[subprocess.Popen] = []
    azurite = start_azurite()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EVENTPROCESSOR_STORE_CONNECTION_STRING": azurite.connection_string,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    os.environ["EVENTPROCESSOR_STORE_CONNECTION_STRING"] = azurite.connection_string
    scratch = Path(tempfile.mkdtemp(prefix="status-shot-"))
    try:
        started.append(subprocess.Popen(["Xvfb", DISPLAY, "-screen", "0", "1500x900x24", "-nolisten", "tcp"],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        workers = {}
        for i in range(1, 5):
            process = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "status_worker.py"), "--container", CONTAINER,
                 "--owner-id", f"worker-{i}", "--namespace", NS, "--eventhub", HUB, "--partitions", "8",
                 "--events", "3000", "--batch", "20", "--delay", "0.25", "--interval", "3", "--expiry", str(EXPIRY)],
                stdout=subprocess.DEVNULL, stderr=(scratch / f"worker-{i}.log").open("wb"), cwd=ROOT, env=env)
            started.append(process)
            workers[f"worker-{i}"] = process

        def settled() -> bool:
            status = asyncio.run(_status())
            return status.summary.owned == 8 and status.summary.imbalance == 0 and status.summary.live_members == 4

        _wait_for(settled, 60, "balance")
        command = (f"eventprocessor status --namespace {NS} --eventhub {HUB} --container {CONTAINER} "
                   f"--expiration {EXPIRY:g} --watch --interval 0.5")
        shown = command.replace(" --container", " \\\n      --container")
        script = f"clear; printf '%s\\n' {shlex.quote('$ ' + shown)}; exec {command}"
        started.append(subprocess.Popen(
            ["xterm", "-display", DISPLAY, "-geometry", "132x38+0+0", "-fa", "DejaVu Sans Mono", "-fs", "10",
             "-bg", "#1e1e1e", "-fg", "#d4d4d4", "-T", TITLE, "-e", "bash", "-c", script],
            env={**env, "DISPLAY": DISPLAY, "TERM": "xterm-256color", "COLORTERM": "truecolor"}))
        time.sleep(4)
        victim = workers["worker-2"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        _wait_for(lambda: asyncio.run(_status()).summary.expired > 0, EXPIRY + 10, "expiry of worker-2's records")
        time.sleep(1.2)  # two refreshes of the watch
        raw = scratch / "screen.xwd"
        subprocess.run(["xwd", "-display", DISPLAY, "-name", TITLE, "-silent", "-out", str(raw)], check=True)
        xwd_to_png(raw, Path(args.out))
        after = asyncio.run(_status())
        print(f"wrote {args.out}; at capture the store showed: {after.summary.line()}")
    finally:
        for process in reversed(started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        azurite.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
