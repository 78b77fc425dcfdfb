"""A real Spark cluster on loopback from the pip ``pyspark`` package: a standalone
master, one worker and a Spark Connect server, for tests, benchmarks and samples.

Nothing is downloaded: the package ships ``bin/spark-class`` and ``bin/spark-submit``
and the jars (Spark Connect included). Each piece is a JVM started in a session of its
own, so it is stopped with its whole process group (``spark-submit`` is a shell whose JVM
is a child; a worker's executors are its children). Every port is a free port on
127.0.0.1; logs, pid files, the worker's directory and scratch space are under one
temporary directory that :meth:`SparkCluster.stop` removes.

Readiness comes from the logs: the master is up at ``elected leader``, the worker at
``Successfully registered with master``, Spark Connect at ``Spark Connect server
started``. The master starts first; the worker and the Connect server then start side
by side.

Sizing: standalone mode gives every application executors of its own, and an executor
needs at least one core of a worker. The default worker offers 3 cores and 2 GB, so
that the Connect server's application (capped at 1 core, 512 MB) and two more
applications of 1 core and 512 MB (two processor processes, each its own driver) run at
once; an application with Spark's defaults (every free core, 1 GB) gets the other 2
cores. The cores are slots, not CPUs: on a 2-CPU machine they share the 2 CPUs.

Executors run Python only for Python UDFs (and ``foreachBatch`` of Spark's own
streaming); the Python they run is ``PYSPARK_PYTHON`` of the driver (classic) or of the
Connect server (Connect). This module sets it to the running interpreter for the worker
and the Connect server.

Example::

    with start_spark_cluster() as cluster:
        spark = SparkSession.builder.remote(cluster.connect_url).getOrCreate()
        classic = SparkSession.builder.master(cluster.master_url).getOrCreate()

Run ``python -m eventprocessor.emulators.spark_cluster`` to start one and print its URLs; Ctrl-C stops it.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_ports

__all__ = ["SparkCluster", "SparkClusterUnavailable", "start_spark_cluster", "find_spark_home",
           "CONNECT_APP_CONF", "ConnectServer"]

logger = logging.getLogger(__name__)

_HOST = "127.0.0.1"

CONNECT_APP_CONF: Mapping[str, str] = {
    "spark.cores.max": "1",
    "spark.executor.memory": "512m",
}
"""What the Connect server's application takes of the worker."""

_READY = {
    "master": "elected leader",
    "worker": "Successfully registered with master",
    "connect": "Spark Connect server started",
}


class SparkClusterUnavailable(RuntimeError):
    """Java or Spark is missing, or a piece did not start; the message says why and
    holds the end of that piece's log."""


def find_spark_home() -> Path:
    """The Spark distribution inside the installed ``pyspark`` package (or ``$SPARK_HOME``)."""
    env = os.environ.get("SPARK_HOME")
    if env and (Path(env) / "bin" / "spark-class").exists():
        return Path(env)
    try:
        import pyspark
    except ImportError as error:
        raise SparkClusterUnavailable("pyspark is not installed (pip install -e '.[spark]')") from error
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise SparkClusterUnavailable(f"{home} has no bin/spark-class: this pyspark package cannot run a cluster")
    return home


def _java_ok() -> bool:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return True
    return shutil.which("java") is not None


