"""The consumer process of the end-to-end, soak and moves benchmarks.

The program and its parent's side live in the public testing package, which the tests
use too: :mod:`eventprocessor.testing.worker` (``python -m eventprocessor.testing.worker``,
the same options and JSON lines as ever) and :mod:`eventprocessor.testing.processes`
(:func:`spawn_worker`, :class:`WorkerHandle`). This module keeps the benchmarks' old
import path and command working: ``python -m benchmarks.e2e_worker ...`` runs the same
program.
"""
from __future__ import annotations

import sys

from eventprocessor.testing.processes import WorkerHandle, create_container, spawn_worker
from eventprocessor.testing.worker import HUB_ENV, STORAGE_ENV, emit, main, resident_bytes

__all__ = ["HUB_ENV", "STORAGE_ENV", "WorkerHandle", "create_container", "spawn_worker", "emit", "main",
           "resident_bytes"]

_emit = emit  # scale_worker's name for it

if __name__ == "__main__":
    sys.exit(main())
