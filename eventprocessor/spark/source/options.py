"""The options of ``spark.readStream.format("eventhubs")``, checked once, all together.

Option names are the Microsoft connector's (``azure-event-hubs-spark``) where it has one,
so a query written for it keeps its options. Spark hands options over case-insensitive
(lower-cased). Every problem found is reported in one :class:`ConfigurationError` that
names the option and says what to write instead; the connection string is never shown.

Positions are the connector's JSON ``EventPosition``::

    {"offset": "-1", "seqNo": -1, "enqueuedTime": null, "isInclusive": true}

The first field that is set wins, in this order: ``offset`` (a string; ``"-1"`` is the
start of the stream, ``"@latest"`` its end), ``seqNo`` (>= 0), ``enqueuedTime`` (ISO
8601, UTC when no zone is given). ``eventhubs.startingPositions`` maps partitions to
positions; its keys are the connector's ``{"ehName": "hub", "partitionId": 0}`` (as JSON
text), or plain partition ids.

Example::

    options = SourceOptions.parse({"eventhubs.connectionstring": conn, "maxeventspertrigger": "10000"})
"""
from __future__ import annotations

import difflib
import json
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ...errors import ConfigurationError
from ...extras import install_command

__all__ = ["SourceOptions", "Position", "StoreOptions", "OPTIONS", "START_OF_STREAM", "END_OF_STREAM"]

logger = logging.getLogger(__name__)

START_OF_STREAM = "-1"
END_OF_STREAM = "@latest"

# name (as written in docs) -> what it is, for the error message of an unknown option.
OPTIONS: dict[str, str] = {
    "eventhubs.connectionString": "the Event Hubs connection string, with EntityPath=<hub> (plain text)",
    "eventhubs.consumerGroup": "the consumer group (default $Default)",
    "eventhubs.startingPosition": "where a new query starts, a JSON EventPosition (default: the end of the stream)",
    "eventhubs.startingPositions": "per-partition starting positions, a JSON map",
    "eventhubs.endingPosition": "where a batch read ends, a JSON EventPosition (default: the end of the stream)",
    "eventhubs.endingPositions": "per-partition ending positions of a batch read, a JSON map",
    "maxEventsPerTrigger": "most events per micro-batch (default 1000 per partition)",
    "minPartitions": "least Spark input partitions per batch; hot partitions are split by sequence range",
    "failOnDataLoss": "fail when events expired before they were read (default true)",
    "eventhubs.receiverTimeout": "how long a task waits for an event it knows exists (default PT60S)",
    "eventhubs.operationTimeout": "how long a call to the hub may take (default PT300S)",
    "eventhubs.prefetchCount": "events a receiver asks for ahead (default 500)",
    "eventhubs.useExclusiveReceiver": "read with owner level 0 (default false here)",
    "eventhubs.checkpointStore.connectionString": "a storage connection string: write Event Hubs checkpoints there",
    "eventhubs.checkpointStore.container": "the Blob container of the checkpoint store",
    "eventhubs.checkpointStore.table": "the table of the checkpoint store (instead of a container)",
    "eventhubs.checkpointStore.ownerId": "the owner id the query's checkpoints are written as",
    "eventhubs.checkpointStore.ownershipExpiration": "seconds after which an owner counts as gone (default 75)",
}
_BY_KEY = {name.lower(): name for name in OPTIONS}

# Options of the Microsoft connector that tune its own machinery (thread pools, its
# receiver cache, its metrics plug-in): accepted and ignored, so its queries still load.
_IGNORED = {name.lower(): name for name in (
    "eventhubs.threadPoolSize", "eventhubs.maxSilentTime", "eventhubs.maxAcceptableBatchReceiveTime",
    "eventhubs.maxBatchReceiveTime", "eventhubs.slowPartitionAdjustment", "eventhubs.metricPlugin",
    "partitionPreferredLocationStrategy", "eventhubs.partitionPreferredLocationStrategy",
    "eventhubs.DynamicPartitionDiscovery", "useSimulatedClient")}
