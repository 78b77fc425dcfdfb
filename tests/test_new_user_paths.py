"""The first hour of a new user: each path that failed a new user, as a test.
This module: the services (Azurite with and without its flags, stores that cannot work)
and nothing left running; ``tests/test_install_hints.py`` the installs and
``tests/test_new_user_commands.py`` the commands at their own settings.

A user follows the docs (README.md and docs/) from a fresh clone. Each test here walks
one of the paths that failed them, as they walked it (the command line in a subprocess,
the docs' own program text, a sample as ``python samples/...``), and checks what they should
have got: an error that keeps the service's own words and names the fix, a non-zero
exit when nothing can work, nothing left running, no warning at the program's own
settings, install hints that are commands that work, documentation that agrees with
the code. The whole path from a clean clone in a fresh virtual environment is
``tests/test_getting_started.py``.

"Nothing left running" is checked by a marker: every command runs with an
environment variable of its own, which every process it starts inherits (Azurite, the
emulator, workers), and after it exits no process in ``/proc`` may carry it.
"""
from __future__ import annotations

import base64
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests import docs_pages
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
MARKER = "EVENTPROCESSOR_TEST_MARKER"


# --------------------------------------------------------------------------- helpers


def processes_marked(marker: str) -> list[int]:
    """PIDs of the live processes whose environment carries ``MARKER=marker``."""
    needle = f"{MARKER}={marker}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def assert_nothing_left(marker: str, grace: float = 3.0) -> None:
    """No process started under ``marker`` outlives the command (``grace`` seconds for
    exits already under way)."""
    deadline = time.monotonic() + grace
    while processes_marked(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_marked(marker)
    details = []
    for pid in left:
        try:
            command = (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ")
            details.append(f"{pid}: {command[:200]!r}")
        except OSError:
            details.append(str(pid))
        try:
            os.kill(pid, signal.SIGKILL)  # started by this test: do not leave it for the next one
        except OSError:
            pass
    assert not left, "processes left running after the command ended:\n" + "\n".join(details)


def environment(marker: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVENTHUB_", "STORAGE_", "EVENTPROCESSOR_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if marker is not None:
        env[MARKER] = marker
    env.update(extra)
    return env


# Runs a program with some modules not installable (a meta-path finder installed before
# anything is imported): a user who installed some extras and not others.
WITHOUT = """
import runpy, sys
blocked = {blocked!r}
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in blocked):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
sys.argv = {argv!r}
if sys.argv[0] == "-m":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_without(blocked: Sequence[str], argv: Sequence[str], *, env: dict[str, str], timeout: float = 60,
                cwd: Path = ROOT) -> subprocess.CompletedProcess:
    code = WITHOUT.format(blocked=list(blocked), argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=cwd)


def assert_one_line_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _wait_for_ports(ports: Sequence[int], process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not all(_port_in_use(port) for port in ports):
        assert process.poll() is None, f"exited with {process.returncode}"
        assert time.monotonic() < deadline, f"ports {ports} not listening within {timeout} s"
        time.sleep(0.1)


def _needs_azurite_binary() -> Path:
    from eventprocessor.emulators.azurite import find_azurite

    binary = find_azurite()
    if binary is None or not binary.exists() or shutil.which("node") is None:
        unavailable("the azurite executable was not found (run `npm ci`)")
    assert binary is not None
    return binary


def _default_ports_free() -> None:
    busy = [port for port in (10000, 10001, 10002) if _port_in_use(port)]
    if busy:
        unavailable(f"127.0.0.1:{busy[0]} is in use: this test starts Azurite on its default ports, as the README "
                    "says")


def _readme_block(name: str) -> str:
    """The fenced block the docs mark ``<!-- getting-started: name -->``."""
    return "\n".join(docs_pages.getting_started_block(name)) + "\n"


def _eventhubs_example() -> str:
    return docs_pages.eventhubs_example()


# --------------------------------------------------------------------------- an Azurite without the flag


@dataclass
class StrictAzurite:
    """Azurite started as a user would without the README's flags: it checks API versions."""

    blob_port: int
    table_port: int
    process: subprocess.Popen

    @property
    def connection_string(self) -> str:
        from eventprocessor.emulators.azurite import Azurite

        return Azurite(self.blob_port, 0, self.table_port).connection_string


@pytest.fixture(scope="module")
def strict_azurite(tmp_path_factory) -> Iterator[StrictAzurite]:
    binary = _needs_azurite_binary()
    blob, queue, table = _free_port(), _free_port(), _free_port()
    process = subprocess.Popen(
        [str(binary), "--silent", "--inMemoryPersistence", "--disableTelemetry", "--blobHost", "127.0.0.1",
         "--queueHost", "127.0.0.1", "--tableHost", "127.0.0.1", "--blobPort", str(blob), "--queuePort", str(queue),
         "--tablePort", str(table)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, start_new_session=True,
        cwd=tmp_path_factory.mktemp("strict-azurite"))
    try:
        _wait_for_ports([blob, table], process)
        yield StrictAzurite(blob, table, process)
    finally:
        process.terminate()
        process.wait(timeout=10)


THE_FLAG = "--skipApiVersionCheck"
AZURITE_SAYS = "is not supported by Azurite"


@pytest.mark.azurite
async def test_a_store_on_azurite_without_the_flag_quotes_azurite_and_names_the_flag(strict_azurite):
    from eventprocessor.errors import CheckpointStoreError
    from eventprocessor.stores import BlobCheckpointStore

    async with BlobCheckpointStore.from_connection_string(strict_azurite.connection_string, "checkpoints") as store:
        for call in (store.check, lambda: store.list_ownership("ns", "hub", "$default")):
            with pytest.raises(CheckpointStoreError) as raised:
                await call()
            message = str(raised.value)
            assert AZURITE_SAYS in message and THE_FLAG in message and "likely cause" in message, message
            assert "Eby8vdM02xNOcqFlq" not in message


@pytest.mark.eventhubs
@pytest.mark.azurite
def test_the_readme_example_on_an_unusable_store_fails_at_once_and_says_why(eventhubs_emulator, strict_azurite,
                                                                             tmp_path):
    """It ran its full 20 s, delivered nothing and exited 0; Azurite's message was dropped."""
    program = tmp_path / "eventhubs_example.py"
    program.write_text(_eventhubs_example())
    env = environment(EVENTHUB_CONNECTION_STRING=eventhubs_emulator.connection_string,
                      EVENTHUB_NAME=eventhubs_emulator.fresh_hub(4), RUN_SECONDS="20",
                      STORAGE_CONNECTION_STRING=strict_azurite.connection_string)
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=90, env=env,
                         cwd=tmp_path)
    elapsed = time.monotonic() - started
    assert out.returncode != 0, out.stdout + out.stderr
    assert elapsed < 15, f"took {elapsed:.1f} s: it should fail at once, not after RUN_SECONDS"
    last = out.stderr.strip().splitlines()[-1]
    assert "CheckpointStoreError" in last and AZURITE_SAYS in last and THE_FLAG in last, out.stderr


@pytest.mark.azurite
def test_status_on_azurite_without_the_flag_says_the_flag(strict_azurite):
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "status", "--namespace", "ns", "--eventhub",
                          "hub", "--container", "checkpoints"], capture_output=True, text=True, timeout=60,
                         env=environment(EVENTPROCESSOR_STORE_CONNECTION_STRING=strict_azurite.connection_string))
    assert out.returncode == 1
    assert_one_line_error(out, AZURITE_SAYS, THE_FLAG)


@pytest.mark.azurite
async def test_demo_on_an_azurite_without_the_flag_says_the_flag(strict_azurite, monkeypatch):
    from eventprocessor.cli import demo
    from eventprocessor.cli.user_errors import CommandError

    monkeypatch.setattr(demo.store, "AZURITE_PORTS",
                        (strict_azurite.blob_port, _free_port(), strict_azurite.table_port))
    with pytest.raises(CommandError) as raised:
        await demo.run_demo(demo.DemoConfig(store="blob", partitions=2, processors=1))
    message = str(raised.value)
    assert AZURITE_SAYS in message and THE_FLAG in message and "does not answer" not in message, message


@pytest.mark.azurite
async def test_a_refused_key_and_a_missing_container_are_named_with_the_fix(azurite):
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    from eventprocessor.errors import CheckpointStoreError
    from eventprocessor.stores import BlobCheckpointStore, TableCheckpointStore

    wrong = base64.b64encode(b"w" * 64).decode()
    for store in (BlobCheckpointStore(azurite.blob_endpoint, "checkpoints", credential=wrong),
                  TableCheckpointStore(azurite.table_endpoint, "checkpoints", credential=wrong)):
        async with store:
            with pytest.raises(CheckpointStoreError) as raised:
                await store.check()
        message = str(raised.value)
        assert "Server failed to authenticate the request" in message, message  # the service's own words
        assert "account key or SAS token was refused" in message and wrong not in message, message

    # A SAS for one container cannot create it: the store cannot make its home, and says so.
    container = f"missing-{uuid.uuid4().hex[:10]}"
    sas = generate_container_sas("devstoreaccount1", container, account_key=azurite.account_key,
                                 permission=ContainerSasPermissions(read=True, write=True, list=True, delete=True),
                                 expiry=datetime.now(timezone.utc) + timedelta(hours=1))
    async with BlobCheckpointStore(azurite.blob_endpoint, container, credential=sas) as store:
        with pytest.raises(CheckpointStoreError) as raised:
            await store.check()
    message = str(raised.value)
    assert "does not exist" in message and "create the container" in message, message
    assert sas.split("sig=")[1].split("&")[0] not in message


def test_the_service_message_kept_in_store_errors_never_carries_a_credential():
    """The service's own words are kept, but a message that quotes a SAS signature, a
    key or a string-to-sign loses them."""
    azure_exceptions = pytest.importorskip("azure.core.exceptions")
    from eventprocessor.stores import describe_error

    key = base64.b64encode(b"k" * 64).decode()
    said = (f"Signature did not match. sig=abc%2Fdef&se=2030 used {key}; String to sign used was r\n2030\n/blob/x"
            "\nRequestId:1\nTime:now")
    error = azure_exceptions.HttpResponseError(message=said)
    text = describe_error(error)
    assert text.startswith('HttpResponseError: "Signature did not match.'), text
    assert "abc%2Fdef" not in text and key not in text and "/blob/x" not in text and "RequestId" not in text, text
    assert "sig=<removed>" in text and "String to sign <removed>" in text, text


@pytest.mark.azurite
def test_azurite_started_by_hand_as_the_readme_says_serves_the_stores(tmp_path):
    """The by-hand command of the docs (Getting started), run as written (default ports, so that
    ``UseDevelopmentStorage=true`` reaches it)."""
    _needs_azurite_binary()
    _default_ports_free()
    command = _readme_block("azurite-by-hand").strip()
    assert command.endswith("&") and THE_FLAG in command and "--loose" in command, command
    argv = shlex.split(command[:-1])
    assert argv[0] == "node_modules/.bin/azurite"
    argv[0] = str(ROOT / argv[0])  # the docs run it from the checkout root
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                               start_new_session=True)
    try:
        _wait_for_ports([10000, 10002], process)
        code = ("import asyncio\n"
                "from eventprocessor.stores import BlobCheckpointStore, TableCheckpointStore\n"
                "from eventprocessor.stores.records import Ownership\n"
                "async def main():\n"
                "    for cls, name in ((BlobCheckpointStore, 'byhand'), (TableCheckpointStore, 'byhand')):\n"
                "        async with cls.from_connection_string('UseDevelopmentStorage=true', name) as store:\n"
                "            await store.check()\n"
                "            [won] = await store.claim_ownership([Ownership('ns', 'hub', '$default', '0', 'me')])\n"
                "            print(type(store).__name__, 'claimed', won.partition_id)\n"
                "asyncio.run(main())\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env=environment(), cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split("\n")[:2] == ["BlobCheckpointStore claimed 0", "TableCheckpointStore claimed 0"]
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.mark.azurite
def test_eventprocessor_azurite_serves_the_default_ports_and_stops_on_sigterm(tmp_path):
    _needs_azurite_binary()
    _default_ports_free()
    marker = uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "-m", "eventprocessor.cli", "azurite"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=environment(marker), cwd=tmp_path)
    try:
        assert process.stdout is not None
        line = process.stdout.readline().strip()
        assert line.startswith("DefaultEndpointsProtocol=http;") and "BlobEndpoint=http://127.0.0.1:10000/" in line
        code = ("import asyncio, sys\nfrom eventprocessor.stores import BlobCheckpointStore\n"
                "async def main():\n"
                "    async with BlobCheckpointStore.from_connection_string('UseDevelopmentStorage=true', 'cli') as s:\n"
                "        await s.check()\n"
                "asyncio.run(main())\n")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             env=environment(), cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0, process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # it stops the Azurite it started; a SIGKILL would orphan it
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        assert_nothing_left(marker)
    assert not _port_in_use(10000)


