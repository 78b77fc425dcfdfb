"""How the scale benchmark sizes its timing: the cost of listing the ownership records
measured on this machine (:func:`calibrate`), and the rule that derives the interval and
the expiration from it (:func:`choose_timing`)."""
from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import statistics
import sys
import time
import uuid
from dataclasses import dataclass

from harness.worker import STANDIN_NAMESPACE as NAMESPACE

from ..toolkit.machine import idle_cores, process_cpu_seconds

__all__ = ["CAP_TICKS", "CONSUMER_GROUP", "EXPIRATION_RATIO", "IMPLS", "NAMESPACE", "OFFICIAL_EXPIRATION_RATIO",
           "Calibration", "Sizing", "calibrate", "choose_timing", "delete_container"]

IMPLS = ("ours", "official")
CONSUMER_GROUP = "$default"
EXPIRATION_RATIO = 5.0  # this SDK's defaults: 15 s interval, 75 s expiration
OFFICIAL_EXPIRATION_RATIO = 6.0  # azure-eventhub's defaults: 30 s interval, 180 s expiration
CAP_TICKS = 60  # a side that has not balanced after this many ticks of every processor is reported as such


@dataclass(frozen=True)
class Calibration:
    """The measured cost of listing ``partitions`` ownership records once."""

    partitions: int
    listings: int
    client_cpu: float  # seconds, median
    server_cpu: float | None  # Azurite's seconds, median (None when it is not ours to read)
    wall: float  # seconds, median
    idle_cores: float | None = None  # cores idle just before (other users' work counted as busy)
    server_write_cpu: float | None = None  # Azurite's seconds per record written (claims), mean

    @property
    def cpu(self) -> float:
        return self.client_cpu + (self.server_cpu or 0.0)

    @property
    def client_ms_per_record(self) -> float:
        return 1000 * self.client_cpu / self.partitions

    @property
    def server_ms_per_record(self) -> float | None:
        return None if self.server_cpu is None else 1000 * self.server_cpu / self.partitions


@dataclass(frozen=True)
class Sizing:
    """The settings the rule chose, and what they imply (seconds)."""

    interval: float  # I, both sides
    expiration: float  # E, ours: 5·I (this SDK's ratio)
    renewal_age: float  # ours: ownership_renewal_age R
    store_timeout: float  # ours: store_timeout T, derived by the processor from E and R
    operation_timeout: float  # ours: the Blob store's own operation_timeout
    lease: float  # ours: E minus the safety margin
    herd: float  # N simultaneous listings on the machine's cores: N·c/C
    listing_load: float  # cores all processors spend listing, at one listing per interval each
    cores: float  # C: the cores the rule sized for
    store_load: float | None = None  # the share of the store's one thread that listings take: N·s/I
    burst: float | None = None  # B = N·s + 2·P·w: the store's seconds of work when every processor starts
    bound_by: str = "client CPU"  # which term of the rule chose I

    @property
    def official_expiration(self) -> float:
        """E for the official processor: its own ratio (6·I, as 30 s / 180 s)."""
        return OFFICIAL_EXPIRATION_RATIO * self.interval

    def expiration_of(self, impl: str) -> float:
        return self.official_expiration if impl == "official" else self.expiration

    @property
    def hold(self) -> float:
        """How long a side keeps running once balanced: every lease of ours is renewed once."""
        return self.renewal_age + 0.1 * self.expiration

    @property
    def stall_room(self) -> float:
        """How long ours may be unable to run (a stalled event loop) between two renewal
        attempts and still keep its leases: the lease minus the renewal age."""
        return self.lease - self.renewal_age


