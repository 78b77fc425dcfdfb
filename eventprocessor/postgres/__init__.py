"""PostgreSQL sink: the partitions a processor owns, into PostgreSQL, exactly once.

Needs the ``[postgres]`` extra (asyncpg). ``import eventprocessor`` never imports it.

Example::

    from eventprocessor import EventProcessor
    from eventprocessor.postgres import PostgresSink

    async def write(events, connection):          # runs inside the sink's transaction
        await connection.copy_records_to_table(
            "readings", columns=["partition_id", "sequence_number", "body"],
            records=[(e.partition_id, e.sequence_number, e.body) for e in events])

    sink = PostgresSink(write, dsn="postgresql://app@db:5432/telemetry")
    async with sink, EventProcessor(source, store, sink):
        await asyncio.sleep(60)

The checkpoint store can be any (``PostgresCheckpointStore`` keeps a group on PostgreSQL
alone). The rows need no unique key: nothing is written twice, so nothing needs
deduplicating.

How it writes
-------------
The sink is the processor's partition-processor factory: every claim gets a handler.
Each claim buffers its partition's events and commits them in transactions of at most
``max_events`` events, at the latest ``max_interval`` seconds after the first of them
arrived, on a task of its own: while one batch commits, the handler takes the next
events (up to one more batch, then it waits), so receiving overlaps with the database's
work. One transaction per batch of one partition, in order::

    BEGIN
    write(events, connection)                      -- your rows
    DO $$ BEGIN
        UPDATE positions SET sequence_number = <last event of the batch>
         WHERE <partition> AND claim_token = <this claim's> AND sequence_number = <where it was>;
        IF NOT FOUND THEN RAISE ... END IF;        -- SQLSTATE EPF01: roll back, the claim ends
    END $$; COMMIT                                 -- one message: the server runs both at once

The positions table (:mod:`~eventprocessor.postgres.positions`) has one row per partition:
the last committed sequence number, and the claim that may advance it (owner, the
checkpoint store's epoch, and a random token per claim). A new claim *fences* the row
before it writes anything: one statement that sets its owner, epoch and token, keeping the
position, only if the row's epoch is lower than the claim's (or the same epoch of the same
owner), and returns the position. That position is where the partition resumes: the
handler skips every event at or below it, wherever the store's checkpoint made the
receiver start. A fence that finds a newer epoch in the row ends the claim at once.

After each commit, at most every ``checkpoint_interval`` seconds and when the claim ends
gracefully, the store's checkpoint follows the committed position. It is only a hint
(where the next owner's receiver starts); it is never ahead of the database's position.

Why every event is in the table exactly once
--------------------------------------------
1. *Rows and position move together.* A transaction commits the rows of events
   ``(p, q]`` and moves the position from ``p`` to ``q``, or does neither.
2. *No overlap, no gap.* The ``UPDATE`` matches only if the row still says ``p`` and names
   this claim, and ``COMMIT`` runs only if it matched. It takes the row's lock until
   ``COMMIT``; under ``READ COMMITTED`` it judges its condition on the newest committed row
   (PostgreSQL re-reads a row changed since the statement began), under ``REPEATABLE
   READ`` and ``SERIALIZABLE`` a concurrent change fails it with a serialization error
   (the batch is run again). So the committed ranges follow each other: each event's rows
   are committed once.
3. *A stale claim commits nothing.* Once a newer claim's fence has committed, the row's
   token is not the old claim's, so the old claim's ``UPDATE`` matches nothing and its
   transaction rolls back with its rows, whatever it believes about its lease.
4. *Nobody waits for a frozen owner.* The ``UPDATE`` and ``COMMIT`` go out in one message,
   which the server runs without waiting for the client: no owner, frozen or cut off,
   holds the row between them, so a new owner's fence never waits for one (a fence that
   comes while the server runs them waits microseconds, then resumes after what they
   committed).

So, the interleavings:

* *SIGKILL at any step* (before ``BEGIN``, after it, after the write, after ``COMMIT``,
  after the checkpoint): the server rolls back the open transaction when the connection
  goes (or has committed it, if the last message arrived). The next owner's fence reads
  the committed position and resumes after it.
* *A zombie* (frozen by SIGSTOP past its lease, then resumed), wherever it froze,
  between batches or in the middle of one (of a COPY too): it holds no lock the new owner
  needs; the new owner fences as soon as the store gives it the partition. On waking, the
  zombie's ``UPDATE`` matches nothing and its transaction rolls back; or, if the server
  ended its idle session meanwhile (``transaction_idle_timeout``), its last message fails
  and the row tells it the partition is another claim's. Frozen after ``COMMIT``, it had
  committed before the new owner came, which resumes after those events.
* *A move between the write and the commit* (the partition stolen, or expired and taken):
  the same as a zombie. A planned handoff is cleaner still: the old owner commits what it
  buffered and checkpoints it before it releases the partition.
* *A commit whose answer is lost* (the connection breaks while the last message is out):
  the sink reads the row with ``SELECT ... FOR UPDATE`` on another connection (which
  waits if the server is running that message). The row says which: this claim at the
  batch's last event (committed), this claim at the position before (rolled back: the
  batch is written again, under the same condition), or another claim (this one ends; the
  new owner resumed from the row). It never guesses.
* *The database restarts*: open transactions roll back, committed ones are durable; the
  sink retries with backoff while the claim lasts and settles a lost commit as above.
* *A connection cut mid-transaction*: nothing was committed (the last message was not
  sent, or is settled as above); the batch is written again on another connection.

What it does not cover: effects of ``write`` outside the connection it is given (an HTTP
call, another database) are not transactional and can happen more than once. ``write``
must not commit or roll back the transaction, nor open one of its own with
``connection.transaction()`` (``SAVEPOINT`` statements work).

Failures
--------
A transaction that loses a serialization conflict or a deadlock is run again at once (up
to ``serialization_retries`` times). A database that cannot be reached, or that restarts,
is retried with backoff while the claim lasts. A batch whose write fails otherwise (your
function raises, a constraint is violated) is written again under ``retry_policy``, then
the partition is *parked*: nothing more of it is written or checkpointed until the
processor restarts, and an ERROR says why (``sink.parked``). A database position behind
the store's checkpoint (rows restored from an old backup, another positions table) parks
the partition too, with :class:`PositionBehindError`, rather than write around a gap.

Epochs come from the checkpoint store. Pointing a sink at an existing positions table
with a *new* checkpoint store (epochs starting again) is refused as stale (loudly: the
claims end); use another ``positions_table`` or delete that consumer group's rows.
"""
from .claims import SinkStats
from .positions import DEFAULT_POSITIONS_TABLE, Positions
from .sink import WRITE_RETRY_POLICY, PositionBehindError, PostgresSink
from .transaction import StepHook, WriteFunction

__all__ = ["PostgresSink", "PositionBehindError", "SinkStats", "WRITE_RETRY_POLICY", "DEFAULT_POSITIONS_TABLE",
           "Positions", "StepHook", "WriteFunction"]
