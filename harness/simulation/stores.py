"""The stores of a simulation: this SDK's in-memory store and one with the official
``CheckpointStore`` interface (dict records, Blob semantics), each seen by every instance
through a view of its own behind virtual latency, reporting to the simulation's
:class:`~eventprocessor.testing.OwnershipLedger`."""
from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from eventprocessor import CheckpointStore, CheckpointStoreError
from eventprocessor.stores.records import Member, Ownership
from eventprocessor.testing import LedgerStore, OwnershipLedger

from .instants import EPOCH_SECONDS, Instants

__all__ = ["OfficialSimStore", "SimulatedStore"]

_T = TypeVar("_T")


class _Latency:
    def __init__(self, instants: Instants, latency: float, rng: random.Random) -> None:
        self.instants = instants
        self.latency = latency
        self._rng = rng

    def draw(self) -> float:
        # Uniform in [0, latency]: a tick sometimes takes a large share of the interval.
        return self._rng.uniform(0.0, self.latency) if self.latency > 0 else 0.0

    async def round_trip(self, execute: Callable[[], Any]) -> Any:
        """One request: it executes at the midpoint of its round trip, after everything
        else of that instant."""
        delay = self.draw()
        if delay:
            await self.instants.sleep(delay / 2)
        await self.instants.last()
        result = execute()
        if asyncio.iscoroutine(result):
            result = await result
        if delay:
            await self.instants.sleep(delay / 2)
        return result

    async def writes(self, items: Sequence[Any], execute: Callable[[Any], Awaitable[Any]]) -> list[Any]:
        """One round trip for a batch of writes sent concurrently.

        Batches of different instances that reach the store at the same instant are
        applied record by record in a random interleaving, as concurrent requests are
        over a network (one task per instant, not per record, so large runs stay fast).
        """
        delay = self.draw()
        results = await self.instants.write_group(self.instants.now + delay / 2, items, execute, self._rng)
        if delay:
            await self.instants.sleep(delay / 2)
        return results


class _Crashed(CheckpointStoreError):
    """The instance behind this store view crashed: it sends nothing any more."""


class SimulatedStore(LedgerStore):
    """One instance's view of this SDK's :class:`~stores.InMemoryCheckpointStore`, behind
    virtual latency, reporting to the simulation's
    :class:`~eventprocessor.testing.OwnershipLedger`.

    Every instance gets its own view (:meth:`for_instance`) over the same inner store,
    ledger and latency, so the ledger knows who wrote each record, and a crashed
    instance's view refuses every further request (a dead process sends nothing). Each
    request executes at the midpoint of its round trip; a batch claim is one round trip
    (a real store issues the writes concurrently) but is billed one request per record,
    like the inner store's ``request_counts``. Member records (heartbeats and their
    listing) cost requests too, and so does every checkpoint fence (the real processor
    fences each claim it wins, as on Blob and Table).
    """

    def __init__(self, inner: CheckpointStore, instants: Instants, ledger: OwnershipLedger,
                 latency: float = 0.0, rng: random.Random | None = None, *, writer: str = "") -> None:
        super().__init__(inner, ledger, writer=writer, now=lambda: instants.now)
        self._instants = instants
        self._latency = _Latency(instants, latency, rng or random.Random(0))
        self.dead = False

    def for_instance(self, owner_id: str) -> SimulatedStore:
        view = SimulatedStore(self.inner, self._instants, self.ledger, writer=owner_id)
        view._latency = self._latency
        return view

    def _check(self) -> None:
        if self.dead:
            raise _Crashed(f"{self.writer} crashed; it sends no more requests")

    async def forward(self, operation: str, call: Callable[[], Awaitable[_T]], units: int = 1) -> _T:
        self._check()
        return await self._latency.round_trip(lambda: LedgerStore.forward(self, operation, call, units))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        self._check()
        results = await self._latency.writes(list(ownerships), self.claim_one)
        return [record for record in results if record is not None]

    async def write_member(self, member: Member) -> Member:
        self._check()
        return await self._latency.round_trip(lambda: LedgerStore.write_member(self, member))


@dataclass
class _OfficialRecords:
    ownership: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)


class OfficialSimStore:
    """The official ``CheckpointStore`` interface (dict records) with real store semantics.

    Like the Blob store the official SDK ships: ``last_modified_time`` is the *store's*
    time (float seconds), the etag changes on every write, a record without an etag is
    create-if-absent and a stale etag fails; checkpoints are written unconditionally.
    Records are copied in and out, because the official balancer mutates the dicts it is
    given (the official in-memory store hands out its live dicts, which would let one
    instance's plan rewrite another's view). One view per instance (:meth:`for_instance`),
    as for :class:`SimulatedStore`.
    """

    def __init__(self, instants: Instants, ledger: OwnershipLedger, latency: float = 0.0,
                 rng: random.Random | None = None, *, writer: str = "") -> None:
        self._records = _OfficialRecords()
        self._ledger = ledger
        self._instants = instants
        self._latency = _Latency(instants, latency, rng or random.Random(0))
        self.writer = writer
        self.dead = False

    def for_instance(self, owner_id: str) -> OfficialSimStore:
        view = OfficialSimStore(self._instants, self._ledger, writer=owner_id)
        view._records, view._latency = self._records, self._latency
        return view

    def _check(self) -> None:
        if self.dead:
            raise _Crashed(f"{self.writer} crashed; it sends no more requests")

    def server_time(self) -> float:
        return EPOCH_SECONDS + self._instants.now

    async def list_ownership(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                             **kwargs: Any) -> list[dict[str, Any]]:
        self._check()

        def execute() -> list[dict[str, Any]]:
            self._ledger.count("list_ownership")
            return [dict(record) for record in self._records.ownership.values()]

        return await self._latency.round_trip(execute)

    async def claim_ownership(self, ownership_list: Iterable[dict[str, Any]], **kwargs: Any) -> list[dict[str, Any]]:
        self._check()
        claims = [dict(claim) for claim in ownership_list]

        async def execute(claim: dict[str, Any]) -> dict[str, Any] | None:
            pid = claim["partition_id"]
            current = self._records.ownership.get(pid)
            etag = claim.get("etag")
            ok = (current is None and etag is None) or (current is not None and etag is not None
                                                          and etag == current["etag"])
            self._ledger.write(pid, claim.get("owner_id") or "", ok, self._instants.now, self.writer)
            if not ok:
                return None
            record = dict(claim, etag=str(uuid.uuid4()), last_modified_time=self.server_time())
            self._records.ownership[pid] = record
            return dict(record)

        results = await self._latency.writes(claims, execute)
        return [record for record in results if record is not None]

    async def update_checkpoint(self, checkpoint: dict[str, Any], **kwargs: Any) -> None:
        self._check()

        def execute() -> None:
            self._ledger.count("update_checkpoint")
            self._records.checkpoints[checkpoint["partition_id"]] = dict(checkpoint)

        await self._latency.round_trip(execute)

    async def list_checkpoints(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str,
                               **kwargs: Any) -> list[dict[str, Any]]:
        self._check()

        def execute() -> list[dict[str, Any]]:
            self._ledger.count("list_checkpoints")
            return [dict(c) for c in self._records.checkpoints.values()]

        return await self._latency.round_trip(execute)
