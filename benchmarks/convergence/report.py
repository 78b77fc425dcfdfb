"""The convergence benchmark's section of RESULTS.md: its targets, its tables, its notes
and its plots."""
from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

from harness.simulation import EXPIRATION_MULTIPLES

from ..toolkit.report import plots_dir
from .scenarios import (
    BALANCED,
    BUSY_WORK,
    EXPIRATION,
    IMPLEMENTATIONS,
    INTERVAL,
    PRE_ROLL,
    STRATEGIES,
    TRAFFIC,
    WORK,
    Outcome,
)
from .tables import (
    balance_factor_table,
    equal_cost_summary,
    equal_cost_table,
    failover_table,
    or_never,
    rebalance_table,
    rolling_table,
    side_by_side,
    skew_table,
    standbys_table,
    static_table,
    steady_table,
    ticks_text,
)

logger = logging.getLogger(__name__)


def check_targets(sections: dict[str, Any]) -> list[tuple[str, bool, str]]:
    """The targets this SDK must meet, each with pass/miss and the evidence."""
    checks: list[tuple[str, bool, str]] = []
    ours = lambda section: [o for o in sections[section] if o.implementation == "ours"]  # noqa: E731
    for o in ours("rebalance"):
        name = f"{o.scenario} {o.schedule} {o.strategy.value}"
        if o.scenario.startswith("cold start"):
            t = o.phase.ticks_to_balanced
            if o.strategy is BALANCED:
                ok = t is not None and t <= o.limit_ticks + 1 and o.phase.steals == 0
                checks.append((f"{name}: <= ceil(P/N)+1 = {o.limit_ticks + 1} ticks, 0 steals", ok,
                               f"{t} ticks, {o.phase.steals} steals"))
            else:
                checks.append((f"{name}: 1 tick", t == 1, f"{t} ticks"))
        elif o.scenario.startswith("scale out"):
            ok = o.phase.moves == o.min_moves and o.phase.duplicates == 0
            checks.append((f"{name}: moves = minimum {o.min_moves}, 0 duplicates", ok,
                           f"{o.phase.moves} moves, {o.phase.duplicates} duplicates"))
        elif o.scenario.startswith("graceful scale in"):
            checks.append((f"{name}: 0 duplicates", o.phase.duplicates == 0, f"{o.phase.duplicates} duplicates"))
    for ours_o, off_o in side_by_side(sections["failover"]):
        e = ours_o.extra
        got = e["ticks_past_expiry"]
        ok = got is not None and got <= e["forced_ticks"] + 1e-9
        name = f"{ours_o.scenario} {ours_o.schedule} {ours_o.strategy.value}"
        checks.append((f"{name}: orphans re-owned within expiry + {e['forced_ticks']} tick(s)", ok,
                       f"{or_never(got)} ticks past expiry"))
        checks.append((f"{name}: duplicates <= the official's", ours_o.phase.duplicates <= off_o.phase.duplicates,
                       f"{ours_o.phase.duplicates} vs {off_o.phase.duplicates}"))
    for o in ours("rolling"):
        checks.append((f"{o.scenario} {o.schedule} {o.strategy.value}: 0 duplicates", o.phase.duplicates == 0,
                       f"{o.phase.duplicates} duplicates, longest pause {o.extra['pause_max']:.1f} s"))
    for o in ours("standbys"):
        e = o.extra
        bound = e["expiry_s"] + INTERVAL
        ok = e["standbys"] == e["expected_standbys"] and e["by_standby"] and e["resumed_s"] is not None \
            and e["resumed_s"] <= bound
        checks.append((f"{o.scenario} {o.schedule} {o.strategy.value}: {e['expected_standbys']} standbys; one takes "
                       "over within the expiration (by the first tick after the orphan's record expired)", ok,
                       f"{e['standbys']} standbys, by a standby: {'yes' if e['by_standby'] else 'no'}, resumed "
                       f"{or_never(e['resumed_s'])} s after the crash; record expired after {e['expiry_s']:.1f} s "
                       f"(bound {bound:.1f} s), the crashed member's record after {or_never(e['member_expiry_s'])} s"))
    for o in sections["static"]:
        e = o.extra
        taken_late = e["resumed_s"] is not None and e["member_expiry_s"] is not None \
            and e["resumed_s"] >= e["member_expiry_s"]
        ok = e["shares_ok"] and taken_late and e["return"].ticks_to_balanced is not None \
            and e["return"].steals == 0 and e["return"].duplicates == 0
        checks.append((f"{o.scenario} {o.schedule}: shares by ordinal; the crashed ordinal's share is taken only once "
                       "its member record expired; it returns by handoff with 0 duplicates", ok,
                       f"shares {'ok' if e['shares_ok'] else 'wrong'}; resumed {or_never(e['resumed_s'])} s after the "
                       f"crash, member record expired after {or_never(e['member_expiry_s'])} s; returned in "
                       f"{ticks_text(e['return'])} ticks with {e['return'].handoffs} handoffs, "
                       f"{e['return'].steals} steals, "
                       f"{e['return'].duplicates} duplicates"))
    by_factor: dict[str, dict[int, Outcome]] = {}
    for o in sections["balance_factor"]:
        by_factor.setdefault(o.strategy.value, {})[o.extra["factor"]] = o
    for strategy, factors in by_factor.items():
        one = factors.get(1)
        for factor, o in sorted(factors.items()):
            ok = o.extra["spread"] <= factor and o.phase.duplicates == 0 and \
                (one is None or o.phase.moves <= one.phase.moves)
            checks.append((f"balance_factor={factor} {strategy}: spread <= {factor}, moves <= factor 1's, "
                           "0 duplicates", ok,
                           f"spread {o.extra['spread']}, {o.phase.moves} moves, {o.phase.duplicates} duplicates"))
    for o in ours("steady"):
        checks.append((f"{o.scenario} {o.schedule} {o.strategy.value}: 0 ownership changes",
                       o.phase.owner_changes == 0, f"{o.phase.owner_changes} changes"))
    for ours_o, off_o in side_by_side(sections["steady"]):
        ratio = ours_o.extra["per_hour"] / off_o.extra["per_hour"]
        # With store latency the official loop ticks less often (each tick waits for its
        # writes), so it makes fewer requests per hour while renewing less often; the
        # half-cost target is for equal work, without latency.
        slowed = bool(ours_o.extra.get("latency"))
        limit = 1.0 if slowed else 0.5
        checks.append((f"{ours_o.scenario} {ours_o.schedule} {ours_o.strategy.value}: storage requests/hour <= "
                       f"{'the official' if slowed else 'half the official'}'s at the same settings", ratio <= limit,
                       f"{ours_o.extra['per_hour']:.0f} vs {off_o.extra['per_hour']:.0f} ({ratio:.2f})"))
    for o in ours("skew"):
        e = o.extra
        ok = e["steals_by_skewed"] == 0 and o.phase.duplicates == 0
        checks.append((f"{o.scenario} {o.strategy.value}: the skewed instance steals no live partition; 0 "
                       "duplicates before the crash", ok,
                       f"{e['steals_by_skewed']} steals, {o.phase.duplicates} duplicates"))
    eq = sections.get("equal_cost")
    if eq:
        official, chosen = eq["official"], eq["chosen"]
        best = eq.get("official_best") or official
        if chosen is None:
            checks.append(("equal-cost failover: settings with the official's requests/hour (within 3 %)", False,
                           "no candidate matched"))
        else:
            ratio = (chosen.mean_resumed or math.inf) / (official.mean_resumed or math.inf)
            checks.append((f"equal-cost failover ({chosen.label}, {chosen.measured_per_hour:.0f} vs "
                           f"{official.measured_per_hour:.0f} requests/hour): crash to resumed <= half the official's "
                           "at its defaults", ratio <= 0.5,
                           f"mean {chosen.mean_resumed:.1f} s vs {official.mean_resumed:.1f} s ({ratio:.2f})"))
            best_ratio = (chosen.mean_resumed or math.inf) / (best.mean_resumed or math.inf)
            checks.append((f"equal-cost failover, each side's best within the budget ({chosen.label} vs {best.label}): "
                           "crash to resumed <= the official's", best_ratio <= 1.0,
                           f"mean {chosen.mean_resumed:.1f} s vs {best.mean_resumed:.1f} s ({best_ratio:.2f})"))
    runs = [o for key, s in sections.items() if key != "equal_cost" for o in s if o.implementation == "ours"]
    worst = max((o.phase.max_deliverers for o in runs), default=0)
    overlap = sum(o.phase.overlap_seconds for o in runs)
    checks.append(("no two claims of this SDK deliver one partition at the same virtual instant (measured from the "
                   "handlers' batches)", worst <= 1 and overlap == 0,
                   f"max {worst} deliverers of one partition; {overlap:.2f} partition-seconds of overlap in all runs"))
    lost = sum(o.extra.get("undelivered", 0) for o in runs)
    checks.append(("no event left undelivered (this SDK, every run with traffic)", lost == 0, f"{lost} events"))
    return checks


