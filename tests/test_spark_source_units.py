"""The eventhubs Spark source without Spark or a hub: its options, its offsets and
planning (rate limits, new partitions, Trigger.AvailableNow, split ranges), its rows,
and its part in a checkpoint store (on the in-memory store). The same source on a real
cluster and emulator: ``tests/test_spark_source.py``."""
from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventprocessor.errors import ConfigurationError
from eventprocessor.events import Event
from eventprocessor.sources.base import PartitionProperties
from eventprocessor.spark.source.checkpoints import CheckpointWriter, plan_claims
from eventprocessor.spark.source.offsets import (
    HubOffset,
    PartitionPosition,
    ReadRange,
    data_loss,
    group_ranges,
    plan_latest,
    plan_ranges,
    rate_limit,
)
from eventprocessor.spark.source.options import Position, SourceOptions, StoreOptions
from eventprocessor.spark.source.rows import ARROW_SCHEMA, events_to_record_batch, json_value
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.stores.records import Checkpoint, Ownership
from eventprocessor.testing import FaultyStore

KEY = "c2VjcmV0LWtleS12YWx1ZQ=="
CONN = f"Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=listen;SharedAccessKey={KEY};EntityPath=hub"


def parse(**extra: str) -> SourceOptions:
    return SourceOptions.parse({"eventhubs.connectionString": CONN, **extra})


def position(**fields) -> str:
    return json.dumps({"offset": None, "seqNo": -1, "enqueuedTime": None, "isInclusive": True, **fields})


# ----------------------------------------------------------------------------- options


def test_the_connectors_options_parse_as_its_users_write_them():
    starting = {json.dumps({"ehName": "hub", "partitionId": 0}): json.loads(position(seqNo=42)),
                json.dumps({"ehName": "hub", "partitionId": 1}): json.loads(position(offset="@latest"))}
    options = SourceOptions.parse({  # Spark lower-cases option names; both spellings must work
        "eventhubs.connectionString": CONN, "EVENTHUBS.CONSUMERGROUP": "spark", "maxEventsPerTrigger": "5000",
        "eventhubs.startingPosition": position(offset="-1"), "eventhubs.startingPositions": json.dumps(starting),
        "eventhubs.endingPosition": position(enqueuedTime="2026-01-31T12:00:00.000Z"),
        "eventhubs.receiverTimeout": "PT30S", "eventhubs.operationTimeout": "PT2M", "eventhubs.prefetchCount": "800",
        "eventhubs.threadPoolSize": "16",  # the connector's own machinery: ignored
    })
    assert (options.eventhub_name, options.fully_qualified_namespace) == ("hub", "contoso.servicebus.windows.net")
    assert options.consumer_group == "spark" and options.max_events_per_trigger == 5000
    assert options.starting("0") == Position("sequence_number", 42, True)
    assert options.starting("1") == Position("end", inclusive=False)
    assert options.starting("7") == Position("start", inclusive=True)
    assert options.ending("3") == Position("enqueued_time", datetime(2026, 1, 31, 12, tzinfo=timezone.utc), True)
    assert (options.receiver_timeout, options.operation_timeout, options.prefetch_count) == (30.0, 120.0, 800)
    defaults = parse()
    assert defaults.consumer_group == "$Default"
    assert defaults.starting("0").kind == "end", "the connector starts at the end of the stream by default"
    assert defaults.fail_on_data_loss and defaults.store is None


def test_every_bad_option_is_named_in_one_error_without_the_secret():
    with pytest.raises(ConfigurationError) as error:
        SourceOptions.parse({"eventhubs.connectionString": CONN, "maxEventsPerTriger": "10",
                             "eventhubs.startingPosition": "{not json", "minPartitions": "0",
                             "failOnDataLoss": "maybe", "eventhubs.startingPositions": json.dumps(
                                 {json.dumps({"ehName": "other", "partitionId": 0}): json.loads(position(seqNo=1))}),
                             "eventhubs.maxRatePerPartition": "100", "eventhubs.checkpointStore.container": "cps"})
    text = str(error.value)
    for named in ("did you mean maxEventsPerTrigger", "eventhubs.startingPosition is not JSON",
                  "minPartitions must be from 1", "failOnDataLoss must be true or false", "names event hub 'other'",
                  "eventhubs.maxrateperpartition is not supported: rates are for the connector's DStream API",
                  "eventhubs.checkpointStore.connectionString is missing"):
        assert named in text, (named, text)
    assert KEY not in text


