"""Microsoft's own azure-eventhub async samples (``tests/azure_samples/``, copied unchanged
from the azure-eventhub 5.11.7 sdist) run against the session's Event Hubs emulator and
Azurite, each twice: as published (``azure-eventhub``) and with only the
``EventHubConsumerClient`` import changed to ``from eventprocessor import
EventHubConsumerClient`` (``eventprocessor``). Both runs must do the same thing.

Each sample runs as a user runs it: ``python <sample>.py`` in its own process, with the
connection strings in the environment variables it reads (``EVENT_HUB_CONN_STR``,
``EVENT_HUB_NAME``, ``AZURE_STORAGE_CONN_STR``) and a fresh hub. ``send_async.py`` sends
first; how many events each partition got is read from the emulator afterwards. The
receive samples run forever, so each is stopped with Ctrl-C (SIGINT) once it has printed
a receipt for every event sent (plus a moment for anything extra), as a user stops it;
then what it printed is checked (every event once, partitions initialized and closed
with ``SHUTDOWN``, no ``on_error`` call) and what it checkpointed is read from the blobs
(the official layout: ``{namespace}/{hub}/{group}/checkpoint/{partition}``).
``recv_for_period_async.py`` stops by itself after 15 s.
"""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.dropin_imports import migrated

pytestmark = [pytest.mark.azurite, pytest.mark.eventhubs]

pytest.importorskip("azure.eventhub.extensions.checkpointstoreblobaio")

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "tests" / "azure_samples"
CONTAINER = "your-blob-container-name"  # the samples' own ("Please make sure the blob container resource exists.")
GROUP = "$default"  # the samples say "$default" or "$Default"; blob names are lower-cased
CLIENTS = ["azure-eventhub", "eventprocessor"]
DEADLINE = 120.0  # seconds for a sample to print what it must; each needs 2-20
RECEIVED = re.compile(r"^Received events? from partition: (\d+)\.$")
INITIALIZED = re.compile(r"^Partition: (\d+) has been initialized\.$")
CLOSED = re.compile(r"^Partition: (\d+) has been closed, reason for closing: (.+)\.$")

def test_the_migration_changes_the_consumer_import_and_nothing_else() -> None:
    import difflib

    for path in sorted(SAMPLES.glob("recv*.py")) + [SAMPLES / "receive_batch_with_checkpoint_async.py"]:
        original = path.read_text()
        diff = [line for line in difflib.unified_diff(original.splitlines(), migrated(original).splitlines(),
                                                      lineterm="", n=0) if line[:1] in "+-"]
        removed = [line for line in diff if line.startswith("-") and not line.startswith("---")]
        added = [line for line in diff if line.startswith("+") and not line.startswith("+++")]
        assert len(removed) == 1 and "EventHubConsumerClient" in removed[0], (path.name, diff)
        assert "+from eventprocessor import EventHubConsumerClient" in added, (path.name, diff)
        assert len(added) == (2 if "EventHubProducerClient" in removed[0] else 1), (path.name, diff)


