"""The demo's checkpoint store: in memory, or Blob or Table storage on a local Azurite (the
one running on its default ports, else one started for the demo and stopped with it)."""
from __future__ import annotations

import asyncio
import shlex
import uuid
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from rich.console import Console

from eventprocessor import CheckpointStore
from eventprocessor.errors import StoreTimeoutError
from eventprocessor.sources import EventSource

from ..user_errors import CommandError, require_azurite
from .display import say

if TYPE_CHECKING:  # pragma: no cover
    from eventprocessor.emulators.azurite import Azurite

    from .model import DemoConfig

__all__ = ["AZURITE_PORTS", "open_store", "status_command"]

# Azurite's default ports (blob, queue, table): an Azurite already running there is used.
AZURITE_PORTS = (10000, 10001, 10002)
STORE_PROBE_TIMEOUT = 15.0


async def open_store(config: DemoConfig, console: Console,
                     stack: AsyncExitStack) -> tuple[CheckpointStore, str, Azurite | None]:
    """The demo's store; what it starts is stopped by ``stack``, on every exit path."""
    if config.store == "memory":
        from eventprocessor.stores import InMemoryCheckpointStore

        return InMemoryCheckpointStore(), "in-memory store", None
    purpose = f"`eventprocessor demo --store {config.store}`"
    from eventprocessor.emulators.azurite import Azurite, port_open, start_azurite

    if port_open(AZURITE_PORTS[0]) and port_open(AZURITE_PORTS[2]):
        emulator = Azurite(*AZURITE_PORTS)
        started = False
    else:
        require_azurite(purpose)
        emulator = start_azurite()
        stack.callback(emulator.stop)
        started = True
    store, location = await _azure_store(config.store, emulator)
    stack.push_async_callback(store.close)
    if started:
        pid = emulator.process.pid if emulator.process is not None else "?"
        say(console, f"Store: no Azurite was running; started one (pid {pid}) at 127.0.0.1:{emulator.blob_port} "
                     f"(blob), 127.0.0.1:{emulator.table_port} (table); it stops when the demo ends")
    else:
        say(console, f"Store: using the Azurite already running at 127.0.0.1:{emulator.blob_port} (blob), "
                     f"127.0.0.1:{emulator.table_port} (table)")
    return store, location, emulator


async def _azure_store(kind: str, emulator: Azurite) -> tuple[CheckpointStore, str]:
    """A Blob or Table store (``kind``) on ``emulator``, after a check shows that it can be used."""
    if kind == "blob":
        from eventprocessor.stores import BlobCheckpointStore

        name, port = f"demo-{uuid.uuid4().hex[:12]}", emulator.blob_port
        store: CheckpointStore = BlobCheckpointStore.from_connection_string(emulator.connection_string, name)
    else:
        from eventprocessor.stores import TableCheckpointStore

        name, port = f"demo{uuid.uuid4().hex[:12]}", emulator.table_port  # table names: letters and digits
        store = TableCheckpointStore.from_connection_string(emulator.connection_string, name)
    try:
        await asyncio.wait_for(store.check(), STORE_PROBE_TIMEOUT)
    except Exception as error:
        await store.close()
        problem = " ".join(str(error).split()) or type(error).__name__
        where = f"127.0.0.1:{port}"
        if emulator.started_here:
            raise CommandError(f"the Azurite started at {where} cannot be used ({problem}); run again with --debug "
                               "for details") from error
        if isinstance(error, (asyncio.TimeoutError, StoreTimeoutError)):
            raise CommandError(
                f"the service on {where} does not answer as Azurite {kind.title()} storage ({problem}): stop it, or "
                f"free ports {AZURITE_PORTS[0]}-{AZURITE_PORTS[2]} so that the demo starts its own Azurite") from error
        raise CommandError(
            f"the Azurite already running at {where} cannot be used: {problem}. Restart it as `eventprocessor "
            f"azurite` does, or stop it so that the demo starts its own") from error
    return store, f"{kind} {name} @ 127.0.0.1:{port}"


def status_command(source: EventSource, store: CheckpointStore, emulator: Azurite | None,
                   config: DemoConfig, eventhub_connection_string: str | None = None) -> str | None:
    """The ``eventprocessor status`` command line that watches the demo's group from
    another terminal, or None for the in-memory store (it lives in this process only)."""
    if emulator is None:
        return None
    if config.store == "blob":
        where = ["--container", shlex.quote(str(getattr(store, "container_name", None)))]
    else:
        where = ["--store", "table", "--table", shlex.quote(str(getattr(store, "table_name", None)))]
    # Azurite's well-known development key, not a secret; on its default ports, the short form.
    default_ports = (emulator.blob_port, emulator.table_port) == (AZURITE_PORTS[0], AZURITE_PORTS[2])
    account = "UseDevelopmentStorage=true" if default_ports else emulator.connection_string
    words = [f"EVENTPROCESSOR_STORE_CONNECTION_STRING={shlex.quote(account)}"]
    if eventhub_connection_string:
        words.append(f"EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING={shlex.quote(eventhub_connection_string)}")
    words += ["eventprocessor", "status", "--namespace", shlex.quote(source.fully_qualified_namespace),
              "--eventhub", shlex.quote(source.eventhub_name), *where, "--expiration", f"{config.expiration:g}",
              "--watch"]
    return " ".join(words)