@pytest.mark.parametrize("conn, named", [
    ("", "eventhubs.connectionString is missing"),
    ("Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=" + KEY,
     "has no EntityPath: append ';EntityPath=<event hub name>'"),
    ("this is not a connection string " + KEY, "eventhubs.connectionString is malformed (value not shown)"),
])
def test_a_bad_connection_string_is_named_and_never_shown(conn, named):
    with pytest.raises(ConfigurationError, match="cannot load") as error:
        SourceOptions.parse({"eventhubs.connectionString": conn})
    assert named in str(error.value)
    assert KEY not in str(error.value)
    assert KEY not in repr(parse())


def test_positions_follow_the_connectors_precedence_and_forms():
    assert parse(**{"eventhubs.startingPosition": position(offset="1024", seqNo=5)}).starting("0") \
        == Position("offset", "1024", True), "an offset wins over a sequence number, as in the connector"
    assert parse(**{"eventhubs.startingPosition": position(seqNo=5, isInclusive=False)}).starting("0") \
        == Position("sequence_number", 5, False)
    when = parse(**{"eventhubs.startingPosition": position(enqueuedTime="2026-03-01T10:00:00")}).starting("0")
    assert when.value == datetime(2026, 3, 1, 10, tzinfo=timezone.utc), "a time without a zone is UTC"
    plain = parse(**{"eventhubs.startingPositions": json.dumps({"3": json.loads(position(seqNo=9))})})
    assert plain.starting("3").value == 9, "plain partition ids work as keys too"
    for bad, named in ((position(), "sets no position"), (position(seqNo="5"), "seqNo must be a whole number"),
                       (json.dumps({"offset": "-1", "sequence": 1}), "unknown fields ['sequence']"),
                       (position(enqueuedTime="yesterday"), "enqueuedTime must be an ISO 8601 time")):
        with pytest.raises(ConfigurationError, match="eventhubs.startingPosition") as error:
            parse(**{"eventhubs.startingPosition": bad})
        assert named in str(error.value)


def test_checkpoint_store_options():
    store = parse(**{"eventhubs.checkpointStore.connectionString": "UseDevelopmentStorage=true",
                     "eventhubs.checkpointStore.container": "checkpoints",
                     "eventhubs.checkpointStore.ownershipExpiration": "30"}).store
    assert store == StoreOptions("UseDevelopmentStorage=true", "checkpoints", None, None, 30.0)
    assert "UseDevelopmentStorage" not in repr(store)
    with pytest.raises(ConfigurationError, match="exactly one of eventhubs.checkpointStore.container"):
        parse(**{"eventhubs.checkpointStore.connectionString": "x", "eventhubs.checkpointStore.container": "a",
                 "eventhubs.checkpointStore.table": "b"})
    with pytest.raises(ConfigurationError, match="minPartitions cannot go together"):
        parse(**{"eventhubs.useExclusiveReceiver": "true", "minPartitions": "8"})


# ----------------------------------------------------------------------------- offsets and planning


def props(pid: str, begin: int, last: int, offset: str = "") -> PartitionProperties:
    return PartitionProperties(pid, begin, last, offset or str(last * 100), None, last < begin)


def offset_of(**seqs: int) -> HubOffset:
    return HubOffset("hub", {pid.lstrip("p"): PartitionPosition(seq) for pid, seq in seqs.items()})


def test_an_offset_is_json_in_partition_order_and_refuses_another_hub():
    offset = HubOffset("hub", {"10": PartitionPosition(5, "500"), "2": PartitionPosition(0)})
    data = offset.to_json()
    assert list(data["partitions"]) == ["2", "10"]
    assert json.loads(json.dumps(data)) == data
    assert HubOffset.from_json(data, "hub") == offset
    with pytest.raises(ConfigurationError, match="written for event hub 'hub'.*names 'other'"):
        HubOffset.from_json(data, "other")
    with pytest.raises(ConfigurationError, match="did not write"):
        HubOffset.from_json({"0": 5}, "hub")


