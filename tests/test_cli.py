"""The command line as a user runs it: --help everywhere, one-line errors that say what to
install, --debug, the demo end to end (also through a pipe), and the benchmarks from any
directory.

"A fresh clone with only ``pip install -e .``" is reproduced cheaply: the CLI runs in a
subprocess whose import system refuses ``azure``, ``pyspark``, ``pyarrow`` and
``pandas`` (a meta-path finder installed before anything is imported), with
``AZURITE_BIN`` pointing nowhere or a PATH without ``node``/``java``.
"""
from __future__ import annotations

import configparser
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventprocessor.cli import main
from eventprocessor.cli.user_errors import EXTRA_MODULES, CommandError

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("azure", "pyspark", "pyarrow", "pandas")

# Runs the CLI as the `eventprocessor` console script would, with HEAVY not installable.
WITHOUT_EXTRAS = f"""
import sys
class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
from eventprocessor.cli import main
main(prog_name="eventprocessor")
"""


def run_cli(*args: str, extras: bool = True, env: dict[str, str] | None = None, cwd: Path | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
    command = ([sys.executable, "-m", "eventprocessor.cli"] if extras
               else [sys.executable, "-c", WITHOUT_EXTRAS])
    environment = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    environment.pop("EVENTPROCESSOR_DEBUG", None)
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout, env=environment,
                          cwd=cwd or ROOT)


def assert_one_line_error(out: subprocess.CompletedProcess, *needles: str) -> str:
    """Non-zero exit, no traceback, and exactly one line of stderr that names ``needles``."""
    assert out.returncode != 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr + out.stdout, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _every_command() -> list:
    """Every command and subcommand the CLI registers (benchmarks added later included)."""
    import click

    found: list = [[]]
    context = click.Context(main)
    for name in main.list_commands(context):
        found.append([name])
        command = main.get_command(context, name)
        if isinstance(command, click.Group):
            found += [[name, sub] for sub in command.list_commands(click.Context(command, parent=context))]
    return found


EVERY_COMMAND = _every_command()


@pytest.mark.parametrize("args", EVERY_COMMAND)
def test_every_command_has_help(args):
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "usage" in result.output.lower()


def test_every_help_works_without_any_extra():
    for args in EVERY_COMMAND + [["--debug", "bench", "store-bench"]]:
        out = run_cli(*args, "--help", extras=False)
        assert out.returncode == 0, (args, out.stderr)
        assert "usage" in out.stdout.lower() and "Traceback" not in out.stderr, args
    assert run_cli("--version", extras=False).returncode == 0


@pytest.mark.parametrize("args, install", [
    (["demo", "--store", "blob"], f"pip install -e '{ROOT}[blob]'"),
    (["send"], f"pip install -e '{ROOT}[eventhub]'"),
    (["bench", "convergence", "--quick"], f"pip install -e '{ROOT}[eventhub]'"),
    (["bench", "store-bench"], f"pip install -e '{ROOT}[blob,table]' azure-eventhub-checkpointstoreblob-aio"),
    (["bench", "store_bench", "--stores", "ours-table"], f"pip install -e '{ROOT}[table]'"),
    (["bench", "spark-sink"], f"pip install -e '{ROOT}[spark]'"),
])
def test_a_missing_extra_is_one_line_naming_the_install_command(args, install):
    out = run_cli(*args, extras=False)
    assert_one_line_error(out, install)


def test_commands_that_need_no_extra_run_without_them(tmp_path):
    out = run_cli("bench", "throughput", "--events-per-partition", "50", "--rounds", "1", extras=False)
    assert out.returncode == 0, out.stderr
    assert "median per-round ratio" in out.stdout
    out = run_cli("bench", "store-bench", "--stores", "memory", "--partitions", "4", "--checkpoint-ops", "4",
                  "--list-repeats", "1", "--rounds", "1", extras=False)
    assert out.returncode == 0, out.stderr
    assert "| ours in-memory" in out.stdout
    out = run_cli("demo", "--partitions", "4", "--processors", "2", "--interval", "0.1", "--expiration", "1",
                  "--rate", "200", "--timeout", "30", extras=False)
    assert out.returncode == 0, out.stderr
    assert "events lost" in out.stdout


def test_debug_shows_the_traceback_instead():
    out = run_cli("--debug", "demo", "--store", "blob", extras=False)
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "MissingRequirementError" in out.stderr
    out = run_cli("--debug", "bench", "convergence", "--quick", extras=False)
    assert out.returncode != 0
    assert "Traceback" in out.stderr and "MissingRequirementError" in out.stderr


def needs_extra(module: str) -> None:
    """The extras' checks come first; past them, these tests need the extra installed."""
    from eventprocessor.cli.user_errors import missing_modules
    from tests.conftest import unavailable

    if missing_modules([module]):
        unavailable(f"{module} is not installed (pip install -e '.[all]')")


def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_demo_on_azurite_without_npm_ci_says_to_run_it():
    needs_extra("azure.storage.blob")
    if _port_in_use(10000):
        pytest.skip("something listens on 127.0.0.1:10000; the demo would use it instead of starting Azurite")
    out = run_cli("demo", "--store", "blob", env={"AZURITE_BIN": str(ROOT / "no-such-dir" / "azurite")})
    assert_one_line_error(out, f"cd {ROOT} && npm ci")


