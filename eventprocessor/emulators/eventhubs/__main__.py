"""``python -m eventprocessor.emulators.eventhubs``: run the Event Hubs emulator until SIGINT or SIGTERM.

Prints the connection string on stdout once it accepts connections, then one per event
hub with its ``EntityPath``, a line each; logs go to stderr. ``eventprocessor emulator``
is the same with the project's CLI.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from . import EventHubsEmulator, serve
from .config import EmulatorConfig, EmulatorConfigError


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m eventprocessor.emulators.eventhubs", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=5672, help="port; 0 picks a free one (default 5672)")
    parser.add_argument("--eventhub", action="append", default=[], metavar="NAME",
                        help="an event hub to serve (repeatable)")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of each --eventhub (default 2)")
    parser.add_argument("--consumer-group", action="append", default=[], metavar="NAME",
                        help="a consumer group of each --eventhub (repeatable; $Default always exists)")
    parser.add_argument("--config", metavar="PATH", help="Microsoft's emulator Config.json")
    parser.add_argument("--max-events-per-partition", type=int, default=100_000,
                        help="events kept per partition, oldest dropped first (default 100000)")
    parser.add_argument("--retention", type=float, default=3600.0, metavar="SECONDS",
                        help="events older than this are dropped (default 3600)")
    parser.add_argument("--sas-key", metavar="KEY",
                        help="check tokens: only SAS tokens signed with KEY (key name RootManageSharedAccessKey) "
                             "are accepted, and the printed connection string carries KEY (default: any token, "
                             "as Microsoft's emulator)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-v info, -vv debug)")
    return parser.parse_args(argv)


def build(args: argparse.Namespace) -> EventHubsEmulator:
    limits = {"max_events_per_partition": args.max_events_per_partition, "retention_seconds": args.retention}
    config = EmulatorConfig.from_file(args.config, **limits) if args.config else EmulatorConfig(**limits)
    return EventHubsEmulator(config, eventhubs=args.eventhub, partitions=args.partitions,
                             consumer_groups=args.consumer_group, host=args.host, port=args.port,
                             sas_key=args.sas_key)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        emulator = build(args)
    except EmulatorConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        asyncio.run(serve(emulator))
    except OSError as error:
        print(f"error: cannot listen on {args.host}:{args.port}: {error.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
