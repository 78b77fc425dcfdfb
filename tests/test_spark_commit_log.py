"""The Spark sink's commit log on its own: fences, plans, commits, publication numbers,
compaction; in a directory and in a checkpoint store (in-memory here, Blob on Azurite).
No Spark."""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable

import pytest

from eventprocessor.errors import ConfigurationError
from eventprocessor.spark.commit_log import (
    BatchRefused,
    CommitLog,
    FileLogStorage,
    LogStorage,
    PartitionRange,
    StagedFile,
    StaleFenceError,
    StoreLogStorage,
)
from eventprocessor.spark.log_state import LogState
from eventprocessor.stores import InMemoryCheckpointStore

SCOPE = dict(fully_qualified_namespace="memory.local", eventhub_name="hub", consumer_group="$default")


def rng(pid: str, first: int, last: int, owner: str, epoch: int) -> PartitionRange:
    return PartitionRange(pid, first, last, str(last), last - first + 1, owner, epoch)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["directory", "store"])
def storage_factory(request, tmp_path) -> Callable[[], LogStorage]:
    """New handles on one log: as separate processes would open it."""
    if request.param == "directory":
        return lambda: FileLogStorage(tmp_path / "log")
    store = InMemoryCheckpointStore()
    return lambda: StoreLogStorage(store, "commits", **SCOPE)


def opener(storage_factory, **kwargs) -> Callable[[], CommitLog]:
    return lambda: CommitLog(storage_factory(), **SCOPE, **kwargs)


async def test_committed_batches_raise_the_high_water_mark_seen_by_a_new_fence(storage_factory):
    open_log = opener(storage_factory)
    a = open_log()
    assert (await a.fence("0", owner_id="a", epoch=1)).high_water_mark is None
    first = await a.begin([rng("0", 0, 9, "a", 1)])
    assert await a.commit(first) is None  # no files: no publication number
    second = await a.begin([rng("0", 10, 19, "a", 1)])
    assert second > first
    await a.commit(second)
    b = open_log()  # another process reading the same log
    result = await b.fence("0", owner_id="b", epoch=2)
    assert result.high_water_mark == 19
    assert result.aborted == ()
    assert b.outcome(first) == b.outcome(second) == "committed"


async def test_a_fence_aborts_the_old_owners_planned_batch_and_its_commit_is_refused(storage_factory):
    open_log = opener(storage_factory)
    old, new = open_log(), open_log()
    await old.fence("0", owner_id="old", epoch=1)
    await old.fence("1", owner_id="old", epoch=1)
    batch = await old.begin([rng("0", 0, 9, "old", 1), rng("1", 0, 4, "old", 1)])
    fence = await new.fence("0", owner_id="new", epoch=2)
    assert fence.aborted == (batch,)
    assert fence.high_water_mark is None
    with pytest.raises(BatchRefused) as refused:
        await old.commit(batch)
    assert refused.value.lost == {"0"}
    assert await old.lost_partitions([rng("0", 0, 9, "old", 1), rng("1", 0, 4, "old", 1)]) == ["0"]
    # The old owner may go on with the partition it still has, but not with the lost one.
    with pytest.raises(BatchRefused) as refused:
        await old.begin([rng("0", 0, 9, "old", 1), rng("1", 0, 4, "old", 1)])
    assert refused.value.lost == {"0"}
    retry = await old.begin([rng("1", 0, 4, "old", 1)])
    await old.commit(retry)
    assert await open_log().high_water_marks() == {"1": 4}


async def test_a_commit_that_wins_the_race_counts_for_the_new_owner(storage_factory):
    open_log = opener(storage_factory)
    old, new = open_log(), open_log()
    await old.fence("0", owner_id="old", epoch=1)
    batch = await old.begin([rng("0", 0, 9, "old", 1)])
    await old.commit(batch)
    assert (await new.fence("0", owner_id="new", epoch=2)).high_water_mark == 9
    assert await old.abort(batch) is False  # an outcome never changes
    await old.commit(batch)  # committing again is a no-op


async def test_a_given_up_batch_cannot_commit(storage_factory):
    log = opener(storage_factory)()
    await log.fence("0", owner_id="a", epoch=1)
    batch = await log.begin([rng("0", 0, 9, "a", 1)])
    assert await log.abort(batch) is True
    with pytest.raises(BatchRefused, match="given up") as refused:
        await log.commit(batch)
    assert refused.value.lost == {"0"}
    assert await opener(storage_factory)().high_water_marks() == {}


