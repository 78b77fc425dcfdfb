"""Retake ``docs/status-watch.svg``: ``eventprocessor status --watch`` on a live group.

Needs only Python packages (the ``[blob]`` extra, ``pyte``) and Azurite (``npm ci``): no
X server, no terminal program. Run from the checkout root (tox runs it before
``mkdocs build``)::

    python docs/status_screenshot.py [--out docs/status-watch.svg]

What it does: starts Azurite on free loopback ports and four worker processes
(``tests/status_worker.py``: an EventProcessor on the Blob store, 8 partitions, slow
handlers so that checkpoints move), waits until they share the partitions, SIGKILLs one
worker, and runs ``eventprocessor status --watch`` in a pseudo terminal of 132 x 38
characters. Everything the command writes to the terminal is fed to ``pyte``, a terminal
emulator, and once the killed worker's records have expired on the store's clock (and
before the survivors take them over) the emulated screen is rendered as SVG: the text,
with the terminal's colours and bold. Everything it started is stopped by PID on every
exit path; the whole run is bounded by ``--timeout`` (60 s).
"""
from __future__ import annotations

import argparse
import asyncio
import fcntl
import html
import os
import pty
import selectors
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NS, HUB, GROUP = "contoso.servicebus.windows.net", "orders", "$default"
CONTAINER = "checkpoints"
EXPIRY = 15.0
COLUMNS, LINES = 132, 38

# The terminal's colours (VS Code's dark theme, as the xterm of the earlier screenshots).
BACKGROUND, FOREGROUND = "#1e1e1e", "#d4d4d4"
PALETTE = {
    "black": "#000000", "red": "#cd3131", "green": "#0dbc79", "brown": "#e5e510", "yellow": "#e5e510",
    "blue": "#2472c8", "magenta": "#bc3fbc", "cyan": "#11a8cd", "white": "#e5e5e5",
    "brightblack": "#666666", "brightred": "#f14c4c", "brightgreen": "#23d18b", "brightbrown": "#f5f543",
    "brightyellow": "#f5f543", "brightblue": "#3b8eea", "brightmagenta": "#d670d6", "brightcyan": "#29b8db",
    "brightwhite": "#ffffff",
}
FONT_SIZE, CELL_WIDTH, CELL_HEIGHT, PAD = 13, 7.8, 17, 12


def _colour(name: str, default: str) -> str:
    if name == "default":
        return default
    if name in PALETTE:
        return PALETTE[name]
    if len(name) == 6 and all(c in "0123456789abcdefABCDEF" for c in name):  # 256 colours, truecolor
        return f"#{name.lower()}"
    return default


def screen_to_svg(screen: Any) -> str:
    """An SVG of a ``pyte.Screen``: one ``<text>`` per line, one ``<tspan>`` per run of
    cells with the same colours and weight, each run stretched to its cells' width so the
    columns line up whatever monospace font the viewer has."""
    used = [y for y in range(screen.lines) if screen.display[y].strip()]
    lines = (used[-1] + 1) if used else 1  # no empty rows at the bottom
    width = PAD * 2 + CELL_WIDTH * screen.columns
    height = PAD * 2 + CELL_HEIGHT * lines
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" role="img" aria-label="eventprocessor status --watch">',
           f'<rect width="100%" height="100%" rx="6" fill="{BACKGROUND}"/>',
           f'<g font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="{FONT_SIZE}" '
           f'xml:space="preserve">']
    for y in range(lines):
        row = screen.buffer[y]
        cells = [row[x] for x in range(screen.columns)]
        runs: list[tuple] = []
        for x, cell in enumerate(cells):
            fg, bg = _colour(cell.fg, FOREGROUND), _colour(cell.bg, BACKGROUND)
            if cell.reverse:
                fg, bg = bg, fg
            key = (fg, bg, cell.bold)
            if runs and runs[-1][0] == key:
                runs[-1][2].append(cell.data)
            else:
                runs.append((key, x, [cell.data]))
        baseline = PAD + CELL_HEIGHT * y + FONT_SIZE
        spans = []
        for (fg, bg, bold), x, chars in runs:
            if bg == BACKGROUND:  # trailing blanks draw nothing
                while chars and chars[-1] == " ":
                    chars = chars[:-1]
            text = "".join(chars)
            if bg != BACKGROUND:
                out.append(f'<rect x="{PAD + CELL_WIDTH * x:.1f}" y="{PAD + CELL_HEIGHT * y}" '
                           f'width="{CELL_WIDTH * len(chars):.1f}" height="{CELL_HEIGHT}" fill="{bg}"/>')
            if not text.strip():
                continue
            weight = ' font-weight="bold"' if bold else ""
            spans.append(f'<tspan x="{PAD + CELL_WIDTH * x:.1f}" textLength="{CELL_WIDTH * len(chars):.1f}" '
                         f'lengthAdjust="spacingAndGlyphs" fill="{fg}"{weight}>{html.escape(text)}</tspan>')
        if spans:
            out.append(f'<text y="{baseline}">{"".join(spans)}</text>')
    out.append("</g></svg>")
    return "\n".join(out) + "\n"


