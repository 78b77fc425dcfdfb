"""The planned-move scenarios: scale out and in, a rolling restart, a standby's takeover.

:func:`scale_2_4_2`, :func:`rolling_restart` and :func:`standby_takeover` each drive a
:class:`~harness.group.Group` and return its
:class:`~harness.group.Outcome`; they are the scenarios of
``tests/test_handoff_processes.py`` and ``python -m benchmarks.moves``.

Example::

    partitions, scenario = SCENARIOS["scale"]
    outcome = await scenario(group)
    assert outcome.duplicates == 0 and outcome.lost == 0
"""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from .group import SETTLE_TIMEOUT, STARTUP_TIMEOUT, TAKEOVER_BOUND, Group, Outcome, fair_shares

__all__ = ["SCENARIOS", "scale_2_4_2", "rolling_restart", "standby_takeover"]


async def scale_2_4_2(group: Group) -> Outcome:
    """2 processes, then 4, then 2 again (the added ones stopped gracefully)."""
    started = time.monotonic()
    outcome = Outcome("scale 2 -> 4 -> 2", group.label, group.partitions)
    first = [await group.spawn(f"{group.impl}-scale-{i}") for i in range(2)]
    await group.start(first)
    more = [await group.spawn(f"{group.impl}-scale-{i}") for i in (2, 3)]
    outcome.settle.append(await group.until(lambda: group.settled(first + more), "4 processes sharing the hub",
                                            SETTLE_TIMEOUT))
    await asyncio.sleep(2.0)
    for worker in more:
        await worker.stop()  # SIGTERM: a graceful stop
    outcome.settle.append(await group.until(lambda: group.settled(first), "2 processes sharing the hub again",
                                            SETTLE_TIMEOUT))
    await asyncio.sleep(2.0)
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


async def rolling_restart(group: Group) -> Outcome:
    """4 processes, each stopped gracefully and started again under its name in turn."""
    started = time.monotonic()
    outcome = Outcome("rolling restart of 4", group.label, group.partitions)
    running = [await group.spawn(f"{group.impl}-roll-{i}") for i in range(4)]
    await group.start(running)
    for index in range(4):
        stopped = running[index]
        step = time.monotonic()
        await stopped.stop()  # SIGTERM: a graceful stop
        survivors = [w for w in running if w is not stopped]
        await group.until(functools.partial(group.settled, survivors),
                          f"3 processes sharing the hub after {stopped.owner_id} "
                          "stopped", SETTLE_TIMEOUT)
        running[index] = await group.spawn(stopped.owner_id)  # the same name, as a StatefulSet restarts a pod
        await group.until(lambda: group.settled(running), f"4 processes sharing the hub after {stopped.owner_id} "
                          "restarted", STARTUP_TIMEOUT)
        outcome.settle.append(time.monotonic() - step)
        await asyncio.sleep(1.0)
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


async def standby_takeover(group: Group) -> Outcome:
    """8 processes on 4 partitions; the owner of one partition is SIGKILLed."""
    started = time.monotonic()
    outcome = Outcome("8 processes on 4 partitions, SIGKILL of an owner", group.label, group.partitions)
    workers = [await group.spawn(f"{group.impl}-standby-{i}") for i in range(8)]
    await group.start(workers)
    await asyncio.sleep(3.0)  # long enough for a checkpoint or two before the crash
    shares = group.shares(workers)
    if shares is None or sorted(shares) != fair_shares(group.partitions, len(workers)):
        raise RuntimeError(f"{group.label}: the processes did not stay at one partition per owner: {shares}")
    standbys = {w.owner_id for w, share in zip(workers, shares, strict=False) if share == 0}
    victim = next(w for w, share in zip(workers, shares, strict=False) if share)
    partition = next(iter(group.recent([victim])))
    victim.kill()
    killed_at = time.time()
    await victim.process.wait()
    survivors = [w for w in workers if w is not victim]

    def resumed() -> list[tuple[float, str]]:
        return sorted((t, w.owner_id) for w in survivors for (t, p, _f, _l) in w.batches
                      if p == partition and t > killed_at)

    await group.until(lambda: bool(resumed()), f"partition {partition} resumed after the SIGKILL",
                      TAKEOVER_BOUND + 30)
    first_batch_at, taker = resumed()[0]
    outcome.takeover = first_batch_at - killed_at
    outcome.taker_was_standby = taker in standbys
    claims = [t for w in survivors for (t, owned) in w.ownership if partition in owned and t > killed_at]
    outcome.claimed = min(claims) - killed_at if claims else None
    await group.until(lambda: group.settled(survivors), "7 processes sharing the hub", SETTLE_TIMEOUT, fail=False)
    outcome.shares_after = sorted(group.shares(survivors) or [])
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


Scenario = Callable[[Group], Awaitable[Outcome]]
SCENARIOS: dict[str, tuple[int, Scenario]] = {
    "scale": (8, scale_2_4_2),
    "rolling": (8, rolling_restart),
    "standby": (4, standby_takeover),
}
"""Scenario name -> (partitions of its hub, the scenario)."""
