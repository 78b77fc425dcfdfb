"""Azure Event Hubs as an event source, through ``azure-eventhub``.

Needs the ``[eventhub]`` extra. The processor does the load balancing and the
checkpointing; this adapter only reads partition ids and receives. Each partition
receiver opens with the claim's epoch as its owner level, so a newer owner's receiver
disconnects an older one on the service side.

Example::

    source = EventHubSource.from_connection_string(conn_str, eventhub_name="telemetry")
    # or: EventHubSource("mynamespace.servicebus.windows.net", "telemetry", DefaultAzureCredential())
    processor = EventProcessor(source, BlobCheckpointStore.from_connection_string(...), MyProcessor)

How it receives. azure-eventhub's public receive API (``receive_batch``) runs a whole
load-balancing ``EventProcessor`` per call, polls its buffers every 50 ms and builds an
``EventData`` per event. This adapter drives the client's own per-partition consumer
instead (``EventHubConsumerClient._create_consumer`` and the consumer's AMQP handler)
and turns each received AMQP message straight into an :class:`~eventprocessor.Event`.
Connection, authentication, retries of the link and the wire format stay the
client's. It also drops the delivery tags the client's AMQP link would otherwise keep
for every event received (a set that only grows: see ``_LeanReceiver._forget_delivery_tags``).
These are private parts of azure-eventhub: :func:`lean_receive_supported`
checks them once, and when they are missing (a future azure-eventhub) the source
falls back to ``receive_batch`` and logs a warning. ``tests/test_eventhub_source.py``
fails loudly when the installed version no longer offers them. Measured gain: see the
``e2e`` section of ``benchmarks/RESULTS.md``.

Connections. azure-eventhub opens one AMQP connection per receiver (its shared
connection mode does not work with its pure-Python transport), plus one short-lived
connection per management call. Partition ids are therefore cached for
``partition_ids_ttl`` seconds (30 by default): a partition added to the hub is seen
within that time.

Failures. Every failure of the hub is raised as
:class:`~eventprocessor.errors.EventSourceError`, with ``reason`` one of
``unreachable``, ``timeout``, ``not-found`` (hub, consumer group or partition),
``unauthorized`` (a rejected credential), ``refused`` (a request the hub refuses, such
as a position past the end of the partition) or ``disconnected``. The message names the
namespace and the hub, never a key. ``get_partition_ids`` answers or fails within
``operation_timeout`` seconds (10 by default): an unreachable host, an unknown hub or a
rejected credential fail at once, a host that accepts connections but never answers
fails at the timeout. A receiver taken over by a higher owner level raises
:class:`~eventprocessor.errors.ReceiverDisconnectedError`. Policy: the source itself does
not retry beyond one quick second attempt; the processor retries every
load-balancing tick and each partition pump reopens its receiver with backoff (up to
5 s), so the processor keeps trying for as long as it runs.
"""
from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import deque
from datetime import datetime, timezone
from typing import Any, Callable, Deque, Dict, List, Optional, Tuple

from .._install import install_command
from ..errors import ConfigurationError, EventSourceError, ReceiverDisconnectedError
from ..events import BodyType, Event, EventPosition, body_fields, received_event
from .base import EventSource, LastEnqueuedEventProperties, PartitionProperties, PartitionReceiver

__all__ = ["EventHubSource", "to_event", "to_starting_position", "message_to_event", "message_body",
           "lean_receive_supported"]

logger = logging.getLogger(__name__)

# Markers of the errors Event Hubs returns when a receiver with a higher epoch took the
# partition (link stolen / epoch receiver conflict).
_TAKEN_OVER_MARKERS = ("link:stolen", "linkstolen", "higher epoch", "receiver with a higher", "ownerlevel",
                       "owner level")
_NOT_FOUND_MARKERS = ("not-found", "notfound", "could not be found", "status code: 404")
_UNAUTHORIZED_MARKERS = ("unauthorized", "status code: 401", "token authentication failed", "invalidsignature",
                         "authentication")
