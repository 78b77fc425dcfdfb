"""Committing one claim's batch: one transaction (:func:`~.transaction.write_batch`), tried
again as each failure allows.

* a serialization failure or a deadlock (SQLSTATE 40001, 40P01): run again at once, up to
  ``serialization_retries`` times, then counted as a failed write;
* a database that cannot be reached, or that restarts (a broken connection, a shutdown, a
  server still starting, too many connections): tried again with backoff (0.1 s doubling
  to 5 s) while the claim lasts;
* a commit whose answer was lost: the row is read once the transaction is over
  (:func:`~.transaction.settle_commit`): committed, or written again;
* any other failure (``write`` raises, a constraint is violated): written again under the
  retry policy, then the outcome is :attr:`Outcome.PARKED`.

The claim's lease is checked before each attempt: once it ran out, the outcome is
:attr:`Outcome.ENDED` (the next owner reads the events again).
"""
from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any

from .._runtime.backoff import Backoff
from ..errors import PoisonEventsError
from ..events import Event
from ..policies import RetryPolicy
from ..stores._postgres import SERIALIZATION_STATES, describe, transient
from .claims import Claim, SinkStats
from .positions import Positions
from .transaction import CommitOutcomeUnknown, StaleClaim, StepHook, WriteFunction, settle_commit, write_batch

__all__ = ["Committer", "HeldConnection", "Outcome"]

logger = logging.getLogger(__name__)


class Outcome(enum.Enum):
    COMMITTED = "committed"
    STALE = "stale"
    """A newer claim holds the partition: nothing was committed; the claim must end."""
    ENDED = "ended"
    """The claim's lease ran out before the batch could be committed."""
    PARKED = "parked"
    """The write failed every attempt."""


class _Inconsistent(Exception):
    """The row names this claim but a position it never wrote."""


