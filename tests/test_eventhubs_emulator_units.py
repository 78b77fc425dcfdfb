"""The emulator's parts without a network: codec, frames, configuration, positions, storage.

The wire-level proof is ``tests/test_eventhubs_emulator.py`` (the official client);
these pin the pieces down quickly, including against the client's own decoder.
"""
from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventprocessor.emulators.eventhubs import frames as F
from eventprocessor.emulators.eventhubs.broker import BrokerError, Namespace
from eventprocessor.emulators.eventhubs.codec import (
    AMQPDecodeError,
    Described,
    Symbol,
    SymbolArray,
    Timestamp,
    UInt,
    ULong,
    decode,
    encode,
    skip,
)
from eventprocessor.emulators.eventhubs.config import EmulatorConfig, EmulatorConfigError
from eventprocessor.emulators.eventhubs.messages import SplitMessage, split_message
from eventprocessor.emulators.eventhubs.positions import StartPosition, parse_selector

ROOT = Path(__file__).resolve().parent.parent

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False),
    st.binary(max_size=300), st.text(max_size=300), st.builds(Symbol, st.text("abcxyz:-", max_size=40)),
    st.builds(Timestamp, st.integers(-2**63, 2**63 - 1)), st.uuids(),
    st.builds(UInt, st.integers(0, 2**32 - 1)), st.builds(ULong, st.integers(0, 2**64 - 1)),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=8),
    st.dictionaries(st.one_of(st.text(max_size=20), st.builds(Symbol, st.text("abc", max_size=10))), inner,
                    max_size=8),
    # Not 0x23-0x27: the client turns those delivery-state descriptors into dicts.
    st.builds(Described, st.builds(ULong, st.integers(0x40, 0x300)), inner),
), max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(values)
def test_codec_round_trips_and_skip_agrees_with_decode(value):
    data = encode(value)
    decoded, end = decode(data)
    assert end == len(data) == skip(data, 0)
    assert decoded == value


@settings(max_examples=200, deadline=None)
@given(values)
def test_the_official_client_decodes_what_the_emulator_encodes(value):
    from azure.eventhub._pyamqp._decode import _DECODE_BY_CONSTRUCTOR

    data = memoryview(encode(value))
    rest, decoded = _DECODE_BY_CONSTRUCTOR[data[0]](data[1:])
    assert len(rest) == 0
    assert _normalize(decoded) == _normalize(value)


def _normalize(value):
    """Both decoders' views in one vocabulary: the client returns text as bytes and
    unwraps described values."""
    if isinstance(value, Described):
        return _normalize(value.value)
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, dict):
        return {_normalize(k): _normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalize(v) for v in value]
    return value


@pytest.mark.parametrize("data", [b"", b"\xa1\x05ab", b"\xff", b"\xc0\x05\x02\x41", b"\xd1\x00\x00\x00\x08\x00\x00"
                                  b"\x00\x03\x41\x41\x41\x41", b"\xa1\x02\xff\xfe"])
def test_malformed_values_raise_decode_errors(data):
    with pytest.raises(AMQPDecodeError):
        decode(data)


def test_performatives_carry_every_field_so_the_client_can_read_them_by_position():
    from azure.eventhub._pyamqp._decode import decode_frame

    attach = F.attach_frame(3, name="link", handle=7, role=False, snd_settle_mode=1, rcv_settle_mode=0,
                            source=F.source("hub/ConsumerGroups/$default/Partitions/0"), target=F.target("x"),
                            initial_delivery_count=0, max_message_size=1024)
    code, fields = decode_frame(memoryview(attach[8:]))
    assert code == 0x12 and len(fields) == 14
    assert fields[0] == b"link" and fields[1] == 7 and fields[9] == 0 and fields[10] == 1024
    transfer = F.transfer_frame(1, 5, 42, b"\x00\x53\x75\xa0\x02hi")
    code, fields = decode_frame(memoryview(transfer[8:]))
    assert code == 0x14 and fields[:6] == [5, 42, (42).to_bytes(8, "big"), 0, True, False]
    assert bytes(fields[11]) == b"\x00\x53\x75\xa0\x02hi"
    ours = F.decode_performative(memoryview(attach)[8:])
    assert ours.name == "attach" and ours.fields[0] == "link" and ours.fields[5].value[0].startswith("hub/")


