"""The second hour of a new user: when their own setup goes wrong, the SDK says what and
where. Each test is a path that misled a user, on virtual time and the in-memory store
and source (FaultyStore for the store's faults), with the log captured as they read it.
"""
from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import replace

import pytest

from eventprocessor import (
    EventProcessor,
    EventSourceError,
    FailurePolicy,
    PartitionProcessor,
    PoisonEventsError,
)
from eventprocessor.sources import InMemoryEventSource
from eventprocessor.stores import InMemoryCheckpointStore
from eventprocessor.testing import FaultyStore, run_virtual, virtual_utc_clock
from tests.test_processor import until

FAST = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=20.0)


def _said(caplog: pytest.LogCaptureFixture, level: int = logging.WARNING) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno >= level and record.name.startswith("eventprocessor")]


# --------------------------------------------------------------------------- the store down


@pytest.mark.parametrize("fault", ["down", "hang"])
def test_a_store_down_for_60_s_is_a_handful_of_lines_naming_the_store_and_one_when_it_recovers(caplog, fault):
    """The README's example on a Blob store whose Azurite is not running: the store error
    twice, then 29 WARNINGs in 60 s blaming the CPU, one per tick."""
    store = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()))
    setattr(store, fault, True)

    async def scenario() -> None:
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        async with EventProcessor(source, store, PartitionProcessor, **FAST) as processor:
            await asyncio.sleep(60)
            store.clear()
            await until(lambda: len(processor.owned_partitions) == 4, what="the partitions, once the store is back")

    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        run_virtual(scenario())
    said = _said(caplog)
    assert 2 <= len(said) <= 5, "\n".join(said)
    assert all("FaultyStore(InMemoryCheckpointStore())" in line for line in said), "\n".join(said)
    assert not any("CPU" in line for line in said), "\n".join(said)
    first = said[0]
    assert re.search(r"is failing: (write_member|list_ownership\w*) (failed|gave up) after \d+\.\d s", first), first
    [recovered] = [line for line in said if "answers again after" in line]
    assert "after 6" in recovered and said.index(recovered) >= len(said) - 2, said  # down for 60 s and more
    # Between them, only how long it has lasted; after it, at most the end of the backing off.
    assert all("still fails after" in line and "calls failed" in line for line in said[1:said.index(recovered)]), said
    assert all("answers in time again" in line for line in said[said.index(recovered) + 1:]), said


def test_a_store_outage_reaches_the_handlers_and_error_handler_without_a_warning_per_partition(caplog):
    reported: list[Exception] = []

    async def on_error(error, context):
        reported.append(error)

    store = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()))

    async def scenario() -> None:
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        async with EventProcessor(source, store, PartitionProcessor, error_handler=on_error, **FAST) as processor:
            await until(lambda: len(processor.owned_partitions) == 4)
            store.down = True
            await asyncio.sleep(10)
            store.clear()
            await asyncio.sleep(5)

    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        run_virtual(scenario())
    assert reported, "error_handler hears of the outage"
    said = _said(caplog)
    assert not [line for line in said if line.startswith("error on partition")], "\n".join(said)
    assert not [line for line in said if "renewal of partition" in line], "\n".join(said)
    assert len(said) <= 3, "\n".join(said)


def test_a_tick_slowed_by_the_store_names_the_store_call_not_the_cpu(caplog):
    store = FaultyStore(InMemoryCheckpointStore(clock=virtual_utc_clock()))

    async def scenario() -> None:
        source = InMemoryEventSource(4, clock=virtual_utc_clock())
        async with EventProcessor(source, store, PartitionProcessor, **FAST) as processor:
            await until(lambda: len(processor.owned_partitions) == 4)
            store.latency = 1.5  # every call answers, late
            # The listings (a tick at rest lists the members only; one after a change, the
            # ownership records too).
            store.only = {"list_ownership_and_members", "list_ownership", "list_members"}
            await asyncio.sleep(60)

    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        run_virtual(scenario())
    overran = [line for line in _said(caplog) if "tick took" in line]
    assert overran, _said(caplog)
    assert len(overran) <= 3, "\n".join(overran)  # rate-limited, with a count
    assert all("CPU" not in line and "list_" in line and "1.5" in line for line in overran), overran
    assert any("more" in line for line in overran[1:]) or len(overran) == 1, overran


# --------------------------------------------------------------------------- mismatches named


