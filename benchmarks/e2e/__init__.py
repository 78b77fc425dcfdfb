"""End to end over AMQP: this SDK's processor, azure-eventhub's own, and two bare receive loops, on one emulator.

Run it with ``python -m benchmarks.e2e`` (or ``eventprocessor bench e2e``). It starts its
own Event Hubs emulator (``eventprocessor.emulators.eventhubs``) and its own Azurite, both on
loopback, and uses them for every side:

* **floor-lean**, the floor of our receive path: a bare receive loop on azure-eventhub's AMQP
  client that reads frames as this SDK's lean receive path does
  (``python -m harness.worker --impl floor-lean``, ``eventprocessor.sources.eventhub.frames``):
  it receives and decodes the messages, reads their sequence numbers and counts them;
  nothing else. No consumer on our receive path can do less: the target is judged
  against it;
* **floor**, the floor of azure-eventhub's receive path: the same loop reading frames the
  client's own way (``--impl floor``, a task and a timer per frame). No consumer of the
  client as it stands, the official one included, can do less;
* **ours**: ``EventProcessor`` + ``EventHubSource`` + this SDK's ``BlobCheckpointStore``;
* **official**: ``azure.eventhub.aio.EventHubConsumerClient.receive_batch`` + the
  ``azure-eventhub-checkpointstoreblob-aio`` ``BlobCheckpointStore``.

Each runs as a separate OS process. Both consumers take batches of ``--batch`` events,
balance GREEDY with the same intervals, and checkpoint a partition once
``--checkpoint-events`` of its events were delivered since its last checkpoint (the same
cadence in events on both sides, whatever the size of the batches each one gets).
Measured, in one run:

1. **Fill**: the official producer fills a hub with ``--events`` events; its rate, its
   CPU per event and the emulator's CPU per event in.
2. **Prefetch sweep**: each side reads ``--sweep-events`` events from the start with
   every prefetch of ``--sweep``; each side then runs at the prefetch that gave it the
   most events/s.
3. **Throughput**: ``--rounds`` rounds; in each, every side reads the whole hub from the
   start (the order rotates). Events/s and CPU per event are those of the steady window
   (from the moment every partition delivered a batch to the last expected event), with
   the emulator's CPU per event in the same window and the CPU other processes of the
   machine took meanwhile. Ours is reported as a fraction of each floor of the same
   round (the headline: of the floor of our receive path), the official as one of
   azure-eventhub's floor; a round in which other work took more than ``--busy-cores``
   of the machine is flagged and left out of the headline.
4. **Failover**: two processes under a steady stream; one is SIGKILLed; seconds until
   each of its partitions is delivered again by the survivor (max over partitions).
5. **Scale-out**: two processes under a steady stream, then two more; duplicates
   delivered from the scale-out on (deliveries of events delivered before), and events
   lost (must be 0). The official runs twice: checkpointing in ``on_partition_close``
   as a careful user would, and as its samples do (no checkpoint on close).

``--save-json PATH`` also writes the run's figures; ``--from-json PATH`` runs nothing and
prints the tables of such a file again, judged with the options of that command (another
``--busy-cores``, say): how the tests check the rule that leaves busy rounds out.
"""
from __future__ import annotations

import argparse
import asyncio
import logging

from ..toolkit import program, services
from ..toolkit.report import header
from .bench import Bench
from .report import Summary, render, summarize
from .results import Phase, load_run, save_run

__all__ = ["main", "Phase", "Summary", "summarize", "save_run", "load_run"]


def _prefetches(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sweep takes prefetch values separated by commas, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"--sweep takes positive prefetch values, got {text!r}")
    return values