class Sample:
    """One sample running in its own process; its output lines are collected as they
    come (stdout and stderr apart)."""

    def __init__(self, name: str, client: str, env: dict[str, str], workdir: Path) -> None:
        text = (SAMPLES / name).read_text()
        path = workdir / name
        path.write_text(migrated(text) if client == "eventprocessor" else text)
        self.name, self.client = name, client
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self.process = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.DEVNULL, text=True, env=env, cwd=workdir)
        self._readers = [threading.Thread(target=self._read, args=(stream, lines), daemon=True)
                         for stream, lines in ((self.process.stdout, self.stdout), (self.process.stderr, self.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))

    def matching(self, pattern: re.Pattern[str], lines: list[str] | None = None) -> list[re.Match[str]]:
        return [m for m in (pattern.match(line) for line in list(self.stdout if lines is None else lines)) if m]

    def per_partition(self, pattern: re.Pattern[str] = RECEIVED, lines: list[str] | None = None) -> Counter:
        return Counter(m.group(1) for m in self.matching(pattern, lines))

    def wait_for(self, condition: Callable[[], bool], what: str, timeout: float = DEADLINE) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.process.poll() is not None:
                self._join()
                if condition():
                    return
                pytest.fail(f"{self.client}: {self.name} exited ({self.process.returncode}) before {what}\n"
                            f"{self.report()}")
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"{self.client}: {self.name} did not get to {what} in {timeout:.0f} s\n{self.report()}")
            time.sleep(0.1)

    def finish(self, timeout: float = 60.0) -> int:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.client}: {self.name} did not stop within {timeout:.0f} s\n{self.report()}")
        self._join()
        return self.process.returncode

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._join()

    def _join(self) -> None:
        for reader in self._readers:
            reader.join(10)

    def report(self) -> str:
        return ("stdout:\n" + "\n".join(self.stdout[-40:]) + "\nstderr:\n" + "\n".join(self.stderr[-60:]))

    def assert_stopped_by_ctrl_c(self, returncode: int) -> None:
        # As any asyncio.run program stopped with Ctrl-C: KeyboardInterrupt, exit by SIGINT.
        assert returncode == -signal.SIGINT and "KeyboardInterrupt" in self.stderr, \
            f"{self.client}: {self.name} exited {returncode}\n{self.report()}"
        self.assert_clean_exit()

    def assert_clean_exit(self) -> None:
        assert not [line for line in self.stdout if line.startswith("An exception")], self.report()  # on_error
        if self.client == "eventprocessor":
            # azure-eventhub never closes the checkpoint store, and the samples do not either,
            # so its aiohttp session is reported unclosed at exit; the drop-in closes the
            # store it built from the official one.
            leaks = [line for line in self.stderr if "Unclosed" in line or "was destroyed but it is pending" in line]
            assert not leaks, f"{self.client}: {self.name} left resources open\n{self.report()}"


@pytest.fixture
def envs(eventhubs_emulator, azurite, tmp_path: Path) -> dict[str, dict[str, str]]:
    """For each client, the environment a user sets for the samples, on a hub of its own
    (both clients run at the same time), and the samples' container made (the samples say
    it must exist; the official store does not create it)."""
    from azure.core.exceptions import ResourceExistsError
    from azure.storage.blob.aio import ContainerClient

    async def make_container() -> None:
        async with ContainerClient.from_connection_string(azurite.connection_string, CONTAINER) as container:
            try:
                await container.create_container()
            except ResourceExistsError:
                pass

    asyncio.run(make_container())
    base = {k: v for k, v in os.environ.items() if not k.startswith(("EVENT_HUB_", "AZURE_STORAGE_"))}
    base.update({
        "EVENT_HUB_CONN_STR": eventhubs_emulator.connection_string,
        "AZURE_STORAGE_CONN_STR": azurite.connection_string,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1",
    })
    envs = {}
    for client in CLIENTS:
        (tmp_path / client).mkdir()
        envs[client] = {**base, "EVENT_HUB_NAME": eventhubs_emulator.fresh_hub(4), "WORKDIR": str(tmp_path / client)}
    return envs


def start(name: str, envs: dict[str, dict[str, str]]) -> dict[str, Sample]:
    """``name`` under each client, at the same time."""
    return {client: Sample(name, client, env, Path(env["WORKDIR"])) for client, env in envs.items()}


def interrupt(samples: dict[str, Sample], grace: float = 1.5) -> None:
    """Anything extra would arrive in ``grace`` seconds; then Ctrl-C, as a user stops it."""
    time.sleep(grace)
    for sample in samples.values():
        sample.process.send_signal(signal.SIGINT)
    for sample in samples.values():
        sample.assert_stopped_by_ctrl_c(sample.finish())


def events_per_partition(env: dict[str, str]) -> dict[str, int]:
    """What the hub holds, partition by partition, as the emulator reports it."""
    from azure.eventhub.aio import EventHubConsumerClient

    async def read() -> dict[str, int]:
        client = EventHubConsumerClient.from_connection_string(env["EVENT_HUB_CONN_STR"], GROUP,
                                                               eventhub_name=env["EVENT_HUB_NAME"])
        async with client:
            counts = {}
            for pid in await client.get_partition_ids():
                properties = await client.get_partition_properties(pid)
                counts[pid] = 0 if properties["is_empty"] else properties["last_enqueued_sequence_number"] + 1
            return counts

    return asyncio.run(read())


