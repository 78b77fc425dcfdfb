"""The ``eventprocessor`` command line: ``demo``, ``status``, ``emulator``, ``azurite``,
``postgres``, ``send`` and ``bench``.

One function per command, each registered on :data:`main` (or on the ``bench`` group).
A command checks what it needs before it starts (extras, tools, services; see
:mod:`eventprocessor.cli.user_errors`). A failure a user can fix ends in one line on
stderr that says what to do, and a non-zero exit; ``--debug`` shows the traceback
instead. ``--help`` works without any extra installed. Every numeric option has a
range. A command that starts a service stops it on every way out, SIGTERM included
(:mod:`eventprocessor.cli.running`).
"""
from __future__ import annotations

import asyncio
import importlib
import logging
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from eventprocessor import LoadBalancingStrategy, __version__

from .running import Interrupted, run, sigterm_interrupts
from .user_errors import CommandError, one_line_message, source_checkout

logger = logging.getLogger(__name__)

DEBUG_ENVIRONMENT_VARIABLE = "EVENTPROCESSOR_DEBUG"
_DEBUG_KEY = "eventprocessor.debug"

# Each benchmark is benchmarks/<name>.py (or the package benchmarks/<name>/); its command is the name with
# dashes (store_bench -> ``eventprocessor bench store-bench``). The underscore spelling
# is accepted too.
BENCHMARKS = {
    "convergence": "Rebalance convergence: this SDK vs azure-eventhub's load balancer, simulated.",
    "throughput": "Events/s through an EventProcessor vs a bare asyncio loop.",
    "decode": "Per-event cost of turning a received AMQP message into an Event, vs azure-eventhub's EventData.",
    "store_bench": "Checkpoint-store throughput on Azurite vs the official blob store and a bare-SDK floor.",
    "spark_sink": "Rows/s through the Spark sink vs Spark's own path for the same batches, pipelined the same way.",
    "spark_source": ("Rows/s from Event Hubs into Parquet through the Spark source vs the official consumer "
                     "and the sink."),
    "faults": "Recovery from store faults, crashes and hung handlers against their documented bounds.",
    "e2e": "End to end over AMQP: this SDK vs azure-eventhub's consumer on the Event Hubs emulator.",
    "moves": "Scale-out, scale-in, rolling restart and a crash as OS processes: duplicates, pauses vs azure-eventhub.",
    "scale": "Many processors as OS processes on Azurite, sized from the measured listing cost, vs azure-eventhub.",
    "load": "One hot partition, then a slowed process, as capped OS processes: balancing by count vs by load vs "
            "azure-eventhub.",
    "state": "Stateful partitions: pause of a planned move at 1, 16, 64 MB of state, warm-up vs naive restore.",
    "soak": "Resident memory of a long-running consumer over millions of events, vs azure-eventhub's consumer.",
    "postgres_sink": ("Rows/s into PostgreSQL exactly once vs a bare COPY loop and insert-then-checkpoint, "
                      "duplicates after SIGKILL; PostgreSQL vs Blob store checkpoints/s."),
    "concurrency": "Many events in flight per partition vs one at a time and gather per batch, against the limit.",
}


def _debugging(ctx: click.Context | None) -> bool:
    if os.environ.get(DEBUG_ENVIRONMENT_VARIABLE, "") not in ("", "0"):
        return True
    return bool(ctx is not None and ctx.meta.get(_DEBUG_KEY))