def test_latest_takes_what_is_there_and_keeps_partitions_without_news_as_they_were():
    start = HubOffset("hub", {"0": PartitionPosition(10, "1000"), "1": PartitionPosition(3, None)})
    end = plan_latest(start, {"0": props("0", 0, 19, "1900"), "1": props("1", 0, 2)})
    assert end.partitions["0"] == PartitionPosition(20, "1900"), "the offset string of the last event comes along"
    assert end.partitions["1"] is start.partitions["1"], "a partition with nothing new keeps its entry as it was"
    assert plan_latest(start, {"0": props("0", 0, 9), "1": props("1", 0, 2)}).to_json() == start.to_json(), \
        "nothing new: the same JSON as the start (Spark compares the text)"


def test_a_new_partition_is_read_from_its_first_event():
    start = offset_of(p0=5)
    end = plan_latest(start, {"0": props("0", 0, 4), "1": props("1", 0, 9)})
    assert end.partitions["1"].sequence_number == 10
    assert [(r.partition_id, r.from_sequence_number, r.until_sequence_number) for r in plan_ranges(start, end)] \
        == [("1", 0, 10)]


def test_available_now_never_passes_its_target_and_ignores_partitions_added_after_it():
    target = HubOffset("hub", {"0": PartitionPosition(50, "5000"), "1": PartitionPosition(20, "2000")})
    grown = {"0": props("0", 0, 99), "1": props("1", 0, 19), "2": props("2", 0, 9)}
    start = offset_of(p0=0, p1=0)
    first = plan_latest(start, grown, max_rows=40, target=target)
    assert sum(first.partitions[p].sequence_number for p in "01") == 40 and "2" not in first.partitions
    second = plan_latest(first, grown, max_rows=40, target=target)
    assert second.sequence_numbers() == {"0": 50, "1": 20}
    assert second.partitions["0"].offset == "5000", "reaching the target gives its offset string"
    assert plan_latest(second, grown, max_rows=40, target=target) == second, "done: the start comes back"


def test_the_rate_limit_shares_rows_by_backlog_and_skips_expired_events():
    assert rate_limit({"0": 0, "1": 0}, {"0": 900, "1": 100}, 100) == {"0": 89, "1": 11}
    assert rate_limit({"0": 0, "1": 0, "2": 0}, {"0": 1000, "1": 1, "2": 1}, 3) == {"0": 1, "1": 1, "2": 1}, \
        "a small partition is not starved while the limit allows one event each"
    start = offset_of(p0=0)
    end = plan_latest(start, {"0": props("0", 500, 999)}, max_rows=100)
    assert end.sequence_numbers() == {"0": 600}, "expired events do not count against the limit"
    assert [d.partition_id for d in data_loss(start, {"0": props("0", 500, 999)})] == ["0"]
    assert data_loss(offset_of(p0=1000), {"0": props("0", 1000, 999)}) == [], "read up to the end, then expired"


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([str(i) for i in range(12)]),
                       st.tuples(st.integers(0, 10_000), st.integers(0, 10_000)), min_size=1),
       st.integers(1, 30_000))
def test_the_rate_limit_takes_exactly_the_limit_or_everything_and_never_goes_past_a_partition(ranges, limit):
    begins = {pid: b for pid, (b, _size) in ranges.items()}
    untils = {pid: b + size for pid, (b, size) in ranges.items()}
    got = rate_limit(begins, untils, limit)
    total = sum(untils[p] - begins[p] for p in ranges)
    assert sum(got[p] - begins[p] for p in ranges) == min(total, limit)
    assert all(begins[p] <= got[p] <= untils[p] for p in ranges)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from([str(i) for i in range(8)]),
                       st.tuples(st.integers(0, 1000), st.integers(0, 5000)), min_size=1),
       st.integers(1, 64))
