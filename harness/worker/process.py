"""Worker processes seen from their parent: start one, read what it reports, stop or kill it.

:func:`spawn_worker` starts ``python -m harness.worker`` (this SDK's processor,
azure-eventhub's or a floor, one OS process each) and returns a :class:`WorkerHandle`
that reads what it reports: every delivered batch, the partitions it dispatches, its
ownership changes with their reasons, CPU and memory, its state lines.

Example::

    await create_container(azurite_conn, "e2e")
    handle = await spawn_worker("w1", hub=hub, container="e2e", hub_connection_string=hub_conn,
                                storage_connection_string=azurite_conn, log_dir=str(tmp_path))
    try:
        ...
    finally:
        await handle.stop()
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from typing import Any

from .names import HUB_ENV, STORAGE_ENV

__all__ = ["WorkerHandle", "spawn_worker", "create_container"]


class WorkerHandle:
    """A worker process seen from its parent: what it delivered, owns and costs.

    ``deliveries`` maps (partition, sequence number) to how many times it was delivered
    by this worker; ``batches`` every delivered batch as (wall time, partition, first,
    last); ``ownership`` every change of the dispatched set as (wall time, partitions);
    ``changes`` every ownership change the processor logged, with its reason;
    ``published`` the utilisation it published (``--balance-by load``); ``ticks`` the
    processor's load-balancing ticks as of its last ``owned`` line; ``states`` its state
    lines (``--state-every``), with ``owned_set`` the partitions the last one that named
    them dispatched, since ``owned_since``.

    It reads any process that prints the worker's JSON lines (another worker program of
    a test may print just ``started`` and ``owned``): build it over that process and
    start :meth:`read` as a task, as :func:`spawn_worker` does.
    """

    def __init__(self, owner_id: str, process: asyncio.subprocess.Process, stderr_path: str) -> None:
        self.owner_id = owner_id
        self.process = process
        self.stderr_path = stderr_path
        self.started: dict[str, Any] | None = None
        self.owned: list[str] = []
        self.ticks = 0
        self.ownership: list[tuple] = []  # (wall time, partitions dispatched from then on)
        self.changes: list[tuple] = []  # ours: (wall time, partition, reason, epoch) per ownership change
        self.events = 0
        self.cpu = 0.0
        self.stats_at = 0.0
        self.stats: list[tuple] = []  # (wall time, events, CPU seconds, resident bytes or None)
        self.traced: list[dict[str, Any]] = []  # --tracemalloc-at: what grew most, by allocation site
        self.published: list[tuple] = []  # ours, --balance-by load: (wall time, utilisation it published)
        self.slowed: dict[str, Any] | None = None  # the "slowed" line (SIGUSR1 with --slow-factor)
        self.checkpoint_timeouts = 0  # ours: checkpoints that timed out, left to the next one
        self.deliveries: dict[tuple, int] = {}
        self.batches: list[tuple] = []  # (wall time, partition, first, last)
        self.first: dict[str, Any] | None = None
        self.done: dict[str, Any] | None = None
        self.restores: list[dict[str, Any]] = []  # --stateful, --naive: each claim's restored state, in order
        self.checkpoints: list[tuple] = []  # --stateful, --naive: (wall time, partition, sequence number, ms)
        self.states: list[dict[str, Any]] = []  # --state-every: the state lines, "owned" taken out
        self.owned_set: set[str] = set()
        self.owned_since = 0.0  # the state line's time at which ``owned_set`` became what it is
        self.ready = False  # --wait-for-go: set up, waiting for go()
        self.stopped = False
        self.lines: list[str] = []
        self.reader: asyncio.Task[None] | None = None

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    @property
    def last(self) -> dict[str, Any]:
        """The last state line (empty before the first)."""
        return self.states[-1] if self.states else {}

    def at(self, t: float) -> dict[str, Any]:
        """The last state line made at or before ``t`` (or the first one)."""
        found = self.states[0] if self.states else {}
        for state in self.states:
            if state["t"] > t:
                break
            found = state
        return found

    def go(self) -> None:
        """Start a worker spawned with ``wait_for_go=True`` (it said ``ready``)."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")

    async def read(self) -> None:
        assert self.process.stdout is not None
        async for raw in self.process.stdout:
            line = raw.decode(errors="replace").strip()
            if not line:
                continue
            self.lines.append(line)
            del self.lines[:-20]
            try:
                record = json.loads(line)
            except ValueError:
                continue
            kind = record.get("event")
            if kind == "batch":
                span = record["s"]
                numbers = range(span[0], span[1] + 1) if record.get("c") else span
                partition = record["p"]
                for number in numbers:
                    key = (partition, number)
                    self.deliveries[key] = self.deliveries.get(key, 0) + 1
                self.batches.append((record["t"], partition, min(numbers), max(numbers)))
            elif kind == "stats":
                self.events, self.cpu, self.stats_at = record["events"], record["cpu"], record["t"]
                self.stats.append((record["t"], record["events"], record["cpu"], record.get("rss")))
            elif kind == "tracemalloc":
                self.traced.append(record)
            elif kind == "load":
                self.published.append((record["t"], record["u"]))
            elif kind == "slowed":
                self.slowed = record
            elif kind == "checkpoint_timeout":
                self.checkpoint_timeouts += 1
            elif kind == "owned":
                if record["owned"] != self.owned or not self.ownership:  # a heartbeat line changes nothing
                    self.ownership.append((record["t"], record["owned"]))
                self.owned = record["owned"]
                self.ticks = int(record.get("ticks", self.ticks))
            elif kind == "ownership":
                self.changes.append((record["t"], record["p"], record["reason"], record["epoch"]))
            elif kind == "restored":
                self.restores.append(record)
            elif kind == "checkpoint":
                self.checkpoints.append((record["t"], record["p"], record["seq"], record["ms"]))
            elif kind == "state":
                if "owned" in record:
                    self.owned_set = set(record.pop("owned"))
                    self.owned_since = record["t"]
                self.states.append(record)
            elif kind == "ready":
                self.ready = True
            elif kind == "stopped":
                self.stopped = True
            elif kind == "started":
                self.started = record
            elif kind == "first":
                self.first = record
            elif kind == "done":
                self.done = record

    def kill(self) -> None:
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM (a graceful stop that releases ownership), then SIGKILL."""
        if self.process.returncode is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                await asyncio.wait_for(self.process.wait(), timeout)
            except (ProcessLookupError, asyncio.TimeoutError):
                self.kill()
        await self.process.wait()
        if self.reader is not None:
            try:
                await asyncio.wait_for(self.reader, 5)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                self.reader.cancel()

    def diagnostics(self) -> str:
        try:
            with open(self.stderr_path, errors="replace") as handle:
                stderr = handle.read()[-2000:]
        except OSError:
            stderr = ""
        return (f"--- {self.owner_id} (returncode {self.process.returncode})\nstdout tail:\n"
                + "\n".join(self.lines[-5:]) + f"\nstderr tail:\n{stderr}")


async def create_container(storage_connection_string: str, name: str) -> None:
    """Create a blob container for a worker's checkpoint store (the official store does not)."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob.aio import BlobServiceClient

    async with BlobServiceClient.from_connection_string(storage_connection_string) as service:
        try:
            await service.create_container(name)
        except ResourceExistsError:
            pass


