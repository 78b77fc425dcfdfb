"""Shared fixtures: a session-wide Azurite, a session-wide Event Hubs emulator, and the CI
rule that missing services fail."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterator

import pytest

from emulators.azurite import Azurite, AzuriteUnavailable, start_azurite
from tests.spark_fixtures import connect_spark, spark_cluster  # noqa: F401  (the session Spark cluster)

if TYPE_CHECKING:  # pragma: no cover
    from emulators.eventhubs.process import EmulatorProcess

IN_CI = bool(os.environ.get("CI"))


def unavailable(reason: str) -> None:
    """Fail in CI, skip elsewhere: tests that need a service never pass silently in CI."""
    if IN_CI:
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    """One Azurite for the whole test session, on free loopback ports."""
    try:
        instance = start_azurite()
    except AzuriteUnavailable as error:
        unavailable(f"Azurite could not start: {error}")
        raise  # unreachable; keeps type checkers happy
    try:
        yield instance
    finally:
        instance.stop()


# ----------------------------------------------------------------------------- Event Hubs emulator

# Hubs of the session emulator, handed out one per test so tests never see each other's
# events: "pool4-N" have 4 partitions, "pool8-N" 8; all have consumer groups cg1 and cg2.
HUB_POOLS = {4: 60, 8: 12}


@dataclass
class SessionEmulator:
    """The session's Event Hubs emulator process and a pool of fresh hubs."""

    process: "EmulatorProcess"
    _next: Dict[int, int] = field(default_factory=dict)

    @property
    def connection_string(self) -> str:
        return self.process.connection_string

    @property
    def port(self) -> int:
        return self.process.port

    def fresh_hub(self, partitions: int = 4) -> str:
        """The name of a hub no other test of this session has used."""
        index = self._next.get(partitions, 0)
        if partitions not in HUB_POOLS or index >= HUB_POOLS[partitions]:
            raise RuntimeError(f"no fresh {partitions}-partition hub left: raise HUB_POOLS in tests/conftest.py")
        self._next[partitions] = index + 1
        return f"pool{partitions}-{index}"


def _session_config(path: Path) -> Path:
    entities = [{"Name": f"pool{partitions}-{index}", "PartitionCount": str(partitions),
                 "ConsumerGroups": [{"Name": "cg1"}, {"Name": "cg2"}]}
                for partitions, count in HUB_POOLS.items() for index in range(count)]
    config = {"UserConfig": {"NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1", "Entities": entities}],
                             "LoggingConfig": {"Type": "Console"}}}
    path.write_text(json.dumps(config))
    return path


@pytest.fixture(scope="session")
def eventhubs_emulator(tmp_path_factory) -> Iterator[SessionEmulator]:
    """One Event Hubs emulator process for the whole session, on a free loopback port,
    stopped by PID even when tests fail."""
    from emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process

    directory = tmp_path_factory.mktemp("eventhubs")
    config = _session_config(directory / "Config.json")
    log = (directory / "emulator.log").open("wb")
    try:
        process = start_emulator_process(["--config", str(config), "--max-events-per-partition", "200000"],
                                         stderr=log)
    except EmulatorUnavailable as error:
        log.close()
        unavailable(f"the Event Hubs emulator could not start: {error}")
        raise  # unreachable
    try:
        yield SessionEmulator(process)
    finally:
        code = process.stop()
        log.close()
        if code not in (0, None):
            print(f"\nthe Event Hubs emulator exited with code {code}; its log: {directory / 'emulator.log'}")


@pytest.fixture
def hub(eventhubs_emulator: SessionEmulator) -> str:
    """A fresh 4-partition hub on the session emulator."""
    return eventhubs_emulator.fresh_hub(4)
