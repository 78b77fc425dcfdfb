"""What the drop-in hands to ``on_error`` and raises: azure-eventhub's exceptions.

The errors of :class:`~eventprocessor.sources.eventhub.EventHubSource` already are
(``EventSourceError[ConnectError]``, ``ReceiverDisconnectedError[ConnectionLostError]``:
see :mod:`eventprocessor.sources.eventhub.failures`). This gives the others the same
treatment, in place: an event source's error (from any source) becomes the official
class of its reason, a partition this processor no longer owns becomes
``azure.eventhub.exceptions.OwnershipLostError``, and any other error of this SDK an
``EventHubError``. Each stays this SDK's error too (``except OwnershipLostError`` of
either package catches it). Errors that are not this SDK's (a callback's own
exceptions, a store's) and configuration errors (``ValueError``s, as the official
client raises for bad arguments) pass as they are.
"""
from __future__ import annotations

from typing import TypeVar

from ..errors import (
    ConfigurationError,
    EventProcessorError,
    EventSourceError,
    InvalidCheckpointError,
    ReceiverDisconnectedError,
)
from ..errors import OwnershipLostError as OurOwnershipLostError
from ..sources.eventhub.failures import official_type, with_official_type

__all__ = ["official_error"]

_E = TypeVar("_E", bound=BaseException)


def official_error(error: _E) -> _E:
    """``error`` as azure-eventhub's exception (see the module docstring); the same object."""
    from azure.eventhub import exceptions as official

    if not isinstance(error, EventProcessorError) or isinstance(
            error, (official.EventHubError, official.OwnershipLostError, ConfigurationError, InvalidCheckpointError)):
        return error
    if isinstance(error, EventSourceError):
        return with_official_type(error, official_type(error.reason))
    if isinstance(error, ReceiverDisconnectedError):
        return with_official_type(error, official.ConnectionLostError)  # a takeover, as the client reports it
    if isinstance(error, OurOwnershipLostError):
        return with_official_type(error, official.OwnershipLostError)
    return with_official_type(error, official.EventHubError)