# --------------------------------------------------------------------------- plots


def plot(outcomes: Sequence[Outcome], scenario: str, filename: str) -> str | None:
    """Partitions per instance over ticks, this SDK beside the official processor
    (rows: strategies; staggered schedule)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is in the benchmark deps
        logger.warning("matplotlib is not installed; skipping %s", filename)
        return None
    chosen = {(o.strategy, o.implementation): o for o in outcomes
              if o.scenario == scenario and o.schedule == "staggered"}
    if not chosen:
        return None
    fig, axes = plt.subplots(len(STRATEGIES), 2, figsize=(12, 4 * len(STRATEGIES)), sharey="row", squeeze=False)
    for r, strategy in enumerate(STRATEGIES):
        for c, impl in enumerate(IMPLEMENTATIONS):
            ax = axes[r][c]
            o = chosen.get((strategy, impl))
            if o is None:
                ax.set_visible(False)
                continue
            owners = sorted({owner for _t, counts in o.samples for owner in counts})
            ticks = [t for t, _c in o.samples]
            spread = 0.25 / max(1, len(owners))
            for k, owner in enumerate(owners):
                # A small offset per instance keeps equal lines apart.
                shift = (k - (len(owners) - 1) / 2) * spread
                ax.step(ticks, [counts.get(owner, 0) + shift for _t, counts in o.samples], where="post",
                        linewidth=1)
            if o.event_tick:
                ax.axvline(o.event_tick, color="grey", linestyle="--", linewidth=1)
            name = "this SDK" if impl == "ours" else "azure-eventhub EventProcessor"
            ax.set_title(f"{name}, {strategy.value}: {ticks_text(o.phase)} ticks, {o.phase.moves} moves, "
                         f"{o.phase.steals} steals, {o.phase.duplicates} duplicate events", fontsize=9)
            ax.set_xlabel("tick (load-balancing intervals)")
            ax.set_ylabel("partitions owned")
            ax.grid(alpha=0.3)
    fig.suptitle(f"{scenario}: partitions per instance (staggered ticks; dashed line: the event; "
                 "lines offset slightly to stay visible)", fontsize=10)
    fig.tight_layout()
    plots_dir().mkdir(parents=True, exist_ok=True)
    path = plots_dir() / filename
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return filename


# --------------------------------------------------------------------------- main


def notes(sections: dict[str, Any]) -> list[str]:
    eq = sections["equal_cost"]
    p, n = eq["size"]
    return [
        "- Duplicates come from the batches: an event handed to a handler that some handler had been given before "
        "counts once per extra delivery (a batch cut short by a cancellation counts: its handler had the events). "
        "The official processor cannot hand a partition over: it steals, the new owner resumes from the last "
        "checkpoint, and the victim's batch in flight (or the batch its own next tick cancels) is delivered again. "
        f"How many events that is depends on how busy handlers are (here {WORK * 1000:.0f} ms per "
        f"{TRAFFIC.step:g} s; {BUSY_WORK * 1000:.0f} ms in the busy-handler rows): its column shows what a steal "
        "costs at that load. Its graceful stop cancels the receive tasks, so the batches in flight are delivered "
        "again too. Crashes, stops and rolling restarts are timed half-way through a batch of every partition, the "
        "worst moment, the same for both; a crash then costs both SDKs exactly the batches in flight.",
        "- This SDK moves partitions between live processors by handoff: the processor that needs one marks the "
        "record (`requested_by`), the owner sees the mark at its next tick, its pump finishes the batch, "
        "checkpoints it, closes with HANDOFF and writes the record over to the claimer, which adopts it at its "
        "next tick. A stop does the same towards nobody. Steals happen only after `handoff_timeout` (30 s) without "
        "an answer. The price is time: a moved partition pauses from the owner's close to the claimer's next tick "
        "(up to one interval), and in BALANCED mode under lockstep ticks each move takes two ticks (the mark is "
        "seen one tick later, the handoff one more), which is why some scale-out tick counts exceed the "
        "one-per-tick limit and the rolling-restart pauses are longer than the official's, which starts the "
        "stolen partition at once (and delivers its batch twice).",
        "- A crashed processor's member record keeps it in every plan until that record expires too, so the "
        "orphans can be dealt to the dead member meanwhile: where the standbys' and crashes' crash-to-resumed "
        "times exceed the orphans' record expiry by more than a tick, they follow the crashed member's record "
        "expiry (standbys table). After a crash, GREEDY survivors each take only their own share of the plan, "
        "and the extra slots move to whoever holds the most as they claim, so the last orphans can wait a second "
        "round of ticks.",
        "- Storage traffic. Both are billed one request per listing and one per record written. The official "
        "loop lists once and rewrites every owned record every tick: `(N + P) / tick`. This SDK lists ownership "
        "and members in one request every tick (one listing of the `ownership` prefix returns both), rewrites "
        "each owned record once it is `renewal age` old (by default when 15 s of its lease remain, at least E/2) "
        "and its member record every E/4: `N / I + P / R + 4N / E` per second. Checkpoint writes are the "
        "application's cadence and the same for both; they are left out of every request count.",
        "- Equal-cost failover: the budget is the official processor's measured cost at its defaults (30 s "
        "interval, 180 s expiration, loop sleeping 30 s x (1 + U(0, 0.2))). Both sides choose from the same "
        "candidate settings within that budget, each by its own cost, and are crashed at "
        f"{len(eq['offsets'])} instants spread over 180 s (P={p}, N={n}, GREEDY, each SDK's own loop jitter); each "
        "side's setting with the shortest mean crash-to-resumed time is its best (this SDK's among those with the "
        "default renewal age is *chosen*; those with the renewal age at E/2 are a second set). The official "
        "processor renews every record every tick, so its cost is set by the interval alone and it can afford no "
        "interval under 30 s here; its expiration costs it nothing, and its shortest candidate wins. Resumed = the "
        "last orphan's first batch at a survivor.",
        "- Partition growth: the official `OwnershipManager` fetches the partition ids once and caches them for the "
        "life of the processor (`cached_parition_ids`), so it never claims partitions added later (*never*); "
        "their events are never delivered.",
        "- Clock skew: the official balancer compares the store's `last_modified_time` with its own `time.time()`; "
        "an instance 5 minutes ahead sees every record as expired and takes live partitions every tick. This SDK "
        "judges expiry as `listing.server_time - last_modified_time`, both from the store, and times its own lease "
        "with a monotonic clock, so the skew changes nothing.",
        "- Greedy cold start: every processor writes its member record before its first tick, so every plan "
        "counts all of them and each takes its own share in its first tick.",
    ]


def render(sections: dict[str, Any], head: str, plots: Sequence[str]) -> str:
    """The section: ``head`` (the line under the title, :meth:`~benchmarks.toolkit.program.Run.header`),
    the targets, the tables, the notes and the plots."""
    checks = check_targets(sections)
    lines = [
        "## Rebalance convergence: this SDK vs azure-eventhub's processor",
        "",
        head,
        "",
        f"Virtual time (`eventprocessor.testing.VirtualTimeLoop`, one fresh loop per run); load-balancing interval "
        f"{INTERVAL:.0f} s and ownership expiration {EXPIRATION:.0f} s for both unless a table says otherwise. "
        "*ours* is `eventprocessor.EventProcessor` with its defaults (other than the timing a table names), "
        "started with `start(balancing=False)`: its renewer, lease keeper, heartbeat, pumps and store deadlines "
        "run on the loop's clock, each tick is one `balance_once()` (the real taker: list, claim, fence), and "
        "its store bills every request, checkpoint fences included. "
        "*official* is "
        "`azure.eventhub.aio._eventprocessor._ownership_manager.OwnershipManager` driven and dispatched like its "
        "`EventProcessor` (claim, `get_checkpoints()` for new partitions, one receive task each with owner level "
        "0, cancel what the claim no longer returns, release when a task ends, unfenced checkpoints). Both use a "
        "store with Blob semantics (create-if-absent, If-Match etags, store-side last-modified time). Traffic: "
        f"{TRAFFIC.per_step} events per partition every {TRAFFIC.step:g} s into one `InMemoryEventSource` (same "
        f"receiver semantics for both: a new receiver with an equal or higher owner level disconnects the old "
        f"one); each handler spends {WORK * 1000:.0f} ms per batch and then checkpoints it. Traffic starts "
        f"{PRE_ROLL:g} s before each scenario's event (at t=0 for cold starts; cold starts above "
        "P=128 run without). *staggered*: each instance at its own random phase; *lockstep*: all instances list "
        "the same snapshot, then all write (writes of one instant interleave at random). Ticks count load-balancing "
        "rounds to the start of the final balanced stretch (every partition owned by a live instance, max-min <= 1, "
        "held for expiry + 2 ticks). A move gives a partition to a new owner; a steal is a claim of a record that "
        "had not expired; a handoff is a record written over by its owner. *Duplicate events*, *overlap* "
        "(partition-seconds during which batches of two different claims of one partition were both in their "
        "handlers) and *max deliverers* (the most claims inside a batch of one partition at one instant) are "
        "measured from what the handlers were given. Requests exclude checkpoint writes.",
        "",
        "### Targets (this SDK)",
        "",
        "| Target | Met | Measured |",
        "|---|---|---|",
    ]
    lines += [f"| {name} | {'yes' if ok else '**no**'} | {evidence} |" for name, ok, evidence in checks]
    lines += ["", "### Cold start, scale out, scale in, partition growth", "", rebalance_table(sections["rebalance"])]
    lines += ["", "### Crash and failover", "",
              "Limit: a record can only be taken once expired; after that the one-per-tick rule forces "
              "`ceil(orphans / survivors)` ticks in BALANCED mode and 1 in GREEDY mode. *Re-owned*: the store "
              "names a survivor for every orphan; *resumed*: every orphan's first batch at a survivor.", "",
              failover_table(sections["failover"])]
    lines += ["", "### Rolling restart", "",
              "Each instance in turn stops (half-way through a batch of every partition) and a new one starts 5 s "
              "later; the next stops once the group has been balanced for 2 ticks. Pauses are gaps between "
              "consecutive batches of one partition (1 s apart in steady state).", "",
              rolling_table(sections["rolling"])]
    lines += ["", "### Standbys", "",
              "More instances than partitions: after the cold start the extra ones own nothing; then an owner "
              "crashes.", "", standbys_table(sections["standbys"])]
    lines += ["", "### Static assignment and balance factor (this SDK only)", "",
              "STATIC: partition i belongs to ordinal `i % replica_count`; a missing ordinal's share is spread "
              "over the others once its member record expired (its partitions' records may still be live: those "
              "claims count as claims of live records), and goes back by handoff when it returns. The official "
              "processor has no equivalent.", "", static_table(sections["static"]), "",
              "`balance_factor`: the imbalance left alone between live owners (KIP-441); the official processor "
              "has no equivalent.", "", balance_factor_table(sections["balance_factor"])]
    lines += ["", "### Steady state", "", "Without traffic: storage requests of a balanced group.", "",
              steady_table(sections["steady"])]
    eq = sections["equal_cost"]
    p, n = eq["size"]
    shared = "; ".join(f"I={i:g} s: E in {{{', '.join(f'{e:g}' for e in es)}}}" for i, es in eq["shared"].items())
    lines += ["", "### Failover at equal cost", "",
              f"P={p}, N={n}, GREEDY, each SDK's own loop timing. The budget is the official processor's storage "
              f"requests per hour at its defaults ({eq['budget']:.0f} by its formula; "
              f"{eq['official'].measured_per_hour:.0f} measured). Both sides choose from the same "
              f"candidates ({shared} s: for each interval this SDK's shortest whole-second expiration within the "
              f"budget, under each renewal rule, and {', '.join(map(str, EXPIRATION_MULTIPLES))} intervals), each "
              "keeping, per interval, the shortest expiration within the budget by its own cost formula and then "
              "by its measured cost (3 % of noise allowed); every setting kept is crashed at the same instants and "
              "each side's "
              "best mean crash-to-resumed time is marked. Requests per hour, formulas: this SDK "
              "`3600 x (N/I + P/R + 4N/E)` (one listing of ownership and members per tick; each record rewritten "
              "once per renewal age R, by default max(E/2, lease - 15 s); the member record every E/4); official "
              "`3600 x (N+P) / (1.1 I)` (one listing and one rewrite per owned "
              f"record per tick, ticks every I x (1 + U(0, 0.2))): its cost does not depend on the expiration, so "
              "within the budget it takes the shortest candidate at the intervals it can afford. Crash to resumed "
              f"is measured at {len(eq['offsets'])} crash instants, {', '.join(f'{o:.0f}' for o in eq['offsets'])} s "
              "after the group settled.", "", equal_cost_table(eq), ""]
    lines += equal_cost_summary(eq)
    lines += ["", "### Clock skew", "",
              "One instance's local clock is 5 minutes ahead of the store; after a cold start and a steady stretch "
              "with traffic another instance crashes.", "", skew_table(sections["skew"])]
    lines += ["", "### Notes", "", *notes(sections)]
    if plots:
        lines += ["", "### Plots", ""] + [f"![{name}](results/{name})" for name in plots]
    return "\n".join(lines)
