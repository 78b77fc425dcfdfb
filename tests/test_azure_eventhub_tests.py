"""azure-eventhub's own async live tests (``tests/azure_eventhub_tests/``, from the
azure-eventhub 5.15.1 sdist) against the session's emulator: the official client must
pass every one that does not need real Azure, and the drop-in (the same files with
only the consumer's import changed) every one the official client passes, except those
that read the official client's private attributes (``LEFT_OUT``, listed on the
migration page).

They run in a pytest session of their own (``emulator_conftest.py`` gives them their
fixtures), with many xdist workers: the tests mostly wait (``asyncio.sleep(10)`` and
more), so they overlap well on two cores. Both clients run in that one session, on the
session's emulator, each test on a fresh 2-partition hub. Clients that reach the
namespace over TLS (all but those built from an emulator connection string) go through
a TLS-terminating relay on loopback (:class:`TcpFaultProxy` with ``ssl=``), with a
certificate from a throwaway CA the client's default trust store is given; the tests'
Azure AD credential is a SAS token credential. ``--sleep False`` (the sdist's own
option) closes a connection instead of sleeping past the service's 240 s idle time.
"""
from __future__ import annotations

import ast
import asyncio
import os
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from eventprocessor.emulators.fault_proxy import TcpFaultProxy
from harness.tls import TestPki
from tests.dropin_imports import migrated

pytestmark = pytest.mark.eventhubs

pytest.importorskip("azure.eventhub")

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests" / "azure_eventhub_tests"
HOST = "emulator.eventhubs.test"  # the reserved .test domain: never a real host
WORKERS = 16  # the tests mostly wait: sixteen at a time (see LONGEST) keep the session near its longest test

NEEDS_AZURE = {
    "test_consumer_client_async.py::test_receive_storage_checkpoint_async[pyamqp]":
        "needs an Azure storage account and Azure Resource Manager (it changes the hub's retention)",
    "test_buffered_producer_async.py::test_long_wait_small_buffer[pyamqp]": "skipped upstream",
}
# Tests the drop-in is not run with: they read the official client's private attributes.
LEFT_OUT = {
    "test_consumer_client_async.py::test_receive_no_partition_async": "client._event_processors",
    "test_consumer_client_async.py::test_receive_load_balancing_async": "client._event_processors",
    "test_consumer_client_async.py::test_receive_batch_no_max_wait_time_async": "client._event_processors",
    "test_consumer_client_async.py::test_receive_batch_large_event_async": "client._event_processors",
    "test_consumer_client_async.py::test_receive_mimic_processing_async": "client._event_processors",
    "test_negative_async.py::test_receive_with_invalid_param_async": "client._event_processors",
    "test_reconnect_async.py::test_receive_connection_idle_timeout_and_reconnect_async": "client._create_consumer",
}


# The order the tests are handed out in, so that the session lasts about as long as its
# longest test. ``--dist load`` gives each worker two consecutive tests to start with and
# keeps one queued behind the one a worker runs: a test queued behind one of the
# minutes-long tests waits for it to end. So each of those (LONGEST: the official client's
# test_client_invalid_credential_async takes about 300 s: it sleeps 15 s six times, and
# each time azure-eventhub's consumer then waits out its 30 s load-balancing interval
# before receive() returns; the drop-in's about 190 s; test_long_sleep sleeps 220 s by
# design) is paired with a test skipped at once (PARTNERS), on a worker of its own; the
# other slow tests (SLOWEST) follow, then the rest. (worksteal would give the first
# tests all to the first worker's share.)
LONGEST = ("test_client_invalid_credential_async", "test_long_sleep")
PARTNERS = ("test_buffered_producer_async.py::test_long_wait_small_buffer",
            "test_consumer_client_async.py::test_receive_storage_checkpoint_async")
SLOWEST = ("test_client_with_ssl_context_async", "test_send_with_invalid_hostname_async",
           "test_send_with_timing_configuration", "test_receive_with_event_position_async",
           "test_receive_owner_level_async")


def _tests(path: Path, *, consumer_only: bool = False) -> list[str]:
    """The test functions of ``path`` (``consumer_only``: those that use ``EventHubConsumerClient``)."""
    tree = ast.parse(path.read_text())
    return [node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test_") and (not consumer_only or any(
                isinstance(n, ast.Name) and n.id == "EventHubConsumerClient" for n in ast.walk(node)))]


def _private_reads(path: Path, function: str) -> set[str]:
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == function)
    return {f"{ast.unparse(n.value)}.{n.attr}" for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and n.attr.startswith("_") and not n.attr.startswith("__")}


@dataclass
class Outcomes:
    """Each test's outcome (``passed``, ``failed``, ``skipped``), by client, and the run's time."""

    official: dict[str, str]
    drop_in: dict[str, str]
    seconds: float
    report: str


def _write_run_directory(run: Path) -> list[str]:
    """The tests as published (``official/``) and migrated (``dropin/``), beside the
    emulator conftest; returns the node ids to run."""
    sources = sorted((TESTS / "livetest" / "asynctests").glob("test_*.py"))
    (run / "conftest.py").write_text((TESTS / "emulator_conftest.py").read_text())
    (run / "pytest.ini").write_text("[pytest]\nasyncio_mode = strict\nasyncio_default_fixture_loop_scope = function\n")
    selected = []
    for variant in ("official", "dropin"):
        (run / variant).mkdir()
        for path in sources:
            text = path.read_text()
            (run / variant / path.name).write_text(text if variant == "official" else migrated(text))
            selected += [f"{variant}/{path.name}::{name}" for name in _tests(path, consumer_only=variant == "dropin")
                         if variant == "official" or f"{path.name}::{name}" not in LEFT_OUT]
    return _in_order(selected)


