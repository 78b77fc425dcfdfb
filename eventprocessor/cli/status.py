"""``eventprocessor status``: what a consumer group looks like right now, read from its store.

For each partition: its owner, epoch, lease age (on the store's clock), a pending handoff,
the checkpoint (sequence number, offset, time) and, when the event hub is reachable, the
newest event and the lag. For each member: what it owns, its heartbeat. A summary line:
owned, unowned, expired, imbalance, lag.

Three layers, so that each can be tested on its own:

* :func:`build_status` is pure: listings in, a :class:`GroupStatus` out. Expiry is judged
  as the processors judge it, ``server_time - last_modified > expiration``, both from the
  store, where ``last_modified`` is the later of the record's and its owner's heartbeat
  when that heartbeat keeps its partitions (``lease=member``).
* :func:`read_status` does the I/O: it reads the store (and the event hub, if given)
  concurrently, every call bounded by ``timeout``. A store that cannot be read is an
  error; an event hub that cannot be read only makes the lag unknown, with the reason.
* :func:`render` and :meth:`GroupStatus.to_json` show it; :func:`run_status` is the
  command (store and source from the options, ``--watch``, ``--json``).

Nothing here writes to the store, and no secret (key, SAS token, connection string)
is ever printed: stores and sources are shown by their ``repr``, which omits them.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventprocessor._ownership.liveness import heartbeats, with_heartbeats
from eventprocessor._ownership.strategies import HANDOFF_PROPERTY, ORDINAL_PROPERTY
from eventprocessor.errors import ConfigurationError, EventProcessorError
from eventprocessor.sources import EventSource, PartitionProperties
from eventprocessor.stores.contract import CheckpointStore
from eventprocessor.stores.records import Checkpoint, MemberListing, OwnershipListing, partition_sort_key

from .user_errors import CommandError, require

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console, RenderableType

__all__ = ["GroupStatus", "MemberStatus", "PartitionStatus", "StatusOptions", "StatusSummary", "build_status",
           "read_status", "render", "run_status", "STORE_CONNECTION_STRING_ENV", "STORE_ACCOUNT_KEY_ENV",
           "STORE_SAS_TOKEN_ENV", "EVENTHUB_CONNECTION_STRING_ENV"]

logger = logging.getLogger(__name__)

STORE_CONNECTION_STRING_ENV = "EVENTPROCESSOR_STORE_CONNECTION_STRING"
STORE_ACCOUNT_KEY_ENV = "EVENTPROCESSOR_STORE_ACCOUNT_KEY"
STORE_SAS_TOKEN_ENV = "EVENTPROCESSOR_STORE_SAS_TOKEN"
EVENTHUB_CONNECTION_STRING_ENV = "EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING"

# Partition properties are one management request each; a hub with 1024 partitions
# should not open 1024 requests at once.
PROPERTIES_CONCURRENCY = 16
# Closing a client talks to the service too; never let it hold the command up.
CLOSE_TIMEOUT = 5.0

OWNED, EXPIRED, RELEASED, UNCLAIMED, UNREADABLE = "owned", "expired", "released", "unclaimed", "unreadable"


@dataclass(frozen=True)
class PartitionStatus:
    """One partition as the store (and the event hub) describe it.

    ``state`` is ``owned`` (a live record), ``expired`` (older than the expiration on the
    store's clock: the next tick of any processor takes it), ``released`` (a record with
    no owner), ``unclaimed`` (no record; only known when the hub's partition list was
    read) or ``unreadable`` (a record the store cannot read; ``note`` says why). ``lag``
    is the number of events after the checkpoint (after the start of the partition when
    there is no checkpoint: ``lag_from == "start"``), ``None`` when unknown.
    """

    partition_id: str
    state: str
    owner_id: str | None = None
    epoch: int | None = None
    lease_age: float | None = None
    last_modified_time: datetime | None = None
    requested_by: str = ""
    checkpoint_sequence_number: int | None = None
    checkpoint_offset: str | None = None
    checkpoint_time: datetime | None = None
    checkpoint_age: float | None = None
    checkpoint_owner_id: str | None = None
    checkpoint_epoch: int | None = None
    last_enqueued_sequence_number: int | None = None
    last_enqueued_time: datetime | None = None
    lag: int | None = None
    lag_from: str | None = None
    note: str = ""


@dataclass(frozen=True)
class MemberStatus:
    """One processor of the group: the partitions it owns (live records) and the expired
    records that still name it, and its heartbeat record when the store keeps them.

    ``state`` is ``live`` when it has a live heartbeat or owns a live record, else
    ``gone``.
    """

    owner_id: str
    state: str
    owned: int
    expired: int
    heartbeat_age: float | None = None
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StatusSummary:
    """The counts of the summary line. ``imbalance`` is the most minus the fewest
    partitions owned by a live member (``None`` without live members); ``lag`` the sum
    of the known lags (``None`` when none is known)."""

    partitions: int
    owned: int
    unowned: int
    expired: int
    unreadable: int
    handoffs_pending: int
    live_members: int
    imbalance: int | None
    most_owned: int | None
    fewest_owned: int | None
    lag: int | None
    lag_known: int
    partitions_from: str

    def line(self) -> str:
        """The summary as one line of text."""
        where = "" if self.partitions_from == "eventhub" else " (seen in the store)"
        parts = [f"{self.partitions} partitions{where}: {self.owned} owned, {self.unowned} unowned, "
                 f"{self.expired} expired"]
        if self.unreadable:
            parts[0] += f", {self.unreadable} unreadable"
        if self.handoffs_pending:
            parts[0] += f", {self.handoffs_pending} handoff{'s' if self.handoffs_pending != 1 else ''} pending"
        if self.imbalance is None:
            parts.append(f"{self.live_members} live members")
        else:
            parts.append(f"{self.live_members} live member{'s' if self.live_members != 1 else ''}, imbalance "
                         f"{self.imbalance} (most {self.most_owned}, fewest {self.fewest_owned})")
        if self.lag is None:
            parts.append("lag unknown")
        elif self.lag_known < self.partitions:
            parts.append(f"lag {self.lag} events ({self.lag_known} of {self.partitions} partitions known)")
        else:
            parts.append(f"lag {self.lag} events")
        return " · ".join(parts)


@dataclass(frozen=True)
class GroupStatus:
    """A consumer group at one moment: partitions, members, summary, and notes that say
    what could not be known (members not kept by the store, lag not reachable)."""

    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str
    store: str
    server_time: datetime
    expiration: float
    partitions: tuple[PartitionStatus, ...]
    members: tuple[MemberStatus, ...]
    summary: StatusSummary
    members_note: str | None = None
    lag_note: str | None = None
    records_note: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: times as ISO 8601 strings, ages in seconds.

        Example::

            print(json.dumps(status.to_json(), indent=2))
        """
        def plain(value: Any) -> Any:
            if isinstance(value, datetime):
                return value.isoformat()
            if isinstance(value, dict):
                return {k: plain(v) for k, v in value.items()}
            if isinstance(value, (list, tuple)):
                return [plain(v) for v in value]
            return value

        document = asdict(self)
        document["members"] = [{**m, "properties": dict(m["properties"])} for m in document["members"]]
        return {"summary_line": self.summary.line(), **plain(document)}


