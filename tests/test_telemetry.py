"""Metrics and traces through OpenTelemetry's SDK, read with its in-memory reader and
exporter: every metric the docs name changes when it should."""
from __future__ import annotations

import asyncio
from collections import defaultdict

import pytest

pytest.importorskip("opentelemetry.sdk", reason="needs the [otel] extra's SDK (opentelemetry-sdk)")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

from eventprocessor import EventProcessor, PartitionProcessor  # noqa: E402
from eventprocessor.testing import (
    Cluster,  # noqa: E402
    run_virtual,  # noqa: E402
)

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=12.0)
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


class Telemetry:
    def __init__(self) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))

    def read(self) -> dict[str, list[tuple[dict, float]]]:
        """metric name -> [(attributes, value)]: sums and gauges by value, histograms by count."""
        out: dict[str, list[tuple[dict, float]]] = defaultdict(list)
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count
                        out[metric.name].append((dict(point.attributes), value))
        return out

    def total(self, name: str, **match: str) -> float:
        return sum(v for attrs, v in self.read().get(name, []) if all(attrs.get(k) == w for k, w in match.items()))


def test_every_metric_moves_when_it_should():
    otel = Telemetry()

    class Checkpointing(PartitionProcessor):
        async def process_events(self, events, context):
            await asyncio.sleep(0.01)
            await context.update_checkpoint()

    async def scenario():
        cluster = Cluster(4, seed=1, **OPTIONS)
        first = EventProcessor(cluster.source, cluster.store, Checkpointing, owner_id="a", handoff_timeout=None,
                               track_last_enqueued_event_properties=True, meter_provider=otel.meters,
                               tracer_provider=otel.tracers, **OPTIONS)
        await first.start()
        await cluster.wait_until(lambda: len(first.owned_partitions) == 4, timeout=10)
        claimed = otel.total("eventprocessor.ownership.changes", **{"eventprocessor.reason": "claimed"})
        owned = otel.total("eventprocessor.partitions.owned")
        await cluster.source.send("traced", partition_id="0", properties={"traceparent": TRACEPARENT})
        await cluster.produce(40)
        await asyncio.sleep(3)
        processed = otel.total("messaging.client.consumed.messages")
        batches = otel.total("eventprocessor.batches.processed")
        handler = otel.total("messaging.process.duration")
        consumer_lag = otel.total("messaging.eventhubs.consumer.lag")
        checkpoints = otel.total("eventprocessor.checkpoint.duration")
        partition_lag = [v for _a, v in otel.read()["eventprocessor.partition.lag"]]
        # a second processor steals (no handoff): stolen for it, lost for the first
        second = EventProcessor(cluster.source, cluster.store, Checkpointing, owner_id="b", handoff_timeout=None,
                                meter_provider=otel.meters, **OPTIONS)
        await second.start()
        await cluster.wait_until(lambda: len(second.owned_partitions) == 2, timeout=30)
        await asyncio.sleep(2)
        stolen = otel.total("eventprocessor.ownership.changes", **{"eventprocessor.reason": "stolen"})
        lost = otel.total("eventprocessor.ownership.changes", **{"eventprocessor.reason": "lost"})
        # a slow and failing store: overruns, store errors, tick and store durations
        # the listings a tick makes: at rest it reads the members only, ownership on a change
        cluster.store.only = {"list_members", "list_ownership"}
        cluster.store.latency = 2.0
        await asyncio.sleep(6)
        cluster.store.clear()
        cluster.store.down = True
        await asyncio.sleep(3)
        cluster.store.clear()
        await asyncio.sleep(2)
        metrics = {name: otel.total(name) for name in (
            "eventprocessor.balancing.duration", "eventprocessor.balancing.overruns", "eventprocessor.store.duration",
            "eventprocessor.store.errors", "eventprocessor.claims.lost")}
        await first.stop()
        await second.stop()
        released = otel.total("eventprocessor.ownership.changes", **{"eventprocessor.reason": "released"})
        return dict(claimed=claimed, owned=owned, processed=processed, batches=batches, handler=handler,
                    consumer_lag=consumer_lag, checkpoints=checkpoints, partition_lag=partition_lag, stolen=stolen,
                    lost=lost, released=released, **metrics)

    seen = run_virtual(scenario())
    assert seen["claimed"] == 4 and seen["owned"] == 4
    assert seen["processed"] == 41 and seen["batches"] >= 4
    assert seen["handler"] == seen["batches"]  # one duration per process_events call
    assert seen["consumer_lag"] == 41  # one lag measurement per event
    assert seen["checkpoints"] >= seen["batches"]
    assert seen["partition_lag"] and all(v == 0 for v in seen["partition_lag"])  # caught up
    assert seen["stolen"] == 2 and seen["lost"] == 2
    assert seen["eventprocessor.balancing.duration"] > 10
    assert seen["eventprocessor.balancing.overruns"] >= 1
    assert seen["eventprocessor.store.duration"] > 10
    assert seen["eventprocessor.store.errors"] >= 1
    assert seen["released"] >= 4
    spans = otel.spans.get_finished_spans()
    processing = [s for s in spans if s.name == "process hub"]
    assert processing and all(s.attributes["messaging.system"] == "eventhubs" for s in processing)
    linked = [s for s in processing if s.links]
    assert linked and format(linked[0].links[0].context.trace_id, "032x") == TRACEPARENT.split("-")[1]


