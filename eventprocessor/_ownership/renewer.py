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

While the processor's heartbeat keeps its partitions (:mod:`.liveness`), the table
reports no renewal due: records are rewritten only in the per-partition mode.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from .._runtime.bounded_store import BATCH
from .._runtime.clock import Clock, with_deadline
from ..errors import CheckpointStoreError
from .lease import Lease
from .lease_table import LeaseTable
from .writer import OwnershipWriter

__all__ = ["LeaseRenewer"]

logger = logging.getLogger(__name__)


class LeaseRenewer:
    """Renews the leases of ``table`` through ``writer``.

    ``on_contested()`` is called when a renewal loses its conditional write;
    ``on_error(error, lease)`` when a renewal fails for another reason (store error or
    time-out). ``describe`` names the processor in log lines.

    Example::

        renewer = LeaseRenewer(table=table, writer=OwnershipWriter(store), clock=SystemClock(),
                               on_contested=taker.wake, on_error=reporter.renewal_failed, describe="p1")
        scope.start_loop("renewer", renewer.run())
    """

    def __init__(self, *, table: LeaseTable, writer: OwnershipWriter, clock: Clock,
                 on_contested: Callable[[], None], on_error: Callable[[Exception, Lease], None],
                 describe: str) -> None:
        self._table = table
        self._writer = writer
        self._clock = clock
        self._on_contested = on_contested
        self._on_error = on_error
        self._describe = describe
        self._wake = asyncio.Event()
        self.renewals = 0
        self.failed_renewals = 0

    def wake(self) -> None:
        """A lease was added or changed: re-plan the next wake-up."""
        self._wake.set()

    async def run(self) -> None:
        """Renew forever (until cancelled)."""
        while True:
            now = self._clock.monotonic()
            due = self._table.renewal_due(now)
            if due:
                # The most urgent first, BATCH per call; the loop comes back for the rest.
                await self.renew(sorted(due, key=lambda lease: lease.deadline)[:BATCH])
                continue
            self._wake.clear()
            until_next = self._table.next_renewal(now)
            if until_next is None:
                await self._wake.wait()
                continue
            pause = max(0.0, until_next)
            try:
                await with_deadline(self._clock, pause, self._wake.wait(), lambda: TimeoutError())
            except TimeoutError:
                pass

    async def renew(self, due: list[Lease]) -> None:
        """One conditional write per lease in ``due``, all in one store call."""
        sent_at = self._clock.monotonic()
        written = await self._writer.write((lease.record for lease in due), announce=False)
        answered_at = self._clock.monotonic()
        won_by_pid = written.by_partition()
        contested = False
        for lease in due:
            if not lease.renewable(answered_at) and lease.partition_id not in won_by_pid:
                continue
            record = won_by_pid.get(lease.partition_id)
            if record is not None:
                if lease.renewable(answered_at) or lease.pump_alive:
                    self._table.confirm(lease, record, sent_at=sent_at, answered_at=answered_at)
                    self.renewals += 1
                continue
            self.failed_renewals += 1
            self._table.renewal_failed(lease)
            failure = written.failed.get(lease.partition_id)
            if failure is None:
                contested = True
                logger.info("processor %s: renewal of partition %s lost its conditional write; listing to "
                            "see who wrote it", self._describe, lease.partition_id)
            else:
                # A store that fails is told once, as an outage (the reporter); this is detail.
                (logger.debug if isinstance(failure, CheckpointStoreError) else logger.warning)(
                    "processor %s: renewal of partition %s failed (attempt %d, %.1f s left of the lease): %r",
                    self._describe, lease.partition_id, lease.renewal_failures, lease.deadline - answered_at, failure)
                self._on_error(failure, lease)
        if contested:
            self._on_contested()