class Terminal:
    """A command in a pseudo terminal of ``COLUMNS`` x ``LINES``, its output fed to pyte."""

    def __init__(self, argv: list[str], env: dict[str, str], banner: str) -> None:
        import pyte

        self.screen = pyte.Screen(COLUMNS, LINES)
        self.stream = pyte.ByteStream(self.screen)
        self.stream.feed(banner.replace("\n", "\r\n").encode() + b"\r\n")
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", LINES, COLUMNS, 0, 0))
        self.master = master
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                                        start_new_session=True)
        os.close(slave)
        self.selector = selectors.DefaultSelector()
        self.selector.register(master, selectors.EVENT_READ)

    def pump(self, seconds: float) -> None:
        """Feed the screen whatever the command writes for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if self.selector.select(timeout=min(left, 0.1)):
                try:
                    data = os.read(self.master, 65536)
                except OSError:  # the command exited: the slave side is closed
                    return
                self.stream.feed(data)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # Ctrl-C, as a user stops --watch
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.selector.close()
        os.close(self.master)


def _wait_for(condition: Callable[[], bool], deadline: float, what: str,
              terminal: Terminal | None = None) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not happen in time")
        if terminal is not None:
            terminal.pump(0.3)
        else:
            time.sleep(0.3)


async def _status() -> Any:
    from eventprocessor.cli.status import read_status
    from eventprocessor.stores.blob import BlobCheckpointStore

    async with BlobCheckpointStore.from_connection_string(os.environ["EVENTPROCESSOR_STORE_CONNECTION_STRING"],
                                                          CONTAINER) as store:
        return await read_status(store, NS, HUB, GROUP, expiration=EXPIRY)


async def _expires_in(owner: str) -> float:
    """Seconds until ``owner``'s records expire on the store's clock: EXPIRY after its
    latest proof of life (its member record's heartbeat or a record it wrote)."""
    from eventprocessor.stores.blob import BlobCheckpointStore

    async with BlobCheckpointStore.from_connection_string(os.environ["EVENTPROCESSOR_STORE_CONNECTION_STRING"],
                                                          CONTAINER) as store:
        members = await store.list_members(NS, HUB, GROUP)
        ownership = await store.list_ownership(NS, HUB, GROUP)
    times = [m.last_modified_time for m in members.members if m.owner_id == owner]
    times += [r.last_modified_time for r in ownership.ownerships if r.owner_id == owner]
    latest = max(t for t in times if t is not None)
    return EXPIRY - (ownership.server_time - latest).total_seconds()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "status-watch.svg"))
    parser.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds (default 60)")
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    from eventprocessor.emulators.azurite import AzuriteUnavailable, start_azurite

    try:
        azurite = start_azurite()
    except AzuriteUnavailable as error:
        print(f"status_screenshot: {error}", file=sys.stderr)
        return 2
    started: list[subprocess.Popen] = []
    paused: list[subprocess.Popen] = []
    terminal: Terminal | None = None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "EVENTPROCESSOR_STORE_CONNECTION_STRING": azurite.connection_string,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    os.environ["EVENTPROCESSOR_STORE_CONNECTION_STRING"] = azurite.connection_string
    scratch = Path(tempfile.mkdtemp(prefix="status-shot-"))
    try:
        workers = {}
        for i in range(1, 5):
            process = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "status_worker.py"), "--container", CONTAINER,
                 "--owner-id", f"worker-{i}", "--namespace", NS, "--eventhub", HUB, "--partitions", "8",
                 "--events", "3000", "--batch", "20", "--delay", "0.25", "--interval", "2", "--expiry", str(EXPIRY)],
                stdout=subprocess.DEVNULL, stderr=(scratch / f"worker-{i}.log").open("wb"), cwd=ROOT, env=env)
            started.append(process)
            workers[f"worker-{i}"] = process

        def settled() -> bool:
            summary = asyncio.run(_status()).summary
            return summary.owned == 8 and summary.imbalance == 0 and summary.live_members == 4

        _wait_for(settled, deadline, "balance among the four workers")
        command = ["eventprocessor", "status", "--namespace", NS, "--eventhub", HUB, "--container", CONTAINER,
                   "--expiration", f"{EXPIRY:g}", "--watch", "--watch-interval", "0.5"]
        banner = "$ " + " ".join(command[:7]) + " \\\n      " + " ".join(command[7:])
        terminal = Terminal(command, {**env, "TERM": "xterm-256color", "COLORTERM": "truecolor"}, banner)
        terminal.pump(3)
        victim = workers["worker-2"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        # The survivors take worker-2's partitions within a tick of their expiry, often
        # before a poll of the store sees them expired: they are paused (SIGSTOP) from a
        # second before the expiry until the capture, a few seconds, well inside their own
        # leases (E = 15 s) and member records (gone after E/2).
        terminal.pump(max(0.0, asyncio.run(_expires_in("worker-2")) - 1.0))
        survivors = [p for name, p in workers.items() if name != "worker-2"]
        for process in survivors:
            process.send_signal(signal.SIGSTOP)
        paused.extend(survivors)
        _wait_for(lambda: asyncio.run(_status()).summary.expired > 0, deadline, "expiry of worker-2's records",
                  terminal)
        terminal.pump(1.2)  # two refreshes of the watch
        if terminal.process.poll() is not None:
            raise RuntimeError(f"eventprocessor status exited with {terminal.process.returncode}:\n"
                               + "\n".join(terminal.screen.display))
        shown = "\n".join(line.rstrip() for line in terminal.screen.display)
        if "expired" not in shown or "worker-2" not in shown:
            raise RuntimeError(f"the screen does not show worker-2's expired records:\n{shown}")
        Path(args.out).write_text(screen_to_svg(terminal.screen), encoding="utf-8")
        after = asyncio.run(_status())
        for process in paused:
            process.send_signal(signal.SIGCONT)
        paused.clear()
        print(f"wrote {args.out}; at capture the store showed: {after.summary.line()}")
    finally:
        for process in paused:
            process.send_signal(signal.SIGCONT)  # a stopped process would not hear SIGTERM
        if terminal is not None:
            terminal.close()
        for process in reversed(started):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=10)
        azurite.stop()
        for log in scratch.iterdir():
            log.unlink()
        scratch.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