def test_demo_on_azurite_without_node_says_to_install_it(tmp_path):
    needs_extra("azure.storage.blob")
    if _port_in_use(10000):
        pytest.skip("something listens on 127.0.0.1:10000; the demo would use it instead of starting Azurite")
    fake_azurite = tmp_path / "azurite"
    fake_azurite.write_text("#!/usr/bin/env node\n")
    out = run_cli("demo", "--store", "blob", env={"AZURITE_BIN": str(fake_azurite), "PATH": str(tmp_path)})
    assert_one_line_error(out, "Node.js", "`node` is not on PATH")


def test_spark_sink_without_java_says_to_install_it(tmp_path):
    needs_extra("pyspark")
    env = {"PATH": str(tmp_path), "JAVA_HOME": str(tmp_path / "no-jdk")}
    out = run_cli("bench", "spark-sink", env=env)
    assert_one_line_error(out, "Java 17", "openjdk-17")


def test_bad_arguments_name_the_option_and_never_show_a_traceback():
    for args in (["demo", "--partitions", "0"], ["demo", "--interval", "2", "--expiration", "1"],
                 ["bench", "store-bench", "--rounds", "0"], ["bench", "no-such-benchmark"]):
        out = run_cli(*args, extras=False)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr
        assert "error" in out.stderr.lower()


def test_demo_rejects_expiration_not_longer_than_interval():
    result = CliRunner().invoke(main, ["demo", "--interval", "2", "--expiration", "1"])
    assert result.exit_code != 0
    assert "--expiration" in result.output


def test_every_extra_the_cli_knows_is_one_setup_cfg_declares():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    declared = cfg["options.extras_require"]
    for extra, modules in EXTRA_MODULES.items():
        for module in modules:  # azure.storage.blob comes with azure-storage-blob, and so on
            assert module.replace(".", "-") in declared[extra], (extra, module)
            assert module.replace(".", "-") in declared["all"], ("all", module)


def test_python_dash_m_runs_the_same_cli():
    out = subprocess.run([sys.executable, "-m", "eventprocessor.cli", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "eventprocessor" in out.stdout


def _phase_lines(stdout: str) -> Sequence[str]:
    return [line for line in stdout.splitlines() if re.match(r"\[[a-z-]+\] ", line)]


def test_demo_through_a_pipe_keeps_its_phase_labels_in_order():
    out = run_cli("demo", "--partitions", "8", "--processors", "3", "--interval", "0.2", "--expiration", "1.5",
                  "--rate", "300", "--timeout", "40")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = _phase_lines(out.stdout)
    phases = [line[1:line.index("]")] for line in lines]
    order = ["starting", "converging", "scale-in", "failover", "draining", "done"]
    assert [p for i, p in enumerate(phases) if i == 0 or phases[i - 1] != p] == order, lines
    crash = next(i for i, line in enumerate(lines) if "crashed (no release" in line)
    crashed = re.search(r"(processor-\d+) crashed", lines[crash]).group(1)
    # Nothing shows the crashed processor holding 0 partitions before the line saying it crashed.
    assert not any(f"{crashed}=0" in line for line in lines[:crash]), lines
    assert all(f"{crashed}=crashed" in line for line in lines[crash + 1:] if " tick " in line), lines
    assert any("taken over" in line for line in lines[crash:])
    lost_line = next(line for line in out.stdout.splitlines() if "events lost" in line)
    assert lost_line.split()[-2] == "0"


class _SilentServer:
    """A loopback TCP server that accepts connections and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held = []
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)

    def close(self) -> None:
        self.sock.close()
        for connection in self.held:
            connection.close()


async def test_demo_refuses_a_service_on_the_azurite_ports_that_does_not_answer(monkeypatch):
    needs_extra("azure.storage.blob")
    from eventprocessor.cli import demo
    from eventprocessor.cli.demo import store

    servers = [_SilentServer() for _ in range(3)]
    try:
        monkeypatch.setattr(store, "AZURITE_PORTS", tuple(s.port for s in servers))
        monkeypatch.setattr(store, "STORE_PROBE_TIMEOUT", 2.0)
        with pytest.raises(CommandError, match=f"127.0.0.1:{servers[0].port} does not answer as Azurite"):
            await demo.run_demo(demo.DemoConfig(store="blob", partitions=2, processors=1))
    finally:
        for server in servers:
            server.close()


def test_benchmarks_run_from_any_directory_and_ignore_a_benchmarks_package_there(tmp_path):
    decoy = tmp_path / "benchmarks"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("raise ImportError('the decoy benchmarks package was imported')\n")
    results = (ROOT / "benchmarks" / "RESULTS.md").read_bytes()
    out = run_cli("bench", "throughput", "--events-per-partition", "50", "--rounds", "1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "median per-round ratio" in out.stdout
    # `python -m benchmarks.X` finds the checkout through PYTHONPATH, from another directory.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run([sys.executable, "-m", "benchmarks.convergence", "--quick"], capture_output=True, text=True,
                         timeout=300, cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "### Cold start" in out.stdout
    assert (ROOT / "benchmarks" / "RESULTS.md").read_bytes() == results, "a run without --record wrote RESULTS.md"


@pytest.mark.azurite
def test_demo_against_azurite_starts_one_and_says_where():
    from eventprocessor.emulators.azurite import find_azurite
    from tests.conftest import unavailable

    if find_azurite() is None:
        unavailable("the azurite executable was not found (run `npm ci`)")
    out = subprocess.run(
        [sys.executable, "-m", "eventprocessor.cli", "demo", "--store", "blob", "--partitions", "6",
         "--processors", "3", "--interval", "0.3", "--expiration", "2", "--rate", "200", "--timeout", "60"],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "127.0.0.1:" in out.stdout and "Azurite" in out.stdout
    lost_line = next(line for line in out.stdout.splitlines() if "events lost" in line)
    assert lost_line.split()[-2] == "0"
