"""Publishing batches without Spark: Spark's metadata log as the Parquet writer writes it
(entries, compaction, cleanup, gaps filled, idempotence), on a local file system (with
its directory fsyncs) and on a pyarrow file system that is not local (the code path of
abfss://, s3://...). Spark reading these tables is in test_spark_sink.py."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from eventprocessor.spark import log_storage as log_storage_module
from eventprocessor.spark import output as output_module
from eventprocessor.spark.commit_log import Publication, StagedFile
from eventprocessor.spark.output import METADATA_DIR, STAGING_DIR, OutputLocation, ParquetWriter


def stage(location: OutputLocation, batch_id: int, names: list[str]) -> Publication:
    """Files as Spark would have staged them for ``batch_id``; its publication is batch_id."""
    fs = location.filesystem
    files = []
    for name in names:
        relative = f"{ParquetWriter.staging(batch_id)}/{name}"
        fs.create_dir(location.fs_path(os.path.dirname(relative)), recursive=True)
        with fs.open_output_stream(location.fs_path(relative)) as stream:
            stream.write(f"{batch_id}:{name}".encode())
        files.append(StagedFile(name, len(f"{batch_id}:{name}"), 1_700_000_000_000 + batch_id))
    return Publication(batch_id, batch_id, tuple(files))


def metadata_lines(location: OutputLocation, name: str) -> list[dict]:
    with location.filesystem.open_input_stream(location.fs_path(f"{METADATA_DIR}/{name}")) as stream:
        lines = stream.read().decode().split("\n")
    assert lines[0] == "v1"
    return [json.loads(line) for line in lines[1:]]


def test_a_published_batch_is_listed_once_in_sparks_metadata_log(tmp_path):
    location = OutputLocation(tmp_path / "table")
    writer = ParquetWriter(location, ["partition_id"], {})
    publication = stage(location, 0, ["partition_id=0/part-0.parquet", "partition_id=1/part-1.parquet", "_SUCCESS"])
    manifest = writer.manifest(0)
    assert [f.path for f in manifest] == ["partition_id=0/part-0.parquet", "partition_id=1/part-1.parquet"]
    publication = Publication(0, 0, manifest)
    assert writer.publish([publication]) == ([0], 2)
    assert sorted(p.name for p in (tmp_path / "table" / "partition_id=0").iterdir()) == [
        "b000000000000-part-0.parquet"]
    [first, second] = metadata_lines(location, "0")
    assert first["path"] == f"file://{tmp_path}/table/partition_id=0/b000000000000-part-0.parquet"
    assert (first["size"], first["isDir"], first["action"]) == (len("0:partition_id=0/part-0.parquet"), False, "add")
    assert not (tmp_path / "table" / STAGING_DIR / "000000000000").exists()
    # Published again (a roll-forward racing the writer): nothing moves, nothing changes.
    before = (tmp_path / "table" / METADATA_DIR / "0").read_bytes()
    assert writer.publish([publication]) == ([], 0)
    assert (tmp_path / "table" / METADATA_DIR / "0").read_bytes() == before


def test_every_tenth_entry_is_compact_and_older_entries_are_cleaned_up(tmp_path):
    location = OutputLocation(tmp_path / "table")
    writer = ParquetWriter(location, [], {})
    for batch in range(25):
        writer.publish([stage(location, batch, [f"part-{batch}.parquet"])])
    names = sorted(os.listdir(tmp_path / "table" / METADATA_DIR), key=lambda n: int(n.split(".")[0]))
    # A reader needs the newest compact entry and what follows; one interval more is kept
    # for readers that listed the log just before the newest compact entry was written.
    assert names == ["9.compact", *(str(n) for n in range(10, 19)), "19.compact", *(str(n) for n in range(20, 25))]
    compact = metadata_lines(location, "19.compact")
    assert [line["path"].rsplit("/", 1)[1] for line in compact] == [
        f"b{n:012d}-part-{n}.parquet" for n in range(20)]


def test_a_publisher_fills_the_gaps_below_its_batch_first(tmp_path):
    """Writer A committed batches 0 and 1 and died before publishing 1; writer B publishes
    its batch 2 and, first, batch 1: Spark's reader fails on a hole in the log."""
    location = OutputLocation(tmp_path / "table")
    writer = ParquetWriter(location, [], {})
    publications = [stage(location, n, [f"part-{n}.parquet"]) for n in range(3)]
    writer.publish(publications[:1])
    assert writer.publish(publications) == ([1, 2], 2)
    assert sorted(os.listdir(tmp_path / "table" / METADATA_DIR)) == ["0", "1", "2"]