_REFUSED_MARKERS = ("argument-out-of-range", "argumentoutofrange", "invalid-field", "argument-error",
                    "not-allowed", "resource-limit-exceeded", "message-size-exceeded")
_BUSY_MARKERS = ("server-busy", "serverbusy", "is being throttled")
# Event Hubs says how long to wait in its text ("... Please wait 4 seconds and try again.");
# without it, the service's documented minimum (azure-eventhub waits the same).
_RETRY_AFTER = re.compile(r"wait\s+(\d+(?:\.\d+)?)\s*(?:seconds|second|secs|sec|s)\b", re.I)
_DEFAULT_RETRY_AFTER = 4.0
_UNREACHABLE_MARKERS = ("failed to initiate the connection", "connect call failed", "name or service not known",
                        "connection refused", "socketerror", "socket-error", "errno", "nodename nor servname",
                        "temporary failure in name resolution")
# Secrets that may appear in a library's error text: SAS signatures and whole tokens.
_SECRET_PATTERNS = ((re.compile(r"SharedAccessSignature\s+\S+", re.I), "SharedAccessSignature ***"),
                    (re.compile(r"\b(sig|SharedAccessKey|SharedAccessSignature)=[^;&\s]+", re.I), r"\1=***"))

# Frames the lean receiver asks the client to read per call, and how long it keeps
# reading after the first event of a batch arrived (see _LeanReceiver.receive).
_FRAMES_PER_READ = 4
_GATHER_SECONDS = 0.05

_SEQ = b"x-opt-sequence-number"
_OFFSET = b"x-opt-offset"
_ENQUEUED = b"x-opt-enqueued-time"
_PARTITION_KEY = b"x-opt-partition-key"
_UTC = timezone.utc
_DATA = BodyType.DATA


def to_starting_position(position: EventPosition) -> Tuple[Any, bool]:
    """Map an :class:`EventPosition` to azure-eventhub's (starting_position, inclusive)."""
    if position.kind == "earliest":
        return "-1", False
    if position.kind == "latest":
        return "@latest", False
    if position.kind == "sequence_number":
        return int(position.value), position.inclusive  # type: ignore[arg-type]
    if position.kind == "offset":
        return str(position.value), position.inclusive
    return position.value, position.inclusive


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    return value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else str(value)


def _properties(raw: Optional[Dict[Any, Any]]) -> Dict[str, Any]:
    if not raw:
        return {}
    return {(key.decode("utf-8") if isinstance(key, bytes) else str(key)): value for key, value in raw.items()}


def _amqp_value(value: Any) -> Any:
    """A message-id, correlation-id or content-type as ``EventData`` reads it: strings
    (which arrive as bytes) decoded, a UUID or an int kept, bytes that are not UTF-8 kept."""
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return bytes(value)
    return value


def message_body(message: Any) -> Tuple[bytes, BodyType, Any]:
    """``(body, body_type, amqp_body)`` of a received ``_pyamqp`` message, classified as
    azure-eventhub classifies it (``AmqpAnnotatedMessage``): data sections if there are
    any, else sequence sections if any, else the value (None when there is no body)."""
    if message.data:
        return body_fields(BodyType.DATA, message.data)
    if message.sequence:
        return body_fields(BodyType.SEQUENCE, message.sequence)
    return body_fields(BodyType.VALUE, message.value)


def to_event(event_data: Any, partition_id: Optional[str] = None) -> Event:
    """Convert an ``azure.eventhub.EventData`` to this SDK's :class:`Event`, its body as
    sent (``raw_amqp_message.body`` and ``body_type``)."""
    raw = event_data.raw_amqp_message
    body, body_type, amqp_body = body_fields(BodyType(raw.body_type.value), raw.body)
    return Event(
        body=body,
        sequence_number=event_data.sequence_number,
        offset=str(event_data.offset),
        enqueued_time=event_data.enqueued_time,
        partition_key=_text(event_data.partition_key),
        properties=_properties(event_data.properties),
        partition_id=partition_id,
        message_id=_amqp_value(event_data.message_id),
        content_type=_amqp_value(event_data.content_type),
        correlation_id=_amqp_value(event_data.correlation_id),
        body_type=body_type,
        amqp_body=amqp_body,
    )


