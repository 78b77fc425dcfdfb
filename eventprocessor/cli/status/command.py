"""``eventprocessor status`` itself: the store and the event hub from the options,
``--watch`` and ``--json``."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from eventprocessor.errors import ConfigurationError
from eventprocessor.sources import EventSource
from eventprocessor.stores.contract import CheckpointStore

from ..user_errors import CommandError, require
from .model import GroupStatus
from .reading import read_status
from .rendering import render

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console


__all__ = ["EVENTHUB_CONNECTION_STRING_ENV", "STORE_ACCOUNT_KEY_ENV", "STORE_CONNECTION_STRING_ENV",
           "STORE_SAS_TOKEN_ENV", "StatusOptions", "run_status"]

logger = logging.getLogger(__name__)

STORE_CONNECTION_STRING_ENV = "EVENTPROCESSOR_STORE_CONNECTION_STRING"
STORE_ACCOUNT_KEY_ENV = "EVENTPROCESSOR_STORE_ACCOUNT_KEY"
STORE_SAS_TOKEN_ENV = "EVENTPROCESSOR_STORE_SAS_TOKEN"
EVENTHUB_CONNECTION_STRING_ENV = "EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING"
# Closing a client talks to the service too; never let it hold the command up.
CLOSE_TIMEOUT = 5.0


@dataclass(frozen=True)
class StatusOptions:
    """The options of ``eventprocessor status`` (see its ``--help``)."""

    namespace: str | None = None
    eventhub: str | None = None
    consumer_group: str = "$default"
    store: str = "blob"
    connection_string: str | None = None
    account_url: str | None = None
    credential: str = "default"
    account_key: str | None = None
    sas_token: str | None = None
    container: str | None = None
    table: str | None = None
    eventhub_connection_string: str | None = None
    eventhub_credential: str | None = None
    expiration: float = 60.0
    timeout: float = 10.0
    as_json: bool = False
    watch: bool = False
    watch_interval: float = 2.0
    watch_count: int | None = None

    def __repr__(self) -> str:  # the dataclass default would show the secrets
        return (f"StatusOptions(namespace={self.namespace!r}, eventhub={self.eventhub!r}, "
                f"consumer_group={self.consumer_group!r}, store={self.store!r})")


def _store_credential(options: StatusOptions, closers: list[Any]) -> Any:
    if options.credential == "key":
        if not options.account_key:
            raise CommandError(f"--credential key needs the account key: set {STORE_ACCOUNT_KEY_ENV} "
                               "(or pass --account-key)")
        return options.account_key
    if options.credential == "sas":
        if not options.sas_token:
            raise CommandError(f"--credential sas needs a SAS token: set {STORE_SAS_TOKEN_ENV} (or pass --sas-token)")
        return options.sas_token
    if options.credential == "none":
        return None
    require(purpose="--credential default", packages=[("azure.identity", "azure-identity")])
    from azure.identity.aio import DefaultAzureCredential

    credential = DefaultAzureCredential()
    closers.append(credential)
    return credential


def _open_store(options: StatusOptions, closers: list[Any]) -> CheckpointStore:
    """The store the options name; nothing is sent until it is read."""
    if options.connection_string and options.account_url:
        raise CommandError(f"give the store either by connection string (--connection-string or "
                           f"{STORE_CONNECTION_STRING_ENV}) or by --account-url, not both")
    if not options.connection_string and not options.account_url:
        raise CommandError(f"which store? set {STORE_CONNECTION_STRING_ENV} (or pass --connection-string), "
                           "or pass --account-url with --credential")
    name_option, name = ("--container", options.container) if options.store == "blob" else ("--table", options.table)
    if not name:
        raise CommandError(f"--store {options.store} needs {name_option} (where the processors keep their records)")
    require(purpose=f"`eventprocessor status --store {options.store}`", extras=[options.store])
    try:
        if options.store == "blob":
            from eventprocessor.stores.blob import BlobCheckpointStore

            if options.connection_string:
                return BlobCheckpointStore.from_connection_string(options.connection_string, name)
            return BlobCheckpointStore(options.account_url or "", name, credential=_store_credential(options, closers))
        from eventprocessor.stores.table import TableCheckpointStore

        if options.connection_string:
            return TableCheckpointStore.from_connection_string(options.connection_string, name)
        return TableCheckpointStore(options.account_url or "", name, credential=_store_credential(options, closers))
    except ConfigurationError as error:
        raise CommandError(f"the store options are not valid: {' '.join(str(error).split())}") from None


def _open_source(options: StatusOptions, closers: list[Any]) -> tuple[EventSource | None, str | None, str, str]:
    """The event hub to read lag from (or None and why not), and the namespace and hub
    name to look up (from the options, else from the Event Hubs connection string)."""
    namespace, eventhub = options.namespace, options.eventhub
    if not options.eventhub_connection_string and not options.eventhub_credential:
        if not namespace or not eventhub:
            raise CommandError("which group? pass --namespace (fully qualified, as the records are keyed, e.g. "
                               "myns.servicebus.windows.net) and --eventhub")
        return None, (f"lag: unknown (no Event Hubs connection given: set {EVENTHUB_CONNECTION_STRING_ENV} or pass "
                      "--eventhub-credential default)"), namespace, eventhub
    from eventprocessor.cli.user_errors import install_command, missing_modules

    if missing_modules(["azure.eventhub"]):
        if not namespace or not eventhub:
            raise CommandError("pass --namespace and --eventhub (reading them from the Event Hubs connection string "
                               f"needs the [eventhub] extra: run `{install_command(['eventhub'])}`)")
        return None, (f"lag: unknown (reading the event hub needs the [eventhub] extra: run "
                      f"`{install_command(['eventhub'])}`)"), namespace, eventhub
    from eventprocessor.sources.eventhub import EventHubSource

    source: EventSource
    try:
        if options.eventhub_connection_string:
            source = EventHubSource.from_connection_string(options.eventhub_connection_string, eventhub_name=eventhub)
        else:
            if not namespace or not eventhub:
                raise CommandError("--eventhub-credential default needs --namespace and --eventhub")
            require(purpose="--eventhub-credential default", packages=[("azure.identity", "azure-identity")])
            from azure.identity.aio import DefaultAzureCredential

            credential = DefaultAzureCredential()
            closers.append(credential)
            source = EventHubSource(namespace, eventhub, credential)
    except ConfigurationError as error:
        raise CommandError(f"the Event Hubs options are not valid: {' '.join(str(error).split())}") from None
    closers.append(source)
    return source, None, namespace or source.fully_qualified_namespace, source.eventhub_name


async def _close(closers: Sequence[Any]) -> None:
    # Clients first, then the credentials they use.
    for closer in sorted(closers, key=lambda closer: hasattr(closer, "get_token")):
        try:
            await asyncio.wait_for(closer.close(), CLOSE_TIMEOUT)
        except Exception:  # closing is best effort: the command's answer is already out
            logger.debug("closing %s failed", type(closer).__name__, exc_info=True)


def _console() -> Console:
    from rich.console import Console

    # Piped output is not wrapped at rich's default 80 columns: a row per line reads and
    # greps better. COLUMNS still wins.
    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 200
    return Console(width=width)


async def _watch(options: StatusOptions, read: Any, console: Console) -> None:
    from rich.live import Live
    from rich.rule import Rule
    from rich.text import Text

    refreshes = 0
    live: Live | None = None
    last: GroupStatus | None = None
    try:
        while options.watch_count is None or refreshes < options.watch_count:
            started = time.monotonic()
            stamp = time.strftime("%H:%M:%S")
            try:
                status = await read()
                last, problem = status, None
            except CommandError as error:
                if last is None:
                    raise  # nothing to show yet: the options are probably wrong
                problem = f"refresh at {stamp} failed: {error}; showing the status read before"
            refreshes += 1
            if options.as_json:
                document = last.to_json() if last is not None else {}
                print(json.dumps({**document, "refreshed": stamp, "refresh_error": problem}), flush=True)
            else:
                assert last is not None
                view = render(last, refreshed=f"refreshed {stamp}, every {options.watch_interval:g} s, Ctrl-C to stop")
                if problem:
                    from rich.console import Group

                    view = Group(view, Text(problem, style="bold red"))
                if console.is_terminal:
                    if live is None:
                        live = Live(view, console=console, auto_refresh=False, screen=False)
                        live.start()
                    live.update(view, refresh=True)
                else:
                    console.print(Rule(f"refresh {refreshes} at {stamp}"))
                    console.print(view)
            if options.watch_count is not None and refreshes >= options.watch_count:
                break
            await asyncio.sleep(max(0.0, options.watch_interval - (time.monotonic() - started)))
    finally:
        if live is not None:
            live.stop()


def run_status(options: StatusOptions) -> None:
    """Run ``eventprocessor status`` with ``options``: print the status once, or refresh
    it every ``watch_interval`` seconds with ``watch``. User errors raise ``CommandError``.

    Example::

        run_status(StatusOptions(namespace="ns.servicebus.windows.net", eventhub="telemetry",
                                 connection_string=conn_str, container="checkpoints"))
    """
    closers: list[Any] = []
    source, lag_note, namespace, eventhub = _open_source(options, closers)
    store = _open_store(options, closers)
    closers.append(store)
    console = _console()

    async def read() -> GroupStatus:
        return await read_status(store, namespace, eventhub, options.consumer_group, source=source,
                                 expiration=options.expiration, timeout=options.timeout, lag_note=lag_note)

    async def main() -> None:
        try:
            if options.watch:
                await _watch(options, read, console)
            elif options.as_json:
                print(json.dumps((await read()).to_json(), indent=2))
            else:
                console.print(render(await read()))
        finally:
            await _close(closers)

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        if not options.watch:
            raise
    except BrokenPipeError:  # `status --json | head`: the reader has what it wanted
        # Python flushes stdout again at exit; point it at nothing so that it stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