def test_split_ranges_cover_each_partition_exactly_once(ranges, min_partitions):
    start = HubOffset("hub", {pid: PartitionPosition(b) for pid, (b, _size) in ranges.items()})
    end = HubOffset("hub", {pid: PartitionPosition(b + size) for pid, (b, size) in ranges.items()})
    planned = plan_ranges(start, end, min_partitions)
    whole = [r for r in plan_ranges(start, end) if r.count]
    assert len(planned) >= min(min_partitions, sum(r.count for r in whole)) or len(planned) >= len(whole)
    for w in whole:
        mine = sorted((r for r in planned if r.partition_id == w.partition_id), key=lambda r: r.from_sequence_number)
        assert mine[0].from_sequence_number == w.from_sequence_number
        assert mine[-1].until_sequence_number == w.until_sequence_number
        assert all(a.until_sequence_number == b.from_sequence_number for a, b in zip(mine, mine[1:], strict=False))
        assert all(r.count > 0 for r in mine)


def test_min_partitions_splits_a_hot_partition_in_proportion():
    start, end = offset_of(p0=0, p1=0), offset_of(p0=900, p1=100)
    planned = plan_ranges(start, end, 10)
    assert [(r.partition_id, r.count) for r in planned] == [("0", 100)] * 9 + [("1", 100)]
    assert planned[3] == ReadRange("0", 300, 400, 3, 9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=32), st.integers(1, 4096))
def test_small_ranges_share_tasks_and_every_range_is_read_once(sizes, min_events):
    ranges = [ReadRange(str(i), 0, size) for i, size in enumerate(sizes)]
    tasks = group_ranges(ranges, min_events)
    assert sorted(r.partition_id for task in tasks for r in task) == sorted(r.partition_id for r in ranges)
    for task in tasks[:-1]:
        assert len(task) == 1 or sum(r.count for r in task) >= min_events
        assert len(task) == 1 or all(r.count < min_events for r in task), "a large range has a task of its own"
    assert group_ranges([ReadRange("0", 0, 3125)] * 8) == [[ReadRange("0", 0, 3125)]] * 8, \
        "a batch of 25,000 over 8 partitions keeps one task per partition"
    quiet = group_ranges([ReadRange(str(p), 0, 80) for p in range(8)])
    assert len(quiet) == 1, "a quiet stream's batch (640 events) is one task"


# ----------------------------------------------------------------------------- rows


def test_the_arrow_schema_is_what_spark_expects_of_the_declared_schema():
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema

    from eventprocessor.spark.source.datasource import SCHEMA

    assert to_arrow_schema(SCHEMA, timezone="UTC").equals(ARROW_SCHEMA)


def test_rows_carry_the_connectors_columns_and_json_property_values():
    when = datetime(2026, 5, 1, 12, 30, 15, 123000, tzinfo=timezone.utc)
    events = [Event(b"\x00body", 7, "1792", when, "key-1", {"kind": b"reading", "n": 5, "ok": True, "raw": b"\x01\xff"},
                    "3", "msg-7", "application/json", "corr-1"),
              Event(b"", 8, "2048", when + timedelta(seconds=1))]
    batch = events_to_record_batch("3", events)
    assert batch.schema == ARROW_SCHEMA
    rows = batch.to_pylist()
    assert rows[0]["body"] == b"\x00body" and rows[0]["partition"] == "3" and rows[0]["offset"] == "1792"
    assert rows[0]["sequenceNumber"] == 7 and rows[0]["enqueuedTime"] == when
    assert rows[0]["publisher"] is None and rows[0]["partitionKey"] == "key-1"
    assert dict(rows[0]["properties"]) == {"kind": '"reading"', "n": "5", "ok": "true", "raw": "[1,-1]"}, \
        "AMQP strings arrive as bytes: text is a JSON string, other bytes an array of signed bytes"
    assert dict(rows[0]["systemProperties"]) == {"x-opt-partition-key": '"key-1"', "message-id": '"msg-7"',
                                                 "correlation-id": '"corr-1"', "content-type": '"application/json"'}
    assert rows[1]["properties"] == [] and rows[1]["systemProperties"] == [] and rows[1]["partitionKey"] is None
    assert json_value(datetime(2026, 1, 2, 3, 4, 5, 678900, tzinfo=timezone.utc)) == '"2026-01-02T03:04:05.678Z"'


