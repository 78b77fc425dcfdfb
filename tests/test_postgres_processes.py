"""The PostgreSQL sink and store with real OS processes: SIGKILL at every step of the
sink's transaction, a zombie (SIGSTOP past its lease, then SIGCONT), and a group on
PostgreSQL alone that balances, hands over under load and fails over. Each is counted
from the table the workers wrote: every event exactly once.

The workers (``harness/postgres_worker.py``) read the same deterministic stream, keep
ownership and checkpoints in a ``PostgresCheckpointStore`` and write with a
``PostgresSink`` (or, for the controls, with the insert-then-checkpoint handler a user
would write without it). Longer runs over many seeds: ``python -m harness.postgres_soak``.
"""
from __future__ import annotations

import pytest

from harness.postgres_processes import group, kill_chain, zombie
from harness.postgres_worker import STEPS

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


async def test_sigkill_at_every_step_of_the_transaction_leaves_every_event_exactly_once(postgres, tmp_path):
    """A handler that inserts a batch and then checkpoints writes the batch again when the
    process dies between the two. The sink, killed before its write, after it, after the
    position's UPDATE, after COMMIT and after the checkpoint, one process after another,
    leaves every event in the table once."""
    outcome = await kill_chain(postgres.dsn, str(tmp_path), steps=list(STEPS), seed=1)
    assert outcome.exactly_once() is None, outcome.exactly_once()


async def test_the_insert_then_checkpoint_handler_killed_between_the_two_duplicates(postgres, tmp_path):
    """The control: the kill point is real. The handler a user writes without the sink,
    killed after its insert and before its checkpoint, leaves its batch twice."""
    outcome = await kill_chain(postgres.dsn, str(tmp_path), steps=["after_write"], mode="naive", seed=1)
    assert outcome.missing == 0
    assert outcome.duplicates > 0, "the insert-then-checkpoint handler was expected to duplicate its batch"


@pytest.mark.parametrize("step", ["before_begin", "after_write"])
async def test_a_zombie_resumed_after_its_lease_commits_nothing(postgres, tmp_path, step):
    """Frozen (SIGSTOP) before its transaction, or after its write before COMMIT, past
    its lease (its other partitions frozen wherever they were, in the middle of a COPY
    too); the successor takes them all and writes everything; resumed (SIGCONT), the
    zombie's transactions are refused and rolled back: no event twice."""
    outcome = await zombie(postgres.dsn, str(tmp_path), step=step, idle_timeout=3.0)
    assert outcome.exactly_once() is None, outcome.exactly_once()


async def test_the_insert_then_checkpoint_handler_resumed_after_its_lease_duplicates(postgres, tmp_path):
    """The control: the zombie is real. The handler a user writes without the sink, frozen
    before its insert past its lease and resumed after the new owner wrote the batch,
    inserts it again (its checkpoint is refused, its rows are not)."""
    outcome = await zombie(postgres.dsn, str(tmp_path), step="before_write", mode="naive", idle_timeout=3.0)
    assert outcome.missing == 0
    assert outcome.duplicates > 0, "the resumed insert-then-checkpoint handler was expected to duplicate its batch"


async def test_a_group_on_postgresql_alone_balances_hands_over_and_fails_over_exactly_once(postgres, tmp_path):
    """No Azure storage: ownership, checkpoints and rows in one PostgreSQL. Two processes
    balance 6/6, a third takes its share by handoff while events flow (4/4/4), one is
    SIGKILLed and the two others take its partitions; every event is in the table once."""
    outcome = await group(postgres.dsn, str(tmp_path))
    assert outcome.exactly_once() is None, outcome.exactly_once()
    # As the Blob group: the survivors kept what they owned, and on the server's clock no
    # partition of the killed worker was taken before its lease ran out.
    assert outcome.notes["survivors_kept_their_partitions"] == 1.0, outcome.notes
    assert outcome.notes["earliest_takeover_lease_age_s"] >= outcome.notes["expiry_s"], outcome.notes
    print(f"\npostgres group: {outcome.notes}")