async def test_a_stale_fence_is_refused_with_what_the_log_holds(storage_factory):
    open_log = opener(storage_factory)
    new, stale = open_log(), open_log()
    await new.fence("0", owner_id="new", epoch=5)
    with pytest.raises(StaleFenceError) as refused:
        await stale.fence("0", owner_id="old", epoch=4)
    assert (refused.value.logged_owner, refused.value.logged_epoch) == ("new", 5)
    with pytest.raises(StaleFenceError):  # the same epoch by another owner: two stores?
        await stale.fence("0", owner_id="other", epoch=5)
    await new.fence("0", owner_id="new", epoch=5)  # the same claim again is fine


async def test_a_second_claim_of_the_same_owner_and_epoch_voids_the_first_ones_batches(storage_factory):
    """A processor whose lease ran out can adopt its own ownership record again, with the
    same epoch: a new claim object, reading the partition again from its checkpoint. The
    first object's planned batch must not commit next to the second's (that wrote the
    same events twice on the cluster)."""
    open_log = opener(storage_factory)
    first, second = open_log(), open_log()

    def claimed(first_seq: int, last_seq: int, token: str) -> PartitionRange:
        return PartitionRange("3", first_seq, last_seq, str(last_seq), last_seq - first_seq + 1, "p", 1, token)

    await first.fence("3", owner_id="p", epoch=1, claim_token="first")
    stale_batch = await first.begin([claimed(0, 199, "first")])
    fence = await second.fence("3", owner_id="p", epoch=1, claim_token="second")
    assert fence.aborted == (stale_batch,) and fence.high_water_mark is None
    await second.commit(await second.begin([claimed(0, 399, "second")]))
    with pytest.raises(BatchRefused) as refused:
        await first.commit(stale_batch)
    assert refused.value.lost == {"3"}
    with pytest.raises(BatchRefused):
        await first.begin([claimed(200, 299, "first")])
    assert await open_log().high_water_marks() == {"3": 399}


async def test_a_plan_overlapping_committed_data_is_a_bug_and_refused(storage_factory):
    log = opener(storage_factory)()
    await log.fence("0", owner_id="a", epoch=1)
    await log.commit(await log.begin([rng("0", 0, 9, "a", 1)]))
    with pytest.raises(ValueError, match="overlaps"):
        await log.begin([rng("0", 5, 12, "a", 1)])


async def test_a_batch_commits_only_where_its_claims_last_commit_ended(storage_factory):
    """Each range names the high-water mark it continues (``after``). A batch whose
    predecessor of the same claim never committed (planned, then left behind) is refused
    for that partition, naming it; the other partition of the batch is unaffected, and
    the left-behind batch still commits in its turn."""
    from dataclasses import replace

    log = opener(storage_factory)()
    for pid in "01":
        await log.fence(pid, owner_id="a", epoch=1)
    left_behind = await log.begin([replace(rng("0", 0, 9, "a", 1), after=-1)])
    later = await log.begin([replace(rng("0", 10, 19, "a", 1), after=9), replace(rng("1", 0, 9, "a", 1), after=-1)])
    with pytest.raises(BatchRefused, match=r"partitions \['0'\] do not continue their committed high-water marks "
                                           r"\(0: -1 committed, the batch continues 9\)") as refused:
        await log.commit(later)
    assert refused.value.lost == {"0"}
    assert await log.high_water_marks() == {}
    await log.commit(left_behind)
    await log.commit(later)
    assert await log.high_water_marks() == {"0": 19, "1": 9}
    reread = await opener(storage_factory)().batches()
    assert [r.after for _b, _o, ranges in reread for r in ranges] == [-1, 9, -1]


async def test_commits_with_files_get_dense_publication_numbers(storage_factory):
    open_log = opener(storage_factory)
    a, b = open_log(), open_log()
    await a.fence("0", owner_id="a", epoch=1)
    await b.fence("1", owner_id="b", epoch=1)
    files = (StagedFile("partition_id=0/part-0.parquet", 10, 1),)
    numbers = []
    for i in range(3):
        ba = await a.begin([rng("0", i * 20, i * 20 + 9, "a", 1)])
        bb = await b.begin([rng("1", i * 10, i * 10 + 9, "b", 1)])
        numbers.append(await b.commit(bb, files))
        assert await a.commit(ba) is None  # foreach_batch style: no publication
        numbers.append(await a.commit(await a.begin([rng("0", i * 20 + 10, i * 20 + 19, "a", 1)]), files))
    assert numbers == list(range(6))
    reader = open_log()
    await reader.refresh()
    assert [p.number for p in reader.unpublished()] == list(range(6))
    assert reader.unpublished(through=2)[-1].files == files
    reader.mark_published(3)
    assert [p.number for p in reader.unpublished()] == [4, 5]


