"""The first hour of a new user, the commands at their own settings: quiet
output, a clean scrollback, numeric options with ranges, the pinned Azurite and Node.js,
and docs that agree with the code. (The other paths are ``tests/test_new_user_paths.py``
and ``tests/test_install_hints.py``.)"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import click
import pytest

from eventprocessor.cli import main
from tests import docs_pages
from tests.conftest import unavailable
from tests.test_new_user_paths import _eventhubs_example, _needs_azurite_binary, assert_nothing_left, environment

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = docs_pages.everything()  # README.md, every page of docs/, CHANGELOG.md


# --------------------------------------------------------------------------- quiet at its own defaults


def test_the_demo_over_the_emulator_through_a_pipe_warns_about_nothing():
    """3-4 WARNING paragraphs per run about its own ticks, at its own defaults."""
    marker = uuid.uuid4().hex
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "demo", "--source", "emulator"],
                         capture_output=True, text=True, timeout=240, env=environment(marker), cwd=ROOT)
    assert_nothing_left(marker)  # the emulator process it started
    assert out.returncode == 0, out.stdout + out.stderr
    noise = [line for line in (out.stdout + out.stderr).splitlines()
             if re.search(r"WARNING|ERROR|Traceback|Task exception", line)]
    assert not noise, "\n".join(noise)
    lost = next(line for line in out.stdout.splitlines() if "events lost" in line)
    assert lost.split()[-2] == "0"


@pytest.mark.azurite
def test_the_demo_prints_the_status_command_that_watches_it_and_warns_about_nothing(tmp_path):
    """It printed ``blob demo-33acdda7f723 @ 127.0.0.1:10000``, but not the namespace
    or the hub; ``--namespace demo.local`` found nothing."""
    _needs_azurite_binary()
    marker = uuid.uuid4().hex
    demo = subprocess.Popen([sys.executable, "-m", "eventprocessor.cli", "demo", "--store", "blob"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(marker),
                            cwd=ROOT)
    try:
        assert demo.stdout is not None
        command = None
        for line in demo.stdout:
            if line.startswith("Watch it from another terminal: "):
                command = line.split(": ", 1)[1].strip()
                break
        assert command is not None and " eventprocessor status " in command and command.endswith("--watch"), command
        deadline = time.monotonic() + 60
        shown = ""
        while time.monotonic() < deadline:
            # Run exactly as printed (the shell sets the variable), for two refreshes.
            path = f"{Path(sys.executable).parent}:{os.environ['PATH']}"
            out = subprocess.run(["bash", "-c", f"{command} --watch-count 2 --watch-interval 1"], capture_output=True,
                                 text=True, timeout=60, env=environment(PATH=path), cwd=tmp_path)
            assert out.returncode == 0, out.stderr
            shown = out.stdout
            if re.search(r"16 partitions \(seen in the store\): 16 owned", shown):
                break
        assert "consumer group $default of memory.local/demo-hub" in shown, shown
        assert re.search(r"16 partitions \(seen in the store\): 16 owned", shown), shown
        assert re.search(r"^\s+\d+\s+processor-\d\s+owned", shown, re.M), shown
        rest, errors = demo.communicate(timeout=180)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, rest + errors
    noise = [line for line in (rest + errors).splitlines() if re.search(r"WARNING|ERROR|Traceback", line)]
    assert not noise, "\n".join(noise)
    assert_nothing_left(marker)


def _run_in_terminal(args: Sequence[str], columns: int = 120, rows: int = 30, timeout: float = 120) -> list[str]:
    """Run the CLI in a pseudo-terminal and return what the terminal shows, scrollback
    first, as a terminal emulator (pyte) renders it."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    import pyte

    pid, fd = pty.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
            os.chdir(ROOT)
            env = environment(TERM="xterm-256color", COLUMNS=str(columns), LINES=str(rows))
            os.execve(sys.executable, [sys.executable, "-m", "eventprocessor.cli", *args], env)
        finally:
            os._exit(127)
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        data += chunk
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, data.decode(errors="replace")[-3000:]
    screen = pyte.HistoryScreen(columns, rows, history=100_000)
    screen.set_mode(pyte.modes.LNM)
    pyte.ByteStream(screen).feed(data)
    history = ["".join(line[x].data for x in range(columns)).rstrip() for line in screen.history.top]
    return history + [line.rstrip() for line in screen.display]