def test_property_values_repeated_across_rows_render_by_their_own_type():
    """Each distinct value is rendered once per record batch; 1, True and 1.0 compare
    equal in Python but are different JSON, and unhashable values still render."""
    when = datetime(2026, 5, 1, tzinfo=timezone.utc)
    values = [1, True, 1.0, b"on", "on", [1, 2], 1, True]
    events = [Event(b"", i, str(i), when, properties={"v": value}) for i, value in enumerate(values)]
    rendered = [dict(row["properties"])["v"] for row in events_to_record_batch("0", events).to_pylist()]
    assert rendered == ["1", "true", "1.0", '"on"', '"on"', "[1,2]", "1", "true"]


def _received(messages: list[dict]) -> list:
    """Messages as azure-eventhub's decoder hands them to the lean receive path."""
    from azure.eventhub._pyamqp._decode import decode_payload
    from azure.eventhub._pyamqp._encode import encode_payload
    from azure.eventhub._pyamqp.message import Message, Properties
    from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes

    out = []
    for index, fields in enumerate(messages):
        annotations = {b"x-opt-sequence-number": 100 + index, b"x-opt-offset": str(8192 + index * 200).encode(),
                       b"x-opt-enqueued-time": {TYPE: AMQPTypes.timestamp, VALUE: 1777638615123 + index * 1001}}
        if "key" in fields:
            annotations[b"x-opt-partition-key"] = fields["key"]
        amqp = fields.get("amqp")
        message = Message(message_annotations=annotations, application_properties=fields.get("app"),
                          properties=None if amqp is None else Properties(**amqp),
                          **fields.get("body", {"data": [b"body %d" % index]}))
        out.append(decode_payload(memoryview(encode_payload(bytearray(), message))))
    return out


def test_record_batches_made_from_received_messages_are_those_made_from_their_events():
    """The reader processes make Arrow columns straight from the received messages: the
    same batch, value for value, as from the events the lean receive path makes of them."""
    pytest.importorskip("azure.eventhub")
    import uuid

    from eventprocessor.sources.eventhub.conversion import message_to_event
    from eventprocessor.spark.source.rows import messages_to_record_batch

    messages = _received([
        {},
        {"key": b"device-7", "app": {b"kind": b"reading", b"n": 5, b"ok": True, b"x": 2.5, b"raw": b"\x01\xff"},
         "amqp": {"message_id": b"m-1", "content_type": b"application/json", "correlation_id": b"c-1"}},
        {"amqp": {"message_id": uuid.UUID(int=7), "correlation_id": 42}, "app": {b"list": [1, b"a"], b"n": 5}},
        {"body": {"data": [b"three ", b"data ", b"sections"]}, "key": b"k\xc3\xa9"},
        {"body": {"sequence": [[b"reading", 21.5, True]]}, "app": {b"kind": b"reading"}},
        {"body": {"value": {b"device": b"d-7", b"readings": [-123, 21.5, False]}}},
        {"body": {"value": b"bytes value"}, "amqp": {"message_id": b"\xff\xfe"}},
        {"body": {"data": [b""]}, "app": {}},
    ])
    events = [message_to_event(message, "5") for message in messages]
    ours = messages_to_record_batch("5", messages)
    assert ours.schema == ARROW_SCHEMA
    assert ours.equals(events_to_record_batch("5", events))
    rows = ours.to_pylist()
    assert [r["sequenceNumber"] for r in rows] == list(range(100, 108))
    assert rows[0]["enqueuedTime"] == datetime(2026, 5, 1, 12, 30, 15, 123000, tzinfo=timezone.utc)
    assert rows[3]["body"] == b"three data sections" and rows[3]["partitionKey"] == "k\u00e9"
    assert dict(rows[1]["systemProperties"]) == {"x-opt-partition-key": '"device-7"', "message-id": '"m-1"',
                                                 "correlation-id": '"c-1"', "content-type": '"application/json"'}
    assert messages_to_record_batch("5", []).num_rows == 0


# ----------------------------------------------------------------------------- the checkpoint store


SCOPE = ("contoso.servicebus.windows.net", "hub", "$Default")


def listing_of(store: InMemoryCheckpointStore):
    return store.list_ownership(*SCOPE)