def send(envs: dict[str, dict[str, str]]) -> dict[str, dict[str, int]]:
    """Run send_async.py (unchanged: it uses the producer only) on each client's hub; the
    events each hub got, by partition."""
    # Unchanged for both: it has no consumer to migrate.
    senders = {client: Sample("send_async.py", "azure-eventhub", env, Path(env["WORKDIR"]))
               for client, env in envs.items()}
    sent = {}
    for client, sender in senders.items():
        assert sender.finish() == 0, sender.report()
        assert any(line.startswith("Send messages in") for line in sender.stdout), sender.report()
        sent[client] = {pid: n for pid, n in events_per_partition(envs[client]).items() if n}
        assert sum(sent[client].values()) >= 14, sent  # 1 + a size-limited batch (at least 1) + 1 + 1 + 1 + 10
    return sent


def checkpoints(env: dict[str, str]) -> dict[str, int]:
    """The checkpoints of the hub's ``$default`` group, read from the blobs: the
    official layout, whichever client wrote them. A blob with sequence number -1 is the
    placeholder this SDK writes when it fences a partition that has no checkpoint yet
    (see ``eventprocessor/stores/blob.py``): no checkpoint."""
    from azure.storage.blob.aio import ContainerClient

    async def read() -> dict[str, int]:
        marker = f"/{env['EVENT_HUB_NAME']}/{GROUP}/checkpoint/".lower()
        async with ContainerClient.from_connection_string(env["AZURE_STORAGE_CONN_STR"], CONTAINER) as container:
            found = {blob.name.rsplit("/", 1)[1]: int(blob.metadata["sequencenumber"])
                     async for blob in container.list_blobs(include=["metadata"]) if marker in blob.name}
            return {pid: sequence_number for pid, sequence_number in found.items() if sequence_number != -1}

    return asyncio.run(read())


def _last(counts: dict[str, int]) -> dict[str, int]:
    return {pid: n - 1 for pid, n in counts.items()}


def _receive_everything(name: str, envs: dict[str, dict[str, str]]) -> tuple[dict[str, Sample], dict[str, dict]]:
    sent = send(envs)
    samples = start(name, envs)
    for client, sample in samples.items():
        sample.wait_for(lambda sample=sample, client=client: sample.per_partition() == Counter(sent[client]),
                        f"receiving the {sum(sent[client].values())} events")
    interrupt(samples)
    for client, sample in samples.items():
        assert sample.per_partition() == Counter(sent[client]), f"{client}: every event once\n{sample.report()}"
    return samples, sent


def test_recv_async(envs: dict[str, dict[str, str]]) -> None:
    samples, _sent = _receive_everything("recv_async.py", envs)
    partitions = ["0", "1", "2", "3"]
    for sample in samples.values():
        assert sorted(m.group(1) for m in sample.matching(INITIALIZED)) == partitions, sample.report()
        assert sorted((m.group(1), m.group(2)) for m in sample.matching(CLOSED)) == [
            (pid, "CloseReason.SHUTDOWN") for pid in partitions], sample.report()


def test_recv_with_checkpoint_store_async(envs: dict[str, dict[str, str]]) -> None:
    _samples, sent = _receive_everything("recv_with_checkpoint_store_async.py", envs)
    for client, env in envs.items():
        assert checkpoints(env) == _last(sent[client]), client  # it checkpoints every event


def test_recv_with_checkpoint_by_time_interval_async(envs: dict[str, dict[str, str]]) -> None:
    _samples, sent = _receive_everything("recv_with_checkpoint_by_time_interval_async.py", envs)
    for client, env in envs.items():
        # It checkpoints a partition's first event, then again only after 15 s: all arrive sooner.
        assert checkpoints(env) == {pid: 0 for pid in sent[client]}, client