def _seconds(later: datetime, earlier: datetime | None) -> float | None:
    return None if earlier is None else (later - earlier).total_seconds()


def build_status(*, fully_qualified_namespace: str, eventhub_name: str, consumer_group: str, store: str,
                 expiration: float, ownership: OwnershipListing, checkpoints: Sequence[Checkpoint],
                 members: MemberListing | None = None, members_note: str | None = None,
                 partition_ids: Sequence[str] | None = None,
                 properties: Mapping[str, PartitionProperties] | None = None,
                 lag_note: str | None = None) -> GroupStatus:
    """The status of a group from what its store (and event hub) said. Pure.

    ``partition_ids`` is the hub's partition list when it was read (partitions without a
    record are then ``unclaimed``); ``properties`` the partitions' newest events, for lag.

    Example::

        listing = await store.list_ownership(ns, hub, group)
        status = build_status(fully_qualified_namespace=ns, eventhub_name=hub, consumer_group=group,
                               store=repr(store), expiration=60, ownership=listing,
                               checkpoints=await store.list_checkpoints(ns, hub, group))
        print(status.summary.line())
    """
    now = ownership.server_time
    properties = properties or {}
    ownership = with_heartbeats(ownership, heartbeats(members))
    records = {record.partition_id: record for record in ownership.ownerships}
    unreadable = {record.partition_id: record for record in ownership.unreadable}
    by_partition = {checkpoint.partition_id: checkpoint for checkpoint in checkpoints}
    ids = set(records) | set(unreadable) | set(by_partition) | set(properties) | set(partition_ids or ())

    rows: list[PartitionStatus] = []
    for pid in sorted(ids, key=partition_sort_key):
        record = records.get(pid)
        fields: dict[str, Any] = {}
        if record is not None:
            age = _seconds(now, record.last_modified_time)
            if record.is_released:
                state = RELEASED
            else:
                state = EXPIRED if age is not None and age > expiration else OWNED
            fields.update(owner_id=record.owner_id or None, epoch=record.epoch, lease_age=age,
                          last_modified_time=record.last_modified_time, requested_by=record.requested_by)
        elif pid in unreadable:
            bad = unreadable[pid]
            state = UNREADABLE
            fields.update(lease_age=_seconds(now, bad.last_modified_time), last_modified_time=bad.last_modified_time,
                          note=bad.reason)
        else:
            state = UNCLAIMED
        checkpoint = by_partition.get(pid)
        if checkpoint is not None:
            fields.update(checkpoint_sequence_number=checkpoint.sequence_number, checkpoint_offset=checkpoint.offset,
                          checkpoint_time=checkpoint.last_modified_time,
                          checkpoint_age=_seconds(now, checkpoint.last_modified_time),
                          checkpoint_owner_id=checkpoint.owner_id, checkpoint_epoch=checkpoint.epoch)
        newest = properties.get(pid)
        if newest is not None:
            fields.update(last_enqueued_sequence_number=newest.last_enqueued_sequence_number,
                          last_enqueued_time=newest.last_enqueued_time_utc, **_lag(newest, checkpoint))
        rows.append(PartitionStatus(partition_id=pid, state=state, **fields))

    member_rows = _members(rows, members, expiration)
    records_note = None
    if not (records or unreadable or by_partition or (members is not None and members.members)):
        # The usual cause is a name that differs from the processors' (blob names are
        # lower-cased, the namespace is the fully qualified one).
        records_note = (f"no records of consumer group {consumer_group!r} of {fully_qualified_namespace}/"
                        f"{eventhub_name} in this store: check --namespace, --eventhub, --consumer-group and "
                        "the container or table")
    return GroupStatus(
        fully_qualified_namespace=fully_qualified_namespace, eventhub_name=eventhub_name,
        consumer_group=consumer_group, store=store, server_time=now, expiration=expiration,
        partitions=tuple(rows), members=member_rows,
        summary=_summary(rows, member_rows, "eventhub" if partition_ids is not None else "store"),
        members_note=members_note, lag_note=lag_note, records_note=records_note)


