"""Source faults for real: the official producer sends to the Event Hubs emulator, an
EventProcessor reads it with ``EventHubSource`` through a loopback TCP fault proxy
(:class:`eventprocessor.emulators.fault_proxy.TcpFaultProxy`), from ``earliest``, without checkpoints.
The same invariants as the virtual harness (``tests/test_source_fault_harness.py``),
counted from what the handler received: nothing lost, nothing delivered twice to one
claim, nothing handed to an ended claim, recovery within a generous bound
(:func:`harness.source_faults.recovery_bound`).

Plus ``EventHubSource``'s own behaviour under these faults: a server-busy answer is
classified with its retry-after and waited out, a black-holed connection is noticed by
the AMQP idle timeout, a receiver reopened after a reset resumes after the last event it
handed out.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from eventprocessor import EventPosition, EventProcessor
from eventprocessor.emulators.eventhubs import connection_string
from eventprocessor.emulators.fault_proxy import TcpFaultProxy
from eventprocessor.errors import EventSourceError
from eventprocessor.sources.eventhub import EventHubSource
from eventprocessor.sources.eventhub.failures import ErrorContext
from eventprocessor.testing import DeliveryRecorder, recording_handler
from harness.source_faults import Controls, LocalEmulator, black_hole, resets, restart, run_source_fault

pytestmark = [pytest.mark.eventhubs, pytest.mark.slow]


def assert_clean(run) -> None:
    assert run.lost == 0, run
    assert run.duplicates_within_claims == 0, run
    assert run.after_end == 0, run
    assert run.recovered_after is not None and run.recovered_after <= run.bound, run
    assert run.produced > 0


async def test_connections_reset_every_2_s_for_12_s_lose_nothing_and_replay_nothing(eventhubs_emulator):
    """The reported scenario. On the pump before 080501b: 0 lost, but 2,720-2,860 events
    delivered again to the same claim in three runs (each reopen started at the claim's
    start, ``earliest``); the black-hole and restart tests below failed the same way."""
    hub = eventhubs_emulator.fresh_hub(4)
    run = await run_source_fault(eventhubs_emulator.connection_string, hub, resets(every=2.0, seconds=12.0),
                                 rate=200.0, before=2.0, after=2.0)
    assert_clean(run)
    assert run.connections >= 4 * 6, run  # every receiver's connection was reset and reopened, again and again


async def test_a_black_hole_is_noticed_by_the_idle_timeout_and_recovered_from(eventhubs_emulator):
    hub = eventhubs_emulator.fresh_hub(4)
    run = await run_source_fault(eventhubs_emulator.connection_string, hub, black_hole(6.0), rate=100.0,
                                 before=2.0, after=2.0, idle_timeout=3.0)
    assert_clean(run)


async def test_the_emulator_restarted_on_the_same_port_with_its_events(tmp_path):
    async with LocalEmulator(["restarted"], partitions=2) as emulator:
        run = await run_source_fault(emulator.connection_string, "restarted", restart(), partitions=2, rate=100.0,
                                     before=3.0, after=3.0, emulator=Controls.of(emulator))
    assert_clean(run)


async def test_a_throttled_hub_is_waited_out_per_its_retry_after_not_hammered():
    """Server busy for 6 s with "please wait 3 seconds": each partition's receiver asks
    again once the retry-after passed, at most three times over the window (the pump's
    own backoff, 0.1 s doubling, would ask six or seven times); nothing is lost."""
    async with LocalEmulator(["busy"], partitions=2) as emulator:
        source = EventHubSource.from_connection_string(emulator.connection_string, eventhub_name="busy")
        ledger = DeliveryRecorder()
        seen = []

        class Handler(recording_handler(ledger, checkpoint=False)):  # type: ignore[misc]
            async def process_error(self, error, context):
                seen.append(error)

        processor = EventProcessor(source, _store(), Handler, load_balancing_interval=1.0,
                                   partition_ownership_expiration_interval=12.0, shutdown_timeout=5.0)
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        producer = EventHubProducerClient.from_connection_string(emulator.connection_string, eventhub_name="busy")
        async with producer:
            await processor.start()
            try:
                await _until(lambda: len(processor.owned_partitions) == 2, 20)
                for pid in ("0", "1"):
                    await producer.send_batch([EventData(f"a{i}") for i in range(20)], partition_id=pid)
                await _until(lambda: len(ledger.processed()) == 40, 20)
                emulator.throttle(6.0, retry_after=3.0)
                for pid in ("0", "1"):
                    await producer.send_batch([EventData(f"b{i}") for i in range(20)], partition_id=pid)
                await _until(lambda: len(ledger.processed()) == 80, 30)
            finally:
                await processor.stop()
                await source.close()
    busy = [e for e in seen if isinstance(e, EventSourceError) and e.reason == "server-busy"]
    assert busy and all(e.retry_after == 3.0 for e in busy), seen
    assert emulator.throttled <= 2 * 3, emulator.throttled
    assert ledger.processed() == {(pid, seq) for pid in ("0", "1") for seq in range(40)}
    assert ledger.duplicates_within_claims() == 0 and not ledger.after_end


async def test_a_receiver_reopened_after_a_reset_resumes_after_the_last_event_it_handed_out():
    """The receiver reconnects by itself when asked again after a failure: it must start
    after what it handed out, not at the position it was opened with."""
    async with LocalEmulator(["resume"], partitions=1) as emulator:
        from azure.eventhub import EventData
        from azure.eventhub.aio import EventHubProducerClient

        async with EventHubProducerClient.from_connection_string(emulator.connection_string,
                                                                 eventhub_name="resume") as producer:
            await producer.send_batch([EventData(f"e{i}") for i in range(30)], partition_id="0")
        port = int(emulator.connection_string.split(";")[0].rsplit(":", 1)[1])
        async with TcpFaultProxy("127.0.0.1", port) as proxy:
            source = EventHubSource.from_connection_string(connection_string("127.0.0.1", proxy.port),
                                                           eventhub_name="resume")
            receiver = await source.open_receiver("0", consumer_group="$default",
                                                  starting_position=EventPosition.earliest(), owner_level=1,
                                                  prefetch=10)
            try:
                first = await receiver.receive(10, 5.0)
                assert [e.sequence_number for e in first] == list(range(10))
                proxy.reset_all()
                with pytest.raises(EventSourceError):
                    for _ in range(50):  # what was buffered may come first; then the reset shows
                        await receiver.receive(10, 1.0)
                later = []
                deadline = time.monotonic() + 20
                while len(later) < 20 and time.monotonic() < deadline:
                    later += await receiver.receive(10, 1.0)
            finally:
                await receiver.close()
                await source.close()
    received = [e.sequence_number for e in first] + [e.sequence_number for e in later]
    assert len(received) == len(set(received)), received
    assert sorted(received) == list(range(30)), received


def test_server_busy_is_classified_with_the_retry_after_the_hub_asked_for():
    from azure.eventhub._pyamqp.error import AMQPLinkError

    errors = ErrorContext("ns.example", "hub", None)
    asked = AMQPLinkError(b"com.microsoft:server-busy", description="The request was terminated because the "
                          "namespace ns is being throttled. Error code : 50002. Please wait 7 seconds and try again.")
    classified = errors.classify(asked, "receiving", consumer_group="$default", partition_id="0")
    assert classified.reason == "server-busy" and classified.retry_after == 7.0
    silent = errors.classify(AMQPLinkError(b"com.microsoft:server-busy"), "receiving")
    assert silent.reason == "server-busy" and silent.retry_after == 4.0  # the service's documented minimum


def test_a_source_notices_dead_connections_by_default():
    source = EventHubSource.from_connection_string(connection_string("127.0.0.1", 5672, eventhub_name="h"))
    assert source.client_options["idle_timeout"] == 30.0
    quiet = EventHubSource.from_connection_string(connection_string("127.0.0.1", 5672, eventhub_name="h"),
                                                  idle_timeout=None)
    assert "idle_timeout" not in quiet.client_options


def _store():
    from eventprocessor.stores.memory import InMemoryCheckpointStore

    return InMemoryCheckpointStore()


async def _until(condition, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"not reached within {timeout} s")
        await asyncio.sleep(0.1)
