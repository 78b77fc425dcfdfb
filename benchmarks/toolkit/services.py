"""The services a benchmark starts for itself, on 127.0.0.1, and stops whatever happens:
Azurite, the project's Event Hubs emulator, and a folder for the workers' logs.

A service that cannot start raises :class:`~eventprocessor.cli.user_errors.CommandError`
saying which and why, which the program prints as one line (exit status 2).

Example (the body of a benchmark's run)::

    with services.logs("moves", args.log_dir) as log_dir, \\
            services.azurite_and_emulator(hubs={"moves-scale-0": 8}) as (emulator, azurite):
        asyncio.run(measure(emulator.connection_string, azurite.connection_string, log_dir))
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from eventprocessor.cli.user_errors import CommandError

__all__ = ["azurite", "azurite_and_emulator", "logs"]


@contextlib.contextmanager
def logs(name: str, keep: str | None) -> Iterator[str]:
    """The folder for the workers' logs: ``keep`` (created, left in place) when the user gave
    one (``--log-dir``), else a temporary folder removed on exit."""
    if keep:
        os.makedirs(keep, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix=f"{name}-bench-") as scratch:
        yield scratch


@contextlib.contextmanager
def azurite() -> Iterator[Any]:
    """A fresh Azurite (in-memory) on free loopback ports; yields it (``.connection_string``,
    ``.process``)."""
    from eventprocessor.emulators.azurite import AzuriteUnavailable, start_azurite

    try:
        started = start_azurite()
    except AzuriteUnavailable as error:
        raise CommandError(f"Azurite could not start: {error}") from error
    try:
        yield started
    finally:
        started.stop()


@contextlib.contextmanager
def azurite_and_emulator(args: Sequence[str] = (), *, hubs: Mapping[str, int] | None = None
                         ) -> Iterator[tuple[Any, Any]]:
    """Azurite, then the Event Hubs emulator started with ``args`` and, when ``hubs`` is given,
    a ``Config.json`` that declares those hubs (name -> partition count); yields
    (emulator, azurite)."""
    from eventprocessor.emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process

    with azurite() as storage, tempfile.TemporaryDirectory(prefix="emulator-config-") as scratch:
        options = list(args)
        if hubs is not None:
            path = os.path.join(scratch, "Config.json")
            entities = [{"Name": name, "PartitionCount": str(partitions)} for name, partitions in hubs.items()]
            with open(path, "w") as handle:
                json.dump({"UserConfig": {"NamespaceConfig": [{"Type": "EventHub", "Name": "emulatorNs1",
                                                               "Entities": entities}]}}, handle)
            options += ["--config", path]
        try:
            emulator = start_emulator_process(options)
        except EmulatorUnavailable as error:
            raise CommandError(str(error)) from error
        try:
            yield emulator, storage
        finally:
            emulator.stop()
