"""The PostgreSQL sink's fault scenarios over many seeds: the long run the tests sample
once. Run from the checkout root::

    python -m harness.postgres_soak --rounds 20            # in-process scenarios, 20 seeds each
    python -m harness.postgres_soak --rounds 5 --processes # and the OS-process ones

It starts its own PostgreSQL (two: the restart scenario restarts its own). Each round
runs every scenario with that round's seed: a frozen owner at each step of the
transaction, one let go before its session ends, a commit whose answer is lost (carried
out, and not), a connection cut at each step, the database restarted mid-transaction, a
planned move under load; with ``--processes`` also the SIGKILL chain over the steps in a
shuffled order and a SIGSTOP zombie at each step. It prints one line per scenario (runs,
duplicates, missing, seconds) and exits 1 if any run left an event twice or not at all.
"""
from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable

from .postgres_processes import Outcome, kill_chain
from .postgres_processes import zombie as process_zombie
from .postgres_scenarios import cut_connection, lost_commit, move_under_load, restart, zombie
from .postgres_worker import STEPS

Scenario = Callable[[int], Awaitable[Outcome]]


def _scenarios(dsn: str, restartable: object, log_dir: str, processes: bool) -> dict[str, Scenario]:
    def frozen(step: str) -> Scenario:
        return lambda seed: zombie(dsn, step=step, seed=seed)

    def cut(step: str) -> Scenario:
        return lambda seed: cut_connection(dsn, step=step, seed=seed)

    def stopped(step: str) -> Scenario:
        return lambda seed: process_zombie(dsn, log_dir, step=step, nth=1 + seed % 3)

    found: dict[str, Scenario] = {f"zombie at {step}": frozen(step) for step in STEPS[:4]}
    found["zombie whose session the server ended"] = lambda seed: zombie(dsn, step="after_write", seed=seed,
                                                                        session_ended=True)
    found["lost COMMIT answer, carried out"] = lambda seed: lost_commit(dsn, committed=True, seed=seed)
    found["lost COMMIT answer, never arrived"] = lambda seed: lost_commit(dsn, committed=False, seed=seed)
    found.update({f"connection cut at {step}": cut(step) for step in STEPS[:3]})
    found["database restarted mid-transaction"] = lambda seed: restart(restartable, seed=seed)
    found["planned move under load"] = lambda seed: move_under_load(dsn, seed=seed)
    if processes:
        found["SIGKILL chain, every step"] = lambda seed: kill_chain(
            dsn, log_dir, steps=random.Random(seed).sample(STEPS, len(STEPS)), seed=seed)
        found.update({f"SIGSTOP zombie at {step}": stopped(step) for step in STEPS[:4]})
    return found


async def _soak(dsn: str, restartable: object, log_dir: str, rounds: int, first_seed: int,
                processes: bool) -> dict[str, list[tuple[int, int, float]]]:
    results: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    scenarios = _scenarios(dsn, restartable, log_dir, processes)
    for seed in range(first_seed, first_seed + rounds):
        for name, scenario in scenarios.items():
            began = time.monotonic()
            outcome = await scenario(seed)
            results[name].append((outcome.duplicates, outcome.missing, time.monotonic() - began))
            if outcome.exactly_once() is not None:
                print(f"seed {seed}, {name}: {outcome.exactly_once()}", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.postgres_soak", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="seeds per scenario (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--processes", action="store_true", help="also the OS-process scenarios (slower)")
    args = parser.parse_args(argv)
    from eventprocessor.emulators.postgres import start_postgres

    settings = {"fsync": "off"}
    with start_postgres(settings=settings) as server, start_postgres(settings=settings) as restartable, \
            tempfile.TemporaryDirectory(prefix="postgres-soak-") as log_dir:
        results = asyncio.run(_soak(server.dsn, restartable, log_dir, args.rounds, args.seed, args.processes))
    failed = False
    print(f"{'scenario':45} {'runs':>5} {'duplicates':>10} {'missing':>8} {'s/run':>6}")
    for name, runs in results.items():
        duplicates, missing = sum(r[0] for r in runs), sum(r[1] for r in runs)
        failed = failed or bool(duplicates or missing)
        print(f"{name:45} {len(runs):5} {duplicates:10} {missing:8} {sum(r[2] for r in runs) / len(runs):6.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