def _in_order(selected: list[str]) -> list[str]:
    """``selected`` in the order to hand out (see LONGEST): each longest test followed by a
    partner skipped at once, then the slow ones, then the rest (each group in its order)."""
    longest = [node for name in LONGEST for node in selected if node.rsplit("::", 1)[1] == name]
    partners = [node for node in selected if node.split("/", 1)[1] in PARTNERS]
    assert len(partners) >= len(longest) == 2 * len(LONGEST), (longest, partners)
    paired = [node for pair in zip(longest, partners[:len(longest)], strict=True) for node in pair]
    rest = [node for node in selected if node not in paired]
    return paired + sorted(rest, key=lambda node: node.rsplit("::", 1)[1] not in SLOWEST)


class _Relay:
    """The TLS-terminating relay in front of the emulator, on a thread of its own (the
    tests block their event loops with synchronous clients)."""

    def __init__(self, upstream_port: int, pki: TestPki) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tls-relay", daemon=True)
        self.proxy = TcpFaultProxy("127.0.0.1", upstream_port, ssl=pki.server_context())

    def __enter__(self) -> _Relay:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self._loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.proxy.stop(), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


def _outcomes(junit: Path) -> dict[str, dict[str, str]]:
    found: dict[str, dict[str, str]] = {"official": {}, "dropin": {}}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        variant, _, module = case.get("classname", "").partition(".")
        name = f"{module.rsplit('.', 1)[-1]}.py::{case.get('name')}"
        kind = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        found.setdefault(variant, {})[name] = {"failure": "failed", "error": "failed"}.get(kind, kind)
    return found


@pytest.fixture(scope="module")
def outcomes(eventhubs_emulator, tmp_path_factory) -> Iterator[Outcomes]:
    import certifi

    work = tmp_path_factory.mktemp("azure-eventhub-tests")
    run = work / "run"
    run.mkdir()
    selected = _write_run_directory(run)
    pki = TestPki.create(work / "pki", hostnames=[HOST])
    bundle = pki.bundle_with(certifi.where(), work / "pki" / "bundle.pem")
    # One fresh hub per test case at most (87 functions here, the drop-in's a subset of them).
    (work / "hubs").write_text("\n".join(eventhubs_emulator.fresh_hub(2) for _ in range(150)))
    with _Relay(eventhubs_emulator.port, pki) as relay:
        env = {**os.environ, "LIVETEST_EMULATOR": eventhubs_emulator.connection_string, "LIVETEST_HOST": HOST,
               "LIVETEST_TLS_PORT": str(relay.proxy.port), "LIVETEST_CA_BUNDLE": str(bundle),
               "LIVETEST_HUBS": str(work / "hubs"), "LIVETEST_HUBS_TAKEN": str(work / "hubs.taken"),
               "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        env.pop("PYTEST_XDIST_WORKER", None)
        began = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--import-mode=importlib",
             "-c", str(run / "pytest.ini"), "--rootdir", str(run), "-n", str(WORKERS), "--dist", "load",
             "--sleep", "False", "-q", "-rfEs", "--junitxml", str(work / "junit.xml"), "-o", "junit_family=xunit1",
             *selected],
            cwd=run, env=env, capture_output=True, text=True, timeout=900)
        seconds = time.monotonic() - began
    found = _outcomes(work / "junit.xml")
    yield Outcomes(found["official"], found["dropin"], seconds, done.stdout[-20000:] + done.stderr[-5000:])


def _table(outcomes: dict[str, str]) -> str:
    counts = {kind: sum(1 for v in outcomes.values() if v == kind) for kind in ("passed", "failed", "skipped")}
    return ", ".join(f"{n} {kind}" for kind, n in counts.items())


def test_the_official_client_passes_them_and_the_drop_in_wherever_it_does(outcomes: Outcomes) -> None:
    """One test for the one run (its fixture runs once per worker that needs it: two tests
    could land on both xdist workers and run the ten-minute suite twice)."""
    print(f"\nazure-eventhub's tests, {outcomes.seconds:.0f} s: official client {_table(outcomes.official)}; "
          f"drop-in {_table(outcomes.drop_in)}")
    assert len(outcomes.official) == 83, outcomes.report
    wrong = {name: outcome for name, outcome in outcomes.official.items()
             if outcome != ("skipped" if name in NEEDS_AZURE else "passed")}
    assert not wrong, f"the official client: {wrong}\n{outcomes.report}"
    assert outcomes.drop_in, outcomes.report
    differ = {name: (outcome, outcomes.official.get(name)) for name, outcome in outcomes.drop_in.items()
              if outcome != outcomes.official.get(name)}
    assert not differ, f"the drop-in, where it differs from the official client: {differ}\n{outcomes.report}"


def test_the_tests_left_out_for_the_drop_in_read_the_official_client_s_private_attributes() -> None:
    for name, attribute in LEFT_OUT.items():
        module, function = name.split("::")
        reads = _private_reads(TESTS / "livetest" / "asynctests" / module, function)
        assert any(read.endswith(attribute.split(".", 1)[1]) for read in reads), (name, reads)


def test_the_migration_page_lists_every_test_left_out_for_the_drop_in_and_what_it_reads() -> None:
    page = (ROOT / "docs" / "howto" / "migrating.md").read_text()
    rows = {line.split("|")[1].strip().split()[0].strip("`"): line for line in page.splitlines()
            if line.startswith("| `test_")}
    for name, attribute in LEFT_OUT.items():
        function = name.split("::")[1]
        assert function in rows, f"{function} is left out for the drop-in but not listed on the migration page"
        assert f"`{attribute.split('(')[0]}" in rows[function], (function, attribute, rows[function])
