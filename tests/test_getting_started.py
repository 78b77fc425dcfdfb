"""The docs' getting-started path, walked as a new user walks it, from a clean clone
in a fresh virtual environment.

One test, in the order a reader meets it (README.md, then the site's pages in the order
of mkdocs.yml's nav), every text read from the clone:

1. ``git clone`` of this checkout's HEAD into a scratch directory, ``python -m venv``;
2. the quick start exactly as written (``pip install -e . && eventprocessor demo``);
3. the Python examples of every page that need nothing more (run, and their claimed
   output checked), with ``pip install -e '.[otel]'`` as the Metrics section of
   docs/howto/operating.md says before its example;
4. ``eventprocessor demo --store blob`` before ``[blob]`` is installed: the one-line
   error names an install command, which is run exactly as printed;
5. ``npm ci`` and Azurite started as the ``azurite`` block of docs/getting-started.md says;
6. the local Event Hubs block of docs/howto/eventhubs.md line by line (``[eventhub,blob]``,
   the emulator, the variables, ``RUN_SECONDS=20 python eventhubs_example.py`` on the
   guide's program, after events were sent to the hub), and ``eventprocessor status``
   reading what it checkpointed; ``[table]`` and ``status --store table`` on the same
   Azurite;
7. Azurite and the emulator stopped as a user stops them (SIGINT, Ctrl-C).

It fails on any traceback, any WARNING, any process left running (every process it
starts carries an environment marker; none may outlive the walk), and any command
that does not do what the docs say it does.

Offline and fast: ``pip`` reads a wheelhouse (``PIP_NO_INDEX``/``PIP_FIND_LINKS``, so
the commands stay exactly as the docs write them) that ``pip download`` fills once
and keeps beside the test environment (``<sys.prefix>/getting-started-wheels``), keyed
by the requirements of setup.cfg. The ``[spark]`` extra is left out: pyspark installs
from a 456 MB source archive (about 45 s) and a session needs Java; the Spark sample
is walked by ``tests/test_spark_cluster.py``, and its missing-prerequisite path by
``tests/test_new_user_paths.py``. Needs ports 10000-10002 (Azurite's defaults, for
``UseDevelopmentStorage=true``) and 5672 (the emulator's) free; about two minutes.
"""
from __future__ import annotations

import asyncio
import configparser
import hashlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.test_new_user_paths import MARKER, assert_nothing_left
from tests.test_readme_examples import assert_claimed_output, examples

ROOT = Path(__file__).resolve().parent.parent
EXTRAS = ("blob", "table", "eventhub", "otel")  # [spark]: see the module docstring
WHEELHOUSE = Path(sys.prefix) / "getting-started-wheels"
NOISE = re.compile(r"Traceback|WARNING|\bERROR\b|Error:|Unclosed|Task exception")


def _requirements() -> list[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["options"]["install_requires"].splitlines()
    for extra in EXTRAS:
        lines += cfg["options.extras_require"][extra].splitlines()
    build = re.search(r"requires\s*=\s*\[(.*?)\]", (ROOT / "pyproject.toml").read_text(), re.S)
    assert build, "pyproject.toml names its build requirements"
    lines += re.findall(r'"([^"]+)"', build.group(1))
    return sorted({line.strip() for line in lines if line.strip()})


def _wheelhouse() -> Path:
    """Wheels of every requirement of the walk, downloaded once per set of requirements."""
    requirements = _requirements()
    stamp = hashlib.sha256("\n".join(requirements).encode()).hexdigest()[:16]
    done = WHEELHOUSE / f".complete-{stamp}"
    if not done.exists():
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        out = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(WHEELHOUSE),
                              *requirements], capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            unavailable(f"could not fill the wheelhouse with pip download: {out.stderr.strip()[-500:]}")
        done.write_text("\n".join(requirements))
    return WHEELHOUSE