async def test_plan_claims_renews_its_own_claims_free_ones_and_leaves_live_owners():
    store = InMemoryCheckpointStore()
    await store.claim_ownership([Ownership(*SCOPE, "0", "processor-a", epoch=3),
                                 Ownership(*SCOPE, "1", "spark-q", epoch=2),
                                 Ownership(*SCOPE, "2", "", epoch=5)])
    plan = plan_claims(await listing_of(store), ["0", "1", "2", "3"], "spark-q", fully_qualified_namespace=SCOPE[0],
                       eventhub_name=SCOPE[1], consumer_group=SCOPE[2], expiration=60)
    assert [(o.partition_id, o.epoch) for o in plan.renew] == [("1", 2)]
    assert [(o.partition_id, o.epoch) for o in plan.claim] == [("2", 6), ("3", 1)]
    assert plan.held_by_others == {"0": "processor-a"}
    later = await store.list_ownership(*SCOPE)
    aged = type(later)(later.ownerships, later.server_time + timedelta(seconds=61), later.unreadable)
    plan = plan_claims(aged, ["0"], "spark-q", fully_qualified_namespace=SCOPE[0], eventhub_name=SCOPE[1],
                       consumer_group=SCOPE[2], expiration=60)
    assert [(o.partition_id, o.epoch) for o in plan.claim] == [("0", 4)], "an expired owner's partition is free"


def end_at(**seqs) -> HubOffset:
    return HubOffset("hub", {pid.lstrip("p"): PartitionPosition(seq, f"o{seq - 1}") for pid, seq in seqs.items()})


async def checkpoints(store) -> dict[str, int]:
    return {c.partition_id: c.sequence_number for c in await store.list_checkpoints(*SCOPE)}


async def test_a_query_never_moves_a_checkpoint_back_nor_writes_over_a_live_owner():
    store = InMemoryCheckpointStore()
    options = StoreOptions("unused", container="checkpoints", owner_id="spark-q")
    # Partition 0 was checkpointed further by a processor that has since stopped (released).
    [record] = await store.claim_ownership([Ownership(*SCOPE, "0", "processor-a", epoch=1)])
    await store.fence_checkpoint(record)
    await store.update_checkpoint(Checkpoint(*SCOPE, "0", 99, offset="o99"), owner_id="processor-a", epoch=1)
    await store.release_ownership(record)
    # Partition 1 is owned, right now, by a live processor.
    await store.claim_ownership([Ownership(*SCOPE, "1", "processor-b", epoch=4)])
    writer = CheckpointWriter(options, *SCOPE, store=store.new_client())
    report = await writer.commit(end_at(p0=50, p1=50, p2=50))
    assert report.written == {"2": 49} and report.behind == {"0": 99} and report.held_by_others == {"1": "processor-b"}
    assert await checkpoints(store) == {"0": 99, "2": 49}
    report = await writer.commit(end_at(p0=120, p1=120, p2=120))
    assert report.written == {"0": 119, "2": 119}
    stored = {c.partition_id: c for c in await store.list_checkpoints(*SCOPE)}
    assert (stored["0"].offset, stored["0"].owner_id, stored["0"].epoch) == ("o119", "spark-q", 2)
    assert writer.held() == ["0", "2"]


async def test_an_owner_that_takes_a_partition_from_the_query_keeps_it():
    store = InMemoryCheckpointStore()
    writer = CheckpointWriter(StoreOptions("unused", container="c", owner_id="spark-q"), *SCOPE, store=store)
    await writer.commit(end_at(p0=10))
    listing = await store.list_ownership(*SCOPE)
    [mine] = listing.ownerships
    other = store.new_client()
    [taken] = await other.claim_ownership([Ownership(*SCOPE, "0", "processor-a", etag=mine.etag, epoch=mine.epoch + 1)])
    assert (await other.fence_checkpoint(taken)).sequence_number == 9, "the processor resumes after the query"
    report = await writer.commit(end_at(p0=20))
    assert report.held_by_others == {"0": "processor-a"} and not report.written
    assert await checkpoints(store) == {"0": 9}
    await writer.release()
    assert [o.owner_id for o in (await store.list_ownership(*SCOPE)).ownerships] == ["processor-a"], \
        "stopping releases only what the query still holds"


