"""An in-process checkpoint store with the semantics of the real ones.

Used by unit tests, the demo and the benchmarks' simulator. It keeps the contract
exactly: records are immutable and re-created on every write, each write gets a new
random etag, a claim with ``etag=None`` fails if the record exists, a stale etag
fails, checkpoints are fenced (never over a checkpoint of a later epoch), malformed
records are refused on write and skipped with a warning on listing (nothing in this
process should produce them, but the conformance suite plants some to prove the
listing survives them), and time comes from an injectable clock.
"""
from __future__ import annotations

import logging
import uuid
from collections import Counter
from dataclasses import replace
from datetime import datetime, timezone
from typing import Callable, Dict, Iterable, List, Optional, Tuple

from eventprocessor.checkpoint_store import CheckpointStore
from eventprocessor.errors import ConfigurationError, OwnershipLostError
from eventprocessor.records import Checkpoint, Ownership, OwnershipListing

__all__ = ["InMemoryCheckpointStore"]

logger = logging.getLogger(__name__)

_Scope = Tuple[str, str, str]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _new_etag() -> str:
    return f'"{uuid.uuid4().hex}"'


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _ownership_problem(record: object) -> Optional[str]:
    if not isinstance(record, Ownership):
        return f"not an Ownership record ({type(record).__name__})"
    if not isinstance(record.owner_id, str):
        return "owner_id is not a string"
    if not _is_count(record.epoch):
        return "epoch is not a non-negative integer"
    return None


def _checkpoint_problem(record: object) -> Optional[str]:
    if not isinstance(record, Checkpoint):
        return f"not a Checkpoint record ({type(record).__name__})"
    seq = record.sequence_number
    if not isinstance(seq, int) or isinstance(seq, bool):
        return "sequence_number is not an integer"
    if record.epoch is not None and not _is_count(record.epoch):
        return "epoch is not a non-negative integer"
    return None


class InMemoryCheckpointStore(CheckpointStore):
    """Checkpoint store held in this process.

    ``clock`` returns the store's "server" time as an aware datetime; inject one to
    simulate time or clock skew. ``request_counts`` counts requests by kind the way a
    remote store would bill them (one per record written, one per listing).

    Example::

        store = InMemoryCheckpointStore()
        processor = EventProcessor(source, store, MyProcessor)
    """

    def __init__(self, *, clock: Optional[Callable[[], datetime]] = None) -> None:
        self._clock = clock or _utcnow
        self._ownership: Dict[_Scope, Dict[str, Ownership]] = {}
        self._checkpoints: Dict[_Scope, Dict[str, Tuple[Checkpoint, str]]] = {}
        self.request_counts: Counter = Counter()
        self._warned: set = set()

    def __repr__(self) -> str:
        return f"InMemoryCheckpointStore(scopes={len(self._ownership)})"

    def now(self) -> datetime:
        return self._clock()

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        self.request_counts["list_ownership"] += 1
        scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        records = self._ownership.get(scope, {})
        valid = tuple(r for pid, r in records.items() if self._usable("ownership", scope, pid, r, _ownership_problem))
        return OwnershipListing(ownerships=valid, server_time=self._clock())

    def _usable(self, kind: str, scope: _Scope, pid: str, record: object, check: Callable[[object], Optional[str]]) -> bool:
        problem = check(record)
        if problem is None:
            return True
        key = (kind, scope, pid, id(record))
        log = logger.debug if key in self._warned else logger.warning
        self._warned.add(key)
        log("skipping %s record of partition %s (namespace %s, hub %s, consumer group %s): %s",
            kind, pid, scope[0], scope[1], scope[2], problem)
        return False

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> List[Ownership]:
        claims = list(ownerships)
        for claim in claims:
            problem = _ownership_problem(claim)
            if problem is not None:
                raise ConfigurationError(f"invalid claim: {problem}")
        won: List[Ownership] = []
        for claim in claims:
            self.request_counts["claim_ownership"] += 1
            scope = (claim.fully_qualified_namespace, claim.eventhub_name, claim.consumer_group)
            records = self._ownership.setdefault(scope, {})
            current = records.get(claim.partition_id)
            if claim.etag is None:
                if current is not None:
                    logger.debug("create of partition %s lost: record exists", claim.partition_id)
                    continue
            elif current is None or current.etag != claim.etag:
                logger.debug("claim of partition %s lost: etag is stale", claim.partition_id)
                continue
            record = replace(claim, etag=_new_etag(), last_modified_time=self._clock())
            records[claim.partition_id] = record
            won.append(record)
        return won

    async def update_checkpoint(self, checkpoint: Checkpoint, *, owner_id: str, epoch: int) -> None:
        problem = _checkpoint_problem(checkpoint)
        if problem is not None:
            raise ConfigurationError(f"invalid checkpoint: {problem}")
        if not isinstance(owner_id, str) or not owner_id:
            raise ConfigurationError("owner_id must be a non-empty string")
        if not _is_count(epoch):
            raise ConfigurationError("epoch must be a non-negative int")
        self.request_counts["update_checkpoint"] += 1
        scope = (checkpoint.fully_qualified_namespace, checkpoint.eventhub_name, checkpoint.consumer_group)
        current = self._ownership.get(scope, {}).get(checkpoint.partition_id)
        if current is None or current.owner_id != owner_id or current.epoch != epoch:
            holder = "nobody" if current is None or current.is_released else current.owner_id
            raise OwnershipLostError(
                f"checkpoint of partition {checkpoint.partition_id} refused: {owner_id} (epoch {epoch}) "
                f"does not own it, {holder} does"
                + ("" if current is None else f" (epoch {current.epoch})"),
                partition_id=checkpoint.partition_id,
            )
        previous = self._checkpoints.get(scope, {}).get(checkpoint.partition_id)
        previous_epoch = getattr(previous[0], "epoch", None) if previous is not None else None
        if isinstance(previous_epoch, int) and _is_count(previous_epoch) and previous_epoch > epoch:
            raise OwnershipLostError(
                f"checkpoint of partition {checkpoint.partition_id} refused: it was written by epoch "
                f"{previous_epoch}, later than {owner_id}'s epoch {epoch}",
                partition_id=checkpoint.partition_id,
            )
        stored = replace(checkpoint, owner_id=owner_id, epoch=epoch)
        self._checkpoints.setdefault(scope, {})[checkpoint.partition_id] = (stored, _new_etag())

    async def list_checkpoints(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> List[Checkpoint]:
        self.request_counts["list_checkpoints"] += 1
        scope = (fully_qualified_namespace, eventhub_name, consumer_group)
        records = self._checkpoints.get(scope, {})
        return [c for pid, (c, _etag) in records.items() if self._usable("checkpoint", scope, pid, c, _checkpoint_problem)]