def test_large_transfers_are_split_to_the_peers_frame_size():
    payload = bytes(range(256)) * 40
    pieces = F.transfer_frames(0, 1, 9, payload, max_frame_size=1000)
    assert all(len(piece) <= 1000 for piece in pieces) and len(pieces) > 10
    decoded = [F.decode_performative(memoryview(piece)[8:]) for piece in pieces]
    assert [d.fields[5] for d in decoded] == [True] * (len(pieces) - 1) + [False]  # "more"
    assert b"".join(d.payload for d in decoded) == payload


def test_sender_annotations_are_kept_but_the_service_ones_cannot_be_forged():
    from eventprocessor.emulators.eventhubs.codec import encode as enc

    annotations = {Symbol("x-opt-sequence-number"): 999, Symbol("x-opt-partition-key"): "k", Symbol("custom"): 5}
    message = b"\x00\x53\x70" + enc([True]) + b"\x00\x53\x71" + enc({Symbol("hop"): 1}) \
        + b"\x00\x53\x72" + enc(annotations) + b"\x00\x53\x75" + enc(b"body")
    split = split_message(message)
    assert split.header == b"\x00\x53\x70" + enc([True]) and split.partition_key == "k"
    assert split.annotation_count == 2
    entries = split.annotations
    assert decode(b"\xc1" + bytes((len(entries) + 1, 2)) + entries)[0] == {Symbol("custom"): 5}
    # Delivery annotations are kept for the consumers, as the service keeps them.
    delivery = split.delivery
    assert decode(b"\xc1" + bytes((len(delivery) + 1, split.delivery_count)) + delivery)[0] == {Symbol("hop"): 1}
    assert split.rest == b"\x00\x53\x75" + enc(b"body")


def test_the_properties_and_application_properties_sections_are_stored_as_sent():
    """message-id, content-type, correlation-id (any AMQP id type) reach consumers as the
    producer sent them; tests/test_migration.py checks both clients read them."""
    from eventprocessor.emulators.eventhubs.codec import encode as enc

    properties = b"\x00\x53\x73" + enc([b"m-1", None, None, None, None, uuid.UUID(int=7), Symbol("text/plain")])
    application = b"\x00\x53\x74" + enc({"kind": "reading"})
    message = b"\x00\x53\x72" + enc({Symbol("x-opt-offset"): "1"}) + properties + application \
        + b"\x00\x53\x75" + enc(b"body")
    split = split_message(message)
    assert split.annotation_count == 0 and split.rest == properties + application + b"\x00\x53\x75" + enc(b"body")


def test_selectors_parse_like_the_client_writes_them():
    assert parse_selector("amqp.annotation.x-opt-offset > '-1'") == StartPosition("start")
    assert parse_selector("amqp.annotation.x-opt-offset > '@latest'") == StartPosition("latest")
    assert parse_selector("amqp.annotation.x-opt-sequence-number >= '42'") == StartPosition("sequence_number", 42, True)
    assert parse_selector("amqp.annotation.x-opt-enqueued-time > '1700000000000'") == \
        StartPosition("enqueued_time", 1_700_000_000_000, False)
    assert parse_selector(None) == StartPosition("start")  # no filter: the service starts at the beginning
    for bad in ("amqp.annotation.x-opt-offset = '1'", "x > '1'", "amqp.annotation.x-opt-offset > 1",
                "amqp.annotation.x-opt-sequence-number > 'one'"):
        with pytest.raises(BrokerError) as info:
            parse_selector(bad)
        assert info.value.condition == "amqp:invalid-field"


def _messages(count):
    return [SplitMessage(b"", b"", 0, b"", 0, b"\x00\x53\x75\xa0\x01" + bytes((65 + i % 26,)), None)
            for i in range(count)]


