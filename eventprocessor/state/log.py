"""StateLog: a partition's state in the checkpoint store, as a chain of changes.

Each commit appends one *change* (the keys set or deleted since the previous commit)
named by its version and the epoch of the claim that wrote it, and pointing at the
change before it. The checkpoint record names the head of the chain
(:class:`~eventprocessor.stores.records.StateRef`), and it is written after the change, fenced
by the claim's epoch like every checkpoint. So:

* the state restored for a checkpoint is exactly the chain that ends at its head: a
  change whose checkpoint was never written (a crash, a lost claim) is not on any chain
  and is ignored, and a zombie's changes can never be named by a checkpoint;
* a commit writes what changed, not the whole state.

From time to time (every ``snapshot_every`` commits, or once the changes since the last
snapshot outweigh the state and one store entry) a *snapshot* of the whole state at the
head is written in the background and the entries before it are deleted, so a restore
reads one snapshot and a few changes. Every entry is immutable and created only if
absent (the store's ``EntryLog``); one too large for a store entry is split into chunks.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from ..errors import CheckpointStoreError
from ..stores.contract import EntryLog
from ..stores.records import MAX_ENTRY_BYTES, StateRef
from .mapping import encode

__all__ = ["StateLog", "StateUnreadableError", "Restored", "CHANGE", "SNAPSHOT"]

logger = logging.getLogger(__name__)

CHANGE = "c"
SNAPSHOT = "s"
_NAME = re.compile(r"^([cs])(\d{12})\.(\d+)\.(\d+)\.(\d+)$")
IN_FLIGHT = 8
"""Store calls one state log keeps in flight (chunks written or read, entries deleted).
Sent all at once to a store that serves one request at a time (Azurite), the chunks of a
large state queue behind each other: a few at a time, and each call's deadline grows
with the bytes in flight (``BoundedStore``: ``store_timeout`` + bytes / 4 MiB/s), so a
64 MB state is committed and restored with 0.5-s store calls, and a store that never
answers is still detected within ``store_timeout`` + 8 chunks / 4 MiB/s (+1.9 s)."""

_T = TypeVar("_T")


async def _at_most(limit: int, calls: Sequence[Callable[[], Awaitable[_T]]]) -> list[_T]:
    """Run ``calls`` with at most ``limit`` in flight; their results, in order. The first
    failure cancels the rest: a commit or restore that failed leaves no store calls
    behind (queued ones would otherwise go on, each up to its deadline, against a store
    that may not answer)."""
    gate = asyncio.Semaphore(limit)
    failed = asyncio.Event()

    async def one(call: Callable[[], Awaitable[_T]]) -> _T:
        async with gate:
            if failed.is_set():  # set before the gate let this one in: never start it
                raise asyncio.CancelledError()
            try:
                return await call()
            except BaseException:
                failed.set()
                raise

    tasks = [asyncio.ensure_future(one(call)) for call in calls]
    try:
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


class StateUnreadableError(CheckpointStoreError):
    """A partition's state cannot be read back for its checkpoint (an entry of the chain
    is missing or corrupt). The partition is not dispatched until it can be."""


@dataclass
class Restored:
    """The state at a chain head: every key's JSON text, and what reading it cost."""

    texts: dict[str, str]
    head: StateRef | None
    sequence_number: int | None = None
    entries_read: int = 0
    bytes_read: int = 0
    changes_since_snapshot: int = 0
    warm: bool = False
    """Loaded from a warm replica: only the changes since its last refresh were read."""


@dataclass
class _Listing:
    changes: dict[tuple[int, int], int] = field(default_factory=dict)  # (version, epoch) -> chunks present
    snapshots: dict[tuple[int, int], int] = field(default_factory=dict)
    totals: dict[tuple[str, int, int], int] = field(default_factory=dict)  # (kind, version, epoch) -> chunk count


def _name(kind: str, ref: StateRef, index: int, count: int) -> str:
    return f"{kind}{ref.version:012d}.{ref.epoch}.{index}.{count}"


def _chunks(data: bytes) -> list[bytes]:
    return [data[i:i + MAX_ENTRY_BYTES] for i in range(0, len(data), MAX_ENTRY_BYTES)] or [b""]