def _lag(newest: PartitionProperties, checkpoint: Checkpoint | None) -> dict[str, Any]:
    """Events still to process: after the checkpoint, or all the partition holds. Events
    older than the partition's retention are gone, so they are not counted."""
    if newest.is_empty:
        return {"lag": 0, "lag_from": "checkpoint" if checkpoint is not None else "start"}
    before_first = newest.beginning_sequence_number - 1
    if checkpoint is None:
        return {"lag": newest.last_enqueued_sequence_number - before_first, "lag_from": "start"}
    return {"lag": newest.last_enqueued_sequence_number - max(checkpoint.sequence_number, before_first),
            "lag_from": "checkpoint"}


def _members(rows: Sequence[PartitionStatus], members: MemberListing | None,
             expiration: float) -> tuple[MemberStatus, ...]:
    owned = Counter(row.owner_id for row in rows if row.state == OWNED and row.owner_id)
    expired = Counter(row.owner_id for row in rows if row.state == EXPIRED and row.owner_id)
    heartbeats: dict[str, tuple[float | None, Mapping[str, str]]] = {}
    if members is not None:
        for member in members.members:
            heartbeats[member.owner_id] = (_seconds(members.server_time, member.last_modified_time),
                                           dict(member.properties))
    result = []
    for owner_id in sorted(set(owned) | set(expired) | set(heartbeats)):
        age, props = heartbeats.get(owner_id, (None, {}))
        beating = owner_id in heartbeats and age is not None and age <= expiration
        state = "live" if beating or owned[owner_id] else "gone"
        result.append(MemberStatus(owner_id=owner_id, state=state, owned=owned[owner_id],
                                   expired=expired[owner_id], heartbeat_age=age, properties=props))
    return tuple(result)


