"""A local Event Hubs emulator that the official ``azure-eventhub`` clients talk to unchanged.

It speaks AMQP 1.0 on loopback (plain AMQP, no TLS), and AMQP over WebSockets on the
same port, and serves event hubs kept in memory: SASL and CBS ``put-token``, the
``$management`` READ operations behind ``get_eventhub_properties`` /
``get_partition_ids`` / ``get_partition_properties``, sends (single, batched, to a
partition, by partition key, round robin, to a partition with a key), receives from
any starting position with credit-based flow control, every message section kept
(header, delivery and message annotations, properties, footer), owner levels (epochs)
with the service's stealing rules, and the service's error conditions. Point a client
at it with the connection string it prints (``UseDevelopmentEmulator=true``); over
WebSockets, add ``transport_type=TransportType.AmqpOverWebsocket`` and
``custom_endpoint_address=emulator.custom_endpoint_address``.

Codec. The AMQP codec is this package's own (:mod:`.codec`, :mod:`.frames`), not the
client's private ``azure.eventhub._pyamqp``: the emulator needs no Azure package, no
private module can change under it, and it is an independent peer of the client, so
the conformance tests compare two implementations instead of one with itself. A broker
needs only a small codec: it writes performatives with every field present and copies
message sections without decoding them. Measured cost: see ``benchmarks/RESULTS.md``
(section ``e2e``, the emulator's ceiling).

Example::

    from azure.eventhub.aio import EventHubProducerClient
    from eventprocessor.emulators.eventhubs import EventHubsEmulator

    async with EventHubsEmulator(eventhubs=["telemetry"], partitions=4) as emulator:
        producer = EventHubProducerClient.from_connection_string(
            emulator.connection_string, eventhub_name="telemetry")
        async with producer:
            await producer.send_batch([EventData(b"hello")])

Command line: ``python -m eventprocessor.emulators.eventhubs --port 0 --eventhub telemetry --partitions 4``
(also ``eventprocessor emulator``) prints the connection string once it accepts connections,
then one per event hub with its ``EntityPath``, and stops cleanly on SIGINT or SIGTERM.

Limits. Tokens are not checked unless ``sas_key`` is given (any token is accepted, as in
Microsoft's Docker emulator). Events live in memory only: nothing survives a restart.
Each partition keeps at most ``max_events_per_partition`` events (100,000 by default)
and none older than ``retention_seconds`` (1 hour, Microsoft's emulator's retention);
the oldest are dropped first. Messages up to 1 MB. Any number of hubs, up to 1024
partitions per hub, any number of consumer groups (Microsoft's emulator: 10 hubs, 32
partitions, 20 consumer groups).
"""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Iterable
from types import TracebackType
from typing import TextIO

from .broker import Namespace
from .config import EmulatorConfig, EmulatorConfigError, EventHubConfig
from .server import AMQPServer

__all__ = ["DEFAULT_EVENTHUB", "EventHubsEmulator", "EmulatorConfig", "EventHubConfig", "EmulatorConfigError",
           "connection_string", "DEFAULT_KEY_NAME", "DEFAULT_KEY", "serve"]

logger = logging.getLogger(__name__)

# The values of Microsoft's emulator connection string. Not secrets: documented placeholders.
DEFAULT_KEY_NAME = "RootManageSharedAccessKey"
DEFAULT_KEY = "SAS_KEY_VALUE"


def connection_string(host: str, port: int, *, eventhub_name: str | None = None,
                      key_name: str = DEFAULT_KEY_NAME, key: str = DEFAULT_KEY) -> str:
    """The connection string ``azure-eventhub`` needs for an emulator at ``host:port``."""
    entity = f"EntityPath={eventhub_name};" if eventhub_name else ""
    return (f"Endpoint=sb://{host}:{port};SharedAccessKeyName={key_name};SharedAccessKey={key};{entity}"
            "UseDevelopmentEmulator=true")


DEFAULT_EVENTHUB = "telemetry"
"""The hub served when none is named."""