def _change_document(prev: StateRef | None, sequence_number: int, changes: dict[str, str | None]) -> bytes:
    # Values are JSON already: they are written as they are, not encoded a second time.
    sets = ",".join(f"{encode(key)}:{text}" for key, text in changes.items() if text is not None)
    deletes = encode([key for key, text in changes.items() if text is None])
    head = encode({"prev": None if prev is None else str(prev), "seq": sequence_number})
    return f'{head[:-1]},"del":{deletes},"set":{{{sets}}}}}'.encode()


def _snapshot_document(sequence_number: int, texts: dict[str, str]) -> bytes:
    values = ",".join(f"{encode(key)}:{text}" for key, text in texts.items())
    return f'{{"seq":{sequence_number},"values":{{{values}}}}}'.encode()


class StateLog:
    """The state entries of one partition of one consumer group.

    Example::

        log = StateLog(store, ("ns", "hub", "$default"), "3")
        head = await log.append(prev=None, ref=StateRef(1, 7), sequence_number=41, changes={"k": "1"})
        restored = await log.restore(head)        # {"k": "1"}
    """

    def __init__(self, store: EntryLog, scope: tuple[str, str, str], partition_id: str) -> None:
        self._store = store
        self._scope = scope
        self.partition_id = partition_id
        self.log_name = f"state-{partition_id}"

    # ----------------------------------------------------------------- writing
    async def append(self, *, prev: StateRef | None, ref: StateRef, sequence_number: int,
                     changes: dict[str, str | None]) -> int:
        """Write one change as ``ref`` after ``prev``; returns the bytes written."""
        data = _change_document(prev, sequence_number, changes)
        await self._create(CHANGE, ref, data)
        return len(data)

    async def snapshot(self, ref: StateRef, sequence_number: int, texts: dict[str, str]) -> int:
        """Write the whole state at ``ref``; returns the bytes written."""
        data = _snapshot_document(sequence_number, texts)
        await self._create(SNAPSHOT, ref, data)
        return len(data)

    async def _create(self, kind: str, ref: StateRef, data: bytes) -> None:
        chunks = _chunks(data)
        names = [_name(kind, ref, i, len(chunks)) for i in range(len(chunks))]
        created = await _at_most(IN_FLIGHT, [
            functools.partial(self._store.create_entry, *self._scope, self.log_name, name, chunk)
            for name, chunk in zip(names, chunks, strict=False)])
        for name, chunk, was_created in zip(names, chunks, created, strict=False):
            if not was_created and await self._store.read_entry(*self._scope, self.log_name, name) != chunk:
                raise CheckpointStoreError(f"state entry {name} of partition {self.partition_id} exists with other "
                                           "content: two writers of one claim")

    async def compact(self, keep: StateRef) -> int:
        """Delete every entry before the snapshot at ``keep`` (older changes, older
        snapshots, changes of commits that never happened). Returns how many."""
        listing = await self._list()
        doomed = [name for (kind, version, epoch), count in listing.totals.items() if version < keep.version
                  for name in (_name(kind, StateRef(version, epoch), i, count) for i in range(count))]
        await _at_most(IN_FLIGHT, [functools.partial(self._store.delete_entry, *self._scope, self.log_name, name)
                                   for name in doomed])
        return len(doomed)

    # ----------------------------------------------------------------- reading
    async def has_entries(self) -> bool:
        return bool(await self._store.list_entries(*self._scope, self.log_name))

    async def _list(self) -> _Listing:
        listing = _Listing()
        for name in await self._store.list_entries(*self._scope, self.log_name):
            match = _NAME.match(name)
            if match is None:
                continue
            kind, version, epoch, _index, count = match.group(1), int(match.group(2)), int(match.group(3)), \
                int(match.group(4)), int(match.group(5))
            key = (version, epoch)
            present = listing.changes if kind == CHANGE else listing.snapshots
            present[key] = present.get(key, 0) + 1
            listing.totals[(kind, version, epoch)] = count
        return listing

    async def _read(self, kind: str, key: tuple[int, int], count: int) -> tuple[dict, int]:
        return (await self._read_entries(kind, [(key, count)]))[0]

    async def _read_entries(self, kind: str, entries: list[tuple[tuple[int, int], int]]) -> list[tuple[dict, int]]:
        """Read whole entries (every chunk, :data:`IN_FLIGHT` at a time): each one's
        document and size, in order."""
        names = [(index, _name(kind, StateRef(*key), i, count))
                 for index, (key, count) in enumerate(entries) for i in range(count)]
        parts = await _at_most(IN_FLIGHT, [functools.partial(self._store.read_entry, *self._scope, self.log_name, name)
                                           for _index, name in names])
        chunks: list[list[bytes | None]] = [[] for _entry in entries]
        for (index, _), part in zip(names, parts, strict=False):
            chunks[index].append(part)
        results = []
        for (key, _count), found in zip(entries, chunks, strict=False):
            ref = StateRef(*key)
            if any(part is None for part in found):
                raise StateUnreadableError(f"state entry {kind}{ref} of partition {self.partition_id} is missing a "
                                           "chunk")
            data = b"".join(part for part in found if part is not None)
            try:
                results.append((json.loads(data.decode("utf-8")), len(data)))
            except (UnicodeDecodeError, ValueError) as error:
                raise StateUnreadableError(f"state entry {kind}{ref} of partition {self.partition_id} is corrupt: "
                                           f"{error}") from None
        return results

    async def restore(self, head: StateRef | None, *, attempts: int = 3) -> Restored:
        """The state at ``head`` (``None``: empty). Retries from a fresh listing when a
        compaction deleted entries meanwhile; raises :class:`StateUnreadableError` when
        the chain cannot be followed."""
        if head is None:
            return Restored({}, None)
        error: StateUnreadableError | None = None
        for _attempt in range(attempts):
            try:
                return await self._restore(head, await self._list())
            except StateUnreadableError as failure:
                error = failure
        assert error is not None
        raise error

    async def _restore(self, head: StateRef, listing: _Listing) -> Restored:
        complete = {key for key, present in listing.snapshots.items()
                    if key[0] <= head.version and present == listing.totals[(SNAPSHOT, *key)]}
        floor = min((key[0] for key in complete), default=-1)
        docs = await self._changes(listing, floor, head.version)
        read = [len(docs), sum(size for _doc, size in docs.values())]
        chain: list[dict] = []
        at: tuple[int, int] | None = (head.version, head.epoch)
        texts: dict[str, str] = {}
        while at is not None:
            if at in complete:  # the whole state at this point of the chain
                doc, size = await self._read(SNAPSHOT, at, listing.totals[(SNAPSHOT, *at)])
                read[0] += 1
                read[1] += size
                texts = {key: encode(value) for key, value in doc["values"].items()}
                break
            if at not in docs:
                raise StateUnreadableError(f"state change {StateRef(*at)} of partition {self.partition_id} is "
                                           f"missing: the chain to {head} is broken")
            doc = docs[at][0]
            chain.append(doc)
            at = _prev(doc)
        for doc in reversed(chain):
            for key in doc.get("del", ()):
                texts.pop(key, None)
            for key, value in doc.get("set", {}).items():
                texts[key] = encode(value)
        sequence = chain[0].get("seq") if chain else None
        return Restored(texts, head, sequence, read[0], read[1], len(chain))

    async def _changes(self, listing: _Listing, above: int, up_to: int) -> dict[tuple[int, int], tuple[dict, int]]:
        """Every complete change with a version in (above, up_to], read in parallel
        (changes of commits that never happened included: they are simply not followed)."""
        keys = [key for key, present in listing.changes.items()
                if above < key[0] <= up_to and present == listing.totals[(CHANGE, *key)]]
        results = await self._read_entries(CHANGE, [(key, listing.totals[(CHANGE, *key)]) for key in keys])
        return dict(zip(keys, results, strict=False))

    async def changes_between(self, older: StateRef | None, head: StateRef) -> list[dict] | None:
        """The changes from just after ``older`` up to ``head``, oldest first (each a
        dict with ``set``, ``del`` and ``seq``), or None when the chain from ``head`` does
        not pass ``older`` (its entries were compacted away: restore instead)."""
        listing = await self._list()
        docs = await self._changes(listing, -1 if older is None else older.version, head.version)
        chain: list[dict] = []
        at: tuple[int, int] | None = (head.version, head.epoch)
        target = None if older is None else (older.version, older.epoch)
        while at != target:
            if at is None or at not in docs:
                return None
            chain.append(docs[at][0])
            at = _prev(docs[at][0])
        return list(reversed(chain))


def _prev(doc: dict) -> tuple[int, int] | None:
    prev = doc.get("prev")
    if prev is None:
        return None
    ref = StateRef.parse(prev)
    return ref.version, ref.epoch
