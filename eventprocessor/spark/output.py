"""Where batches go: the output location, Spark's file-sink metadata log, and the two
writers (Parquet with staging and publication, and ``foreach_batch``).

The sink's own file operations (listing a batch's staged files, moving them into the
table, writing ``_spark_metadata``) go through a :class:`pyarrow.fs.FileSystem`, so they
work wherever pyarrow reaches: a local or mounted file system (``file://`` or a plain
path), ``abfs://``/``abfss://`` (Azure Data Lake Storage and Blob), ``s3://``, ``gs://``,
``hdfs://`` (with libhdfs). Spark's executors write the data with Spark's own file
systems. Both must see the same storage; the sink never asks Spark for file-system
access, so it works the same on a classic session and over Spark Connect.

Publication
-----------
A committed batch (see :mod:`~eventprocessor.spark.commit_log`) carries its *manifest*
(the staged files with sizes) and a dense *publication number* ``n``. Publishing it
moves its files from ``_eventprocessor_staging/<batch_id>/`` into the table (each
renamed ``b<batch_id>-<name>``) and then writes ``_spark_metadata/<n>`` listing them, in
the format of Spark's own file sink (``v1`` and one ``SinkFileStatus`` per line; every
tenth a ``.compact`` holding every file so far). A plain ``spark.read.parquet(path)``
reads only the files that log lists, so a batch appears all at once, and never partly.
``_spark_metadata/<n>`` is written only after every number below ``n`` is in place (a
publisher fills gaps itself: every committed batch's manifest is in the commit log), so
the log never has holes that would make readers fail. Every step is idempotent: a move
whose source is gone and whose target exists is done; a metadata entry is a pure
function of the manifest. A batch published twice (a roll-forward racing its writer) is
listed once, under its one number.
"""
from __future__ import annotations

import json
import logging
import os
import posixpath
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pyarrow.fs as pafs

from ..errors import ConfigurationError
from .commit_log import Manifest, Publication, StagedFile, fsync_directory

__all__ = ["OutputLocation", "SparkMetadataLog", "ParquetWriter", "ForeachBatchWriter", "Writer", "StepHook",
           "STAGING_DIR", "METADATA_DIR", "COMMITS_DIR"]

logger = logging.getLogger(__name__)

STAGING_DIR = "_eventprocessor_staging"
METADATA_DIR = "_spark_metadata"
COMMITS_DIR = "_eventprocessor_commits"

StepHook = Callable[[str], None]
"""Called with the name of each step a batch reaches (see :class:`~eventprocessor.spark.SparkSink`)."""

# What java.net.URI leaves unquoted in a path (Hadoop's Path.toUri quotes the rest).
_URI_SAFE = "/:@!$&'()*+,;=-._~"
_SCHEMES = {"s3a": "s3", "s3n": "s3", "gcs": "gs"}


def _no_hook(_step: str) -> None:
    pass


class OutputLocation:
    """The output root as Spark sees it (a Hadoop path) and as the sink's file
    operations see it (a pyarrow file system and a path in it).

    ``path`` is a local path, or a URI Spark understands (``file:``, ``abfss:``,
    ``s3a:``, ``hdfs:`` ...). ``filesystem`` is the pyarrow file system for the sink's
    own operations; by default it is made from the URI (a local path needs none; for
    ``abfss://`` pyarrow uses ``DefaultAzureCredential``; pass
    ``pyarrow.fs.AzureFileSystem(account_name=..., account_key=...)`` to choose).

    Example::

        OutputLocation("abfss://events@account.dfs.core.windows.net/telemetry",
                       filesystem=pyarrow.fs.AzureFileSystem(account_name="account", account_key=key))
    """

    def __init__(self, path: str | os.PathLike, filesystem: pafs.FileSystem | None = None) -> None:
        text = os.fspath(path).rstrip("/") or "/"
        self._filesystem = filesystem
        if "://" not in text or text.startswith("file:"):
            local = text[len("file://"):] if text.startswith("file://") else text[len("file:"):] \
                if text.startswith("file:") else text
            root = str(Path(local).absolute())
            self.local = True
            self.scheme = "file"
            self.spark_root = "file://" + root
            self._uri_root = "file://" + quote(root, safe=_URI_SAFE)
            self.root = root
            return
        parts = urlsplit(text)
        self.local = False
        self.scheme = parts.scheme.lower()
        self.spark_root = text
        self._uri_root = f"{parts.scheme}://{parts.netloc}{quote(parts.path, safe=_URI_SAFE)}"
        self._netloc = parts.netloc
        self.root = _filesystem_path(self.scheme, parts.netloc, parts.path)

    @property
    def filesystem(self) -> pafs.FileSystem:
        """The pyarrow file system of the sink's own operations (made on first use: for
        some services that takes a request)."""
        if self._filesystem is None:
            if self.local:
                self._filesystem = pafs.LocalFileSystem()
            else:
                uri = f"{_SCHEMES.get(self.scheme, self.scheme)}://{self._netloc}/{self.root.split('/', 1)[-1]}"
                try:
                    self._filesystem, _path = pafs.FileSystem.from_uri(uri)
                except Exception as error:
                    first = str(error).splitlines()[0] if str(error) else ""
                    raise ConfigurationError(
                        f"the sink cannot reach {self.scheme}://{self._netloc}/... with pyarrow "
                        f"({type(error).__name__}: {first}); pass filesystem= (a pyarrow.fs.FileSystem with "
                        "credentials for that storage)") from None
        return self._filesystem

    def __repr__(self) -> str:
        return f"OutputLocation({self.spark_root!r})"

    def spark_path(self, relative: str = "") -> str:
        """The Hadoop path Spark writes ``relative`` (``/``-separated) under the root at."""
        return self.spark_root if not relative else f"{self.spark_root}/{relative}"

    def uri(self, relative: str) -> str:
        """``relative`` as a URI, percent-encoded as Hadoop's ``Path.toUri`` does: the
        form Spark's ``_spark_metadata`` log holds."""
        return f"{self._uri_root}/{quote(relative, safe=_URI_SAFE)}"

    def fs_path(self, relative: str = "") -> str:
        return self.root if not relative else f"{self.root}/{relative}"

    def local_path(self, relative: str = "") -> Path:
        return Path(self.fs_path(relative))


