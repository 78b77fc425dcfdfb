"""Exceptions a user of the SDK can catch.

Messages never contain secrets: stores build them from names (container, table,
partition id), never from connection strings, keys or SAS tokens.
"""
from __future__ import annotations

__all__ = [
    "EventProcessorError",
    "ConfigurationError",
    "OwnershipLostError",
    "ReceiverDisconnectedError",
    "CheckpointStoreError",
    "ClaimOwnershipError",
    "StaleEpochError",
    "StoreTimeoutError",
    "StoreDataLostError",
    "EventSourceError",
    "HandlerTimeoutError",
    "PoisonEventsError",
    "InvalidCheckpointError",
    "EVENT_SOURCE_REASONS",
]


class EventProcessorError(Exception):
    """Base class of every error raised by this SDK."""


class ConfigurationError(EventProcessorError, ValueError):
    """An argument, name or connection string is invalid. The message names which."""


class OwnershipLostError(EventProcessorError):
    """This processor no longer owns the partition.

    Raised by ``PartitionContext.update_checkpoint`` and by fenced store writes when
    another processor has claimed the partition (or this one released or self-fenced
    it). The checkpoint was *not* written.
    """

    def __init__(self, message: str, *, partition_id: str | None = None, records_vanished: bool = False) -> None:
        super().__init__(message)
        self.partition_id = partition_id
        self.records_vanished = records_vanished
        """True when no other processor took it: the partition's checkpoint and ownership
        records, which this claim had written, are gone (a store wiped or restored)."""


class ReceiverDisconnectedError(OwnershipLostError):
    """A receiver with a higher (or equal) owner level took over the partition.

    Mirrors Event Hubs' epoch semantics: opening an exclusive receiver disconnects
    the receivers with a lower owner level.
    """


class CheckpointStoreError(EventProcessorError):
    """The checkpoint store failed for a reason other than a lost race.

    Network failures, 5xx after retries, authentication errors and the like. A lost
    conditional write (HTTP 409/412) is never reported this way: it is a normal
    outcome of the protocol.
    """


class ClaimOwnershipError(CheckpointStoreError):
    """Some claims failed with an unexpected error.

    ``claimed`` holds the claims that were won in the same call, so a caller never
    loses track of ownership it really has; ``failures`` maps partition id to the
    error that stopped its claim.
    """

    def __init__(self, message: str, *, claimed: list, failures: dict) -> None:
        super().__init__(message)
        self.claimed = claimed
        self.failures = failures


class StaleEpochError(OwnershipLostError):
    """The partition's checkpoint was written with an epoch at or above the claim's.

    Happens when the ownership record lost its epoch (rewritten by a program that does
    not keep it, or corrupted). The claimer re-claims above ``stored_epoch``.
    """

    def __init__(self, message: str, *, partition_id: str | None = None, stored_epoch: int = 0) -> None:
        super().__init__(message, partition_id=partition_id)
        self.stored_epoch = stored_epoch


class StoreTimeoutError(CheckpointStoreError):
    """A checkpoint-store call did not finish within its deadline: the processor's
    ``store_timeout``, or the store's own ``operation_timeout`` (10 s by default for
    the Blob and Table stores).

    Whether the request reached the store is unknown; the processor treats the outcome
    as lost and its leases run out on their own (self-fencing) if the store stays silent.
    """


class StoreDataLostError(CheckpointStoreError):
    """Records this processor had seen vanished from the store or went backwards.

    A storage account restored, wiped or emulated afresh (Azurite restarted without
    persistence) looks like this. ``partition_ids`` names the partitions concerned.
    """

    def __init__(self, message: str, *, partition_ids: tuple = ()) -> None:
        super().__init__(message)
        self.partition_ids = partition_ids


class EventSourceError(EventProcessorError):
    """The event source (the event hub) failed: unreachable, unknown hub or consumer
    group, rejected credential, or a malformed answer.

    ``fully_qualified_namespace`` and ``eventhub_name`` say which; the message never
    contains a key or a connection string. Distinct from :class:`CheckpointStoreError`,
    so that a user can tell the hub from the store. ``reason`` classifies it for code
    that reacts differently (one of :data:`EVENT_SOURCE_REASONS`, or ``""``).
    ``retry_after`` is how many seconds the hub asked the caller to wait before trying
    again (set with ``reason="server-busy"``: Event Hubs' ``com.microsoft:server-busy``
    throttling), else None.
    """

    def __init__(self, message: str, *, fully_qualified_namespace: str = "", eventhub_name: str = "",
                 reason: str = "", retry_after: float | None = None) -> None:
        super().__init__(message)
        self.fully_qualified_namespace = fully_qualified_namespace
        self.eventhub_name = eventhub_name
        self.reason = reason
        self.retry_after = retry_after


#: ``EventSourceError.reason`` values: the hub could not be reached (or timed out), an
#: entity (hub, consumer group, partition) does not exist, the credential was refused,
#: the request was refused (a position past the end, a malformed request), the
#: connection failed after it was established, or the hub is throttling the caller
#: (``server-busy``: wait ``retry_after`` seconds before trying again).
EVENT_SOURCE_REASONS = ("unreachable", "timeout", "not-found", "unauthorized", "refused", "disconnected",
                        "server-busy")


class HandlerTimeoutError(EventProcessorError):
    """``process_events`` has not returned within the processor's ``handler_timeout``.

    Reported (a WARNING and ``process_error``) while the processor keeps waiting for the
    handler; other partitions are not held up. At shutdown, a handler still running after
    ``shutdown_timeout`` is cancelled.
    """

    def __init__(self, message: str, *, partition_id: str | None = None) -> None:
        super().__init__(message)
        self.partition_id = partition_id


class PoisonEventsError(EventProcessorError):
    """Events that ``process_events`` failed on every delivery attempt.

    ``events`` are the events (they are not lost: they are here, and in the
    ``dead_letter`` hook if one is set), ``attempts`` how many deliveries each got, and
    ``__cause__`` the handler's last exception. What happens next is the processor's
    ``on_poison`` policy: skip them (checkpointing past them) or park the partition.
    """

    def __init__(self, message: str, *, events: list, attempts: int, partition_id: str | None = None) -> None:
        super().__init__(message)
        self.events = events
        self.attempts = attempts
        self.partition_id = partition_id


class InvalidCheckpointError(EventProcessorError, ValueError):
    """``update_checkpoint`` was asked for something that would misplace the partition:
    an event of another partition, an event not delivered in this claim, or a position
    before the last checkpoint (without ``allow_rewind=True``). Nothing was written."""