def test_claims_lost_to_a_race_are_counted():
    async def scenario(seed: int) -> tuple:
        otel = Telemetry()
        cluster = Cluster(8, seed=seed, **OPTIONS)
        ps = [EventProcessor(cluster.source, cluster.store, PartitionProcessor, owner_id=f"p{i}",
                             meter_provider=otel.meters, load_balancing_strategy="balanced", **OPTIONS)
              for i in range(4)]
        # no member records (none has joined): four invisible newcomers pick at random, and some collide
        assert all(p.membership is None for p in ps)
        await asyncio.gather(*(p.balance_once() for p in ps))
        return sum(p.stats.claims_lost for p in ps), otel.total("eventprocessor.claims.lost")

    results = [run_virtual(scenario(seed)) for seed in range(1, 11)]
    assert all(counted == lost for lost, counted in results)
    assert any(lost >= 1 for lost, _counted in results)  # collisions happen on some seeds


def test_backing_off_from_a_store_that_times_out_is_counted():
    otel = Telemetry()

    class Idle(PartitionProcessor):
        async def process_events(self, events, context):
            pass

    async def scenario():
        cluster = Cluster(2, seed=2, **OPTIONS)
        processor = EventProcessor(cluster.source, cluster.store, Idle, owner_id="a", meter_provider=otel.meters,
                                   **OPTIONS)
        await processor.start()
        await cluster.wait_until(lambda: len(processor.owned_partitions) == 2, timeout=10)
        before = otel.total("eventprocessor.balancing.backoffs")
        cluster.store.hang = True  # every call runs into store_timeout
        await asyncio.sleep(3 * processor.timing.store_timeout)
        during = otel.total("eventprocessor.balancing.backoffs")
        errors = otel.total("eventprocessor.store.errors", **{"error.type": "StoreTimeoutError"})
        cluster.store.clear()
        await processor.stop()
        return before, during, errors, processor.stats

    before, during, errors, stats = run_virtual(scenario())
    assert before == 0
    assert during >= 1 and during == stats.backed_off_ticks
    assert errors >= 1


def test_a_handler_that_blocks_the_event_loop_is_measured():
    """eventprocessor.loop.stalls: one point per stall longer than a second, with its length."""
    otel = Telemetry()

    class Blocking(PartitionProcessor):
        async def process_events(self, events, context):
            if events[0].sequence_number == 1:
                asyncio.get_running_loop().advance(3.0)  # three seconds without awaiting

    async def scenario():
        cluster = Cluster(1, seed=3, **OPTIONS)
        processor = EventProcessor(cluster.source, cluster.store, Blocking, owner_id="a", meter_provider=otel.meters,
                                   **OPTIONS)
        await processor.start()
        await cluster.produce(1)
        await asyncio.sleep(2)
        before = otel.total("eventprocessor.loop.stalls")
        await cluster.produce(1)
        await asyncio.sleep(2)
        after = otel.total("eventprocessor.loop.stalls")
        await processor.stop()
        return before, after

    before, after = run_virtual(scenario())
    assert (before, after) == (0, 1)