def ours_at_defaults(sizing: Sizing) -> Sizing:
    """Ours with ``EventProcessor``'s default timing: at rest its ticks list no ownership
    record (one heartbeat per processor keeps its partitions), so its interval is not
    sized by P x N (docs/concepts/timing.md, "Sizing"); only the official side is."""
    from eventprocessor import EventProcessor, Timing
    from eventprocessor.stores import DEFAULT_OPERATION_TIMEOUT

    defaults = inspect.signature(EventProcessor.__init__).parameters
    interval = float(defaults["load_balancing_interval"].default)
    expiration = float(defaults["partition_ownership_expiration_interval"].default)
    timing = Timing.derive(interval=interval, expiration=expiration, renewal_age=None, store_timeout=None,
                           shutdown_timeout=30.0, handler_timeout=None)
    return dataclasses.replace(sizing, interval=interval, expiration=expiration, renewal_age=timing.renewal_age,
                               store_timeout=timing.store_timeout, operation_timeout=DEFAULT_OPERATION_TIMEOUT,
                               lease=timing.lease_length, bound_by="EventProcessor's defaults")


def choose_timing(listing_cpu: float, processors: int, cores: float, *, budget: float = 0.5,
                  min_interval: float = 1.0, store_listing: float | None = None,
                  store_write: float | None = None, partitions: int = 0) -> Sizing:
    """The sizing rule (docs/concepts/timing.md, "Sizing"), from the measured CPU of one listing.

    * ``I = ⌈N·c / (f·C)⌉`` (at least ``min_interval``): the listings of all N
      processors, one per interval each, use at most ``f`` (``budget``) of the C cores.
    * the store, when its own cost is known (Azurite is one Node.js thread: one core at
      most, whatever the machine has): with ``s`` its seconds per listing
      (``store_listing``), ``I ≥ ⌈N·s / f⌉``, so listings take at most ``f`` of its
      thread; and with ``w`` its seconds per record written (``store_write``), the
      start-up burst ``B = N·s + 2·P·w`` (every processor lists, a greedy start writes
      every claim and its checkpoint fence) fits in the store timeout,
      ``T ≈ 0.67·I ≥ B``, that is ``I ≥ ⌈1.5·B⌉``. A store that gets more than it can
      do queues the rest, every call times out, and the processors back off (see
      ``eventprocessor._runtime.backoff``); these terms keep the benchmark out of that regime.
    * ``E = 5·I``: the ratio of this SDK's defaults (15 s / 75 s); the official
      processor, which rewrites its records at every tick, has four ticks to spare.
    * ``R = E/2`` (ours): the lease minus R, ``0.4·E = 2·I``, is how long a processor may
      be unable to renew (its event loop held by a listing's XML parsing while N
      processes share C cores: up to ``N·c/C = f·I``) and still keep its leases, and the
      store timeout the processor derives from it, ``(0.9·E − R)/3 ≈ 0.67·I``, exceeds
      the start-up herd ``N·c/C`` (every processor listing at once).
    * the store's own ``operation_timeout`` is raised to that store timeout when it is
      longer than the default 10 s, so the store does not cut a listing first.

    Example::

        >>> s = choose_timing(0.45, 16, 2)
        >>> (s.interval, s.expiration, s.renewal_age, round(s.store_timeout, 2))
        (8.0, 40.0, 20.0, 5.33)
    """
    from eventprocessor import Timing
    from eventprocessor.stores import DEFAULT_OPERATION_TIMEOUT

    if listing_cpu <= 0 or processors < 1 or cores <= 0 or not 0 < budget <= 1:
        raise ValueError("listing_cpu, processors, cores and budget must be positive (budget at most 1)")
    terms = {"client CPU": float(math.ceil(processors * listing_cpu / (budget * cores)))}
    burst = None
    if store_listing:
        terms["the store's thread"] = float(math.ceil(processors * store_listing / budget))
        burst = processors * store_listing + 2 * partitions * (store_write or 0.0)
        terms["the start-up burst"] = float(math.ceil(1.5 * burst))
    bound_by = max(terms, key=lambda k: terms[k])
    interval = max(float(min_interval), terms[bound_by])
    store_load_at = processors * store_listing / interval if store_listing else None
    expiration = EXPIRATION_RATIO * interval
    timing = Timing.derive(interval=interval, expiration=expiration, renewal_age=expiration / 2, store_timeout=None,
                           shutdown_timeout=30.0, handler_timeout=None)
    return Sizing(interval=interval, expiration=expiration, renewal_age=timing.renewal_age,
                  store_timeout=timing.store_timeout,
                  operation_timeout=max(DEFAULT_OPERATION_TIMEOUT, math.ceil(timing.store_timeout)),
                  lease=timing.lease_length, herd=processors * listing_cpu / cores,
                  listing_load=processors * listing_cpu / interval, cores=cores, store_load=store_load_at,
                  burst=burst, bound_by=bound_by if interval > min_interval else "the minimum interval")