def test_recv_with_checkpoint_by_event_count_async(envs: dict[str, dict[str, str]]) -> None:
    """The published sample raises KeyError in on_event on every partition's first event
    (its counter dict starts empty), under either client: it prints a receipt, never
    checkpoints, and the error is logged, since it has no on_error."""
    sent = send(envs)
    samples = start("recv_with_checkpoint_by_event_count_async.py", envs)
    for client, sample in samples.items():
        sample.wait_for(lambda sample=sample, client=client: set(sample.per_partition()) == set(sent[client]) and any(
            "KeyError" in line for line in sample.stderr), "a receipt from every partition and the KeyError logged")
    interrupt(samples)
    for client, env in envs.items():
        assert checkpoints(env) == {}, client


def test_receive_batch_with_checkpoint_async(envs: dict[str, dict[str, str]]) -> None:
    sent = send(envs)
    samples = start("receive_batch_with_checkpoint_async.py", envs)
    counted = re.compile(r"^INFO:__main__:Partition (\d+), Received count: (\d+)$")

    def received(sample: Sample) -> Counter:
        totals: Counter = Counter()
        for match in sample.matching(counted, sample.stderr):  # it logs to stderr (logging.basicConfig)
            totals[match.group(1)] += int(match.group(2))
        return totals

    for client, sample in samples.items():
        sample.wait_for(lambda sample=sample, client=client: received(sample) == Counter(sent[client]),
                        "receiving every event in batches")
        # Each batch takes 2 s (the sample's stand-in for work), then checkpoints.
        sample.wait_for(lambda client=client: checkpoints(envs[client]) == _last(sent[client]),
                        "checkpointing every partition's last batch")
    interrupt(samples)
    for client, sample in samples.items():
        assert received(sample) == Counter(sent[client]), sample.report()
        assert all(int(m.group(2)) <= 100 for m in sample.matching(counted, sample.stderr))  # max_batch_size=100


def test_recv_track_last_enqueued_event_prop_async(envs: dict[str, dict[str, str]]) -> None:
    sent = send(envs)
    samples = start("recv_track_last_enqueued_event_prop_async.py", envs)
    for client, sample in samples.items():
        sample.wait_for(lambda sample=sample, client=client:
                        sample.per_partition() == Counter({"0": sent[client]["0"]}),
                        "receiving partition 0")
    interrupt(samples)
    for client, sample in samples.items():
        expected = sent[client]["0"]
        assert sample.per_partition() == Counter({"0": expected}), sample.report()  # partition_id="0" only
        newest = [int(m.group(1)) for m in (re.search(r"'sequence_number': (\d+)", line) for line in sample.stdout
                                            if line.startswith("Last enqueued event properties")) if m]
        assert newest and newest[-1] == expected - 1, sample.report()
        events = [line for line in sample.stdout if line.startswith("{ body: ")]  # print(event)
        assert len(events) == expected and all(" offset: " in line for line in events), sample.report()


def test_recv_for_period_async(envs: dict[str, dict[str, str]]) -> None:
    sent = send(envs)
    samples = start("recv_for_period_async.py", envs)
    for client, sample in samples.items():
        assert sample.finish(timeout=DEADLINE) == 0, sample.report()  # it stops by itself after 15 s
        sample.assert_clean_exit()
        assert sample.per_partition() == Counter(sent[client]), sample.report()
        assert sorted((m.group(1), m.group(2)) for m in sample.matching(CLOSED)) == [
            (pid, "CloseReason.SHUTDOWN") for pid in ["0", "1", "2", "3"]], sample.report()
        assert sample.stdout[-1].startswith("Consumer has stopped receiving"), sample.report()


def test_recv_with_custom_starting_position_async(envs: dict[str, dict[str, str]]) -> None:
    # It sends its own four events to partition 0 and reads from the third from last.
    samples = start("recv_with_custom_starting_position_async.py", envs)
    received = re.compile(r"^Received event: (.+) from partition: 0\.$")
    for sample in samples.values():
        sample.wait_for(lambda sample=sample: len(sample.matching(received)) >= 3, "receiving three events")
    interrupt(samples)
    for sample in samples.values():
        assert [m.group(1) for m in sample.matching(received)] == [
            "Second event in partition 0", "Third event in partition 0", "Forth event in partition 0"], \
            sample.report()
        assert [m.group(1) for m in sample.matching(INITIALIZED)] == ["0"], sample.report()
