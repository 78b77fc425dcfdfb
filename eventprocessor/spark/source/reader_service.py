"""The executor's reader processes: where the eventhubs source's receivers live.

Spark runs each task of a micro-batch in one of the executor's Python workers, and
which worker gets a partition's task changes from batch to batch. A receiver kept in a
worker would serve its partition's next task only when that task happens to land on
the same worker, and reading ahead there would be wasted as often. So the receivers
live in reader processes beside the workers instead: one per CPU of the machine (up to
the partitions read), each owning the partitions ``p`` with ``p mod n`` its number, each
with a :class:`~eventprocessor.spark.source.executor.ReaderPool` whose readers receive
and decode ahead (:mod:`.readahead`). A task asks its partition's reader process for its
range over a Unix socket and hands the record batches it gets to Spark.

* A reader process is started by the first task that needs it (under a file lock, so
  once per machine) and ends when it has kept no reader and served no task for
  ``IDLE_EXIT`` seconds. It runs in a session of its own, with the worker's Python.
* Its socket is in a directory only this user can open
  (``<tmp>/eventprocessor-spark-<uid>``), named after a digest of the query's
  connection string, consumer group, prefetch and owner level: queries of other hubs or
  credentials get reader processes of their own. Connection strings go over the socket
  with each request, never on a command line.
* Frames: the request is one JSON line; the answer is frames of a kind byte and a
  4-byte length: ``B`` a record batch (Arrow IPC), ``E`` an error (JSON: its type,
  message and reason), ``D`` done.

Example::

    for batch in service_read_range(options, ReadRange("0", 100, 200)):
        ...
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import pyarrow as pa

from ...errors import EventSourceError
from .executor import ReaderPool
from .offsets import DataLossError, ReadRange
from .options import SourceOptions
from .rows import ARROW_SCHEMA

__all__ = ["service_available", "service_read_range", "service_prepare", "service_call", "socket_path", "main",
           "IDLE_EXIT"]

logger = logging.getLogger(__name__)

IDLE_EXIT = 20.0
"""Seconds a reader process with no reader kept and no task served waits before it ends."""

_START_SECONDS = 30.0  # how long a task waits for a reader process it started
_HEADER = struct.Struct("!cI")
_REQUEST_FIELDS = ("connection_string", "fully_qualified_namespace", "eventhub_name", "consumer_group",
                   "fail_on_data_loss", "receiver_timeout", "operation_timeout", "prefetch_count",
                   "exclusive_receiver")
_ERRORS = {"EventSourceError": EventSourceError, "DataLossError": DataLossError}


def service_available() -> bool:
    return hasattr(socket, "AF_UNIX") and hasattr(os, "getuid")


def _shards() -> int:
    return max(1, os.cpu_count() or 1)


def _shard(partition_id: str, shards: int) -> int:
    if partition_id.isdigit():
        return int(partition_id) % shards
    return int(hashlib.sha256(partition_id.encode()).hexdigest(), 16) % shards


def _directory() -> Path:
    base = Path(tempfile.gettempdir())
    if len(str(base)) > 60:  # a Unix socket path holds about 100 bytes
        base = Path("/tmp")
    directory = base / f"eventprocessor-spark-{os.getuid()}"
    directory.mkdir(mode=0o700, exist_ok=True)
    if directory.stat().st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user")
    return directory


def socket_path(options: SourceOptions, partition_id: str) -> Path:
    """The socket of the reader process that serves ``partition_id`` of this query's hub."""
    digest = hashlib.sha256("\0".join(map(str, (options.connection_string, options.consumer_group,
                                                options.prefetch_count, options.exclusive_receiver))).encode())
    shards = _shards()
    return _directory() / f"{digest.hexdigest()[:20]}-{_shard(partition_id, shards)}-of-{shards}.sock"


# ----------------------------------------------------------------------------- a task's side


def _connect(path: Path) -> socket.socket | None:
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(str(path))
        return connection
    except OSError:
        connection.close()
        return None