async def spawn_worker(owner_id: str, *, hub: str, container: str | None, hub_connection_string: str | None,
                       storage_connection_string: str | None, log_dir: str,
                       extra: list[str] | None = None, wait_for_go: bool = False) -> WorkerHandle:
    """Start ``python -m harness.worker`` with the connection strings in its
    environment (none for ``--source memory``), so that they never show in a process
    listing; ``extra`` are more of its options. Its stderr goes to a file in ``log_dir``.
    ``wait_for_go``: it starts its processor only at :meth:`WorkerHandle.go` (once
    :attr:`~WorkerHandle.ready`), and stops should this process go away.

    Example::

        worker = await spawn_worker("p0", hub=hub, container="checkpoints", hub_connection_string=hub_conn,
                                    storage_connection_string=azurite_conn, log_dir=str(tmp_path),
                                    extra=["--interval", "0.5", "--expiry", "3"])
        ...
        await worker.stop()   # SIGTERM: a graceful stop
    """
    # The directory that holds this package goes first on the child's path, so that it
    # runs this very code (a checkout, a worktree) rather than another installed copy.
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    for name, value in ((HUB_ENV, hub_connection_string), (STORAGE_ENV, storage_connection_string)):
        if value is not None:
            env[name] = value
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    stderr_path = os.path.join(log_dir, f"{owner_id}.stderr")
    restarts = 0
    while os.path.exists(stderr_path):  # the same name started again: keep the earlier log
        restarts += 1
        stderr_path = os.path.join(log_dir, f"{owner_id}.{restarts}.stderr")
    with open(stderr_path, "wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "harness.worker", "--hub", hub,
            *(["--container", container] if container else []), "--owner-id", owner_id, *(extra or []),
            *(["--wait-for-go"] if wait_for_go else []),
            stdin=asyncio.subprocess.PIPE if wait_for_go else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=stderr, env=env, limit=1 << 20)  # state lines name partitions
    handle = WorkerHandle(owner_id, process, stderr_path)
    handle.reader = asyncio.create_task(handle.read())
    return handle
