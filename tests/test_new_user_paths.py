"""The first hour of a new user: each path that failed a new user, as a test.

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
import configparser
import json
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

import click
import pytest

from eventprocessor.cli import main
from tests import docs_pages
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = docs_pages.everything()  # README.md, every page of docs/, CHANGELOG.md
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

    monkeypatch.setattr(demo, "AZURITE_PORTS", (strict_azurite.blob_port, _free_port(), strict_azurite.table_port))
    with pytest.raises(CommandError) as raised:
        await demo.run_demo(demo.DemoConfig(store="azurite", partitions=2, processors=1))
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
    out = run_without(["azure.eventhub"], ["-m", "eventprocessor.cli", "demo", "--store", "azurite", "--source",
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
    process = subprocess.Popen([sys.executable, "-m", "eventprocessor.cli", "demo", "--store", "azurite"],
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


# --------------------------------------------------------------------------- install hints


def _install_hints() -> list[str]:
    """Every ``pip install ...`` a user is told, in the README and every page of the
    docs, the samples and the program sources, as written (up to the end of its code
    span or line)."""
    texts = [docs_pages.text(page) for page in docs_pages.pages()]
    folders = ("eventprocessor", "harness", "samples", "docs", "benchmarks")
    texts += [path.read_text(encoding="utf-8") for folder in folders
              for path in sorted((ROOT / folder).rglob("*.py"))]
    hints = []
    for text in texts:
        for match in re.finditer(r"pip install[^`\n\"]*", text):
            hints.append(match.group(0).strip())
    return hints


def test_every_install_hint_quotes_its_brackets_and_names_no_package_the_index_lacks():
    """``pip install eventprocessor[eventhub]`` named a package PyPI does not have, and
    an unquoted ``.[blob]`` is a glob in zsh (``no matches found``)."""
    hints = _install_hints()
    assert len(hints) > 10, hints
    for hint in hints:
        words = shlex.split(hint.replace("{", "").replace("}", ""), posix=True)
        raw = hint.split()
        for word, written in zip(words, raw, strict=False):
            if "[" in word:
                assert written.startswith(("'", '"')), f"unquoted brackets (a glob in zsh): {hint!r}"
        assert not re.search(r"(?<![\w/.-])eventprocessor\[", hint.replace("'", "")) or "@" in hint, \
            f"names the package eventprocessor, which is not on PyPI: {hint!r}"


def test_the_install_hint_from_a_checkout_works_from_any_directory(tmp_path):
    from eventprocessor.extras import install_command

    hint = install_command(["blob", "eventhub"], ["azure-identity"])
    assert hint == f"pip install -e {shlex.quote(str(ROOT) + '[blob,eventhub]')} azure-identity"
    # What the shell hands pip, from another directory, is the checkout with the extras.
    words = subprocess.run(["sh", "-c", f"printf '%s\\n' {hint.split(' ', 2)[2]}"], capture_output=True, text=True,
                           cwd=tmp_path).stdout.split()
    assert words == ["-e", f"{ROOT}[blob,eventhub]", "azure-identity"]


def test_the_install_hint_of_a_wheel_names_the_wheel(monkeypatch, tmp_path):
    """Installed from a wheel (no checkout), the hint reinstalls that wheel with the
    extra: the project is not on any index."""
    from importlib import metadata

    from eventprocessor import extras

    wheel = tmp_path / "eventprocessor-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")

    class Installed:
        def read_text(self, name: str) -> str | None:
            assert name == "direct_url.json"
            return json.dumps({"url": wheel.as_uri(), "archive_info": {}})

    monkeypatch.setattr(extras, "source_checkout", lambda: None)
    monkeypatch.setattr(metadata, "distribution", lambda name: Installed())
    assert extras.install_command(["blob"]) == f"pip install {shlex.quote(f'{wheel}[blob]')}"


def test_importing_a_store_without_its_extra_says_the_install_command(tmp_path):
    program = tmp_path / "import_store.py"
    program.write_text("import eventprocessor.stores\ntry:\n    eventprocessor.stores.BlobCheckpointStore\n"
                       "except ModuleNotFoundError as error:\n    print(error)\n")
    out = run_without(["azure", "aiohttp"], [str(program)], env=environment())
    assert out.returncode == 0, out.stderr
    assert "BlobCheckpointStore needs the [blob] extra" in out.stdout, out.stdout
    assert f"pip install -e {shlex.quote(f'{ROOT}[blob]')}" in out.stdout, out.stdout


# --------------------------------------------------------------------------- samples check first


SPARK_MODULES = ["pyspark", "pyarrow", "pandas"]


def test_the_spark_sample_without_the_spark_extra_is_one_line():
    started = time.monotonic()
    out = run_without(SPARK_MODULES, [str(ROOT / "samples" / "spark_consumer.py")], env=environment())
    assert time.monotonic() - started < 10
    assert_one_line_error(out, "[spark]", f"pip install -e {shlex.quote(f'{ROOT}[spark]')}")


def test_the_spark_sample_without_java_is_one_line(tmp_path):
    from eventprocessor.cli.user_errors import missing_modules

    if missing_modules(SPARK_MODULES):
        unavailable("pyspark is not installed (pip install -e '.[all]')")
    env = environment(PATH=str(Path(sys.executable).parent), JAVA_HOME=str(tmp_path / "no-jdk"))
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(ROOT / "samples" / "spark_consumer.py")], capture_output=True,
                         text=True, timeout=60, env=env, cwd=ROOT)
    assert time.monotonic() - started < 10
    assert_one_line_error(out, "Java 17")


@pytest.mark.parametrize("sample, blocked, needle", [
    ("eventhub_consumer.py", ["azure.eventhub"], "[eventhub]"),
    ("callback_consumer.py", ["azure.eventhub"], "[eventhub]"),
    ("multiprocess_azurite.py", ["azure"], "[blob,eventhub]"),
])
def test_samples_without_their_extras_are_one_line(sample, blocked, needle):
    marker = uuid.uuid4().hex
    out = run_without(blocked, [str(ROOT / "samples" / sample)], env=environment(marker))
    assert_one_line_error(out, needle, "pip install -e")
    assert_nothing_left(marker)


# --------------------------------------------------------------------------- extras match the docs


def test_the_otel_extra_installs_what_the_metrics_example_imports():
    """``pip install -e '.[otel]'`` then the metrics example (docs/howto/operating.md):
    ``ModuleNotFoundError: opentelemetry.sdk`` (the extra had only the API)."""
    from importlib import metadata

    section = docs_pages.section("docs/howto/operating.md", "Metrics")
    example = re.search(r"```python\n(.*?)```", section, re.S)
    assert example
    imported = set(re.findall(r"^(?:from|import) (opentelemetry[\w.]*)", example.group(1), re.M))
    assert imported, "the metrics example imports OpenTelemetry"
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    otel = {re.split(r"[<>=!~\[ ]", line.strip())[0].lower()
            for line in cfg["options.extras_require"]["otel"].splitlines() if line.strip()}
    providers = metadata.packages_distributions()
    for module in imported:
        # The distribution that installs this module (opentelemetry is a namespace package:
        # look at the deepest installed package of the module's path).
        parts = module.split(".")
        dists: set = set()
        for depth in range(len(parts), 0, -1):
            candidates = {d.lower() for d in providers.get(".".join(parts[:depth]), [])}
            if depth == 1:
                candidates = set()
            if candidates:
                dists = candidates
                break
        if not dists:
            import importlib.util

            spec = importlib.util.find_spec(module)
            assert spec is not None and spec.origin, module
            for dist in metadata.distributions():
                files = dist.files or []
                if any(str(dist.locate_file(f)) == spec.origin for f in files):
                    dists.add(dist.metadata["Name"].lower())
        assert dists & otel, f"{module} comes with {sorted(dists)}, which the [otel] extra ({sorted(otel)}) lacks"


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
    demo = subprocess.Popen([sys.executable, "-m", "eventprocessor.cli", "demo", "--store", "azurite"],
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
            out = subprocess.run(["bash", "-c", f"{command} --count 2 --interval 1"], capture_output=True, text=True,
                                 timeout=60, env=environment(PATH=path), cwd=tmp_path)
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
