"""What azure-eventhub's own processor needs of an ``EventHubConsumerClient``, without a hub.

Its ``OwnershipManager`` reads ``_address.hostname``, ``eventhub_name`` and awaits
``get_partition_ids()``; its ``EventProcessor`` also calls ``_create_consumer`` for each
partition it claims. :class:`StandInClient` gives exactly those: the partition ids a
callable returns, and consumers that receive nothing (:class:`IdleConsumer`), so that the
official balancer and dispatch run as they do in production while only ownership is
measured (the convergence simulator, the worker program's ``--source none``).

Example::

    client = StandInClient("bench.servicebus.windows.net", "hub", lambda: ["0", "1", "2"])
    manager = OwnershipManager(client, "$default", "owner-1", store, 60.0, strategy, None)
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

__all__ = ["IdleConsumer", "StandInClient"]


class IdleConsumer:
    """What the official processor's per-partition task awaits instead of an AMQP link."""

    async def receive(self, *_args: Any) -> None:
        await asyncio.Event().wait()  # until cancelled

    async def close(self) -> None:
        pass


class StandInClient:
    """The parts of ``EventHubConsumerClient`` the official ``OwnershipManager`` and
    ``EventProcessor`` use: its namespace, its hub, its partition ids, idle consumers."""

    def __init__(self, namespace: str, eventhub_name: str, partition_ids: Callable[[], Iterable[str]]) -> None:
        self._address = SimpleNamespace(hostname=namespace)
        self.eventhub_name = eventhub_name
        self._partition_ids = partition_ids

    async def get_partition_ids(self) -> list[str]:
        return list(self._partition_ids())

    def _create_consumer(self, *_args: Any, **_kwargs: Any) -> IdleConsumer:
        return IdleConsumer()
