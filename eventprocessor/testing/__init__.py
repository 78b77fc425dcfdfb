"""Public tools for testing code built on this SDK, and the SDK itself.

* :class:`VirtualTimeLoop` / :func:`run_virtual`: asyncio on virtual time, so tests of
  leases, ticks and timeouts run in milliseconds with production code paths;
* :class:`FaultyStore`: switchable faults (latency, black hole, outage, errors, lost
  answers, a saturated single worker) in front of any checkpoint store;
* :class:`FaultySource`: switchable faults (receive errors, detached links, stalls, a
  black hole, server-busy throttling, failed opens and listings, a vanished partition)
  in front of any event source;
* :class:`DeliveryRecorder` and :func:`recording_handler`: what handlers received, and
  the duplicates, losses, overlaps and deliveries after a claim ended counted from it;
* :class:`OwnershipLedger` and :class:`LedgerStore`: what the store saw (requests by
  kind; claims, renewals, handoffs, releases, moves and steals), kept on the store's side;
* :class:`Cluster`: real :class:`~eventprocessor.EventProcessor` s over one in-memory
  store and one :class:`~eventprocessor.sources.InMemoryEventSource`, on the running loop.

The scenario harness that the project's own tests and benchmarks share (consumer
processes, fault rigs on Azurite and the Event Hubs emulator, fleets) is not part of this
package: it lives in the repository's ``harness/`` folder and is not installed.

Example::

    from eventprocessor.testing import Cluster, run_virtual

    async def main():
        cluster = Cluster(4, load_balancing_interval=1, partition_ownership_expiration_interval=10)
        processor = cluster.add()
        await processor.start()
        await cluster.produce(40)
        await cluster.wait_until(lambda: cluster.settled([processor]), timeout=60)
        await processor.stop()
        return cluster.ledger.duplicates()

    assert run_virtual(main()) == 0
"""
from .cluster import Cluster
from .loop import VIRTUAL_EPOCH, ManualClock, VirtualTimeLoop, run_virtual, virtual_utc_clock
from .ownership import LedgerStore, OwnershipLedger
from .recorder import Delivery, DeliveryRecorder, recording_handler
from .source import FaultyReceiver, FaultySource
from .store import FaultyStore

__all__ = ["VirtualTimeLoop", "ManualClock", "run_virtual", "virtual_utc_clock", "VIRTUAL_EPOCH", "FaultyStore",
           "FaultySource", "FaultyReceiver", "Delivery",
           "DeliveryRecorder", "recording_handler", "OwnershipLedger", "LedgerStore", "Cluster"]