async def test_concurrent_writers_get_dense_unique_versions(tmp_path):
    logs = [CommitLog(FileLogStorage(tmp_path), **SCOPE) for _ in range(4)]
    for i, log in enumerate(logs):
        await log.fence(str(i), owner_id=f"o{i}", epoch=1)
    versions: list[int] = []

    async def write(i: int) -> None:
        for n in range(15):
            version = await logs[i].begin([rng(str(i), n * 10, n * 10 + 9, f"o{i}", 1)])
            await logs[i].commit(version)
            versions.append(version)

    await asyncio.gather(*(write(i) for i in range(4)))
    assert len(versions) == len(set(versions)) == 60
    reader = CommitLog(FileLogStorage(tmp_path), **SCOPE, compact_every=1000)
    assert await reader.high_water_marks() == {str(i): 149 for i in range(4)}
    assert reader.next_version == 4 + 60 * 2
    assert not list(tmp_path.glob(".tmp-*"))


async def test_one_log_per_event_hub_and_consumer_group(tmp_path):
    await CommitLog(FileLogStorage(tmp_path), **SCOPE).fence("0", owner_id="a", epoch=1)
    other = CommitLog(FileLogStorage(tmp_path), fully_qualified_namespace="memory.local", eventhub_name="hub",
                      consumer_group="analytics")
    with pytest.raises(ConfigurationError, match="one output per event hub and consumer group"):
        await other.fence("0", owner_id="b", epoch=1)


async def test_a_log_of_an_older_format_is_refused_by_name(tmp_path):
    (tmp_path / "000000000000").write_text(json.dumps({"type": "fence", "partition_id": "0", "format": 1}))
    with pytest.raises(ConfigurationError, match="format 1.*new output path"):
        await CommitLog(FileLogStorage(tmp_path), **SCOPE).fence("0", owner_id="a", epoch=1)


# ----------------------------------------------------------------------------- compaction


async def test_compaction_keeps_the_state_and_bounds_the_log(storage_factory):
    clock = Clock()
    open_log = opener(storage_factory, compact_every=10, retention=60.0, clock=clock)
    writer = open_log()
    await writer.fence("0", owner_id="a", epoch=1)
    await writer.fence("1", owner_id="a", epoch=1)
    files = (StagedFile("x.parquet", 1, 1),)
    for n in range(30):
        await writer.commit(await writer.begin([rng("0", n, n, "a", 1)]), files)
    pending = await writer.begin([rng("1", 0, 4, "a", 1)])
    await asyncio.sleep(0)
    await writer.aclose()
    storage = writer.storage
    names = await storage.list()
    snapshots = [int(n[len("snapshot-"):]) for n in names if n.startswith("snapshot-")]
    assert snapshots, "a snapshot was written"
    assert len([n for n in names if n.isdigit()]) == 63, "nothing is deleted before the retention"

    clock.now += 61  # the snapshots are older than the retention: a later compaction deletes below them
    await writer.commit(await writer.begin([rng("0", 30, 30, "a", 1)]), files)
    for _ in range(10):
        await writer.commit(await writer.begin([rng("0", 31 + _, 31 + _, "a", 1)]))
    await writer.aclose()
    kept = [int(n) for n in await storage.list() if n.isdigit()]
    assert min(kept) == max(snapshots), "entries below the snapshot known for the retention are deleted"
    assert len(kept) == writer.next_version - max(snapshots)

    # A new reader starts from the newest snapshot and agrees with the writer.
    reader = open_log()
    assert await reader.high_water_marks() == {"0": 40}
    assert reader.outcome(pending) == "planned"
    assert [p.number for p in reader.unpublished()] == list(range(31))
    fence = await reader.fence("1", owner_id="b", epoch=2)
    assert fence.aborted == (pending,)
    with pytest.raises(BatchRefused):
        await writer.commit(pending)


async def test_a_reader_paused_past_the_retention_continues_from_the_snapshot(storage_factory):
    clock = Clock()
    open_log = opener(storage_factory, compact_every=5, retention=60.0, clock=clock)
    sleeper, worker = open_log(), open_log()
    await sleeper.fence("0", owner_id="s", epoch=1)
    await worker.fence("1", owner_id="w", epoch=1)
    for n in range(20):
        await worker.commit(await worker.begin([rng("1", n, n, "w", 1)]))
    await worker.aclose()
    clock.now += 61
    for n in range(20, 30):
        await worker.commit(await worker.begin([rng("1", n, n, "w", 1)]))
    await worker.aclose()
    assert "000000000000" not in await worker.storage.list(), "the start of the log was compacted away"
    # The sleeper's view ends at version 2; the names after it are free again. It must not
    # take the end of its view for the end of the log.
    batch = await sleeper.begin([rng("0", 0, 9, "s", 1)])
    assert batch >= 2 + 30 * 2
    await sleeper.commit(batch)
    assert await open_log().high_water_marks() == {"0": 9, "1": 29}