# --------------------------------------------------------------------------- nothing left running


def test_demo_without_the_eventhub_extra_says_so_and_starts_nothing():
    """With ``[blob]`` but not ``[eventhub]``: it started Azurite, failed, printed an
    ``Unclosed client session`` error and left Azurite running."""
    if _port_in_use(10000):
        unavailable("something listens on 127.0.0.1:10000; the demo would use it instead of starting Azurite")
    marker = uuid.uuid4().hex
    out = run_without(["azure.eventhub"], ["-m", "eventprocessor.cli", "demo", "--store", "blob", "--source",
                                           "emulator"], env=environment(marker))
    assert_one_line_error(out, "[eventhub]", f"pip install -e {shlex.quote(f'{ROOT}[eventhub]')}")
    assert "Unclosed" not in out.stderr
    assert_nothing_left(marker)


@pytest.mark.azurite
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_demo_stopped_by_a_signal_stops_the_azurite_it_started(signum, code):
    _needs_azurite_binary()
    if _port_in_use(10000):
        unavailable("something listens on 127.0.0.1:10000; the demo would use it instead of starting Azurite")
    marker = uuid.uuid4().hex
    process = subprocess.Popen([sys.executable, "-m", "eventprocessor.cli", "demo", "--store", "blob"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment(marker),
                               cwd=ROOT)
    try:
        assert process.stdout is not None
        seen = []
        for line in process.stdout:
            seen.append(line)
            if line.startswith("[converging]"):
                break
        started = re.search(r"started one \(pid (\d+)\)", "".join(seen))
        assert started, "".join(seen)
        assert int(started.group(1)) in processes_marked(marker)
        process.send_signal(signum)
        assert process.wait(timeout=60) == code, process.stderr.read() if process.stderr else ""
    finally:
        if process.poll() is None:
            process.kill()
    assert_nothing_left(marker)


@pytest.mark.eventhubs
def test_the_migration_sample_checks_its_packages_before_starting_anything():
    """It started Azurite and an emulator, then died with a traceback after 4.7 s."""
    marker = uuid.uuid4().hex
    started = time.monotonic()
    out = run_without(["azure.eventhub.extensions"], [str(ROOT / "samples" / "migrate_from_azure_eventhub.py")],
                      env=environment(marker))
    assert time.monotonic() - started < 10
    assert_one_line_error(out, "azure-eventhub-checkpointstoreblob-aio", "pip install")
    assert out.returncode == 2
    assert "started" not in out.stdout
    assert_nothing_left(marker)
