"""FaultySource: switchable faults in front of any event source."""
from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from typing import Any

from ..errors import EventSourceError
from ..events import Event, EventPosition
from ..sources.base import EventSource, LastEnqueuedEventProperties, PartitionProperties, PartitionReceiver

__all__ = ["FaultySource", "FaultyReceiver"]

SERVER_BUSY = "com.microsoft:server-busy"
"""The AMQP condition Event Hubs throttles with; injected errors name it."""


class FaultyReceiver(PartitionReceiver):
    """A receiver of a :class:`FaultySource`: the inner receiver behind the source's
    switches. Once it failed it is *dead*, as a detached AMQP link is: every later
    ``receive`` fails too (counted as ``receive_on_dead``), so the caller has to open a
    new receiver."""

    def __init__(self, source: FaultySource, inner: PartitionReceiver, partition_id: str,
                 position: EventPosition) -> None:
        self._source = source
        self._inner = inner
        self.partition_id = partition_id
        self.position = position
        self.dead: str | None = None  # why it died
        self.closed = False
        self._signal: asyncio.Future | None = None

    @property
    def last_enqueued_event_properties(self) -> LastEnqueuedEventProperties | None:
        return self._inner.last_enqueued_event_properties

    def __repr__(self) -> str:
        return f"FaultyReceiver(partition_id={self.partition_id!r}, dead={self.dead!r})"

    def _die(self, why: str) -> EventSourceError:
        self.dead = why
        return self._source._error("disconnected", f"receiving from partition {self.partition_id} failed: {why}")

    def interrupt(self, why: str) -> None:
        """Kill the receiver now: a receive in progress fails at once (a detached link)."""
        if self.dead is None:
            self.dead = why
        if self._signal is not None and not self._signal.done():
            self._signal.set_result(why)

    async def receive(self, max_batch_size: int, max_wait_time: float | None) -> list[Event]:
        source, pid = self._source, self.partition_id
        source.calls["receive"] += 1
        if self.closed:
            raise RuntimeError("receiver is closed")
        if self.dead is not None:
            source.injected["receive_on_dead"] += 1
            raise self._die(self.dead)
        await source._before("receive", pid)
        if source._draw(source.receive_error_rate) or source._take_once("receive"):
            source.injected["receive_error"] += 1
            raise self._die("injected receive error (amqp:internal-error)")
        if source._draw(source.detach_rate):
            source.injected["detach"] += 1
            raise self._die("the link was detached (amqp:link:detach-forced)")
        if source.stall and source._applies(pid):
            source.injected["stall"] += 1
            await asyncio.sleep(source.stall)
        if source.black_hole and source._applies(pid):
            raise self._die(await source._swallow(self))
        loop = asyncio.get_running_loop()
        self._signal = loop.create_future()
        inner = asyncio.ensure_future(self._inner.receive(max_batch_size, max_wait_time))
        try:
            await asyncio.wait({inner, self._signal}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not inner.done():
                inner.cancel()
                await asyncio.gather(inner, return_exceptions=True)
        signal, self._signal = self._signal, None
        if signal.done():
            why = signal.result()
            if why == "black hole":
                raise self._die(await source._swallow(self))
            # Whatever the inner receiver had taken is dropped with the link, as a
            # client's prefetch buffer is when its connection resets.
            raise self._die(why)
        events = inner.result()
        if pid in source.removed:  # went away while we waited
            raise source._not_found(pid)
        source.delivered[pid] += len(events)
        return events

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.interrupt("closed")
        self._source._open.discard(self)
        await self._inner.close()


class FaultySource(EventSource):
    """An event source with switchable faults. Every switch can be flipped while
    processors run; :meth:`clear` turns them all off.

    * ``receive_error_rate``: probability that a ``receive`` fails with
      :class:`~eventprocessor.errors.EventSourceError` (reason ``disconnected``);
      :meth:`fail_next` fails the next few calls of one operation instead;
    * ``detach_rate``: probability that a ``receive`` finds its link detached, as
      azure-eventhub reports a link the service closed; :meth:`detach_all` detaches every
      open receiver now, waiting ones included (a connection reset). A failed receiver
      stays dead: the caller must open a new one;
    * ``stall``: seconds each ``receive`` hangs before it goes on (a slow link);
    * ``black_hole``: calls hang while it is on (receives in progress too: their events
      never arrive). When it is switched off, hung receives fail (``disconnected``, as
      the client's idle timeout reports a dead connection), and hung ``open_receiver``
      and ``get_partition_ids`` calls fail with ``timeout`` after ``call_timeout``
      seconds, as EventHubSource's ``operation_timeout`` makes them;
    * :meth:`throttle`: for some seconds every call fails with reason ``server-busy``
      (Event Hubs' ``com.microsoft:server-busy``) and a ``retry_after``; calls made
      before the retry-after they were given has passed are counted as
      ``ignored_retry_after`` (a caller that hammers a throttled hub);
    * ``open_error_rate`` / ``ids_error_rate``: probability that ``open_receiver`` /
      ``get_partition_ids`` fails (``unreachable``);
    * :meth:`remove` / :meth:`restore`: a partition disappears: ``get_partition_ids``
      stops listing it, its receivers fail with ``not-found`` and it cannot be opened;
    * ``only``: if set, receive and open faults apply only to these partition ids.

    ``calls`` counts calls by operation, ``injected`` the faults injected by kind,
    ``opens`` the successful opens per partition, ``delivered`` events returned.

    Example::

        source = FaultySource(InMemoryEventSource(4), rng=random.Random(1))
        processor = EventProcessor(source, store, MyProcessor)
        await processor.start()
        source.detach_all()               # every link drops once
        source.throttle(10, retry_after=4)
        source.receive_error_rate = 0.2
        ...
        source.clear()
        assert source.injected["detach"] > 0
    """

    def __init__(self, inner: EventSource, *, rng: random.Random | None = None,
                 call_timeout: float = 10.0) -> None:
        self.inner = inner
        self.fully_qualified_namespace = inner.fully_qualified_namespace
        self.eventhub_name = inner.eventhub_name
        self.rng = rng or random.Random(0)
        self.call_timeout = call_timeout
        self.receive_error_rate = 0.0
        self.detach_rate = 0.0
        self.stall = 0.0
        self.black_hole = False
        self.open_error_rate = 0.0
        self.ids_error_rate = 0.0
        self.only: set[str] | None = None
        self.removed: set[str] = set()
        self.calls: Counter = Counter()
        self.injected: Counter = Counter()
        self.opens: Counter = Counter()
        self.delivered: Counter = Counter()
        self.first_open_sequence: dict[str, int] = {}
        """Per partition, the newest sequence number when its first receiver opened (for
        ``latest``: the events after it are the ones a processor must deliver)."""
        self._once: Counter = Counter()
        self._busy_until = -math.inf
        self._retry_after = 0.0
        self._asked_to_wait: dict[str, float] = {}  # partition (or "") -> loop time the caller was told to wait for
        self._open: set[FaultyReceiver] = set()
        self._healed: asyncio.Event | None = None

    def __repr__(self) -> str:
        return f"FaultySource({self.inner!r})"

    def __getattr__(self, name: str) -> Any:  # send, partition_count, ... of the inner source
        return getattr(self.inner, name)

    # ------------------------------------------------------------------ switches

    def clear(self) -> None:
        """Turn every fault off (removed partitions come back)."""
        self.receive_error_rate = self.detach_rate = self.stall = 0.0
        self.open_error_rate = self.ids_error_rate = 0.0
        self.only = None
        self._once.clear()
        self._busy_until = -math.inf
        self.removed.clear()
        self.set_black_hole(False)

    def set_black_hole(self, on: bool) -> None:
        """Switch the black hole; receives in progress start hanging at once."""
        self.black_hole = on
        if on:
            for receiver in list(self._open):
                if self._applies(receiver.partition_id) and receiver._signal is not None \
                        and not receiver._signal.done():
                    receiver._signal.set_result("black hole")
        elif self._healed is not None:
            self._healed.set()
            self._healed = None

    def fail_next(self, operation: str, count: int = 1) -> None:
        """The next ``count`` calls of ``operation`` (``receive``, ``open_receiver`` or
        ``get_partition_ids``) fail."""
        self._once[operation] += count

    def detach_all(self, why: str = "the connection was reset (amqp:connection:forced)") -> int:
        """Detach every open receiver now; returns how many."""
        hit = [r for r in self._open if self._applies(r.partition_id) and r.dead is None]
        for receiver in hit:
            receiver.interrupt(why)
        self.injected["detach"] += len(hit)
        return len(hit)

    def throttle(self, seconds: float, *, retry_after: float = 4.0) -> None:
        """For ``seconds`` from now, every call answers server-busy with ``retry_after``."""
        self._busy_until = asyncio.get_running_loop().time() + seconds
        self._retry_after = retry_after
        for receiver in list(self._open):
            if self._applies(receiver.partition_id):
                receiver.interrupt(f"{SERVER_BUSY}: the request was throttled")

    def remove(self, partition_id: str) -> None:
        """The partition disappears (until :meth:`restore` or :meth:`clear`)."""
        self.removed.add(partition_id)
        for receiver in list(self._open):
            if receiver.partition_id == partition_id:
                receiver.interrupt(f"partition {partition_id} was not found (amqp:not-found)")

    def restore(self, partition_id: str) -> None:
        self.removed.discard(partition_id)

    @property
    def throttled(self) -> bool:
        return asyncio.get_running_loop().time() < self._busy_until

    # ------------------------------------------------------------------ machinery

    def _applies(self, partition_id: str | None) -> bool:
        return self.only is None or partition_id is None or partition_id in self.only

    def _draw(self, rate: float) -> bool:
        return bool(rate) and self.rng.random() < rate

    def _take_once(self, operation: str) -> bool:
        if self._once[operation] > 0:
            self._once[operation] -= 1
            return True
        return False

    def _error(self, reason: str, what: str, retry_after: float | None = None) -> EventSourceError:
        return EventSourceError(f"event hub {self.eventhub_name!r} in namespace {self.fully_qualified_namespace!r}: "
                                f"{what}", fully_qualified_namespace=self.fully_qualified_namespace,
                                eventhub_name=self.eventhub_name, reason=reason, retry_after=retry_after)

    def _not_found(self, partition_id: str) -> EventSourceError:
        self.injected["not_found"] += 1
        return self._error("not-found", f"partition {partition_id} does not exist (amqp:not-found)")

    async def _before(self, operation: str, partition_id: str | None) -> None:
        """The faults every call meets first: a removed partition, throttling."""
        if partition_id is not None and partition_id in self.removed:
            raise self._not_found(partition_id)
        if not self._applies(partition_id):
            return
        now = asyncio.get_running_loop().time()
        key = partition_id or ""
        if now < self._asked_to_wait.get(key, -math.inf) - 1e-6:  # (virtual time: float rounding)
            self.injected["ignored_retry_after"] += 1
        if now < self._busy_until:
            self.injected["server_busy"] += 1
            self._asked_to_wait[key] = now + self._retry_after
            raise self._error("server-busy", f"{operation} was throttled ({SERVER_BUSY}): please wait "
                                             f"{self._retry_after:g} seconds and try again", self._retry_after)

    async def _wait_healed(self) -> None:
        if self._healed is None:
            self._healed = asyncio.Event()
        await self._healed.wait()

    async def _swallow(self, receiver: FaultyReceiver | None) -> str:
        """Hang while the black hole lasts; returns what the caller then reports."""
        self.injected["black_hole"] += 1
        while self.black_hole and (receiver is None or not receiver.closed):
            await self._wait_healed()
        return "no frame received for the idle timeout: the connection is dead"

    async def _hang_call(self, operation: str) -> None:
        """A call sent into the black hole: fails with ``timeout`` after ``call_timeout``."""
        self.injected["black_hole"] += 1
        await asyncio.sleep(self.call_timeout)
        raise self._error("timeout", f"{operation} did not finish in time")

    # ------------------------------------------------------------------ EventSource

    async def get_partition_ids(self) -> list[str]:
        self.calls["get_partition_ids"] += 1
        await self._before("get_partition_ids", None)
        if self.black_hole:
            await self._hang_call("reading the partition ids")
        if self._draw(self.ids_error_rate) or self._take_once("get_partition_ids"):
            self.injected["ids_error"] += 1
            raise self._error("unreachable", "reading the partition ids failed: the hub cannot be reached")
        ids = await self.inner.get_partition_ids()
        return [pid for pid in ids if pid not in self.removed]

    async def open_receiver(self, partition_id: str, *, consumer_group: str, starting_position: EventPosition,
                            owner_level: int | None, prefetch: int = 300,
                            track_last_enqueued_event_properties: bool = False) -> PartitionReceiver:
        self.calls["open_receiver"] += 1
        await self._before("open_receiver", partition_id)
        if self._applies(partition_id):
            if self.black_hole:
                await self._hang_call(f"opening a receiver on partition {partition_id}")
            if self._draw(self.open_error_rate) or self._take_once("open_receiver"):
                self.injected["open_error"] += 1
                raise self._error("unreachable", f"opening a receiver on partition {partition_id} failed: "
                                                 "the hub cannot be reached")
        options: dict[str, Any] = {}
        if track_last_enqueued_event_properties:
            options["track_last_enqueued_event_properties"] = True
        if partition_id not in self.first_open_sequence:
            properties = await self.inner.get_partition_properties(partition_id)
            self.first_open_sequence[partition_id] = properties.last_enqueued_sequence_number
        inner = await self.inner.open_receiver(partition_id, consumer_group=consumer_group,
                                               starting_position=starting_position, owner_level=owner_level,
                                               prefetch=prefetch, **options)
        receiver = FaultyReceiver(self, inner, partition_id, starting_position)
        self._open.add(receiver)
        self.opens[partition_id] += 1
        return receiver

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        self.calls["get_partition_properties"] += 1
        await self._before("get_partition_properties", partition_id)
        return await self.inner.get_partition_properties(partition_id)

    async def close(self) -> None:
        for receiver in list(self._open):
            await receiver.close()
        await self.inner.close()
