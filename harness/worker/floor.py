"""``--impl floor``: a bare receive loop on azure-eventhub's own AMQP client, the floor of
the ``e2e`` benchmark.

It reads every partition of the hub from its start with azure-eventhub's ``_pyamqp``
receive client and does only what no consumer can avoid: it receives the messages (the
client reads and decodes each frame into a ``Message``), reads each one's sequence
number, and reports them as every side does (:class:`~harness.worker.report.Tally`). No
``EventData``, no ``Event``, no processor, no handler, no checkpoint. Whatever a consumer
does beyond this is its overhead.

How it drives the client, and why it is the fastest way we found:

- each partition's receiver is opened the way the client opens one
  (``EventHubConsumerClient._create_consumer`` and ``EventHubConsumer._open``: the
  connection, the CBS token, the link with ``prefetch`` credit), outside the clock;
- then its AMQP handler is driven directly: ``do_work_async(batch=credit)`` reads as
  many frames as the link has credit for (the hub is full, so none of them waits), and
  the client grants ``prefetch`` again when the credit reaches 0;
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


async def _partition(client: Any, consumer_group: str, partition_id: str, prefetch: int, tally: Tally,
                     stop: asyncio.Event) -> None:
    async def unused(*_args: Any) -> None:
        return None

    consumer = client._create_consumer(consumer_group, partition_id, "-1", unused, prefetch=prefetch)
    await consumer._open()
    handler = consumer._handler
    received: list[Any] = []

    async def append(message: Any) -> None:
        received.append(message)

    handler._message_received_callback = append
    link = handler._link
    tags = link._received_delivery_tags
    try:
        while not stop.is_set():
            credit = link.current_link_credit
            if await handler.do_work_async(batch=credit if credit > 0 else prefetch) is False:
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
    emit({"event": "started", "owner": args.owner_id, "pid": os.getpid(), "impl": "floor", "eventhub": args.hub})
    await worker.set_up()
    async with client:
        ids = await client.get_partition_ids()
        tasks = [asyncio.create_task(_partition(client, args.consumer_group, pid, args.prefetch, worker.tally,
                                                worker.stop)) for pid in ids]
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
