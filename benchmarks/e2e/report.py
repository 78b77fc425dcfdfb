"""e2e's section of RESULTS.md: the sweep, the throughput rounds (quiet ones counted),
failover and scale-out."""
from __future__ import annotations

import argparse
from dataclasses import dataclass

from ..toolkit.report import median, number, table, value_range
from .results import CONSUMERS, SIDES, Phase, Results

__all__ = ["RATIOS", "Summary", "render", "summarize"]

SCALE_OUT_LABELS = {"ours": "ours", "official": "official, checkpoint in `on_partition_close`",
                    "official-as-documented": "official as its samples write it (no checkpoint on close)"}
SIDE_LABELS = {"floor-lean": "floor, our receive path (`floor-lean`)",
               "floor": "floor, azure-eventhub's receive path (`floor`)", "ours": "ours", "official": "official"}
# The ratios per round: (numerator, denominator) -> how the tables name it.
RATIOS = {("ours", "floor-lean"): "ours/floor (our receive path)",
          ("ours", "floor"): "ours/floor (azure-eventhub's receive path)",
          ("official", "floor"): "official/floor (azure-eventhub's receive path)",
          ("ours", "official"): "ours/official"}
HEADLINE = ("ours", "floor-lean")  # the ratio the target is judged on
_PER_ROUND = (HEADLINE, ("ours", "floor"), ("official", "floor"))  # the ratios of the per-round table
TARGET = 0.85  # ours / the floor of our receive path, events/s


@dataclass
class Summary:
    """The throughput rounds in figures: which rounds count, and the ratios over them."""

    quiet: list[int]  # indexes of the rounds in which no phase was busy
    busy: bool  # too few quiet rounds: the run is not a result
    ratios: dict[str, list[float]]  # per counted round, keyed by RATIOS' labels
    cpu_ratios: dict[str, list[float]]
    counted: list[int]  # the rounds the figures come from (the quiet ones, or all when busy)


def summarize(rounds: list[dict[str, Phase]], busy_cores: float, min_quiet: int) -> Summary:
    """Per-round ratios of events/s and CPU per event. A round counts when no phase of it
    was busy (other processes used more than ``busy_cores``); with fewer than
    ``min_quiet`` such rounds the run is flagged busy and every round is shown, for
    information only. A side a round lacks (a run saved before that side existed)
    leaves its ratios out of that round.

    Example::

        summary = summarize(results.rounds, busy_cores=0.3, min_quiet=3)
        print(summary.busy, summary.ratios["ours/floor (our receive path)"])
    """
    quiet = [i for i, phases in enumerate(rounds) if not any(p.busy(busy_cores) for p in phases.values())]
    busy = len(quiet) < min(min_quiet, len(rounds))
    counted = list(range(len(rounds))) if busy else quiet
    both = {pair: [rounds[i] for i in counted if pair[0] in rounds[i] and pair[1] in rounds[i]] for pair in RATIOS}
    ratios = {name: [phases[a].rate / phases[b].rate for phases in both[(a, b)]] for (a, b), name in RATIOS.items()}
    cpu_ratios = {name: [phases[a].cpu_us / phases[b].cpu_us for phases in both[(a, b)]]
                  for (a, b), name in RATIOS.items()}
    return Summary(quiet, busy, ratios, cpu_ratios, counted)


def _ratio(phases: dict[str, Phase], pair: tuple[str, str]) -> str:
    a, b = pair
    return f"{phases[a].rate / phases[b].rate:.2f}" if a in phases and b in phases else "-"


def _cell(phase: Phase | None, busy_cores: float) -> str:
    if phase is None:
        return "-"
    return (f"{phase.rate:,.0f}; {phase.cpu_us:.1f}; {number(phase.others_cores, '.2f')}"
            + (" busy" if phase.busy(busy_cores) else ""))


