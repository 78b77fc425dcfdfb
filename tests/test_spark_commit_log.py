"""The Spark sink's commit log on its own: fences, plans, exclusive outcomes. No Spark."""
from __future__ import annotations

import threading

import pytest

from eventprocessor.errors import ConfigurationError, OwnershipLostError
from eventprocessor.spark.commit_log import BatchRefused, CommitLog, PartitionRange

SCOPE = dict(fully_qualified_namespace="memory.local", eventhub_name="hub", consumer_group="$default")


def log_at(path) -> CommitLog:
    return CommitLog(path, **SCOPE)


def rng(pid: str, first: int, last: int, owner: str, epoch: int) -> PartitionRange:
    return PartitionRange(pid, first, last, str(last), last - first + 1, owner, epoch)


def test_committed_batches_raise_the_high_water_mark_seen_by_a_new_fence(tmp_path):
    a = log_at(tmp_path)
    assert a.fence("0", owner_id="a", epoch=1).high_water_mark is None
    first = a.begin([rng("0", 0, 9, "a", 1)])
    assert a.commit(first)
    second = a.begin([rng("0", 10, 19, "a", 1)])
    assert second > first
    assert a.commit(second)
    b = log_at(tmp_path)  # another process reading the same directory
    result = b.fence("0", owner_id="b", epoch=2)
    assert result.high_water_mark == 19
    assert result.aborted == ()


def test_a_fence_aborts_the_old_owners_pending_batch_and_its_commit_is_refused(tmp_path):
    old, new = log_at(tmp_path), log_at(tmp_path)
    old.fence("0", owner_id="old", epoch=1)
    old.fence("1", owner_id="old", epoch=1)
    batch = old.begin([rng("0", 0, 9, "old", 1), rng("1", 0, 4, "old", 1)])
    fence = new.fence("0", owner_id="new", epoch=2)
    assert fence.aborted == (batch,)
    assert fence.high_water_mark is None
    assert old.commit(batch) is False
    assert old.lost_partitions([rng("0", 0, 9, "old", 1), rng("1", 0, 4, "old", 1)]) == ["0"]
    # The old owner may go on with the partition it still has, but not with the lost one.
    with pytest.raises(BatchRefused) as refused:
        old.begin([rng("0", 0, 9, "old", 1), rng("1", 0, 4, "old", 1)])
    assert refused.value.lost == {"0"}
    retry = old.begin([rng("1", 0, 4, "old", 1)])
    assert old.commit(retry)
    assert log_at(tmp_path).high_water_marks() == {"1": 4}


def test_a_commit_that_wins_the_race_counts_for_the_new_owner(tmp_path):
    old, new = log_at(tmp_path), log_at(tmp_path)
    old.fence("0", owner_id="old", epoch=1)
    batch = old.begin([rng("0", 0, 9, "old", 1)])
    assert old.commit(batch)
    assert new.fence("0", owner_id="new", epoch=2).high_water_mark == 9
    assert old.abort(batch) is False  # an outcome never changes


def test_a_stale_fence_is_refused(tmp_path):
    new, stale = log_at(tmp_path), log_at(tmp_path)
    new.fence("0", owner_id="new", epoch=5)
    with pytest.raises(OwnershipLostError):
        stale.fence("0", owner_id="old", epoch=4)


def test_a_plan_overlapping_committed_data_is_a_bug_and_refused(tmp_path):
    log = log_at(tmp_path)
    log.fence("0", owner_id="a", epoch=1)
    assert log.commit(log.begin([rng("0", 0, 9, "a", 1)]))
    with pytest.raises(ValueError, match="overlaps"):
        log.begin([rng("0", 5, 12, "a", 1)])


def test_concurrent_writers_get_dense_unique_versions(tmp_path):
    logs = [log_at(tmp_path) for _ in range(4)]
    for i, log in enumerate(logs):
        log.fence(str(i), owner_id=f"o{i}", epoch=1)
    versions: list = []
    lock = threading.Lock()

    def write(i: int) -> None:
        for n in range(25):
            v = logs[i].begin([rng(str(i), n * 10, n * 10 + 9, f"o{i}", 1)])
            assert logs[i].commit(v)
            with lock:
                versions.append(v)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(versions) == len(set(versions)) == 100
    assert log_at(tmp_path).high_water_marks() == {str(i): 249 for i in range(4)}
    assert sorted(p.name for p in tmp_path.glob("*.json"))[-1] == f"{103:012d}.json"
    assert not list(tmp_path.glob(".tmp-*"))


def test_one_log_per_event_hub_and_consumer_group(tmp_path):
    log_at(tmp_path).fence("0", owner_id="a", epoch=1)
    other = CommitLog(tmp_path, fully_qualified_namespace="memory.local", eventhub_name="hub",
                      consumer_group="analytics")
    with pytest.raises(ConfigurationError, match="one output per event hub and consumer group"):
        other.fence("0", owner_id="b", epoch=1)
