"""LeaseRenewer: keeps the records of owned partitions fresh, on its own schedule.

Renewal is apart from balancing (the split of KCL's LeaseRenewer and LeaseTaker): a slow
listing, a slow claim or slow user code never makes an owned lease lapse. Each lease is
rewritten once it is ``renewal_age`` old (measured from the send time of its last
accepted write), conditional on the etag of that write; a failed attempt is retried
every ``retry_interval`` until the lease's deadline, after which the lease self-fences.

The renewer never decides that a partition is lost: a renewal that loses its
conditional write (the record was rewritten by someone) only asks the balancing loop to
list at once (``on_contested``), and the listing tells whether it was a steal or a
handoff request. A lease whose pump has ended is never renewed.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Callable, Dict, List, Optional

from .bounded_store import BATCH, with_deadline
from .checkpoint_store import CheckpointStore
from .clock import Clock
from .errors import ClaimOwnershipError
from .lease import Lease

__all__ = ["LeaseRenewer"]

logger = logging.getLogger(__name__)


class LeaseRenewer:
    """Renews the leases in ``leases`` (the processor's table, shared, read live).

    ``on_contested()`` is called when a renewal loses its conditional write;
    ``on_error(error, lease)`` when a renewal fails for another reason (store error or
    time-out). ``describe`` names the processor in log lines.
    """

    def __init__(self, *, store: CheckpointStore, leases: Dict[str, Lease], clock: Clock, renewal_age: float,
                 lease_length: float, retry_interval: float, on_contested: Callable[[], None],
                 on_error: Callable[[Exception, Lease], None], describe: str) -> None:
        self._store = store
        self._leases = leases
        self._clock = clock
        self.renewal_age = renewal_age
        self.lease_length = lease_length
        self.retry_interval = retry_interval
        self._on_contested = on_contested
        self._on_error = on_error
        self._describe = describe
        self._wake = asyncio.Event()
        self.renewals = 0
        self.failed_renewals = 0

    def wake(self) -> None:
        """A lease was added or changed: re-plan the next wake-up."""
        self._wake.set()

    def _due(self, now: float) -> List[Lease]:
        return [lease for lease in self._leases.values() if lease.renewable(now) and lease.renew_at <= now]

    def _next_wake(self, now: float) -> Optional[float]:
        """Seconds until the next renewal or deadline; None when nothing is renewable
        (then only :meth:`wake` starts the next round)."""
        times = [lease.renew_at for lease in self._leases.values() if lease.renewable(now)]
        # Also wake at deadlines, so that a lease that could not be renewed is seen to end.
        times += [lease.deadline for lease in self._leases.values() if lease.renewable(now)]
        return min(times) - now if times else None

    async def run(self) -> None:
        """Renew forever (until cancelled)."""
        while True:
            now = self._clock.monotonic()
            due = self._due(now)
            if due:
                # The most urgent first, BATCH per call; the loop comes back for the rest.
                await self.renew(sorted(due, key=lambda lease: lease.deadline)[:BATCH])
                continue
            self._wake.clear()
            until_next = self._next_wake(now)
            if until_next is None:
                await self._wake.wait()
                continue
            pause = max(0.0, until_next)
            try:
                await with_deadline(self._clock, pause, self._wake.wait(), lambda: TimeoutError())
            except TimeoutError:
                pass

    async def renew(self, due: List[Lease]) -> None:
        """One conditional write per lease in ``due``, all in one store call."""
        sent_at = self._clock.monotonic()
        records = [lease.record for lease in due]
        error: Optional[Exception] = None
        try:
            won = await self._store.claim_ownership(records)
        except ClaimOwnershipError as exc:
            won, error = list(exc.claimed), exc
        except Exception as exc:
            won, error = [], exc
        answered_at = self._clock.monotonic()
        won_by_pid = {record.partition_id: record for record in won}
        contested = False
        for lease in due:
            if not lease.renewable(answered_at) and lease.partition_id not in won_by_pid:
                continue
            record = won_by_pid.get(lease.partition_id)
            if record is not None:
                if lease.renewable(answered_at) or lease.pump_alive:
                    lease.confirm(record, sent_at=sent_at, answered_at=answered_at,
                                  lease_length=self.lease_length, renewal_age=self.renewal_age)
                    self.renewals += 1
                continue
            self.failed_renewals += 1
            lease.renewal_failures += 1
            lease.renew_at = answered_at + self.retry_interval
            failure = getattr(error, "failures", {}).get(lease.partition_id, error) if error is not None else None
            if failure is None:
                contested = True
                logger.info("processor %s: renewal of partition %s lost its conditional write; listing to "
                            "see who wrote it", self._describe, lease.partition_id)
            else:
                logger.warning("processor %s: renewal of partition %s failed (attempt %d, %.1f s left of the "
                               "lease): %r", self._describe, lease.partition_id, lease.renewal_failures,
                               lease.deadline - answered_at, failure)
                self._on_error(failure, lease)
        if contested:
            self._on_contested()