async def test_stopping_releases_the_querys_partitions_and_a_store_failure_never_raises():
    store = InMemoryCheckpointStore()
    writer = CheckpointWriter(StoreOptions("unused", container="c"), *SCOPE, store=store)
    assert writer.owner_id.startswith("spark-")
    await writer.commit(end_at(p0=10, p1=10))
    await writer.release()
    assert all(o.is_released for o in (await store.list_ownership(*SCOPE)).ownerships)

    broken = FaultyStore(InMemoryCheckpointStore())
    broken.down = True
    report = await CheckpointWriter(StoreOptions("unused", container="c"), *SCOPE, store=broken).commit(end_at(p0=10))
    assert report.failed and "CheckpointStoreError" in report.failed and not report.written


async def test_the_query_starts_after_the_stores_checkpoints():
    store = InMemoryCheckpointStore()
    [record] = await store.claim_ownership([Ownership(*SCOPE, "1", "processor-a", epoch=1)])
    await store.fence_checkpoint(record)
    await store.update_checkpoint(Checkpoint(*SCOPE, "1", 41, offset="4100"), owner_id="processor-a", epoch=1)
    writer = CheckpointWriter(StoreOptions("unused", container="c"), *SCOPE, store=store)
    assert await writer.starting_positions() == {"1": PartitionPosition(42, "4100")}


# ----------------------------------------------------------------------------- kept readers


def test_kept_readers_are_closed_after_two_and_a_half_batch_intervals_learnt_from_the_plans():
    """A batch adds at most one reader per partition, so closing a kept one after 2.5
    batch intervals bounds a partition's receivers below Event Hubs' 5 readers, whatever
    the pace: the interval comes from the planning times the tasks carry. A reader
    serves a range at most ``max_skip`` events after its position, never one behind it."""
    from eventprocessor.spark.source.executor import ReaderPool
    from eventprocessor.spark.source.readahead import PartitionReader
    from eventprocessor.testing import run_virtual

    options = SourceOptions.parse({"eventhubs.connectionString": CONN})

    async def main() -> None:
        now = asyncio.get_running_loop().time
        pool = ReaderPool(idle=5.0, max_skip=100, clock=now)
        assert pool.idle == 5.0, "no batch seen yet: the default"
        for planned in (1000.0, 1008.0, 1016.0):
            pool.note_batch(planned)
        assert pool.idle == 20.0
        pool.note_batch(1012.0)  # a batch whose tasks all ran elsewhere shows up later: the interval is 4 s
        assert pool.idle == 10.0
        kept = PartitionReader(options, "0", 50, ahead=10, clock=now)
        pool.keep(("p", "0"), kept)
        await asyncio.sleep(9.0)
        assert pool.take(("p", "0"), 40) is None, "behind the reader: never"
        assert pool.take(("p", "0"), 200) is None, "too far ahead"
        assert pool.take(("p", "0"), 80) is kept, "within 2.5 intervals: reused, skipping 30 events"
        kept.used_at = now()
        pool.keep(("p", "0"), kept)
        await asyncio.sleep(12.0)
        assert pool.kept() == 0 and pool.take(("p", "0"), 80) is None, "unused for longer: closed"
        for planned in (2000.0, 2000.2):
            pool.note_batch(planned)
        assert pool.idle == 2.0, "never below 2 s"

    run_virtual(main())


def test_readers_of_a_slow_first_batch_are_kept_for_the_second():
    """Before two batches were seen the interval is unknown, and the first batch is the
    slow one (executors and workers start): a reader it used must still be there for
    the second batch 10 s later, or every range is received again from the hub."""
    from eventprocessor.spark.source.executor import ReaderPool
    from eventprocessor.spark.source.readahead import PartitionReader
    from eventprocessor.testing import run_virtual

    options = SourceOptions.parse({"eventhubs.connectionString": CONN})

    async def main() -> None:
        now = asyncio.get_running_loop().time
        pool = ReaderPool(max_skip=100, clock=now)
        pool.note_batch(1000.0)
        kept = PartitionReader(options, "0", 50, ahead=10, clock=now)
        pool.keep(("p", "0"), kept)
        await asyncio.sleep(12.0)
        assert pool.take(("p", "0"), 50) is kept, "the second batch, 12 s later: the first batch's reader serves it"
        kept.used_at = now()
        pool.keep(("p", "0"), kept)
        await asyncio.sleep(32.0)
        assert pool.kept() == 0, "no batch for longer than the default (30 s): closed"

    run_virtual(main())