async def calibrate(connection_string: str, partitions: int, listings: int, azurite_pid: int | None,
                    idle_sample: float = 5.0) -> Calibration:
    """Write ``partitions`` ownership records to a scratch container and time listing them."""
    from eventprocessor.errors import CheckpointStoreError
    from eventprocessor.stores.blob import BlobCheckpointStore
    from eventprocessor.stores.records import Ownership

    container = f"scale-calibration-{partitions}-{uuid.uuid4().hex[:6]}"
    hub = "calibration"
    idle = await idle_cores(idle_sample)
    async with BlobCheckpointStore.from_connection_string(connection_string, container, operation_timeout=60) as store:
        await store.list_ownership(NAMESPACE, hub, CONSUMER_GROUP)  # creates the container
        gate = asyncio.Semaphore(32)

        async def claim(index: int) -> None:
            record = Ownership(NAMESPACE, hub, CONSUMER_GROUP, str(index), f"calibration-{index % 16}", epoch=1)
            for attempt in range(5):  # a busy machine may time a write out; a lost answer reads as lost race
                async with gate:
                    try:
                        won = await store.claim_ownership([record])
                    except CheckpointStoreError:
                        if attempt == 4:
                            raise
                        continue
                if won:
                    return
                current = {r.partition_id: r for r in (await store.list_ownership(NAMESPACE, hub,
                                                                                  CONSUMER_GROUP)).ownerships}
                if str(index) in current:
                    return

        written0 = process_cpu_seconds(azurite_pid)
        await asyncio.gather(*(claim(i) for i in range(partitions)))
        written1 = process_cpu_seconds(azurite_pid)
        write_cpu = None if written0 is None or written1 is None else (written1 - written0) / partitions
        client, server, wall = [], [], []
        for _ in range(listings):
            cpu0, azurite0, wall0 = time.process_time(), process_cpu_seconds(azurite_pid), time.perf_counter()
            listing = await store.list_ownership(NAMESPACE, hub, CONSUMER_GROUP)
            wall.append(time.perf_counter() - wall0)
            client.append(time.process_time() - cpu0)
            azurite1 = process_cpu_seconds(azurite_pid)
            if azurite0 is not None and azurite1 is not None:
                server.append(azurite1 - azurite0)
            if len(listing.ownerships) != partitions:
                raise RuntimeError(f"calibration listed {len(listing.ownerships)} records, expected {partitions}")
    await delete_container(connection_string, container)
    return Calibration(partitions, listings, statistics.median(client),
                       statistics.median(server) if server else None, statistics.median(wall), idle, write_cpu)


async def delete_container(connection_string: str, name: str) -> None:
    """Leave Azurite as the next side found it (best effort, bounded)."""
    from azure.storage.blob.aio import ContainerClient

    try:
        async with ContainerClient.from_connection_string(connection_string, name) as client:
            await asyncio.wait_for(client.delete_container(), 60)
    except Exception as error:  # a side's leftovers only cost the next one some memory
        print(f"could not delete container {name}: {error!r:.200}", file=sys.stderr, flush=True)