def test_a_checkpoint_ahead_of_the_partition_s_last_event_is_named_with_the_fix(caplog):
    """The README's program again with Azurite up: the first run's checkpoints are ahead
    of the fresh in-memory source, and it was silent for 60 s."""
    store = InMemoryCheckpointStore(clock=virtual_utc_clock())

    class Checkpointing(PartitionProcessor):
        async def process_events(self, events, context):
            await context.update_checkpoint()

    async def run(events: int) -> None:
        source = InMemoryEventSource(1, clock=virtual_utc_clock())
        for i in range(events):
            await source.send(f"event {i}")
        async with EventProcessor(source, store, Checkpointing, **FAST):
            await asyncio.sleep(10)

    run_virtual(run(20))
    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        run_virtual(run(5))
    said = _said(caplog)
    assert len(said) == 1, said  # one sentence, not a refusal every reconnect
    line = said[0]
    assert "partition 0" in line and "19" in line and "4" in line, line
    assert "override_checkpoints=True" in line and "consumer group" in line, line


class _UnknownHub(InMemoryEventSource):
    async def get_partition_ids(self) -> list[str]:
        raise EventSourceError(f"event hub {self.eventhub_name!r} in namespace {self.fully_qualified_namespace!r}: "
                               "reading its partition ids failed: the event hub does not exist",
                               fully_qualified_namespace=self.fully_qualified_namespace,
                               eventhub_name=self.eventhub_name, reason="not-found")


class _UnknownConsumerGroup(InMemoryEventSource):
    async def open_receiver(self, partition_id, *, consumer_group, **kwargs):
        raise EventSourceError(f"event hub {self.eventhub_name!r}: opening a receiver (consumer group "
                               f"{consumer_group!r}) failed: the consumer group does not exist",
                               fully_qualified_namespace=self.fully_qualified_namespace,
                               eventhub_name=self.eventhub_name, reason="not-found")


@pytest.mark.parametrize("source_type", [_UnknownHub, _UnknownConsumerGroup])
def test_a_source_that_can_never_work_ends_the_processor_with_its_error_within_5_s(caplog, source_type):
    """An event hub name that does not exist: one ERROR line, then the program ran on and
    exited 0 as if it had worked."""

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        source = source_type(4, clock=virtual_utc_clock())
        started = loop.time()
        with pytest.raises(EventSourceError, match="does not exist"):
            async with EventProcessor(source, InMemoryCheckpointStore(clock=virtual_utc_clock()), PartitionProcessor,
                                      load_balancing_interval=15):
                await asyncio.sleep(60)
        return loop.time() - started

    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        took = run_virtual(scenario())
    assert took <= 5.5, took
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) <= 2 and any("does not exist" in line for line in errors), errors


def test_run_raises_the_error_of_a_source_that_can_never_work():
    async def scenario() -> None:
        processor = EventProcessor(_UnknownHub(2, clock=virtual_utc_clock()),
                                   InMemoryCheckpointStore(clock=virtual_utc_clock()), PartitionProcessor)
        with pytest.raises(EventSourceError, match="does not exist"):
            await asyncio.wait_for(processor.run(), 10)

    run_virtual(scenario())


def test_keep_retrying_the_source_when_asked():
    async def scenario() -> bool:
        source = _UnknownHub(2, clock=virtual_utc_clock())
        async with EventProcessor(source, InMemoryCheckpointStore(clock=virtual_utc_clock()), PartitionProcessor,
                                  source_startup_timeout=None, **FAST) as processor:
            await asyncio.sleep(30)
            return processor.is_running

    assert run_virtual(scenario())


def test_a_source_that_worked_once_is_retried_for_as_long_as_the_processor_runs():
    class Flaky(InMemoryEventSource):
        broken = False

        async def get_partition_ids(self) -> list[str]:
            if self.broken:
                raise EventSourceError("the hub cannot be reached", reason="unreachable")
            return await super().get_partition_ids()

    async def scenario() -> bool:
        source = Flaky(2, clock=virtual_utc_clock())
        async with EventProcessor(source, InMemoryCheckpointStore(clock=virtual_utc_clock()), PartitionProcessor,
                                  **FAST) as processor:
            await until(lambda: len(processor.owned_partitions) == 2)
            source.broken = True
            await asyncio.sleep(30)
            return processor.is_running

    assert run_virtual(scenario())


# --------------------------------------------------------------------------- one traceback per failure