def _connect_or_start(path: Path) -> socket.socket:
    import fcntl  # POSIX only, like the Unix socket

    connection = _connect(path)
    if connection is not None:
        return connection
    with open(f"{path}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        connection = _connect(path)
        if connection is not None:
            return connection
        path.unlink(missing_ok=True)
        log = open(f"{path}.log", "ab")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        subprocess.Popen([sys.executable, "-m", "eventprocessor.spark.source.reader_service", "--socket", str(path)],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True, env=env)
        log.close()
        deadline = time.monotonic() + _START_SECONDS
        while time.monotonic() < deadline:
            connection = _connect(path)
            if connection is not None:
                return connection
            time.sleep(0.02)
    raise EventSourceError(f"the eventhubs source's reader process did not start within {_START_SECONDS:g} s; see "
                           f"{path}.log", reason="refused")


def _read_exactly(stream: Any, size: int) -> bytes:
    data = stream.read(size)
    if data is None or len(data) != size:
        raise EOFError("the reader process closed the connection")
    return data


def _options_fields(options: SourceOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in _REQUEST_FIELDS}


def service_prepare(options: SourceOptions, reads: list[ReadRange]) -> None:
    """Have the reader processes of ``reads`` receive them ahead of the task's reads
    (started if needed; each answers at once)."""
    by_path: dict[Path, list[ReadRange]] = {}
    for read in reads:
        by_path.setdefault(socket_path(options, read.partition_id), []).append(read)
    for path, mine in by_path.items():
        with _connect_or_start(path) as connection, connection.makefile("rb") as stream:
            request = {"options": _options_fields(options), "prepare": [asdict(r) for r in mine]}
            connection.sendall(json.dumps(request).encode() + b"\n")
            _read_exactly(stream, _HEADER.size)


def service_read_range(options: SourceOptions, read: ReadRange) -> Iterator[pa.RecordBatch]:
    """One task's range from its partition's reader process (started if needed)."""
    request = {"options": _options_fields(options), "read": asdict(read)}
    connection = _connect_or_start(socket_path(options, read.partition_id))
    with connection, connection.makefile("rb") as stream:
        connection.sendall(json.dumps(request).encode() + b"\n")
        while True:
            try:
                kind, size = _HEADER.unpack(_read_exactly(stream, _HEADER.size))
                payload = _read_exactly(stream, size)
            except EOFError:
                raise EventSourceError(
                    f"partition {read.partition_id} of {options.eventhub_name!r}: the reader process ended while "
                    "serving this task (Spark runs the task again)", reason="disconnected") from None
            if kind == b"B":
                yield pa.ipc.read_record_batch(pa.py_buffer(payload), ARROW_SCHEMA)
            elif kind == b"D":
                return
            else:
                error = json.loads(payload)
                raise _ERRORS.get(error["type"], EventSourceError)(
                    error["message"], fully_qualified_namespace=options.fully_qualified_namespace,
                    eventhub_name=options.eventhub_name, reason=error.get("reason") or "refused")


def service_call(options: SourceOptions, partition_id: str, command: str) -> dict[str, Any] | None:
    """Ask the reader process of ``partition_id`` (if one runs) for its ``"stats"``
    (readers opened and reused, events received ahead and dropped), or to ``"stop"``.
    None when none runs."""
    connection = _connect(socket_path(options, partition_id))
    if connection is None:
        return None
    with connection, connection.makefile("rb") as stream:
        connection.sendall(json.dumps({command: True}).encode() + b"\n")
        kind, size = _HEADER.unpack(_read_exactly(stream, _HEADER.size))
        return json.loads(_read_exactly(stream, size)) if size else {}


# ----------------------------------------------------------------------------- the reader process


class _Service:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.pool = ReaderPool()
        self.serving = 0
        self.last_served = time.monotonic()
        self.stopping = False
        self._options: dict[str, SourceOptions] = {}

    def options(self, fields_: dict[str, Any]) -> SourceOptions:
        text = json.dumps(fields_, sort_keys=True)
        options = self._options.get(text)
        if options is None:
            known = {f.name for f in fields(SourceOptions)}
            options = self._options[text] = SourceOptions(**{k: v for k, v in fields_.items() if k in known})
        return options

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.serving += 1
        try:
            request = json.loads(await reader.readline())
            if "stats" in request or "stop" in request:
                await self._answer(request, writer)
                return
            options = self.options(request["options"])
            if "prepare" in request:
                for read in request["prepare"]:
                    self.pool.prepare(options, ReadRange(**read))
                writer.write(_HEADER.pack(b"D", 0))
                await writer.drain()
                return
            read = ReadRange(**request["read"])
            try:
                async for batch in self.pool.read(options, read):
                    payload = batch.serialize()
                    writer.write(_HEADER.pack(b"B", payload.size))
                    writer.write(memoryview(payload))
                    await writer.drain()
                writer.write(_HEADER.pack(b"D", 0))
            except (ConnectionError, asyncio.CancelledError):
                raise
            except Exception as error:
                detail = json.dumps({"type": type(error).__name__, "message": str(error),
                                     "reason": getattr(error, "reason", None)}).encode()
                writer.write(_HEADER.pack(b"E", len(detail)) + detail)
            await writer.drain()
        except ConnectionError:
            logger.info("a task stopped reading its range (cancelled?)")
        finally:
            self.serving -= 1
            self.last_served = time.monotonic()
            writer.close()

    async def _answer(self, request: dict[str, Any], writer: asyncio.StreamWriter) -> None:
        pool = self.pool
        readers = [r for rs in pool._kept.values() for r in rs]
        stats = json.dumps({"opened": pool.opened, "reused": pool.reused, "kept": pool.kept(),
                            "received": sum(r.received for r in readers),
                            "dropped": sum(r.dropped for r in readers)}).encode()
        writer.write(_HEADER.pack(b"D", len(stats)) + stats)
        await writer.drain()
        if "stop" in request:
            self.stopping = True

    async def run(self) -> None:
        server = await asyncio.start_unix_server(self.handle, path=str(self.path))
        os.chmod(self.path, 0o600)
        async with server:
            while not self.stopping and (self.serving or self.pool.kept()
                                         or time.monotonic() - self.last_served < IDLE_EXIT):
                await asyncio.sleep(0.25)
        await self.pool.close()
        self.path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eventprocessor.spark.source.reader_service",
                                     description="An executor's reader process for the eventhubs source.")
    parser.add_argument("--socket", required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    asyncio.run(_Service(Path(args.socket)).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
