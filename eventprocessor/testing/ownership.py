"""What the store saw: every request by kind, and every ownership write told apart (a
claim, a renewal, a handoff request, a handoff, a release; moves and steals).

:class:`OwnershipLedger` is kept by the store's side, so it counts what processors did,
never what they believe they did. :class:`LedgerStore` is one processor's view of a
store that reports every call it forwards to a shared ledger, naming its writer (so
that the ledger tells an owner's handoff from a claimer's claim).

Example::

    ledger = OwnershipLedger(expiration=60.0)
    memory = InMemoryCheckpointStore(clock=virtual_utc_clock())
    processors = [EventProcessor(source, LedgerStore(memory, ledger, writer=f"p{i}"), handler, owner_id=f"p{i}")
                  for i in range(3)]
    ...
    assert ledger.steals == 0 and ledger.requests["handoff"] == ledger.handoffs
"""
from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..stores.contract import CheckpointStore, StoreWrapper, release_ownership
from ..stores.records import Member, Ownership

__all__ = ["OwnershipLedger", "LedgerStore"]

_T = TypeVar("_T")


@dataclass
class _Record:
    owner: str
    modified: float  # the ledger's time (seconds)


@dataclass
class OwnershipLedger:
    """What the store saw, in the same terms for any implementation.

    Every executed request is reported here with the time it executed at and the
    processor that sent it. Ownership writes are told apart by who wrote what:

    * ``renew``: the owner rewrites its own record;
    * ``request``: another processor marks a live record as requested (graceful handoff);
    * ``handoff``: the owner writes its record over to another processor;
    * ``claim``: a processor writes a record to itself that named someone else (or no
      record existed); a *steal* if that record was live (younger than ``expiration``);
    * ``release``: the owner clears its record.

    A *move* gives a partition to an owner other than its last non-empty owner. Times are
    seconds on any one clock (the loop's, say); :meth:`snapshot` and subtraction give the
    figures of a phase. Example::

        ledger.write("0", "a", True, 0.0)      # first claim: not a move
        ledger.write("0", "b", True, 10.0)     # a's record was live: a steal
        assert (ledger.moves, ledger.steals) == (1, 1)
    """

    expiration: float
    records: dict[str, _Record] = field(default_factory=dict)
    last_owner: dict[str, str] = field(default_factory=dict)
    requests: Counter = field(default_factory=Counter)
    moves: int = 0
    steals: int = 0
    handoffs: int = 0
    failed_claims: int = 0
    owner_changes: int = 0
    steals_by: Counter = field(default_factory=Counter)
    version: int = 0
    """Grows with every ownership write (a cheap way to see that something changed)."""
    members: dict[str, float] = field(default_factory=dict)
    """Member id -> the time of its last heartbeat (member record write)."""
    keepers: set[str] = field(default_factory=set)
    """Members whose heartbeat keeps their partitions (``lease=member``): their records
    live as long as the later of the record's write and the owner's heartbeat."""

    def count(self, kind: str) -> None:
        """A request that changes no ownership record (lists, checkpoints, fences)."""
        self.requests[kind] += 1

    def member_written(self, owner: str, now: float, *, keeps_partitions: bool = False) -> None:
        self.requests["write_member"] += 1
        self.members[owner] = now
        if keeps_partitions:
            self.keepers.add(owner)
        else:
            self.keepers.discard(owner)

    def alive_at(self, record: _Record) -> float:
        """When ``record`` was last proven live: its write, or its owner's heartbeat."""
        if record.owner in self.keepers:
            return max(record.modified, self.members.get(record.owner, record.modified))
        return record.modified

    def member_expiry(self, owner: str) -> float | None:
        """When peers stop counting ``owner``'s member record (None if it never wrote
        one): the processor treats a member as gone after half the expiration
        (``Timing.member_expiration``)."""
        written = self.members.get(owner)
        return None if written is None else written + self.expiration / 2

    def write(self, partition_id: str, owner: str, won: bool, now: float, writer: str | None = None) -> None:
        """One conditional write of ``partition_id``'s record naming ``owner``, sent by
        ``writer`` (by default ``owner``); ``won`` says whether the store applied it."""
        writer = owner if writer is None else writer
        self.version += 1
        previous = self.records.get(partition_id)
        previous_owner = previous.owner if previous is not None else ""
        if not owner:
            kind = "release"
        elif previous_owner == owner:
            kind = "renew" if writer == owner else "request"
        elif writer != owner:
            kind = "handoff"
        else:
            kind = "claim"
        self.requests[kind] += 1
        if not won:
            self.failed_claims += 1
            return
        if previous_owner != owner:
            self.owner_changes += 1
        if owner:
            before = self.last_owner.get(partition_id)
            if before is not None and before != owner:
                self.moves += 1
                if kind == "handoff":
                    self.handoffs += 1
                elif previous is not None and previous.owner == before and \
                        now - self.alive_at(previous) <= self.expiration:
                    self.steals += 1
                    self.steals_by[owner] += 1
            self.last_owner[partition_id] = owner
        self.records[partition_id] = _Record(owner, now)

    def live_owner(self, partition_id: str, now: float) -> str | None:
        """The owner ``partition_id``'s record names, if it has not expired at ``now``."""
        record = self.records.get(partition_id)
        if record is None or not record.owner or now - self.alive_at(record) > self.expiration:
            return None
        return record.owner

    def counts(self, partition_ids: Iterable[str], owners: Iterable[str], now: float) -> dict[str, int]:
        """Partitions each of ``owners`` holds a live record of at ``now``."""
        result = {owner: 0 for owner in owners}
        for pid in partition_ids:
            owner = self.live_owner(pid, now)
            if owner in result:
                result[owner] += 1
        return result

    def snapshot(self) -> dict[str, Any]:
        """The counters now; subtract two to get a phase's."""
        return {
            "requests": Counter(self.requests),
            "moves": self.moves,
            "steals": self.steals,
            "handoffs": self.handoffs,
            "failed_claims": self.failed_claims,
            "owner_changes": self.owner_changes,
        }


