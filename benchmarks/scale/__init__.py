"""Scale on real storage: many processors in separate OS processes, one Blob store on Azurite.

Run it with ``python -m benchmarks.scale`` (or ``eventprocessor bench scale``); ``--record``
writes its section of ``benchmarks/RESULTS.md``. It starts a fresh Azurite (in-memory, on
127.0.0.1) for each size ``PxN`` (P partitions, N processors; ``1024x16,2048x16,4096x32``
by default, smallest first), or uses the storage whose connection string is in
``EVENTPROCESSOR_SCALE_STORAGE`` (never on the command line: it holds a key; ``--store-pid``
names that Azurite's process, for its CPU):

1. **Measures the listing cost** on this machine: P ownership records are written to a
   scratch container and listed ``--calibration-listings`` times; the client's CPU
   (this process) and Azurite's CPU (``/proc``) per listing are the medians. Just before,
   it samples how many cores the machine leaves idle (other users' work counts as busy).
2. **Sizes the timing from it** (:func:`choose_timing`, the rule in docs/concepts/timing.md, "Sizing";
   ``--size-for`` prints what it chooses for costs you give it): with c the CPU seconds
   of one listing (client + Azurite) and C the cores the processors can count on (the
   idle ones, at least a quarter of the machine), ``I = N·c / (f·C)`` rounded up to whole
   seconds (at least ``--min-interval``), so the listings of all N processors use at most
   the fraction ``f`` (``--cpu-budget``, 0.5) of C; E at each SDK's own ratio to I (ours
   ``5·I`` as 15 s / 75 s, the official ``6·I`` as 30 s / 180 s); for ours ``R = E/2``
   and the Blob store's ``operation_timeout`` at least the store timeout derived from them.
3. **Runs each side** with that I and the same strategy (GREEDY by default), as N
   separate OS processes (``python -m harness.worker --source none``) started together once all have
   imported: *ours* is ``EventProcessor`` + this SDK's ``BlobCheckpointStore``; *official*
   is azure-eventhub's own ``EventProcessor`` class with
   ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``, given a stand-in
   client (same partition ids, idle consumers instead of AMQP links; ours reads an empty
   in-memory source, so neither side spends anything on events). Each side gets its own
   container on the same Azurite; the order of the sides alternates from size to size.
   A side runs until it is balanced or until every processor has made ``--cap-ticks``
   ticks (60; a recorded run needs at least 60), within ``--budget-minutes`` (45): a side
   is started only when the cap's ticks at I fit in what is left of the budget, keeping
   what the other side of its size needs, and a side whose ticks overrun so much that the
   budget ends it before the cap is reported as stopped by the budget. Sizes and sides
   that do not fit are sized and reported, not run.

Measured per side: seconds and ticks from the common start to balanced (every partition
dispatched by exactly one processor, shares differing by at most one), or to the cap,
then held for ``R + E/10`` (every lease of ours renewed at least once); missed renewals
(must be 0), by one rule for both SDKs (``harness.worker.report.RenewalWatch``: a partition still
dispatched more than E after the last accepted write of its ownership record), ours'
self-fenced leases, overrun ticks and overrun WARNING lines, HTTP requests per second
counted at each worker's transport, CPU per processor (``time.process_time`` in the
worker), Azurite's CPU, the longest event-loop stall of any processor and the CPU other
processes used on the machine meanwhile (:mod:`benchmarks.toolkit.machine`; a busy run is
flagged). At the end, one listing of the store checks that every partition's record
names exactly one live processor, is not expired, and agrees with what that processor
dispatches.

Every phase is bounded in time; every worker and Azurite are stopped on the way out,
failures and SIGTERM included. A side that does not balance by the cap is reported as
such, with what was owned, never as a success. The exit status is 1 when ours missed a
check.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

from ..toolkit import program, services
from .report import render
from .run import SizeResult, run_sizes
from .sides import SideResult
from .sizing import CAP_TICKS, Calibration, Sizing, choose_timing

__all__ = ["main", "choose_timing", "Calibration", "Sizing", "SideResult"]

logger = logging.getLogger(__name__)

DEFAULT_SIZES = "1024x16,2048x16,4096x32"
QUICK_SIZES = "8x2"
STORAGE_ENV = "EVENTPROCESSOR_SCALE_STORAGE"
"""Names the storage to measure instead of an Azurite of the benchmark's own (its connection
string: never on the command line, where a process listing shows it)."""
DEFAULT_BUDGET_MINUTES = 45.0


def _sizes(text: str) -> list[tuple[int, int]]:
    sizes = []
    for part in text.split(","):
        partitions, _, processors = part.strip().lower().partition("x")
        sizes.append((int(partitions), int(processors)))
    return sizes


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("scale", __doc__, prog)
    parser.add_argument("--sizes", default=None,
                        help=f"Comma-separated PARTITIONSxPROCESSORS. "
                             f"[default: {DEFAULT_SIZES}; --quick: {QUICK_SIZES}]")
    parser.add_argument("--quick", action="store_true", help="A small smoke run (never recorded).")
    parser.add_argument("--strategy", choices=["greedy", "balanced"], default="greedy",
                        help="Load-balancing strategy of both sides. [default: %(default)s]")
    parser.add_argument("--cpu-budget", type=float, default=0.5,
                        help="Fraction f of the cores that the listings of all processors may use. "
                             "[default: %(default)s]")
    parser.add_argument("--min-interval", type=float, default=1.0, help="The shortest interval the rule picks (s). "
                                                                        "[default: %(default)s]")
    parser.add_argument("--ours-timing", choices=("defaults", "sized"), default="defaults",
                        help="Ours at EventProcessor's default timing (its ticks list no ownership record at rest), "
                             "or at the interval sized for the official side. [default: %(default)s]")
    parser.add_argument("--hold", type=float, default=None,
                        help="Seconds to keep running once balanced. [default: the renewal age + E/10, so that every "
                             "lease of ours is renewed at least once]")
    parser.add_argument("--cap-ticks", type=float, default=float(CAP_TICKS),
                        help="A side that is not balanced once every processor has made this many ticks is reported "
                             "as not balanced (at least 60 for a recorded run). [default: %(default)g]")
    parser.add_argument("--budget-minutes", type=float, default=DEFAULT_BUDGET_MINUTES,
                        help="The whole run's time budget: a side is only started when the cap's ticks fit in what is "
                             "left of it (keeping what the other side of the size needs); the sizes and sides that "
                             "did not fit are sized and reported, not run. [default: %(default)g]")
    parser.add_argument("--calibration-listings", type=int, default=5,
                        help="Listings timed to measure the cost of one (their median is used). "
                             "[default: %(default)s]")
    parser.add_argument("--ready-timeout", type=float, default=180.0, help="Seconds for all workers to import. "
                                                                           "[default: %(default)s]")
    parser.add_argument("--stop-timeout", type=float, default=40.0,
                        help="Seconds each worker gets to stop. [default: %(default)s]")
    parser.add_argument("--drain-timeout", type=float, default=300.0,
                        help="Seconds to wait for Azurite to go idle before a side starts. [default: %(default)s]")
    parser.add_argument("--store-pid", type=int, default=None,
                        help=f"With {STORAGE_ENV} set (a storage of your own instead of the Azurite the benchmark "
                             "starts): the process id of that Azurite, to measure its CPU and wait for it to go idle.")
    parser.add_argument("--size-for", metavar="JSON", default=None,
                        help="Print what the sizing rule chooses for these measured costs and exit, e.g. "
                             "'{\"listing_cpu\": 0.55, \"processors\": 16, \"cores\": 2}' (optional: store_listing, "
                             "store_write, partitions, budget, min_interval).")
    parser.add_argument("--final-listing-timeout", type=float, default=120.0, help=argparse.SUPPRESS)
    parser.add_argument("--report-every", type=float, default=0.5, help=argparse.SUPPRESS)
    parser.add_argument("--idle-sample", type=float, default=5.0, help=argparse.SUPPRESS)
    parser.add_argument("--impls", default="ours,official",
                        help="The sides to run, comma-separated: ours, official (a size whose official side cannot "
                             "fit an hour can still be measured for ours; never recorded unless both). "
                             "[default: %(default)s]")
    parser.add_argument("--log-dir", default=None, help="Keep each worker's stderr in this directory.")
    parser.add_argument("--group-join-delay", type=float, default=None,
                        help="Ours: group_join_delay in seconds (0: none). [default: EventProcessor's]")
    parser.add_argument("--worker-log-level", default="WARNING", type=str.upper,
                        help="The workers' log level (INFO shows every claim, handoff and listing decision in "
                             "--log-dir). [default: %(default)s]")
    return parser


def _size_for(parser: argparse.ArgumentParser, text: str) -> int:
    """``--size-for``: the sizing rule alone, as JSON on stdout."""
    try:
        given = json.loads(text)
        sizing = choose_timing(float(given.pop("listing_cpu")), int(given.pop("processors")),
                               float(given.pop("cores")), **given)
    except (ValueError, KeyError, TypeError) as error:
        parser.error(f"--size-for needs a JSON object with listing_cpu, processors and cores, and optionally "
                     f"store_listing, store_write, partitions, budget and min_interval: {error}")
    print(json.dumps({**vars(sizing), "hold": sizing.hold, "stall_room": sizing.stall_room,
                      "official_expiration": sizing.official_expiration}))
    return 0


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print its tables; ``--record`` writes them to RESULTS.md.

    Example::

        python -m benchmarks.scale --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.size_for is not None:
            return _size_for(parser, args.size_for)
        if args.quick and args.record:
            parser.error("--quick runs are partial: they are never recorded")
        if args.record and args.cap_ticks < CAP_TICKS:
            parser.error(f"--record needs --cap-ticks of at least {CAP_TICKS}: a shorter cap is a give-up window, "
                         f"not a measurement")
        if args.quick:  # a smoke run: shorter samples, quicker reports, a short hold
            args.idle_sample, args.report_every, args.calibration_listings = 0.5, 0.25, 3
            args.hold = 5.0 if args.hold is None else args.hold
        try:
            args.sizes = _sizes(args.sizes or (QUICK_SIZES if args.quick else DEFAULT_SIZES))
        except ValueError:
            parser.error("--sizes must look like 1024x16,4096x32")
        if any(p < 1 or n < 1 for p, n in args.sizes):
            parser.error("--sizes: partitions and processors must be positive")
        if not 0 < args.cpu_budget <= 1:
            parser.error("--cpu-budget must be in (0, 1]")
        if args.cap_ticks < 1:
            parser.error("--cap-ticks must be at least 1")
        args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
        if not args.impls or set(args.impls) - {"ours", "official"}:
            parser.error("--impls takes ours, official or both, comma-separated")
        if args.record and set(args.impls) != {"ours", "official"}:
            parser.error("--record needs both sides (--impls ours,official): one side alone compares nothing")
        args.unmeasured = []
        return _run(args, run)

    return program.run("scale", parser, body, argv)


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def _run(args: argparse.Namespace, run: program.Run) -> int:
    from eventprocessor.cli.user_errors import require, require_azurite

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    require(purpose="the scale benchmark", extras=["blob", "eventhub"],
            packages=[("azure.eventhub.extensions.checkpointstoreblobaio", "azure-eventhub-checkpointstoreblob-aio")])
    # A storage of the user's own (never on the command line: a connection string holds a key).
    given = os.environ.get(STORAGE_ENV)
    if not given:
        require_azurite("the scale benchmark")
    previous = None
    if threading.current_thread() is threading.main_thread():
        # SIGTERM unwinds like Ctrl-C, so that every worker and Azurite are stopped.
        previous = signal.signal(signal.SIGTERM, _interrupt)
    results: list[SizeResult] = []
    try:
        if given:
            results = asyncio.run(run_sizes(args, given, args.store_pid, started=run.started))
        else:
            # One Azurite per size, started fresh: a size does not inherit the records,
            # memory and queued requests of the one before (Azurite keeps everything in
            # one in-memory database served by one thread).
            for index, size in enumerate(args.sizes):
                with services.azurite() as azurite:
                    pid = azurite.process.pid if azurite.process is not None else None
                    results += asyncio.run(run_sizes(args, azurite.connection_string, pid, sizes=[size],
                                                     started=run.started, first_index=index))
    except KeyboardInterrupt:
        print(f"{program.command_name('scale')}: interrupted; every worker was stopped", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    run.report(render(results, args, run.header(flag_busy=False)))
    # 1 when ours missed a check in a size that ran (the official side's results are findings)
    failed = any(size.error or (ours is not None and (not ours.every_partition_owned_once
                                                      or ours.counters.get("missed_renewals", 0)))
                 for size in results for ours in [size.sides.get("ours")] if not size.not_run)
    return 1 if failed else 0

