"""Stateful groups: the hub's contents, the states stored, standby replicas, a stateful failover.

Used by ``tests/test_state_processes.py`` and ``python -m benchmarks.state``.

Example::

    outcome = await stateful_failover(group)
    bodies = await hub_bodies(hub_conn, hub)
    assert count_mismatches(group, bodies, await stored_states(group)) == 0
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

from .group import SETTLE_TIMEOUT, TAKEOVER_BOUND, Failover, Group, Outcome
from .worker.process import WorkerHandle

__all__ = ["Failover", "stateful_failover", "hub_bodies", "stored_states", "standby_replicas",
           "count_mismatches", "restore_mismatches"]


def _scope(group: Group) -> tuple[str, str, str]:
    started = next((w.started for w in group.workers if w.started), None)
    if started is None:
        raise RuntimeError(f"{group.label}: no worker said where it reads (no 'started' line)")
    return started["namespace"], started["eventhub"], "$default"


async def hub_bodies(connection_string: str, hub: str, *, consumer_group: str = "$default",
                     timeout: float = 60.0) -> dict[str, list[str]]:
    """Every event the hub holds, read back with azure-eventhub's consumer: partition ->
    the bodies as text, indexed by sequence number. Read it once the workers stopped (a
    receiver without an owner level is refused beside theirs on one consumer group)."""
    from azure.eventhub.aio import EventHubConsumerClient

    client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group=consumer_group,
                                                           eventhub_name=hub)
    async with client:
        ends = {pid: (await client.get_partition_properties(pid))["last_enqueued_sequence_number"]
                for pid in await client.get_partition_ids()}
        received: dict[str, dict[int, str]] = {pid: {} for pid in ends}
        complete = asyncio.Event()

        async def on_batch(context: Any, events: list[Any]) -> None:
            for event in events:
                received[context.partition_id][event.sequence_number] = event.body_as_str()
            if all(len(received[pid]) >= end + 1 for pid, end in ends.items()):
                complete.set()

        if all(end < 0 for end in ends.values()):
            complete.set()
        task = asyncio.create_task(client.receive_batch(on_batch, starting_position="-1", max_batch_size=300))
        try:
            await asyncio.wait_for(complete.wait(), timeout)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    bodies: dict[str, list[str]] = {}
    for pid, end in ends.items():
        if sorted(received[pid]) != list(range(end + 1)):
            raise RuntimeError(f"partition {pid} of hub {hub}: read back sequence numbers other than 0..{end}")
        bodies[pid] = [received[pid][n] for n in range(end + 1)]
    return bodies


async def stored_states(group: Group) -> dict[str, tuple[int, dict[str, Any]]]:
    """What a new owner of each partition would restore now, read from the group's
    Blob container with this SDK's own restore (``StateKeeper.restore``): partition ->
    (the checkpoint's sequence number, -1 without one; the per-key counts, padding left
    out)."""
    from eventprocessor.state import StateKeeper, StateLog
    from eventprocessor.stores.blob import BlobCheckpointStore

    from .worker.handlers import PAD_PREFIX

    scope = _scope(group)
    states: dict[str, tuple[int, dict[str, Any]]] = {}
    async with BlobCheckpointStore.from_connection_string(group.storage_connection_string, group.container) as store:
        checkpoints = {c.partition_id: c for c in await store.list_checkpoints(*scope)}
        for pid in sorted(group.all_partitions, key=int):
            checkpoint = checkpoints.get(pid)
            keeper = StateKeeper(StateLog(store, scope, pid), epoch=0)
            await keeper.restore(checkpoint)
            states[pid] = (checkpoint.sequence_number if checkpoint is not None else -1,
                           {k: v for k, v in keeper.state.items() if not k.startswith(PAD_PREFIX)})
    return states


async def standby_replicas(group: Group, acceptable_recovery_lag: int = 10_000) -> dict[str, set[str]]:
    """Partition -> the processes whose member record publishes a replica of it within
    ``acceptable_recovery_lag`` events (what failover chooses from)."""
    from eventprocessor.state.replica import LAGS_PROPERTY, decode_lags
    from eventprocessor.stores.blob import BlobCheckpointStore

    async with BlobCheckpointStore.from_connection_string(group.storage_connection_string, group.container) as store:
        listing = await store.list_members(*_scope(group))
    replicas: dict[str, set[str]] = {}
    for member in listing.members:
        for pid, lag in decode_lags(member.properties.get(LAGS_PROPERTY)).items():
            if lag <= acceptable_recovery_lag:
                replicas.setdefault(pid, set()).add(member.owner_id)
    return replicas


def _standby_count(group: Group) -> int:
    options = group.worker_options
    return int(options[options.index("--standbys") + 1]) if "--standbys" in options else 0


def _designated_standbys(owners: dict[str, str], processes: list[str], count: int) -> dict[str, list[str]]:
    """Partition -> the processes the SDK's standby plan (:func:`standby_plan`, pure)
    names to keep its replica, for these owners and processes."""
    from eventprocessor.state.replica import standby_plan

    plan = standby_plan(owners, processes, count)
    return {pid: sorted(m for m, kept in plan.items() if pid in kept) for pid in owners}


def count_mismatches(group: Group, bodies: dict[str, list[str]],
                     states: dict[str, tuple[int, dict[str, Any]]] | None = None) -> list[str]:
    """Where a per-key count differs from the events the hub holds: every state a claim
    restored (it must equal the count of the events up to the checkpoint it resumed
    from) and, given ``states``, the state in the store at the end (its checkpoint must
    be at the last event, its counts those of the whole partition). Empty: exact."""
    problems = restore_mismatches(group, bodies)
    for pid, (seq, counts) in sorted((states or {}).items()):
        if seq != len(bodies[pid]) - 1:
            problems.append(f"partition {pid}: the last checkpoint is at sequence number {seq}, the hub holds "
                            f"{len(bodies[pid])} events")
        expected = dict(Counter(bodies[pid][:seq + 1]))
        if counts != expected:
            problems.append(f"partition {pid}: the stored state counts {counts}, the hub's events up to its "
                            f"checkpoint say {expected}")
    return problems


def restore_mismatches(group: Group, bodies: dict[str, list[str]], *, since: float = float("-inf"),
                       until: float = float("inf")) -> list[str]:
    """Where a state a claim restored (at wall time ``since <= t < until``) differs from
    the per-key count of the hub's events up to the checkpoint it resumed from. Empty:
    exact."""
    problems = []
    for worker in group.workers:
        for restored in worker.restores:
            if not since <= restored["t"] < until:
                continue
            pid, seq = restored["p"], restored["seq"]
            expected = dict(Counter(bodies[pid][:seq + 1]))
            if restored["counts"] != expected:
                problems.append(f"{worker.owner_id} restored partition {pid} at sequence number {seq} with counts "
                                f"{restored['counts']}, the hub's events up to it say {expected}")
    return problems


async def stateful_failover(group: Group, processes: int = 3) -> Outcome:
    """Stateful processes with standbys (the group's ``worker_options`` say
    ``--stateful --standbys N``); once every partition's standbys (those the SDK's plan
    names for the current owners) publish caught-up replicas, and have for 2 s, the owner
    of the most partitions is SIGKILLed and each of its partitions must go to one of
    those standbys, restored from the warm replica."""
    started = time.monotonic()
    outcome = Outcome(f"{processes} stateful processes with standbys, SIGKILL of an owner", group.label,
                      group.partitions)
    workers = [await group.spawn(f"{group.impl}-stateful-{i}") for i in range(processes)]
    await group.start(workers)
    standbys = _standby_count(group)
    deadline = time.monotonic() + SETTLE_TIMEOUT
    stable_since: float | None = None
    last: tuple[dict[str, str], dict[str, list[str]]] | None = None
    while True:
        # Every partition owned, shares balanced, and each partition's standby, the one
        # the SDK's own rendezvous plan names for today's owners and processes, publishing
        # a caught-up replica; the same for 2 s (a few checkpoints, which the standbys
        # follow). A share reached by a move a moment ago is not enough: the plan moves
        # standbys with the owners, and a replica published for the old owner is dropped a
        # tick later while the new standby loads its own.
        shares = group.shares(workers)
        owners = {pid: w.owner_id for w in workers for pid in w.owned}
        replicas = await standby_replicas(group)
        designated = _designated_standbys(owners, [w.owner_id for w in workers], standbys)
        ready = shares is not None and len(owners) == group.partitions and all(
            designated[pid] and set(designated[pid]) <= replicas.get(pid, set()) for pid in owners)
        now = time.monotonic()
        if ready and last == (owners, designated):
            if stable_since is not None and now - stable_since >= 2.0:
                break
        else:
            stable_since = now if ready else None
        last = (owners, designated) if ready else None
        if now > deadline:
            raise TimeoutError(f"{group.label}: no caught-up standby of every partition within {SETTLE_TIMEOUT:.0f}s: "
                               f"owners {owners}, standbys planned {designated}, published {replicas}\n"
                               + "\n".join(w.diagnostics() for w in workers))
        await asyncio.sleep(0.5)
    victim = max(workers, key=lambda w: (len(w.owned), w.owner_id))
    partitions = list(victim.owned)
    outcome.failovers = [Failover(pid, designated[pid]) for pid in partitions]
    victim.kill()
    killed_at = time.time()
    await victim.process.wait()
    survivors = [w for w in workers if w is not victim]

    def first_batch(pid: str) -> float | None:
        return min((t for w in survivors for (t, p, _f, _l) in w.batches if p == pid and t > killed_at), default=None)

    def holders(pid: str) -> list[tuple[float, WorkerHandle]]:
        """The survivors that held ``pid`` after the kill, each from the first report of it."""
        held = [(min((t for t, owned in w.ownership if pid in owned and t > killed_at), default=None), w)
                for w in survivors]
        return sorted(((t, w) for t, w in held if t is not None), key=lambda tw: tw[0])

    await group.until(lambda: all(first_batch(pid) is not None for pid in partitions),
                      f"partitions {partitions} resumed after the SIGKILL", TAKEOVER_BOUND + 30)
    await group.until(lambda: group.settled(survivors), f"{len(survivors)} processes sharing the hub", SETTLE_TIMEOUT,
                      fail=False)
    for failover in outcome.failovers:
        # The failover is the first claim after the kill; a handoff after it (the taker
        # above its share) is a second move, told apart: it may come before the taker
        # delivered a batch of the partition, so the first to deliver is not the taker.
        found = first_batch(failover.partition)
        failover.takeover = round(found - killed_at, 2) if found is not None else None
        held = holders(failover.partition)
        failover.owners = [w.owner_id for _t, w in held]
        if not held:
            continue
        claimed_at, taker = held[0]
        failover.taker, failover.claimed = taker.owner_id, round(claimed_at - killed_at, 2)
        restores = [r for r in taker.restores if r["p"] == failover.partition and r["t"] > killed_at]
        if restores:
            failover.restored = round(restores[0]["t"] - killed_at, 2)
            failover.warm = bool(restores[0]["warm"])
    outcome.takeover = max(f.takeover for f in outcome.failovers if f.takeover is not None)
    outcome.taker_was_standby = all(f.taker in f.standbys for f in outcome.failovers)
    outcome.shares_after = sorted(group.shares(survivors) or [])
    await group.finish(outcome)
    outcome.seconds = time.monotonic() - started
    return outcome