def last_enqueued_of(message: Any) -> Optional[LastEnqueuedEventProperties]:
    """The partition's newest event as the service reported it in ``message``'s delivery
    annotations (present when the receiver asked for runtime metrics)."""
    annotations = getattr(message, "delivery_annotations", None) or {}
    seq = annotations.get(b"last_enqueued_sequence_number", annotations.get("last_enqueued_sequence_number"))
    if seq is None:
        return None
    offset = annotations.get(b"last_enqueued_offset", annotations.get("last_enqueued_offset", b"-1"))
    enqueued = annotations.get(b"last_enqueued_time_utc", annotations.get("last_enqueued_time_utc"))
    retrieved = annotations.get(b"runtime_info_retrieval_time_utc", annotations.get("runtime_info_retrieval_time_utc"))
    return LastEnqueuedEventProperties(
        int(seq), offset.decode("ascii") if isinstance(offset, bytes) else str(offset),
        datetime.fromtimestamp(enqueued / 1000, _UTC) if isinstance(enqueued, (int, float)) else enqueued,
        datetime.fromtimestamp(retrieved / 1000, _UTC) if isinstance(retrieved, (int, float)) else retrieved)


def message_to_event(message: Any, partition_id: Optional[str] = None) -> Event:
    """Convert a received AMQP message (azure-eventhub's ``_pyamqp`` ``Message``) to an
    :class:`Event`, without building the ``EventData`` in between. The body is kept as
    sent (see :class:`Event`: ``body_type``, ``amqp_body``)."""
    annotations = message.message_annotations
    data = message.data
    if data and len(data) == 1:  # the usual event: one data section
        body, body_type, amqp_body = data[0], _DATA, None
        if body.__class__ is not bytes:
            body = bytes(body)
    else:
        body, body_type, amqp_body = message_body(message)
    offset = annotations[_OFFSET]
    key = annotations.get(_PARTITION_KEY)
    amqp = message.properties  # the AMQP properties section, None when the producer set none of it
    return received_event(
        body,
        annotations[_SEQ],
        offset.decode("ascii") if isinstance(offset, bytes) else str(offset),
        datetime.fromtimestamp(annotations[_ENQUEUED] / 1000, _UTC),
        key.decode("utf-8") if isinstance(key, bytes) else (None if key is None else str(key)),
        _properties(message.application_properties),
        partition_id,
        None if amqp is None else _amqp_value(amqp.message_id),
        None if amqp is None else _amqp_value(amqp.content_type),
        None if amqp is None else _amqp_value(amqp.correlation_id),
        body_type,
        amqp_body,
    )


def lean_receive_supported(client: Any) -> bool:
    """Whether ``client`` (``EventHubConsumerClient`` or one of them) offers the private
    pieces the lean receive path drives: ``_create_consumer``, and on the consumer
    ``_open``, ``_create_handler`` and ``close`` (``_handler`` and ``_message_buffer``
    are checked on each opened consumer)."""
    if not callable(getattr(client, "_create_consumer", None)):
        return False
    try:
        from azure.eventhub.aio._consumer_async import EventHubConsumer
    except ImportError:
        return False
    return all(callable(getattr(EventHubConsumer, name, None)) for name in ("_open", "close", "_create_handler"))


