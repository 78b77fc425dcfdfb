"""The real AMQP path for the demo: the Event Hubs emulator in a process of its own and the
official producer feeding it."""
from __future__ import annotations

from contextlib import AsyncExitStack
from typing import Any

from ..user_errors import CommandError

__all__ = ["EmulatorFeed"]

# The demo's hub never grows, and on the emulator asking for its partition ids is an AMQP
# management round trip (a new connection, about 0.5 s of this process's one event loop):
# refreshed every few seconds, it alone would make ticks overrun the demo's 0.5 s interval.
EMULATOR_PARTITION_IDS_TTL = 3600.0


class EmulatorFeed:
    """The real AMQP path: the Event Hubs emulator in a process of its own, the official
    producer sending keyed batches, and an ``EventHubSource`` for the processors.

    The emulator gets its own process (and core) so that the demo's one event loop
    runs only the client side: at start the processors open one AMQP receiver per
    partition, and with the emulator's side of those connections on the same loop
    too, the ticks of the demo's 0.5 s interval overran."""

    def __init__(self, partitions: int) -> None:
        self.partitions = partitions
        self.emulator: Any = None
        self.producer: Any = None
        self.source: Any = None
        self.sent = 0

    async def start(self, stack: AsyncExitStack) -> str:
        from azure.eventhub.aio import EventHubProducerClient

        from eventprocessor.emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process
        from eventprocessor.sources.eventhub import EventHubSource

        stack.push_async_callback(self.close)
        try:
            # Started synchronously (about a second, before any processor runs), so that
            # nothing can cancel the demo between the start and the registration of its stop.
            self.emulator = start_emulator_process(["--eventhub", "demo-hub", "--partitions", str(self.partitions)])
        except EmulatorUnavailable as error:
            raise CommandError(f"the Event Hubs emulator did not start: {' '.join(str(error).split())}") from None
        stack.callback(self.emulator.stop)
        conn = self.emulator.connection_string
        self.producer = EventHubProducerClient.from_connection_string(conn, eventhub_name="demo-hub")
        self.source = EventHubSource.from_connection_string(conn, eventhub_name="demo-hub",
                                                            partition_ids_ttl=EMULATOR_PARTITION_IDS_TTL)
        # Asked once now, not by the four processors' first ticks at once.
        await self.source.get_partition_ids()
        return f"Event Hubs emulator at 127.0.0.1:{self.emulator.port} (AMQP, pid {self.emulator.pid})"

    @property
    def connection_string(self) -> str:
        return str(self.emulator.connection_string)

    async def send(self, count: int) -> None:
        from azure.eventhub import EventData

        key = f"device-{(self.sent // max(1, count)) % 97}"
        await self.producer.send_batch([EventData(f"reading {self.sent + i}") for i in range(count)],
                                       partition_key=key)
        self.sent += count

    async def produced(self) -> set[tuple[str, int]]:
        """Every (partition, sequence number) the hub holds, read from its properties."""
        result: set[tuple[str, int]] = set()
        for pid in await self.producer.get_partition_ids():
            last = (await self.producer.get_partition_properties(pid))["last_enqueued_sequence_number"]
            result.update((pid, seq) for seq in range(last + 1))
        return result

    async def close(self) -> None:
        """The clients; the emulator process is stopped by the exit stack."""
        if self.producer is not None:
            await self.producer.close()
        if self.source is not None:
            await self.source.close()


