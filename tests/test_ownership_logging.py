"""Every ownership change is one log record that says why, with the owner, the partition
and the epoch as structured fields (``eventprocessor.*`` attributes of the record), on the
virtual clock: claimed, expired, stolen, adopted (handed over to it), released, handed
off, lost, self-fenced and store lost."""
from __future__ import annotations

import asyncio
import logging

import pytest

from eventprocessor import OWNERSHIP_LOG_FIELDS, OWNERSHIP_REASONS
from eventprocessor.testing import Cluster, run_virtual

OPTIONS = dict(load_balancing_interval=1.0, partition_ownership_expiration_interval=8.0)
LOGGER = "eventprocessor"  # ownership lines come from eventprocessor._ownership.lease_table


def _changes(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """The ownership-change records, as their structured fields plus level and message."""
    found = []
    for record in caplog.records:
        if record.name.startswith(LOGGER) and hasattr(record, "eventprocessor.reason"):
            fields: dict[str, object] = {name.split(".", 1)[1]: getattr(record, name) for name in OWNERSHIP_LOG_FIELDS}
            fields.update(level=record.levelname, message=record.getMessage())
            found.append(fields)
    return found


def _by(changes: list[dict[str, object]], reason: str) -> list[tuple[object, object, object]]:
    return sorted((c["owner_id"], c["partition_id"], c["epoch"]) for c in changes if c["reason"] == reason)


def _common_checks(changes: list[dict[str, object]]) -> None:
    assert changes
    assert {c["reason"] for c in changes} <= set(OWNERSHIP_REASONS)
    assert all(c["eventhub_name"] == "hub" and c["consumer_group"] == "$default" for c in changes)
    assert all(f"partition {c['partition_id']} " in str(c["message"]) and f"(epoch {c['epoch']})" in str(c["message"])
               and f"processor {c['owner_id']} " in str(c["message"]) for c in changes)
    unplanned = {"lost", "self_fenced", "store_lost"}
    assert all(c["level"] == ("WARNING" if c["reason"] in unplanned else "INFO") for c in changes)


def test_claims_steals_and_releases_say_why_with_owner_partition_and_epoch(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario():
        cluster = Cluster(4, seed=3, **OPTIONS)
        # "a" cannot hand over (handoff_timeout=None), so "b" steals its share
        a = cluster.add("a", handoff_timeout=None)
        await a.start()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 4, timeout=10)
        b = cluster.add("b")
        await b.start()
        await cluster.wait_until(lambda: len(b.owned_partitions) == 2 and len(a.owned_partitions) == 2, timeout=30)
        await asyncio.sleep(2)
        moved = set(b.owned_partitions)
        await a.stop()
        await b.stop()
        return moved

    moved = run_virtual(scenario())
    changes = _changes(caplog)
    _common_checks(changes)
    assert _by(changes, "claimed") == [("a", str(p), 1) for p in range(4)]
    assert _by(changes, "stolen") == sorted(("b", p, 2) for p in moved)
    assert all("taken from a to balance the load" in str(c["message"]) for c in changes if c["reason"] == "stolen")
    assert _by(changes, "lost") == sorted(("a", p, 1) for p in moved)
    released = _by(changes, "released")
    assert sorted(p for _o, p, _e in released) == [str(p) for p in range(4)]
    assert {(o, p) for o, p, _e in released} == {("b" if p in moved else "a", p) for _o, p, _e in released}


def test_a_handoff_is_logged_by_both_sides(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario():
        cluster = Cluster(4, seed=4, **OPTIONS)
        a = cluster.add("a")
        await a.start()
        await cluster.wait_until(lambda: len(a.owned_partitions) == 4, timeout=10)
        b = cluster.add("b")
        await b.start()
        await cluster.wait_until(lambda: len(b.owned_partitions) == 2 and len(a.owned_partitions) == 2, timeout=30)
        await asyncio.sleep(2)
        moved = set(b.owned_partitions)
        await a.stop()
        await b.stop()
        return moved

    moved = run_virtual(scenario())
    changes = _changes(caplog)
    _common_checks(changes)
    assert _by(changes, "handed_off") == sorted(("a", p, 1) for p in moved)
    assert _by(changes, "adopted") == sorted(("b", p, 2) for p in moved)  # the epoch rises by one at the handoff
    assert not _by(changes, "stolen") and not _by(changes, "lost")


def test_expiry_self_fencing_and_a_wiped_store_say_why(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    async def scenario():
        cluster = Cluster(2, seed=5, **OPTIONS)
        # a crash: "x" leaves its records to expire, "y" claims them after expiry
        x = cluster.add("x")
        await x.start()
        await cluster.wait_until(lambda: len(x.owned_partitions) == 2, timeout=10)
        await x.stop(release=False)
        await asyncio.sleep(OPTIONS["partition_ownership_expiration_interval"] + 1)
        y = cluster.add("y")
        await y.start()
        await cluster.wait_until(lambda: len(y.owned_partitions) == 2, timeout=30)
        # the store stops answering: "y" self-fences before anyone could claim its partitions
        cluster.store.hang = True
        await cluster.wait_until(lambda: not y.owned_partitions, timeout=30)
        cluster.store.clear()
        await cluster.wait_until(lambda: len(y.owned_partitions) == 2, timeout=30)
        # the store loses its data
        cluster.memory.wipe()
        await asyncio.sleep(4)
        await y.stop()

    run_virtual(scenario())
    changes = _changes(caplog)
    _common_checks(changes)
    # x had epoch 1; y claimed its records after expiry at epoch 2, then self-fenced. Its
    # claims at epoch 2 ended, so it never resumes them at that epoch (nothing may be handed
    # to an ended claim): it claims each partition again one epoch up, either because the
    # record still named its ended claim or because the record had expired meanwhile.
    assert _by(changes, "self_fenced") == [("y", "0", 2), ("y", "1", 2)]
    assert not _by(changes, "adopted")
    expired = _by(changes, "expired")
    assert expired in ([("y", "0", 2), ("y", "1", 2)], [("y", "0", 2), ("y", "0", 3), ("y", "1", 2), ("y", "1", 3)])
    again = sorted(c for c in _by(changes, "claimed") + expired if c[2] == 3)
    assert again == [("y", "0", 3), ("y", "1", 3)]
    assert all("still named its ended claim (epoch 2)" in str(c["message"]) for c in changes
               if c["reason"] == "claimed" and c["epoch"] == 3)
    assert _by(changes, "store_lost") == [("y", "0", 3), ("y", "1", 3)]  # the epoch y held when the store was wiped
