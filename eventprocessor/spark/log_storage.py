"""Where the Spark sink's commit log keeps its entries: files (on one machine) or the
checkpoint store (shared by every processor, no shared disk)."""
from __future__ import annotations

import abc
import asyncio
import builtins
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..stores.contract import CheckpointStore


class LogStorage(abc.ABC):
    """Where a :class:`CommitLog` keeps its entries: named, immutable byte strings with
    a real create-if-absent. ``description`` names the place in messages (no secrets)."""

    description: str = "?"

    @abc.abstractmethod
    async def create(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` unless it exists. True when this call made it."""

    @abc.abstractmethod
    async def read(self, name: str) -> bytes | None:
        """The data of ``name``, or ``None``."""

    @abc.abstractmethod
    async def list(self, prefix: str = "") -> builtins.list[str]:
        """The names starting with ``prefix``, sorted."""

    @abc.abstractmethod
    async def delete(self, name: str) -> None:
        """Delete ``name`` if it exists."""


class FileLogStorage(LogStorage):
    """Entries as files of one directory on a POSIX file system (see the module
    docstring). Blocking calls run in worker threads."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = Path(directory)
        self.description = f"directory {self.directory}"
        self._made = False

    def _ensure(self) -> None:
        if not self._made:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._made = True

    def _create(self, name: str, data: bytes) -> bool:
        self._ensure()
        temp = self.directory / f".tmp-{uuid.uuid4().hex}"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(temp, self.directory / name)
            won = True
        except FileExistsError:
            won = False
        finally:
            os.unlink(temp)
        fsync_directory(self.directory)
        return won

    def _read(self, name: str) -> bytes | None:
        try:
            return (self.directory / name).read_bytes()
        except FileNotFoundError:
            return None

    def _list(self, prefix: str) -> builtins.list[str]:
        if not self.directory.is_dir():
            return []
        return sorted(p.name for p in self.directory.iterdir() if p.name.startswith(prefix)
                      and not p.name.startswith(".tmp-"))

    def _delete(self, name: str) -> None:
        try:
            os.unlink(self.directory / name)
        except FileNotFoundError:
            pass

    async def create(self, name: str, data: bytes) -> bool:
        return await asyncio.to_thread(self._create, name, data)

    async def read(self, name: str) -> bytes | None:
        return await asyncio.to_thread(self._read, name)

    async def list(self, prefix: str = "") -> builtins.list[str]:
        return await asyncio.to_thread(self._list, prefix)

    async def delete(self, name: str) -> None:
        await asyncio.to_thread(self._delete, name)


class StoreLogStorage(LogStorage):
    """Entries of log ``log_name`` of one consumer group in a checkpoint store (its
    ``create_entry`` / ``read_entry`` / ``list_entries`` / ``delete_entry``)."""

    def __init__(self, store: CheckpointStore, log_name: str, *, fully_qualified_namespace: str,
                 eventhub_name: str, consumer_group: str) -> None:
        self.store = store
        self.log_name = log_name
        self._scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        self.description = f"log {log_name!r} of {eventhub_name}/{consumer_group} in {type(store).__name__}"

    async def create(self, name: str, data: bytes) -> bool:
        return await self.store.create_entry(*self._scope, self.log_name, name, data)

    async def read(self, name: str) -> bytes | None:
        return await self.store.read_entry(*self._scope, self.log_name, name)

    async def list(self, prefix: str = "") -> builtins.list[str]:
        return await self.store.list_entries(*self._scope, self.log_name, prefix)

    async def delete(self, name: str) -> None:
        await self.store.delete_entry(*self._scope, self.log_name, name)


def fsync_directory(directory: str | os.PathLike) -> None:
    """Make the entries of ``directory`` (files created, linked or renamed into it)
    durable. A no-op where directories cannot be opened (not POSIX)."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
