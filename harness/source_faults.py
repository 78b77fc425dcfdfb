"""Source faults for real: an EventProcessor reading the Event Hubs emulator through a
loopback TCP fault proxy (:class:`~eventprocessor.emulators.fault_proxy.TcpFaultProxy`), while the
official ``azure.eventhub.aio.EventHubProducerClient`` sends to the emulator directly.

The twin, on the real transport, of ``tests/test_source_fault_harness.py`` (virtual
time, :class:`~eventprocessor.testing.FaultySource`). Used by
``tests/test_source_faults_emulator.py`` (short, generous bounds) and
``python -m benchmarks.faults --emulator`` (the recorded rows).

What is measured comes from what the handler received
(:class:`~eventprocessor.testing.DeliveryRecorder`) and what the emulator holds: the
events produced are the producer's acknowledged sends while it runs, and at the end what
the hub holds (its partition properties: every sequence number from 0 to the last
enqueued one, on a fresh hub), never a figure of the SDK under test.

Needs the ``[eventhub]`` extra and the project's Event Hubs emulator
(:mod:`eventprocessor.emulators.eventhubs`).

Example::

    run = await run_source_fault(emulator.connection_string, hub, resets(every=2, seconds=12))
    assert run.lost == 0 and run.duplicates_within_claims == 0 and not run.after_end
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from eventprocessor import EventProcessor
from eventprocessor.emulators.fault_proxy import TcpFaultProxy
from eventprocessor.events import EventPosition
from eventprocessor.sources.eventhub import EventHubSource
from eventprocessor.testing.recorder import DeliveryRecorder, recording_handler

__all__ = ["SourceFaultRun", "run_source_fault", "repeatedly", "resets", "black_hole", "restart", "throttle",
           "Controls", "LocalEmulator", "recovery_bound"]

logger = logging.getLogger(__name__)

OPTIONS: dict[str, Any] = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0,
                               shutdown_timeout=5.0)
PUMP_MAX_BACKOFF = 5.0


@dataclass
class SourceFaultRun:
    """What one scenario measured."""

    name: str
    bound: float
    recovered_after: float | None
    produced: int
    lost: int
    duplicates_within_claims: int
    after_end: int
    duplicates: int
    connections: int
    note: str = ""
    errors: list[Exception] = field(default_factory=list)


Inject = Callable[[TcpFaultProxy, "Controls"], Awaitable[str]]


@dataclass
class Controls:
    """What a scenario may do to the emulator itself, when it owns one
    (:class:`LocalEmulator`): restart it, throttle it."""

    restart: Callable[[], Awaitable[str]] | None = None
    throttle: Callable[[float, float], None] | None = None

    @classmethod
    def of(cls, emulator: LocalEmulator, down: float = 1.0) -> Controls:
        return cls(restart=lambda: emulator.restart(down),
                   throttle=lambda seconds, retry_after: emulator.throttle(seconds, retry_after=retry_after))


async def repeatedly(action: Callable[[], int], *, every: float, seconds: float) -> int:
    """Call ``action`` every ``every`` seconds for ``seconds`` (the loop's clock, virtual or
    real); the sum of what it returned (connections reset, links detached)."""
    loop = asyncio.get_running_loop()
    end, count = loop.time() + seconds, 0
    while loop.time() < end:
        count += action()
        await asyncio.sleep(every)
    return count


def resets(*, every: float = 2.0, seconds: float = 12.0) -> Inject:
    """Every connection through the proxy reset every ``every`` seconds for ``seconds``."""
    async def inject(proxy: TcpFaultProxy, _emulator: Controls) -> str:
        count = await repeatedly(proxy.reset_all, every=every, seconds=seconds)
        return f"every connection reset every {every:g} s for {seconds:g} s ({count} resets)"
    return inject


def black_hole(seconds: float) -> Inject:
    """Nothing relayed or answered for ``seconds``; the connections it caught stay dead."""
    async def inject(proxy: TcpFaultProxy, _emulator: Controls) -> str:
        proxy.black_hole()
        await asyncio.sleep(seconds)
        proxy.pass_through()
        return f"no byte relayed for {seconds:g} s ({proxy.swallowed} connections swallowed)"
    return inject


def restart() -> Inject:
    """The emulator stops and starts again on the same port."""
    async def inject(proxy: TcpFaultProxy, emulator: Controls) -> str:
        assert emulator.restart is not None, "this scenario needs an emulator it may restart"
        return await emulator.restart()
    return inject


def throttle(seconds: float, *, retry_after: float = 4.0) -> Inject:
    """The emulator answers server-busy (``retry_after``) to every receiver for ``seconds``."""
    async def inject(proxy: TcpFaultProxy, emulator: Controls) -> str:
        assert emulator.throttle is not None, "this scenario needs an emulator it may throttle"
        emulator.throttle(seconds, retry_after)
        await asyncio.sleep(seconds)
        return f"server busy for {seconds:g} s, retry-after {retry_after:g} s"
    return inject


def _expected(last: dict[str, int]) -> set[tuple[str, int]]:
    return {(pid, seq) for pid, top in last.items() for seq in range(top + 1)}


async def run_source_fault(connection_string: str, hub: str, inject: Inject, *, name: str = "",
                           partitions: int = 4, rate: float = 200.0, before: float = 3.0, after: float = 4.0,
                           recovery_timeout: float = 40.0, processors: int = 1,
                           emulator: Controls | None = None, idle_timeout: float | None = 10.0,
                           **options: Any) -> SourceFaultRun:
    """Send ``rate`` events/s to ``hub`` (fresh, ``partitions`` partitions) with the
    official producer; read them with EventProcessors from ``earliest``, without
    checkpoints, through a :class:`TcpFaultProxy`; inject the fault ``before`` seconds
    after every partition is dispatched; keep sending ``after`` seconds past its end.
    ``idle_timeout`` goes to the consumer client: how soon a dead AMQP connection is noticed."""
    from azure.eventhub import EventData
    from azure.eventhub.aio import EventHubProducerClient

    from eventprocessor.stores.memory import InMemoryCheckpointStore

    host, port = connection_string.split("sb://", 1)[1].split(";", 1)[0].rsplit(":", 1)
    ledger = DeliveryRecorder()
    errors: list[Exception] = []
    loop = asyncio.get_running_loop()
    async with TcpFaultProxy(host, int(port)) as proxy:
        proxied = connection_string.replace(f"sb://{host}:{port}", f"sb://127.0.0.1:{proxy.port}")
        client_options = {"idle_timeout": idle_timeout} if idle_timeout else {}
        sources = [EventHubSource.from_connection_string(proxied, eventhub_name=hub, **client_options)
                   for _ in range(processors)]
        store = InMemoryCheckpointStore()

        async def on_error(error: Exception, _context: object) -> None:
            errors.append(error)

        handler = recording_handler(ledger, checkpoint=False, checkpoint_on_release=False)
        running = [EventProcessor(source, store, handler, owner_id=f"p{i}", error_handler=on_error,
                                  initial_event_position=EventPosition.earliest(), **{**OPTIONS, **options})
                   for i, source in enumerate(sources)]
        producer_client = EventHubProducerClient.from_connection_string(connection_string, eventhub_name=hub)
        renew_producer = False  # after a restart: the official producer's every send then reconnects (~1.4 s)
        sending = asyncio.Event()
        sending.set()
        stop = asyncio.Event()
        sent = 0
        acked: dict[str, int] = {str(i): 0 for i in range(partitions)}  # events the hub acknowledged

        async def produce() -> None:
            nonlocal sent, producer_client, renew_producer
            tick = 0.05
            per_tick = max(1, int(rate * tick))
            while not stop.is_set():
                if not sending.is_set():  # the emulator is restarting
                    await asyncio.sleep(tick)
                    continue
                pid = str((sent // per_tick) % partitions)
                if renew_producer:
                    renew_producer = False
                    await producer_client.close()
                    producer_client = EventHubProducerClient.from_connection_string(connection_string,
                                                                                    eventhub_name=hub)
                try:
                    await producer_client.send_batch([EventData(f"e{sent + i}") for i in range(per_tick)],
                                                     partition_id=pid)
                    sent += per_tick
                    acked[pid] += per_tick
                except Exception as error:  # noqa: BLE001 - a send the restart interrupted: not produced
                    logger.debug("send failed: %r", error)
                await asyncio.sleep(tick)

        def dispatched() -> bool:
            live: dict[str, int] = {}
            for p in running:
                for pid in p.owned_partitions:
                    pump = p.pump(pid)
                    if pump is not None and pump.alive:
                        live[pid] = live.get(pid, 0) + 1
            return all(live.get(str(i)) == 1 for i in range(partitions))

        async def last_sequence_numbers() -> dict[str, int]:
            from azure.eventhub.aio import EventHubConsumerClient
            async with EventHubConsumerClient.from_connection_string(
                    connection_string, consumer_group="$Default", eventhub_name=hub) as reader:
                return {str(i): (await reader.get_partition_properties(str(i)))["last_enqueued_sequence_number"]
                        for i in range(partitions)}

        async def caught_up() -> bool:
            # On a fresh hub, the acknowledged sends of a partition are sequence numbers 0..n-1.
            return _expected({pid: n - 1 for pid, n in acked.items()}) <= ledger.processed()

        async def wait(condition: Callable[[], Awaitable[bool]], timeout: float) -> float | None:
            end = loop.time() + timeout
            while loop.time() < end:
                if await condition():
                    return loop.time()
                await asyncio.sleep(0.2)
            return None

        async def settled() -> bool:
            return dispatched() and await caught_up()

        def caught_up_to(mark: dict[str, int]) -> Callable[[], Awaitable[bool]]:
            async def condition() -> bool:
                return dispatched() and _expected({pid: n - 1 for pid, n in mark.items()}) <= ledger.processed()
            return condition

        producer = None
        try:
            try:
                for p in running:
                    await p.start()
                producer = asyncio.ensure_future(produce())
                if await wait(settled, 30) is None:
                    raise RuntimeError("the processors never dispatched every partition before the fault")
                await asyncio.sleep(before)
                controls = emulator or Controls()
                if controls.restart is not None:
                    inner_restart = controls.restart

                    async def paused_restart() -> str:
                        nonlocal renew_producer
                        sending.clear()  # the producer would fail meanwhile: nothing it sends is lost or counted
                        try:
                            return await inner_restart()
                        finally:
                            renew_producer = True
                            sending.set()
                    controls = Controls(paused_restart, controls.throttle)
                note = await inject(proxy, controls)
                proxy.pass_through()
                fault_over = loop.time()
                bound = recovery_bound(idle_timeout)
                # Recovered: every partition dispatched once and every event the hub had
                # acknowledged by the first send after the fault processed (events keep
                # coming: "all of them" would race the producer; a paused producer must
                # have sent again, or a restart would count as recovered at once).
                ended_with = dict(acked)

                async def sent_again() -> bool:
                    return all(acked[pid] > ended_with[pid] for pid in acked)

                await wait(sent_again, 15)
                recovered = await wait(caught_up_to(dict(acked)), recovery_timeout)
                await asyncio.sleep(after)
                stop.set()
                await producer
                await wait(caught_up, 30)
                # What the hub holds, which may be more than was acknowledged (a send whose
                # answer a restart interrupted).
                last = await last_sequence_numbers()
            finally:
                await producer_client.close()
        finally:
            stop.set()
            if producer is not None and not producer.done():
                producer.cancel()
            for p in running:
                await p.stop()
            for source in sources:
                await source.close()
        expected = _expected(last)
        return SourceFaultRun(
            name=name, bound=bound, recovered_after=None if recovered is None else recovered - fault_over,
            produced=len(expected), lost=len(expected - ledger.processed()),
            duplicates_within_claims=ledger.duplicates_within_claims(), after_end=len(ledger.after_end),
            duplicates=ledger.duplicates(), connections=proxy.accepted, note=note, errors=errors)


def recovery_bound(idle_timeout: float | None) -> float:
    """After the fault ends: a receive that hangs on a dead connection fails within the
    client's ``idle_timeout``; an open in flight fails within ``operation_timeout``
    (10 s); the pump then waits its reconnect backoff (at most 5 s) and reopens; plus
    5 s of slack for a shared machine and real I/O (catching up included)."""
    return (idle_timeout or 0.0) + 10.0 + PUMP_MAX_BACKOFF + 5.0


class LocalEmulator:
    """An :class:`~eventprocessor.emulators.eventhubs.EventHubsEmulator` on the running event loop that
    can be throttled and restarted on the same port with its events kept (the same
    in-memory namespace serves again: a service restart with durable storage). The
    emulator's process (``python -m eventprocessor.emulators.eventhubs``) keeps nothing across a
    restart: its hubs come back empty.

    (On a thread of its own, each send of the official producer took ~0.5 s: the
    emulator shares the loop of the test instead, which is fine at a few hundred events/s.)

    Example::

        async with LocalEmulator(["hub"], partitions=4) as emulator:
            ...
            await emulator.restart(down=1.0)
    """

    def __init__(self, eventhubs: list[str], *, partitions: int = 4) -> None:
        from eventprocessor.emulators.eventhubs import EventHubsEmulator

        self.emulator = EventHubsEmulator(eventhubs=eventhubs, partitions=partitions)

    @property
    def connection_string(self) -> str:
        return self.emulator.connection_string

    async def __aenter__(self) -> LocalEmulator:
        await self.emulator.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.emulator.stop()

    def throttle(self, seconds: float, *, retry_after: float) -> None:
        """See :meth:`~eventprocessor.emulators.eventhubs.broker.Namespace.throttle`."""
        self.emulator.namespace.throttle(seconds, retry_after=retry_after)

    @property
    def throttled(self) -> int:
        return self.emulator.namespace.throttled

    async def restart(self, down: float = 1.0) -> str:
        """Stop serving (every connection closed), stay down ``down`` seconds, serve again
        on the same port with the same events."""
        await self.emulator.stop()
        await asyncio.sleep(down)
        await self.emulator.start()
        return f"emulator stopped, down {down:g} s, started again on the same port with its events"