def test_positions_resolve_on_a_partition_and_past_the_end_is_refused():
    namespace = Namespace(max_events_per_partition=1000)
    partition = namespace.add_hub("h", 2).partition("1")
    assert partition.resolve(StartPosition("start")) == 0 == partition.resolve(StartPosition("latest"))
    partition.append(_messages(10), None)
    offsets = [partition.event(s)[2] for s in range(10)]
    assert partition.resolve(StartPosition("sequence_number", 3)) == 4
    assert partition.resolve(StartPosition("sequence_number", 3, True)) == 3
    assert partition.resolve(StartPosition("sequence_number", 9)) == 10  # the next event
    assert partition.resolve(StartPosition("offset", offsets[5])) == 6
    assert partition.resolve(StartPosition("offset", offsets[5], True)) == 5
    assert partition.resolve(StartPosition("offset", offsets[5] + 1, True)) == 6  # between events
    assert partition.resolve(StartPosition("latest")) == 10
    with pytest.raises(BrokerError) as info:
        partition.resolve(StartPosition("sequence_number", 10))
    assert info.value.condition == "com.microsoft:argument-out-of-range"
    with pytest.raises(BrokerError):
        namespace.hub("h").partition("2")
    with pytest.raises(BrokerError):
        namespace.hub("nope")
    with pytest.raises(BrokerError):
        namespace.hub("h").check_consumer_group("nope")
    namespace.hub("H").check_consumer_group("$DEFAULT")  # names are case-insensitive


def test_retention_keeps_the_newest_events_and_moves_the_beginning():
    namespace = Namespace(max_events_per_partition=100)
    partition = namespace.add_hub("h", 1).partition("0")
    for _ in range(30):
        partition.append(_messages(50), None)
    assert partition.begin_sequence_number == 1400 and partition.next_sequence_number == 1500
    assert partition.resolve(StartPosition("start")) == 1400
    assert partition.resolve(StartPosition("sequence_number", 10)) == 1400  # gone: the oldest retained
    payload, _header_end, offset, _time = partition.event(1499)
    assert offset == partition.last_offset and payload.endswith(b"\xa0\x01" + bytes((65 + 49 % 26,)))


class _Receiver:
    def __init__(self, name, owner_level):
        self.name, self.owner_level, self.disconnected = name, owner_level, None

    def wake(self):
        pass

    def disconnect(self, condition, description):
        self.disconnected = condition


def test_owner_level_rules():
    partition = Namespace().add_hub("h", 1).partition("0")
    plain = [_Receiver(f"p{i}", None) for i in range(5)]
    for receiver in plain:
        partition.add_receiver("$default", receiver)
    with pytest.raises(BrokerError) as info:
        partition.add_receiver("$default", _Receiver("sixth", None))
    assert info.value.condition == "amqp:resource-limit-exceeded"
    epoch1 = _Receiver("e1", 1)
    partition.add_receiver("$default", epoch1)
    assert all(r.disconnected == "amqp:link:stolen" for r in plain)
    with pytest.raises(BrokerError):
        partition.add_receiver("$default", _Receiver("late plain", None))
    with pytest.raises(BrokerError):
        partition.add_receiver("$default", _Receiver("e0", 0))
    same = _Receiver("e1 again", 1)
    partition.add_receiver("$default", same)  # equal owner level takes over
    assert epoch1.disconnected == "amqp:link:stolen" and same.disconnected is None
    partition.add_receiver("other-group", _Receiver("elsewhere", None))  # groups are independent


MICROSOFT_SAMPLE = {
    "UserConfig": {
        "NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1", "Entities": [
            {"Name": "eh1", "PartitionCount": "2", "ConsumerGroups": [{"Name": "cg1"}]},
            {"Name": "eh2", "PartitionCount": 40, "ConsumerGroups": []},
        ]}],
        "LoggingConfig": {"Type": "File"},
    }
}


def test_microsoft_config_json_is_read_as_is(tmp_path):
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(MICROSOFT_SAMPLE))
    config = EmulatorConfig.from_file(path)
    assert [(h.name, h.partition_count, h.consumer_groups) for h in config.eventhubs] == [
        ("eh1", 2, ("cg1",)), ("eh2", 40, ())]
    assert config.namespace == "emulatorNs1"
    assert config.beyond_microsoft_limits == ["eh2: 40 partitions (Microsoft's emulator: at most 32)"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("UserConfig"), "no 'UserConfig'"),
    (lambda d: d["UserConfig"]["NamespaceConfig"][0]["Entities"][0].update(PartitionCount="two"), "whole number"),
    (lambda d: d["UserConfig"]["NamespaceConfig"][0]["Entities"][0].update(PartitionCount="0"), "from 1 to"),
    (lambda d: d["UserConfig"]["NamespaceConfig"][0]["Entities"][0].pop("Name"), "Name is missing"),
    (lambda d: d["UserConfig"]["NamespaceConfig"][0]["Entities"][1].update(Name="eh1"), "configured twice"),
    (lambda d: d["UserConfig"]["NamespaceConfig"][0]["Entities"][0].update(Name="bad/name"), "invalid event hub name"),
    (lambda d: d["UserConfig"]["NamespaceConfig"][0].update(Type="ServiceBus"), "must be 'EventHub'"),
])
def test_bad_configurations_name_the_problem(tmp_path, mutate, message):
    document = json.loads(json.dumps(MICROSOFT_SAMPLE))
    mutate(document)
    path = tmp_path / "Config.json"
    path.write_text(json.dumps(document))
    with pytest.raises(EmulatorConfigError, match=message):
        EmulatorConfig.from_file(path)


