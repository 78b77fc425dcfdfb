"""Start and stop a local PostgreSQL server from the binaries on this machine.

Used by the test suite (one server per test session), ``eventprocessor postgres``, the
benchmarks and the samples. It runs ``initdb`` and ``pg_ctl`` from the PostgreSQL server
binaries installed on the machine (``apt-get install postgresql`` on Debian and Ubuntu;
found through ``$POSTGRES_BIN``, ``pg_config --bindir``, ``/usr/lib/postgresql/*/bin`` or
``PATH``) into a temporary directory (or a given one), listening on 127.0.0.1 only, on
a free port (or a given one), with trust authentication for the role ``postgres``: a
server for tests and local use, never for production.

``initdb`` refuses to run as root, and CI runs as root: then the server's files belong
to the ``postgres`` system user (which the Debian package creates) and every server
command runs as that user.

Example::

    with start_postgres() as server:
        store = PostgresCheckpointStore(dsn=server.dsn)
"""
from __future__ import annotations

import glob
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ports import HOST, free_ports, port_open

__all__ = ["PostgresServer", "PostgresUnavailable", "find_postgres_bin", "start_postgres", "INSTALL_HINT",
           "SERVER_USER"]

logger = logging.getLogger(__name__)

INSTALL_HINT = "apt-get install postgresql"
"""The Debian/Ubuntu package with ``initdb``, ``pg_ctl`` and ``postgres``."""

SERVER_USER = "postgres"
"""The system user the server runs as when this process is root (``initdb`` refuses root)."""

_ROLE = "postgres"
_DATABASE = "postgres"
_CONF = "eventprocessor.conf"
_INCLUDE = f"include_if_exists = '{_CONF}'"
_SETTINGS = {"max_connections": "200", "fsync": "on"}


class PostgresUnavailable(RuntimeError):
    """The server binaries are missing, or the server did not start. The message says why
    and what to do."""


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", path)) or (0,)


def _has_server(directory: Path) -> bool:
    return (directory / "initdb").exists() and (directory / "pg_ctl").exists()


