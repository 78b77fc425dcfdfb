"""``eventprocessor postgres``: a local PostgreSQL from the server binaries on the machine,
its DSN on one line, stopped on SIGTERM; a one-line error naming the package to install
when the binaries are missing."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import asyncpg
import pytest

from eventprocessor.emulators.ports import port_open
from eventprocessor.emulators.postgres import INSTALL_HINT, find_postgres_bin
from tests.conftest import unavailable

ROOT = Path(__file__).resolve().parent.parent
COMMAND = [sys.executable, "-m", "eventprocessor", "postgres"]


def test_missing_server_binaries_end_in_one_line_naming_the_package(tmp_path):
    env = dict(os.environ, POSTGRES_BIN=str(tmp_path / "nowhere"))
    done = subprocess.run(COMMAND, capture_output=True, text=True, timeout=60, env=env, cwd=ROOT)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"`{INSTALL_HINT}`" in lines[0] and "POSTGRES_BIN" in lines[0]


async def test_it_prints_a_dsn_that_works_and_stops_on_sigterm():
    if find_postgres_bin() is None:
        unavailable(f"no PostgreSQL server binaries: `{INSTALL_HINT}`")
    # Under /tmp rather than tmp_path: as root, the server runs as the postgres user, who
    # cannot enter pytest's private directories.
    where = Path(tempfile.mkdtemp(prefix="cli-postgres-"))
    where.chmod(0o755)
    cluster = where / "cluster"
    process = subprocess.Popen([*COMMAND, "--setting", "fsync=off", "--location", str(cluster)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert process.stdout is not None
        dsn = process.stdout.readline().strip()
        assert dsn.startswith("postgresql://postgres@127.0.0.1:"), process.stderr.read() if not dsn else dsn
        connection = await asyncpg.connect(dsn)
        try:
            assert await connection.fetchval("SHOW listen_addresses") == "127.0.0.1"
            assert await connection.fetchval("SHOW fsync") == "off"
        finally:
            await connection.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) in (0, 143)
        assert not port_open(int(dsn.rsplit(":", 1)[1].split("/")[0])), "the server stopped with the command"
        assert (cluster / "data" / "PG_VERSION").exists(), "--location keeps the cluster"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
            pytest.fail("the command did not stop on SIGTERM")
        shutil.rmtree(where, ignore_errors=True)
