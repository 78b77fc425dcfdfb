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
  store and one :class:`~eventprocessor.sources.MemoryEventSource`, on the running loop.

Modules for tests across processes and real transports (they need the extras and the
local services, and are imported only when named):

* :mod:`eventprocessor.testing.worker` (``python -m eventprocessor.testing.worker``) and
  :mod:`eventprocessor.testing.processes`: consumer processes (this SDK's or
  azure-eventhub's) that report every delivered batch, and planned-move scenarios;
* :mod:`eventprocessor.testing.azurite_faults`: store faults on Azurite through a TCP
  fault proxy; :mod:`eventprocessor.testing.source_faults`: source faults on the Event
  Hubs emulator;
* :mod:`eventprocessor.testing.spark_files`: which files each micro-batch of a Spark
  file sink wrote, from its ``_spark_metadata`` log.

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
