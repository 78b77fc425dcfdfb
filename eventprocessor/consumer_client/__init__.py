"""A drop-in for ``azure.eventhub.aio.EventHubConsumerClient``: the same constructor, the
same ``receive_batch`` / ``receive`` callbacks, run by :class:`~eventprocessor.EventProcessor`.

Migrating is one import; the official checkpoint store and every callback stay as they
are::

    # from azure.eventhub.aio import EventHubConsumerClient
    from eventprocessor import EventHubConsumerClient
    from azure.eventhub.extensions.checkpointstoreblobaio import BlobCheckpointStore

    checkpoint_store = BlobCheckpointStore.from_connection_string(storage_conn_str, container_name="checkpoints")
    client = EventHubConsumerClient.from_connection_string(
        conn_str, consumer_group="$default", eventhub_name="telemetry", checkpoint_store=checkpoint_store)

    async def on_event_batch(partition_context, events):
        for event in events:
            print(partition_context.partition_id, event.body_as_str())
        await partition_context.update_checkpoint()

    async with client:
        await client.receive_batch(on_event_batch, starting_position="-1")

azure-eventhub's ``BlobCheckpointStore`` is replaced by ``stores.BlobCheckpointStore`` on
the same container and credential (:meth:`stores.BlobCheckpointStore.from_azure_eventhub`),
which reads and writes the official blobs with fenced claims and checkpoints, so the
checkpoints carry over in both directions; ``stores.BlobCheckpointStore`` can be passed
directly too. Any other store written to azure-eventhub's ``CheckpointStore`` interface
runs through that interface, with the guarantees it allows
(:mod:`.official_store`). Without a checkpoint store, as in azure-eventhub, each receive
call reads every partition with checkpoints in memory. This module is a thin adapter: one
:class:`~eventprocessor.EventProcessor` per ``receive``/``receive_batch`` call, whose
:class:`~eventprocessor.PartitionProcessor` calls the callbacks. What stays, what changes
and what is better is in docs/howto/migrating.md.

Callbacks get ``azure.eventhub.EventData`` events (the ``[eventhub]`` extra) and a
:class:`ConsumerPartitionContext`, which has the official context's attributes and
``update_checkpoint(event=None)``. ``on_partition_close`` gets
``azure.eventhub.CloseReason``: ``SHUTDOWN`` when the client closes, ``OWNERSHIP_LOST``
when the partition moved to another processor (a graceful handoff included) or its lease
ran out.

What reaches ``on_error`` and what the client raises are azure-eventhub's exceptions
(``ConnectError``, ``AuthenticationError``, ``ConnectionLostError``...), which are this
SDK's errors too (:mod:`.official_errors`). Arguments of the official client this
adapter cannot honour raise :class:`~eventprocessor.errors.ConfigurationError` naming
them; none is ignored.
"""
from .client import EventHubConsumerClient
from .context import ConsumerPartitionContext
from .events import to_event_data
from .options import (
           CLIENT_OPTIONS,
           PROCESSOR_OPTIONS,
           SOURCE_OPTIONS,
           StartingPosition,
           starting_positions,
           to_event_position,
)
from .receive_call import ReceiveOptions

__all__ = ["EventHubConsumerClient", "ConsumerPartitionContext", "StartingPosition", "to_event_data",
           "starting_positions", "to_event_position", "CLIENT_OPTIONS", "SOURCE_OPTIONS", "PROCESSOR_OPTIONS",
           "ReceiveOptions"]
