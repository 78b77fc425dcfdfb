"""Spark micro-batch sink: the partitions a processor owns, into Spark, exactly once.

Needs the ``[spark]`` extra (pyspark with its Spark Connect client, pyarrow, pandas)
and, for a classic session in this process, Java. ``import eventprocessor`` never
imports any of them; this package imports pyarrow, and pyspark only when the first
batch is written.

Example::

    from eventprocessor import EventProcessor
    from eventprocessor.spark import SparkSink

    sink = SparkSink("/data/events", partition_by="partition_id",
                     max_events=10_000, max_bytes=64 << 20, max_interval=5.0)
    async with EventProcessor(source, store, sink):
        await asyncio.sleep(60)
    await sink.close()
    spark.read.parquet("/data/events").groupBy("partition_id").count().show()

The same code on a cluster, through Spark Connect, with the commit log in the
checkpoint store the processors share and the table on ADLS::

    sink = SparkSink("abfss://lake@account.dfs.core.windows.net/events", commit_log=store,
                     remote="sc://spark-connect.example.com:15002")

Micro-batches
-------------
The sink is the processor's partition-processor factory: every claim gets a handler
that feeds one shared set of buffers. A batch is cut at ``max_events`` events,
``max_bytes`` bytes of bodies or ``max_interval`` seconds after its first event,
whichever comes first, and takes a fair share of every owned partition's buffered
events. While one batch is written, the next is planned and converted to a DataFrame,
and the handlers buffer at most one more (back-pressure). Spark runs in worker threads
and never on the event loop, so ownership renewals keep going however long Spark takes
(a first Spark Connect query, a busy cluster); batches commit in the order they were cut.

Each batch becomes one DataFrame, converted from Arrow (never row by row), with the
columns of :data:`EVENT_SCHEMA`::

    partition_id     string      sequence_number  long
    offset           string      enqueued_time    timestamp (UTC)
    partition_key    string      body             binary
    properties       map<string,string>

plus ``enqueued_date`` (date) when ``partition_by`` names it, plus the columns of
``decode`` (a function of the batch's Arrow table; :func:`json_body` parses JSON
bodies into columns or a struct). ``decode`` runs in the processor's process, not on
executors.

The DataFrame goes to ``foreach_batch(df, batch_id)`` (or ``foreach_batch(df,
batch_id, batch)`` with a :class:`MicroBatch` when the function takes three
arguments); it runs in a worker thread of the processor's process. Without
``foreach_batch`` the default writer appends Parquet to ``path``, partitioned by
``partition_by``. Sessions built by the sink read ``partition_id=0`` directories back
as strings (``spark.sql.sources.partitionColumnTypeInference.enabled=false``); set that
in your own session too, or read with an explicit schema.

Sessions
--------
The SparkSession is the one passed as ``spark``, else one made from ``remote``
(``sc://...``: Spark Connect) or ``master`` (``spark://``, ``yarn``, ``k8s://``,
``local[*]``) and ``spark_conf``, else the active one, else a new ``local[*]`` session
bound to 127.0.0.1. The sink uses only the DataFrame API (``createDataFrame`` from
Arrow and ``df.write``), never ``_jvm`` or ``sparkContext``, so classic and Connect
sessions run the same code. Nothing is downloaded at run time.

What the cluster needs: the jars for the output's file system (hadoop-azure for
``abfss://``, hadoop-aws for ``s3a://``) and its credentials. The sink's default writer
runs no Python on executors; ``foreach_batch`` code or ``decode`` columns that use Python
UDFs do, and executors then run the Python named by ``PYSPARK_PYTHON`` (of the driver
for a classic session, of the Connect server for Spark Connect), which needs the same
pyarrow and pandas.

The exactly-once contract
-------------------------
The sink keeps a commit log (:class:`~eventprocessor.spark.commit_log.CommitLog`): a
linear log of *fences*, batch *plans* and *commits*, each entry created with a real
create-if-absent, in the checkpoint store the processors share (``commit_log=store``:
Blob, Table or in-memory; nothing mounted) or in a directory of a POSIX file system
they all share (the default for a local path: ``<path>/_eventprocessor_commits``). One
log per output and per event hub and consumer group.

1. When a processor starts a partition (a claim with the store's ``epoch``), it appends
   a *fence*. A fence older than one already logged is refused: the claim is stale, and
   it ends at once (the processor stops dispatching it), so the partition's current
   owner goes on. The fence aborts every planned batch of another claim that contains
   the partition (an older claim, or an earlier claim object of the same owner and epoch:
   a processor whose lease ran out can adopt its own ownership record again), so the
   partition's committed *high-water mark* (highest committed sequence number) is final
   as of the fence. The handler skips events at or below it,
   wherever the store's checkpoint made the receiver start; when it reads the high-water
   mark event and the store's checkpoint is behind it (a crash between commit and
   checkpoint), it checkpoints that event.
2. A batch first appends its *plan*: per partition the sequence-number range and the
   claim (owner id, epoch). The plan's log version is the ``batch_id``: unique among all
   processors sharing the log and always naming the same ranges. A plan is refused for
   partitions whose latest fence is another claim; their claims end, their events are
   dropped (the new owner reads them) and the batch goes on with the rest.
3. The data is written: the Parquet writer writes to
   ``<path>/_eventprocessor_staging/<batch_id>/`` (invisible to readers) and lists the
   files it wrote; ``foreach_batch`` does whatever it does.
4. The batch appends its *commit* (with the list of its files). It is accepted only if
   no newer claim fenced one of its partitions since the plan. **This is the commit
   point.** The sink does not second-guess it with its own lease clock: a batch whose
   lease lapsed during a slow Spark call still commits if no other owner fenced, and is
   refused if one did.
5. The Parquet writer *publishes* the batch: it moves the staged files into ``path``
   (named ``b<batch_id>-...``), then writes entry ``n`` of Spark's own file-sink
   metadata log, ``<path>/_spark_metadata/n``, listing them (``n``: the batch's place
   among the commits; entries are written in order, gaps filled first). A plain
   ``spark.read.parquet(path)`` reads exactly the files that log lists, so it sees
   whole committed batches, never part of one. Whoever finds a committed batch not yet
   published (after a crash) publishes it; staged files of aborted batches are deleted.
6. Only then are the store checkpoints advanced, one per partition of the batch, fenced
   by ``(owner_id, epoch)``. A refused checkpoint (``OwnershipLostError``) is harmless:
   the new owner skips the batch's events through the commit log.

So, for the Parquet writer, each event is in the table exactly once whatever process
dies when: a crash before step 4 leaves only staged files that are deleted and events
that are read again; a crash after step 4 is rolled forward and the events are skipped
by high-water mark. A zombie owner cannot commit a partition's events once the new
owner's fence is in the log. A batch published twice (a roll-forward racing its
writer) is listed once: its files and its metadata entry are the same each time.

For ``foreach_batch``, the sink guarantees the same for its commit log, and calls
``foreach_batch`` at least once per committed batch: a batch whose function ran but did
not commit (crash, or a partition taken over mid-batch) has its events delivered again
later, in a batch with a new ``batch_id`` that may be cut differently. A retry after an
exception in ``foreach_batch`` keeps the ``batch_id`` and the data. Make the function
idempotent on ``batch_id`` (e.g. overwrite ``.../batch_id=N``), or on the
``(partition_id, sequence_number)`` ranges of :class:`MicroBatch`.

Failures
--------
A batch whose write fails (Spark, ``decode``, ``foreach_batch``) is written again with
the same ``batch_id`` under ``retry_policy`` (exponential backoff, at most
``max_delivery_attempts``), then the poison policy applies (park by default, or skip
through ``dead_letter``), as for handler errors. A failing commit log (store outage) is
retried with backoff while the claim lasts; a committed batch whose publication fails is
retried until it is published. All of it is logged.

What each file system gives
---------------------------
* Commit log in a checkpoint store (Blob, Table, in-memory): create-if-absent is atomic
  and exclusive; nothing needs mounting.
* Commit log in a directory: ``link`` is atomic and exclusive on local file systems and
  NFS; entries and their directory are fsynced.
* Output on a local file system (or NFS): staged data files and every directory entry
  the sink creates or renames are fsynced before the commit and after the moves, and the
  ``_spark_metadata`` entries are written to a temporary file, fsynced and renamed: a
  committed batch survives power loss. Moves are atomic renames.
* Output on HDFS or ADLS Gen2 (``abfss://`` with a hierarchical namespace): renames are
  atomic; durability is the service's.
* Output on object stores (``s3a://``, ``gs://``, Blob without hierarchical namespace):
  a move is a copy and a delete. ``spark.read.parquet(path)`` still sees whole batches
  (through ``_spark_metadata``); readers that list directories instead (pyarrow, pandas,
  engines that ignore ``_spark_metadata``) can see a batch's files twice while it is
  being moved, or partly.
* Any readers that ignore ``_spark_metadata`` see files as they are moved in (per
  file), never a batch that was not committed.

Compaction: the commit log keeps a snapshot every 100 entries and deletes entries below
a snapshot ``log_retention`` seconds (15 minutes) after it first saw it;
``_spark_metadata`` keeps a ``.compact`` entry every 10 batches (like Spark's own file
sink, it lists every file of the table) and the entries from the previous compact entry
on.

Fences compare the checkpoint store's epochs. Pointing a sink at an existing output with
a *new* checkpoint store (epochs starting again) is refused as stale (loudly: the claims
end); use a new output path (or ``log_name``) then. A commit log in the checkpoint store
itself cannot get out of step with it.

Event Hubs as a Spark source
----------------------------
:class:`EventHubsDataSource` (``spark.readStream.format("eventhubs")``) reads a hub
from Spark itself, with no processor process: see :mod:`eventprocessor.spark.source`.
"""
from typing import TYPE_CHECKING, Any

