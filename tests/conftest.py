"""Shared fixtures: a session-wide Azurite, a session-wide Event Hubs emulator, and the CI
rule that missing services fail.

Under pytest-xdist (``pytest -n 2``, what tox runs) the workers share one Azurite and one
emulator: the first worker that needs one starts it under a file lock and writes where it
listens into a directory the controller made (``EVENTPROCESSOR_TEST_SERVICES``); the others
read it; the controller stops them all at the end of the session. Tests that need fixed
ports (the README's default ports) run on one worker, the Spark cluster's tests on one
worker and the local Spark session's on one: see ``pytest_collection_modifyitems``."""
from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from eventprocessor.emulators.azurite import Azurite, AzuriteUnavailable, start_azurite
from eventprocessor.emulators.postgres import PostgresServer, PostgresUnavailable, start_postgres
from tests.spark_fixtures import connect_spark, spark_cluster  # noqa: F401  (the session Spark cluster)

if TYPE_CHECKING:  # pragma: no cover
    from eventprocessor.emulators.eventhubs.process import EmulatorProcess

IN_CI = bool(os.environ.get("CI"))
SHARED = "EVENTPROCESSOR_TEST_SERVICES"

# Modules whose tests must not run beside each other on two workers.
FIXED_PORTS = ("test_getting_started", "test_new_user_paths", "test_new_user_commands", "test_install_hints",
               "test_cli", "test_readme_examples", "test_readme_eventhubs", "test_samples", "test_cli_eventhubs")
SPARK_CLUSTER = ("test_spark_cluster", "test_readme_spark_source", "test_spark_handoff")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_GroupedNodeIds(), "grouped-node-ids")
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", default=None):
        os.environ[SHARED] = tempfile.mkdtemp(prefix="eventprocessor-services-")


# Before xdist's own hook, which turns the xdist_group marks into the node ids --dist
# loadgroup schedules by (``path::test@group``); _GroupedNodeIds, after it, makes those
# ids take effect under pytest 9.2. The fixed-port tests also hold the machine-wide lock
# below (two test sessions on one machine).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        if module in FIXED_PORTS:
            item.add_marker(pytest.mark.xdist_group("fixed-ports"))
        elif module in SPARK_CLUSTER or module.startswith("test_spark_source"):
            item.add_marker(pytest.mark.xdist_group("spark-cluster"))  # one cluster, on one worker
        elif module == "test_spark_sink":
            item.add_marker(pytest.mark.xdist_group("spark-local"))  # one local Spark session
        elif module == "test_azure_eventhub_tests":
            # Its module fixture runs azure-eventhub's tests once, on 180 fresh hubs: on one worker only.
            item.add_marker(pytest.mark.xdist_group("azure-eventhub-tests"))