class HeldConnection:
    """One pool connection kept across a claim's consecutive transactions (see
    :meth:`Committer.commit`): taken at the first, given back with :meth:`let_go` (the
    pool resets it then, as after any use)."""

    def __init__(self, pool: Callable[[], Awaitable[Any]]) -> None:
        self._pool = pool
        self._owner: Any = None
        self._connection: Any = None

    async def get(self) -> Any:
        if self._connection is None:
            self._owner = await self._pool()
            self._connection = await self._owner.acquire()
        return self._connection

    async def let_go(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await self._owner.release(connection)


class Committer:
    """Commits batches for the sink (see the module docstring)."""

    def __init__(self, *, pool: Callable[[], Awaitable[Any]], positions: Positions, write: WriteFunction,
                 hook: StepHook | None, isolation: str, serialization_retries: int, retry_policy: RetryPolicy,
                 stats: SinkStats) -> None:
        self._pool = pool
        self._begin = f"BEGIN ISOLATION LEVEL {isolation.replace('_', ' ').upper()}"
        self._positions = positions
        self._write = write
        self._hook = hook
        self._serialization_retries = serialization_retries
        self._retry_policy = retry_policy
        self._stats = stats

    async def commit(self, claim: Claim, chunk: list[Event], held: HeldConnection
                     ) -> tuple[Outcome, BaseException | None]:
        """Commit ``chunk`` (the claim's next events) in one transaction; the outcome, and
        the error that parked it. The transaction runs on the connection ``held`` holds
        (consecutive batches of one claim skip the pool's acquire and reset); a connection
        that failed is let go and the next attempt takes a fresh one."""
        ctx = claim.context
        attempt = conflicts = 0
        outage = Backoff(0.1, cap=5.0)
        while claim.active:
            if not ctx.is_owned:
                return Outcome.ENDED, None
            try:
                await self._once(claim, chunk, held)
                return Outcome.COMMITTED, None
            except StaleClaim:
                self._stats.stale_rollbacks += 1
                return Outcome.STALE, None
            except CommitOutcomeUnknown as unknown:
                self._stats.unknown_commits += 1
                try:
                    settled = await self._settle(claim, chunk, unknown)
                except _Inconsistent as error:
                    return Outcome.PARKED, error
                if settled is not None:
                    return settled, None
                continue  # rolled back: write the batch again
            except Exception as error:
                self._stats.last_error = error
                state = str(getattr(error, "sqlstate", "") or "")
                if state in SERIALIZATION_STATES and conflicts < self._serialization_retries:
                    conflicts += 1
                    self._stats.serialization_retries += 1
                    await asyncio.sleep(random.uniform(0, 0.01 * conflicts))
                    continue
                if transient(error) and state not in SERIALIZATION_STATES:
                    delay = outage.next()
                    logger.warning("sink: partition %s: the database cannot be used (%s); trying again in %.1f s",
                                   ctx.partition_id, describe(error), delay)
                    await asyncio.sleep(delay)
                    continue
                attempt += 1
                if attempt >= self._retry_policy.max_delivery_attempts:
                    return Outcome.PARKED, self._poison(claim, chunk, error, attempt)
                delay = self._retry_policy.delay(attempt)
                logger.warning("sink: writing %d events of partition %s from sequence number %s failed (attempt %d "
                               "of %d): %s; trying again in %.1f s", len(chunk), ctx.partition_id,
                               chunk[0].sequence_number, attempt, self._retry_policy.max_delivery_attempts,
                               describe(error), delay, exc_info=error)
                await asyncio.sleep(delay)
        return Outcome.ENDED, None

    async def _once(self, claim: Claim, chunk: list[Event], held: HeldConnection) -> None:
        assert claim.advance is not None, "a claim commits only once fenced"
        connection = await held.get()
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            await write_batch(connection, positions=self._positions, begin=self._begin, advance=claim.advance,
                              expected=claim.position, events=chunk, write=self._write, hook=self._hook,
                              context=claim.context)
        except BaseException:
            await held.let_go()  # whatever state it is in, the next attempt starts on a fresh one
            raise
        self._stats.commit_seconds.append(loop.time() - started)

    async def _settle(self, claim: Claim, chunk: list[Event], unknown: CommitOutcomeUnknown) -> Outcome | None:
        """A commit whose answer was lost: what the row says once the transaction is over.
        None: it rolled back (write the batch again)."""
        ctx = claim.context
        logger.warning("sink: partition %s: %s; reading the position once the transaction is over",
                       ctx.partition_id, unknown)
        holder = await settle_commit(await self._pool(), self._positions, claim.key,
                                     still_wanted=lambda: claim.active and ctx.is_owned)
        if holder is None:
            return Outcome.ENDED
        if holder.claim_token != claim.token:
            return Outcome.STALE  # a newer claim fenced the row: it resumes from what it found there
        if holder.position.sequence_number == chunk[-1].sequence_number:
            logger.info("sink: partition %s: the transaction committed", ctx.partition_id)
            return Outcome.COMMITTED
        if holder.position.sequence_number == claim.position:
            logger.info("sink: partition %s: the transaction was rolled back; writing the batch again",
                        ctx.partition_id)
            return None
        raise _Inconsistent(f"partition {ctx.partition_id}: after a lost COMMIT answer the position is "
                            f"{holder.position.sequence_number}, neither {claim.position} nor "
                            f"{chunk[-1].sequence_number}, under this claim's token: another writer moved it")

    @staticmethod
    def _poison(claim: Claim, chunk: list[Event], error: BaseException, attempts: int) -> PoisonEventsError:
        ctx = claim.context
        poisoned = PoisonEventsError(
            f"partition {ctx.partition_id} of {ctx.eventhub_name}/{ctx.consumer_group}: writing {len(chunk)} events "
            f"from sequence number {chunk[0].sequence_number} failed in all {attempts} attempts ({describe(error)})",
            events=list(chunk), attempts=attempts, partition_id=ctx.partition_id)
        poisoned.__cause__ = error
        return poisoned
