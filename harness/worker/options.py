"""The worker program's options (``python -m harness.worker --help``), checked together."""
from __future__ import annotations

import argparse
from typing import Any

__all__ = ["FLOORS", "parse", "policy_options"]

FLOORS = ("floor", "floor-lean")  # the bare receive loops (:mod:`.floor`): no processor, no store


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m harness.worker",
                                     description="A consumer process for multi-process tests and benchmarks.")
    what = parser.add_argument_group("what runs")
    what.add_argument("--impl", choices=["ours", "official", *FLOORS], default="ours",
                      help="this SDK's processor, azure-eventhub's, or a floor: a bare receive loop on "
                           "azure-eventhub's AMQP client reading frames its own way (floor) or the way this SDK's "
                           "lean receive path reads them (floor-lean) (--source eventhub)")
    what.add_argument("--hub", required=True)
    what.add_argument("--owner-id", required=True)
    what.add_argument("--consumer-group", default="$default")
    what.add_argument("--source", choices=["eventhub", "memory", "none"], default="eventhub",
                      help="memory: an in-process InMemoryEventSource fed by an in-process producer (ours only); "
                           "none: partitions without events, only ownership (ours: an empty InMemoryEventSource; "
                           "official: its EventProcessor over a stand-in client with idle consumers)")
    what.add_argument("--store", choices=["blob", "memory"],
                      help="the checkpoint store (default: memory with --source memory, else blob)")
    what.add_argument("--container", help="blob container of the checkpoint store (--store blob)")
    what.add_argument("--partitions", type=int, default=8, help="--source memory or none: partition count")
    what.add_argument("--produce", type=int, default=0, help="--source memory: events to send in all")
    what.add_argument("--backlog", type=int, default=1000,
                      help="--source memory: events the producer keeps ahead of the handler per partition")
    what.add_argument("--retention", type=int, default=0,
                      help="--source memory: events retained per partition (default: 4 x --backlog)")
    what.add_argument("--body", type=int, default=32, help="--source memory: event size in bytes")

    balancing = parser.add_argument_group("balancing")
    balancing.add_argument("--interval", type=float, default=0.5, help="load-balancing interval, seconds")
    balancing.add_argument("--expiry", type=float, default=3.0, help="ownership expiration interval, seconds")
    balancing.add_argument("--strategy", choices=["balanced", "greedy"], default="greedy")
    balancing.add_argument("--renewal-age", type=float, help="ours: ownership_renewal_age, seconds")
    balancing.add_argument("--group-join-delay", type=float,
                           help="ours: group_join_delay, seconds (0: none; default: the SDK's)")
    balancing.add_argument("--operation-timeout", type=float,
                           help="ours, --store blob: the Blob store's operation_timeout, seconds (default: the "
                                "store's)")
    balancing.add_argument("--balance-by", choices=["count", "load"], default="count",
                           help="ours only: balance partition counts (the default) or measured load")
    balancing.add_argument("--load-threshold", type=float, help="--balance-by load: LoadPolicy.threshold")
    balancing.add_argument("--load-damping", type=float, help="--balance-by load: LoadPolicy.damping")
    balancing.add_argument("--load-max-moves", type=int, help="--balance-by load: LoadPolicy.max_moves")
    balancing.add_argument("--load-cooldown", type=float, help="--balance-by load: LoadPolicy.cooldown, seconds")
    balancing.add_argument("--load-floor", type=float, help="--balance-by load: LoadPolicy.floor")

    handler = parser.add_argument_group("the handler")
    handler.add_argument("--batch", type=int, default=300, help="max batch size")
    handler.add_argument("--prefetch", type=int, default=300)
    handler.add_argument("--checkpoint-every", type=int, default=1, help="checkpoint every N batches")
    handler.add_argument("--checkpoint-events", type=int, default=0,
                         help="checkpoint once N events of a partition were delivered since its last checkpoint "
                              "(replaces --checkpoint-every)")
    handler.add_argument("--checkpoint-on-close", action="store_true",
                         help="official only: also checkpoint a partition's last delivered event in "
                              "on_partition_close (as a careful user would; this SDK's processor does it on release "
                              "by itself)")
    handler.add_argument("--work", type=float, default=0.0, help="seconds each batch spends in the handler")
    handler.add_argument("--cpu-per-event", type=float, default=0.0,
                         help="CPU seconds the handler spends on each event (a busy loop on its thread's CPU clock)")
    handler.add_argument("--slow-factor", type=float, default=1.0,
                         help="on SIGUSR1, multiply --cpu-per-event by this (a processor slowed down)")
    handler.add_argument("--stateful", action="store_true",
                         help="count events per key (the body) in context.state (EventProcessor(stateful=True))")
    handler.add_argument("--standbys", type=int, default=0, help="--stateful: warm replicas per partition")
    handler.add_argument("--recovery-lag", type=int, default=None,
                         help="--stateful: acceptable_recovery_lag, events (default: the processor's)")
    handler.add_argument("--state-bytes", type=int, default=0,
                         help="--stateful, --naive: pad each partition's state to about this many bytes at its "
                              "first claim")
    handler.add_argument("--naive", action="store_true",
                         help="count per key in a dict kept in one blob per partition, read at the claim and written "
                              "with each checkpoint (the way without the feature; not with --stateful)")

    lines = parser.add_argument_group("what it reports (JSON lines on stdout)")
    lines.add_argument("--report", choices=["events", "counts"], default="events",
                       help="events: a line per delivered batch; counts: only the stats lines count them")
    lines.add_argument("--expect", type=int, default=0, help="say 'done' (with the CPU time) at this many events")
    lines.add_argument("--stats-interval", type=float, default=0.25,
                       help="seconds between stats lines (0: none)")
    lines.add_argument("--owned-every", type=float, default=0.0,
                       help="ours: an owned line at least this often, seconds, even when nothing changed (0: only "
                            "on a change)")
    lines.add_argument("--ownership-lines", action=argparse.BooleanOptionalAction, default=True,
                       help="ours: a line per ownership change the processor logs (off: for large groups, where "
                            "they would cost CPU)")
    lines.add_argument("--state-every", type=float, default=0.0,
                       help="a state line this often, seconds (0: none): ownership, ticks, renewals, HTTP requests "
                            "to the store since 'go'")
    lines.add_argument("--tracemalloc-at", type=int, default=0,
                       help="trace allocations from this many delivered events on, baseline at twice as many; at the "
                            "stop, print the allocation sites that grew since (a leak hunt; slows the process down)")
    lines.add_argument("--tracemalloc-frames", type=int, default=1,
                       help="frames kept per allocation (1: the allocating line, a few times slower; 10: who called "
                            "it, many times slower)")
    lines.add_argument("--log-level", default="WARNING", type=str.upper,
                       choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                       help="level of this SDK's log lines on stderr (INFO shows every move); others log WARNING")

    life = parser.add_argument_group("its life")
    life.add_argument("--wait-for-go", action="store_true",
                      help="print 'ready' once set up, start when a line arrives on stdin, stop when stdin closes")
    life.add_argument("--lifetime", type=float, default=0.0,
                      help="stop by itself this many seconds after starting (0: never), should the parent not")
    return parser


