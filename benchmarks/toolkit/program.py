"""What every benchmark program shares: its two names, the options every one has
(``--record``, ``--debug``), one-line errors for what a user can fix, and one run's
command, clock and machine load.

A benchmark is ``benchmarks/<name>.py`` (or the package ``benchmarks/<name>/``). It runs as ``python -m
benchmarks.<name>`` (from the checkout root, or from anywhere with the checkout on
``PYTHONPATH``) and as ``eventprocessor bench <name with dashes>`` (from anywhere). Either
way it prints its results and leaves ``benchmarks/RESULTS.md`` alone unless ``--record``
is given; partial runs (``convergence --quick``) refuse ``--record``.

Example (the skeleton of a benchmark's ``main``)::

    def main(argv=None, prog=None):
        parser = program.parser("throughput", __doc__, prog)
        parser.add_argument("--rounds", type=int, default=15)
        return program.run("throughput", parser, measure_and_report, argv)

    def measure_and_report(args, run):
        ...
        run.report("\\n".join(["## Throughput", "", run.header(), "", table]))
        return 0
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence

from eventprocessor.cli.user_errors import CommandError, one_line_message

from . import report
from .machine import LoadWindow

__all__ = ["Run", "at_least_one", "command_name", "parser", "recorded_command", "run"]


def command_name(name: str) -> str:
    """The CLI spelling of a benchmark module's name: ``store_bench`` -> ``store-bench``."""
    return name.replace("_", "-")


def at_least_one(text: str) -> int:
    """An option's type for counts (rounds, events, partitions): a whole number, 1 or more.
    Example: ``parser.add_argument("--rounds", type=program.at_least_one, default=5)``."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def parser(name: str, doc: str | None, prog: str | None = None) -> argparse.ArgumentParser:
    """An argument parser with the options every benchmark has: ``--record``, ``--debug``."""
    summary = (doc or name).strip().split("\n\n")[0].replace("\n", " ")
    result = argparse.ArgumentParser(
        prog=prog or f"python -m benchmarks.{name}", description=summary,
        epilog=f"The same program runs as `python -m benchmarks.{name}` and `eventprocessor bench "
               f"{command_name(name)}`.")
    result.add_argument("--record", action="store_true",
                        help="Write the results into this benchmark's section of benchmarks/RESULTS.md (without it "
                             "nothing is written).")
    result.add_argument("--debug", action="store_true", help="Show the full traceback of a failure.")
    return result


def recorded_command(name: str, argv: Sequence[str] | None, unrecorded: Sequence[str] = ()) -> str:
    """The command line to write beside recorded results: ``python -m benchmarks.<name> ...``,
    without ``--debug``, ``--log-dir`` and the options in ``unrecorded`` (with their values):
    where logs or raw samples went is no part of the result."""
    given = list(sys.argv[1:] if argv is None else argv)
    dropped = ("--log-dir", *unrecorded)
    kept: list[str] = []
    skip = False
    for arg in given:
        if skip:
            skip = False
        elif arg in dropped:
            skip = True
        elif arg != "--debug" and not arg.startswith(tuple(f"{option}=" for option in dropped)):
            kept.append(arg)
    return " ".join(["python -m benchmarks." + name, *(shlex.quote(arg) for arg in kept)])


class Run:
    """One run of a benchmark program: the command that reproduces it, its clock from the
    start, and the machine's load since (:class:`~benchmarks.toolkit.machine.LoadWindow`)."""

    def __init__(self, name: str, command: str, record: bool) -> None:
        self.name = name
        self.command = command
        self.record = record
        self.started = time.monotonic()
        self.load = LoadWindow()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started

    def header(self, note: str = "", *, timed: bool = True, flag_busy: bool = True) -> str:
        """The line under the section's title (:func:`~benchmarks.toolkit.report.header`):
        the command, the time since the start (unless ``timed`` is false), the machine, its
        load, then ``note``; then, when other processes were busy over the run (and
        ``flag_busy``), the paragraph that says the figures are not a result
        (:func:`~benchmarks.toolkit.report.busy_flag`)."""
        load = self.load.reading()
        line = report.header(self.command, seconds=self.seconds if timed else None, load=load)
        flag = report.busy_flag([load], "the figures of this run") if flag_busy else []
        return "\n\n".join([f"{line} {note}" if note else line, *flag[:1]])

    def report(self, markdown: str) -> None:
        """Print the results; with ``--record``, also replace the benchmark's section of RESULTS.md."""
        print(markdown)
        if self.record:
            path = report.write_section(self.name, markdown)
            print(f"\nrecorded in {path}", file=sys.stderr)


def run(name: str, parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace, Run], int],
        argv: list[str] | None = None, *, unrecorded: Sequence[str] = ()) -> int:
    """Parse ``argv`` and run ``body(args, run)``. A failure a user can fix (a missing
    extra, no Azurite, no Java) is printed as one line and returns 2, unless ``--debug``.
    ``unrecorded``: options left out of the recorded command (see :func:`recorded_command`)."""
    args = parser.parse_args(argv)
    try:
        return body(args, Run(name, recorded_command(name, argv, unrecorded), args.record))
    except Exception as error:
        message = one_line_message(error)
        if message is None or args.debug:
            raise
        if not isinstance(error, CommandError):
            message += " (--debug shows the traceback)"
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2
