"""``EventHubSource``: the event source on Azure Event Hubs (see the package docs)."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any

from ...errors import ConfigurationError
from ...events import EventPosition
from ...extras import install_command
from ..base import EventHubProperties, EventSource, PartitionProperties, PartitionReceiver
from .failures import ErrorContext
from .fallback import _BatchReceiver
from .lean import _LeanReceiver, lean_receive_supported
from .receiver import SourceLink, Throttle

__all__ = ["EventHubSource"]

logger = logging.getLogger(__name__)


class EventHubSource(EventSource):
    """An Event Hub, read through ``azure-eventhub``'s async consumer client.

    Construct it with a connection string (:meth:`from_connection_string`, which also
    takes the emulators' ``UseDevelopmentEmulator=true`` strings), or with the
    namespace, the hub and an ``azure.identity.aio`` credential (or an
    ``AzureNamedKeyCredential`` / ``AzureSasCredential``). Other keyword arguments
    (``transport_type``, ``retry_total``, ...) go to ``EventHubConsumerClient``.
    Credentials and connection strings are kept private: they never appear in
    ``repr``, logs or error messages.

    ``operation_timeout`` bounds ``get_partition_ids`` and the opening of a receiver;
    ``partition_ids_ttl`` is how long partition ids are reused before the hub is asked
    again; ``idle_timeout`` (the AMQP connection idle time-out, 30 s by default) is how
    soon a receiver notices a connection that went silent (a black-holed network path, a
    hung gateway): the hub keeps a live connection busy with empty frames, so only a dead
    one stays silent that long. A server-busy answer (throttling) is waited out: no
    receiver is opened and no partition ids are asked for until its retry-after passed.

    ``lean_receive`` chooses how receivers read (see the package docs): ``True`` (the
    default) drives the client's own consumer when the installed azure-eventhub offers
    the internals that needs, ``False`` always receives through azure-eventhub's public
    ``receive_batch`` (slower; what a future azure-eventhub without those internals
    gets, and a way to rule the lean path out when chasing a problem).
    :attr:`uses_lean_receive` says which one is used, :attr:`client_options` what
    every client is built with.

    Example::

        from azure.identity.aio import DefaultAzureCredential

        source = EventHubSource("mynamespace.servicebus.windows.net", "telemetry", DefaultAzureCredential())
        async with EventProcessor(source, store, MyProcessor):
            ...

        public = EventHubSource.from_connection_string(conn_str, lean_receive=False)
        assert not public.uses_lean_receive
    """

    def __init__(self, fully_qualified_namespace: str, eventhub_name: str, credential: Any, *,
                 operation_timeout: float = 10.0, partition_ids_ttl: float = 30.0,
                 idle_timeout: float | None = 30.0, lean_receive: bool = True, **client_kwargs: Any) -> None:
        if not fully_qualified_namespace:
            raise ConfigurationError("fully_qualified_namespace must not be empty")
        if not eventhub_name:
            raise ConfigurationError("eventhub_name must not be empty")
        if operation_timeout <= 0:
            raise ConfigurationError(f"operation_timeout must be positive, got {operation_timeout}")
        if partition_ids_ttl < 0:
            raise ConfigurationError(f"partition_ids_ttl must not be negative, got {partition_ids_ttl}")
        if idle_timeout is not None and idle_timeout <= 0:
            raise ConfigurationError(f"idle_timeout must be positive seconds (or None: never), got {idle_timeout}")
        if not isinstance(lean_receive, bool):
            raise ConfigurationError(f"lean_receive must be True (the lean path where the installed azure-eventhub "
                                     f"allows it) or False (always receive_batch), got {lean_receive!r}")
        if idle_timeout is not None:
            client_kwargs.setdefault("idle_timeout", float(idle_timeout))
        self.fully_qualified_namespace = fully_qualified_namespace
        self.eventhub_name = eventhub_name
        self.operation_timeout = float(operation_timeout)
        self.partition_ids_ttl = float(partition_ids_ttl)
        self._credential = credential
        self._tls: Any = None
        self._conn_str: str | None = None
        self._client_kwargs = client_kwargs
        self._clients: dict[str, Any] = {}
        self._management: Any = None
        self._partition_ids: list[str] | None = None
        self._partition_ids_at = 0.0
        self._errors = ErrorContext(fully_qualified_namespace, eventhub_name, None)
        self._lean: bool | None = None if lean_receive else False  # None: not checked yet
        self.clock: Callable[[], float] = time.monotonic
        # The hub's server-busy answers, shared with every receiver (read through self.clock).
        self._throttle = Throttle(lambda: repr(self), clock=lambda: self.clock())

    @classmethod
    def from_connection_string(cls, conn_str: str, *, eventhub_name: str | None = None,
                               **kwargs: Any) -> EventHubSource:
        """Build from an Event Hubs connection string (``Endpoint=sb://...;SharedAccessKeyName=...;
        SharedAccessKey=...[;EntityPath=hub]``, or an emulator string with
        ``UseDevelopmentEmulator=true``)."""
        try:
            from azure.eventhub import parse_connection_string
        except ImportError as error:  # pragma: no cover - depends on the extra
            raise ConfigurationError(f"EventHubSource needs the [eventhub] extra: {install_command(['eventhub'])}") \
                from error
        if not isinstance(conn_str, str) or not conn_str.strip():
            raise ConfigurationError("the Event Hubs connection string is empty")
        try:
            props = parse_connection_string(conn_str)
        except Exception:
            raise ConfigurationError(
                "the Event Hubs connection string is malformed: expected 'Endpoint=sb://<namespace>/;"
                "SharedAccessKeyName=<name>;SharedAccessKey=<key>' (values not shown)") from None
        name = eventhub_name or props.eventhub_name
        if not name:
            raise ConfigurationError(
                "no event hub name: pass eventhub_name= or put EntityPath in the connection string")
        if eventhub_name and props.eventhub_name and eventhub_name != props.eventhub_name:
            raise ConfigurationError(
                f"eventhub_name {eventhub_name!r} differs from the connection string's EntityPath "
                f"{props.eventhub_name!r}")
        namespace = props.fully_qualified_namespace
        source = cls(namespace, name, None, **kwargs)
        source._conn_str = conn_str
        source._errors = ErrorContext(namespace, name, props.shared_access_key or props.shared_access_signature)
        return source

    def __repr__(self) -> str:
        return (f"EventHubSource(fully_qualified_namespace={self.fully_qualified_namespace!r}, "
                f"eventhub_name={self.eventhub_name!r})")

    def _new_client(self, consumer_group: str, **overrides: Any) -> Any:
        from azure.eventhub.aio import EventHubConsumerClient

        kwargs = {**self._client_kwargs, **overrides}
        if not ({"ssl_context", "connection_verify"} & kwargs.keys()) and not kwargs.get("uamqp_transport"):
            kwargs["ssl_context"] = self._ssl_context()
        if self._conn_str is not None:
            return EventHubConsumerClient.from_connection_string(
                self._conn_str, consumer_group=consumer_group, eventhub_name=self.eventhub_name, **kwargs)
        return EventHubConsumerClient(self.fully_qualified_namespace, self.eventhub_name, consumer_group,
                                      self._credential, **kwargs)

    def _ssl_context(self) -> Any:
        """One TLS context for every connection of this source, the one the client would
        build for each (``certifi``'s CA bundle, certificates and host names checked).
        The client builds it for every connection, even a plain one to an emulator, and
        loading the CA bundle holds the event loop about 50 ms: one per receiver, so a
        processor taking 16 partitions stalled its loop for most of a second."""
        if self._tls is None:
            import ssl

            import certifi

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.load_verify_locations(certifi.where())
            self._tls = context
        return self._tls

    @property
    def credential(self) -> Any:
        """The credential given to the constructor (``None`` for a source built from a
        connection string, which is never shown). An ``azure.identity.aio`` credential
        is the caller's to close.

        Example::

            source = EventHubSource(namespace, "telemetry", DefaultAzureCredential())
            ...
            await source.close()
            await source.credential.close()
        """
        return self._credential

    @property
    def client_options(self) -> Mapping[str, Any]:
        """The keyword arguments every ``EventHubConsumerClient`` of this source is built
        with (``idle_timeout`` and what was passed beyond this class's own), as a
        read-only copy whose secret-bearing values (a proxy's password, anything named
        like a key, token or secret) read ``"***"``. The connection string and the
        credential are never among them.

        Example::

            source = EventHubSource.from_connection_string(conn_str, transport_type=TransportType.AmqpOverWebsocket)
            assert source.client_options["idle_timeout"] == 30.0
        """
        return MappingProxyType(_masked(self._client_kwargs))

    @property
    def clients(self) -> Mapping[str, Any]:
        """The ``EventHubConsumerClient`` opened for each consumer group so far (every
        receiver of a group shares one), keyed by consumer group; a read-only snapshot,
        for inspection: :meth:`close` closes them.

        Example::

            await source.open_receiver("0", consumer_group="analytics", starting_position=EventPosition.latest(),
                                       owner_level=None)
            assert source.clients["analytics"].eventhub_name == source.eventhub_name
        """
        return MappingProxyType(dict(self._clients))

    def _client(self, consumer_group: str) -> Any:
        client = self._clients.get(consumer_group)
        if client is None:
            client = self._new_client(consumer_group)
            self._clients[consumer_group] = client
        return client

    @property
    def uses_lean_receive(self) -> bool:
        """Whether receivers drive the client's consumer directly (see the package docs):
        ``False`` with ``lean_receive=False``, or when the installed azure-eventhub lacks
        the internals that needs (then it logs a warning once)."""
        if self._lean is None:
            from azure.eventhub.aio import EventHubConsumerClient

            self._lean = lean_receive_supported(EventHubConsumerClient)
            if not self._lean:
                logger.warning("the installed azure-eventhub lacks the consumer internals EventHubSource drives; "
                               "receiving through its public receive_batch instead (slower)")
        return self._lean

    def _use_public_receive(self) -> None:
        self._lean = False

    async def get_partition_ids(self) -> list[str]:
        """The hub's partition ids, reused for ``partition_ids_ttl`` seconds.

        Raises :class:`EventSourceError` within ``operation_timeout`` seconds if the hub
        cannot say.
        """
        now = self.clock()
        if self._partition_ids is not None and now - self._partition_ids_at < self.partition_ids_ttl:
            return list(self._partition_ids)
        wait = self._throttle.remaining()
        if wait > 0:
            raise self._errors.error("server-busy", f"reading the partition ids: the hub is throttling; retry after "
                                                    f"{wait:.1f} s", retry_after=wait)
        ids = await self._fetch_partition_ids()
        self._partition_ids, self._partition_ids_at = ids, self.clock()
        return list(ids)

    async def _fetch_partition_ids(self) -> list[str]:
        if self._management is None:
            # Its own client, without the client's retries: this call has a time budget.
            self._management = self._new_client("$default", retry_total=0)
        deadline = self.clock() + self.operation_timeout
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - self.clock()
            try:
                ids = await asyncio.wait_for(self._management.get_partition_ids(), max(0.01, remaining))
                return [str(pid) for pid in ids]
            except asyncio.CancelledError:
                raise
            except BaseException as error:
                failure = self._throttle.note(self._errors.classify(error, "reading the partition ids"))
                # One quick second attempt for a hub that may be restarting; a missing
                # hub or a rejected credential will not change in half a second.
                if attempt >= 2 or failure.reason not in ("unreachable", "disconnected") \
                        or deadline - self.clock() < 1.0:
                    logger.debug("%r: %s", self, failure)
                    raise failure from None
                await asyncio.sleep(0.5)

    async def open_receiver(self, partition_id: str, *, consumer_group: str, starting_position: EventPosition,
                            owner_level: int | None, prefetch: int = 300,
                            track_last_enqueued_event_properties: bool = False) -> PartitionReceiver:
        client = self._client(consumer_group)
        kind = _LeanReceiver if self.uses_lean_receive else _BatchReceiver
        link = SourceLink(self.eventhub_name, self.operation_timeout, self._errors, self._throttle,
                          self._use_public_receive)
        return kind(link, client, partition_id, consumer_group, starting_position, owner_level, prefetch,
                    track_last_enqueued_event_properties)

    async def get_eventhub_properties(self) -> EventHubProperties:
        """The hub's name, creation time and partition ids, asked now (the partition ids
        :meth:`get_partition_ids` reuses are not touched), within ``operation_timeout``
        seconds; raises :class:`EventSourceError` if the hub cannot say."""
        raw = await self._ask(lambda client: client.get_eventhub_properties(), "reading the event hub's properties")
        return EventHubProperties(eventhub_name=str(raw.get("eventhub_name", self.eventhub_name)),
                                  created_at=raw.get("created_at"),
                                  partition_ids=tuple(str(pid) for pid in raw.get("partition_ids", ())))

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        """The partition's bounds and newest event, within ``operation_timeout`` seconds;
        raises :class:`EventSourceError` if the hub cannot say."""
        raw = await self._ask(lambda client: client.get_partition_properties(partition_id),
                              f"reading the properties of partition {partition_id}", partition_id=partition_id)
        return PartitionProperties(
            partition_id=str(raw.get("id", partition_id)),
            beginning_sequence_number=int(raw.get("beginning_sequence_number", 0)),
            last_enqueued_sequence_number=int(raw.get("last_enqueued_sequence_number", -1)),
            last_enqueued_offset=str(raw.get("last_enqueued_offset", "-1")),
            last_enqueued_time_utc=raw.get("last_enqueued_time_utc"),
            is_empty=bool(raw.get("is_empty", False)),
        )

    async def _ask(self, call: Callable[[Any], Awaitable[dict[str, Any]]], doing: str, *,
                   partition_id: str | None = None) -> dict[str, Any]:
        """One management request through this source's management client, within
        ``operation_timeout``; a failure raised as a classified :class:`EventSourceError`."""
        if self._management is None:
            self._management = self._new_client("$default", retry_total=0)
        try:
            return await asyncio.wait_for(call(self._management), self.operation_timeout)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            raise self._throttle.note(self._errors.classify(error, doing, partition_id=partition_id)) from None

    async def close(self) -> None:
        clients = list(self._clients.values()) + ([self._management] if self._management is not None else [])
        self._clients, self._management = {}, None
        for client in clients:
            try:
                await client.close()
            except Exception:
                logger.debug("closing an Event Hubs client failed", exc_info=True)



_SECRET_WORDS = ("password", "secret", "token", "key", "signature", "credential")


def _masked(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of client options with the values of secret-bearing names (at any depth of
    nested dicts, as ``http_proxy``'s ``password``) replaced by ``"***"``."""
    return {name: "***" if any(word in str(name).lower() for word in _SECRET_WORDS)
            else _masked(value) if isinstance(value, Mapping) else value
            for name, value in options.items()}