class EventHubsEmulator:
    """The emulator in this event loop, as an async context manager.

    Give a :class:`EmulatorConfig`, or name hubs with ``eventhubs=`` (all with
    ``partitions`` partitions and the ``consumer_groups``). With no hubs at all it serves
    :data:`DEFAULT_EVENTHUB` (``telemetry``, the hub the docs' examples and the
    samples read) with ``partitions`` partitions and consumer group ``cg1``, as
    Microsoft's default configuration serves its ``eh1``.
    ``port=0`` picks a free port. With ``sas_key``, tokens must be signed with it.

    Example::

        async with EventHubsEmulator(eventhubs=["hub"], partitions=4) as emulator:
            print(emulator.connection_string)
    """

    def __init__(self, config: EmulatorConfig | None = None, *, eventhubs: Iterable[str] = (),
                 partitions: int = 2, consumer_groups: Iterable[str] = (), host: str = "127.0.0.1", port: int = 0,
                 sas_key: str | None = None, sas_key_name: str | None = None) -> None:
        flags = EmulatorConfig.from_flags(eventhubs=list(eventhubs), partitions=partitions,
                                          consumer_groups=list(consumer_groups))
        config = config.with_hubs(flags) if config is not None else flags
        if not config.eventhubs:
            config = config.with_hubs(EmulatorConfig((EventHubConfig(DEFAULT_EVENTHUB, partitions, ("cg1",)),)))
        self.config = config
        self.namespace = Namespace(host=host, max_events_per_partition=config.max_events_per_partition,
                                   retention_seconds=config.retention_seconds)
        for hub in config.eventhubs:
            self.namespace.add_hub(hub.name, hub.partition_count, list(hub.consumer_groups))
        self._sas_key = sas_key
        self._server = AMQPServer(self.namespace, host=host, port=port, sas_key=sas_key,
                                  sas_key_name=sas_key_name or (DEFAULT_KEY_NAME if sas_key else None))
        self._started = False

    def __repr__(self) -> str:
        hubs = ", ".join(f"{h.name}:{h.partition_count}" for h in self.config.eventhubs)
        return f"EventHubsEmulator(host={self.host!r}, port={self.port}, eventhubs=[{hubs}])"

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def connection_string(self) -> str:
        """The namespace connection string (pass ``eventhub_name=`` to the client)."""
        return connection_string(self.host, self.port, key=self._sas_key or DEFAULT_KEY)

    def connection_string_for(self, eventhub_name: str) -> str:
        """A connection string with ``EntityPath`` set to ``eventhub_name``."""
        return connection_string(self.host, self.port, eventhub_name=eventhub_name, key=self._sas_key or DEFAULT_KEY)

    @property
    def custom_endpoint_address(self) -> str:
        """``sb://host:port``: what a client over WebSockets
        (``transport_type=TransportType.AmqpOverWebsocket``) passes as
        ``custom_endpoint_address`` to reach this port instead of 443."""
        return f"sb://{self.host}:{self.port}"

    @property
    def connections(self) -> int:
        """How many client connections are open now."""
        return len(self._server.connections)

    async def start(self) -> None:
        if self._started:
            return
        await self._server.start()
        self._started = True
        logger.info("Event Hubs emulator listening on %s:%d (%d event hubs)", self.host, self.port,
                    len(self.config.eventhubs))
        if self.host not in ("127.0.0.1", "::1", "localhost"):
            logger.warning("the Event Hubs emulator listens on %s, beyond this machine: it accepts any token "
                           "and has no TLS", self.host)
        for note in self.config.beyond_microsoft_limits:
            logger.info("beyond Microsoft's emulator limits: %s", note)

    async def stop(self) -> None:
        if self._started:
            self._started = False
            await self._server.stop()

    async def __aenter__(self) -> EventHubsEmulator:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()


async def serve(emulator: EventHubsEmulator, *, out: TextIO = sys.stdout) -> None:
    """Run ``emulator`` until SIGINT or SIGTERM. Once it listens, print its connection
    string, then one per event hub with its ``EntityPath`` (what the Spark source and
    ``eventprocessor status`` take), a line each."""
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await emulator.start()
        hubs = [emulator.connection_string_for(hub.name) for hub in emulator.config.eventhubs]
        out.write("\n".join([emulator.connection_string, *hubs]) + "\n")
        out.flush()
        await stopping.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await emulator.stop()
