"""The command line as a user runs it: --help everywhere, and the demo end to end."""
from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from eventprocessor.cli import main


@pytest.mark.parametrize("args", [[], ["demo"], ["bench"], ["bench", "convergence"], ["bench", "throughput"],
                                  ["bench", "store-bench"], ["bench", "spark-sink"]])
def test_every_command_has_help(args):
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert "usage" in result.output.lower()


def test_python_dash_m_runs_the_same_cli():
    out = subprocess.run([sys.executable, "-m", "eventprocessor", "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and "eventprocessor" in out.stdout


def test_demo_converges_fails_over_and_loses_nothing_without_a_tty():
    out = subprocess.run(
        [sys.executable, "-m", "eventprocessor", "demo", "--partitions", "8", "--processors", "3",
         "--interval", "0.2", "--expiration", "1.5", "--rate", "300", "--timeout", "40"],
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "balanced in" in out.stdout
    assert "crashed" in out.stdout and "taken over" in out.stdout
    lost_line = next(line for line in out.stdout.splitlines() if "events lost" in line)
    assert lost_line.split()[-2] == "0"


def test_demo_rejects_expiration_not_longer_than_interval():
    result = CliRunner().invoke(main, ["demo", "--interval", "2", "--expiration", "1"])
    assert result.exit_code != 0
    assert "--expiration" in result.output


@pytest.mark.azurite
def test_demo_against_azurite_starts_one_and_says_where():
    from eventprocessor.emulator import find_azurite

    from tests.conftest import unavailable

    if find_azurite() is None:
        unavailable("the azurite executable was not found (run `npm ci`)")
    out = subprocess.run(
        [sys.executable, "-m", "eventprocessor", "demo", "--store", "azurite", "--partitions", "6",
         "--processors", "3", "--interval", "0.3", "--expiration", "2", "--rate", "200", "--timeout", "60"],
        capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "127.0.0.1:" in out.stdout and "Azurite" in out.stdout
    lost_line = next(line for line in out.stdout.splitlines() if "events lost" in line)
    assert lost_line.split()[-2] == "0"