class _GroupedNodeIds:
    """pytest-xdist's loadgroup names a grouped test ``path::test@group`` by setting
    ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is ``item._id`` there):
    without this, every group's tests were spread over both workers. With an older pytest
    ``_nodeid`` is the id itself and nothing changes."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list) -> None:
        for item in items:
            suffixed = item.__dict__.get("_nodeid")
            if isinstance(suffixed, str) and suffixed != item.nodeid:
                from _pytest.nodeid import NodeId

                item._id = NodeId.parse(suffixed)


@pytest.fixture(autouse=True)
def _fixed_ports_one_session_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tests on the README's fixed ports (Azurite's 10000-10002, AMQP's 5672) hold a lock
    for the whole machine, so two test sessions on one machine (two checkouts, a CI run
    beside a developer's) take turns instead of failing on a port in use."""
    group = request.node.get_closest_marker("xdist_group")
    if group is None or group.args[:1] != ("fixed-ports",):
        yield
        return
    from filelock import FileLock

    with FileLock(os.path.join(tempfile.gettempdir(), "eventprocessor-fixed-ports.lock")):
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The controller stops the services the workers shared, by the process ids they wrote."""
    directory = os.environ.get(SHARED)
    if not directory or hasattr(session.config, "workerinput"):
        return
    for info in Path(directory).glob("*.json"):
        service = json.loads(info.read_text())
        for pid in service.get("pids", []):
            _stop_pid(pid, getattr(signal, service.get("signal", "SIGTERM")))
        for path in service.get("remove", []):
            shutil.rmtree(path, ignore_errors=True)


def _stop_pid(pid: int, signum: int = signal.SIGTERM) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def shared_service(name: str, start: Callable[[], Any], describe: Callable[[Any], dict[str, Any]],
                   rebuild: Callable[[dict[str, Any]], Any]) -> Iterator[Any]:
    """One service for the whole run: started here, or (under xdist) by whichever worker
    asked first, and found by the others through the shared directory."""
    directory = os.environ.get(SHARED)
    if not directory:
        yield None  # the caller starts and stops its own
        return
    from filelock import FileLock

    info = Path(directory) / f"{name}.json"
    found: dict[str, Any] | None = None
    with FileLock(str(info) + ".lock"):
        if info.exists():
            found = json.loads(info.read_text())
        else:
            try:
                service = start()
            except BaseException as error:  # every worker fails the same way, without trying again
                info.write_text(json.dumps({"error": str(error) or type(error).__name__, "pids": []}))
                raise
            info.write_text(json.dumps(describe(service)))
    if found is None:
        yield service
        return
    if "error" in found:
        unavailable(found["error"])
    yield rebuild(found)


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: tests that need a service never pass silently in CI."""
    if IN_CI:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def _start_azurite() -> Azurite:
    try:
        return start_azurite()
    except AzuriteUnavailable as error:
        unavailable(f"Azurite could not start: {error}")
        raise  # unreachable; keeps type checkers happy


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """One Azurite for the whole test session, on free loopback ports."""
    shared = shared_service(
        "azurite", _start_azurite,
        lambda a: {"ports": [a.blob_port, a.queue_port, a.table_port], "pids": [a.process.pid] if a.process else []},
        lambda info: Azurite(*info["ports"]))
    instance = next(shared)
    if instance is not None:
        yield instance
        return
    instance = _start_azurite()
    try:
        yield instance
    finally:
        instance.stop()


# ----------------------------------------------------------------------------- PostgreSQL

# The session's server keeps commits across a crash of the server process (what the fault
# tests need) but does not wait for the disk: no test here is about losing the machine.
POSTGRES_TEST_SETTINGS = {"fsync": "off", "full_page_writes": "off"}


