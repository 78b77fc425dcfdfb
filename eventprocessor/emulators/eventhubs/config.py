"""What the emulator serves: Microsoft's emulator ``Config.json``, or the same from flags.

Microsoft's Event Hubs emulator (a Docker image) reads a ``Config.json`` like::

    {"UserConfig": {
        "NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1",
                             "Entities": [{"Name": "eh1", "PartitionCount": "2",
                                           "ConsumerGroups": [{"Name": "cg1"}]}]}],
        "LoggingConfig": {"Type": "File"}}}

:meth:`EmulatorConfig.from_file` reads exactly that file, so a team's existing set-up
works unchanged. ``PartitionCount`` may be a string (as in Microsoft's samples) or a
number; ``$Default`` always exists; ``LoggingConfig`` is accepted and ignored (this
emulator logs to stderr).

Limits. Microsoft's emulator allows one namespace, 10 event hubs, 32 partitions per hub
and 20 consumer groups per hub. This one goes beyond them, and says so: any number of
hubs, up to :data:`MAX_PARTITIONS` partitions per hub and any number of consumer groups.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["EmulatorConfig", "EventHubConfig", "EmulatorConfigError", "MAX_PARTITIONS", "MICROSOFT_LIMITS"]

MAX_PARTITIONS = 1024
# Microsoft's Docker emulator, for comparison (its documentation, 2025).
MICROSOFT_LIMITS = {"event hubs": 10, "partitions per hub": 32, "consumer groups per hub": 20}
_NAME = re.compile(r"^[A-Za-z0-9$][A-Za-z0-9._\-$]{0,255}$")


class EmulatorConfigError(ValueError):
    """The configuration is invalid; the message names the field and the entity."""


@dataclass(frozen=True)
class EventHubConfig:
    name: str
    partition_count: int = 2
    consumer_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class EmulatorConfig:
    """Event hubs to serve, and how much each partition keeps in memory.

    Example::

        config = EmulatorConfig.from_flags(eventhubs=["telemetry"], partitions=4, consumer_groups=["audit"])
        config = EmulatorConfig.from_file("Config.json")
    """

    eventhubs: tuple[EventHubConfig, ...] = ()
    namespace: str = "emulatorNs1"
    max_events_per_partition: int = 100_000
    retention_seconds: float = 3600.0

    def __post_init__(self) -> None:
        seen = set()
        for hub in self.eventhubs:
            _check_name(hub.name, "event hub")
            key = hub.name.casefold()
            if key in seen:
                raise EmulatorConfigError(f"event hub {hub.name!r} is configured twice")
            seen.add(key)
            if not isinstance(hub.partition_count, int) or not 1 <= hub.partition_count <= MAX_PARTITIONS:
                raise EmulatorConfigError(
                    f"event hub {hub.name!r}: PartitionCount must be a whole number from 1 to {MAX_PARTITIONS}, "
                    f"got {hub.partition_count!r}")
            for group in hub.consumer_groups:
                _check_name(group, f"consumer group of event hub {hub.name!r}")
        if self.max_events_per_partition < 1:
            raise EmulatorConfigError(
                f"max_events_per_partition must be at least 1, got {self.max_events_per_partition}")
        if self.retention_seconds <= 0:
            raise EmulatorConfigError(f"retention_seconds must be positive, got {self.retention_seconds}")

    @property
    def beyond_microsoft_limits(self) -> list[str]:
        """Where this configuration exceeds what Microsoft's Docker emulator accepts."""
        notes = []
        if len(self.eventhubs) > MICROSOFT_LIMITS["event hubs"]:
            notes.append(f"{len(self.eventhubs)} event hubs (Microsoft's emulator: at most 10)")
        for hub in self.eventhubs:
            if hub.partition_count > MICROSOFT_LIMITS["partitions per hub"]:
                notes.append(f"{hub.name}: {hub.partition_count} partitions (Microsoft's emulator: at most 32)")
            if len(set(g.casefold() for g in hub.consumer_groups) | {"$default"}) > 20:
                notes.append(f"{hub.name}: more than 20 consumer groups (Microsoft's emulator: at most 20)")
        return notes

    @classmethod
    def from_flags(cls, *, eventhubs: Iterable[str] = (), partitions: int = 2, consumer_groups: Iterable[str] = (),
                   max_events_per_partition: int = 100_000, retention_seconds: float = 3600.0) -> EmulatorConfig:
        """Hubs named on the command line, all with the same partitions and consumer groups."""
        groups = tuple(consumer_groups)
        return cls(tuple(EventHubConfig(name, partitions, groups) for name in eventhubs),
                   max_events_per_partition=max_events_per_partition, retention_seconds=retention_seconds)

    @classmethod
    def from_file(cls, path: str | Path, **limits: Any) -> EmulatorConfig:
        """Read Microsoft's emulator ``Config.json``."""
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
        except OSError as error:
            raise EmulatorConfigError(f"cannot read the emulator configuration {str(path)!r}: {error.strerror}") \
                from None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as error:
            raise EmulatorConfigError(f"{path}: not valid JSON (line {error.lineno}, column {error.colno}: "
                                      f"{error.msg})") from None
        return cls.from_document(document, source=str(path), **limits)

    @classmethod
    def from_document(cls, document: Any, *, source: str = "configuration", **limits: Any) -> EmulatorConfig:
        user = _get(document, "UserConfig", source, dict)
        namespaces = _get(user, "NamespaceConfig", f"{source}: UserConfig", list)
        if len(namespaces) != 1:
            raise EmulatorConfigError(
                f"{source}: UserConfig.NamespaceConfig must hold exactly one namespace, found {len(namespaces)}")
        namespace = namespaces[0]
        where = f"{source}: UserConfig.NamespaceConfig[0]"
        kind = namespace.get("Type", "EventHub") if isinstance(namespace, dict) else None
        if kind != "EventHub":
            raise EmulatorConfigError(f"{where}.Type must be 'EventHub', got {kind!r}")
        name = namespace.get("Name", "emulatorNs1")
        entities = _get(namespace, "Entities", where, list)
        hubs = []
        for index, entity in enumerate(entities):
            place = f"{where}.Entities[{index}]"
            if not isinstance(entity, dict):
                raise EmulatorConfigError(f"{place} must be an object with Name and PartitionCount")
            hub_name = entity.get("Name")
            if not isinstance(hub_name, str) or not hub_name:
                raise EmulatorConfigError(f"{place}.Name is missing")
            count = entity.get("PartitionCount", 2)
            try:
                partition_count = int(count)
                if isinstance(count, float) or str(partition_count) != str(count).strip():
                    raise ValueError(count)
            except (TypeError, ValueError):
                raise EmulatorConfigError(f"{place} ({hub_name}): PartitionCount must be a whole number, "
                                          f"got {count!r}") from None
            groups = []
            for group_index, group in enumerate(entity.get("ConsumerGroups") or []):
                group_name = group.get("Name") if isinstance(group, dict) else None
                if not isinstance(group_name, str) or not group_name:
                    raise EmulatorConfigError(f"{place}.ConsumerGroups[{group_index}].Name is missing")
                groups.append(group_name)
            hubs.append(EventHubConfig(hub_name, partition_count, tuple(groups)))
        return cls(tuple(hubs), namespace=str(name), **limits)

    def with_hubs(self, extra: EmulatorConfig) -> EmulatorConfig:
        """This configuration plus the hubs of ``extra`` (flags on top of a file)."""
        return EmulatorConfig(self.eventhubs + extra.eventhubs, namespace=self.namespace,
                              max_events_per_partition=self.max_events_per_partition,
                              retention_seconds=self.retention_seconds)


def _get(container: Any, key: str, where: str, kind: type) -> Any:
    if not isinstance(container, dict) or key not in container:
        raise EmulatorConfigError(f"{where} has no {key!r}: expected Microsoft's emulator Config.json layout "
                                  "(UserConfig.NamespaceConfig[0].Entities)")
    value = container[key]
    if not isinstance(value, kind):
        raise EmulatorConfigError(f"{where}.{key} must be a {'list' if kind is list else 'object'}")
    return value


def _check_name(name: str | None, what: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name) or name.endswith((".", "-")):
        raise EmulatorConfigError(
            f"invalid {what} name {name!r}: use letters, digits, '.', '-', '_' (at most 256 characters, "
            "starting and ending with a letter or digit)")
