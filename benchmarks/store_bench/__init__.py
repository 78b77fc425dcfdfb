"""Checkpoint-store benchmark: our stores, the official blob store and a bare-SDK floor, on one Azurite.

Run it with ``python -m benchmarks.store_bench`` (or ``eventprocessor bench store-bench``);
``--record`` writes the tables into ``benchmarks/RESULTS.md``; ``--raw PATH`` writes every
round's measurements as JSON.
It starts its own Azurite on free loopback ports, and for each partition count (32 and
1024 by default) measures, store after store in the same round, ``--rounds`` rounds with
the store order rotated each round:

* claims/s: claiming every partition from nothing (create-if-absent, one per partition),
  then re-claiming with the etag (the renewal every tick does), over all partitions again
  and again until at least ``--phase-ops`` re-claims;
* fences/s (our stores): the fence a new owner writes right after winning a claim
  (``fence_checkpoint``: read ownership, read checkpoint, conditional write), repeated
  like the re-claims;
* checkpoints/s: ``--checkpoint-ops`` steady-state checkpoint writes by the owner (after
  one untimed write per partition, so first-write creates are not counted), and the
  client CPU per checkpoint (this process; Azurite is another);
* list-ownership latency: median and p95 of repeated listings of all N records;
* HTTP requests per operation, counted at the transport.

The stores: our ``BlobCheckpointStore`` (fenced checkpoints), the official
``azure-eventhub-checkpointstoreblob-aio`` ``BlobCheckpointStore`` (unfenced, dict API),
our ``TableCheckpointStore``, and two floors: the unavoidable work of a fenced checkpoint
written with the bare Azure SDK and nothing else, a conditional ``set_blob_metadata``
If-Match the last etag (``bare-blob``) and a conditional Table ``update_entity``
(``bare-table``), same fields, same concurrency. ``--stores memory`` runs the harness on
the in-memory store without Azurite, as a dry run.

Comparisons are per round (the stores of one round ran back to back), reported as the
median and the range of the per-round ratios: ours against the official store on the same
backend (Blob: what fencing costs), each store against its backend's floor, and our Table
store against our Blob store, labelled as a backend comparison (the official store has no
Table backend). The machine's load is measured beside every round
(:mod:`benchmarks.toolkit.machine`); a run on a busy machine is flagged as such.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import sys

from eventprocessor.cli.user_errors import require, require_azurite

from ..toolkit import program, services
from ..toolkit.machine import LoadReading, LoadWindow
from .measure import StoreResult, Summary, measure
from .report import render
from .stores import make

__all__ = ["main", "measure", "StoreResult", "Summary"]

logger = logging.getLogger(__name__)

DEFAULT_PARTITIONS = (32, 1024)
DEFAULT_CONCURRENCY = 16
DEFAULT_CHECKPOINT_OPS = 4096
DEFAULT_PHASE_OPS = 1024
DEFAULT_LIST_REPEATS = 10
DEFAULT_ROUNDS = 6
ALL_STORES = ("ours-blob", "official-blob", "ours-table", "bare-blob", "bare-table")


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("store_bench", __doc__, prog)
    parser.add_argument(
        "--partitions", default=",".join(map(str, DEFAULT_PARTITIONS)),
        help="Comma-separated partition counts. [default: %(default)s]",
    )
    parser.add_argument("--concurrency", type=program.at_least_one, default=DEFAULT_CONCURRENCY,
                        help="Workers. [default: %(default)s]")
    parser.add_argument(
        "--checkpoint-ops", type=program.at_least_one, default=DEFAULT_CHECKPOINT_OPS,
        help="Timed checkpoint writes per store, partition count and round. [default: %(default)s]",
    )
    parser.add_argument(
        "--phase-ops", type=program.at_least_one, default=DEFAULT_PHASE_OPS,
        help="At least this many timed re-claims and fences per store, partition count and round. "
             "[default: %(default)s]",
    )
    parser.add_argument(
        "--list-repeats", type=program.at_least_one, default=DEFAULT_LIST_REPEATS,
        help="Listings per store, partition count and round. [default: %(default)s]",
    )
    parser.add_argument(
        "--stores", default=",".join(ALL_STORES),
        help="Comma-separated: ours-blob, official-blob, ours-table, bare-blob, bare-table, memory. "
             "[default: %(default)s]",
    )
    parser.add_argument(
        "--rounds", type=program.at_least_one, default=DEFAULT_ROUNDS,
        help="Rounds over all stores, order rotated each round; medians and ranges reported. [default: %(default)s]",
    )
    parser.add_argument("--raw", metavar="PATH", default=None,
                        help="Also write every round's measurements to PATH as JSON.")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    try:
        args.partitions = [int(p) for p in args.partitions.split(",") if p.strip()]
    except ValueError:
        parser.error("--partitions must be comma-separated integers")
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = set(args.stores) - set(ALL_STORES) - {"memory"}
    if unknown:
        parser.error(f"unknown store(s): {', '.join(sorted(unknown))} (known: {', '.join(ALL_STORES)}, memory)")
    if any(p < 1 for p in args.partitions):
        parser.error("--partitions must be positive")
    return args


async def _run(args: argparse.Namespace, connection_string: str | None
               ) -> tuple[list[StoreResult], list[LoadReading]]:
    results: list[StoreResult] = []
    loads: list[LoadReading] = []
    for round_index in range(args.rounds):
        window = LoadWindow()
        for partitions in args.partitions:
            # Rotating the order spreads the drift of a shared machine over all stores.
            shift = round_index % len(args.stores)
            for kind in args.stores[shift:] + args.stores[:shift]:
                adapter = make(kind, connection_string, partitions)
                if adapter is None:
                    print(f"skipped {kind}: not available", file=sys.stderr)
                    continue
                print(
                    f"round {round_index + 1}/{args.rounds}: {adapter.name} at {partitions} partitions ...",
                    file=sys.stderr, flush=True,
                )
                try:
                    results.append(
                        await measure(
                            adapter, partitions, concurrency=args.concurrency,
                            checkpoint_ops=args.checkpoint_ops, list_repeats=args.list_repeats,
                            phase_ops=args.phase_ops, round_index=round_index,
                        )
                    )
                finally:
                    await adapter.close()
        loads.append(window.reading())
        print(f"round {round_index + 1}: {loads[-1].describe()}", file=sys.stderr, flush=True)
    return results, loads


# What each store needs beyond the core install: extras, and packages no extra provides.
_NEEDS = {
    "ours-blob": (["blob"], []),
    "official-blob": (["blob"], [("azure.eventhub.extensions.checkpointstoreblobaio",
                                  "azure-eventhub-checkpointstoreblob-aio")]),
    "ours-table": (["table"], []),
    "bare-blob": (["blob"], []),
    "bare-table": (["table"], []),
    "memory": ([], []),
}


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print the tables; with ``--record``, write them to
    benchmarks/RESULTS.md. Example::

        python -m benchmarks.store_bench --partitions 32,1024 --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        return _run_and_report(_check(parser, args), run)

    return program.run("store_bench", parser, body, argv, unrecorded=("--raw",))


def _run_and_report(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    require(purpose=f"store-bench with --stores {','.join(args.stores)}",
            extras=sorted({extra for kind in args.stores for extra in _NEEDS[kind][0]}),
            packages=[package for kind in args.stores for package in _NEEDS[kind][1]])
    with contextlib.ExitStack() as stack:
        connection_string = None
        if any(kind != "memory" for kind in args.stores):
            require_azurite("store-bench")
            connection_string = stack.enter_context(services.azurite()).connection_string
        results, loads = asyncio.run(_run(args, connection_string))
    if not results:
        print("store_bench: no store could be measured", file=sys.stderr)
        return 1
    if args.raw:
        with open(args.raw, "w") as handle:
            json.dump({"command": run.command, "rounds": [r.to_dict() for r in results],
                       "load": [vars(r) for r in loads]}, handle, indent=1)
    run.report(render(results, header=run.header(flag_busy=False), concurrency=args.concurrency,
                      checkpoint_ops=args.checkpoint_ops, phase_ops=args.phase_ops, list_repeats=args.list_repeats,
                      rounds=args.rounds, loads=loads))
    return 0