def _start_postgres() -> PostgresServer:
    try:
        return start_postgres(settings=POSTGRES_TEST_SETTINGS)
    except PostgresUnavailable as error:
        unavailable(f"PostgreSQL could not start: {error}")
        raise  # unreachable; keeps type checkers happy


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole test session (initdb into a temporary
    directory, 127.0.0.1, a free port), shared by the xdist workers and stopped at the end
    (SIGINT: PostgreSQL's fast shutdown). Tests keep apart by table and consumer group;
    a test that restarts or crashes a server starts its own."""
    shared = shared_service(
        "postgres", _start_postgres,
        lambda server: {"port": server.port, "directory": str(server.directory), "bin_dir": str(server.bin_dir),
                        "user": server.user, "pids": [server.pid] if server.pid else [], "signal": "SIGINT",
                        "remove": [str(server.directory)]},
        lambda info: PostgresServer(info["port"], Path(info["directory"]), Path(info["bin_dir"]), info["user"],
                                    temporary=False))
    instance = next(shared)
    if instance is not None:
        yield instance
        return
    instance = _start_postgres()
    try:
        yield instance
    finally:
        instance.stop()


# ----------------------------------------------------------------------------- Event Hubs emulator

# Hubs of the session emulator, handed out one per test so tests never see each other's
# events: "pool4-N" have 4 partitions, "pool8-N" 8, "pool2-N" 2 (azure-eventhub's own
# tests, tests/test_azure_eventhub_tests.py, take one each); all have consumer groups cg1
# and cg2.
HUB_POOLS = {4: 120, 8: 24, 2: 200}
# The session emulator checks SAS tokens, with the key of the connection string it prints
# (the documented placeholder of Microsoft's emulator): a client that signs with another
# key, or names another key, is refused, as by the service.
SESSION_SAS_KEY = "SAS_KEY_VALUE"


@dataclass
class SessionEmulator:
    """The session's Event Hubs emulator process and a pool of fresh hubs."""

    process: EmulatorProcess
    _next: dict[int, int] = field(default_factory=dict)

    @property
    def connection_string(self) -> str:
        return self.process.connection_string

    @property
    def port(self) -> int:
        return self.process.port

    def fresh_hub(self, partitions: int = 4) -> str:
        """The name of a hub no other test of this run has used (on any worker)."""
        directory = os.environ.get(SHARED)
        if directory:
            from filelock import FileLock

            counters = Path(directory) / "hubs.counters"
            with FileLock(str(counters) + ".lock"):
                taken = json.loads(counters.read_text()) if counters.exists() else {}
                index = taken.get(str(partitions), 0)
                taken[str(partitions)] = index + 1
                counters.write_text(json.dumps(taken))
        else:
            index = self._next.get(partitions, 0)
            self._next[partitions] = index + 1
        if partitions not in HUB_POOLS or index >= HUB_POOLS[partitions]:
            raise RuntimeError(f"no fresh {partitions}-partition hub left: raise HUB_POOLS in tests/conftest.py")
        return f"pool{partitions}-{index}"


def _session_config(path: Path) -> Path:
    entities = [{"Name": f"pool{partitions}-{index}", "PartitionCount": str(partitions),
                 "ConsumerGroups": [{"Name": "cg1"}, {"Name": "cg2"}]}
                for partitions, count in HUB_POOLS.items() for index in range(count)]
    config = {"UserConfig": {"NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1", "Entities": entities}],
                             "LoggingConfig": {"Type": "Console"}}}
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="session")
def eventhubs_emulator(tmp_path_factory) -> Iterator[SessionEmulator]:
    """One Event Hubs emulator process for the whole session, on a free loopback port,
    stopped by PID even when tests fail."""
    from eventprocessor.emulators.eventhubs.process import EmulatorProcess, EmulatorUnavailable, start_emulator_process

    def start() -> SessionEmulator:
        directory = tmp_path_factory.mktemp("eventhubs")
        config = _session_config(directory / "Config.json")
        try:
            process = start_emulator_process(["--config", str(config), "--max-events-per-partition", "200000",
                                              "--sas-key", SESSION_SAS_KEY],
                                             stderr=(directory / "emulator.log").open("wb"))
        except EmulatorUnavailable as error:
            unavailable(f"the Event Hubs emulator could not start: {error}")
            raise  # unreachable
        return SessionEmulator(process)

    shared = shared_service(
        "eventhubs", start, lambda e: {"connection_string": e.connection_string, "pids": [e.process.pid]},
        lambda info: SessionEmulator(EmulatorProcess(info["connection_string"], None)))  # type: ignore[arg-type]
    emulator = next(shared)
    if emulator is not None:
        yield emulator
        return
    directory = tmp_path_factory.mktemp("eventhubs")
    config = _session_config(directory / "Config.json")
    log = (directory / "emulator.log").open("wb")
    try:
        process = start_emulator_process(["--config", str(config), "--max-events-per-partition", "200000",
                                          "--sas-key", SESSION_SAS_KEY], stderr=log)
    except EmulatorUnavailable as error:
        log.close()
        unavailable(f"the Event Hubs emulator could not start: {error}")
        raise  # unreachable
    try:
        yield SessionEmulator(process)
    finally:
        code = process.stop()
        log.close()
        if code not in (0, None):
            print(f"\nthe Event Hubs emulator exited with code {code}; its log: {directory / 'emulator.log'}")


@pytest.fixture
def hub(eventhubs_emulator: SessionEmulator) -> str:
    """A fresh 4-partition hub on the session emulator."""
    return eventhubs_emulator.fresh_hub(4)