class _ErrorContext:
    """What a source error names: the namespace, the hub, and the secret to scrub."""

    def __init__(self, namespace: str, eventhub_name: str, secret: Optional[str]) -> None:
        self.namespace = namespace
        self.eventhub_name = eventhub_name
        self.secret = secret

    def scrub(self, text: str) -> str:
        if self.secret:
            text = text.replace(self.secret, "***")
        for pattern, replacement in _SECRET_PATTERNS:
            text = pattern.sub(replacement, text)
        return text

    def error(self, reason: str, what: str, cause: Optional[BaseException] = None, *,
              retry_after: Optional[float] = None) -> EventSourceError:
        detail = ""
        if cause is not None:
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
            detail = f": {type(cause).__name__}" + (f": {self.scrub(first)[:300]}" if first else "")
        return EventSourceError(
            f"event hub {self.eventhub_name!r} in namespace {self.namespace!r}: {what}{detail}",
            fully_qualified_namespace=self.namespace, eventhub_name=self.eventhub_name, reason=reason,
            retry_after=retry_after)

    def classify(self, error: BaseException, doing: str, *, consumer_group: Optional[str] = None,
                 partition_id: Optional[str] = None) -> EventSourceError:
        """The :class:`EventSourceError` for a client exception raised while ``doing``."""
        text = f"{type(error).__name__} {error} {getattr(error, 'condition', '')}".lower()
        where = ""
        if consumer_group is not None:
            where = f" (consumer group {consumer_group!r}, partition {partition_id!r})"
        if isinstance(error, asyncio.TimeoutError):
            return self.error("timeout", f"{doing}{where} did not finish in time", None)
        if any(marker in text for marker in _BUSY_MARKERS):
            found = _RETRY_AFTER.search(f"{error} {getattr(error, 'description', '') or ''}")
            wait = float(found.group(1)) if found else _DEFAULT_RETRY_AFTER
            return self.error("server-busy", f"{doing}{where} was throttled by the hub (server busy); retry after "
                                             f"{wait:g} s", error, retry_after=wait)
        if any(marker in text for marker in _NOT_FOUND_MARKERS):
            thing = "the consumer group, the partition or the event hub" if consumer_group else "the event hub"
            return self.error("not-found", f"{doing}{where} failed: {thing} does not exist", error)
        if any(marker in text for marker in _UNAUTHORIZED_MARKERS) or type(error).__name__ in (
                "ClientAuthenticationError", "CredentialUnavailableError", "AuthenticationError"):
            return self.error("unauthorized", f"{doing}{where} failed: the credential was rejected", error)
        if any(marker in text for marker in _REFUSED_MARKERS):
            return self.error("refused", f"{doing}{where} was refused by the hub", error)
        if any(marker in text for marker in _UNREACHABLE_MARKERS) or isinstance(error, OSError):
            return self.error("unreachable", f"{doing}{where} failed: the hub cannot be reached", error)
        return self.error("disconnected", f"{doing}{where} failed", error)


def _taken_over(error: BaseException) -> bool:
    text = f"{error} {getattr(error, 'condition', '')}".lower()
    return any(marker in text for marker in _TAKEN_OVER_MARKERS)


class _PartitionReceiverBase(PartitionReceiver):
    """What both receive paths share: the partition, group, position and owner level,
    and how a client error becomes this SDK's error."""

    def __init__(self, source: "EventHubSource", client: Any, partition_id: str, consumer_group: str,
                 position: EventPosition, owner_level: Optional[int], prefetch: int, track: bool = False) -> None:
        self._source = source
        self._client = client
        self.partition_id = partition_id
        self.consumer_group = consumer_group
        self._position = position
        self._owner_level = owner_level
        self._prefetch = max(1, prefetch)
        self._track = track
        self._last_enqueued: Optional[LastEnqueuedEventProperties] = None

    @property
    def last_enqueued_event_properties(self) -> Optional[LastEnqueuedEventProperties]:
        return self._last_enqueued

    def __repr__(self) -> str:
        return (f"EventHubReceiver(partition_id={self.partition_id!r}, consumer_group={self.consumer_group!r}, "
                f"owner_level={self._owner_level})")

    def _translate(self, error: BaseException, doing: str = "receiving") -> Exception:
        if isinstance(error, (EventSourceError, ReceiverDisconnectedError)):
            return error
        if _taken_over(error):
            return ReceiverDisconnectedError(
                f"receiver on partition {self.partition_id} of {self._source.eventhub_name!r} (owner level "
                f"{self._owner_level}) was taken over by a higher owner level", partition_id=self.partition_id)
        return self._source._note(self._source._errors.classify(error, doing, consumer_group=self.consumer_group,
                                                                partition_id=self.partition_id))


