"""``--impl floor`` and ``--impl floor-lean``: bare receive loops, the floors of the
``e2e`` benchmark.

Each reads every partition of the hub from its start with azure-eventhub's ``_pyamqp``
receive client and does only what no consumer can avoid: it receives the messages (the
client reads and decodes each frame into a ``Message``), reads each one's sequence
number, and reports them as every side does (:class:`~harness.worker.report.Tally`). No
``EventData``, no ``Event``, no processor, no handler, no checkpoint. Whatever a consumer
does beyond this is its overhead.

The two floors differ in one thing, how a received frame is read:

- ``floor``: azure-eventhub's own way, its transport's ``receive_frame``, which wraps
  every frame's read in ``asyncio.wait_for`` (a task and a timer per frame);
- ``floor-lean``: this SDK's lean receive path's way
  (:func:`eventprocessor.sources.eventhub.frames.read_buffered_frames`, installed on the
  connection's transport as ``EventHubSource``'s lean receiver installs it): a frame
  already in the stream buffer is read and decoded without that task. The decoding is
  the client's own in both. It is the floor of this SDK's receive path: ``EventHubSource``
  does everything it does, and more (an ``Event`` per message, batching, the processor).

How it drives the client, and why it is the fastest way we found:

- each partition's receiver is opened the way the client opens one
  (``EventHubConsumerClient._create_consumer`` and ``EventHubConsumer._open``: the
  connection, the CBS token, the link with ``prefetch`` credit), outside the clock;
- then its AMQP handler is driven directly: ``do_work_async(batch=n)`` reads ``n``
  frames, ``_FRAMES_PER_READ`` or the credit left if less (the hub is full, so none of
  them waits), and the client grants ``prefetch`` again when the credit reaches 0.
  Reads of a few dozen frames took less CPU per event and gave more events/s than reads
  of a whole credit (3,000 frames) on both floors, most of all on the lean one: a whole
  credit's messages, alive at once, are traversed and promoted by Python's cyclic
  garbage collector (with it off, most of the difference went), and a read that finds
  every frame buffered never yields to the other partitions. Fewer than about 32 frames
  and the cost of each call shows;
- a read returns once its connection has been quiet ``_QUIET_SECONDS`` (the client's
  socket timeout, 0.2 s by default): at the end of the hub, a read asks for more frames
  than are left, and with the default each partition's last events were reported 0.2 s
  after they arrived: idle time that the benchmark's window counted, the more of it the
  shorter the window (``EventHubSource`` hands out what it has 50 ms after a batch's
  first event);
- messages are appended by a plain callback (the consumer's own takes an
  ``asyncio.Lock`` per message), and the link's delivery-tag set is emptied after each
  read (the client would keep a tag per message forever).
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from .names import HUB_ENV
from .report import Tally, emit
from .run import Worker

__all__ = ["run"]

_SEQ = b"x-opt-sequence-number"
_FRAMES_PER_READ = 64  # frames per do_work_async call at most (see above)
_QUIET_SECONDS = 0.01  # a read ends when no frame came for this long (see above)


async def _partition(client: Any, consumer_group: str, partition_id: str, prefetch: int, tally: Tally,
                     stop: asyncio.Event, lean: bool) -> None:
    async def unused(*_args: Any) -> None:
        return None

    consumer = client._create_consumer(consumer_group, partition_id, "-1", unused, prefetch=prefetch)
    await consumer._open()
    handler = consumer._handler
    if lean:
        from eventprocessor.sources.eventhub.frames import read_buffered_frames

        if not read_buffered_frames(handler._connection._transport):
            raise RuntimeError("--impl floor-lean: the installed azure-eventhub's transport lacks what this SDK's "
                               "frame reader (read_buffered_frames) needs")
    handler._socket_timeout = _QUIET_SECONDS
    received: list[Any] = []

    async def append(message: Any) -> None:
        received.append(message)

    handler._message_received_callback = append
    link = handler._link
    tags = link._received_delivery_tags
    try:
        while not stop.is_set():
            credit = link.current_link_credit
            frames = min(credit if credit > 0 else prefetch, _FRAMES_PER_READ)
            if await handler.do_work_async(batch=frames) is False:
                raise RuntimeError(f"partition {partition_id}: the client closed the receiver")
            tags.clear()
            if received:
                messages = received[:]
                received.clear()
                tally.delivered(partition_id, [m.message_annotations[_SEQ] for m in messages])
    finally:
        await consumer.close()


async def run(worker: Worker) -> None:
    """Read every partition until ``worker.stop``; a receiver that fails ends the run with
    its error (the other receivers are stopped first)."""
    from azure.eventhub.aio import EventHubConsumerClient

    args = worker.args
    client = EventHubConsumerClient.from_connection_string(os.environ[HUB_ENV], consumer_group=args.consumer_group,
                                                           eventhub_name=args.hub)
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": args.impl, "eventhub": args.hub})
    await worker.set_up()
    lean = args.impl == "floor-lean"
    async with client:
        ids = await client.get_partition_ids()
        tasks = [asyncio.create_task(_partition(client, args.consumer_group, pid, args.prefetch, worker.tally,
                                                worker.stop, lean)) for pid in ids]
        waiter = asyncio.create_task(worker.stop.wait())
        await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
        worker.stop.set()
        for task in tasks:
            task.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        waiter.cancel()
    failures = [r for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    if failures:
        raise failures[0]