from ..extras import the_extra_it_needs

with the_extra_it_needs("eventprocessor.spark"):
    from .arrow import EVENT_SCHEMA, events_to_table, json_body
    from .attempt import Attempt, AttemptState, MicroBatch
    from .commit_log import BatchRefused, CommitLog, FileLogStorage, PartitionRange, StaleFenceError, StoreLogStorage
    from .output import COMMITS_DIR, METADATA_DIR, STAGING_DIR, OutputLocation
    from .session import is_connect, spark_session
    from .sink import SparkSink

if TYPE_CHECKING:  # pragma: no cover
    from .source.datasource import EventHubsDataSource

__all__ = [
    "EventHubsDataSource", "SparkSink", "MicroBatch", "PartitionRange", "CommitLog", "FileLogStorage",
    "StoreLogStorage", "BatchRefused", "StaleFenceError", "Attempt", "AttemptState", "EVENT_SCHEMA", "json_body",
    "events_to_table", "spark_session",
    "is_connect", "OutputLocation", "COMMITS_DIR", "STAGING_DIR", "METADATA_DIR",
]


def __getattr__(name: str) -> Any:
    # The data source subclasses pyspark's classes: pyspark is imported only when it is asked for.
    if name == "EventHubsDataSource":
        with the_extra_it_needs("eventprocessor.spark.EventHubsDataSource"):
            from .source.datasource import EventHubsDataSource

        return EventHubsDataSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