def _summary(rows: Sequence[PartitionStatus], members: Sequence[MemberStatus], partitions_from: str) -> StatusSummary:
    states = Counter(row.state for row in rows)
    live = [member.owned for member in members if member.state == "live"]
    lags = [row.lag for row in rows if row.lag is not None]
    return StatusSummary(
        partitions=len(rows), owned=states[OWNED], unowned=states[RELEASED] + states[UNCLAIMED],
        expired=states[EXPIRED], unreadable=states[UNREADABLE],
        handoffs_pending=sum(1 for row in rows if row.state == OWNED and row.requested_by),
        live_members=len(live), imbalance=(max(live) - min(live)) if live else None,
        most_owned=max(live) if live else None, fewest_owned=min(live) if live else None,
        lag=sum(lags) if lags else None, lag_known=len(lags), partitions_from=partitions_from)


# --------------------------------------------------------------------------- reading


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


# --------------------------------------------------------------------------- showing


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    sign, seconds = ("-", -seconds) if seconds < 0 else ("", seconds)
    whole = int(seconds)
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600:02d}h"


def _text(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


_STATE_STYLE = {OWNED: "green", EXPIRED: "bold red", RELEASED: "yellow", UNCLAIMED: "yellow", UNREADABLE: "magenta"}


def render(status: GroupStatus, *, refreshed: str | None = None) -> RenderableType:
    """The partitions table, the members table, the notes and the summary line.

    Columns nobody could fill are left out: ``checkpointed`` when the store keeps no
    checkpoint times, ``last enqueued`` and ``lag`` when the event hub was not read (a
    note says why).

    Example::

        Console().print(render(status))
    """
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    heading = Text(f"consumer group {status.consumer_group} of {status.fully_qualified_namespace}/"
                   f"{status.eventhub_name}", style="bold")
    where = Text(f"{status.store} · store time {status.server_time:%Y-%m-%d %H:%M:%S} UTC · expiration "
                 f"{status.expiration:g} s" + (f" · {refreshed}" if refreshed else ""), style="dim")
    timed = any(row.checkpoint_age is not None for row in status.partitions)
    lagged = any(row.last_enqueued_sequence_number is not None for row in status.partitions)
    partitions = Table(box=box.SIMPLE_HEAD, show_edge=False)
    columns = [("partition", "right"), ("owner", "left"), ("state", "left"), ("epoch", "right"),
               ("lease age", "right"), ("checkpoint", "right"), ("offset", "right")]
    columns += [("checkpointed", "right")] if timed else []
    columns += [("last enqueued", "right"), ("lag", "right")] if lagged else []
    for name, justify in columns:
        partitions.add_column(name, justify=justify)  # type: ignore[arg-type]
    for row in status.partitions:
        state = Text(row.state, style=_STATE_STYLE.get(row.state, ""))
        if row.requested_by:
            state.append(f", handoff to {row.requested_by}", style="cyan")
        if row.note:
            state.append(f" ({row.note})")
        cells: list[Any] = [row.partition_id, _text(row.owner_id), state, _text(row.epoch), _age(row.lease_age),
                            _text(row.checkpoint_sequence_number), _text(row.checkpoint_offset)]
        if timed:
            cells.append(_age(row.checkpoint_age) + (" ago" if row.checkpoint_age is not None else ""))
        if lagged:
            from_start = " from start" if row.lag_from == "start" and row.lag is not None else ""
            cells += [_text(row.last_enqueued_sequence_number), _text(row.lag) + from_start]
        partitions.add_row(*cells)

    members = Table(box=box.SIMPLE_HEAD, show_edge=False)
    # Heartbeat and properties come from member records; without them the columns say nothing.
    heartbeats = any(member.heartbeat_age is not None for member in status.members)
    member_columns = [("member", "left"), ("state", "left"), ("owns", "right"), ("expired", "right")]
    if heartbeats:
        member_columns += [("heartbeat", "right"), ("strategy", "left"), ("handoff", "left"), ("ordinal", "right")]
    for name, justify in member_columns:
        members.add_column(name, justify=justify)  # type: ignore[arg-type]
    for member in status.members:
        member_cells: list[Any] = [member.owner_id, Text(member.state, style="green" if member.state == "live"
                                                         else "red"), str(member.owned), str(member.expired)]
        if heartbeats:
            member_cells += [_age(member.heartbeat_age), _text(member.properties.get("strategy")),
                             _text(member.properties.get(HANDOFF_PROPERTY)),
                             _text(member.properties.get(ORDINAL_PROPERTY))]
        members.add_row(*member_cells)

    parts: list[Any] = [heading, where, Text(""), partitions, Text(""), Text("members", style="bold"), members,
                        Text("")]
    for note in (status.records_note, status.members_note, status.lag_note):
        if note:
            parts.append(Text(note, style="dim"))
    parts.append(Text(status.summary.line(), style="bold"))
    return Group(*parts)


# --------------------------------------------------------------------------- the command


@dataclass(frozen=True)
class StatusOptions:
    """The options of ``eventprocessor status`` (see its ``--help``)."""

    namespace: str | None = None
    eventhub: str | None = None
    consumer_group: str = "$default"
    store: str = "blob"
    connection_string: str | None = None
    account_url: str | None = None
    credential: str = "default"
    account_key: str | None = None
    sas_token: str | None = None
    container: str | None = None
    table: str | None = None
    eventhub_connection_string: str | None = None
    eventhub_credential: str | None = None
    expiration: float = 60.0
    timeout: float = 10.0
    as_json: bool = False
    watch: bool = False
    interval: float = 2.0
    count: int | None = None

    def __repr__(self) -> str:  # the dataclass default would show the secrets
        return (f"StatusOptions(namespace={self.namespace!r}, eventhub={self.eventhub!r}, "
                f"consumer_group={self.consumer_group!r}, store={self.store!r})")


def _store_credential(options: StatusOptions, closers: list[Any]) -> Any:
    if options.credential == "key":
        if not options.account_key:
            raise CommandError(f"--credential key needs the account key: set {STORE_ACCOUNT_KEY_ENV} "
                               "(or pass --account-key)")
        return options.account_key
    if options.credential == "sas":
        if not options.sas_token:
            raise CommandError(f"--credential sas needs a SAS token: set {STORE_SAS_TOKEN_ENV} (or pass --sas-token)")
        return options.sas_token
    if options.credential == "none":
        return None
    require(purpose="--credential default", packages=[("azure.identity", "azure-identity")])
    from azure.identity.aio import DefaultAzureCredential

    credential = DefaultAzureCredential()
    closers.append(credential)
    return credential


def _open_store(options: StatusOptions, closers: list[Any]) -> CheckpointStore:
    """The store the options name; nothing is sent until it is read."""
    if options.connection_string and options.account_url:
        raise CommandError(f"give the store either by connection string (--connection-string or "
                           f"{STORE_CONNECTION_STRING_ENV}) or by --account-url, not both")
    if not options.connection_string and not options.account_url:
        raise CommandError(f"which store? set {STORE_CONNECTION_STRING_ENV} (or pass --connection-string), "
                           "or pass --account-url with --credential")
    name_option, name = ("--container", options.container) if options.store == "blob" else ("--table", options.table)
    if not name:
        raise CommandError(f"--store {options.store} needs {name_option} (where the processors keep their records)")
    require(purpose=f"`eventprocessor status --store {options.store}`", extras=[options.store])
    try:
        if options.store == "blob":
            from eventprocessor.stores.blob import BlobCheckpointStore

            if options.connection_string:
                return BlobCheckpointStore.from_connection_string(options.connection_string, name)
            return BlobCheckpointStore(options.account_url or "", name, credential=_store_credential(options, closers))
        from eventprocessor.stores.table import TableCheckpointStore

        if options.connection_string:
            return TableCheckpointStore.from_connection_string(options.connection_string, name)
        return TableCheckpointStore(options.account_url or "", name, credential=_store_credential(options, closers))
    except ConfigurationError as error:
        raise CommandError(f"the store options are not valid: {' '.join(str(error).split())}") from None


def _open_source(options: StatusOptions, closers: list[Any]) -> tuple[EventSource | None, str | None, str, str]:
    """The event hub to read lag from (or None and why not), and the namespace and hub
    name to look up (from the options, else from the Event Hubs connection string)."""
    namespace, eventhub = options.namespace, options.eventhub
    if not options.eventhub_connection_string and not options.eventhub_credential:
        if not namespace or not eventhub:
            raise CommandError("which group? pass --namespace (fully qualified, as the records are keyed, e.g. "
                               "myns.servicebus.windows.net) and --eventhub")
        return None, (f"lag: unknown (no Event Hubs connection given: set {EVENTHUB_CONNECTION_STRING_ENV} or pass "
                      "--eventhub-credential default)"), namespace, eventhub
    from eventprocessor.cli.user_errors import install_command, missing_modules

    if missing_modules(["azure.eventhub"]):
        if not namespace or not eventhub:
            raise CommandError("pass --namespace and --eventhub (reading them from the Event Hubs connection string "
                               f"needs the [eventhub] extra: run `{install_command(['eventhub'])}`)")
        return None, (f"lag: unknown (reading the event hub needs the [eventhub] extra: run "
                      f"`{install_command(['eventhub'])}`)"), namespace, eventhub
    from eventprocessor.sources.eventhub import EventHubSource

    source: EventSource
    try:
        if options.eventhub_connection_string:
            source = EventHubSource.from_connection_string(options.eventhub_connection_string, eventhub_name=eventhub)
        else:
            if not namespace or not eventhub:
                raise CommandError("--eventhub-credential default needs --namespace and --eventhub")
            require(purpose="--eventhub-credential default", packages=[("azure.identity", "azure-identity")])
            from azure.identity.aio import DefaultAzureCredential

            credential = DefaultAzureCredential()
            closers.append(credential)
            source = EventHubSource(namespace, eventhub, credential)
    except ConfigurationError as error:
        raise CommandError(f"the Event Hubs options are not valid: {' '.join(str(error).split())}") from None
    closers.append(source)
    return source, None, namespace or source.fully_qualified_namespace, source.eventhub_name


async def _close(closers: Sequence[Any]) -> None:
    # Clients first, then the credentials they use.
    for closer in sorted(closers, key=lambda closer: hasattr(closer, "get_token")):
        try:
            await asyncio.wait_for(closer.close(), CLOSE_TIMEOUT)
        except Exception:  # closing is best effort: the command's answer is already out
            logger.debug("closing %s failed", type(closer).__name__, exc_info=True)


def _console() -> Console:
    from rich.console import Console

    # Piped output is not wrapped at rich's default 80 columns: a row per line reads and
    # greps better. COLUMNS still wins.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
    return Console(width=width)


async def _watch(options: StatusOptions, read: Any, console: Console) -> None:
    from rich.live import Live
    from rich.rule import Rule
    from rich.text import Text

    refreshes = 0
    live: Live | None = None
    last: GroupStatus | None = None
    try:
        while options.count is None or refreshes < options.count:
            started = time.monotonic()
            stamp = time.strftime("%H:%M:%S")
            try:
                status = await read()
                last, problem = status, None
            except CommandError as error:
                if last is None:
                    raise  # nothing to show yet: the options are probably wrong
                problem = f"refresh at {stamp} failed: {error}; showing the status read before"
            refreshes += 1
            if options.as_json:
                document = last.to_json() if last is not None else {}
                print(json.dumps({**document, "refreshed": stamp, "refresh_error": problem}), flush=True)
            else:
                assert last is not None
                view = render(last, refreshed=f"refreshed {stamp}, every {options.interval:g} s, Ctrl-C to stop")
                if problem:
                    from rich.console import Group

                    view = Group(view, Text(problem, style="bold red"))
                if console.is_terminal:
                    if live is None:
                        live = Live(view, console=console, auto_refresh=False, screen=False)
                        live.start()
                    live.update(view, refresh=True)
                else:
                    console.print(Rule(f"refresh {refreshes} at {stamp}"))
                    console.print(view)
            if options.count is not None and refreshes >= options.count:
                break
            await asyncio.sleep(max(0.0, options.interval - (time.monotonic() - started)))
    finally:
        if live is not None:
            live.stop()


def run_status(options: StatusOptions) -> None:
    """Run ``eventprocessor status`` with ``options``: print the status once, or refresh
    it every ``interval`` seconds with ``watch``. User errors raise ``CommandError``.

    Example::

        run_status(StatusOptions(namespace="ns.servicebus.windows.net", eventhub="telemetry",
                                 connection_string=conn_str, container="checkpoints"))
    """
    closers: list[Any] = []
    source, lag_note, namespace, eventhub = _open_source(options, closers)
    store = _open_store(options, closers)
    closers.append(store)
    console = _console()

    async def read() -> GroupStatus:
        return await read_status(store, namespace, eventhub, options.consumer_group, source=source,
                                 expiration=options.expiration, timeout=options.timeout, lag_note=lag_note)

    async def main() -> None:
        try:
            if options.watch:
                await _watch(options, read, console)
            elif options.as_json:
                print(json.dumps((await read()).to_json(), indent=2))
            else:
                console.print(render(await read()))
        finally:
            await _close(closers)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        if not options.watch:
            raise
    except BrokenPipeError:  # `status --json | head`: the reader has what it wanted
        # Python flushes stdout again at exit; point it at nothing so that it stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
