"""One batch of one partition, one transaction: the user's rows and the partition's
position committed together, or neither.

:func:`write_batch` sends ``BEGIN``, runs ``write(events, connection)``, then sends the
position's conditional ``UPDATE`` and ``COMMIT`` as one message
(:meth:`~eventprocessor.postgres.positions.Positions.advance_and_commit`). A claim that no
longer holds the row gets :class:`StaleClaim` (nothing committed). A connection that breaks
while that last message is out raises :class:`CommitOutcomeUnknown`;
:func:`settle_commit` then reads the row once the transaction is over. Anything else that
fails rolls the transaction back: nothing of it is committed, so the batch can be written
again.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ..errors import ConfigurationError
from ..events import Event
from ..partition import PartitionContext
from ..stores._postgres import describe, outcome_unknown, transient
from .positions import NOT_HELD, AdvanceStatement, Holder, Key, Position, Positions

__all__ = ["StaleClaim", "WriteAborted", "CommitOutcomeUnknown", "write_batch", "settle_commit", "StepHook",
           "WriteFunction", "run_step"]

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


class WriteAborted(Exception):
    """``COMMIT`` answered ``ROLLBACK``: a statement of the transaction had failed (and
    ``write`` caught the error). Nothing of it was committed."""


class CommitOutcomeUnknown(Exception):
    """``COMMIT`` was sent, then the connection broke: the transaction may or may not have
    committed."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"the answer to COMMIT was lost ({describe(cause)})")


async def run_step(hook: StepHook | None, step: str, context: PartitionContext) -> None:
    if hook is not None:
        result = hook(step, context)
        if inspect.isawaitable(result):
            await result


async def _roll_back(connection: Any) -> None:
    try:
        if connection.is_in_transaction():
            await connection.execute("ROLLBACK")
    except Exception as error:  # a broken connection: the server rolls back when it sees it gone
        logger.debug("rollback failed (%s); the server rolls the transaction back by itself", describe(error))


async def _write(write: WriteFunction, events: Sequence[Event], connection: Any) -> None:
    try:
        result = write(list(events), connection)
        if not inspect.isawaitable(result):
            raise ConfigurationError(f"the sink's write function returned {type(result).__name__}, not an "
                                     "awaitable: define it as `async def write(events, connection)`")
        await result
    except Exception as error:
        if type(error).__name__ == "InterfaceError" and "manually started transaction" in str(error):
            raise ConfigurationError("the sink's write function opened a transaction (connection.transaction()) "
                                     "inside the one the sink opened: write with the connection as it is (use "
                                     "SAVEPOINT statements for a partial rollback)") from error
        raise


async def write_batch(connection: Any, *, positions: Positions, begin: str, advance: AdvanceStatement,
                      expected: int, events: Sequence[Event], write: WriteFunction, hook: StepHook | None,
                      context: PartitionContext) -> None:
    """Write ``events`` (one partition's, in order) and move the partition's position from
    ``expected`` to their last, in one transaction.

    The position's ``UPDATE`` is conditional on the row's claim token and position, and
    goes out with ``COMMIT`` in one message: the server runs both without waiting for the
    client, so a claim that a newer one fenced commits nothing (:class:`StaleClaim`), and no
    client, frozen or cut off, ever holds the row between them. A fence that comes while
    the server runs them waits the few microseconds it takes."""
    last = events[-1]
    await run_step(hook, "before_begin", context)
    await connection.execute(begin)
    try:
        await run_step(hook, "after_begin", context)
        await _write(write, events, connection)
        await run_step(hook, "after_write", context)
    except BaseException:
        await _roll_back(connection)
        raise
    try:
        status = await positions.advance_and_commit(connection, advance, expected=expected,
                                                    to=Position(last.sequence_number, last.offset))
    except Exception as error:
        if outcome_unknown(error):
            raise CommitOutcomeUnknown(error) from error
        await _roll_back(connection)  # the server answered: nothing of the transaction was committed
        if getattr(error, "sqlstate", None) == NOT_HELD:
            raise StaleClaim(f"the position of partition {context.partition_id} is no longer this claim's") from None
        if getattr(error, "sqlstate", None) == "25P02":  # in_failed_sql_transaction
            raise WriteAborted("a statement of the batch had failed and its error was caught inside write; "
                               "nothing of the batch was committed") from error
        raise
    if status != "COMMIT":
        raise WriteAborted(f"COMMIT answered {status!r}: a statement of the batch had failed and its error was "
                           "caught inside write; nothing of the batch was committed")


async def settle_commit(pool: Any, positions: Positions, key: Key, *,
                        still_wanted: Callable[[], bool]) -> Holder | None:
    """The partition's row once the transaction whose answer was lost is over (``FOR
    UPDATE`` waits for a transaction that is moving the row to commit or roll back; one that
    never got its last message rolls back when the server sees the connection gone, at the
    latest after ``idle_in_transaction_session_timeout``, and never moved the row).
    Retries while the server cannot be reached; None when ``still_wanted()`` turns False
    first."""
    delay = 0.05
    while still_wanted():
        try:
            async with pool.acquire() as connection:
                return await positions.settle(connection, key, timeout=5.0)
        except Exception as error:
            if not transient(error):
                raise
            logger.info("reading the position of partition %s after a lost COMMIT answer failed (%s); trying "
                        "again in %.1f s", key[3], describe(error), delay)
        await asyncio.sleep(delay)
        delay = min(delay * 2, 2.0)
    return None
