"""Reading a group's status: the store (and the event hub, if given) concurrently, every
call bounded. A store that cannot be read is an error; an event hub that cannot be read
only makes the lag unknown, with the reason."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from eventprocessor.errors import ConfigurationError, EventProcessorError
from eventprocessor.sources import EventSource, PartitionProperties
from eventprocessor.stores.contract import CheckpointStore
from eventprocessor.stores.records import Checkpoint, MemberListing, OwnershipListing

from ..user_errors import CommandError
from .model import GroupStatus, build_status

__all__ = ["read_status"]

logger = logging.getLogger(__name__)


# Partition properties are one management request each; a hub with 1024 partitions
# should not open 1024 requests at once.
PROPERTIES_CONCURRENCY = 16


async def _bounded(awaitable: Any, timeout: float, what: str) -> Any:
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        raise TimeoutError(f"{what} did not answer within {timeout:g} s") from None


async def _read_members(store: CheckpointStore, scope: tuple[str, str, str],
                        timeout: float) -> tuple[MemberListing | None, str | None]:
    try:
        return await _bounded(store.list_members(*scope), timeout, "listing members"), None
    except NotImplementedError:
        return None, "members: not kept by this store; the members shown are the owners named by ownership records"
    except Exception as error:  # the partitions are still worth showing
        logger.debug("listing members failed", exc_info=True)
        return None, f"members: could not be read ({_describe(error)}); the members shown are the owners of records"


def _describe(error: BaseException) -> str:
    """What went wrong, in words that never carry a secret: our own errors' messages
    (they never contain one) and timeouts; for anything else only its type. Plus what
    the Azure error underneath suggests doing."""
    if isinstance(error, (EventProcessorError, TimeoutError, CommandError)):
        text = " ".join(str(error).split()) or type(error).__name__
    else:
        text = f"{type(error).__name__} (run with -v for details)"
    hint = _hint(error)
    return f"{text}: {hint}" if hint else text


def _hint(error: BaseException) -> str:
    """What an Azure error under ``error`` (its cause chain) means for the user."""
    try:
        from azure.core.exceptions import ClientAuthenticationError, HttpResponseError, ServiceRequestError
    except ImportError:
        return ""
    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return ""
        if isinstance(seen, ServiceRequestError):
            return "could not connect; check the endpoint and that the service is running"
        if isinstance(seen, ClientAuthenticationError) or getattr(seen, "status_code", None) in (401, 403):
            return "the credential was refused; check the key, SAS token or role assignment"
        if isinstance(seen, HttpResponseError) and getattr(seen, "status_code", None) == 404:
            return "not found; check the account, container or table name"
        seen = seen.__cause__ or seen.__context__
    return ""


async def _read_source(source: EventSource | None, timeout: float,
                       note: str | None) -> tuple[list[str] | None, dict[str, PartitionProperties], str | None]:
    """The hub's partition ids and each partition's newest event; on failure, the reason
    in one line instead. Never raises (lag is optional)."""
    if source is None:
        return None, {}, note
    where = f"the event hub {source.fully_qualified_namespace}/{source.eventhub_name}"
    try:
        ids = [str(pid) for pid in await _bounded(source.get_partition_ids(), timeout, where)]
    except Exception as error:
        logger.debug("reading the partition ids failed", exc_info=True)
        return None, {}, f"lag: unknown ({_where(where, error)})"
    gate = asyncio.Semaphore(PROPERTIES_CONCURRENCY)

    async def one(pid: str) -> PartitionProperties:
        async with gate:
            return await source.get_partition_properties(pid)

    outcomes = await asyncio.gather(
        *(_bounded(one(pid), timeout, f"{where}, partition {pid}") for pid in ids), return_exceptions=True)
    found = {pid: outcome for pid, outcome in zip(ids, outcomes, strict=True)
             if isinstance(outcome, PartitionProperties)}
    failures = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if not failures:
        return ids, found, None
    first = failures[0]
    if isinstance(first, NotImplementedError):
        return ids, found, f"lag: unknown ({type(source).__name__} does not report partition properties)"
    logger.debug("reading partition properties failed", exc_info=first)
    share = "" if len(failures) == len(ids) else f" for {len(failures)} of {len(ids)} partitions"
    return ids, found, f"lag: unknown{share} ({_where(where, first)})"


def _where(where: str, error: BaseException) -> str:
    # A timeout's message already names what did not answer.
    return str(error) if isinstance(error, TimeoutError) else f"{where}: {_describe(error)}"


async def read_status(store: CheckpointStore, fully_qualified_namespace: str, eventhub_name: str,
                      consumer_group: str = "$default", *, source: EventSource | None = None,
                      expiration: float = 60.0, timeout: float = 10.0,
                      lag_note: str | None = None) -> GroupStatus:
    """Read the group's records (and the hub's newest events, if ``source`` is given)
    concurrently and return its status. Read-only.

    Every call is bounded by ``timeout`` seconds. A store that fails or does not answer
    raises :class:`~eventprocessor.cli.user_errors.CommandError` (one line, no secret); a
    source that fails only makes the lag unknown, and ``lag_note`` (what to say when no
    source is given) is replaced by the reason.

    Example::

        async with BlobCheckpointStore.from_connection_string(conn_str, "checkpoints") as store:
            status = await read_status(store, "ns.servicebus.windows.net", "telemetry", "$default")
            print(status.summary.line())
    """
    if not (isinstance(expiration, (int, float)) and expiration > 0):
        raise ConfigurationError(f"expiration must be a positive number of seconds, got {expiration!r}")
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
    scope = (fully_qualified_namespace, eventhub_name, consumer_group)

    async def from_store() -> tuple[OwnershipListing, list[Checkpoint]]:
        return await asyncio.gather(store.list_ownership(*scope), store.list_checkpoints(*scope))

    store_task = asyncio.ensure_future(_bounded(from_store(), timeout, "the checkpoint store"))
    members_task = asyncio.ensure_future(_read_members(store, scope, timeout))
    source_task = asyncio.ensure_future(_read_source(source, timeout, lag_note))
    try:
        ownership, checkpoints = await store_task
    except BaseException as error:
        for task in (store_task, members_task, source_task):
            task.cancel()
        await asyncio.gather(store_task, members_task, source_task, return_exceptions=True)
        if isinstance(error, ConfigurationError):
            raise CommandError(" ".join(str(error).split())) from None
        if not isinstance(error, Exception):
            raise
        logger.debug("reading the store failed", exc_info=True)
        raise CommandError(f"cannot read the checkpoint store {store!r}: {_describe(error)}") from None
    members, members_note = await members_task
    partition_ids, properties, note = await source_task
    return build_status(fully_qualified_namespace=fully_qualified_namespace, eventhub_name=eventhub_name,
                        consumer_group=consumer_group, store=repr(store), expiration=expiration,
                        ownership=ownership, checkpoints=checkpoints, members=members, members_note=members_note,
                        partition_ids=partition_ids, properties=properties, lag_note=note)


