"""A discrete-event simulator that runs real load-balancing and dispatch code under
virtual time, and records what every handler was given: the engine of the convergence
benchmark (``benchmarks/convergence.py``), checked by ``tests/test_convergence_sim.py``.

Two kinds of instance run side by side over stores with the same semantics and the same
request accounting, reading one :class:`~eventprocessor.sources.InMemoryEventSource`:

* :class:`OursInstance` wraps this SDK's :class:`~eventprocessor.EventProcessor`: its
  renewer, lease keeper, member heartbeat and partition pumps run on their own on the
  virtual clock, and every balancing tick is one ``await processor.balance_once()``.
* :class:`OfficialInstance` wraps azure-eventhub's async ``OwnershipManager`` (the load
  balancer inside ``azure.eventhub.aio.EventProcessor``) and reproduces that processor's
  dispatch (``event_processor.py``): after each ``claim_ownership()`` it starts one
  receive task per newly claimed partition from the checkpoint ``get_checkpoints()``
  returned, with owner level 0 (what the official processor uses with a checkpoint
  store; equal owner levels disconnect the older receiver), cancels the tasks of
  partitions its claim no longer returned, and releases a partition when its task ends.
  Its handler checkpoints through the official ``PartitionContext`` (unfenced). The
  official code reads ``time.time()`` and ``random`` at module level, so while a
  simulation runs both names are replaced by per-instance stand-ins (see
  :func:`official_module_patched`).

With :class:`Traffic`, a producer appends events to every partition at a steady rate and
both SDKs' handlers record each batch (:class:`Deliveries`): partition, owner, claim,
first and last sequence number, virtual start and end (a handler spends ``work``
seconds per batch, then checkpoints it). Duplicates, overlaps, pauses and the time to
resume after a crash are measured from those records, never derived from beliefs.

A simulation runs on :class:`eventprocessor.testing.VirtualTimeLoop`, the clock every
timed part of the SDK follows (the processors' leases, ticks and store deadlines, the
pumps, the source's waits, the in-memory store's server time): time only moves when every
coroutine is waiting, so a thousand ticks take seconds and a run is a deterministic
function of its seed. Store requests execute at the midpoint of their round trip, after
everything else of that instant (:class:`Instants`, even with zero latency); that is what
makes a *lockstep* tick real: every instance lists the same snapshot before any of them
writes. What the store saw is kept by an :class:`~eventprocessor.testing.OwnershipLedger`.

Example::

    async def main():
        async with simulation("ours", LoadBalancingStrategy.GREEDY, 32, traffic=Traffic()) as sim:
            sim.start_traffic()
            for _ in range(4):
                sim.add_instance()
            result = await sim.run_until_balanced(max_ticks=50)
            return result.ticks_to_balanced, result.duplicates

    print(run_virtual(main()))
"""

from .costs import (
    EXPIRATION_MULTIPLES,
    RENEWAL_RULES,
    equal_cost_candidates,
    official_requests_per_hour,
    ours_requests_per_hour,
    renewal_for,
    shared_candidates,
    shortest_within,
)
from .deliveries import Batch, Deliveries, Traffic
from .instances import OfficialInstance, OursInstance, official_module_patched
from .instants import EPOCH, InstanceClock, Instants
from .limits import minimal_moves, one_per_tick_limit
from .run import SCHEDULES, PhaseResult, Sample, Simulation, simulation
from .stores import OfficialSimStore, SimulatedStore

__all__ = [
    "EPOCH", "EXPIRATION_MULTIPLES", "RENEWAL_RULES", "SCHEDULES", "Batch", "Deliveries", "InstanceClock", "Instants",
    "OfficialInstance", "OfficialSimStore", "OursInstance", "PhaseResult", "Sample", "SimulatedStore", "Simulation",
    "Traffic", "equal_cost_candidates", "minimal_moves", "official_module_patched", "official_requests_per_hour",
    "one_per_tick_limit", "ours_requests_per_hour", "renewal_for", "shared_candidates", "shortest_within",
    "simulation",
]
