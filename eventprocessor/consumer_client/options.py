"""What the drop-in takes of azure-eventhub's arguments: starting positions, the
checkpoint store (the official one run as ours, or none) and which keywords go where."""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from .._runtime.clock import SystemClock
from ..errors import ConfigurationError
from ..events import EventPosition
from ..stores.contract import CheckpointStore

logger = logging.getLogger(__name__)


StartingPosition = str | int | datetime
"""An official starting position: an offset (``"-1"`` is the start, ``"@latest"`` only
new events), a sequence number (int) or an enqueued time (a naive datetime is UTC, as
azure-eventhub reads it)."""


# azure-eventhub's constructor / from_connection_string keywords that configure its AMQP
# client: they go to the client under EventHubSource unchanged.
CLIENT_OPTIONS = frozenset({
    "logging_enable", "http_proxy", "auth_timeout", "user_agent", "retry_total", "retry_backoff_factor",
    "retry_backoff_max", "retry_mode", "idle_timeout", "transport_type", "custom_endpoint_address",
    "connection_verify", "ssl_context", "socket_timeout",
})
# EventHubSource's own keywords.
SOURCE_OPTIONS = frozenset({"operation_timeout", "partition_ids_ttl"})
# EventProcessor keywords this client passes through (what azure-eventhub does not have).
PROCESSOR_OPTIONS = frozenset({
    "owner_id", "ownership_renewal_age", "ownership_renewal", "store_timeout", "shutdown_timeout", "handler_timeout",
    "failure_policy", "refuse_checkpoint_rewind",
    "handoff_timeout", "balance_factor", "ordinal", "replica_count", "override_checkpoints", "meter_provider",
    "tracer_provider", "clock", "rng",
})
_ALL_PARTITIONS = "-1"
_UTC = timezone.utc
_SINGLE_EVENT_BATCH = 300  # receive(): events fetched per pump turn, handed to on_event one by one



def _require_azure_eventhub() -> None:
    try:
        import azure.eventhub  # noqa: F401
    except ImportError as error:  # pragma: no cover - depends on the extra
        from ..extras import install_command

        raise ConfigurationError("EventHubConsumerClient (the azure-eventhub drop-in) needs the [eventhub] extra: "
                                 f"{install_command(['eventhub'])}") from error


def _resolve_store(checkpoint_store: Any) -> tuple[CheckpointStore | None,
                                                  Callable[[], CheckpointStore] | None]:
    """``(store, build)``: the store to run on (``None``: azure-eventhub's in-memory mode)
    and, when this client built it from azure-eventhub's store, how to build it again:
    the client closes it in ``close()`` and runs a new one if it receives again.

    This SDK's stores run as they are; azure-eventhub's ``BlobCheckpointStore`` runs as
    ``stores.BlobCheckpointStore`` on its container (every guarantee, the same blobs);
    any other store written to azure-eventhub's ``CheckpointStore`` interface runs
    through that interface (:class:`.official_store.OfficialInterfaceStore`)."""
    if checkpoint_store is None or isinstance(checkpoint_store, CheckpointStore):
        return checkpoint_store, None
    if type(checkpoint_store).__module__.startswith("azure.eventhub"):
        from eventprocessor.stores.blob import BlobCheckpointStore, is_azure_eventhub_blob_store

        if is_azure_eventhub_blob_store(checkpoint_store):
            def build() -> CheckpointStore:
                return BlobCheckpointStore.from_azure_eventhub(checkpoint_store)  # no I/O until used

            store = build()
            logger.info("checkpoint_store is azure-eventhub's BlobCheckpointStore: running on %r, the same container "
                        "and blobs, with fenced claims and checkpoints", store)
            return store, build
    from .official_store import OfficialInterfaceStore, is_official_interface_store

    if is_official_interface_store(checkpoint_store):
        logger.info("checkpoint_store %s is written to azure-eventhub's CheckpointStore interface: claims and "
                    "checkpoints go through its methods, without epochs, fenced checkpoints or graceful handoffs "
                    "(stores.BlobCheckpointStore and stores.TableCheckpointStore keep them)",
                    type(checkpoint_store).__name__)
        return OfficialInterfaceStore(checkpoint_store), None
    raise ConfigurationError(f"checkpoint_store must be a checkpoint store: one of eventprocessor.stores "
                             f"(BlobCheckpointStore, TableCheckpointStore, InMemoryCheckpointStore), azure-eventhub's "
                             f"BlobCheckpointStore, or a store written to azure-eventhub's CheckpointStore interface "
                             f"(async list_ownership, claim_ownership, update_checkpoint and list_checkpoints); got "
                             f"{type(checkpoint_store).__name__}")


def _memory_store(clock: Any) -> CheckpointStore:
    """The in-memory store of one receive call without a checkpoint store. Its wall clock
    follows the processor's clock, so the processor and the store agree on time, virtual
    time included."""
    from eventprocessor.stores.memory import InMemoryCheckpointStore

    ticks = clock if callable(getattr(clock, "monotonic", None)) else SystemClock()
    origin = datetime.now(_UTC) - timedelta(seconds=ticks.monotonic())
    return InMemoryCheckpointStore(clock=lambda: origin + timedelta(seconds=ticks.monotonic()))


