"""PostgresSink: the partition-processor factory that writes each partition's events into
PostgreSQL exactly once. See the package docstring (:mod:`eventprocessor.postgres`) for
the contract and why it holds."""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Mapping
from types import TracebackType
from typing import Any

from .._runtime.backoff import Backoff
from .._sink_handler import SinkHandler
from ..errors import ConfigurationError, EventProcessorError, OwnershipLostError
from ..events import Event
from ..partition import PartitionProcessor, claim_of
from ..policies import CloseReason, RetryPolicy
from ..stores._postgres import check_dsn, describe, require_asyncpg, safe_dsn
from .claims import Claim, ClaimState, SinkStats
from .committer import Committer, HeldConnection, Outcome
from .positions import DEFAULT_POSITIONS_TABLE, Position, Positions
from .transaction import (
    StepHook,
    WriteFunction,
    run_step,
)

__all__ = ["PostgresSink", "WRITE_RETRY_POLICY", "PositionBehindError"]

logger = logging.getLogger(__name__)

WRITE_RETRY_POLICY = RetryPolicy(max_delivery_attempts=8, retry_backoff=1.0, max_retry_backoff=60.0)
"""How often a batch whose write fails is tried: 8 attempts, 1 s backoff doubling up to
60 s (about two minutes), then the partition is parked."""

_ISOLATIONS = ("read_committed", "repeatable_read", "serializable")
_FENCE_TIMEOUT = 5.0


class PositionBehindError(EventProcessorError):
    """The database's position of a partition is behind the checkpoint store's: rows the
    store counts as written are not in the database (restored from a backup, another
    handler checkpointed the group, or another positions table). The partition is parked
    rather than written with a gap."""