def test_the_live_table_leaves_a_clean_scrollback():
    """Log lines written while the live table was shown broke its redraw and left pieces
    of the table in the scrollback. ``-v`` logs a line per ownership change."""
    pytest.importorskip("pyte")
    shown = _run_in_terminal(["-v", "demo", "--partitions", "4", "--processors", "3", "--interval", "0.2",
                              "--expiration", "1.5", "--timeout", "60"])
    headers = [i for i, line in enumerate(shown) if re.match(r"┃ processor\s+┃ state", line)]
    assert len(headers) == 1, "\n".join(shown)  # the final table, once
    assert sum("eventprocessor demo —" in line for line in shown) == 1, "\n".join(shown)
    for phase in ("[starting]", "[converging]", "[scale-in]", "[failover]", "[draining]", "[done]"):
        assert any(phase in line for line in shown), phase
    assert any("partition 0 claimed" in line for line in shown), "the -v log lines are shown"


# --------------------------------------------------------------------------- npm ci, numeric options, the benchmark


def _excluding(ranges: dict[str, str], version: str) -> dict[str, str]:
    """The entries of ``ranges`` (name: semver range) that ``version`` does not satisfy,
    judged by npm's own semver package (node_modules/semver)."""
    code = ("const s=require('semver');const r=JSON.parse(process.argv[1]);"
            "process.stdout.write(JSON.stringify(Object.keys(r).filter(k=>!s.satisfies(process.argv[2],r[k]))))")
    out = subprocess.run(["node", "-e", code, json.dumps(ranges), version], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return {name: ranges[name] for name in json.loads(out.stdout)}


def test_the_pinned_azurite_accepts_the_node_the_readme_names(tmp_path):
    """With Node 20, as the README asks, ``npm ci`` printed ``EBADENGINE``: the pinned
    Azurite (and one of its packages) declared Node >= 22."""
    if shutil.which("npm") is None or not (ROOT / "node_modules" / "semver").is_dir():
        unavailable("npm, or node_modules (`npm ci`), is missing")
    named = re.search(r"Node\.js (\d+)\.(\d+) or newer", README)
    assert named, "the README names the Node.js it needs"
    assert set(re.findall(r"Node\.js (\d+\.\d+) or newer", DOCS)) == {f"{named.group(1)}.{named.group(2)}"}, \
        "every page names the same Node.js"
    minimum = f"{named.group(1)}.{named.group(2)}.0"
    from eventprocessor.cli.user_errors import NODE_VERSION

    assert NODE_VERSION == f"{named.group(1)}.{named.group(2)} or newer"
    pinned = json.loads((ROOT / "package.json").read_text())["devDependencies"]["azurite"]
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/azurite"]["version"] == pinned
    from eventprocessor.cli.user_errors import PINNED_AZURITE

    assert PINNED_AZURITE == pinned and f"pins `azurite` {pinned}" in DOCS
    refused = _excluding({name: entry["engines"]["node"] for name, entry in lock["packages"].items()
                          if isinstance(entry.get("engines"), dict) and "node" in entry["engines"]}, minimum)
    assert not refused, f"packages whose engines range excludes Node {minimum}: {refused}"
    # And npm itself, with the Node of this machine, says nothing about engines.
    for name in ("package.json", "package-lock.json"):
        shutil.copy(ROOT / name, tmp_path / name)
    out = subprocess.run(["npm", "ci", "--dry-run", "--no-audit", "--no-fund"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "EBADENGINE" not in out.stdout + out.stderr, out.stderr


def _every_option() -> list[tuple]:
    found = []

    def walk(command: click.Command, path: list[str]) -> None:
        for param in command.params:
            if isinstance(param, click.Option):
                found.append((" ".join(path), param))
        if isinstance(command, click.Group):
            for name in command.list_commands(click.Context(command)):
                sub = command.get_command(click.Context(command), name)
                if sub is not None:
                    walk(sub, path + [name])

    walk(main, ["eventprocessor"])
    return found


def test_every_numeric_option_has_a_range():
    numeric = [(path, option) for path, option in _every_option()
               if isinstance(option.type, (click.types.IntParamType, click.types.FloatParamType))]
    assert numeric, "the CLI has numeric options"
    unbounded = [f"{path} {option.opts[0]}" for path, option in numeric
                 if not isinstance(option.type, (click.IntRange, click.FloatRange))]
    assert not unbounded, f"numeric options without a range: {unbounded}"


def test_demo_refuses_a_negative_timeout():
    """``demo --timeout -5`` was accepted and ended "balance did not happen within -5s"."""
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "demo", "--timeout", "-5"],
                         capture_output=True, text=True, timeout=60, env=environment(), cwd=ROOT)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "--timeout" in out.stderr and "Traceback" not in out.stderr
    assert "did not happen" not in out.stdout + out.stderr


def test_the_quick_convergence_run_meets_its_targets_or_says_why():
    """It ended "3 target(s) missed" beside the README's "all 59 targets met"."""
    from eventprocessor.cli.user_errors import missing_modules

    if missing_modules(["azure.eventhub"]):
        unavailable("azure-eventhub is not installed (pip install -e '.[all]')")
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "bench", "convergence", "--quick"],
                         capture_output=True, text=True, timeout=600, env=environment(), cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    missed = re.search(r"(\d+) target\(s\) missed", out.stderr)
    assert not missed or "--quick run" in out.stderr, out.stderr[-2000:]
    assert "| **no** |" not in out.stdout, [line for line in out.stdout.splitlines() if "**no**" in line]


