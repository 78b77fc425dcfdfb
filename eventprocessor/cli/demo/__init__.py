"""The main job: several processors and a producer in one process, shown live.

``eventprocessor demo`` runs, over an InMemoryEventSource and the in-memory store (or Blob or
Table storage on a local Azurite with ``--store blob`` or ``--store table``, and the real AMQP path with
``--source emulator``: ``EventHubSource`` on the local Event Hubs emulator, fed by the
official producer): convergence, a graceful scale-in, a crash and its failover, then a
summary that counts lost and duplicate events.

The modules, by concern: :mod:`.run` (the phases and their counts), :mod:`.store` (the
checkpoint store, and Azurite when it needs one), :mod:`.feed` (the emulator and the
official producer), :mod:`.display` (the live table, the log lines, the summary).
"""
from .display import summary_table
from .run import DemoConfig, DemoResult, check_prerequisites, default_timing, run_demo

__all__ = ["DemoConfig", "DemoResult", "check_prerequisites", "default_timing", "run_demo", "summary_table"]
