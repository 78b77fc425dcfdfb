"""Where a :class:`~eventprocessor.spark.SparkSink` sends its batches and keeps its
commit log, chosen (and checked) once from the sink's arguments.

* The writer: Parquet into ``path`` (staged, then published into the table and
  ``_spark_metadata``), or the user's ``foreach_batch``.
* The commit log: entries of a named log in the checkpoint store the processors share
  (the name derived from the output's path unless ``log_name`` says), or a directory of
  a POSIX file system all processors mount (``<path>/_eventprocessor_commits`` by
  default for a local output).

Example::

    output = SinkOutput.choose(path="/data/events", foreach_batch=None, commit_log=None, log_name=None,
                               filesystem=None, partition_by=["partition_id"], write_options={},
                               step_hook=lambda step: None)
    log = output.open_log(context, retention=900.0)
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigurationError
from ..partition import PartitionContext
from ..stores.contract import CheckpointStore
from .commit_log import CommitLog, FileLogStorage, StoreLogStorage
from .output import COMMITS_DIR, ForeachBatch, ForeachBatchWriter, OutputLocation, ParquetWriter, StepHook, Writer

__all__ = ["SinkOutput"]


@dataclass
class SinkOutput:
    """The writer, the output location (``None`` for ``foreach_batch``) and where the
    commit log lives: a checkpoint store with ``log_name``, or a directory path."""

    writer: Writer
    location: OutputLocation | None
    log_target: str | CheckpointStore
    log_name: str | None

    @classmethod
    def choose(cls, *, path: str | os.PathLike | None, foreach_batch: ForeachBatch | None,
               commit_log: str | os.PathLike | CheckpointStore | None, log_name: str | None, filesystem: Any,
               partition_by: Sequence[str], write_options: Mapping[str, str] | None,
               step_hook: StepHook) -> SinkOutput:
        """Check the arguments together; a wrong combination is one error naming the fix."""
        location: OutputLocation | None = None
        writer: Writer
        if foreach_batch is not None:
            if not callable(foreach_batch):
                raise ConfigurationError("foreach_batch must be callable as foreach_batch(df, batch_id)")
            if path is not None:
                raise ConfigurationError("pass either path (the Parquet writer) or foreach_batch, not both")
            writer = ForeachBatchWriter(foreach_batch)
        else:
            if path is None:
                raise ConfigurationError("SparkSink needs a path for the Parquet writer, or foreach_batch")
            location = OutputLocation(path, filesystem)
            writer = ParquetWriter(location, list(partition_by), write_options or {}, step_hook)
        target, name = _log_target(commit_log, log_name, location, foreach_batch is not None)
        return cls(writer=writer, location=location, log_target=target, log_name=name)

    def open_log(self, ctx: PartitionContext, retention: float) -> CommitLog:
        """The commit log, scoped to the context's event hub and consumer group."""
        target = self.log_target
        storage = (StoreLogStorage(target, self.log_name or "", fully_qualified_namespace=ctx.fully_qualified_namespace,
                                   eventhub_name=ctx.eventhub_name, consumer_group=ctx.consumer_group)
                   if isinstance(target, CheckpointStore) else FileLogStorage(target))
        return CommitLog(storage, fully_qualified_namespace=ctx.fully_qualified_namespace,
                         eventhub_name=ctx.eventhub_name, consumer_group=ctx.consumer_group, retention=retention)


def _log_target(commit_log: str | os.PathLike | CheckpointStore | None, log_name: str | None,
                location: OutputLocation | None, foreach: bool) -> tuple[str | CheckpointStore, str | None]:
    if isinstance(commit_log, CheckpointStore):
        if log_name is None:
            if foreach or location is None:
                raise ConfigurationError("foreach_batch with a commit log in a checkpoint store needs log_name= "
                                         "(one name per destination)")
            digest = hashlib.sha256(location.spark_root.encode()).hexdigest()[:16]
            log_name = f"spark-sink-{digest}"
        return commit_log, log_name
    if log_name is not None:
        raise ConfigurationError("log_name names a commit log kept in a checkpoint store (commit_log=store)")
    if commit_log is None:
        if foreach:
            raise ConfigurationError("foreach_batch needs commit_log=: a checkpoint store (with log_name=) or a "
                                     "directory all processors share")
        assert location is not None
        if not location.local:
            raise ConfigurationError(
                f"the output {location.spark_root} is not a local path: pass commit_log= (the checkpoint "
                "store the processors share, or a directory all of them mount)")
        return str(location.local_path(COMMITS_DIR)), None
    text = os.fspath(commit_log)
    if "://" in text and not text.startswith("file:"):
        raise ConfigurationError(f"commit_log {text.split('://')[0]}://... is not supported: pass a checkpoint "
                                 "store, or a directory on a POSIX file system all processors share")
    return (text[len("file://"):] if text.startswith("file://") else text), None