# --------------------------------------------------------------------------- the docs agree with the code


def test_the_docs_document_the_status_expiration_the_cli_uses():
    status = main.get_command(click.Context(main), "status")
    assert status is not None
    default = next(p.default for p in status.params if p.name == "expiration")
    documented = re.search(r"`--expiration` must be the processors' `partition_ownership_expiration_interval`\s+"
                           r"\(default (\d+) s", DOCS)
    assert documented and float(documented.group(1)) == default, (documented and documented.group(0), default)
    import inspect

    from eventprocessor import EventProcessor

    assert inspect.signature(EventProcessor.__init__).parameters[
        "partition_ownership_expiration_interval"].default == default


def test_the_docs_blob_layout_names_the_member_prefix_the_store_writes():
    pytest.importorskip("azure.storage.blob")
    from eventprocessor.stores.backend import MEMBER
    from eventprocessor.stores.blob import BlobRecords

    prefix = BlobRecords.prefix(MEMBER, ("{namespace}", "{eventhub}", "{consumer_group}"))
    layout = re.search(r"## Blob layout\n.*?```text\n(.*?)```", docs_pages.text(docs_pages.DOCS / "howto" /
                                                                             "checkpoint-stores.md"), re.S)
    assert layout, "the checkpoint stores guide shows the blob layout"
    members = [line for line in layout.group(1).splitlines() if "member" in line]
    assert members and all(line.startswith(prefix) for line in members), (prefix, members)


def test_the_emulator_serves_the_hub_the_docs_example_reads():
    from eventprocessor.emulators.eventhubs import EventHubsEmulator

    hub = re.search(r'HUB = os\.environ\.get\("EVENTHUB_NAME", "([\w-]+)"\)', _eventhubs_example())
    assert hub
    served = [h.name for h in EventHubsEmulator().config.eventhubs]
    assert served == [hub.group(1)], (served, hub.group(1))
    assert f"serves the hub `{hub.group(1)}`" in DOCS or f"the hub {hub.group(1)}" in DOCS