class _OneLineErrors(click.Group):
    """A group whose subcommands' failures end in one ``Error:`` line, not a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with sigterm_interrupts():  # finally blocks run, and stop what the command started
                return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise
        except Exception as error:
            if _debugging(ctx):
                raise
            message = one_line_message(error)
            if message is None:
                logger.debug("unexpected failure", exc_info=True)
                message = (f"unexpected {type(error).__name__}: {' '.join(str(error).split())} "
                           "(run again with `eventprocessor --debug ...` to see the traceback)")
            raise click.ClickException(message) from None


class _BenchmarkGroup(_OneLineErrors):
    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, cmd_name.replace("_", "-"))


@click.group(cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="eventprocessor")
@click.option("-v", "--verbose", count=True, help="More log output (-v info, -vv debug).")
@click.option("--debug", is_flag=True,
              help=f"Show the full traceback of a failure (or set {DEBUG_ENVIRONMENT_VARIABLE}=1).")
@click.pass_context
def main(ctx: click.Context, verbose: int, debug: bool) -> None:
    """Run consumers of a partitioned event stream with balanced, fenced ownership."""
    ctx.meta[_DEBUG_KEY] = debug
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@main.command()
@click.option("--partitions", default=16, show_default=True, type=click.IntRange(1, 4096), help="Partitions.")
@click.option("--processors", default=4, show_default=True, type=click.IntRange(1, 256),
              help="Processors in this process.")
@click.option("--strategy", type=click.Choice(["greedy", "balanced"]), default="greedy",
              show_default=True, help="Greedy takes the fair share at once, balanced one new partition per tick.")
@click.option("--interval", type=click.FloatRange(min=0.01),
              help="Load-balancing interval in seconds.  [default: 0.5; 2 with --store blob or table]")
@click.option("--expiration", type=click.FloatRange(min=0.05),
              help="Ownership expiration in seconds (failover waits this long after a crash).  "
                   "[default: 4; 12 with --store blob or table]")
@click.option("--rate", default=400.0, show_default=True, type=click.FloatRange(min=0),
              help="Events per second the producer sends (0 = as fast as it can).")
@click.option("--store", type=click.Choice(["memory", "blob", "table"]), default="memory", show_default=True,
              help="The checkpoint store: in this process, or Blob or Table storage on a local Azurite (the one on "
                   "its default ports, else one started for the demo).")
@click.option("--source", type=click.Choice(["memory", "emulator"]), default="memory", show_default=True,
              help="The events: an in-process log, or the real AMQP path (EventHubSource on a local Event Hubs "
                   "emulator, fed by azure-eventhub's producer).")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Give up on a phase after this many seconds.")
def demo(partitions: int, processors: int, strategy: str, interval: float | None, expiration: float | None,
         rate: float, store: str, source: str, timeout: float) -> None:
    """Producer and processors in one process: convergence, scale-in, crash, failover.

    Ends with a summary of events produced, processed, lost (must be 0) and
    duplicated. Exits 1 if any event was lost. With --store blob or table it prints
    the `eventprocessor status` command that watches it from another terminal.
    """
    from rich.console import Console

    from .demo import DemoConfig, default_timing, run_demo, summary_table

    default_interval, default_expiration = default_timing(store)
    interval = default_interval if interval is None else interval
    expiration = default_expiration if expiration is None else expiration
    if expiration <= interval:
        raise click.BadParameter("must be longer than --interval", param_hint="--expiration")
    console = Console()
    config = DemoConfig(partitions=partitions, processors=processors, strategy=LoadBalancingStrategy(strategy),
                        interval=interval, expiration=expiration, rate=rate, store=store, source=source,
                        timeout=timeout)
    try:
        result = run(run_demo(config, console))
    except Interrupted as stopped:
        sys.exit(stopped.exit_code)
    except (TimeoutError, RuntimeError) as error:
        raise click.ClickException(str(error)) from None
    console.print(summary_table(result))
    if result.lost:
        console.print(f"[red]{result.lost} events were lost[/]")
        sys.exit(1)


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=5672, show_default=True, type=click.IntRange(0, 65535),
              help="Port; 0 picks a free one.")
@click.option("--eventhub", "eventhubs", multiple=True, metavar="NAME", help="An event hub to serve (repeatable).")
@click.option("--partitions", default=2, show_default=True, type=click.IntRange(1, 1024),
              help="Partitions of each --eventhub.")
@click.option("--consumer-group", "consumer_groups", multiple=True, metavar="NAME",
              help="A consumer group of each --eventhub (repeatable; $Default always exists).")
@click.option("--config", "config_path", type=click.Path(exists=True, dir_okay=False),
              help="Microsoft's Event Hubs emulator Config.json.")
@click.option("--max-events-per-partition", default=100_000, show_default=True, type=click.IntRange(min=1),
              help="Events kept per partition; the oldest are dropped first.")
@click.option("--retention", default=3600.0, show_default=True, type=click.FloatRange(min=0.001),
              help="Seconds an event is kept.")
def emulator(host: str, port: int, eventhubs: tuple[str, ...], partitions: int, consumer_groups: tuple[str, ...],
             config_path: str | None, max_events_per_partition: int, retention: float) -> None:
    """A local Event Hubs emulator the official azure-eventhub clients use unchanged.

    Once it accepts connections it prints connection strings, a line each: the
    namespace's, then one per event hub, with its EntityPath (what the Spark source
    and `eventprocessor status` take). Stops on SIGINT or SIGTERM. Without --eventhub
    or --config it serves the hub the docs' examples and the samples read, telemetry,
    with --partitions partitions and consumer group cg1.
    """
    from eventprocessor.emulators.eventhubs import EmulatorConfig, EmulatorConfigError, EventHubsEmulator, serve

    try:
        if config_path:
            config = EmulatorConfig.from_file(config_path, max_events_per_partition=max_events_per_partition,
                                              retention_seconds=retention)
        else:
            config = EmulatorConfig(max_events_per_partition=max_events_per_partition, retention_seconds=retention)
        hub_emulator = EventHubsEmulator(config, eventhubs=eventhubs, partitions=partitions,
                                         consumer_groups=consumer_groups, host=host, port=port)
    except EmulatorConfigError as error:
        raise click.ClickException(str(error)) from None
    try:
        asyncio.run(serve(hub_emulator))
    except OSError as error:
        raise click.ClickException(f"cannot listen on {host}:{port}: {error.strerror}") from None


@main.command()
@click.option("--blob-port", default=10000, show_default=True, type=click.IntRange(0, 65535),
              help="Blob service port; 0 picks a free one.")
@click.option("--queue-port", default=10001, show_default=True, type=click.IntRange(0, 65535),
              help="Queue service port; 0 picks a free one.")
@click.option("--table-port", default=10002, show_default=True, type=click.IntRange(0, 65535),
              help="Table service port; 0 picks a free one.")
@click.option("--location", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the data in this directory. Default: in memory (gone when it stops).")
def azurite(blob_port: int, queue_port: int, table_port: int, location: Path | None) -> None:
    """Azurite, the Azure Storage emulator, on 127.0.0.1 with the flags this SDK needs.

    Starts node_modules/.bin/azurite (`npm ci` in the checkout installs it) with
    --skipApiVersionCheck (without it, every call of the current azure-storage SDKs
    fails with HTTP 400 InvalidHeaderValue) and --loose, on Azurite's default ports,
    where UseDevelopmentStorage=true finds it. Prints one line, the connection string,
    once it accepts connections; stops on Ctrl-C or SIGTERM.
    """
    from eventprocessor.emulators.azurite import AzuriteUnavailable, port_open, start_azurite

    from .user_errors import require_azurite

    busy = [port for port in (blob_port, queue_port, table_port) if port and port_open(port)]
    if busy:
        raise CommandError(f"127.0.0.1:{busy[0]} is in use (an Azurite already running?): stop it, or choose other "
                           "ports with --blob-port, --queue-port and --table-port (0 picks a free one)")
    require_azurite("`eventprocessor azurite`")
    if location is not None:
        location.mkdir(parents=True, exist_ok=True)
    try:
        emulator = start_azurite(ports=(blob_port, queue_port, table_port), location=location)
    except AzuriteUnavailable as error:
        raise CommandError(f"Azurite did not start: {' '.join(str(error).split())}") from None
    try:
        click.echo(emulator.connection_string)
        assert emulator.process is not None
        code = emulator.process.wait()
        raise CommandError(f"Azurite exited by itself with code {code}")
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()


@main.command()
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port on 127.0.0.1; 0 picks a free one.")
@click.option("--location", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the cluster in this directory (initdb when empty, reused otherwise). Default: a temporary "
                   "directory, removed when it stops.")
@click.option("--setting", "settings", multiple=True, metavar="NAME=VALUE",
              help="A postgresql.conf setting, such as fsync=off (repeatable).")
def postgres(port: int, location: Path | None, settings: tuple[str, ...]) -> None:
    """A local PostgreSQL for the PostgreSQL store and sink, from the server binaries here.

    Runs initdb and pg_ctl (the `postgresql` package: `apt-get install postgresql`) into a
    temporary directory, as the `postgres` system user when run as root, listening on
    127.0.0.1 only with trust authentication: for development and tests, not production.
    Prints one line, the DSN (postgresql://postgres@127.0.0.1:PORT/postgres), once it
    accepts connections; stops it on Ctrl-C or SIGTERM.
    """
    import time

    from eventprocessor.emulators.ports import port_open
    from eventprocessor.emulators.postgres import PostgresUnavailable, start_postgres

    if port and port_open(port):
        raise CommandError(f"127.0.0.1:{port} is in use (a PostgreSQL already running?): stop it, or choose another "
                           "port with --port (0 picks a free one)")
    values = {}
    for setting in settings:
        name, equals, value = setting.partition("=")
        if not equals or not name.strip():
            raise click.BadParameter(f"{setting!r} is not NAME=VALUE", param_hint="--setting")
        values[name.strip()] = value.strip()
    try:
        server = start_postgres(port=port, location=location, settings=values)
    except PostgresUnavailable as error:
        raise CommandError(f"PostgreSQL did not start: {' '.join(str(error).split())}") from None
    try:
        click.echo(server.dsn)
        while server.running:
            time.sleep(0.5)
        raise CommandError(f"PostgreSQL stopped by itself; its log: {server.log_path}")
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


_SEND_EPILOG = """\b
Examples:
  eventprocessor send                               # 10 events to telemetry on the local emulator
  eventprocessor send --count 1000 --rate 100 --partition-key 'device-{i}'
  eventprocessor send --lines readings.jsonl --partition-key '{device}'
  EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING='Endpoint=sb://...;EntityPath=orders' eventprocessor send --count 5

\b
Templates are Python format strings over each event's fields: {i} (its number in this
run, from 0), {time} (UTC, ISO 8601) and, with --lines, {line} and the top-level
fields of a line that is a JSON object.
"""


@main.command(epilog=_SEND_EPILOG)
@click.option("--eventhub-connection-string", envvar="EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING", show_envvar=True,
              metavar="TEXT", help="Event Hubs connection string. Prefer the variable.  [default: the local "
                                   "emulator on 127.0.0.1:5672]")
@click.option("--eventhub", metavar="NAME", help="Event hub name.  [default: the connection string's EntityPath; "
                                                 "telemetry on the local emulator]")
@click.option("--count", default=10, show_default=True, type=click.IntRange(min=1),
              help="Events to send (with --lines: every line instead).")
@click.option("--rate", default=0.0, show_default=True, type=click.FloatRange(min=0),
              help="Events per second (0 = as fast as the hub takes them).")
@click.option("--partition-key", metavar="TEMPLATE",
              help="Partition key of each event: events with the same key go to the same partition, in order.  "
                   "[default: none, the hub spreads them]")
@click.option("--partition-id", metavar="ID", help="Send every event to this partition.")
@click.option("--body", default="event {i}", show_default=True, metavar="TEMPLATE", help="Body of each event.")
@click.option("--lines", type=click.File("r"), metavar="FILE",
              help="Send each line of FILE as an event's body (- reads standard input).")
def send(eventhub_connection_string: str | None, eventhub: str | None, count: int, rate: float,
         partition_key: str | None, partition_id: str | None, body: str, lines: Any) -> None:
    """Send events to an event hub: the local emulator unless told otherwise.

    A producer for trying things out: --count events whose bodies come from the --body
    template, or one per line of --lines, at --rate events per second or as fast as
    the hub takes them, through azure-eventhub's own producer (needs [eventhub]).
    Prints one line at the end: how many events it sent, to which hub.
    """
    from .send import SendOptions, run_send

    run_send(SendOptions(connection_string=eventhub_connection_string, eventhub=eventhub, count=count, rate=rate,
                         partition_key=partition_key, partition_id=partition_id, body=body, lines=lines))


_STATUS_EPILOG = """\b
Examples:
  export EVENTPROCESSOR_STORE_CONNECTION_STRING='DefaultEndpointsProtocol=https;AccountName=...'
  eventprocessor status --namespace myns.servicebus.windows.net --eventhub telemetry \\
      --container checkpoints --watch
  eventprocessor status --namespace myns.servicebus.windows.net --eventhub telemetry \\
      --account-url https://acct.blob.core.windows.net --credential default --container checkpoints --json
  EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING='Endpoint=sb://...' eventprocessor status --container checkpoints

