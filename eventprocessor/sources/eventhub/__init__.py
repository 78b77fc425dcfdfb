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
falls back to ``receive_batch`` and logs a warning (``EventHubSource(..., lean_receive=False)``
takes that path on purpose). ``tests/test_eventhub_source.py``
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

Layout: :mod:`.source` (``EventHubSource``), :mod:`.lean` (the lean receiver),
:mod:`.fallback` (the ``receive_batch`` receiver), :mod:`.receiver` (what both share),
:mod:`.conversion` (messages and ``EventData`` to ``Event``), :mod:`.failures` (client
errors to ``EventSourceError``).
"""
from .conversion import last_enqueued_of, message_body, message_to_event, to_event, to_starting_position
from .lean import lean_receive_supported
from .source import EventHubSource

__all__ = ["EventHubSource", "to_event", "to_starting_position", "message_to_event", "message_body",
           "lean_receive_supported", "last_enqueued_of"]