def _filesystem_path(scheme: str, netloc: str, path: str) -> str:
    """The path pyarrow's file system of ``scheme`` uses for a URI."""
    if scheme in ("abfs", "abfss", "wasb", "wasbs"):
        container = netloc.split("@", 1)[0]
        return f"{container}{path}".rstrip("/")
    if scheme in ("s3", "s3a", "s3n", "gs", "gcs"):
        return f"{netloc}{path}".rstrip("/")
    return path.rstrip("/") or "/"


# ----------------------------------------------------------------------------- file operations


class _Files:
    """The few file operations the sink needs, on one :class:`OutputLocation`; on a
    local file system, directory entries are fsynced after they change."""

    def __init__(self, location: OutputLocation) -> None:
        self.location = location

    @property
    def fs(self) -> pafs.FileSystem:
        return self.location.filesystem

    def list_files(self, relative: str) -> list[pafs.FileInfo]:
        """Every file under ``relative``, recursively ([] when it does not exist)."""
        selector = pafs.FileSelector(self.location.fs_path(relative), recursive=True, allow_not_found=True)
        return [info for info in self.fs.get_file_info(selector) if info.type == pafs.FileType.File]

    def list_names(self, relative: str) -> list[str]:
        selector = pafs.FileSelector(self.location.fs_path(relative), recursive=False, allow_not_found=True)
        return [info.base_name for info in self.fs.get_file_info(selector)]

    def exists(self, relative: str) -> bool:
        return self.fs.get_file_info(self.location.fs_path(relative)).type != pafs.FileType.NotFound

    def read(self, relative: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self.location.fs_path(relative)) as stream:
                return stream.read()
        except FileNotFoundError:
            return None

    def make_dirs(self, relative: str) -> None:
        self.fs.create_dir(self.location.fs_path(relative), recursive=True)

    def move(self, source: str, target: str) -> bool:
        """Move a file; True if this call moved it, False if it was moved already
        (source gone, target there). Raises when both are gone."""
        try:
            self.fs.move(self.location.fs_path(source), self.location.fs_path(target))
            return True
        except (FileNotFoundError, OSError) as error:
            if self.exists(target) and not self.exists(source):
                return False
            raise FileNotFoundError(f"moving {source} to {target} in {self.location.spark_root}: {error}") from error

    def write_atomically(self, relative: str, data: bytes) -> None:
        """Write a whole file so that readers see all of it or none: a temporary file
        (fsynced on a local file system) moved into place."""
        directory = posixpath.dirname(relative)
        temp = posixpath.join(directory, f".{posixpath.basename(relative)}.{uuid.uuid4().hex}.tmp")
        if self.location.local:
            path = self.location.local_path(temp)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(path, self.location.local_path(relative))
            fsync_directory(self.location.local_path(directory))
            return
        with self.fs.open_output_stream(self.location.fs_path(temp)) as stream:
            stream.write(data)
        try:
            self.fs.move(self.location.fs_path(temp), self.location.fs_path(relative))
        except OSError:
            if not self.exists(relative):  # a file system that refuses to rename onto an existing file
                raise
            self.delete_file(temp)

    def delete_file(self, relative: str) -> None:
        try:
            self.fs.delete_file(self.location.fs_path(relative))
        except FileNotFoundError:
            pass

    def delete_dir(self, relative: str) -> None:
        try:
            self.fs.delete_dir(self.location.fs_path(relative))
        except FileNotFoundError:
            pass

    def sync_files(self, relatives: Sequence[str]) -> None:
        """fsync files and their directories (local file systems; elsewhere a no-op)."""
        if not self.location.local:
            return
        directories: set[str] = set()
        for relative in relatives:
            fd = os.open(self.location.local_path(relative), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            directories.add(posixpath.dirname(relative))
        self.sync_dirs(directories)

    def sync_dirs(self, relatives: Iterable[str]) -> None:
        """fsync directories and their parents up to the root (local file systems)."""
        if not self.location.local:
            return
        done: set[str] = set()
        for relative in relatives:
            while relative not in done:
                done.add(relative)
                fsync_directory(self.location.local_path(relative))
                if not relative:
                    break
                relative = posixpath.dirname(relative)


# ----------------------------------------------------------------------------- Spark's metadata log


class SparkMetadataLog:
    """Writes Spark's file-sink metadata log (``<root>/_spark_metadata``), the one
    ``spark.read.parquet(root)`` honours.

    Entry ``n`` is ``v1`` followed by one JSON ``SinkFileStatus`` per file; entries
    ``n`` with ``(n + 1) % compact_interval == 0`` are ``n.compact`` files holding every
    file of entries ``0..n``. ``compact_interval`` must be what readers use
    (``spark.sql.streaming.fileSink.log.compactInterval``, 10 by default). After writing a
    compact entry, entries below the previous compact entry are deleted: a reader needs
    the newest compact entry and the entries after it.
    """

    VERSION = "v1"
    _BLOCK_SIZE = 128 * 1024 * 1024

    def __init__(self, files: _Files, compact_interval: int = 10) -> None:
        self.files = files
        self.compact_interval = compact_interval

    def _name(self, number: int) -> str:
        suffix = ".compact" if (number + 1) % self.compact_interval == 0 else ""
        return f"{METADATA_DIR}/{number}{suffix}"

    def latest(self) -> int:
        """The highest entry number written (-1 for none)."""
        numbers = [-1]
        for name in self.files.list_names(METADATA_DIR):
            stem = name[:-len(".compact")] if name.endswith(".compact") else name
            if stem.isdigit():
                numbers.append(int(stem))
        return max(numbers)

    def _lines(self, number: int) -> list[str]:
        data = self.files.read(self._name(number))
        if data is None:
            raise FileNotFoundError(f"{self.files.location.spark_root}/{self._name(number)} is missing: the metadata "
                                    "log has a hole (entries are written in order; was it edited?)")
        lines = data.decode().split("\n")
        if lines[0] != self.VERSION:
            raise ValueError(f"{self._name(number)} has version {lines[0]!r}, not {self.VERSION}")
        return [line for line in lines[1:] if line]

    def status_lines(self, files: Sequence[tuple[str, StagedFile]]) -> list[str]:
        """One ``SinkFileStatus`` line per (final relative path, staged file)."""
        return [json.dumps({"path": self.files.location.uri(relative), "size": staged.size, "isDir": False,
                            "modificationTime": staged.modification_time, "blockReplication": 1,
                            "blockSize": self._BLOCK_SIZE, "action": "add"}, separators=(",", ":"))
                for relative, staged in files]

    def write(self, number: int, lines: list[str]) -> None:
        """Write entry ``number`` (every entry below it must exist)."""
        if (number + 1) % self.compact_interval == 0:
            everything: list[str] = []
            first = number - self.compact_interval + 1
            if first > 0:
                everything.extend(self._lines(first - 1))
            for earlier in range(max(first, 0), number):
                everything.extend(self._lines(earlier))
            lines = everything + lines
        self.files.make_dirs(METADATA_DIR)
        self.files.write_atomically(self._name(number), ("\n".join([self.VERSION, *lines])).encode())
        if (number + 1) % self.compact_interval == 0:
            self._delete_before(number - self.compact_interval)

    def _delete_before(self, keep_from: int) -> None:
        for name in self.files.list_names(METADATA_DIR):
            stem = name[:-len(".compact")] if name.endswith(".compact") else name
            if stem.isdigit() and int(stem) < keep_from:
                self.files.delete_file(f"{METADATA_DIR}/{name}")


# ----------------------------------------------------------------------------- writers


class ParquetWriter:
    """The default writer: Parquet staged under ``_eventprocessor_staging/<batch_id>``,
    then published into the table (see the module docstring)."""

    has_files = True

    def __init__(self, location: OutputLocation, partition_by: Sequence[str], options: Mapping[str, str],
                 step_hook: StepHook | None = None) -> None:
        self.location = location
        self.files = _Files(location)
        self.metadata = SparkMetadataLog(self.files)
        self.partition_by = list(partition_by)
        # The commit log and publication make the Hadoop committer's second round of renames
        # redundant: task output may go straight to the staging directory.
        self.options = {"mapreduce.fileoutputcommitter.algorithm.version": "2",
                        "mapreduce.fileoutputcommitter.marksuccessfuljobs": "false", **dict(options)}
        self._hook = step_hook or _no_hook

    def __repr__(self) -> str:
        return f"ParquetWriter({self.location.spark_root!r})"

    @staticmethod
    def staging(batch_id: int) -> str:
        return f"{STAGING_DIR}/{batch_id:012d}"

    def write(self, df: Any, batch_id: int, batch: Any) -> None:
        """Spark writes the batch into its staging directory (replacing a failed attempt)."""
        writer = df.write.mode("overwrite")
        if self.partition_by:
            writer = writer.partitionBy(*self.partition_by)
        writer.options(**self.options).parquet(self.location.spark_path(self.staging(batch_id)))

    def manifest(self, batch_id: int) -> Manifest:
        """The staged data files (fsynced, on a local file system), for the commit."""
        staging = self.staging(batch_id)
        prefix = self.location.fs_path(staging) + "/"
        found = []
        for info in self.files.list_files(staging):
            relative = info.path[len(prefix):] if info.path.startswith(prefix) else info.base_name
            if any(part.startswith((".", "_")) for part in relative.split("/")):
                continue  # checksums, _SUCCESS, temporaries
            found.append(StagedFile(relative, int(info.size or 0), int((info.mtime_ns or 0) // 1_000_000)))
        found.sort(key=lambda f: f.path)
        self.files.sync_files([f"{staging}/{f.path}" for f in found])
        return tuple(found)

    @staticmethod
    def final_path(batch_id: int, staged: StagedFile) -> str:
        directory, name = posixpath.split(staged.path)
        final = f"b{batch_id:012d}-{name}"
        return f"{directory}/{final}" if directory else final

    def publish(self, publications: Sequence[Publication]) -> tuple[list[int], int]:
        """Publish committed batches in order (gaps first). Returns the batch ids this
        call wrote a metadata entry for (the others were published already) and the
        number of files it moved."""
        if not publications:
            return [], 0
        latest = self.metadata.latest()
        published: list[int] = []
        moved = 0
        for publication in publications:
            if publication.number > latest:
                moved += self._publish_one(publication)
                published.append(publication.batch_id)
                latest = publication.number
            self.files.delete_dir(self.staging(publication.batch_id))
        return published, moved

    def _publish_one(self, publication: Publication) -> int:
        staging = self.staging(publication.batch_id)
        targets: list[tuple[str, StagedFile]] = []
        directories: set[str] = set()
        made: set[str] = set()
        moved = 0
        for staged in publication.files:
            final = self.final_path(publication.batch_id, staged)
            directory = posixpath.dirname(final)
            if directory not in made:
                self.files.make_dirs(directory)
                made.add(directory)
            if self.files.move(f"{staging}/{staged.path}", final):
                moved += 1
                if moved == 1:
                    self._hook("mid_publish")
            targets.append((final, staged))
            directories.add(directory)
        self.files.sync_dirs(directories)
        self.metadata.write(publication.number, self.metadata.status_lines(targets))
        logger.debug("published batch %d as %s/%s/%d (%d files)", publication.batch_id, self.location.spark_root,
                     METADATA_DIR, publication.number, len(targets))
        return moved

    def discard(self, batch_id: int) -> None:
        self.files.delete_dir(self.staging(batch_id))

    def staged_batches(self) -> list[int]:
        """The batch ids that have a staging directory."""
        return sorted(int(name) for name in self.files.list_names(STAGING_DIR) if name.isdigit())


ForeachBatch = Callable[..., Any]


class ForeachBatchWriter:
    """Hands each batch to a user function ``f(df, batch_id)`` or ``f(df, batch_id, batch)``."""

    has_files = False

    def __init__(self, function: ForeachBatch) -> None:
        import inspect

        self.function = function
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):
            parameters = []
        positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        variadic = any(p.kind == p.VAR_POSITIONAL for p in parameters)
        self.wants_batch = variadic or len(positional) >= 3

    def __repr__(self) -> str:
        return f"ForeachBatchWriter({getattr(self.function, '__name__', self.function)!r})"

    def write(self, df: Any, batch_id: int, batch: Any) -> None:
        if self.wants_batch:
            self.function(df, batch_id, batch)
        else:
            self.function(df, batch_id)

    def manifest(self, batch_id: int) -> Manifest | None:
        return None

    def publish(self, publications: Sequence[Publication]) -> tuple[list[int], int]:
        return [], 0

    def discard(self, batch_id: int) -> None:
        pass

    def staged_batches(self) -> list[int]:
        return []


Writer = ParquetWriter | ForeachBatchWriter