class Walk:
    """A shell in the clone, with the fresh venv first on PATH and the marker set."""

    def __init__(self, clone: Path, venv: Path, marker: str, wheels: Path) -> None:
        self.clone = clone
        self.venv = venv
        self.marker = marker
        self.env: dict[str, str] = {
            key: value for key, value in os.environ.items()
            if not key.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_", "EVENTHUB_", "STORAGE_", "EVENTPROCESSOR_",
                                   "AZURITE_"))}
        self.env.update({
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}", "VIRTUAL_ENV": str(venv),
            "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheels), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            MARKER: marker,
        })
        self.background: list[subprocess.Popen] = []
        self.transcript: list[str] = []

    def run(self, command: str, *, timeout: float = 180, expect: int = 0, cwd: Path | None = None) -> str:
        """Run ``command`` in bash as typed; return stdout + stderr."""
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout, env=self.env,
                             cwd=cwd or self.clone)
        text = out.stdout + out.stderr
        self.transcript.append(f"$ {command}\n{text}")
        assert out.returncode == expect, f"$ {command}\nexited {out.returncode}, not {expect}:\n{text[-4000:]}"
        return text

    def quiet(self, command: str, **kwargs: object) -> str:
        text = self.run(command, **kwargs)  # type: ignore[arg-type]
        noise = [line for line in text.splitlines() if NOISE.search(line)]
        assert not noise, f"$ {command}\n" + "\n".join(noise)
        return text

    def start(self, command: str) -> subprocess.Popen:
        """``command &``: in the background, its first line of output returned when it
        has printed one."""
        process = subprocess.Popen(["bash", "-c", f"exec {command}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=self.env, cwd=self.clone)
        self.background.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.background:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)  # Ctrl-C
        for process in self.background:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


def _first_line(process: subprocess.Popen, timeout: float = 60) -> str:
    assert process.stdout is not None
    os.set_blocking(process.stdout.fileno(), True)
    deadline = time.monotonic() + timeout
    line = ""
    while not line and time.monotonic() < deadline:
        assert process.poll() is None, process.stderr.read() if process.stderr else ""
        line = process.stdout.readline().strip()
    return line


class ClonedDocs:
    """The docs as the clone has them: README.md and the site's pages in nav order."""

    def __init__(self, clone: Path) -> None:
        self.clone = clone
        self.readme = (clone / "README.md").read_text(encoding="utf-8")
        nav = (clone / "mkdocs.yml").read_text(encoding="utf-8")
        nav = nav[nav.index("\nnav:"):]
        names = re.findall(r":\s*([\w./-]+\.md)\s*$", nav[:re.search(r"\n\S", nav[1:]).start() + 1], re.M)
        self.pages = {"README.md": self.readme}
        self.pages.update({f"docs/{name}": (clone / "docs" / name).read_text(encoding="utf-8") for name in names})

    def page(self, name: str) -> str:
        return self.pages[name]

    def block(self, name: str) -> list[str]:
        """The lines of the block marked ``<!-- getting-started: name -->``, on whichever page."""
        pattern = rf"<!-- getting-started: {re.escape(name)} -->\s*(?:<!--.*?-->\s*)*```bash\n(.*?)```"
        found = [match for text in self.pages.values() if (match := re.search(pattern, text, re.S))]
        assert len(found) == 1, f"{len(found)} getting-started blocks {name!r} in the docs"
        return [line for line in found[0].group(1).splitlines() if line.strip()]

    def find(self, pattern: str, what: str) -> re.Match[str]:
        found = [match for text in self.pages.values() if (match := re.search(pattern, text, re.S))]
        assert found, f"the docs have no {what}"
        return found[0]


def _send_events(connection_string: str, count_per_partition: int) -> dict[str, int]:
    """What a producer would have sent: a few events to each partition of ``telemetry``."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    async def send() -> dict[str, int]:
        async with EventHubProducerClient.from_connection_string(connection_string, eventhub_name="telemetry") as p:
            ids = await p.get_partition_ids()
            for pid in ids:
                await p.send_batch([EventData(f"walk {pid}-{i}") for i in range(count_per_partition)], partition_id=pid)
            return {pid: count_per_partition for pid in ids}

    return asyncio.run(send())


@pytest.mark.slow
@pytest.mark.azurite
@pytest.mark.eventhubs
def test_the_getting_started_path_from_a_clean_clone(tmp_path):
    for tool in ("git", "bash", "npm", "node"):
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")
    import socket

    for port in (10000, 10001, 10002, 5672):
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                unavailable(f"127.0.0.1:{port} is in use; the README's Azurite and emulator use it")
    wheels = _wheelhouse()
    clone = tmp_path / "eventprocessor"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True, timeout=120)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    docs = ClonedDocs(clone)
    walk = Walk(clone, venv, uuid.uuid4().hex, wheels)
    try:
        _walk(walk, docs, tmp_path)
    finally:
        walk.stop_all()
    for process in walk.background:
        assert process.returncode == 0, f"{process.args} exited {process.returncode}"
    assert_nothing_left(walk.marker)


def _walk(walk: Walk, docs: ClonedDocs, tmp_path: Path) -> None:
    # 2. The quick start, as written.
    quick = re.search(r"## Quick start.*?```bash\n(.*?)```", docs.readme, re.S)
    assert quick and quick.group(1).strip() == "pip install -e . && eventprocessor demo", quick
    demo = walk.quiet(quick.group(1).strip(), timeout=240)
    lost = [line for line in demo.splitlines() if "events lost" in line]
    assert lost and lost[0].split()[-2] == "0", demo[-2000:]
    assert "[done] all" in demo

    # 3. The Python examples, in the reader's order, each extra as its section says.
    scratch = tmp_path / "examples"
    scratch.mkdir()
    ran = [(page, text, example) for page, text in docs.pages.items() for example in examples(text, page)
           if example.mode == "run"]
    assert ran and ran[0][0] == "README.md", "the README's first example is the first the walk runs"
    assert any("opentelemetry" in example.code for _, _, example in ran), "the walk runs the metrics example"
    for page, text, example in ran:
        if "opentelemetry" in example.code:
            install = re.search(r"Install `\[otel\]` \(`(pip install -e '\.\[otel\]')`", text)
            assert install, f"the Metrics section ({page}) says how to install [otel]"
            walk.quiet(install.group(1))
        script = scratch / f"{page.replace('/', '-')}-{example.name}.py"
        script.write_text(example.code, encoding="utf-8")
        output = walk.quiet(f"python {shlex.quote(str(script))}", cwd=scratch)
        if example.expected is not None:
            assert_claimed_output(example.expected, output)

    # 4. A command that needs [blob] says what to run; what it says works as printed.
    said = walk.run("eventprocessor demo --store blob", expect=1)
    hint = re.search(r"run `(pip install [^`]+)`", said)
    assert hint, said
    assert hint.group(1) == f"pip install -e {shlex.quote(str(walk.clone) + '[blob]')}", said
    walk.quiet(hint.group(1), cwd=tmp_path)  # from another directory: it must not depend on the cwd

    # 5. Azurite as Getting started starts it: npm ci in the checkout, then its block.
    assert "`npm ci`\nin the checkout installs the pinned version" in docs.page("docs/getting-started.md")
    walk.run("npm ci --no-audit --no-fund --loglevel=error", timeout=300)
    [azurite_line] = docs.block("azurite")
    assert azurite_line == "eventprocessor azurite &"
    azurite = walk.start(azurite_line[:-1].strip())
    storage = _first_line(azurite)
    assert storage.startswith("DefaultEndpointsProtocol=http;") and "127.0.0.1:10000" in storage, storage

    # 6. The Event Hubs example on this machine, line by line as the guide's block says.
    example = docs.find(r"<!-- BEGIN eventhubs-example -->\s*```python\n(.*?)```", "eventhubs-example block")
    (walk.clone / "eventhubs_example.py").write_text(example.group(1), encoding="utf-8")
    sent: dict[str, int] = {}
    for line in docs.block("eventhubs-local"):
        command = line.split("  #")[0].strip()
        if command == "eventprocessor azurite &":
            assert "unless it runs already" in line
            continue
        if command.endswith("&"):
            emulator = walk.start(command[:-1].strip())
            announced = _first_line(emulator)
            assert announced.startswith("Endpoint=sb://127.0.0.1:5672;"), announced
            continue
        if command.startswith("export "):
            for name, value in (word.split("=", 1) for word in shlex.split(command[len("export "):])):
                walk.env[name] = value
            continue
        if command.startswith("RUN_SECONDS="):
            assert walk.env["EVENTHUB_CONNECTION_STRING"] == announced, "the guide's string is the emulator's"
            assert walk.env["STORAGE_CONNECTION_STRING"] == "UseDevelopmentStorage=true"
            sent = _send_events(walk.env["EVENTHUB_CONNECTION_STRING"], 5)
            printed = walk.quiet(command, timeout=120)
            lines = {tuple(row.split(" ", 2)) for row in printed.splitlines() if row.strip()}
            assert lines == {(pid, str(i), f"walk {pid}-{i}") for pid, n in sent.items() for i in range(n)}, printed
            continue
        walk.quiet(command)
    assert sent, "the block ran the example"

    # `eventprocessor status` (docs/howto/operating.md) on what the example checkpointed.
    walk.env["EVENTPROCESSOR_STORE_CONNECTION_STRING"] = walk.env["STORAGE_CONNECTION_STRING"]
    walk.env["EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING"] = \
        f"{walk.env['EVENTHUB_CONNECTION_STRING']};EntityPath=telemetry"
    walk.env["COLUMNS"] = "200"  # as wide as a terminal: a narrow inherited COLUMNS would cut the columns
    status = walk.quiet("eventprocessor status --container checkpoints")
    assert re.search(rf"{len(sent)} partitions.*0 expired.*lag 0", status), status
    for pid, n in sent.items():
        assert re.search(rf"^\s+{pid}\s+-\s+released\s+\d+\s+\S+\s+{n - 1}\s", status, re.M), status
    # [table], as Getting started installs it, on the same Azurite.
    walk.quiet("pip install -e '.[table]'")
    table = walk.quiet("eventprocessor status --store table --table checkpoints")
    assert "no records of consumer group '$default'" in table, table