def _outcome_retrieved(task: "asyncio.Future[Any]") -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("an abandoned receiver open failed: %r", task.exception())


class _LeanReceiver(_PartitionReceiverBase):
    """One partition, read by driving the client's consumer handler directly.

    The handler's message callback appends raw AMQP messages to the consumer's buffer;
    ``receive`` converts up to ``max_batch_size`` of them at a time. Link credit
    (``prefetch``) bounds how far the hub runs ahead of the handler.
    """

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._consumer: Any = None
        self._handler: Any = None
        self._buffer: Deque[Any] = deque()
        self._closed = False
        self._last_sequence_number: Optional[int] = None  # of the last event handed out

    async def _open(self) -> None:
        # Throttled (server-busy): wait out the hub's retry-after instead of asking again.
        await self._source._wait_if_busy()
        # Reopened after a failure (the link dropped its buffer with the consumer): go on
        # right after the last event handed out, neither replaying nor skipping any.
        position = self._position if self._last_sequence_number is None else \
            EventPosition.from_sequence_number(self._last_sequence_number)
        starting_position, inclusive = to_starting_position(position)

        async def unused(*_args: Any) -> None:  # the lean path reads the buffer itself
            return None

        consumer = self._client._create_consumer(
            self.consumer_group, self.partition_id, starting_position, unused, owner_level=self._owner_level,
            prefetch=self._prefetch, event_position_inclusive=inclusive,
            track_last_enqueued_event_properties=self._track)
        self._consumer = consumer
        opening = asyncio.ensure_future(consumer._open())
        # A receiver closed while it opens (its claim ended) can make the client's open
        # fail after wait_for stopped waiting for it; its outcome is of no use then, and
        # unretrieved it would be logged as "Task exception was never retrieved".
        opening.add_done_callback(_outcome_retrieved)
        try:
            await asyncio.wait_for(opening, self._source.operation_timeout)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            await self._drop_consumer()
            raise self._translate(error, "opening a receiver") from None
        handler = getattr(consumer, "_handler", None)
        buffer = getattr(consumer, "_message_buffer", None)
        if not callable(getattr(handler, "do_work_async", None)) or not isinstance(buffer, deque):
            # This azure-eventhub opens consumers differently: use the public path from
            # the next receiver on (the pump reopens after this error).
            await self._drop_consumer()
            self._source._lean = False
            logger.warning("the installed azure-eventhub's consumer lacks the handler or buffer EventHubSource drives; "
                           "receiving through its public receive_batch from now on (slower)")
            raise self._source._errors.error(
                "disconnected", f"the receiver of partition {self.partition_id} is reopened on the public receive path")
        self._handler = handler
        self._buffer = buffer

    async def receive(self, max_batch_size: int, max_wait_time: Optional[float]) -> List[Event]:
        if self._closed:
            raise RuntimeError("receiver is closed")
        if self._consumer is None:
            await self._open()
        buffer = self._buffer
        if not buffer:
            # The client reads as many frames per call as it is asked for and returns
            # early only when the socket stays quiet for its socket timeout (0.2 s).
            # Asking for the whole prefetch would hold a trickle of events until the
            # prefetch filled, so read a few frames at a time, and keep reading only
            # while frames keep coming, for at most _GATHER_SECONDS after the first.
            loop = asyncio.get_running_loop()
            deadline = None if max_wait_time is None else loop.time() + max_wait_time
            first_at: Optional[float] = None
            before, frames = 0, 1
            while True:
                if buffer:
                    now = loop.time()
                    if first_at is None:
                        first_at = now
                    if len(buffer) >= max_batch_size or len(buffer) - before < frames \
                            or now - first_at >= _GATHER_SECONDS:
                        break
                elif deadline is not None and loop.time() >= deadline:
                    return []
                before, frames = len(buffer), self._frames_to_read()
                try:
                    alive = await self._handler.do_work_async(batch=frames)
                except asyncio.CancelledError:
                    raise
                except Exception as error:
                    await self._drop_consumer()
                    raise self._translate(error, "receiving") from None
                if alive is False:
                    await self._drop_consumer()
                    raise self._source._errors.error(
                        "disconnected", f"the receiver of partition {self.partition_id} (consumer group "
                                        f"{self.consumer_group!r}) was closed by the client")
        self._forget_delivery_tags()
        count = min(max_batch_size, len(buffer))
        popleft = buffer.popleft
        pid = self.partition_id
        messages = [popleft() for _ in range(count)]
        if self._track and messages:
            self._last_enqueued = last_enqueued_of(messages[-1]) or self._last_enqueued
        events = [message_to_event(message, pid) for message in messages]
        if events:
            self._last_sequence_number = events[-1].sequence_number
        return events

    def _forget_delivery_tags(self) -> None:
        """The client's AMQP link (``_pyamqp`` ``ReceiverLink``) adds the tag of every
        delivery it receives to ``_received_delivery_tags`` and removes it only when it
        sends a disposition for it. azure-eventhub never sends one (Event Hubs deliveries
        need no settling), so the set grows by a tag per event for as long as the
        receiver stays open: about 100 bytes per event, 90 MB per million (measured by
        ``python -m benchmarks.soak``). Nothing here settles deliveries, so the tags are
        dropped after each read."""
        tags = getattr(getattr(self._handler, "_link", None), "_received_delivery_tags", None)
        if isinstance(tags, set):
            tags.clear()

    def _frames_to_read(self) -> int:
        """Frames for the next read: a few, and never more than the link credit left
        (asked for more, the client would wait out its socket timeout at the end of
        every credit; at 0 it grants the prefetch again before reading)."""
        credit = getattr(getattr(self._handler, "_link", None), "current_link_credit", None)
        if not isinstance(credit, int) or credit <= 0:
            credit = self._prefetch
        return max(1, min(_FRAMES_PER_READ, credit))

    async def _drop_consumer(self) -> None:
        consumer, self._consumer, self._handler = self._consumer, None, None
        self._buffer = deque()
        if consumer is not None:
            # The client's close waits for its connection keep-alive task, which sleeps
            # in one-second steps: up to a second per closed receiver, during which a
            # partition being handed over or released waits. Stop that task first.
            handler = getattr(consumer, "_handler", None)
            keep_alive = getattr(handler, "_keep_alive_thread", None)
            if isinstance(keep_alive, asyncio.Future):
                keep_alive.cancel()
                handler._keep_alive_thread = None  # type: ignore[union-attr]
                await asyncio.gather(keep_alive, return_exceptions=True)
            try:
                await consumer.close()
            except Exception:
                logger.debug("closing the consumer of partition %s failed", self.partition_id, exc_info=True)

    async def close(self) -> None:
        self._closed = True
        await self._drop_consumer()