def policy_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``LoadPolicy`` fields the ``--load-*`` options give (None: the policy's default)."""
    return {"threshold": args.load_threshold, "damping": args.load_damping, "max_moves": args.load_max_moves,
            "cooldown": args.load_cooldown, "floor": args.load_floor}


def _refusal(args: argparse.Namespace) -> str | None:
    """What is wrong with this combination of options, or None."""
    ours_only = {"--source memory": args.source == "memory", "--stateful": args.stateful, "--naive": args.naive,
                 "--balance-by load": args.balance_by != "count", "--renewal-age": args.renewal_age is not None,
                 "--group-join-delay": args.group_join_delay is not None,
                 "--operation-timeout": args.operation_timeout is not None, "--owned-every": bool(args.owned_every)}
    misplaced = [name for name, given in ours_only.items() if given and args.impl != "ours"]
    if misplaced:
        return f"{', '.join(misplaced)}: this SDK's processor only (--impl ours)"
    if args.checkpoint_on_close and args.impl != "official":
        return "--checkpoint-on-close is for --impl official (this SDK checkpoints on release by itself)"
    if args.impl in FLOORS and (args.source != "eventhub" or args.wait_for_go or args.state_every):
        return f"--impl {args.impl} reads a hub (--source eventhub) and reports batches, not state"
    if args.impl == "official" and args.store == "memory":
        return "--impl official keeps its checkpoints in Blob storage (--store blob)"
    if args.stateful and args.naive:
        return "--naive is the way without --stateful: give one of them"
    if args.naive and args.store != "blob":
        return "--naive keeps its blobs in the checkpoint container: it needs --store blob"
    if args.standbys and not args.stateful:
        return "--standbys keeps replicas of partition state: it needs --stateful"
    if args.store == "blob" and args.impl not in FLOORS and not args.container:
        return "--container is required with --store blob"
    if any(v is not None for v in policy_options(args).values()) and args.balance_by != "load":
        return "the --load-* options set the policy of --balance-by load"
    if args.cpu_per_event < 0 or args.slow_factor <= 0:
        return "--cpu-per-event must be >= 0 and --slow-factor > 0"
    return None


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked: a combination that makes no sense exits with status 2 and says why."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.store is None:
        args.store = "memory" if args.source == "memory" else "blob"
    refusal = _refusal(args)
    if refusal is not None:
        parser.error(refusal)
    return args