\b
Secrets are read from the environment (a command line shows in process listings):
  EVENTPROCESSOR_STORE_CONNECTION_STRING, EVENTPROCESSOR_STORE_ACCOUNT_KEY,
  EVENTPROCESSOR_STORE_SAS_TOKEN, EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING.
They are never printed.
"""


@main.command(epilog=_STATUS_EPILOG)
@click.option("--namespace", metavar="FQDN",
              help="Fully qualified Event Hubs namespace the records are keyed by (myns.servicebus.windows.net). "
                   "Default: the one in the Event Hubs connection string.")
@click.option("--eventhub", metavar="NAME",
              help="Event hub name. Default: EntityPath of the Event Hubs connection string.")
@click.option("--consumer-group", default="$default", show_default=True, help="Consumer group.")
@click.option("--store", type=click.Choice(["blob", "table"]), default="blob", show_default=True,
              help="Checkpoint store kind: Azure Blob (needs [blob]) or Table storage (needs [table]).")
@click.option("--connection-string", envvar="EVENTPROCESSOR_STORE_CONNECTION_STRING", show_envvar=True,
              metavar="TEXT",
              help="Storage connection string (Azurite: UseDevelopmentStorage=true). Prefer the variable.")
@click.option("--account-url", metavar="URL", help="Storage service URL (https://acct.blob.core.windows.net), "
                                                  "instead of a connection string; with --credential.")
@click.option("--credential", type=click.Choice(["default", "key", "sas", "none"]), default="default",
              show_default=True, help="With --account-url: DefaultAzureCredential (azure-identity), the account key, "
                                      "a SAS token, or none (a SAS in the URL).")
@click.option("--account-key", envvar="EVENTPROCESSOR_STORE_ACCOUNT_KEY", show_envvar=True, metavar="KEY",
              help="Account key for --credential key. Prefer the variable.")
@click.option("--sas-token", envvar="EVENTPROCESSOR_STORE_SAS_TOKEN", show_envvar=True, metavar="TOKEN",
              help="SAS token for --credential sas. Prefer the variable.")
@click.option("--container", metavar="NAME", help="Blob container of the records (--store blob).")
@click.option("--table", metavar="NAME", help="Table of the records (--store table).")
@click.option("--eventhub-connection-string", envvar="EVENTPROCESSOR_EVENTHUB_CONNECTION_STRING", show_envvar=True,
              metavar="TEXT", help="Event Hubs connection string, to show the newest events and the lag (needs "
                                   "[eventhub]). Prefer the variable.")
@click.option("--eventhub-credential", type=click.Choice(["default"]),
              help="Read the newest events and the lag from --namespace with DefaultAzureCredential.")
@click.option("--expiration", default=75.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="The processors' partition_ownership_expiration_interval, in seconds: a record older than this "
                   "(on the store's clock) is shown expired.")
@click.option("--timeout", default=10.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Give up on the store or the event hub after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (one document per refresh with --watch).")
@click.option("--watch", is_flag=True, help="Refresh in place until Ctrl-C.")
@click.option("--watch-interval", default=2.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds between refreshes with --watch.")
@click.option("--watch-count", type=click.IntRange(min=1), help="With --watch: stop after this many refreshes.")
def status(**options: Any) -> None:
    """Show a live consumer group: who owns what, checkpoints, lag.

    Reads the group's records from its checkpoint store (nothing is written). For each
    partition: owner, state (owned, expired, released, unclaimed, unreadable; a pending
    handoff), epoch, lease age on the store's clock, checkpoint (sequence number, offset,
    age) and, with an Event Hubs connection, the last enqueued sequence number and the
    lag (events after the checkpoint). For each member: live or gone, partitions owned,
    expired records still naming it, heartbeat age and properties (when the store keeps
    member records). Then one summary line: owned, unowned, expired, imbalance, lag.

    Without an Event Hubs connection, or when the hub cannot be reached, lag is shown as
    unknown with the reason. An unreachable store ends the command with one line and
    exit status 1 within --timeout.
    """
    from .status import StatusOptions, run_status

    run_status(StatusOptions(**options))


def _import_benchmark(name: str) -> ModuleType:
    """``benchmarks.<name>`` from the source checkout this package runs from, whatever the cwd."""
    checkout = source_checkout()
    if checkout is None or not (checkout / "benchmarks" / "__init__.py").is_file():
        raise CommandError("the benchmarks come with a source checkout, not with the installed package: "
                           "clone the repository and run `pip install -e .` in it")
    package_dir = checkout / "benchmarks"
    loaded = sys.modules.get("benchmarks")
    if loaded is None:
        # First on the path, so that a `benchmarks` package in the cwd cannot shadow ours.
        sys.path.insert(0, str(checkout))
        loaded = importlib.import_module("benchmarks")
    where = Path(getattr(loaded, "__file__", None) or ".").resolve().parent
    if where != package_dir:
        raise CommandError(f"another package named 'benchmarks' ({where}) shadows {package_dir}: "
                           f"run the command from another directory")
    return importlib.import_module(f"benchmarks.{name}")


@main.group(cls=_BenchmarkGroup)
def bench() -> None:
    """Run a benchmark of benchmarks/ (from a source checkout, from any directory).

    Each benchmark takes its own options: eventprocessor bench NAME --help. It prints
    its results; it writes its section of benchmarks/RESULTS.md only with --record.
    """


def _bench_command(name: str, summary: str) -> click.Command:
    command_name = name.replace("_", "-")

    @click.command(name=command_name, short_help=summary,
                   help=f"{summary}\n\nThe same program as `python -m benchmarks.{name}`. "
                        f"Its options: eventprocessor bench {command_name} --help",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
                   add_help_option=False)
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def command(ctx: click.Context, args: list[str]) -> None:
        module = _import_benchmark(name)
        argv = list(args)
        if _debugging(ctx) and "--debug" not in argv:
            argv.append("--debug")
        code: int | None = module.main(argv, prog=f"eventprocessor bench {command_name}")
        ctx.exit(code or 0)

    return command


for _name, _summary in BENCHMARKS.items():
    bench.add_command(_bench_command(_name, _summary))
