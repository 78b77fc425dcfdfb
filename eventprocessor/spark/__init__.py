"""Spark micro-batch sink: the partitions a processor owns, into Spark, exactly once.

Needs the ``[spark]`` extra (pyspark, pyarrow, pandas) and Java. ``import
eventprocessor`` never imports any of them; this package imports pyarrow, and pyspark
only when the first batch is written.

Example::

    from eventprocessor import EventProcessor
    from eventprocessor.spark import SparkSink

    sink = SparkSink("/data/events", partition_by="partition_id",
                     max_events=10_000, max_bytes=64 << 20, max_interval=5.0)
    async with EventProcessor(source, store, sink):
        await asyncio.sleep(60)
    await sink.close()
    spark.read.parquet("/data/events").groupBy("partition_id").count().show()

Micro-batches
-------------
The sink is the processor's partition-processor factory: every claim gets a handler
that feeds one shared batcher. A batch is cut at ``max_events`` events, ``max_bytes``
bytes of bodies or ``max_interval`` seconds after its first event, whichever comes
first (a batch never holds more than ``max_events`` events or ``max_bytes`` of bodies,
except one larger event), and takes a fair share of every owned partition's buffered
events. While one batch is written, the next is planned and converted to a DataFrame,
and the handlers buffer at most one more (back-pressure). Spark runs in worker
threads, so ownership renewals keep going; batches commit in the order they were cut.

Each batch becomes one DataFrame, converted from Arrow (never row by row), with the
columns of :data:`EVENT_SCHEMA`::

    partition_id     string      sequence_number  long
    offset           string      enqueued_time    timestamp (UTC)
    partition_key    string      body             binary
    properties       map<string,string>

plus ``enqueued_date`` (date) when ``partition_by`` names it, plus the columns of
``decode`` (a function of the batch's Arrow table; :func:`json_body` parses JSON
bodies into columns or a struct).

The DataFrame goes to ``foreach_batch(df, batch_id)`` (or ``foreach_batch(df,
batch_id, batch)`` with a :class:`MicroBatch` when the function takes three
arguments); it runs in a worker thread. Without ``foreach_batch`` the default writer
appends Parquet to ``path``, partitioned by ``partition_by``. Sessions built by the sink
read ``partition_id=0`` directories back as strings
(``spark.sql.sources.partitionColumnTypeInference.enabled=false``); set that in your own
session too, or read with an explicit schema.

The SparkSession is the one passed as ``spark``, else the active one, else a new
``local[*]`` session bound to 127.0.0.1; ``master`` and ``spark_conf`` select any
cluster (``spark://``, ``yarn``, ``k8s://``). Nothing is downloaded at run time.

The exactly-once contract
-------------------------
The sink keeps a commit log (:class:`~eventprocessor.spark.commit_log.CommitLog`) in
``checkpoint_location`` (default ``<path>/_eventprocessor_commits``). It is a linear
log of *fences* and *batch plans*, each version created atomically and exclusively
(write a temporary file, then ``link`` it into place), so it needs a POSIX file
system shared by all processors of the consumer group (local disk, NFS, a mounted
volume). One output and one log per event hub and consumer group.

1. When a processor starts a partition (a claim with the store's ``epoch``), it
   appends a *fence*. A fence older than one already logged is refused (the claim is
   stale, its events are dropped). The fence aborts every unfinished batch plan that
   contains the partition, so the partition's committed *high-water mark* (highest
   committed sequence number) is final as of the fence. The handler skips events at
   or below it, wherever the store's checkpoint made the receiver start; when it
   reads the high-water mark event and the store's checkpoint is behind it (a crash
   between commit and checkpoint), it checkpoints that event.
2. A batch first appends its *plan*: per partition the sequence-number range and
   the claim (owner id, epoch). The plan's log version is the ``batch_id``: unique
   among all processors sharing the log and always naming the same ranges. A plan is
   refused for partitions whose latest fence is another claim; their events are
   dropped and the batch goes on with the rest.
3. The data is written: the Parquet writer writes to
   ``<path>/_eventprocessor_staging/<batch_id>/`` (invisible to readers: Spark skips
   ``_`` directories); ``foreach_batch`` does whatever it does.
4. Right before committing, the handler checks the claims are still owned, then
   creates the batch's *outcome* ``committed``. A fencer creates ``aborted`` for the
   same batch; only one of the two files can exist, so a batch is committed exactly
   when its claims were current at the commit point. **This is the commit point.**
5. The Parquet writer moves the staged files into ``path`` (names prefixed with
   ``b<batch_id>-``). Whoever finds a committed batch still staged (after a crash)
   finishes the move; staged files of aborted batches are deleted.
6. Only then are the store checkpoints advanced, one per partition of the batch,
   fenced by ``(owner_id, epoch)``. A refused checkpoint (``OwnershipLostError``) is
   harmless: the new owner skips the batch's events through the commit log.

So, for the Parquet writer, each event is in the table exactly once whatever
process dies when: a crash before step 4 leaves only staged files that are deleted
and events that are read again; a crash after step 4 is rolled forward and the events
are skipped by high-water mark. A zombie owner cannot commit a partition's events
once the new owner's fence is in the log. Visibility is per file, not per batch: a
reader listing the table while a batch is being moved (or before a crashed move is
rolled forward) can see part of that batch, never an uncommitted one. Log entries
are fsynced; Spark's local Parquet files are not, so the guarantee covers process
crashes, not a host losing power.

For ``foreach_batch``, the sink guarantees the same for its commit log, and calls
``foreach_batch`` at least once per committed batch: a batch whose function ran but
did not commit (crash, or a partition taken over mid-batch) has its events delivered
again later, in a batch with a new ``batch_id`` that may be cut differently. A retry
after an exception
in ``foreach_batch`` keeps the ``batch_id`` and the data. Make the function
idempotent on ``batch_id`` (e.g. overwrite ``.../batch_id=N``), or on the
``(partition_id, sequence_number)`` ranges of :class:`MicroBatch`.

Fences compare the checkpoint store's epochs. Pointing a sink at an existing output
with a *new* checkpoint store (epochs starting again) can be refused as stale; use a
new output path then.
"""
from .arrow import EVENT_SCHEMA, events_to_table, json_body
from .commit_log import BatchRefused, CommitLog, PartitionRange
from .sink import COMMITS_DIR, STAGING_DIR, MicroBatch, SparkSink, spark_session

__all__ = [
    "SparkSink", "MicroBatch", "PartitionRange", "CommitLog", "BatchRefused", "EVENT_SCHEMA", "json_body",
    "events_to_table", "spark_session", "COMMITS_DIR", "STAGING_DIR",
]
