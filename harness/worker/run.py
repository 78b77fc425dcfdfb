"""One run of the worker program, as its sides (``ours``, ``official``, ``floor``,
``floor-lean``) see it: the options, the tally of deliveries, when to start and stop,
and what its state lines read (:class:`Probe`)."""
from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .handlers import CpuCost
from .options import policy_options
from .report import Tally, emit

__all__ = ["Probe", "Worker"]


@dataclass
class Probe:
    """What a ``state`` line reports of a side: the partitions it dispatches, its counters."""

    owned: Callable[[], set[str]] = set
    counters: Callable[[], dict[str, Any]] = dict


@dataclass
class Worker:
    """The worker program's run: its options, what it delivered, when to go and stop."""

    args: argparse.Namespace
    tally: Tally
    cost: CpuCost
    transport: Any = None  # counts the store's HTTP requests (--state-every with --store blob)
    probe: Probe = field(default_factory=Probe)
    go: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def policy(self) -> dict[str, Any]:
        return policy_options(self.args)

    async def set_up(self) -> bool:
        """A side calls this once it is set up: with ``--wait-for-go`` it says ``ready`` and
        waits for the parent's line. False: stop without starting (the parent went away)."""
        if self.args.wait_for_go:
            emit({"event": "ready", "owner": self.args.owner_id, "pid": os.getpid()})
        await self.go.wait()
        return not self.stop.is_set()
