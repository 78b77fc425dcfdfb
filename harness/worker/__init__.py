"""The worker program: one consumer process for multi-process tests and benchmarks, this
SDK's processor, azure-eventhub's, or a bare receive loop (two floors), reporting what it
does as JSON lines.

Run it as ``python -m harness.worker``; start and read it from a parent with
:func:`spawn_worker` (:mod:`harness.worker.process`, the parent's side).

What runs:

- ``--impl ours``: an ``EventProcessor`` (:mod:`~harness.worker.ours`) with
  ``EventHubSource`` and this SDK's ``BlobCheckpointStore``;
- ``--impl official``: azure-eventhub's ``EventHubConsumerClient.receive_batch`` with
  ``azure-eventhub-checkpointstoreblob-aio``'s ``BlobCheckpointStore``
  (:mod:`~harness.worker.official`);
- ``--impl floor``: a bare receive loop on azure-eventhub's own AMQP client, reading
  frames its own way: the floor of azure-eventhub's receive path in the ``e2e``
  benchmark (:mod:`~harness.worker.floor`);
- ``--impl floor-lean``: the same loop reading frames the way this SDK's lean receive
  path reads them (``eventprocessor.sources.eventhub.frames``): the floor of this SDK's
  receive path, the one the ``e2e`` target is judged against.

Ours and the official read the same hub and checkpoint every ``--checkpoint-every``
batches (or, with ``--checkpoint-events``, once that many events of a partition were
delivered since its last checkpoint), with the same batch size and prefetch.
``--checkpoint-on-close`` (official only) also checkpoints a partition's last delivered
event in ``on_partition_close``, as a careful user of the official client would (this
SDK's processor does that by itself: ``PartitionProcessor.checkpoint_on_release``).

``--source memory`` (ours only) reads a ``InMemoryEventSource`` in this process instead,
with ``InMemoryCheckpointStore`` (``--store`` chooses otherwise), fed by a producer task
that keeps ``--backlog`` events ahead of the handler on every partition until
``--produce`` events were sent; the source retains ``--retention`` events per partition.
``--source none`` has partitions and no events, for measuring ownership alone (the
``scale`` benchmark): ours reads an empty ``InMemoryEventSource``; the official side runs
azure-eventhub's own ``EventProcessor`` class over a stand-in client
(:class:`harness.standin_client.StandInClient`) whose consumers receive nothing.

``--stateful`` (ours only): the handler counts events per key in ``context.state``
(``EventProcessor(..., stateful=True)``; the key is the event's body as text), so the
counts move with the partition and are committed with each checkpoint; ``--standbys N``
keeps N warm replicas of every partition (``num_standbys``); ``--state-bytes B`` pads each
partition's state to about B bytes at its first claim (keys ``~pad/NNNNNN`` of
1,000-character strings: a large state for benchmarks). ``--naive`` (ours only, not with
``--stateful``) counts the same way in a plain dict, as a user would by hand without the
feature: one JSON blob per partition in the checkpoint container, read in ``initialize``
and written before each checkpoint and in ``close``.

``--cpu-per-event SECONDS`` makes the handler CPU-bound: it spends that much of this
process's CPU time on every event (a busy loop on the thread's CPU clock, so the cost is
the same however busy the machine is), in a thread of its own, off the event loop, as a
competent user runs CPU-bound work (both sides). ``--slow-factor F`` multiplies that cost
by F when the process gets SIGUSR1 (a processor slowed down: a heavier handler, a noisy
neighbour). ``--balance-by load`` (ours only) balances by measured load
(``EventProcessor(load_policy=LoadPolicy(...))``) with the knobs the ``--load-*`` options
give.

Connection strings come from the environment (:data:`HUB_ENV` for the hub,
:data:`STORAGE_ENV` for storage) so that they never show in a process listing. It prints
JSON lines on stdout:

- ``{"event": "started", ...}`` once, with the namespace and the hub;
- ``{"event": "batch", "p": partition, "s": [first, last], "t": unix time}`` for each
  delivered batch (``--report events``), written and flushed *before* its checkpoint,
  so a SIGKILL never hides a delivery;
- ``{"event": "owned", "owned": [...], "ticks": n}`` when the set of dispatched partitions
  changes (ours; also every ``--owned-every`` seconds when given);
- ``{"event": "ownership", "p": partition, "reason": ..., "epoch": ...}`` for each ownership
  change the processor logs (ours, unless ``--no-ownership-lines``: claimed, expired,
  stolen, adopted, released, handed_off, ...);
- ``{"event": "stats", "events": n, "cpu": seconds, "t": unix time, "rss": bytes}`` every
  ``--stats-interval`` seconds (four times a second by default); ``rss`` is this process's
  resident set from ``/proc/self/statm`` (null where there is no ``/proc``);
- ``{"event": "state", "t": ..., "cpu": ..., "requests": ..., "count": ..., "owned": [...], ...}``
  every ``--state-every`` seconds: CPU seconds and HTTP requests to the store since 'go',
  the partitions dispatched (``owned`` only when that set changed), the event loop's
  longest stall (``loop_lag``), ticks, overruns, ``overrun_warnings`` (WARNING lines about
  ticks longer than the interval; the official logs none), ``max_tick``, renewals,
  ``failed_renewals`` and ``missed_renewals`` by one rule for both SDKs
  (:class:`~harness.worker.report.RenewalWatch`), claims, losses; for ours also
  ``heartbeats`` (accepted member records that keep every lease), ``self_fenced``, its
  store calls and time-outs and its backoff;
- ``{"event": "load", "u": utilisation, "partitions": n, "t": unix time}`` (ours with
  ``--balance-by load``) whenever the processor samples the load it publishes;
- ``{"event": "slowed", "cpu_per_event": seconds, "t": unix time}`` when SIGUSR1 slowed it;
- ``{"event": "restored", "p": partition, "seq": ..., "counts": {...}, "warm": ..., "entries": n,
  "bytes": n, "keys": n, "t": ...}`` (``--stateful``, ``--naive``) when a claim starts, before
  its first batch: the checkpoint's sequence number it resumes from (-1: none), the
  per-key counts it restored (padding left out), and how the state was loaded (warm
  replica or not, state entries and bytes read; ``--naive``: the blob, ``ms`` to read it);
- ``{"event": "checkpoint", "p": partition, "seq": ..., "ms": ..., "t": ...}``
  (``--stateful``, ``--naive``) after each checkpoint the handler wrote (``ms``: the
  state and the checkpoint together);
- ``{"event": "first", "cpu": ..., "t": ...}`` at the first delivery and ``{"event": "done", ...}``
  when ``--expect`` events have been delivered (process CPU seconds and wall time);
- ``{"event": "ready"}`` with ``--wait-for-go``, once everything is imported and set up:
  it starts when a line arrives on stdin (so that the processes of a group start
  together, their imports not measured) and stops when stdin closes;
- ``{"event": "stopped"}`` at the end.

SIGTERM stops it gracefully; SIGUSR1 applies ``--slow-factor``.

Example (a parent's side)::

    worker = await spawn_worker("p0", hub="hub", container=None, hub_connection_string=None,
                                storage_connection_string=None, log_dir="/tmp",
                                extra=["--source", "memory", "--produce", "1000"])
    ...
    await worker.stop()   # SIGTERM: a graceful stop
"""
from .names import HUB_ENV, STANDIN_NAMESPACE, STORAGE_ENV
from .process import WorkerHandle, create_container, spawn_worker

__all__ = ["HUB_ENV", "STANDIN_NAMESPACE", "STORAGE_ENV", "WorkerHandle", "create_container", "spawn_worker"]
