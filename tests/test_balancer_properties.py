"""Property tests of the balancer over random ownership states, partition counts and
process counts (hypothesis). Every run uses the real ``decide`` and the real in-memory
store semantics (etags, create-if-absent)."""
from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta, timezone

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventprocessor._ownership.balancer import decide
from eventprocessor._ownership.strategies import ORDINAL_PROPERTY, STRATEGIES, BalanceView
from eventprocessor.policies import LoadBalancingStrategy
from eventprocessor.stores.records import Ownership, OwnershipListing
from tests.balancing import CG, EXPIRATION, HUB, INTERVAL, NS, Cluster, steal_is_allowed

OWNERS = "ABCDEFGHIJ"


@st.composite
def cluster_states(draw):
    partitions = draw(st.integers(min_value=1, max_value=40))
    processes = draw(st.integers(min_value=1, max_value=8))
    # each partition: no record, owned by a live process, or held by a dead one (expired)
    choices = st.one_of(st.none(), st.sampled_from(OWNERS[:processes]), st.just("dead"))
    assignment = draw(st.lists(choices, min_size=partitions, max_size=partitions))
    strategy = draw(st.sampled_from([LoadBalancingStrategy.BALANCED, LoadBalancingStrategy.GREEDY]))
    lockstep = draw(st.booleans())
    seed = draw(st.integers(min_value=0, max_value=2**16))
    return partitions, processes, assignment, strategy, lockstep, seed


async def _lockstep_round(cluster: Cluster, owners):
    listing = await cluster.store.list_ownership(NS, HUB, CG)
    decisions = []
    for owner in owners:
        rng = cluster.rngs.setdefault(owner, random.Random(f"{cluster.seed}-{owner}"))
        decision = decide(listing, cluster.partition_ids, owner, fully_qualified_namespace=NS, eventhub_name=HUB,
                          consumer_group=CG, strategy=cluster.strategy, expiration_interval=EXPIRATION,
                          renew_after=EXPIRATION / 2, rng=rng)
        cluster.decisions.append((owner, listing, decision))
        decisions.append(decision)
    for decision in decisions:
        await cluster.store.claim_ownership(list(decision.renewals) + list(decision.claims))
    cluster.time.advance(INTERVAL)


async def _run(state):
    partitions, processes, assignment, strategy, lockstep, seed = state
    owners = list(OWNERS[:processes])
    cluster = Cluster(partitions, strategy=strategy, seed=seed)
    order = random.Random(seed)
    await cluster.seed_ownership({str(p): o for p, o in enumerate(assignment) if o == "dead"}, age=EXPIRATION + 5)
    await cluster.seed_ownership({str(p): o for p, o in enumerate(assignment) if o not in (None, "dead")})
    rounds_to_balance = None
    # Generous bound: one-per-tick needs at most P rounds, plus a few for collisions.
    for round_number in range(1, 2 * partitions + 12):
        shuffled = owners[:]
        order.shuffle(shuffled)
        if lockstep:
            await _lockstep_round(cluster, shuffled)
        else:
            await cluster.round(shuffled)
        if await cluster.balanced(owners):
            rounds_to_balance = round_number
            break
    return cluster, owners, rounds_to_balance


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_reaches_balance_with_every_partition_owned(state):
    cluster, owners, rounds = asyncio.run(_run(state))
    assert rounds is not None, f"not balanced: {asyncio.run(cluster.live_counts(owners))}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_balanced_claims_at_most_one_new_partition_per_tick(state):
    partitions, processes, assignment, _strategy, lockstep, seed = state
    state = (partitions, processes, assignment, LoadBalancingStrategy.BALANCED, lockstep, seed)
    cluster, _owners, _rounds = asyncio.run(_run(state))
    assert all(len(decision.claims) <= 1 for _o, _l, decision in cluster.decisions)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_steals_only_from_above_ceiling_or_at_ceiling_when_below_floor(state):
    cluster, _owners, _rounds = asyncio.run(_run(state))
    for owner, listing, decision in cluster.decisions:
        assert steal_is_allowed(decision, listing, owner, cluster.partitions)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_once_balanced_with_constant_membership_nothing_moves(state):
    async def scenario():
        cluster, owners, rounds = await _run(state)
        assert rounds is not None
        before = await cluster.store.list_ownership(NS, HUB, CG)
        owner_of = {r.partition_id: (r.owner_id, r.epoch) for r in before.ownerships if r.owner_id}
        mark = len(cluster.decisions)
        for _ in range(12):  # two expiration intervals: renewals happen, moves must not
            await cluster.round(owners)
        after = await cluster.store.list_ownership(NS, HUB, CG)
        assert all(decision.claims == () for _o, _l, decision in cluster.decisions[mark:])
        live = {r.partition_id: (r.owner_id, r.epoch) for r in after.ownerships if r.owner_id}
        for pid in map(str, range(cluster.partitions)):
            assert live[pid] == owner_of[pid]

    asyncio.run(scenario())


@st.composite
def snapshots(draw):
    """One ownership snapshot: live, expired and released records, and some member records."""
    partitions = draw(st.integers(min_value=1, max_value=24))
    owners = OWNERS[:draw(st.integers(min_value=1, max_value=6))]
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    records = []
    for pid in map(str, range(partitions)):
        kind = draw(st.sampled_from(["none", "live", "expired", "released"]))
        if kind == "none":
            continue
        age = EXPIRATION + 5 if kind == "expired" else draw(st.floats(0, EXPIRATION))
        records.append(Ownership(NS, HUB, CG, pid, "" if kind == "released" else draw(st.sampled_from(owners)),
                                 last_modified_time=now - timedelta(seconds=age), etag=f"e{pid}", epoch=3))
    members = draw(st.one_of(st.none(), st.just({m: {ORDINAL_PROPERTY: str(i)} for i, m in enumerate(owners)})))
    return OwnershipListing(tuple(records), now), [str(p) for p in range(partitions)], owners, members


@settings(max_examples=200, deadline=None)
@given(snapshots(), st.sampled_from(list(STRATEGIES)), st.integers(0, 2**16))
def test_each_strategy_is_a_pure_function_of_the_snapshot_taking_only_what_it_may(snapshot, strategy, seed):
    listing, partition_ids, owners, members = snapshot
    for owner in owners:
        view = BalanceView.of(listing, partition_ids, owner, expiration_interval=EXPIRATION, members=members,
                              replica_count=len(owners))
        take = STRATEGIES[strategy](view, random.Random(seed))
        assert take == STRATEGIES[strategy](view, random.Random(seed))  # the same snapshot, the same answer
        assert len(set(take)) == len(take) and set(take) <= set(partition_ids) - view.blocked
        assert not {pid for pid in take if view.active.get(pid) and view.active[pid].owner_id == owner}
        if strategy is LoadBalancingStrategy.BALANCED:
            assert len(take) <= 1
        if strategy is LoadBalancingStrategy.STATIC and members is None:
            assert take == []  # no ordinals to go by
