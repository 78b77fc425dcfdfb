"""One batch of one partition, one transaction: the user's rows and the partition's
position committed together, or neither.

:func:`write_batch` runs ``BEGIN``; ``write(events, connection)``; the conditional
``UPDATE`` of the position (:meth:`~eventprocessor.postgres.positions.Positions.advance`);
``COMMIT``. It raises :class:`StaleClaim` (rolled back) when the row belongs to another
claim, and :class:`CommitOutcomeUnknown` when the connection broke after ``COMMIT`` was
sent; :func:`resolve_commit` then asks the server what became of the transaction.
Anything else that fails before ``COMMIT`` rolls the transaction back: nothing of it is
committed, so the batch can be written again.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..events import Event
from ..partition import PartitionContext
from ._connection import describe, outcome_unknown, transient
from .positions import Key, Position, Positions

__all__ = ["StaleClaim", "CommitOutcomeUnknown", "write_batch", "resolve_commit", "StepHook", "WriteFunction",
           "run_step"]

logger = logging.getLogger(__name__)

WriteFunction = Callable[[list[Event], Any], Awaitable[Any]]
"""``async def write(events, connection)``: writes one partition's events with the asyncpg
connection it is given, inside the sink's transaction (never commits or rolls back itself)."""

StepHook = Callable[[str, PartitionContext], Any]
"""Called with the name of each step a batch reaches and the claim's context; may return
an awaitable, which is awaited there (fault-injection tests, tracing)."""


class StaleClaim(Exception):
    """The partition's row was fenced by another claim (or moved by another writer):
    the transaction was rolled back and nothing of it was committed."""


class CommitOutcomeUnknown(Exception):
    """``COMMIT`` was sent, then the connection broke: the transaction may or may not have
    committed. ``transaction_id`` is its id, for ``pg_xact_status``."""

    def __init__(self, transaction_id: str, cause: BaseException) -> None:
        super().__init__(f"the answer to COMMIT of transaction {transaction_id} was lost ({describe(cause)})")
        self.transaction_id = transaction_id


async def run_step(hook: StepHook | None, step: str, context: PartitionContext) -> None:
    if hook is not None:
        result = hook(step, context)
        if inspect.isawaitable(result):
            await result


async def _roll_back(transaction: Any) -> None:
    try:
        await transaction.rollback()
    except Exception as error:  # a broken connection: the server rolls back when it sees it gone
        logger.debug("rollback failed (%s); the server rolls the transaction back by itself", describe(error))


async def write_batch(connection: Any, *, positions: Positions, key: Key, claim_token: str, expected: int,
                      events: Sequence[Event], write: WriteFunction, isolation: str, hook: StepHook | None,
                      context: PartitionContext, timeout: float | None) -> str:
    """Write ``events`` (one partition's, in order) and advance the partition's position
    from ``expected`` to their last event, in one transaction; the transaction's id.

    The position's ``UPDATE`` is conditional on the row's claim token and position, so a
    claim that a newer one fenced commits nothing (:class:`StaleClaim`). The ``UPDATE``
    takes the row's lock, so a fence that comes while it is held waits for ``COMMIT``
    (and then resumes after this batch) or for the rollback."""
    last = events[-1]
    transaction = connection.transaction(isolation=isolation)
    await transaction.start()
    try:
        await run_step(hook, "before_write", context)
        result = write(list(events), connection)
        if not inspect.isawaitable(result):
            raise TypeError(f"the sink's write function returned {type(result).__name__}, not an awaitable: "
                            "define it as `async def write(events, connection)`")
        await result
        await run_step(hook, "after_write", context)
        transaction_id = await positions.advance(connection, key, claim_token=claim_token, expected=expected,
                                                 to=Position(last.sequence_number, last.offset), timeout=timeout)
        if transaction_id is None:
            raise StaleClaim(f"the position of partition {key[3]} no longer belongs to this claim")
        await run_step(hook, "after_advance", context)
    except BaseException:
        await _roll_back(transaction)
        raise
    try:
        await transaction.commit()
    except Exception as error:
        if outcome_unknown(error):
            raise CommitOutcomeUnknown(transaction_id, error) from error
        raise  # the server answered: the transaction did not commit
    return transaction_id


async def resolve_commit(pool: Any, positions: Positions, transaction_id: str, *,
                         still_wanted: Callable[[], bool]) -> bool | None:
    """Whether the transaction committed, asked of the server on another connection:
    ``pg_xact_status`` says committed or aborted once the transaction is over (a server
    that lost the client rolls back within its ``idle_in_transaction_session_timeout``).
    Retries while the server cannot be reached; None when ``still_wanted()`` turns False
    first, or when the server no longer knows the transaction."""
    delay = 0.05
    while still_wanted():
        try:
            async with pool.acquire() as connection:
                status = await positions.status(connection, transaction_id)
        except Exception as error:
            if not transient(error):
                raise
            logger.info("asking the server about transaction %s failed (%s); trying again in %.1f s",
                        transaction_id, describe(error), delay)
        else:
            if status == "committed":
                return True
            if status == "aborted":
                return False
            if status is None:
                return None
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    return None