# Options of the connector this source cannot honour: refused with the way out.
_REFUSED = {
    "eventhubs.useaadauth": "Azure AD callbacks are JVM classes; pass a connection string (a SAS key or token)",
    "eventhubs.aadauthcallback": "Azure AD callbacks are JVM classes; pass a connection string (a SAS key or token)",
    "eventhubs.aadauthcallbackparams": "Azure AD callbacks are JVM classes; pass a connection string",
    "eventhubs.maxratepersecond": "rates are for the connector's DStream API; use maxEventsPerTrigger",
    "eventhubs.maxrateperpartition": "rates are for the connector's DStream API; use maxEventsPerTrigger",
    "eventhubs.maxratesperpartition": "rates are for the connector's DStream API; use maxEventsPerTrigger",
    "eventhubs.endingposition.sequencenumber": "use eventhubs.endingPosition",
}
# Spark's own options, which reach every data source.
_SPARK = {"path", "paths"}

_MAX_LONG = 2**63 - 1
_DURATION = re.compile(r"^P(?:T(?:(?P<h>\d+(?:\.\d+)?)H)?(?:(?P<m>\d+(?:\.\d+)?)M)?(?:(?P<s>\d+(?:\.\d+)?)S)?)$",
                       re.I)


@dataclass(frozen=True)
class Position:
    """One of the connector's EventPositions: ``kind`` is ``start``, ``end``,
    ``offset``, ``sequence_number`` or ``enqueued_time``."""

    kind: str
    value: Any = None
    inclusive: bool = True

    def to_json(self) -> dict[str, Any]:
        """The connector's JSON form (``eventhubs.startingPosition``)."""
        if self.kind in ("start", "end"):
            return {"offset": START_OF_STREAM if self.kind == "start" else END_OF_STREAM, "seqNo": -1,
                    "enqueuedTime": None, "isInclusive": self.inclusive}
        if self.kind == "offset":
            return {"offset": self.value, "seqNo": -1, "enqueuedTime": None, "isInclusive": self.inclusive}
        if self.kind == "sequence_number":
            return {"offset": None, "seqNo": self.value, "enqueuedTime": None, "isInclusive": self.inclusive}
        return {"offset": None, "seqNo": -1, "enqueuedTime": self.value.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                "isInclusive": self.inclusive}


START = Position("start")
END = Position("end", inclusive=False)


@dataclass(frozen=True)
class StoreOptions:
    """A checkpoint store named in the options (see the README, "Spark Structured Streaming")."""

    connection_string: str = field(repr=False)
    container: str | None = None
    table: str | None = None
    owner_id: str | None = None
    ownership_expiration: float = 75.0

    @property
    def kind(self) -> str:
        return "blob" if self.container else "table"

    @property
    def where(self) -> str:
        return f"container {self.container!r}" if self.container else f"table {self.table!r}"


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options. Build it with :meth:`parse`."""

    connection_string: str = field(repr=False)
    fully_qualified_namespace: str
    eventhub_name: str
    consumer_group: str = "$Default"
    starting_position: Position = END
    starting_positions: Mapping[str, Position] = field(default_factory=dict)
    ending_position: Position = END
    ending_positions: Mapping[str, Position] = field(default_factory=dict)
    max_events_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    receiver_timeout: float = 60.0
    operation_timeout: float = 300.0
    prefetch_count: int = 500
    exclusive_receiver: bool = False
    store: StoreOptions | None = None

    def starting(self, partition_id: str) -> Position:
        return self.starting_positions.get(partition_id, self.starting_position)

    def ending(self, partition_id: str) -> Position:
        return self.ending_positions.get(partition_id, self.ending_position)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Check every option; raise one :class:`ConfigurationError` listing each problem.

        Example::

            SourceOptions.parse({"eventhubs.connectionString": conn, "eventhubs.consumerGroup": "spark"})
        """
        return _Parser({str(k).lower(): v for k, v in options.items()}).parse()