def render(results: Results, args: argparse.Namespace, head: str) -> str:
    """The section: ``head`` (the line under the title, :func:`~benchmarks.toolkit.report.header`), then the tables."""
    summary = summarize(results.rounds, args.busy_cores, args.min_quiet_rounds)
    fill, prefetch = results.fill, results.prefetch
    counted = [results.rounds[i] for i in summary.counted]

    def column(side: str, attribute: str) -> list[float]:
        return [getattr(phases[side], attribute) for phases in counted
                if side in phases and getattr(phases[side], attribute) is not None]

    headline = summary.ratios[RATIOS[HEADLINE]]
    azure_floor = summary.ratios[RATIOS[("ours", "floor")]]
    verdict = ("not judged, this run has no floor of our receive path" if not headline
               else "met" if median(headline) >= TARGET else "not met")
    busy_note = (f"**Busy machine: in {len(results.rounds) - len(summary.quiet)} of {len(results.rounds)} rounds other "
                 f"processes used more than {args.busy_cores} cores, so this run is not a result.** The figures below "
                 f"are medians over all rounds, shown for information only.") if summary.busy else (
        f"{len(summary.quiet)} of {len(results.rounds)} rounds were quiet (other processes used at most "
        f"{args.busy_cores} cores in every phase); the figures are medians over those rounds, with their range.")
    loads = ", ".join(f"{max(p.load for p in results.rounds[i].values()):.1f}" for i in summary.counted)
    lines = [
        "## End to end over AMQP: this SDK, azure-eventhub, and two bare receive loops (`e2e`)",
        "",
        head,
        "",
        "One Event Hubs emulator (`eventprocessor.emulators.eventhubs`, its own process) and one Azurite, "
        "both on 127.0.0.1 and started by the benchmark; every consumer is a separate OS process. Two floors, "
        "each a bare receive loop on azure-eventhub's AMQP client (`python -m harness.worker --impl ...`) that "
        "receives, decodes, reads each sequence number and counts: no `EventData`, no `Event`, no processor, no "
        "checkpoint. They differ only in how a received frame is read. *floor, our receive path* (`floor-lean`): "
        "as this SDK's lean receive path reads it (`eventprocessor.sources.eventhub.frames`: a frame already "
        "received is decoded without a task and a timer of its own), the least any consumer on our receive path "
        "can do, so the floor the target is judged against. *floor, azure-eventhub's receive path* (`floor`): as "
        "the client reads it (`asyncio.wait_for` around every frame), the least any consumer of the client as it "
        "stands can do, the official one included. *ours*: `EventProcessor` + `EventHubSource` + our "
        "`BlobCheckpointStore`. *official*: `EventHubConsumerClient.receive_batch` + "
        f"`azure-eventhub-checkpointstoreblob-aio` at its defaults. Both consumers: batches of at most {args.batch} "
        f"events, a checkpoint of a partition every {args.checkpoint_events:,} of its events, GREEDY, "
        f"{args.partitions} partitions of {args.events // args.partitions:,} {args.body}-byte events.",
        "",
    ]
    if results.sweep:
        lines += [
            f"### Prefetch sweep ({args.sweep_events:,} events from the start, one run per value)",
            "",
            "| side | " + " | ".join(f"prefetch {p}" for p in args.sweep) + " | chosen |",
            "|---|" + "---:|" * len(args.sweep) + "---:|",
        ]
        for side in SIDES:
            by_prefetch = {p.prefetch: p for p in results.sweep if p.side == side}
            cells = [f"{by_prefetch[p].rate:,.0f}/s, {by_prefetch[p].cpu_us:.1f} µs"
                     + (" (busy)" if by_prefetch[p].busy(args.busy_cores) else "") if p in by_prefetch else "-"
                     for p in args.sweep]
            lines.append(f"| {SIDE_LABELS[side]} | " + " | ".join(cells) + f" | **{prefetch.get(side, '-')}** |")
        lines += ["", "Each side then runs at the prefetch that gave it the most events/s (its link credit per "
                      "partition).", ""]
    lines += [
        f"### Throughput ({args.events:,} events read from the start by one process per side; {args.rounds} rounds, "
        f"the order of the sides rotating)",
        "",
        busy_note,
        "",
        table(["side", "prefetch", "events/s (median)", "range", "CPU µs/event (median)", "range",
               "emulator CPU µs/event", "start-up (s)"],
              [[SIDE_LABELS[side], prefetch.get(side, "-"), number(median(column(side, "rate")), ",.0f"),
                value_range(column(side, "rate")), number(median(column(side, "cpu_us"))),
                value_range(column(side, "cpu_us"), ".1f"), number(median(column(side, "emulator_us"))),
                number(median(column(side, "startup")))] for side in SIDES], align="lrrrrrrr"),
        "",
        table(["ratio (per round)", "events/s, median", "range", "CPU per event, median", "range"],
              [[name, f"**{number(median(summary.ratios[name]), '.2f')}**", value_range(summary.ratios[name], ".2f"),
                number(median(summary.cpu_ratios[name]), ".2f"), value_range(summary.cpu_ratios[name], ".2f")]
               for name in RATIOS.values()], align="lrrrr"),
        "",
        f"Ours at **{number(median(headline), '.2f')}x** of the events/s of the floor of our receive path, median of "
        f"{len(headline)} rounds (range {value_range(headline, '.2f')}; target >= {TARGET}: {verdict}"
        f"{', busy machine: not a result' if summary.busy else ''}"
        f"), and {number(median(azure_floor), '.2f')}x of azure-eventhub's; 1-minute load average at the end of each "
        f"of those rounds: {loads}.",
        "",
        "Per round (events/s; CPU µs/event; cores used by other processes during the phase; `busy` when above "
        f"{args.busy_cores}):",
        "",
        table(["round", *SIDES, *(f"{a}/{b}" for a, b in _PER_ROUND), "load"],
              [[index, *(_cell(phases.get(side), args.busy_cores) for side in SIDES),
                *(_ratio(phases, pair) for pair in _PER_ROUND), f"{max(p.load for p in phases.values()):.1f}"]
               for index, phases in enumerate(results.rounds)], align="r" + "l" * len(SIDES) + "rrrr"),
        "",
        "Timed from the moment every partition has delivered a batch (sampled every 0.25 s) to the last expected "
        "event, counting only the events and CPU of that window; CPU is the consumer process's own (user + system, "
        "all threads). Other processes' CPU is the machine's busy time (`/proc/stat`) minus that of this run's "
        "processes (consumer, emulator, Azurite, the benchmark) over the same window. The load average counts this "
        "run's own processes too (about 1.3 on an idle machine). Start-up (claiming partitions, opening receivers) "
        "is the last column of the first table.",
        "",
        f"Fill: the official producer sent {args.events:,} events at {fill.rate:,.0f}/s, {fill.producer_us:.1f} µs of "
        f"its CPU per event; the emulator took {number(fill.emulator_us)} µs per event in.",
        "",
    ]
    fo = results.failover
    if fo["ours"] or fo["official"]:
        lines += [
            f"### Failover (2 processes, {args.rate:.0f} events/s, load-balancing interval {args.interval} s, "
            f"ownership expiration {args.expiry} s, prefetch {args.stream_prefetch}, a checkpoint every "
            f"{args.stream_checkpoint_events} events of a partition; one SIGKILLed)",
            "",
            table(["", "seconds from SIGKILL to the last of its partitions delivered again (median)", "range",
                   "events lost"],
                  [[side, number(median(fo[side])), value_range(fo[side], ".1f"), results.failover_lost[side]]
                   for side in CONSUMERS], align="lrrr"),
            "", "Both wait for the dead process's ownership to expire, then claim at their next tick and "
                      "open a receiver. Ours judges expiry on the store's clock, whose timestamps have 1-second "
                      "resolution, and keeps a self-fencing margin; the official processor uses the local clock.",
                  ""]
    if any(results.scale_out.values()):
        lines += [
            f"### Scale-out 2 -> 4 processes ({args.rate:.0f} events/s, interval {args.interval} s, expiration "
            f"{args.expiry} s, a checkpoint every {args.stream_checkpoint_events} events of a partition; "
            f"{args.scale_out_rounds} rounds)",
            "",
            table(["", "duplicates after the scale-out (median)", "per round", "events lost", "partitions moved",
                   "seconds to settle (median)"],
                  [[SCALE_OUT_LABELS[side], number(median([r[0] for r in rounds]), ".0f"),
                    ", ".join(str(r[0]) for r in rounds), sum(r[1] for r in rounds),
                    ", ".join(str(r[2]) for r in rounds), number(median([r[3] for r in rounds]))]
                   for side, rounds in results.scale_out.items() if rounds], align="lrrrrr"),
            "", "A duplicate is a delivery, at or after the moment the two new processes start, of an event "
                      "some process had delivered before (a moved partition replays from its last checkpoint). "
                      "Ours hands a moved partition over (its owner finishes the batch, checkpoints and releases "
                      "it); the official new owner claims it over the old one, which still delivers until its next "
                      "tick, so a checkpoint on close comes after the new owner read the older one.", ""]
    return "\n".join(lines)