def test_a_half_moved_batch_is_finished_by_whoever_publishes_it(tmp_path):
    location = OutputLocation(tmp_path / "table")
    writer = ParquetWriter(location, [], {})
    publication = stage(location, 0, ["a.parquet", "b.parquet"])
    staged = tmp_path / "table" / STAGING_DIR / f"{0:012d}"
    os.rename(staged / "a.parquet", tmp_path / "table" / "b000000000000-a.parquet")
    assert writer.publish([publication]) == ([0], 1)
    assert len(metadata_lines(location, "0")) == 2


def test_local_publication_fsyncs_the_directories_it_changes(tmp_path, monkeypatch):
    synced: list[str] = []
    real = log_storage_module.fsync_directory

    def spy(directory) -> None:
        synced.append(str(directory))
        real(directory)

    monkeypatch.setattr(output_module, "fsync_directory", spy)
    monkeypatch.setattr(log_storage_module, "fsync_directory", spy)
    location = OutputLocation(tmp_path / "table")
    writer = ParquetWriter(location, ["partition_id"], {})
    stage(location, 0, ["partition_id=0/part-0.parquet"])
    manifest = writer.manifest(0)  # the staged files and their directory, before the commit
    assert str(tmp_path / "table" / STAGING_DIR / f"{0:012d}" / "partition_id=0") in synced
    synced.clear()
    writer.publish([Publication(0, 0, manifest)])
    assert str(tmp_path / "table" / "partition_id=0") in synced, "the renamed files' directory"
    assert str(tmp_path / "table") in synced, "the directory a new partition directory was made in"
    assert str(tmp_path / "table" / METADATA_DIR) in synced, "the metadata entry renamed into place"

    synced.clear()
    import asyncio

    from eventprocessor.spark.commit_log import FileLogStorage

    assert asyncio.run(FileLogStorage(tmp_path / "log").create("000000000000", b"{}"))
    assert synced == [str(tmp_path / "log")], "a commit-log entry linked into place"


def test_on_a_file_system_that_is_not_local_the_same_protocol_runs(tmp_path):
    """A pyarrow file system that is not the local one (a sub-tree of a temporary
    directory, addressed as s3a://bucket/table) runs the code path of abfss:// and s3://:
    moves, metadata entries written to a temporary name and moved into place, cleanup."""
    fs = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    location = OutputLocation("s3a://bucket/table", filesystem=fs)
    assert (location.local, location.root, location.spark_path("x")) == (False, "bucket/table",
                                                                          "s3a://bucket/table/x")
    writer = ParquetWriter(location, ["partition_id"], {})
    for batch in range(12):
        stage(location, batch, [f"partition_id={batch % 2}/part-{batch}.parquet"])
        writer.publish([Publication(batch, batch, writer.manifest(batch))])
    listed = {info.path for info in fs.get_file_info(pafs.FileSelector("bucket/table", recursive=True))
              if info.type == pafs.FileType.File}
    assert "bucket/table/partition_id=1/b000000000011-part-11.parquet" in listed
    assert {p.rsplit("/", 1)[1] for p in listed if "/_spark_metadata/" in p} == {
        *(str(n) for n in range(9)), "9.compact", "10", "11"}
    assert not [p for p in listed if STAGING_DIR in p or p.endswith(".tmp")]
    assert metadata_lines(location, "11")[0]["path"] == \
        "s3a://bucket/table/partition_id=1/b000000000011-part-11.parquet"


def test_output_locations_map_uris_to_spark_and_pyarrow_paths():
    abfss = OutputLocation("abfss://lake@account.dfs.core.windows.net/events/")
    assert (abfss.spark_root, abfss.root) == ("abfss://lake@account.dfs.core.windows.net/events", "lake/events")
    assert abfss.uri("enqueued_date=2024-01-01/b1-p.parquet") == \
        "abfss://lake@account.dfs.core.windows.net/events/enqueued_date=2024-01-01/b1-p.parquet"
    local = OutputLocation("/data/my table")
    assert local.spark_path("x") == "file:///data/my table/x"  # a Hadoop path: as is
    assert local.uri("device=a%3Ab/f") == "file:///data/my%20table/device=a%253Ab/f"  # a URI: escaped
    assert OutputLocation(Path("/data/t")).spark_root == OutputLocation("file:///data/t").spark_root


@pytest.mark.parametrize("uri", ["s3a://bucket/t", "hdfs://namenode:8020/t", "gs://bucket/t"])
def test_a_remote_output_touches_nothing_until_it_is_used(uri):
    location = OutputLocation(uri)
    assert not location.local and location.spark_root == uri