class _Parser:
    def __init__(self, raw: Mapping[str, Any]) -> None:
        self.raw = raw
        self.problems: list[str] = []

    def problem(self, message: str) -> None:
        self.problems.append(message)

    def text(self, key: str) -> str | None:
        value = self.raw.get(key.lower())
        if value is None:
            return None
        if not isinstance(value, str):
            value = str(value)
        return value.strip()

    def parse(self) -> SourceOptions:
        self.check_names()
        conn, namespace, hub = self.connection()
        kwargs: dict[str, Any] = {}
        group = self.text("eventhubs.consumerGroup")
        if group is not None:
            if not group:
                self.problem("eventhubs.consumerGroup is empty: name the consumer group (or leave the option out for "
                             "$Default)")
            kwargs["consumer_group"] = group
        for key, attr in (("eventhubs.startingPosition", "starting_position"),
                          ("eventhubs.endingPosition", "ending_position")):
            text = self.text(key)
            if text is not None:
                position = self.position(key, text)
                if position is not None:
                    kwargs[attr] = position
        for key, attr in (("eventhubs.startingPositions", "starting_positions"),
                          ("eventhubs.endingPositions", "ending_positions")):
            text = self.text(key)
            if text is not None:
                kwargs[attr] = self.positions(key, text, hub)
        kwargs["max_events_per_trigger"] = self.integer("maxEventsPerTrigger", 1, _MAX_LONG)
        kwargs["min_partitions"] = self.integer("minPartitions", 1, 1_000_000)
        prefetch = self.integer("eventhubs.prefetchCount", 1, 8000)
        if prefetch is not None:
            kwargs["prefetch_count"] = prefetch
        for key, attr in (("failOnDataLoss", "fail_on_data_loss"),
                          ("eventhubs.useExclusiveReceiver", "exclusive_receiver")):
            flag = self.boolean(key)
            if flag is not None:
                kwargs[attr] = flag
        for key, attr in (("eventhubs.receiverTimeout", "receiver_timeout"),
                          ("eventhubs.operationTimeout", "operation_timeout")):
            seconds = self.duration(key)
            if seconds is not None:
                kwargs[attr] = seconds
        if kwargs.get("exclusive_receiver") and (kwargs.get("min_partitions") or 0) > 1:
            self.problem("eventhubs.useExclusiveReceiver=true and minPartitions cannot go together: two tasks reading "
                         "one partition with owner level 0 would disconnect each other; drop one of them")
        kwargs["store"] = self.store()
        if self.problems:
            raise ConfigurationError("the eventhubs source cannot load: " + "; ".join(self.problems))
        return SourceOptions(connection_string=conn, fully_qualified_namespace=namespace, eventhub_name=hub,
                             **{k: v for k, v in kwargs.items() if v is not None})

    def check_names(self) -> None:
        for key in self.raw:
            if key in _BY_KEY or key in _SPARK:
                continue
            if key in _IGNORED:
                logger.warning("the eventhubs source ignores option %s (it tunes the Microsoft connector's own "
                               "machinery, which this source does not have)", _IGNORED[key])
                continue
            if key in _REFUSED:
                self.problem(f"option {key} is not supported: {_REFUSED[key]}")
                continue
            close = difflib.get_close_matches(key, list(_BY_KEY), n=1, cutoff=0.75)
            if close:
                self.problem(f"unknown option {key!r}: did you mean {_BY_KEY[close[0]]}?")
            elif key.startswith("eventhubs."):
                self.problem(f"unknown option {key!r}; the options are: {', '.join(sorted(OPTIONS))}")
            else:
                logger.warning("the eventhubs source ignores option %r (not one of its options)", key)

    def connection(self) -> tuple[str, str, str]:
        conn = self.text("eventhubs.connectionString")
        if not conn:
            self.problem("eventhubs.connectionString is missing: set it to the hub's connection string "
                         "'Endpoint=sb://<namespace>.servicebus.windows.net/;SharedAccessKeyName=<name>;"
                         "SharedAccessKey=<key>;EntityPath=<hub>' (plain text; no encrypt step)")
            return "", "", ""
        try:
            from azure.eventhub import parse_connection_string
        except ImportError:  # pragma: no cover - depends on the extra
            self.problem("the eventhubs source needs azure-eventhub on the driver and the executors: "
                         + install_command(["eventhub", "spark"]))
            return conn, "", ""
        try:
            props = parse_connection_string(conn)
        except Exception:
            self.problem("eventhubs.connectionString is malformed (value not shown): expected 'Endpoint=sb://"
                         "<namespace>/;SharedAccessKeyName=<name>;SharedAccessKey=<key>;EntityPath=<hub>'")
            return conn, "", ""
        if not props.eventhub_name:
            self.problem("eventhubs.connectionString has no EntityPath: append ';EntityPath=<event hub name>' "
                         "(as the Microsoft connector requires)")
            return conn, props.fully_qualified_namespace or "", ""
        return conn, props.fully_qualified_namespace, props.eventhub_name

    def integer(self, key: str, low: int, high: int) -> int | None:
        text = self.text(key)
        if text is None:
            return None
        try:
            value = int(text)
        except ValueError:
            self.problem(f"{key} must be a whole number from {low} to {high}, got {text[:40]!r}")
            return None
        if not low <= value <= high:
            self.problem(f"{key} must be from {low} to {high}, got {value}")
            return None
        return value

    def boolean(self, key: str) -> bool | None:
        text = self.text(key)
        if text is None:
            return None
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        self.problem(f"{key} must be true or false, got {text[:40]!r}")
        return None

    def duration(self, key: str) -> float | None:
        """Seconds: a number, or a java.time.Duration text such as ``PT60S`` (the connector's form)."""
        text = self.text(key)
        if text is None:
            return None
        seconds: float | None
        try:
            seconds = float(text)
        except ValueError:
            match = _DURATION.match(text)
            seconds = None
            if match and any(match.groupdict().values()):
                parts = {k: float(v or 0) for k, v in match.groupdict().items()}
                seconds = parts["h"] * 3600 + parts["m"] * 60 + parts["s"]
        if seconds is None or not math.isfinite(seconds) or seconds <= 0:
            self.problem(f"{key} must be a positive duration such as PT60S or 60 (seconds), got {text[:40]!r}")
            return None
        return seconds

    def position(self, key: str, text: str) -> Position | None:
        try:
            data = json.loads(text)
        except ValueError:
            self.problem(f"{key} is not JSON: write an EventPosition such as "
                         '{"offset": "-1", "seqNo": -1, "enqueuedTime": null, "isInclusive": true}')
            return None
        return self.position_of(key, data)

    def position_of(self, key: str, data: Any) -> Position | None:
        if not isinstance(data, dict):
            self.problem(f"{key} must be a JSON object (an EventPosition), got {type(data).__name__}")
            return None
        unknown = set(data) - {"offset", "seqNo", "enqueuedTime", "isInclusive"}
        if unknown:
            self.problem(f"{key} has unknown fields {sorted(unknown)}: an EventPosition has offset, seqNo, "
                         "enqueuedTime and isInclusive")
            return None
        inclusive = data.get("isInclusive", True)
        if not isinstance(inclusive, bool):
            self.problem(f"{key}: isInclusive must be true or false, got {inclusive!r}")
            return None
        offset, seq, when = data.get("offset"), data.get("seqNo", -1), data.get("enqueuedTime")
        if offset is not None:
            if not isinstance(offset, str) or not offset:
                self.problem(f"{key}: offset must be a string (\"-1\" for the start, \"@latest\" for the end), "
                             f"got {offset!r}")
                return None
            if offset == START_OF_STREAM:
                return Position("start", inclusive=inclusive)
            if offset == END_OF_STREAM:
                return Position("end", inclusive=False)
            return Position("offset", offset, inclusive)
        if seq is None:
            seq = -1
        if isinstance(seq, bool) or not isinstance(seq, int) or not -1 <= seq <= _MAX_LONG:
            self.problem(f"{key}: seqNo must be a whole number from 0 (or -1 for unset), got {seq!r}")
            return None
        if seq >= 0:
            return Position("sequence_number", seq, inclusive)
        if when is not None:
            parsed = _timestamp(when)
            if parsed is None:
                self.problem(f"{key}: enqueuedTime must be an ISO 8601 time such as 2026-01-31T12:00:00.000Z, "
                             f"got {str(when)[:40]!r}")
                return None
            return Position("enqueued_time", parsed, inclusive)
        self.problem(f"{key} sets no position: give offset, seqNo or enqueuedTime")
        return None

    def positions(self, key: str, text: str, hub: str) -> dict[str, Position]:
        try:
            data = json.loads(text)
        except ValueError:
            self.problem(f"{key} is not JSON: write a map from '{{\"ehName\": \"<hub>\", \"partitionId\": 0}}' "
                         "(or a partition id) to an EventPosition")
            return {}
        if not isinstance(data, dict):
            self.problem(f"{key} must be a JSON object mapping partitions to EventPositions")
            return {}
        result: dict[str, Position] = {}
        for raw_key, value in data.items():
            pid = self.partition_key(key, raw_key, hub)
            if pid is None:
                continue
            position = self.position_of(f"{key}[{pid}]", value)
            if position is not None:
                result[pid] = position
        return result

    def partition_key(self, key: str, raw_key: str, hub: str) -> str | None:
        text = raw_key.strip()
        if text.startswith("{"):
            try:
                name_and_partition = json.loads(text)
            except ValueError:
                name_and_partition = None
            if not isinstance(name_and_partition, dict) or "partitionId" not in name_and_partition:
                self.problem(f"{key}: key {raw_key[:60]!r} is not a NameAndPartition such as "
                             '{"ehName": "hub", "partitionId": 0}')
                return None
            name = name_and_partition.get("ehName")
            if name is not None and hub and str(name).lower() != hub.lower():
                self.problem(f"{key}: key {raw_key[:60]!r} names event hub {name!r}, but the connection string's "
                             f"EntityPath is {hub!r}")
                return None
            text = str(name_and_partition["partitionId"])
        if not text:
            self.problem(f"{key}: an empty partition id")
            return None
        return text

    def store(self) -> StoreOptions | None:
        conn = self.text("eventhubs.checkpointStore.connectionString")
        container = self.text("eventhubs.checkpointStore.container")
        table = self.text("eventhubs.checkpointStore.table")
        owner = self.text("eventhubs.checkpointStore.ownerId")
        expiration = self.duration("eventhubs.checkpointStore.ownershipExpiration")
        if conn is None:
            named = [k for k, v in (("container", container), ("table", table), ("ownerId", owner)) if v is not None]
            if named or expiration is not None:
                self.problem("eventhubs.checkpointStore.connectionString is missing: the checkpoint store options "
                             f"({', '.join(named) or 'ownershipExpiration'}) need the storage account's connection "
                             "string")
            return None
        if not conn:
            self.problem("eventhubs.checkpointStore.connectionString is empty")
            return None
        if (container is None) == (table is None):
            self.problem("the checkpoint store needs exactly one of eventhubs.checkpointStore.container (Blob) and "
                         "eventhubs.checkpointStore.table (Table)")
            return None
        if owner is not None and (not owner or not re.match(r"^[\x21-\x7e]{1,200}$", owner)):
            self.problem("eventhubs.checkpointStore.ownerId must be 1-200 printable ASCII characters without spaces")
            return None
        return StoreOptions(conn, container, table, owner, expiration if expiration is not None else 75.0)


def _timestamp(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)