def find_postgres_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``$POSTGRES_BIN`` when set (and
    nothing else then), else ``pg_config --bindir``, the newest ``/usr/lib/postgresql/*/bin``
    or ``PATH``; None if none has both."""
    if os.environ.get("POSTGRES_BIN"):
        chosen = Path(os.environ["POSTGRES_BIN"])
        return chosen if _has_server(chosen) else None
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        try:
            out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, timeout=10)
            if out.returncode == 0 and out.stdout.strip():
                candidates.append(Path(out.stdout.strip()))
        except (OSError, subprocess.SubprocessError):
            pass
    candidates += [Path(p) for p in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)]
    for tool in ("pg_ctl", "initdb"):
        found = shutil.which(tool)
        if found:
            candidates.append(Path(os.path.realpath(found)).parent)
    return next((candidate for candidate in candidates if _has_server(candidate)), None)


def _server_user() -> str | None:
    """Who runs the server commands: None (this process's user) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        raise PostgresUnavailable(
            f"initdb refuses to run as root and there is no '{SERVER_USER}' system user to run the server as: "
            f"install the server with `{INSTALL_HINT}` (it creates that user), or run as another user") from None
    return SERVER_USER


def _chown(path: Path, user: str | None) -> None:
    if user is not None:
        entry = pwd.getpwnam(user)
        os.chown(path, entry.pw_uid, entry.pw_gid)


@dataclass
class PostgresServer:
    """A running local server: where it listens (``dsn``) and how to stop, restart or crash it.

    ``directory`` holds the cluster (``data/``), the Unix socket and the log (``server.log``);
    a temporary one is removed by :meth:`stop`."""

    port: int
    directory: Path
    bin_dir: Path
    user: str | None = None
    temporary: bool = True
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def dsn(self) -> str:
        """``postgresql://postgres@127.0.0.1:PORT/postgres`` (trust authentication: no password)."""
        return f"postgresql://{_ROLE}@{HOST}:{self.port}/{_DATABASE}"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "server.log"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    @property
    def running(self) -> bool:
        return self.pid is not None and port_open(self.port)

    def _pg_ctl(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.bin_dir / "pg_ctl"), "-D", str(self.data_dir), *args],
                              capture_output=True, text=True, timeout=timeout + 10, user=self.user,
                              cwd=self.directory, stdin=subprocess.DEVNULL)

    def _write_settings(self) -> None:
        settings = {**_SETTINGS, **self.settings, "listen_addresses": HOST, "port": str(self.port),
                    "unix_socket_directories": str(self.directory)}
        lines = [f"{name} = '{value}'" for name, value in settings.items()]
        conf = self.data_dir / _CONF
        conf.write_text("\n".join(lines) + "\n")
        _chown(conf, self.user)

    def start(self, timeout: float = 60.0) -> None:
        """Start the server on its port (again, after :meth:`stop` with ``remove=False`` or :meth:`kill`)."""
        self._write_settings()
        deadline = time.monotonic() + timeout
        while True:
            logged = self.log_path.stat().st_size if self.log_path.exists() else 0
            done = self._pg_ctl("-l", str(self.log_path), "-w", "-t", str(int(timeout)), "start", timeout=timeout)
            if done.returncode == 0 and port_open(self.port):
                logger.info("PostgreSQL started (pid %s) on %s:%s", self.pid, HOST, self.port)
                return
            tail = self._log_tail(logged)
            # After a crash, the old backends hold the shared memory until they notice and exit.
            if "still in use" not in tail or time.monotonic() > deadline:
                raise PostgresUnavailable(f"the server did not start on {HOST}:{self.port}: "
                                          f"{(done.stderr or done.stdout).strip()[-300:]} {tail}".strip())
            time.sleep(0.2)

    def _log_tail(self, since: int = 0) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(since)
                text = log.read().decode(errors="replace").strip()
        except OSError:
            return ""
        return "; its log ends: " + " | ".join(text[-400:].splitlines()) if text else ""

    def stop(self, *, mode: str = "fast", remove: bool | None = None) -> None:
        """Stop the server (``fast``: roll back open transactions and disconnect everyone;
        ``immediate``: a crash, recovered at the next start). A temporary directory is
        removed unless ``remove=False``."""
        if self.pid is not None:
            done = self._pg_ctl("-m", mode, "-w", "stop")
            if done.returncode != 0 and self.pid is not None:
                logger.warning("pg_ctl stop failed (%s); killing the server", done.stderr.strip()[-200:])
                self.kill()
        if remove if remove is not None else self.temporary:
            shutil.rmtree(self.directory, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the postmaster, as a crash would (its backends then exit by themselves;
        :meth:`start` runs crash recovery)."""
        pid = self.pid
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        # What a crashed postmaster leaves behind; its backends notice its death and exit
        # by themselves (the next start waits for them).
        for leftover in (self.data_dir / "postmaster.pid", self.directory / f".s.PGSQL.{self.port}.lock",
                         self.directory / f".s.PGSQL.{self.port}"):
            leftover.unlink(missing_ok=True)

    def restart(self, *, mode: str = "fast", timeout: float = 60.0) -> None:
        """Stop (``fast`` or ``immediate``) and start again on the same port and data."""
        self.stop(mode=mode, remove=False)
        self.start(timeout)

    def __enter__(self) -> PostgresServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie until init reaps it: dead all the same
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def _initdb(bin_dir: Path, data_dir: Path, user: str | None) -> None:
    done = subprocess.run([str(bin_dir / "initdb"), "-D", str(data_dir), "-A", "trust", "-U", _ROLE, "-E", "UTF8",
                           "--locale=C", "--no-sync"], capture_output=True, text=True, timeout=300, user=user,
                          cwd=data_dir.parent, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise PostgresUnavailable(f"initdb failed: {(done.stderr or done.stdout).strip()[-400:]}")
    with (data_dir / "postgresql.conf").open("a") as conf:
        conf.write(f"\n{_INCLUDE}\n")


def start_postgres(*, port: int = 0, location: str | os.PathLike | None = None,
                   settings: dict[str, Any] | None = None, timeout: float = 60.0) -> PostgresServer:
    """Start a server on 127.0.0.1: on ``port`` (0: a free one), with its cluster in
    ``location`` (made with ``initdb`` when empty, reused otherwise; default: a temporary
    directory removed when it stops) and ``settings`` (``postgresql.conf`` names, such as
    ``{"fsync": "off"}``). Waits until it accepts connections.

    Raises :class:`PostgresUnavailable` saying why: binaries missing (with the package
    to install), initdb failed, or the server did not start (with its log's last lines).

    Example::

        with start_postgres() as server:
            print(server.dsn)   # postgresql://postgres@127.0.0.1:54321/postgres
    """
    bin_dir = find_postgres_bin()
    if bin_dir is None:
        where = f" in $POSTGRES_BIN ({os.environ['POSTGRES_BIN']})" if os.environ.get("POSTGRES_BIN") else ""
        raise PostgresUnavailable(f"the PostgreSQL server binaries (initdb, pg_ctl) were not found{where}: install "
                                  f"them with `{INSTALL_HINT}`, or set POSTGRES_BIN to their directory")
    user = _server_user()
    temporary = location is None
    directory = Path(tempfile.mkdtemp(prefix="eventprocessor-postgres-") if temporary else location)  # type: ignore
    directory.mkdir(parents=True, exist_ok=True)
    _chown(directory, user)
    if user is not None and subprocess.run(["test", "-w", str(directory)], user=user).returncode != 0:
        raise PostgresUnavailable(
            f"the server runs as the '{user}' system user (initdb refuses root), and {directory} is out of its "
            "reach (a parent directory is closed to it): choose a location it can reach, such as one under /tmp")
    values = {name: str(value) for name, value in (settings or {}).items()}
    try:
        if not (directory / "data" / "PG_VERSION").exists():
            (directory / "data").mkdir(exist_ok=True)
            _chown(directory / "data", user)
            _initdb(bin_dir, directory / "data", user)
        last: PostgresUnavailable | None = None
        for _attempt in range(3):  # a free port can be taken between picking it and binding it
            server = PostgresServer(port or free_ports(1)[0], directory, bin_dir, user, temporary, values)
            try:
                server.start(timeout)
                return server
            except PostgresUnavailable as error:
                last = error
                if port:
                    break
        assert last is not None
        raise last
    except BaseException:
        if temporary:
            shutil.rmtree(directory, ignore_errors=True)
        raise
