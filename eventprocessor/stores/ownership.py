"""Ownership records: listing them (the unreadable ones apart), claiming them conditionally
(a claim, a renewal, a release, a handoff request), and releasing them. A won claim
drops the fences cached for the partition's earlier owners."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ..errors import CheckpointStoreError, ClaimOwnershipError, ConfigurationError
from .backend import OWNERSHIP, Fields, RecordConflict, RecordListing, Scope
from .checkpoints import CheckpointProtocol
from .codec import check_epoch, check_text, parse_ownership
from .members import MemberProtocol
from .records import FIRST_EPOCH, MemberListing, Ownership, OwnershipListing, UnreadableOwnership

__all__ = ["OwnershipProtocol"]

logger = logging.getLogger(__name__)


class OwnershipProtocol(CheckpointProtocol, MemberProtocol):
    """Lists, claims and releases ownership records (a tick lists them with the members)."""

    async def list_ownership(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> OwnershipListing:
        """Every ownership record of the consumer group, the unreadable ones apart, and
        the service's clock.

        Example::

            listing = await store.list_ownership("ns.servicebus.windows.net", "hub", "$default")
            ages = {o.partition_id: listing.server_time - o.last_modified_time
                    for o in listing.ownerships}
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        listing = await self._bounded("listing ownership", self._backend.list(OWNERSHIP, scope))
        return self._ownership_listing(scope, listing)

    async def list_ownership_and_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> tuple[OwnershipListing, MemberListing | None]:
        """Ownership and member records in one request (what a balancing tick reads).

        Example::

            ownership, members = await store.list_ownership_and_members("ns", "hub", "$default")
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        ownership, members = await self._bounded("listing ownership and members",
                                                 self._backend.list_ownership_and_members(scope))
        return self._ownership_listing(scope, ownership), self._member_listing(scope, members)

    def _ownership_listing(self, scope: Scope, listing: RecordListing) -> OwnershipListing:
        self._warn_foreign(listing, "ownership")
        owned: list[Ownership] = []
        unreadable: list[UnreadableOwnership] = []
        for record in listing.records:
            parsed = parse_ownership(record, scope)
            if isinstance(parsed, Ownership):
                owned.append(parsed)
                continue
            self._warn((record.name, record.etag),
                       "ownership record %s in %s is unreadable (%s): partition %s counts as owned by an unknown "
                       "processor until the record expires, then it is claimed over it", record.name,
                       self._backend.where, parsed, record.key)
            unreadable.append(UnreadableOwnership(record.key, record.etag, record.last_modified, parsed))
        return OwnershipListing(ownerships=tuple(owned), server_time=self._server_time(listing, "listing ownership"),
                                unreadable=tuple(unreadable))

    async def claim_ownership(self, ownerships: Iterable[Ownership]) -> list[Ownership]:
        """Conditionally write each claim (create-if-absent when its etag is None, else
        If-Match); return the ones won, with their new etag and time. Claims run
        concurrently; lost races are left out; other failures raise
        ``ClaimOwnershipError``, which carries the claims won.

        Example::

            won = await store.claim_ownership([replace(record, owner_id=me, epoch=record.epoch + 1)])
        """
        claims = list(ownerships)
        scopes = [self._check_claim(claim) for claim in claims]
        if not claims:
            return []
        attempts = [self._claim_or_failure(claim, scope) for claim, scope in zip(claims, scopes, strict=False)]
        if self._backend.sequential:
            results = [await attempt for attempt in attempts]
        else:
            results = list(await asyncio.gather(*attempts))
        won = [result for result in results if isinstance(result, Ownership)]
        failures = {claim.partition_id: result for claim, result in zip(claims, results, strict=False)
                    if isinstance(result, CheckpointStoreError)}
        if failures:
            detail = ", ".join(f"{pid}: {error}" for pid, error in sorted(failures.items()))
            raise ClaimOwnershipError(f"{len(failures)} of {len(claims)} claims in {self._backend.where} failed "
                                      f"({detail})", claimed=won, failures=failures)
        return won

    def _check_claim(self, claim: Any) -> Scope:
        """Refuse a claim no store could write, before any request is sent."""
        if not isinstance(claim, Ownership):
            raise ConfigurationError(f"claims must be Ownership records, got {type(claim).__name__}")
        scope = self._scope(claim.fully_qualified_namespace, claim.eventhub_name, claim.consumer_group)
        self._partition(claim.partition_id)
        check_text(claim.owner_id, "owner_id")
        check_text(claim.requested_by, "requested_by")
        check_epoch(claim.epoch, claim.partition_id)
        if claim.etag is not None and not isinstance(claim.etag, str):
            raise ConfigurationError(f"etag of partition {claim.partition_id!r} must be a string or None")
        return scope

    async def _claim_or_failure(self, claim: Ownership, scope: Scope) -> Ownership | None | CheckpointStoreError:
        try:
            return await self._bounded(f"claim of partition {claim.partition_id}", self._claim_one(claim, scope))
        except CheckpointStoreError as failure:  # an unknown error is never a won claim
            logger.warning("processor %s: claim of partition %s (hub %s, consumer group %s) failed: %s",
                           claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name,
                           claim.consumer_group, failure)
            return failure

    async def _claim_one(self, claim: Ownership, scope: Scope) -> Ownership | None:
        fields: Fields = {"ownerid": claim.owner_id, "epoch": claim.epoch}
        if claim.requested_by:
            fields["requestedby"] = claim.requested_by
        try:
            record = await self._write(OWNERSHIP, scope, claim.partition_id, fields, claim.etag)
        except RecordConflict as lost:
            logger.debug("processor %s lost the claim of partition %s (hub %s, consumer group %s): %s",
                         claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name,
                         claim.consumer_group, type(lost).__name__)
            return None
        self._keep_only_fence(scope, claim.partition_id, claim.owner_id, claim.epoch)
        if claim.etag is None and claim.epoch == FIRST_EPOCH and claim.owner_id:
            self._created_claim(scope, claim.partition_id, claim.owner_id)
        logger.debug("processor %s claimed partition %s (hub %s, consumer group %s, epoch %s)",
                     claim.owner_id or "<release>", claim.partition_id, claim.eventhub_name, claim.consumer_group,
                     claim.epoch)
        return replace(claim, etag=record.etag, last_modified_time=record.last_modified)

    async def release_ownership(self, ownership: Ownership) -> bool:
        """Clear the owner of ``ownership`` (and any handoff request) if its etag is
        still current; the epoch is kept. Returns True when released.

        Example::

            await store.release_ownership(record)
        """
        won = await self.claim_ownership([replace(ownership, owner_id="", requested_by="")])
        if won and isinstance(ownership.owner_id, str):
            scope = (ownership.fully_qualified_namespace, ownership.eventhub_name, ownership.consumer_group)
            self._forget_fence(scope, ownership.partition_id, ownership.owner_id, ownership.epoch)
        return bool(won)