def _parser(prog: str | None) -> argparse.ArgumentParser:
    parser = program.parser("e2e", __doc__, prog)
    parser.add_argument("--events", type=int, default=None, help="Events per throughput phase. [default: 400000]")
    parser.add_argument("--partitions", type=int, default=8,
                        help="Partitions of the hub. [default: %(default)s]")
    parser.add_argument("--body", type=int, default=32, help="Event size in bytes. [default: %(default)s]")
    parser.add_argument("--batch", type=int, default=300, help="Max batch size of both consumers. "
                                                               "[default: %(default)s]")
    parser.add_argument("--checkpoint-events", type=int, default=1000,
                        help="Throughput: both consumers checkpoint a partition once this many of its events were "
                             "delivered since its last checkpoint. [default: %(default)s]")
    parser.add_argument("--sweep", type=_prefetches, default=[100, 300, 1000, 3000],
                        help="Prefetch values each side is tried with (one value: no sweep). "
                             "[default: 100,300,1000,3000]")
    parser.add_argument("--sweep-events", type=int, default=None, help="Events per sweep phase. [default: --events/2]")
    parser.add_argument("--rounds", type=program.at_least_one, default=5,
                        help="Throughput rounds (each side once per round). [default: %(default)s]")
    parser.add_argument("--busy-cores", type=float, default=0.3,
                        help="A phase is busy when other processes used more than this many cores meanwhile. "
                             "[default: %(default)s]")
    parser.add_argument("--min-quiet-rounds", type=int, default=3,
                        help="With fewer quiet rounds than this, the run is flagged busy (not a result). "
                             "[default: %(default)s]")
    parser.add_argument("--failover-rounds", type=int, default=2,
                        help="Rounds of the failover after SIGKILL, per side. [default: %(default)s]")
    parser.add_argument("--scale-out-rounds", type=int, default=2,
                        help="Rounds of the 2 -> 4 scale-out, per side. [default: %(default)s]")
    parser.add_argument("--no-scale-out", action="store_true",
                        help="Skip the scale-out runs.")
    parser.add_argument("--rate", type=float, default=1000.0, help="Events/s of the steady stream. "
                                                                   "[default: %(default)s]")
    parser.add_argument("--stream-prefetch", type=int, default=300, help="Prefetch in the failover and scale-out "
                                                                         "runs. [default: %(default)s]")
    parser.add_argument("--stream-checkpoint-events", type=int, default=100,
                        help="Failover and scale-out: a checkpoint of a partition every this many of its events. "
                             "[default: %(default)s]")
    parser.add_argument("--interval", type=float, default=1.0, help="Load-balancing interval (failover, scale-out). "
                                                                    "[default: %(default)s]")
    parser.add_argument("--expiry", type=float, default=6.0, help="Ownership expiration (failover, scale-out). "
                                                                  "[default: %(default)s]")
    parser.add_argument("--timeout", type=float, default=180.0, help="Give up on a phase after this many seconds. "
                                                                     "[default: %(default)s]")
    parser.add_argument("--quick", action="store_true", help="A small smoke run (never recorded).")
    parser.add_argument("--save-json", metavar="PATH", help="Also write the run's figures to PATH, for --from-json.")
    parser.add_argument("--from-json", metavar="PATH",
                        help="Run nothing: print the tables of a run saved with --save-json, judged with this "
                             "command's options (--busy-cores, --min-quiet-rounds, ...); never recorded.")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """Run the benchmark and print the tables; ``--record`` writes them to RESULTS.md.

    Example::

        python -m benchmarks.e2e --record
    """
    parser = _parser(prog)

    def body(args: argparse.Namespace, run: program.Run) -> int:
        if args.quick:
            if args.record:
                parser.error("--quick runs are partial: they are never recorded")
            # Enough that the fastest side (the lean floor) still reads a sweep's half for
            # longer than a stats interval (0.25 s) once every partition flows.
            args.events = args.events or 120_000
            args.sweep = args.sweep[:2]
            args.rounds, args.failover_rounds, args.no_scale_out = 1, 0, True
        args.events = args.events or 400_000
        args.sweep_events = args.sweep_events or args.events // 2
        if args.events < 8 * args.partitions or args.sweep_events > args.events:
            parser.error("--events must be at least 8 per partition, and --sweep-events at most --events")
        if args.from_json:
            if args.record or args.save_json:
                parser.error("--from-json prints a saved run again: it is never recorded or saved")
            try:
                results, command, seconds = load_run(args.from_json)
            except ValueError as error:
                parser.error(str(error))
            print(render(results, args, header(command, seconds=seconds)))
            return 0
        return _run(args, run)

    return program.run("e2e", parser, body, argv)


def _run(args: argparse.Namespace, run: program.Run) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    hubs = {f"bench-{index}": args.partitions for index in range(100)}
    with services.logs("e2e", None) as log_dir, services.azurite_and_emulator(
            ["--max-events-per-partition", str(max(100_000, args.events))], hubs=hubs) as (emulator, azurite):
        azurite_pid = azurite.process.pid if azurite.process is not None else None
        bench = Bench(args, emulator.connection_string, emulator.pid, azurite_pid, azurite.connection_string, log_dir)
        results = asyncio.run(bench.run())
    if args.save_json:
        save_run(args.save_json, results, run.command, run.seconds)
    run.report(render(results, args, run.header(flag_busy=False)))
    return 0

