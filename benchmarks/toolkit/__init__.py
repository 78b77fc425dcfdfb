"""What every benchmark program is built on (``docs/benchmarks/index.md``, "Writing a benchmark").

* :mod:`~benchmarks.toolkit.program`: the program itself: its parser with ``--record`` and
  ``--debug``, one-line errors, and the :class:`~benchmarks.toolkit.program.Run` that knows
  the command, the clock and the machine's load;
* :mod:`~benchmarks.toolkit.report`: tables, a median with its range, the line that says
  where and how busy, and the writer of ``benchmarks/RESULTS.md``;
* :mod:`~benchmarks.toolkit.machine`: the one reader of ``/proc``: CPU of processes and of
  the machine, load windows, busy flags;
* :mod:`~benchmarks.toolkit.services`: Azurite, the Event Hubs emulator and a log folder,
  started and stopped for a run.

The worker processes, the scenarios and the convergence simulator that tests share are
in ``harness/``.
"""