class PostgresSink:
    """Writes the events of every partition a processor owns into PostgreSQL, exactly once.

    ``write(events, connection)`` is your async function: it writes one partition's
    events (in order) with the asyncpg connection it gets, inside a transaction the sink
    opened; in the same transaction the sink moves the partition's position in the
    positions table, and commits. A partition's consecutive transactions share one
    connection until its backlog is written. See :mod:`eventprocessor.postgres` for the
    guarantee.

    * ``dsn`` (a ``postgresql://`` URI; its password is never shown) or ``pool`` (an
      asyncpg pool of your own, not closed by the sink).
    * ``positions_table``, ``schema``: where the positions live (created on first use).
    * ``max_events``: events per transaction at most (batching); ``max_interval``: the
      longest an event waits in the buffer before its transaction (the commit cadence).
    * ``isolation``: ``read_committed`` (default), ``repeatable_read`` or ``serializable``.
    * ``serialization_retries``: how often a transaction that lost a serialization
      conflict or a deadlock (SQLSTATE 40001, 40P01) is run again at once (default 10);
      then it counts as a failed write.
    * ``retry_policy``: a batch whose write fails (your function raises, a constraint is
      violated) is written again after its backoff, up to ``max_delivery_attempts``
      (default :data:`WRITE_RETRY_POLICY`); then the partition is parked. A database that
      cannot be reached (restarting, a broken connection) is retried while the claim lasts.
    * ``checkpoint_interval``: how often (seconds) the checkpoint store's checkpoint
      follows the committed position; it is only where a new owner's receiver starts
      reading, the database's position decides what is written.
    * ``transaction_idle_timeout``: the server ends a sink session that sits idle inside
      a transaction this long (a frozen or cut-off owner), rolling it back and releasing
      the locks its write took on your rows (default 30 s). ``write`` must not pause that
      long between two statements.
    * ``pool_size``, ``connect_options``: the pool's size and more ``asyncpg.create_pool``
      arguments (``ssl=``, ``command_timeout=``, ``server_settings=``...).
    * ``step_hook(step, context)``: called at each step of a batch: ``before_begin``
      (nothing sent yet), ``after_begin`` (the transaction open), ``after_write`` (rows
      written, the position's ``UPDATE`` and ``COMMIT`` not sent), ``after_commit``,
      ``after_checkpoint`` (the store's checkpoint moved up); may return an awaitable. For
      fault-injection tests and tracing.

    Example (rows from JSON bodies, on a pool of the application's own; the package's
    docstring has the ``COPY`` one)::

        async def write(events, connection):
            orders = [event.body_as_json() for event in events]
            await connection.executemany("INSERT INTO orders (id, total) VALUES ($1, $2)",
                                         [(order["id"], order["total"]) for order in orders])

        pool = await asyncpg.create_pool("postgresql://app@db:5432/shop", max_size=8)
        async with PostgresSink(write, pool=pool) as sink, EventProcessor(source, store, sink):
            await asyncio.sleep(60)
    """

    def __init__(self, write: WriteFunction, *, dsn: str | None = None, pool: Any = None,
                 positions_table: str = DEFAULT_POSITIONS_TABLE, schema: str | None = None,
                 max_events: int = 1000, max_interval: float = 1.0, isolation: str = "read_committed",
                 serialization_retries: int = 10, retry_policy: RetryPolicy | None = None,
                 checkpoint_interval: float = 5.0, transaction_idle_timeout: float = 30.0, pool_size: int = 10,
                 connect_options: Mapping[str, Any] | None = None, step_hook: StepHook | None = None) -> None:
        self._asyncpg = require_asyncpg("PostgresSink")
        if not callable(write) or not (inspect.iscoroutinefunction(write)
                                       or inspect.iscoroutinefunction(type(write).__call__)):
            raise ConfigurationError("write must be an async function: async def write(events, connection)")
        if (pool is None) == (dsn is None):
            raise ConfigurationError("PostgresSink needs dsn= (a postgresql:// URI) or pool= (an asyncpg pool), "
                                     "one of them")
        self._dsn = None if dsn is None else check_dsn(dsn, "PostgresSink")
        for name, value, low in (("max_events", max_events, 1), ("pool_size", pool_size, 1),
                                 ("serialization_retries", serialization_retries, 0)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigurationError(f"{name} must be an int of at least {low}, got {value!r}")
        for name, number in (("max_interval", max_interval), ("checkpoint_interval", checkpoint_interval),
                             ("transaction_idle_timeout", transaction_idle_timeout)):
            if not isinstance(number, (int, float)) or number <= 0:
                raise ConfigurationError(f"{name} must be a positive number of seconds, got {number!r}")
        if isolation not in _ISOLATIONS:
            raise ConfigurationError(f"isolation must be one of {', '.join(_ISOLATIONS)}, got {isolation!r}")
        if step_hook is not None and not callable(step_hook):
            raise ConfigurationError("step_hook must be callable as step_hook(step, context)")
        self._write = write
        self._positions = Positions(positions_table, schema)
        self.max_events = max_events
        self.max_interval = float(max_interval)
        self.isolation = isolation
        self.serialization_retries = serialization_retries
        self.retry_policy = retry_policy or WRITE_RETRY_POLICY
        self.checkpoint_interval = float(checkpoint_interval)
        self.transaction_idle_timeout = float(transaction_idle_timeout)
        self._pool = pool
        self._own_pool = pool is None
        self._pool_size = pool_size
        self._connect_options = dict(connect_options or {})
        self._hook = step_hook
        self._ready = False
        self._ready_lock = asyncio.Lock()
        self.stats = SinkStats()
        self._committer = Committer(pool=self._ready_pool, positions=self._positions, write=write, hook=step_hook,
                                    isolation=isolation, serialization_retries=serialization_retries,
                                    retry_policy=self.retry_policy, stats=self.stats)

    def __repr__(self) -> str:
        where = f"dsn={safe_dsn(self._dsn)!r}" if self._dsn else "pool=<asyncpg pool>"
        return (f"PostgresSink({where}, positions_table={self._positions.table}, max_events={self.max_events}, "
                f"max_interval={self.max_interval})")

    def __call__(self) -> PartitionProcessor:
        """One handler per partition claim; the processor calls this."""
        return SinkHandler(self, Claim)

    @property
    def parked(self) -> dict[str, BaseException]:
        """Partitions parked (nothing written until the processor restarts), with why."""
        return self.stats.parked

    @property
    def last_error(self) -> BaseException | None:
        return self.stats.last_error

    async def positions(self, fully_qualified_namespace: str, eventhub_name: str,
                        consumer_group: str) -> dict[str, int]:
        """The last committed sequence number of each partition, read from the database now.

        Example::

            done = await sink.positions(source.fully_qualified_namespace, source.eventhub_name, "$default")
        """
        pool = await self._ready_pool()
        async with pool.acquire() as connection:
            holders = await self._positions.read_all(connection, (fully_qualified_namespace, eventhub_name,
                                                                  consumer_group))
        return {pid: holder.position.sequence_number for pid, holder in holders.items()}

    async def close(self) -> None:
        """Close the sink's connection pool (not a pool you passed in). Call it after the
        processor stopped: a stop commits what the claims buffered."""
        if self._own_pool and self._pool is not None:
            pool, self._pool, self._ready = self._pool, None, False
            await pool.close()

    async def __aenter__(self) -> PostgresSink:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # ------------------------------------------------------------------ connections
    async def _ready_pool(self) -> Any:
        """The pool, with the positions table created (once)."""
        if self._ready:
            return self._pool
        async with self._ready_lock:
            if self._pool is None:
                options = dict(self._connect_options)
                settings = {"application_name": "eventprocessor-sink",
                            "idle_in_transaction_session_timeout": str(int(self.transaction_idle_timeout * 1000)),
                            **dict(options.pop("server_settings", None) or {})}
                options.setdefault("timeout", 10.0)  # connecting
                self._pool = self._asyncpg.create_pool(self._dsn, min_size=0, max_size=self._pool_size,
                                                       server_settings=settings, **options)
            if not self._ready:
                await self._pool
                async with self._pool.acquire() as connection:
                    await self._positions.create(connection)
                self._ready = True
        return self._pool

    # ------------------------------------------------------------------ claims
    async def _open(self, claim: Claim) -> None:
        """Fence the claim in the positions table (retrying while the claim lasts). A
        stale claim ends at once; a position behind the store's parks the partition."""
        ctx = claim.context
        retry = Backoff(0.2, cap=10.0)
        while claim.state is ClaimState.FENCING:
            if not ctx.is_owned:
                self._end(claim)
                return
            try:
                position = await self._fence(claim)
            except Exception as error:
                self.stats.last_error = error
                delay = retry.next()
                logger.warning("sink: fencing partition %s of %s/%s in %s failed (%s); retrying in %.1f s",
                               ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, self._positions.table,
                               describe(error), delay)
                await asyncio.sleep(delay)
                continue
            if position is None:
                await self._stale(claim, "fence")
                return
            if position.sequence_number < claim.store_position:
                self._park(claim, PositionBehindError(
                    f"partition {ctx.partition_id} of {ctx.eventhub_name}/{ctx.consumer_group}: the database's "
                    f"position ({position.sequence_number}) is behind the checkpoint store's "
                    f"({claim.store_position}): events the store counts as written are not in {self._positions.table} "
                    "(a database restored from a backup, another handler checkpointing the group, another "
                    "positions table?). Set the store's checkpoint back to the database's position to write them, "
                    "or delete the partition's row to accept the gap; then restart the processor"))
                return
            claim.position = claim.accepted = position.sequence_number
            claim.advance = self._positions.advance_statement(claim.key, claim_token=claim.token)
            claim.state = ClaimState.ACTIVE
            claim.checkpointed_at = asyncio.get_running_loop().time()
            claim.flusher = asyncio.create_task(self._flusher(claim), name=f"sink-flush-{ctx.partition_id}")
            logger.info("sink: owner %s starts partition %s of %s/%s (epoch %s) after sequence number %s",
                        ctx.owner_id, ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, ctx.epoch,
                        position.sequence_number)

    async def _fence(self, claim: Claim) -> Position | None:
        ctx = claim.context
        checkpoint = ctx.last_checkpoint
        start = Position(checkpoint.sequence_number, checkpoint.offset) if checkpoint else Position(-1, None)
        pool = await self._ready_pool()
        async with pool.acquire() as connection:
            return await self._positions.fence(connection, claim.key, owner_id=ctx.owner_id, epoch=ctx.epoch,
                                               claim_token=claim.token, start=start, timeout=_FENCE_TIMEOUT)

    async def _stale(self, claim: Claim, doing: str) -> None:
        """A newer claim holds the partition's row: this claim ends now."""
        ctx = claim.context
        holder = None
        try:
            pool = await self._ready_pool()
            async with pool.acquire() as connection:
                holder = await self._positions.holder(connection, claim.key)
        except Exception as error:
            logger.debug("sink: reading the holder of partition %s failed: %s", ctx.partition_id, describe(error))
        who = f"{holder.owner_id} (epoch {holder.epoch})" if holder else "another claim"
        logger.warning("sink: %s of partition %s of %s/%s by %s (epoch %s) refused: %s holds it in %s; this "
                       "claim ends and commits nothing more", doing, ctx.partition_id, ctx.eventhub_name,
                       ctx.consumer_group, ctx.owner_id, ctx.epoch, who, self._positions.table)
        self._end(claim, fenced_out=True)

    async def _add(self, claim: Claim, events: list[Event]) -> None:
        if claim.state is ClaimState.FENCING:
            await self._open(claim)
        if not claim.active or not events:
            return
        skipped = claim.accept(events, asyncio.get_running_loop().time())
        if skipped:
            await self._catch_up_checkpoint(claim, skipped)
        if len(claim.events) >= self.max_events:
            claim.full.set()
            # Back-pressure: one batch committing, one more waiting, then the handler waits.
            while claim.active and len(claim.events) >= 2 * self.max_events:
                claim.space.clear()
                await claim.space.wait()

    async def _catch_up_checkpoint(self, claim: Claim, skipped: list[Event]) -> None:
        """The store's checkpoint can trail the database (a crash between commit and
        checkpoint): once the event at the database's position comes by, checkpoint it, so
        that the next claim does not read those events again."""
        if claim.store_position >= claim.position:
            return
        for event in skipped:
            if event.sequence_number == claim.position:
                await self._checkpoint(claim, event)
                return

    async def _flush(self, claim: Claim, *, everything: bool = False) -> None:
        """Commit the buffered events, ``max_events`` per transaction (under ``claim.lock``):
        the full transactions only, or everything (at a stop, or when ``max_interval`` is up)."""
        held = HeldConnection(self._ready_pool)  # one connection while the transactions follow each other
        try:
            while claim.active and claim.events and (everything or len(claim.events) >= self.max_events):
                chunk = claim.events[:self.max_events]
                if not await self._commit(claim, chunk, held):
                    return
                claim.committed(len(chunk), asyncio.get_running_loop().time())
                claim.space.set()
                self.stats.transactions_committed += 1
                self.stats.events_committed += len(chunk)
                await run_step(self._hook, "after_commit", claim.context)
                await self._checkpoint_when_due(claim)
        finally:
            await held.let_go()

    async def _flusher(self, claim: Claim) -> None:
        """The claim's committing task: a full batch at once, a smaller one ``max_interval``
        after its first event arrived (the commit cadence). It runs beside the handler, so
        the partition's next events are received while a batch commits."""
        loop = asyncio.get_running_loop()
        while claim.active:
            await claim.pending.wait()
            full = len(claim.events) >= self.max_events
            delay = claim.first_at + self.max_interval - loop.time()
            if not full and delay > 0:
                claim.full.clear()
                try:
                    await asyncio.wait_for(claim.full.wait(), delay)
                except asyncio.TimeoutError:
                    pass
                continue
            try:
                async with claim.lock:
                    await self._flush(claim, everything=not full)
            except Exception as error:  # never let the cadence die: the events would wait for nothing
                self.stats.last_error = error
                logger.exception("sink: committing partition %s failed unexpectedly; trying again in %.1f s",
                                 claim.partition_id, self.max_interval)
                await asyncio.sleep(self.max_interval)
            finally:
                claim.space.set()

    async def _commit(self, claim: Claim, chunk: list[Event], held: HeldConnection) -> bool:
        """Commit ``chunk``; False when the claim ended or parked instead."""
        outcome, error = await self._committer.commit(claim, chunk, held)
        if outcome is Outcome.COMMITTED:
            return True
        if outcome is Outcome.STALE:
            await self._stale(claim, "commit")
        elif outcome is Outcome.PARKED:
            assert error is not None
            self._park(claim, error)
        else:
            self._end(claim)
        return False

    async def _checkpoint_when_due(self, claim: Claim) -> None:
        now = asyncio.get_running_loop().time()
        if claim.last_committed is not None and now - claim.checkpointed_at >= self.checkpoint_interval:
            await self._checkpoint(claim, claim.last_committed)

    async def _checkpoint(self, claim: Claim, event: Event) -> None:
        """Move the store's checkpoint up to a committed event (a hint for where the next
        owner's receiver starts; the database's position decides what is written)."""
        ctx = claim.context
        claim.checkpointed_at = asyncio.get_running_loop().time()
        try:
            await ctx.update_checkpoint(event)
        except OwnershipLostError as lost:
            logger.info("sink: checkpoint of partition %s refused by the store (%s); the claim ends",
                        ctx.partition_id, lost)
            self._end(claim, fenced_out=True)
            return
        except Exception as error:
            self.stats.last_error = error
            logger.warning("sink: checkpoint of partition %s of %s/%s failed (%r); the database's position is "
                           "unaffected", ctx.partition_id, ctx.eventhub_name, ctx.consumer_group, error)
            return
        claim.store_position = max(claim.store_position, event.sequence_number)
        await run_step(self._hook, "after_checkpoint", ctx)

    def _end(self, claim: Claim, *, fenced_out: bool = False) -> None:
        """The claim takes nothing more; its buffered events are dropped (the partition's
        next claim reads them again). ``fenced_out``: a newer claim holds the partition, so
        the processor is told to stop the claim now rather than when its lease ends."""
        if claim.state is not ClaimState.PARKED:
            claim.state = ClaimState.ENDED
        dropped = claim.drop()
        if dropped:
            logger.info("sink: dropping %d buffered events of partition %s (epoch %s): the claim ended", dropped,
                        claim.partition_id, claim.context.epoch)
        if fenced_out:
            claim_of(claim.context).fence_lost()

    def _park(self, claim: Claim, error: BaseException) -> None:
        """Nothing more of the claim is written or checkpointed until the processor
        restarts (it keeps the partition, so no other processor trips over the same rows)."""
        claim.state = ClaimState.PARKED
        claim.drop()
        self.stats.parked[claim.partition_id] = error
        self.stats.last_error = error
        logger.error("sink: partition %s is parked, nothing of it is written until the processor restarts: %s",
                     claim.partition_id, error)

    async def _close(self, claim: Claim, reason: CloseReason) -> None:
        """A stop or a handoff commits what the claim buffered while it still holds its
        lease, and checkpoints it; a lost claim drops what it buffered."""
        graceful = reason in (CloseReason.SHUTDOWN, CloseReason.HANDOFF)
        try:
            async with claim.lock:
                if graceful and claim.active:
                    await self._flush(claim, everything=True)
                    last = claim.last_committed
                    if claim.active and last is not None and claim.store_position < last.sequence_number:
                        await self._checkpoint(claim, last)
        finally:
            if claim.flusher is not None:
                claim.flusher.cancel()
            self._end(claim)
