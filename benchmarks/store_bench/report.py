"""The store benchmark's section of RESULTS.md: the headline, the stores, the comparisons
round by round, the load of each round."""
from __future__ import annotations

from collections.abc import Sequence

from ..toolkit.machine import LoadReading
from ..toolkit.report import busy_flag, median_range, number, package_version, table
from .measure import PHASES, Comparison, StoreResult, compare, summarize
from .stores import OFFICIAL_STORE

__all__ = ["render"]


# The headline's comparisons, in the order the sentence states them.
_HEADLINE = (
    ("ours-blob", "official-blob", "the official Blob store (azure-eventhub-checkpointstoreblob-aio {version} at "
                                   "its defaults, unfenced, on the same Azurite Blob service)"),
    ("ours-blob", "bare-blob", "its floor (a bare conditional Blob write)"),
    ("ours-table", "bare-table", "its floor (a bare conditional Table update)"),
)


def _verdict(comparisons: Sequence[Comparison], loads: Sequence[LoadReading]) -> list[str]:
    """The headline: checkpoint throughput and client CPU of our stores against the official
    store and the floors, as medians of the per-round ratios with their range, per partition
    count. Only figures the tables below show; on a busy machine it says it is not a result."""
    by_key = {(c.store.kind, c.reference.kind, c.store.partitions): c for c in comparisons}
    sentences = []
    for partitions in sorted({c.store.partitions for c in comparisons}):
        parts = []
        for kind, reference, what in _HEADLINE:
            c = by_key.get((kind, reference, partitions))
            if c is None or not c.throughput:
                continue
            store = "our fenced Blob store" if kind == "ours-blob" else "our fenced Table store"
            cpu = f" with {median_range(c.cpu, '.2f', 'x')} its client CPU per checkpoint" if c.cpu else ""
            parts.append(f"{store} at {median_range(c.throughput, '.2f', 'x')} the checkpoints/s of "
                         f"{what.format(version=package_version(OFFICIAL_STORE))}{cpu}")
        if parts:
            sentences.append(f"At {partitions} partitions: " + "; ".join(parts) + ".")
    if not sentences:
        return []
    rounds = max(len(c.throughput) for c in comparisons)
    lead = "**Headline (busy machine, not a result)**" if any(r.busy for r in loads) else "**Headline**"
    return [f"{lead}, medians of {rounds} per-round ratio(s), range in brackets. "
            + " ".join(sentences), ""]


def render(
    results: list[StoreResult], *, header: str, concurrency: int, checkpoint_ops: int, phase_ops: int,
    list_repeats: int, rounds: int, loads: Sequence[LoadReading],
) -> str:
    """The section: a busy-machine flag when there is one, the stores, the comparisons."""
    summaries = summarize(results)
    lines = [
        "## Checkpoint stores on Azurite (`store_bench`)",
        "",
        header,
        "",
        *busy_flag(loads, "these figures"),
        *_verdict(compare(summaries), loads),
        f"Azurite (in-memory persistence) on 127.0.0.1, started by the benchmark; the Python client and "
        f"Azurite share the machine. Concurrency: {concurrency} asyncio workers in one process, each owning "
        f"a disjoint set of partitions. Each store gets a fresh container/table per round; {rounds} "
        f"round(s), the stores of a round run back to back, their order rotated each round; figures are the "
        f"median over rounds (min-max in brackets). Claims: every partition created once (create-if-absent), "
        f"then re-claimed with its etag, over all partitions until at least {phase_ops} re-claims. Fences (our "
        f"stores; the official one has none): the fence a new owner writes after its claim, repeated like the "
        f"re-claims. Checkpoints: {checkpoint_ops} timed steady-state writes per round (after one untimed write "
        f"per target partition; targets are the first min(N, {checkpoint_ops}) partitions). Client CPU: this "
        f"process's CPU time over the phase per operation (Azurite's is not in it). Listing: {list_repeats} "
        f"sequential listings of all N records per round, pooled. Requests: HTTP requests counted at the "
        f"transport (retries included), per operation. *official*: azure-eventhub-checkpointstoreblob-aio "
        f"{package_version(OFFICIAL_STORE)} with its defaults (one unconditional `set_blob_metadata` per checkpoint). "
        f"*floor*: the request a fenced checkpoint cannot do without, sent with the bare Azure SDK and nothing "
        f"else: a conditional write If-Match the etag of the previous one, the same four fields.",
        "",
        table(["Store", "Partitions", "timed ops per round: create / re-claim / fence / checkpoint",
               "create claims/s", "req/create", "re-claims/s", "req/re-claim", "fences/s", "req/fence",
               "checkpoints/s", "req/checkpoint", "client CPU ms/checkpoint", "list median ms", "list p95 ms",
               "req/list"],
              [[g.store, g.partitions, " / ".join(g.ops(phase) for phase in PHASES),
                g.rates("create"), number(g.requests("create"), ".2f"), g.rates("reclaim"),
                number(g.requests("reclaim"), ".2f"), g.rates("fence"), number(g.requests("fence"), ".2f"),
                g.rates("checkpoint"), number(g.requests("checkpoint"), ".2f"), g.cpu_ms("checkpoint"),
                number(g.list_median), number(g.list_p95), number(g.list_requests, ".1f")] for g in summaries],
              align="lrrrrrrrrrrrrrr"),
    ]
    lost = [g for g in summaries if g.failures("create") or g.failures("reclaim")]
    if lost:
        lines += ["", "Lost claims (should be 0 with a single owner): " + ", ".join(
            f"{g.store} @ {g.partitions}: {g.failures('create')} creates, {g.failures('reclaim')} re-claims"
            for g in lost
        )]

    comparisons = compare(summaries)
    if comparisons:
        lines += [
            "",
            "Checkpoints compared round by round (the stores of a round ran back to back): the median and the range "
            "of the per-round ratios of checkpoint throughput (below 1x: slower) and of client CPU per checkpoint "
            "(above 1x: more CPU). Ours against the official store compares like with like (one Azurite Blob "
            "service, the same blob layout, the same Azure transport): it is what fencing costs. Each store against "
            "its floor shows what is left above the request itself. The official store has no Table backend, so "
            "our Table store is compared with its own floor and, as a comparison of backends and not of "
            "implementations, with our Blob store.",
            "",
            table(["Comparison", "Partitions", "rounds", "checkpoints/s ratio, median (range)",
                   "client CPU per checkpoint ratio, median (range)", "client CPU ms/checkpoint, store vs reference",
                   "requests per checkpoint by method, store vs reference"],
                  [[c.meaning, c.store.partitions, len(c.throughput), median_range(c.throughput, ".2f", "x"),
                    median_range(c.cpu, ".2f", "x"),
                    f"{c.store.cpu_ms('checkpoint')} vs {c.reference.cpu_ms('checkpoint')}",
                    f"{c.store.methods('checkpoint')} vs {c.reference.methods('checkpoint')}"] for c in comparisons],
                  align="lrrrr"),
        ]
    fenced = [g for g in summaries if g.fenced and g.has("fence")]
    if fenced:
        lines += ["", "A fence is paid once per won claim: " + "; ".join(
            f"{g.store} @ {g.partitions}: {g.methods('fence')}" for g in fenced) + "."]
    if loads:
        lines += ["", "Load per round (all partition counts): " + "; ".join(
            f"round {i + 1}: other processes {number(r.other_cores, '.2f')} cores, 1-minute load average "
            f"{number(r.load_start)}/{number(r.load_end)} at start/end" for i, r in enumerate(loads)) + "."]
    return "\n".join(lines) + "\n"