class _BatchReceiver(_PartitionReceiverBase):
    """Fallback: one partition fed by the client's public ``receive_batch`` through a
    one-slot queue (so the client runs ahead by at most one batch plus its prefetch)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._queue: "asyncio.Queue[Any]" = asyncio.Queue(maxsize=1)
        self._task: Optional[asyncio.Task] = None

    def _start(self, max_batch_size: int, max_wait_time: Optional[float]) -> None:
        starting_position, inclusive = to_starting_position(self._position)

        async def on_event_batch(context: Any, batch: List[Any]) -> None:
            if self._track:
                newest = getattr(context, "last_enqueued_event_properties", None) or {}
                if newest.get("sequence_number") is not None:
                    self._last_enqueued = LastEnqueuedEventProperties(
                        int(newest["sequence_number"]), str(newest.get("offset")), newest.get("enqueued_time"),
                        newest.get("retrieval_time"))
            await self._queue.put([to_event(e, self.partition_id) for e in batch])

        async def on_error(_context: Any, error: Exception) -> None:
            await self._queue.put(error)

        self._task = asyncio.create_task(self._client.receive_batch(
            on_event_batch, partition_id=self.partition_id, owner_level=self._owner_level,
            starting_position=starting_position, starting_position_inclusive=inclusive,
            max_batch_size=max_batch_size, max_wait_time=max_wait_time, prefetch=self._prefetch,
            on_error=on_error, track_last_enqueued_event_properties=self._track,
        ), name=f"eventhub-receive-{self.partition_id}")

    async def receive(self, max_batch_size: int, max_wait_time: Optional[float]) -> List[Event]:
        if self._task is None:
            self._start(max_batch_size, max_wait_time)
        task = self._task
        assert task is not None
        getter = asyncio.ensure_future(self._queue.get())
        done, _pending = await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in done:
            getter.cancel()
            error = task.exception() if not task.cancelled() else None
            raise self._translate(error) if error else self._source._errors.error(
                "disconnected", f"receiving from partition {self.partition_id} stopped")
        item = getter.result()
        if isinstance(item, BaseException):
            raise self._translate(item)
        return item

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass


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

    Example::

        from azure.identity.aio import DefaultAzureCredential

        source = EventHubSource("mynamespace.servicebus.windows.net", "telemetry", DefaultAzureCredential())
        async with EventProcessor(source, store, MyProcessor):
            ...
    """

    def __init__(self, fully_qualified_namespace: str, eventhub_name: str, credential: Any, *,
                 operation_timeout: float = 10.0, partition_ids_ttl: float = 30.0,
                 idle_timeout: Optional[float] = 30.0, **client_kwargs: Any) -> None:
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
        if idle_timeout is not None:
            client_kwargs.setdefault("idle_timeout", float(idle_timeout))
        self.fully_qualified_namespace = fully_qualified_namespace
        self.eventhub_name = eventhub_name
        self.operation_timeout = float(operation_timeout)
        self.partition_ids_ttl = float(partition_ids_ttl)
        self._credential = credential
        self._tls: Any = None
        self._conn_str: Optional[str] = None
        self._client_kwargs = client_kwargs
        self._clients: Dict[str, Any] = {}
        self._management: Any = None
        self._partition_ids: Optional[List[str]] = None
        self._partition_ids_at = 0.0
        self._errors = _ErrorContext(fully_qualified_namespace, eventhub_name, None)
        self._lean: Optional[bool] = None
        self.clock: Callable[[], float] = time.monotonic
        self._busy_until = float("-inf")  # clock() until which the hub asked us to wait (server-busy)

    @classmethod
    def from_connection_string(cls, conn_str: str, *, eventhub_name: Optional[str] = None,
                               **kwargs: Any) -> "EventHubSource":
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
            raise ConfigurationError("no event hub name: pass eventhub_name= or put EntityPath in the connection string")
        if eventhub_name and props.eventhub_name and eventhub_name != props.eventhub_name:
            raise ConfigurationError(
                f"eventhub_name {eventhub_name!r} differs from the connection string's EntityPath "
                f"{props.eventhub_name!r}")
        namespace = props.fully_qualified_namespace
        source = cls(namespace, name, None, **kwargs)
        source._conn_str = conn_str
        source._errors = _ErrorContext(namespace, name, props.shared_access_key or props.shared_access_signature)
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

    def _client(self, consumer_group: str) -> Any:
        client = self._clients.get(consumer_group)
        if client is None:
            client = self._new_client(consumer_group)
            self._clients[consumer_group] = client
        return client

    @property
    def uses_lean_receive(self) -> bool:
        """Whether receivers drive the client's consumer directly (see the module docs)."""
        if self._lean is None:
            from azure.eventhub.aio import EventHubConsumerClient

            self._lean = lean_receive_supported(EventHubConsumerClient)
            if not self._lean:
                logger.warning("the installed azure-eventhub lacks the consumer internals EventHubSource drives; "
                               "receiving through its public receive_batch instead (slower)")
        return self._lean

    def _note(self, error: EventSourceError) -> EventSourceError:
        """Remember a server-busy answer's retry-after (for every receiver of this source:
        Event Hubs throttles a namespace, not a link)."""
        if error.reason == "server-busy" and error.retry_after:
            now = self.clock()
            if self._busy_until <= now:  # once per throttling episode, not per partition
                logger.warning("%r: the hub is throttling (server busy); no receiver is opened for %.1f s", self,
                               error.retry_after)
            self._busy_until = max(self._busy_until, now + error.retry_after)
        return error

    async def _wait_if_busy(self) -> None:
        delay = self._busy_until - self.clock()
        if delay > 0:
            await asyncio.sleep(delay)

    async def get_partition_ids(self) -> List[str]:
        """The hub's partition ids, reused for ``partition_ids_ttl`` seconds.

        Raises :class:`EventSourceError` within ``operation_timeout`` seconds if the hub
        cannot say.
        """
        now = self.clock()
        if self._partition_ids is not None and now - self._partition_ids_at < self.partition_ids_ttl:
            return list(self._partition_ids)
        wait = self._busy_until - now
        if wait > 0:
            raise self._errors.error("server-busy", f"reading the partition ids: the hub is throttling; retry after "
                                                    f"{wait:.1f} s", retry_after=wait)
        ids = await self._fetch_partition_ids()
        self._partition_ids, self._partition_ids_at = ids, self.clock()
        return list(ids)

    async def _fetch_partition_ids(self) -> List[str]:
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
                failure = self._note(self._errors.classify(error, "reading the partition ids"))
                # One quick second attempt for a hub that may be restarting; a missing
                # hub or a rejected credential will not change in half a second.
                if attempt >= 2 or failure.reason not in ("unreachable", "disconnected") \
                        or deadline - self.clock() < 1.0:
                    logger.debug("%r: %s", self, failure)
                    raise failure from None
                await asyncio.sleep(0.5)

    async def open_receiver(self, partition_id: str, *, consumer_group: str, starting_position: EventPosition,
                            owner_level: Optional[int], prefetch: int = 300,
                            track_last_enqueued_event_properties: bool = False) -> PartitionReceiver:
        client = self._client(consumer_group)
        kind = _LeanReceiver if self.uses_lean_receive else _BatchReceiver
        return kind(self, client, partition_id, consumer_group, starting_position, owner_level, prefetch,
                    track_last_enqueued_event_properties)

    async def get_partition_properties(self, partition_id: str) -> PartitionProperties:
        """The partition's bounds and newest event, within ``operation_timeout`` seconds;
        raises :class:`EventSourceError` if the hub cannot say."""
        if self._management is None:
            self._management = self._new_client("$default", retry_total=0)
        try:
            raw = await asyncio.wait_for(self._management.get_partition_properties(partition_id),
                                         self.operation_timeout)
        except asyncio.CancelledError:
            raise
        except BaseException as error:
            raise self._errors.classify(error, f"reading the properties of partition {partition_id}",
                                        partition_id=partition_id) from None
        return PartitionProperties(
            partition_id=str(raw.get("id", partition_id)),
            beginning_sequence_number=int(raw.get("beginning_sequence_number", 0)),
            last_enqueued_sequence_number=int(raw.get("last_enqueued_sequence_number", -1)),
            last_enqueued_offset=str(raw.get("last_enqueued_offset", "-1")),
            last_enqueued_time_utc=raw.get("last_enqueued_time_utc"),
            is_empty=bool(raw.get("is_empty", False)),
        )

    async def close(self) -> None:
        clients = list(self._clients.values()) + ([self._management] if self._management is not None else [])
        self._clients, self._management = {}, None
        for client in clients:
            try:
                await client.close()
            except Exception:
                logger.debug("closing an Event Hubs client failed", exc_info=True)
