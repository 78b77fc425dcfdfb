"""``eventprocessor status``: what a consumer group looks like right now, read from its store.

For each partition: its owner, epoch, lease age (on the store's clock), a pending handoff,
the checkpoint (sequence number, offset, time) and, when the event hub is reachable, the
newest event and the lag. For each member: what it owns, its heartbeat. A summary line:
owned, unowned, expired, imbalance, lag.

Three layers, so that each can be tested on its own (a module each):

* :func:`build_status` is pure: listings in, a :class:`GroupStatus` out. Expiry is judged
  as the processors judge it, ``server_time - last_modified > expiration``, both from the
  store.
* :func:`read_status` does the I/O: it reads the store (and the event hub, if given)
  concurrently, every call bounded by ``timeout``. A store that cannot be read is an
  error; an event hub that cannot be read only makes the lag unknown, with the reason.
* :func:`render` and :meth:`GroupStatus.to_json` show it; :func:`run_status` is the
  command (store and source from the options, ``--watch``, ``--json``).

Nothing here writes to the store, and no secret (key, SAS token, connection string)
is ever printed: stores and sources are shown by their ``repr``, which omits them.
"""
from .command import (
    EVENTHUB_CONNECTION_STRING_ENV,
    STORE_ACCOUNT_KEY_ENV,
    STORE_CONNECTION_STRING_ENV,
    STORE_SAS_TOKEN_ENV,
    StatusOptions,
    run_status,
)
from .model import GroupStatus, MemberStatus, PartitionStatus, StatusSummary, build_status
from .reading import read_status
from .rendering import render

__all__ = ["GroupStatus", "MemberStatus", "PartitionStatus", "StatusOptions", "StatusSummary", "build_status",
           "read_status", "render", "run_status", "STORE_CONNECTION_STRING_ENV", "STORE_ACCOUNT_KEY_ENV",
           "STORE_SAS_TOKEN_ENV", "EVENTHUB_CONNECTION_STRING_ENV"]
