"""The commit log's snapshots and retention (the rules are in
:mod:`~eventprocessor.spark.commit_log`'s docstring, "Compaction and retention").

Every ``compact_every`` versions the appender writes ``snapshot-<version>``, the whole
:class:`~eventprocessor.spark.log_state.LogState` as of that version; readers start from
the newest snapshot. Entries and older snapshots below a snapshot are deleted once this
process has known that snapshot for ``retention`` seconds (on its monotonic clock, so
wall-clock skew does not matter).

Example::

    snapshots = LogSnapshots(storage, scope=("ns", "hub", "$default"), retention=900.0, compact_every=100,
                             clock=time.monotonic)
    newest = await snapshots.newest()        # None: no snapshot yet
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from .log_records import _DIGITS, FORMAT, SNAPSHOT_PREFIX
from .log_state import LogState
from .log_storage import LogStorage

__all__ = ["LogSnapshots", "snapshot_name"]

logger = logging.getLogger(__name__)


def snapshot_name(version: int) -> str:
    return f"{SNAPSHOT_PREFIX}{version:0{_DIGITS}d}"


def _version_of(name: str) -> int | None:
    """The version an entry or snapshot name stands for (None: neither)."""
    if name.startswith(SNAPSHOT_PREFIX):
        text = name[len(SNAPSHOT_PREFIX):]
        return int(text) if text.isdigit() else None
    return int(name) if name.isdigit() else None


class LogSnapshots:
    """The snapshots of one commit log that this process knows, when it first saw
    each, and the compaction in progress (at most one)."""

    def __init__(self, storage: LogStorage, *, scope: tuple[str, str, str], retention: float, compact_every: int,
                 clock: Callable[[], float]) -> None:
        self.storage = storage
        self.scope = scope
        self.retention = retention
        self.compact_every = compact_every
        self._clock = clock
        self.version = 0  # the newest snapshot known (0: none)
        self.seen: dict[int, float] = {}
        self._cleanup: asyncio.Task[None] | None = None

    async def newest(self) -> int | None:
        """List the snapshots (remembering when each was first seen): the newest
        version, or None when there is none."""
        now = self._clock()
        versions = [v for v in map(_version_of, await self.storage.list(SNAPSHOT_PREFIX)) if v is not None]
        for version in versions:
            self.seen.setdefault(version, now)
        if not versions:
            return None
        self.version = max(self.version, *versions)
        return max(versions)

    def maybe_compact(self, state: LogState) -> None:
        """Start writing a snapshot of ``state`` when ``compact_every`` versions were
        appended since the last one (and no compaction is running)."""
        if state.next_version - self.version < self.compact_every:
            return
        if self._cleanup is not None and not self._cleanup.done():
            return
        copy = LogState.from_json(state.to_json())  # as of now
        self.version = copy.next_version
        self._cleanup = asyncio.get_running_loop().create_task(self._compact(copy), name="spark-commit-log-compaction")

    async def _compact(self, state: LogState) -> None:
        """Write a snapshot of ``state``, then delete what retention allows."""
        try:
            # Outcomes of batches planned before the previous snapshot are not needed any more.
            previous = max([v for v in self.seen if v < state.next_version], default=0)
            state.outcomes = {b: o for b, o in state.outcomes.items() if b >= previous}
            snapshot = {"type": "snapshot", "state": state.to_json(), "scope": list(self.scope), "format": FORMAT}
            name = snapshot_name(state.next_version)
            await self.storage.create(name, json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode())
            self.seen.setdefault(state.next_version, self._clock())
            logger.debug("commit log %s: snapshot at version %d", self.storage.description, state.next_version)
            await self.delete_expired()
        except Exception as error:  # compaction is best effort: the next one tries again
            logger.warning("commit log %s: compaction failed: %r", self.storage.description, error)

    async def delete_expired(self) -> int:
        """Delete entries and snapshots below the newest snapshot this process has known
        for ``retention`` seconds. Returns how many names it deleted."""
        now = self._clock()
        old = [v for v, seen in self.seen.items() if now - seen >= self.retention]
        if not old:
            return 0
        horizon = max(old)
        deleted = 0
        for name in await self.storage.list():
            version = _version_of(name)
            if version is not None and version < horizon:
                await self.storage.delete(name)
                deleted += 1
        for version in [v for v in self.seen if v < horizon]:
            del self.seen[version]
        if deleted:
            logger.info("commit log %s: deleted %d entries below version %d (retention %.0f s)",
                        self.storage.description, deleted, horizon, self.retention)
        return deleted

    async def aclose(self) -> None:
        """Wait for a compaction in progress."""
        task, self._cleanup = self._cleanup, None
        if task is not None:
            try:
                await task
            except asyncio.CancelledError:
                pass
