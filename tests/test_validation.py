"""Validation at the door: every bad argument is refused when it is given,
with a ConfigurationError that names the argument, shows the value and says what would
be valid. One table, one case per row."""
from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from eventprocessor import (
    ConfigurationError,
    EventPosition,
    EventProcessor,
    FailurePolicy,
    LoadPolicy,
    PartitionProcessor,
    StatePolicy,
)
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore

NAN, INF = math.nan, math.inf


def processor(**kwargs: Any) -> EventProcessor:
    args: dict[str, Any] = dict(source=InMemoryEventSource(2), checkpoint_store=InMemoryCheckpointStore(),
                                partition_processor=PartitionProcessor)
    for name in ("source", "checkpoint_store", "partition_processor"):
        if name in kwargs:
            args[name] = kwargs.pop(name)
    return EventProcessor(args["source"], args["checkpoint_store"], args["partition_processor"], **kwargs)


# (case id, what to call, substrings the message must contain)
CASES = [
    ("interval zero", lambda: processor(load_balancing_interval=0), ["load_balancing_interval", "0"]),
    ("interval negative", lambda: processor(load_balancing_interval=-1), ["load_balancing_interval", "-1"]),
    ("interval NaN", lambda: processor(load_balancing_interval=NAN), ["load_balancing_interval", "nan"]),
    ("interval infinite", lambda: processor(load_balancing_interval=INF), ["load_balancing_interval", "inf"]),
    ("interval as text", lambda: processor(load_balancing_interval="10"), ["load_balancing_interval", "'10'"]),
    ("interval as bool", lambda: processor(load_balancing_interval=True), ["load_balancing_interval", "True"]),
    ("expiration NaN", lambda: processor(partition_ownership_expiration_interval=NAN),
     ["partition_ownership_expiration_interval", "nan"]),
    ("expiration not above interval",
     lambda: processor(load_balancing_interval=10, partition_ownership_expiration_interval=5),
     ["longer than load_balancing_interval", "5 <= 10"]),
    ("renewal age at the expiration", lambda: processor(ownership_renewal_age=90),
     ["ownership_renewal_age=90", "shorter than the lease"]),
    ("renewal age beyond the expiration", lambda: processor(ownership_renewal_age=600),
     ["ownership_renewal_age=600"]),
    ("renewal age negative", lambda: processor(ownership_renewal_age=-1), ["ownership_renewal_age", "-1"]),
    ("renewal age NaN", lambda: processor(ownership_renewal_age=NAN), ["ownership_renewal_age", "nan"]),
    ("renewal age zero (a record rewritten without pause)", lambda: processor(ownership_renewal_age=0),
     ["ownership_renewal_age", "positive", "0"]),
    ("store timeout zero", lambda: processor(store_timeout=0), ["store_timeout", "0"]),
    ("store timeout longer than the renewal window", lambda: processor(store_timeout=100),
     ["store_timeout=100", "renewal"]),
    ("shutdown timeout negative", lambda: processor(shutdown_timeout=-5), ["shutdown_timeout", "-5"]),
    ("handler timeout zero", lambda: processor(handler_timeout=0), ["handler_timeout", "0"]),
    ("batch size fractional", lambda: processor(max_batch_size=2.5), ["max_batch_size", "2.5"]),
    ("batch size zero", lambda: processor(max_batch_size=0), ["max_batch_size", "0"]),
    ("batch size bool", lambda: processor(max_batch_size=True), ["max_batch_size", "True"]),
    ("max wait NaN", lambda: processor(max_wait_time=NAN), ["max_wait_time", "nan"]),
    ("max wait zero", lambda: processor(max_wait_time=0), ["max_wait_time", "0"]),
    ("prefetch negative", lambda: processor(prefetch=-1), ["prefetch", "-1"]),
    ("prefetch fractional", lambda: processor(prefetch=1.5), ["prefetch", "1.5"]),
    ("owner id int", lambda: processor(owner_id=123), ["owner_id", "123"]),
    ("owner id empty", lambda: processor(owner_id=""), ["owner_id", "''"]),
    ("owner id blank", lambda: processor(owner_id="   "), ["owner_id"]),
    ("consumer group int", lambda: processor(consumer_group=5), ["consumer_group", "5"]),
    ("consumer group empty", lambda: processor(consumer_group=""), ["consumer_group", "''"]),
    ("position as text", lambda: processor(initial_event_position="earliest"),
     ["initial_event_position", "'earliest'", "EventPosition.earliest()"]),
    ("position as int", lambda: processor(initial_event_position=5), ["initial_event_position", "5"]),
    ("position mapping of text", lambda: processor(initial_event_position={"0": "earliest"}),
     ["initial_event_position", "'0'", "str"]),
    ("position mapping with int keys", lambda: processor(initial_event_position={0: EventPosition.earliest()}),
     ["initial_event_position", "0"]),
    ("unknown strategy", lambda: processor(load_balancing_strategy="fastest"),
     ["load_balancing_strategy", "'fastest'", "'balanced' or 'greedy'"]),
    ("processor class of the wrong kind", lambda: processor(partition_processor=dict),
     ["partition_processor", "dict"]),
    ("processor neither class nor callable", lambda: processor(partition_processor=42),
     ["partition_processor", "int"]),
    ("no source", lambda: processor(source=None), ["source", "NoneType", "InMemoryEventSource"]),
    ("no store", lambda: processor(checkpoint_store=None), ["checkpoint_store", "NoneType"]),
    ("error handler not callable", lambda: processor(error_handler="print"), ["error_handler", "str"]),
    ("dead letter not callable", lambda: FailurePolicy(dead_letter=5), ["dead_letter", "int"]),
    ("delivery attempts zero", lambda: FailurePolicy(max_delivery_attempts=0), ["max_delivery_attempts", "0"]),
    ("delivery attempts fractional", lambda: FailurePolicy(max_delivery_attempts=2.0),
     ["max_delivery_attempts", "2.0"]),
    ("unknown poison policy", lambda: FailurePolicy(on_poison="ignore"), ["on_poison", "'ignore'", "'skip' or 'park'"]),
    ("retry backoff negative", lambda: FailurePolicy(retry_backoff=-1), ["retry_backoff", "-1"]),
    ("failure policy of the wrong kind", lambda: processor(failure_policy={"max_delivery_attempts": 3}),
     ["failure_policy", "FailurePolicy", "dict"]),
    ("load policy of the wrong kind", lambda: processor(load_policy="load"), ["load_policy", "LoadPolicy", "str"]),
    ("load meter not callable", lambda: LoadPolicy(meter=0.5), ["meter", "callable", "float"]),
    ("stateful neither a bool nor a policy", lambda: processor(stateful="yes"), ["stateful", "StatePolicy", "'yes'"]),
    ("standbys negative", lambda: StatePolicy(num_standbys=-1), ["num_standbys", "-1"]),
    ("recovery lag fractional", lambda: StatePolicy(acceptable_recovery_lag=1.5),
     ["acceptable_recovery_lag", "1.5"]),
    ("clock without sleep", lambda: processor(clock=object()), ["clock", "monotonic", "object"]),
    ("rng as a seed", lambda: processor(rng=42), ["rng", "random.Random", "int"]),
    ("source with no partitions", lambda: InMemoryEventSource(0), ["partition_count", "0"]),
    ("source partition count as text", lambda: InMemoryEventSource("4"), ["partition_count", "'4'"]),
    ("source with empty hub name", lambda: InMemoryEventSource(2, eventhub_name=""), ["eventhub_name"]),
    ("position of an unknown kind", lambda: EventPosition("first"), ["kind", "'first'"]),
    ("position at a text sequence number", lambda: EventPosition.from_sequence_number("abc"),
     ["sequence_number", "'abc'"]),
    ("position below -1", lambda: EventPosition.from_sequence_number(-5), ["sequence_number", "-5"]),
    ("position beyond a long", lambda: EventPosition.from_sequence_number(2**63), ["sequence_number", "2**63-1"]),
    ("position at a naive time", lambda: EventPosition.from_enqueued_time(datetime(2026, 1, 1)),
     ["enqueued_time", "timezone-aware"]),
    ("position at a non-numeric offset", lambda: EventPosition.from_offset("@start"), ["offset", "'@start'"]),
    ("inclusive not a bool", lambda: EventPosition.from_sequence_number(3, inclusive="yes"), ["inclusive", "'yes'"]),
]


@pytest.mark.parametrize("call, expected", [pytest.param(c, e, id=name) for name, c, e in CASES])
def test_bad_argument_is_refused_at_the_door(call: Callable[[], Any], expected):
    with pytest.raises(ConfigurationError) as caught:
        call()
    message = str(caught.value)
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_the_corpus_has_at_least_40_cases():
    assert len(CASES) >= 40


def test_valid_defaults_construct():
    p = processor()
    assert p.timing.lease_length < p.timing.expiration
    assert p.timing.store_timeout * 3 <= p.timing.lease_length - p.timing.renewal_age + 1e-9
