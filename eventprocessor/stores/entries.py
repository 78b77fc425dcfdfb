"""Log entries: named, immutable entries in named logs of a consumer group (the Spark
sink's commit log, a partition's state), each created at most once (see
:class:`~eventprocessor.stores.contract.EntryLog`)."""
from __future__ import annotations

from typing import Any

from ..errors import ConfigurationError
from .backend import Kind, RecordExists, Scope
from .calls import ProtocolCalls
from .codec import check_encoded, decode_name, encode_name
from .records import MAX_ENTRY_BYTES

__all__ = ["EntryProtocol"]


class EntryProtocol(ProtocolCalls):
    """Creates, reads, lists and deletes log entries."""

    def _log(self, namespace: Any, eventhub: Any, consumer_group: Any, log_name: Any) -> tuple[Scope, Kind]:
        scope = self._scope(namespace, eventhub, consumer_group)
        return scope, Kind("entry", check_encoded(log_name, "log_name"))

    async def create_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str, data: bytes) -> bool:
        """Create entry ``entry_name`` of log ``log_name`` holding ``data``, only if it
        does not exist; False (nothing changed) when it does. At most
        ``MAX_ENTRY_BYTES`` of data.

        Example::

            if not await store.create_entry("ns", "hub", "$default", "commits", "000000000042", payload):
                ...  # another writer committed version 42 first
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        key = check_encoded(entry_name, "entry_name")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise ConfigurationError(f"data of entry {entry_name!r} must be bytes, got {type(data).__name__}")
        body = bytes(data)
        if len(body) > MAX_ENTRY_BYTES:
            raise ConfigurationError(f"entry {entry_name!r} of log {log_name!r} holds {len(body)} bytes; entries "
                                     f"hold at most {MAX_ENTRY_BYTES}")

        async def create() -> bool:
            try:
                await self._write(kind, scope, key, {}, None, body)
            except RecordExists:
                return False
            return True

        return await self._bounded(f"creating entry {entry_name!r} of log {log_name!r}", create())

    async def read_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                         log_name: str, entry_name: str) -> bytes | None:
        """The data of an entry, or ``None`` if it does not exist.

        Example::

            payload = await store.read_entry("ns", "hub", "$default", "commits", "000000000042")
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        key = check_encoded(entry_name, "entry_name")
        record = await self._bounded(f"reading entry {entry_name!r} of log {log_name!r}",
                                     self._backend.read(kind, scope, key, with_data=True))
        return None if record is None else record.data

    async def list_entries(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, prefix: str = "") -> list[str]:
        """The names of the log's entries that start with ``prefix``, sorted.

        Example::

            versions = await store.list_entries("ns", "hub", "$default", "commits")
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        if not isinstance(prefix, str):
            raise ConfigurationError(f"prefix must be a string, got {type(prefix).__name__}")
        listing = await self._bounded(f"listing log {log_name!r}", self._backend.list(kind, scope, encode_name(prefix)))
        self._warn_foreign(listing, "log entry")
        names = []
        for record in listing.records:
            try:
                names.append(decode_name(record.key))
            except ValueError:
                self._warn((record.name, record.etag), "skipping %s in %s: not an entry of log %r", record.name,
                           self._backend.where, log_name)
        return sorted(names)

    async def delete_entry(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                           log_name: str, entry_name: str) -> None:
        """Delete an entry if it exists (compaction).

        Example::

            await store.delete_entry("ns", "hub", "$default", "commits", "000000000001")
        """
        scope, kind = self._log(fully_qualified_namespace, eventhub_name, consumer_group, log_name)
        key = check_encoded(entry_name, "entry_name")
        await self._bounded(f"deleting entry {entry_name!r} of log {log_name!r}",
                            self._backend.delete(kind, scope, key))
