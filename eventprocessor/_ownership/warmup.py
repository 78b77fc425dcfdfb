"""Warmup: the warm replicas a stateful processor keeps (KIP-441 on this SDK's records).

* **Before a planned move**: the taker tells which partitions it is about to ask for
  (:meth:`Warmup.want`); their state is loaded and followed in the background while their
  owners keep processing, and the handoff request is written only once a replica is
  caught up (:meth:`Warmup.ready`). The new owner then starts from the replica and reads
  only the changes since (:meth:`Warmup.take`): the pause of a move does not grow with
  the state.
* **Standbys** (``StatePolicy.num_standbys``): replicas of other processors' partitions, chosen by
  :func:`~eventprocessor.state.replica.standby_plan`, followed all the time; their lags
  are published in the member record, and a crashed owner's partition goes to its most
  caught-up live standby (:meth:`Warmup.failover`).

Replicas are refreshed every half interval with one checkpoint listing and the few
state entries written since.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping

from .._runtime.clock import sleep_or_wake
from .._runtime.options import ProcessorOptions
from ..policies import StatePolicy
from ..state.log import StateLog
from ..state.replica import LAGS_PROPERTY, WarmReplica, decode_lags, encode_lags, failover_plan, standby_plan
from ..stores.contract import CheckpointStore
from ..stores.records import Ownership, OwnershipListing

__all__ = ["Warmup", "FAILOVER_GRACE_TICKS"]

logger = logging.getLogger(__name__)

FAILOVER_GRACE_TICKS = 3
"""Intervals a claimable partition is left to its preferred standby before anyone may
claim it (the standby may have crashed too)."""


class Warmup:
    """Keeps and follows this processor's warm replicas (see the module docstring)."""

    def __init__(self, *, options: ProcessorOptions, store: CheckpointStore, describe: str) -> None:
        self._options = options
        self._policy = options.state_policy or StatePolicy()
        self._store = store
        self._describe = describe
        self._replicas: dict[str, WarmReplica] = {}
        self._wanted: set[str] = set()
        self._claiming: set[str] = set()
        self._standby: set[str] = set()
        self._lags: dict[str, int] = {}
        self._claimable_since: dict[str, float] = {}
        self._wake = asyncio.Event()
        self.refreshes = 0

    # ----------------------------------------------------------------- what to keep
    def want(self, partition_ids: Iterable[str]) -> None:
        """The partitions this processor is about to ask for (planned moves)."""
        wanted = set(partition_ids)
        if wanted - set(self._replicas):
            self._wake.set()
        self._wanted = wanted

    def asking(self, requests: Iterable[Ownership], awaiting: Iterable[str],
               listing: OwnershipListing) -> list[Ownership]:
        """The handoff requests to write this tick: those whose replica is warm. Wanted
        (loaded and followed): what the tick asks for or awaits, and every partition whose
        record still carries this processor's request, even when this tick's plan would
        ask for another one: its owner may hand it over at any moment."""
        requests = list(requests)
        asked = {r.partition_id for r in listing.ownerships if r.requested_by == self._options.owner_id}
        self.want({r.partition_id for r in requests} | set(awaiting) | asked)
        return [r for r in requests if self.ready(r.partition_id)]

    def claiming(self, partition_ids: Iterable[str]) -> None:
        """Partitions this processor claims or adopts now (a handoff answered, a
        failover): their replicas are kept until the claim takes them (:meth:`take`) or
        fails (:meth:`not_claimed`), however long the claim and its fence take and
        whatever the ticks in between want (``want`` and ``plan`` no longer list them:
        they are neither asked for nor someone else's)."""
        self._claiming |= set(partition_ids) & set(self._replicas)

    def not_claimed(self, partition_ids: Iterable[str]) -> None:
        """Claims that were not won or not started: their replicas are kept only if
        something else still wants them."""
        self._claiming -= set(partition_ids)

    def plan(self, listing: OwnershipListing, members: Mapping[str, Mapping[str, str]] | None,
             owned: Iterable[str]) -> dict[str, str]:
        """One tick: the standbys this processor keeps, and who should claim each
        claimable partition that somebody keeps a replica of (``decide``'s
        ``preferred``)."""
        options = self._options
        live = self._live_owners(listing)
        if self._policy.num_standbys and members:
            mine = standby_plan(live, list(members), self._policy.num_standbys).get(options.owner_id, set())
            if mine - set(self._replicas):
                self._wake.set()
            self._standby = mine - set(owned)
        if not members:
            return {}
        lags = {member: decode_lags(properties.get(LAGS_PROPERTY)) for member, properties in members.items()}
        claimable = [pid for pid in {r.partition_id for r in listing.ownerships} if pid not in live]
        now = options.clock.monotonic()
        grace = FAILOVER_GRACE_TICKS * options.timing.interval
        for pid in list(self._claimable_since):
            if pid not in claimable:
                del self._claimable_since[pid]
        fresh = [pid for pid in claimable if now - self._claimable_since.setdefault(pid, now) <= grace]
        return failover_plan(fresh, lags, self._policy.acceptable_recovery_lag)

    def _live_owners(self, listing: OwnershipListing) -> dict[str, str]:
        expiration = self._options.timing.expiration
        return {r.partition_id: r.owner_id for r in listing.ownerships
                if r.owner_id and r.last_modified_time is not None
                and (listing.server_time - r.last_modified_time).total_seconds() <= expiration}

    # ----------------------------------------------------------------- readiness
    def ready(self, partition_id: str) -> bool:
        """Is the replica of ``partition_id`` loaded and within
        ``acceptable_recovery_lag`` events of the owner's last checkpoint?"""
        lag = self._lags.get(partition_id)
        return lag is not None and lag <= self._policy.acceptable_recovery_lag

    def lags(self) -> dict[str, int]:
        return dict(self._lags)

    def member_properties(self) -> dict[str, str]:
        """What the member record carries: the replicas' lags (failover picks from them)."""
        return {LAGS_PROPERTY: encode_lags(self._lags)} if self._lags else {}

    def take(self, partition_id: str) -> WarmReplica | None:
        """The replica of a partition this processor just claimed (it stops following it)."""
        self._lags.pop(partition_id, None)
        self._standby.discard(partition_id)
        self._wanted.discard(partition_id)
        self._claiming.discard(partition_id)
        replica = self._replicas.pop(partition_id, None)
        return replica if replica is not None and replica.loaded else None

    # ----------------------------------------------------------------- following
    async def run(self) -> None:
        """Refresh the replicas every half interval (at once when one is wanted)."""
        while True:
            self._wake.clear()
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as error:
                logger.warning("processor %s: refreshing warm replicas failed: %r", self._describe, error)
            await sleep_or_wake(self._options.clock, self._options.timing.interval / 2, self._wake)

    async def refresh(self) -> None:
        keep = self._wanted | self._standby | self._claiming
        for pid in [pid for pid in self._replicas if pid not in keep]:
            del self._replicas[pid]
            self._lags.pop(pid, None)
        if not keep:
            return
        self.refreshes += 1
        checkpoints = {c.partition_id: c for c in await self._store.list_checkpoints(*self._options.scope)}
        for pid in sorted(keep):
            replica = self._replicas.get(pid)
            if replica is None:
                replica = self._replicas[pid] = WarmReplica(StateLog(self._store, self._options.scope, pid))
            checkpoint = checkpoints.get(pid)
            behind = replica.lag(checkpoint)  # how far it fell behind since the last refresh
            try:
                await replica.follow(checkpoint)
            except Exception as error:
                logger.info("processor %s: the warm replica of partition %s could not follow (%r); it loads again",
                            self._describe, pid, error)
                self._replicas.pop(pid, None)
                self._lags.pop(pid, None)
                continue
            # A replica's lag is what it had to catch up this round: 0 once it follows.
            self._lags[pid] = behind if behind is not None else (self._policy.acceptable_recovery_lag + 1)