def _split_options(options: Mapping[str, Any], *, with_client: bool) -> tuple[dict[str, Any], dict[str, Any],
                                                                             dict[str, Any]]:
    """Sort keyword arguments into (client, source, processor) options; refuse the rest by name."""
    client: dict[str, Any] = {}
    source: dict[str, Any] = {}
    processor: dict[str, Any] = {}
    unknown: list[str] = []
    for name, value in options.items():
        if name == "uamqp_transport":
            if value:
                raise ConfigurationError("uamqp_transport=True is not supported: the uAMQP transport is deprecated "
                                         "by azure-eventhub, and EventHubSource reads through its pure-Python "
                                         "transport; remove the argument")
        elif name == "retry_backoff":
            # Not an azure-eventhub option (its is retry_backoff_factor), but its own tests pass
            # it and its client ignores it: programs that pass it keep running, and are told.
            logger.warning("retry_backoff=%r has no effect, as in azure-eventhub: the Event Hubs client's backoff "
                           "is retry_backoff_factor, the backoff between deliveries of a failing batch "
                           "failure_policy=FailurePolicy(retry_backoff=...)", value)
        elif name in CLIENT_OPTIONS and with_client:
            client[name] = value
        elif name in SOURCE_OPTIONS and with_client:
            source[name] = value
        elif name in PROCESSOR_OPTIONS:
            processor[name] = value
        else:
            unknown.append(name)
    if unknown:
        names = ", ".join(sorted(unknown))
        if not with_client and set(unknown) & (CLIENT_OPTIONS | SOURCE_OPTIONS):
            raise ConfigurationError(
                f"EventHubConsumerClient.from_source got {names}: options of the Event Hubs client belong to the "
                "source (EventHubSource(..., retry_total=...)), which from_source takes as built")
        raise ConfigurationError(
            f"EventHubConsumerClient got unsupported keyword argument(s) {names}. It takes azure-eventhub's "
            "checkpoint_store, load_balancing_interval, partition_ownership_expiration_interval, "
            f"load_balancing_strategy and client options ({', '.join(sorted(CLIENT_OPTIONS))}), EventHubSource's "
            f"{', '.join(sorted(SOURCE_OPTIONS))}, checkpoint_on_release, and EventProcessor's "
            f"{', '.join(sorted(PROCESSOR_OPTIONS))}")
    return client, source, processor


def to_event_position(value: Any, inclusive: bool, *, what: str = "starting_position") -> EventPosition:
    """An official starting position as an :class:`EventPosition` (see :data:`StartingPosition`)."""
    if not isinstance(inclusive, bool):
        raise ConfigurationError(f"starting_position_inclusive must be True or False, got {inclusive!r}")
    if isinstance(value, bool):
        raise ConfigurationError(f"{what} must be an offset string, a sequence number (int) or a datetime, "
                                 f"got {value!r}")
    if isinstance(value, datetime):
        return EventPosition.from_enqueued_time(value if value.tzinfo is not None else value.replace(tzinfo=_UTC),
                                                inclusive=inclusive)
    if isinstance(value, int):
        return EventPosition.from_sequence_number(value, inclusive=inclusive)
    if isinstance(value, str):
        if value == "-1":
            return EventPosition.earliest()
        if value == "@latest":
            return EventPosition.latest()
        try:
            return EventPosition.from_offset(value, inclusive=inclusive)
        except ConfigurationError:
            raise ConfigurationError(f"{what} {value!r} is neither an offset (a string of digits), '-1' (the "
                                     "start) nor '@latest' (only new events)") from None
    raise ConfigurationError(f"{what} must be an offset string, a sequence number (int) or a datetime, got "
                             f"{type(value).__name__} {value!r}")


def starting_positions(starting_position: Any, starting_position_inclusive: Any
                       ) -> tuple[EventPosition | dict[str, EventPosition], EventPosition]:
    """azure-eventhub's ``starting_position`` / ``starting_position_inclusive`` as
    EventProcessor's ``(initial_event_position, default_event_position)``.

    As in azure-eventhub: no position means only new events (``"@latest"``); in a dict, a
    partition left out starts at the beginning (``"-1"``); ``starting_position_inclusive``
    is one bool or a dict by partition (left out: exclusive)."""
    if isinstance(starting_position_inclusive, Mapping):
        inclusive_by_pid = {str(k): v for k, v in starting_position_inclusive.items()}
        default_inclusive = False
    else:
        inclusive_by_pid = {}
        default_inclusive = starting_position_inclusive
    if starting_position is None:
        to_event_position("@latest", default_inclusive)  # checks the flag
        return EventPosition.latest(), EventPosition.earliest()
    if isinstance(starting_position, Mapping):
        positions = {str(pid): to_event_position(value, inclusive_by_pid.get(str(pid), default_inclusive),
                                                 what=f"starting_position[{pid!r}]")
                     for pid, value in starting_position.items()}
        return positions, EventPosition.earliest()
    if inclusive_by_pid:
        # One position for every partition, inclusive for some of them: those in a dict,
        # the others through the default.
        return ({pid: to_event_position(starting_position, flag) for pid, flag in inclusive_by_pid.items()},
                to_event_position(starting_position, default_inclusive))
    return to_event_position(starting_position, default_inclusive), EventPosition.earliest()
