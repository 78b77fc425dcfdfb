"""What a worker's handler does besides reporting: spend CPU per event (``--cpu-per-event``,
slowed down by SIGUSR1), checkpoint at a cadence, and pad a partition's state to a size."""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import time
from typing import Any

from .report import emit

__all__ = ["PAD_PREFIX", "Cadence", "CpuCost", "counts", "pad"]


class CpuCost:
    """What each event costs the handler in CPU time; SIGUSR1 multiplies it (a slowdown)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.per_event = args.cpu_per_event
        self.factor = args.slow_factor
        # Starts its thread at the first use only.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cpu-cost")

    def slow_down(self) -> None:
        self.per_event *= self.factor
        emit({"event": "slowed", "cpu_per_event": self.per_event, "t": time.time()})

    def spend(self, events: int) -> None:
        """Busy-loop until this thread has used ``events`` times the cost in CPU time."""
        if self.per_event <= 0 or events <= 0:
            return
        end = time.thread_time() + self.per_event * events
        while time.thread_time() < end:
            pass

    async def spend_off_loop(self, events: int) -> None:
        """The handler's CPU work, off the event loop, as a competent user runs CPU-bound
        work (``asyncio.to_thread``): on the loop it holds the process's lease renewals
        and receivers behind it. Recorded by benchmarks.load at 5.5 ms per event: the
        processes that ran it on the loop gave up 18 and 28 leases (self-fenced) that
        their renewals reached too late. One thread per process: the handlers of its
        partitions take turns, as they do on the loop."""
        if self.per_event <= 0 or events <= 0:
            return
        await asyncio.get_running_loop().run_in_executor(self._thread, self.spend, events)


class Cadence:
    """When a handler checkpoints: every N batches, or once N events of the partition
    were delivered since its last checkpoint (as most users write it)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.events = max(0, args.checkpoint_events)
        self.batches = max(1, args.checkpoint_every)
        self._since: dict[str, list[int]] = {}  # partition -> [batches, events] since its last checkpoint

    def due(self, partition_id: str, delivered: int) -> bool:
        since = self._since.setdefault(partition_id, [0, 0])
        since[0] += 1
        since[1] += delivered
        if (since[1] >= self.events) if self.events else (since[0] >= self.batches):
            since[0] = since[1] = 0
            return True
        return False


PAD_PREFIX = "~pad/"
"""Keys that pad a partition's state to ``--state-bytes`` (left out of the reported counts)."""
_PAD_VALUE = "x" * 1000
_PAD_ENTRY_BYTES = len(json.dumps({f"{PAD_PREFIX}000000": _PAD_VALUE}, separators=(",", ":")))  # as a snapshot holds it


def pad(state: Any, target_bytes: int) -> None:
    """Pad ``state`` to about ``target_bytes`` of JSON, once (a state padded already stays)."""
    if target_bytes <= 0 or f"{PAD_PREFIX}000000" in state:
        return
    for index in range(max(1, target_bytes // _PAD_ENTRY_BYTES)):
        state[f"{PAD_PREFIX}{index:06d}"] = _PAD_VALUE


def counts(state: Any) -> dict[str, Any]:
    return {key: value for key, value in state.items() if not key.startswith(PAD_PREFIX)}
