"""The services a process benchmark starts for itself: Azurite and the Event Hubs emulator
on 127.0.0.1, with a scratch directory for the emulator's configuration and the workers'
logs.

Example (the body of a benchmark's ``_run``)::

    measured = services.with_azurite_and_emulator(
        "moves", args.log_dir, lambda path: _config(path, args.rounds),
        lambda hub_conn, storage_conn, log_dir: asyncio.run(_measure(args, hub_conn, storage_conn, log_dir)))
    if measured is None:
        return 2  # one could not start; the reason is printed
"""
from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from typing import TypeVar

__all__ = ["with_azurite_and_emulator"]

_T = TypeVar("_T")


def with_azurite_and_emulator(name: str, log_dir: str | None, config: Callable[[str], str],
                              measure: Callable[[str, str, str], _T]) -> _T | None:
    """Start Azurite, then the emulator with the ``Config.json`` that ``config(path)``
    writes at ``path`` (and returns), run ``measure(hub_connection_string,
    storage_connection_string, log_dir)``, and stop both whatever happens. ``log_dir``
    keeps the workers' logs (``None``: a temporary directory, removed). Returns what
    ``measure`` returned, or ``None`` after one line on stderr saying which service could
    not start and why."""
    from eventprocessor.emulators.azurite import AzuriteUnavailable, start_azurite
    from eventprocessor.emulators.eventhubs.process import EmulatorUnavailable, start_emulator_process

    if log_dir:
        os.makedirs(log_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}-bench-") as scratch:
        try:
            azurite = start_azurite()
        except AzuriteUnavailable as error:
            print(f"{name}: Azurite could not start: {error}", file=sys.stderr)
            return None
        try:
            emulator = start_emulator_process(["--config", config(os.path.join(scratch, "Config.json"))])
        except EmulatorUnavailable as error:
            azurite.stop()
            print(f"{name}: {error}", file=sys.stderr)
            return None
        try:
            return measure(emulator.connection_string, azurite.connection_string, log_dir or scratch)
        finally:
            emulator.stop()
            azurite.stop()
