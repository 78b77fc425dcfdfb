"""Exceptions a user of the SDK can catch.

Messages never contain secrets: stores build them from names (container, table,
partition id), never from connection strings, keys or SAS tokens.
"""
from __future__ import annotations

from typing import Optional

__all__ = [
    "EventProcessorError",
    "ConfigurationError",
    "OwnershipLostError",
    "ReceiverDisconnectedError",
    "CheckpointStoreError",
    "ClaimOwnershipError",
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

    def __init__(self, message: str, *, partition_id: Optional[str] = None) -> None:
        super().__init__(message)
        self.partition_id = partition_id


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