class LedgerStore(StoreWrapper):
    """One processor's view of ``inner`` that reports every call to ``ledger``, as sent by
    ``writer``: each call is counted by operation (the tick's listing of ownership and
    members is one ``list_ownership``), each claimed record is a :meth:`OwnershipLedger.write`
    (one request per record, as a remote store bills them), each member record a
    heartbeat. ``now`` reads the ledger's time (by default the running loop's).

    Claims of one call are sent one record at a time, in order (the in-memory store does
    the same). Example::

        store = LedgerStore(memory, ledger, writer="p0")
        processor = EventProcessor(source, store, handler, owner_id="p0")
    """

    def __init__(self, inner: CheckpointStore, ledger: OwnershipLedger, *, writer: str,
                 now: Callable[[], float] | None = None) -> None:
        super().__init__(inner)
        self.ledger = ledger
        self.writer = writer
        self.now = now or (lambda: asyncio.get_running_loop().time())

    async def forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1) -> _T:
        self.ledger.count(operation)
        return await call()

    async def claim_one(self, claim: Ownership) -> Ownership | None:
        """Write one record to the inner store and report it; the record won, or None."""
        won = await self.inner.claim_ownership([claim])
        self.ledger.write(claim.partition_id, claim.owner_id, bool(won), self.now(), self.writer)
        return won[0] if won else None

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        results = [await self.claim_one(claim) for claim in ownerships]
        return [record for record in results if record is not None]

    async def release_ownership(self, ownership: Ownership) -> bool:
        return await release_ownership(self, ownership)  # a claim with no owner: the ledger sees it

    async def write_member(self, member: Member) -> Member:
        written = await self.inner.write_member(member)
        self.ledger.member_written(member.owner_id, self.now(),
                                   keeps_partitions=member.properties.get("lease") == "member")
        return written