async def test_an_append_that_lands_after_its_version_was_compacted_is_decided_again(storage_factory):
    """A writer reads the end of the log, pauses (longer than the retention) while others
    append and compact, then its create lands on a name that is free again. It must not
    trust it."""
    clock = Clock()
    open_log = opener(storage_factory, compact_every=5, retention=60.0, clock=clock)
    paused, worker = open_log(), open_log()
    await paused.fence("0", owner_id="p", epoch=1)
    await worker.fence("1", owner_id="w", epoch=1)
    storage = paused.storage
    original_create = storage.create
    paused_once = {"done": False}

    async def create_after_a_pause(name: str, data: bytes) -> bool:
        if not paused_once["done"]:
            paused_once["done"] = True
            for n in range(12):
                await worker.commit(await worker.begin([rng("1", n, n, "w", 1)]))
            await worker.aclose()
            clock.now += 61
            for n in range(12, 20):
                await worker.commit(await worker.begin([rng("1", n, n, "w", 1)]))
            await worker.aclose()
            assert name not in await storage.list(), "the version was written and compacted away"
        return await original_create(name, data)

    storage.create = create_after_a_pause  # type: ignore[method-assign]
    batch = await paused.begin([rng("0", 0, 4, "p", 1)])
    await paused.commit(batch)
    reader = open_log()
    assert await reader.high_water_marks() == {"0": 4, "1": 19}
    assert reader.outcome(batch) == "committed"


# ----------------------------------------------------------------------------- Blob on Azurite


@pytest.mark.azurite
async def test_in_the_blob_store_two_logs_racing_get_unique_versions(azurite):
    from eventprocessor.stores import BlobCheckpointStore

    container = f"commit-log-{uuid.uuid4().hex[:8]}"
    stores = [BlobCheckpointStore.from_connection_string(azurite.connection_string, container) for _ in range(3)]
    try:
        logs = [CommitLog.in_store(store, "spark-sink-test", **SCOPE) for store in stores]
        for i, log in enumerate(logs):
            await log.fence(str(i), owner_id=f"o{i}", epoch=1)
        versions: list[int] = []

        async def write(i: int) -> None:
            for n in range(8):
                version = await logs[i].begin([rng(str(i), n, n, f"o{i}", 1)])
                await logs[i].commit(version, (StagedFile(f"f{i}-{n}", 1, 1),))
                versions.append(version)

        await asyncio.gather(*(write(i) for i in range(3)))
        assert len(set(versions)) == 24
        reader = CommitLog.in_store(stores[0], "spark-sink-test", **SCOPE)
        await reader.refresh()
        assert reader.known_high_water_marks() == {"0": 7, "1": 7, "2": 7}
        assert [p.number for p in reader.unpublished()] == list(range(24))
    finally:
        for store in stores:
            await store.close()


# ----------------------------------------------------------------------------- the state, a pure fold
def test_the_log_state_folds_entries_and_survives_a_snapshot_round_trip():
    state = LogState()
    assert state.apply(0, {"type": "fence", "partition_id": "0", "owner_id": "a", "epoch": 1}, "log") == {}
    first = rng("0", 0, 9, "a", 1)
    state.apply(1, {"type": "plan", "ranges": [first.to_json()]}, "log")
    state.apply(2, {"type": "plan", "ranges": [rng("0", 10, 19, "a", 1).to_json()]}, "log")
    assert state.apply(3, {"type": "commit", "batch_id": 1, "files": [StagedFile("part-0.parquet", 10, 1).to_json()]},
                       "log") == {1: (first,)}
    assert state.high_water_marks == {"0": 9} and state.outcome(1) == "committed" and state.outcome(2) == "planned"
    assert [(p.number, p.batch_id) for p in state.unpublished.values()] == [(0, 1)]
    # A newer claim's fence aborts the other claim's planned batch and makes its ranges lost.
    resolved = state.apply(4, {"type": "fence", "partition_id": "0", "owner_id": "b", "epoch": 2}, "log")
    assert list(resolved) == [2] and state.outcome(2) == "aborted" and state.lost([first]) == ["0"]
    state.mark_published(0)
    assert state.unpublished == {} and state.published_floor == 0
    again = LogState.from_json(json.loads(json.dumps(state.to_json())))
    assert again == state
    with pytest.raises(ConfigurationError, match="unknown entry type 'merge'"):
        state.apply(5, {"type": "merge"}, "log")
