"""Member records: one heartbeat record per live processor, so that a processor that owns
nothing still counts in every plan (see :class:`~eventprocessor.stores.contract.OwnershipStore`)."""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from ..errors import ConfigurationError
from .backend import MEMBER, RecordListing, Scope
from .calls import ProtocolCalls
from .codec import WRITE_TOKEN, check_encoded, check_text, decode_name
from .records import Member, MemberListing

__all__ = ["MemberProtocol"]

_PROPERTY_NAME = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
GENERATION_KEY = ".generation"
"""The key of the group's change notice among the member records. No owner id encodes to
it (an encoded name never starts with ``.``), and it sits where one listing of the
members returns it."""
_MAX_PROPERTIES_SIZE = 4096


class MemberProtocol(ProtocolCalls):
    """Lists, writes and deletes member records."""

    def _member_key(self, member: Any) -> tuple[Scope, str]:
        if not isinstance(member, Member):
            raise ConfigurationError(f"expected a Member record, got {type(member).__name__}")
        scope = self._scope(member.fully_qualified_namespace, member.eventhub_name, member.consumer_group)
        check_text(member.owner_id, "owner_id", allow_empty=False)
        return scope, check_encoded(member.owner_id, "owner_id")

    async def list_members(
        self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str
    ) -> MemberListing:
        """The member (heartbeat) records of the consumer group and the service's clock.

        Example::

            listing = await store.list_members("ns.servicebus.windows.net", "hub", "$default")
            alive = [m.owner_id for m in listing.members
                     if listing.server_time - m.last_modified_time < timedelta(seconds=60)]
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        listing = await self._bounded("listing members", self._backend.list(MEMBER, scope))
        return self._member_listing(scope, listing)

    def _member_listing(self, scope: Scope, listing: RecordListing) -> MemberListing:
        self._warn_foreign(listing, "member")
        members = []
        generation = None
        for record in listing.records:
            if record.key == GENERATION_KEY:
                generation = record.etag
                continue
            try:
                owner_id = decode_name(record.key)
            except ValueError:
                self._warn((record.name, record.etag), "skipping member record %s in %s: its name is not an "
                           "encoded owner id", record.name, self._backend.where)
                continue
            properties = {k: v for k, v in record.fields.items() if k != WRITE_TOKEN and isinstance(v, str)}
            members.append(Member(*scope, owner_id, record.last_modified, record.etag, properties))
        return MemberListing(members=tuple(members), server_time=self._server_time(listing, "listing members"),
                             generation=generation)

    async def announce_change(self, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str) -> None:
        """Rewrite the group's change notice (one unconditional write), so that every
        member's next listing of the members shows a new ``generation`` and lists the
        ownership records again.

        Example::

            await store.claim_ownership([claim])
            await store.announce_change("ns", "hub", "$default")
        """
        scope = self._scope(fully_qualified_namespace, eventhub_name, consumer_group)
        await self._bounded("announcing an ownership change",
                            self._backend.upsert(MEMBER, scope, GENERATION_KEY, {}))

    async def write_member(self, member: Member) -> Member:
        """Create or overwrite ``member``'s heartbeat record; return it as stored.

        ``properties`` names are lower-case identifiers (``[a-z][a-z0-9_]*``, at most 64
        characters), values printable ASCII; 4096 characters in all.

        Example::

            me = await store.write_member(Member("ns", "hub", "$default", owner_id,
                                                 properties={"strategy": "balanced"}))
        """
        scope, key = self._member_key(member)
        properties = dict(member.properties)
        for name, value in properties.items():
            if not isinstance(name, str) or not _PROPERTY_NAME.match(name) or name == WRITE_TOKEN:
                raise ConfigurationError(f"member property name {name!r} is invalid: use a lower-case identifier "
                                         "of at most 64 characters (not 'writetoken')")
            check_text(value, f"member property {name!r}")
        if sum(len(k) + len(v) for k, v in properties.items()) > _MAX_PROPERTIES_SIZE:
            raise ConfigurationError(
                f"member properties of {member.owner_id!r} exceed {_MAX_PROPERTIES_SIZE} characters")
        record = await self._bounded(f"heartbeat of member {member.owner_id}",
                                     self._backend.upsert(MEMBER, scope, key, dict(properties)))
        return replace(member, etag=record.etag, last_modified_time=record.last_modified, properties=properties)

    async def delete_member(self, member: Member) -> None:
        """Delete ``member``'s heartbeat record if it exists.

        Example::

            await store.delete_member(me)
        """
        scope, key = self._member_key(member)
        await self._bounded(f"deleting member {member.owner_id}", self._backend.delete(MEMBER, scope, key))