def test_command_line_prints_one_connection_string_and_stops_cleanly_on_sigterm():
    from eventprocessor.emulators.eventhubs.process import start_emulator_process

    with start_emulator_process(["--eventhub", "hub", "--partitions", "4"]) as emulator:
        assert emulator.connection_string.startswith("Endpoint=sb://127.0.0.1:")
        assert emulator.connection_string.endswith(
            ";SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true")
        assert emulator.port > 0
    assert emulator.process.returncode == 0


def test_command_line_rejects_a_bad_config_with_its_reason(tmp_path):
    bad = tmp_path / "Config.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "eventprocessor.emulators.eventhubs", "--port", "0",
                          "--config", str(bad)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 2 and "not valid JSON" in out.stderr and out.stdout == ""


def test_symbol_arrays_and_unique_ids_encode():
    assert decode(encode(SymbolArray(["ANONYMOUS", "PLAIN"])))[0] == ["ANONYMOUS", "PLAIN"]
    identifier = uuid.uuid4()
    assert decode(encode(identifier))[0] == identifier


@pytest.mark.parametrize("body", [
    {"data_body": [b"aa", b"bb", b"cc"]},
    {"sequence_body": [b"message", 123.456, True], "footer": {"footer_key": "footer_value"}},
    {"sequence_body": [[1, 2], [b"x", None]]},
    {"value_body": {b"key": [-123, b"data", False]}, "header": {"priority": 10}},
    {"value_body": "text"},
    {"data_body": [b"x"], "header": {"priority": 10}, "delivery_annotations": {"delann_key": "delann_value"},
     "annotations": {"ann_key": "ann_value"}, "properties": {"subject": "s", "group_id": "g"},
     "application_properties": {"a": 1}, "footer": {"f": b"v"}},
], ids=["three-data-sections", "sequence-and-footer", "two-sequence-sections", "map-value-and-header", "text-value",
        "every-section"])
def test_every_body_type_is_stored_and_returned_as_sent(body):
    """The emulator copies body sections without decoding them: what azure-eventhub's
    producer encodes (several data sections, amqp-sequence sections, an amqp-value, a
    footer) is what its consumer decodes from the stored event."""
    from azure.eventhub._pyamqp._decode import decode_payload
    from azure.eventhub._pyamqp._encode import encode_payload
    from azure.eventhub._transport._pyamqp_transport import PyamqpTransport
    from azure.eventhub.amqp import AmqpAnnotatedMessage

    encoded = encode_payload(bytearray(), PyamqpTransport.to_outgoing_amqp_message(AmqpAnnotatedMessage(**body)))
    sent = decode_payload(memoryview(encoded))  # what a consumer reading the producer's own bytes would get
    split = split_message(encoded)
    partition = Namespace().add_hub("h", 1).partition("0")
    partition.append([split], None)
    received = decode_payload(memoryview(partition.event(0)[0]))
    assert (received.data, received.sequence, received.value, received.footer, received.header, received.properties,
            received.application_properties, received.delivery_annotations) == (
        sent.data, sent.sequence, sent.value, sent.footer, sent.header, sent.properties, sent.application_properties,
        sent.delivery_annotations)
    assert {key: value for key, value in received.message_annotations.items()
            if not key.startswith(b"x-opt-")} == (sent.message_annotations or {})
    assert (received.data or received.sequence or received.value) is not None
    # A receiver asking for runtime metrics gets them beside the producer's delivery annotations.
    runtime = encode(Symbol("last_enqueued_sequence_number")) + encode(0)
    merged = decode_payload(memoryview(partition.with_delivery_annotations(0, runtime, 2)))
    assert merged.delivery_annotations == {b"last_enqueued_sequence_number": 0, **(sent.delivery_annotations or {})}
    assert (merged.data, merged.value, merged.footer, merged.properties) == (
        sent.data, sent.value, sent.footer, sent.properties)