@pytest.mark.parametrize("policy, kept", [
    (FailurePolicy(), "dropped"),
    (FailurePolicy(on_poison="park"), "parked"),
])
def test_a_failing_handler_costs_one_traceback_then_a_line_per_retry_and_says_what_became_of_the_event(
        caplog, policy, kept):
    """A handler that raises on one event: 152 lines and 9 tracebacks, and the last line
    did not say the event was dropped or how to keep it."""

    poisoned: list[PoisonEventsError] = []

    class Failing(PartitionProcessor):
        async def process_events(self, events, context):
            for event in events:
                if event.body_as_str() == "bad":
                    raise ValueError("cannot parse 'bad'")
            await context.update_checkpoint()

        async def process_error(self, error, context):
            if isinstance(error, PoisonEventsError):
                poisoned.append(error)

    async def scenario() -> None:
        source = InMemoryEventSource(1, clock=virtual_utc_clock())
        for body in ("good", "bad", "good"):
            await source.send(body)
        async with EventProcessor(source, InMemoryCheckpointStore(clock=virtual_utc_clock()), Failing,
                                  failure_policy=policy, **FAST):
            await until(lambda: poisoned, what="the poison event")
            await asyncio.sleep(2)

    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        run_virtual(scenario())
    records = [r for r in caplog.records if r.levelno >= logging.WARNING]
    tracebacks = [r for r in records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
    retries = [r for r in records if "(attempt " in r.getMessage() and not r.exc_info]
    assert len(retries) == policy.max_delivery_attempts - 1, [r.getMessage() for r in retries]
    assert all("\n" not in r.getMessage() for r in records)
    last = records[-1].getMessage()
    assert kept in last, last
    if kept == "dropped":
        assert "dead_letter" in last and "on_poison=\"park\"" in last, last


# --------------------------------------------------------------------------- switching back


def test_claiming_over_a_record_written_by_azure_eventhub_s_own_client_does_not_read_like_data_loss(caplog):
    """Switching back to the drop-in after the official client wrote the container:
    "the checkpoint carries epoch 2, not below the claim's 1 (the ownership record lost
    its epoch)"."""
    store = InMemoryCheckpointStore(clock=virtual_utc_clock())
    source = InMemoryEventSource(1, clock=virtual_utc_clock())
    delivered: list[int] = []

    class Checkpointing(PartitionProcessor):
        async def process_events(self, events, context):
            delivered.extend(event.sequence_number for event in events)
            await context.update_checkpoint()

    async def first() -> None:
        for i in range(3):
            await source.send(f"event {i}")
        async with EventProcessor(source, store, Checkpointing, **FAST) as processor:
            await until(lambda: len(delivered) == 3 and processor.owned_partitions == {"0"})
        # azure-eventhub's client writes the ownership record without this SDK's epoch.
        listing = await store.list_ownership(source.fully_qualified_namespace, source.eventhub_name, "$default")
        [record] = listing.ownerships
        await store.claim_ownership([replace(record, owner_id="azure-eventhub-client", epoch=0)])

    async def second() -> None:
        for i in range(3, 5):
            await source.send(f"event {i}")
        async with EventProcessor(source, store, Checkpointing, **FAST):
            await until(lambda: len(delivered) == 5)

    run_virtual(first())
    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        run_virtual(second())
    assert delivered == [0, 1, 2, 3, 4]
    lines = [r.getMessage() for r in caplog.records if "epoch" in r.getMessage() and "partition 0" in r.getMessage()
             and "checkpoint" in r.getMessage()]
    assert lines, [r.getMessage() for r in caplog.records]
    # The one warning is the mixed group: a live record of azure-eventhub's client makes
    # the processor renew per partition again (docs/concepts/leases.md), said once.
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    mixed = [w for w in warnings if "['azure-eventhub-client'] judge ownership by each record's age" in w]
    assert len(mixed) == 1 and warnings == mixed, _said(caplog)
    assert not any("lost" in line for line in lines), lines
    assert any("azure-eventhub" in line and "resum" in line for line in lines), lines


# --------------------------------------------------------------------------- the README's swap, store down


def test_the_readme_s_swap_to_a_blob_store_that_is_down_closes_cleanly_and_names_the_store(tmp_path):
    """The README's first example with the swap it suggests, Azurite not running: the store
    error twice, a WARNING per tick blaming the CPU, and ``Unclosed client session`` /
    ``Unclosed connector`` at the end (the swap never showed closing the store)."""
    pytest.importorskip("azure.storage.blob")
    import subprocess
    import sys
    from pathlib import Path

    from eventprocessor.emulators.azurite import Azurite
    from eventprocessor.emulators.ports import free_ports
    from tests import docs_pages

    readme = docs_pages.text(docs_pages.README)
    swap = readme[readme.index("Swap `InMemoryEventSource`"):]
    swap = swap[:swap.index("\n## ")]
    closing = re.search(r"async with BlobCheckpointStore\.from_connection_string\(([^)]*)\) as store", swap)
    assert closing, "the README's swap shows the store closed by `async with`"
    first = next(block for block in docs_pages.fenced_blocks(readme, "README.md") if block.language == "python")
    program = first.body.replace("from eventprocessor.stores import InMemoryCheckpointStore",
                                 "import os\nfrom eventprocessor.stores import BlobCheckpointStore")
    opened = "    async with EventProcessor(source, InMemoryCheckpointStore(), Printer, load_balancing_interval=1):\n"
    assert opened in program
    program = program.replace(opened, "    async with BlobCheckpointStore.from_connection_string("
                                      "os.environ['STORAGE_CONNECTION_STRING'], 'checkpoints') as store:\n"
                                      "     async with EventProcessor(source, store, Printer, "
                                      "load_balancing_interval=1):\n")
    program = program.replace("timeout=60", "timeout=8")
    (tmp_path / "swapped.py").write_text(program, encoding="utf-8")
    blob, queue, table = free_ports(3)  # nothing listens there: Azurite is not running
    env = {**__import__("os").environ, "STORAGE_CONNECTION_STRING": Azurite(blob, queue, table).connection_string,
           "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    out = subprocess.run([sys.executable, "-X", "dev", str(tmp_path / "swapped.py")], capture_output=True,
                         text=True, timeout=120, env=env, cwd=tmp_path)
    assert "TimeoutError" in out.stderr, out.stderr[-3000:]  # the example's own wait_for, as written
    assert "Unclosed" not in out.stderr and "unclosed" not in out.stderr, out.stderr[-3000:]
    logged = [line for line in out.stderr.splitlines() if line.startswith("processor ")]
    assert 1 <= len(logged) <= 3, "\n".join(logged)
    assert "BlobCheckpointStore(" in logged[0] and f"127.0.0.1:{blob}" in logged[0], logged
    assert all("checkpoints" in line for line in logged), logged  # the store, or its container
    assert not any("CPU" in line for line in out.stderr.splitlines()), out.stderr[-3000:]


# --------------------------------------------------------------------------- the same, on the real transport


@pytest.mark.eventhubs
@pytest.mark.parametrize("where", ["unknown hub", "unknown consumer group", "refused port"])
def test_on_the_emulator_a_source_that_can_never_work_ends_the_processor_within_5_s(
        eventhubs_emulator, request, where):
    pytest.importorskip("azure.eventhub")
    from eventprocessor.emulators.ports import free_ports
    from eventprocessor.sources.eventhub import EventHubSource

    connection, hub, group = eventhubs_emulator.connection_string, "no-such-hub", "$default"
    if where == "refused port":
        connection = connection.replace(f":{eventhubs_emulator.port}", f":{free_ports(1)[0]}")
    if where == "unknown consumer group":
        hub, group = request.getfixturevalue("hub"), "no-such-group"

    async def scenario() -> float:
        loop = asyncio.get_running_loop()
        source = EventHubSource.from_connection_string(connection, eventhub_name=hub)
        started = loop.time()
        try:
            with pytest.raises(EventSourceError) as raised:
                async with EventProcessor(source, InMemoryCheckpointStore(), PartitionProcessor,
                                          consumer_group=group):
                    await asyncio.sleep(30)
        finally:
            await source.close()
        assert "source_startup_timeout=None" in str(raised.value)
        assert raised.value.reason in ("not-found", "unreachable"), raised.value
        return loop.time() - started

    assert asyncio.run(scenario()) < 8.0  # 5 s, and the stop


@pytest.mark.eventhubs
def test_on_the_emulator_a_start_past_the_partition_s_newest_event_is_one_warning_per_partition(hub, eventhubs_emulator,
                                                                                               caplog):
    pytest.importorskip("azure.eventhub")
    from eventprocessor import EventPosition
    from eventprocessor.sources.eventhub import EventHubSource

    async def scenario() -> int:
        source = EventHubSource.from_connection_string(eventhubs_emulator.connection_string, eventhub_name=hub)
        try:
            partitions = len(await source.get_partition_ids())
            async with EventProcessor(source, InMemoryCheckpointStore(), PartitionProcessor, load_balancing_interval=1,
                                      initial_event_position=EventPosition.from_sequence_number(10_000)):
                deadline = asyncio.get_running_loop().time() + 20
                while len(_said(caplog)) < partitions and asyncio.get_running_loop().time() < deadline:
                    await asyncio.sleep(0.2)
                await asyncio.sleep(1)  # and nothing more: the refusals that follow are DEBUG
        finally:
            await source.close()
        return partitions

    with caplog.at_level(logging.DEBUG, logger="eventprocessor"):
        partitions = asyncio.run(scenario())
    said = _said(caplog)
    assert len(said) == partitions, said
    assert all("starts after sequence number 10000" in line and "override_checkpoints=True" in line
               for line in said), said