@dataclass
class _Piece:
    name: str
    process: subprocess.Popen
    log: Path
    ready_marker: str = ""

    def tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def ready(self) -> bool:
        try:
            return (self.ready_marker or _READY[self.name]) in self.log.read_text(errors="replace")
        except OSError:
            return False

    def stop(self, timeout: float) -> None:
        """SIGTERM to the process group, SIGKILL to it after ``timeout``."""
        try:
            group = os.getpgid(self.process.pid)
        except ProcessLookupError:
            self.process.poll()
            return
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(group, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not _group_alive(group):
                    break
                time.sleep(0.1)
            else:
                continue
            break
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # Zombies count as gone: reap our own child if it is one.
    return not _only_zombies(group)


def _only_zombies(group: int) -> bool:
    proc = Path("/proc")
    if not proc.is_dir():
        return False
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, pgrp = fields[0], int(fields[2])
        if pgrp == group and state != "Z":
            return False
    return True


@dataclass
class SparkCluster:
    """A running standalone master, worker and (optionally) Spark Connect server."""

    master_url: str
    connect_url: str | None
    directory: Path
    worker_cores: int
    worker_memory: str
    pieces: list[_Piece] = field(default_factory=list, repr=False)
    keep_directory: bool = False
    python: str = ""

    @property
    def pids(self) -> dict[str, int]:
        return {piece.name: piece.process.pid for piece in self.pieces}

    def log(self, name: str) -> str:
        """The log of ``master``, ``worker`` or ``connect`` so far."""
        for piece in self.pieces:
            if piece.name == name:
                return piece.tail(1_000_000)
        raise KeyError(name)

    def start_connect_server(self, name: str, *, conf: Mapping[str, str] | None = None,
                             timeout: float = 120.0) -> ConnectServer:
        """One more Spark Connect server on this cluster's master, in a process group of
        its own (an application of its own, sized like the first: ``CONNECT_APP_CONF``).
        It is a separate driver: a test can SIGKILL it (:meth:`ConnectServer.kill`)
        without touching the cluster's own server. :meth:`stop` stops it too.

        Example::

            server = cluster.start_connect_server("driver-1")
            spark = SparkSession.builder.remote(server.url).getOrCreate()
        """
        if any(piece.name == name for piece in self.pieces):
            raise ValueError(f"a piece named {name!r} already runs on this cluster")
        env = _environment(find_spark_home(), self.directory, self.python or sys.executable)
        [port] = free_ports(1)
        piece = _launch_connect(find_spark_home(), env, self.directory, self.master_url, port, conf, name)
        self.pieces.append(piece)
        try:
            _wait([piece], time.monotonic() + timeout)
        except BaseException:
            piece.stop(5.0)
            raise
        return ConnectServer(f"sc://{_HOST}:{port}", piece)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every piece by process group (Connect, worker, master), then remove the
        directory. Safe to call twice."""
        for piece in reversed(self.pieces):
            piece.stop(timeout)
        self.pieces.clear()
        if not self.keep_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> SparkCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class ConnectServer:
    """A Spark Connect server started by :meth:`SparkCluster.start_connect_server`."""

    url: str
    piece: _Piece = field(repr=False)

    @property
    def pid(self) -> int:
        return self.piece.process.pid

    def kill(self) -> None:
        """SIGKILL the server's whole process group (the driver dies at once), and reap it."""
        try:
            os.killpg(os.getpgid(self.piece.process.pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.piece.process.wait(timeout=30)

    def stop(self, timeout: float = 15.0) -> None:
        self.piece.stop(timeout)

    def log(self) -> str:
        return self.piece.tail(1_000_000)


def _environment(home: Path, directory: Path, python: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "PYSPARK_SUBMIT_ARGS", "MASTER"):
        env.pop(name, None)
    env.update({
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": _HOST,
        "SPARK_LOG_DIR": str(directory / "logs"),
        "SPARK_PID_DIR": str(directory / "pids"),
        "SPARK_WORKER_DIR": str(directory / "work"),
        "SPARK_LOCAL_DIRS": str(directory / "local"),
        "SPARK_CONF_DIR": str(directory / "conf"),
        "PYSPARK_PYTHON": python,
        "PYSPARK_DRIVER_PYTHON": python,
        # The master's REST submission server is not needed (and would take port 6066).
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
    })
    for name in ("logs", "pids", "work", "local", "conf"):
        (directory / name).mkdir(parents=True, exist_ok=True)
    return env


def _launch(name: str, args: Sequence[str], env: Mapping[str, str], directory: Path, *, ready: str = "") -> _Piece:
    log = directory / "logs" / f"{name}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(list(args), stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=dict(env), cwd=str(directory), start_new_session=True)
    logger.info("Spark %s starting (pid %s), log %s", name, process.pid, log)
    return _Piece(name, process, log, ready)


def _wait(pieces: Sequence[_Piece], deadline: float) -> None:
    waiting = list(pieces)
    while waiting:
        for piece in list(waiting):
            if piece.ready():
                logger.info("Spark %s is ready", piece.name)
                waiting.remove(piece)
            elif piece.process.poll() is not None:
                raise SparkClusterUnavailable(
                    f"the Spark {piece.name} exited with code {piece.process.returncode}; its log ends:\n"
                    f"{piece.tail()}")
        if waiting and time.monotonic() > deadline:
            names = ", ".join(p.name for p in waiting)
            raise SparkClusterUnavailable(
                f"the Spark {names} did not get ready in time; the log of the {waiting[0].name} ends:\n"
                f"{waiting[0].tail()}")
        if waiting:
            time.sleep(0.2)


def _launch_connect(home: Path, env: Mapping[str, str], workdir: Path, master_url: str, port: int,
                    connect_conf: Mapping[str, str] | None, name: str = "connect") -> _Piece:
    conf = {
        "spark.connect.grpc.binding.address": _HOST,
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": _HOST,
        "spark.driver.bindAddress": _HOST,
        "spark.ui.enabled": "false",
        "spark.sql.session.timeZone": "UTC",
        **CONNECT_APP_CONF,
        **dict(connect_conf or {}),
    }
    args = [str(home / "bin" / "spark-submit"), "--class", "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--name", f"Spark Connect server ({name})", "--master", master_url]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args.append("spark-internal")
    return _launch(name, args, env, workdir, ready=_READY["connect"])


def start_spark_cluster(*, connect: bool = True, worker_cores: int = 3, worker_memory: str = "2g",
                        connect_conf: Mapping[str, str] | None = None, timeout: float = 180.0,
                        directory: Path | None = None, python: str | None = None, master_port: int = 0,
                        connect_port: int = 0) -> SparkCluster:
    """Start a master, one worker and (with ``connect``) a Spark Connect server on
    loopback, and wait until each is ready (see the module docstring). The master and
    the Connect server listen on ``master_port`` and ``connect_port``, or on free ports
    (0, the default; every other port is a free one).

    Raises :class:`SparkClusterUnavailable` when Java or the pyspark package is
    missing, or a piece exits or is not ready within ``timeout`` seconds (whatever
    was started is stopped first).
    """
    if not _java_ok():
        raise SparkClusterUnavailable("Java is not installed (Spark needs Java 17 or later on PATH or JAVA_HOME)")
    home = find_spark_home()
    owned_directory = directory is None
    workdir = Path(tempfile.mkdtemp(prefix="spark-cluster-")) if directory is None else Path(directory)
    env = _environment(home, workdir, python or sys.executable)
    free = iter(free_ports(5))
    master_port, master_ui, worker_port, worker_ui, connect_port = (
        port or next(free) for port in (master_port, 0, 0, 0, connect_port))
    master_url = f"spark://{_HOST}:{master_port}"
    cluster = SparkCluster(master_url=master_url, connect_url=None, directory=workdir, worker_cores=worker_cores,
                           worker_memory=worker_memory, keep_directory=not owned_directory,
                           python=python or sys.executable)
    spark_class = str(home / "bin" / "spark-class")
    deadline = time.monotonic() + timeout
    try:
        cluster.pieces.append(_launch("master", [
            spark_class, "org.apache.spark.deploy.master.Master", "--host", _HOST, "--port", str(master_port),
            "--webui-port", str(master_ui)], env, workdir))
        _wait(cluster.pieces, deadline)
        starting = [_launch("worker", [
            spark_class, "org.apache.spark.deploy.worker.Worker", master_url, "--host", _HOST,
            "--port", str(worker_port), "--webui-port", str(worker_ui), "--cores", str(worker_cores),
            "--memory", worker_memory, "--work-dir", str(workdir / "work")], env, workdir)]
        if connect:
            starting.append(_launch_connect(home, env, workdir, master_url, connect_port, connect_conf))
        cluster.pieces.extend(starting)
        _wait(starting, deadline)
    except BaseException:
        cluster.stop()
        raise
    if connect:
        cluster.connect_url = f"sc://{_HOST}:{connect_port}"
    logger.info("Spark cluster ready: master %s, Connect %s", cluster.master_url, cluster.connect_url)
    return cluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m eventprocessor.emulators.spark_cluster",
        description=" ".join(__doc__.split("\n\n")[0].split()).replace("``", "`") + " It prints their URLs and "
                    "runs until Ctrl-C or SIGTERM, which stop the whole cluster.")
    parser.add_argument("--no-connect", action="store_true", help="Start no Spark Connect server.")
    parser.add_argument("--worker-cores", type=int, default=3,
                        help="Cores the worker offers (slots, not CPUs). [default: %(default)s]")
    parser.add_argument("--worker-memory", default="2g", help="Memory the worker offers. [default: %(default)s]")
    parser.add_argument("--master-port", type=int, default=7077,
                        help="The master's port, Spark's usual one; 0 picks a free one. [default: %(default)s]")
    parser.add_argument("--connect-port", type=int, default=15002,
                        help="The Spark Connect server's port, Spark's usual one; 0 picks a free one. "
                             "[default: %(default)s]")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # start_spark_cluster stops what it started on the way out

    # Python dies of a SIGTERM without unwinding: while the cluster starts, the signal
    # becomes an exception, so the pieces already started do not outlive the command.
    signal.signal(signal.SIGTERM, interrupt)
    try:
        cluster = start_spark_cluster(connect=not args.no_connect, worker_cores=args.worker_cores,
                                      worker_memory=args.worker_memory, master_port=args.master_port,
                                      connect_port=args.connect_port)
    except SparkClusterUnavailable as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    print(f"master  {cluster.master_url}")
    if cluster.connect_url:
        print(f"connect {cluster.connect_url}")
    print(f"logs    {cluster.directory / 'logs'}  (Ctrl-C stops the cluster)", flush=True)
    stop = False

    def on_signal(_signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        while not stop:
            time.sleep(0.5)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
