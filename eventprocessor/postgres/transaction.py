"""One batch of one partition, one transaction: the partition's position and the user's
rows committed together, or neither.

:func:`write_batch` sends ``BEGIN; UPDATE <position>`` as one message (the claim takes
the row, or learns it cannot: :class:`StaleClaim`), then ``write(events, connection)``,
then ``COMMIT``. A connection that breaks after ``COMMIT`` was sent raises
:class:`CommitOutcomeUnknown`; :func:`settle_commit` then reads the row once the
transaction is over. Anything else that fails before ``COMMIT`` rolls the transaction
back: nothing of it is committed, so the batch can be written again.
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
from ._connection import describe, outcome_unknown, transient
from .positions import BeginStatement, Holder, Key, Position, Positions

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


async def write_batch(connection: Any, *, positions: Positions, begin: BeginStatement, expected: int,
                      events: Sequence[Event], write: WriteFunction, hook: StepHook | None,
                      context: PartitionContext) -> None:
    """Move the partition's position from ``expected`` to the last of ``events`` (one
    partition's, in order) and write them, in one transaction.

    The position's ``UPDATE`` comes first, in the ``BEGIN`` message: it is conditional on
    the row's claim token and position, so a claim that a newer one fenced takes nothing
    and writes nothing (:class:`StaleClaim`); and it holds the row's lock to the end, so a
    fence that comes meanwhile waits for ``COMMIT`` (and resumes after this batch) or for
    the rollback."""
    last = events[-1]
    await run_step(hook, "before_begin", context)
    try:
        if not await positions.begin(connection, begin, expected=expected,
                                     to=Position(last.sequence_number, last.offset)):
            raise StaleClaim(f"the position of partition {context.partition_id} no longer belongs to this claim")
        await run_step(hook, "after_advance", context)
        await _write(write, events, connection)
        await run_step(hook, "after_write", context)
    except BaseException:
        await _roll_back(connection)
        raise
    try:
        status = await connection.execute("COMMIT")
    except Exception as error:
        if outcome_unknown(error):
            raise CommitOutcomeUnknown(error) from error
        raise  # the server answered: the transaction did not commit
    if status != "COMMIT":
        raise WriteAborted(f"COMMIT answered {status!r}: a statement of the batch had failed and its error was "
                           "caught inside write; nothing of the batch was committed")


async def settle_commit(pool: Any, positions: Positions, key: Key, *,
                        still_wanted: Callable[[], bool]) -> Holder | None:
    """The partition's row once the transaction whose answer was lost is over (it took
    the row's lock first, so ``FOR UPDATE`` waits for it to commit or roll back; a server
    that lost the client rolls back within its ``idle_in_transaction_session_timeout``).
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
