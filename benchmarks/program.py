"""What every benchmark program shares: its two names, ``--record``, ``--debug``, and
one-line errors for what a user can fix.

A benchmark is the module ``benchmarks/<name>.py``. It runs as
``python -m benchmarks.<name>`` (from the checkout root, or from anywhere with the
checkout on ``PYTHONPATH``) and as ``eventprocessor bench <name with dashes>`` (from
anywhere). Either way it prints its results and leaves ``benchmarks/RESULTS.md`` alone
unless ``--record`` is given; partial runs (``convergence --quick``) refuse ``--record``.
Results and plots are found from this file's path, never from the cwd.

Example (the skeleton of a benchmark's ``main``)::

    def main(argv=None, prog=None):
        parser = program.parser("throughput", __doc__, prog)
        parser.add_argument("--rounds", type=int, default=15)
        return program.run(parser, _measure_and_report, argv)
"""
from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Callable, Sequence

from eventprocessor.cli.user_errors import CommandError, one_line_message

__all__ = ["command_name", "parser", "recorded_command", "report", "run"]

_RETIRED_FLAGS = ("--no-write", "--no-record")


def command_name(name: str) -> str:
    """The CLI spelling of a benchmark module's name: ``store_bench`` -> ``store-bench``."""
    return name.replace("_", "-")


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
    # The old opt-out flags: writing is opt-in now, so they change nothing.
    result.add_argument(*_RETIRED_FLAGS, dest="retired_opt_out", action="store_true", help=argparse.SUPPRESS)
    return result


def recorded_command(name: str, argv: Sequence[str] | None) -> str:
    """The command line to write beside recorded results: ``python -m benchmarks.<name> ...``."""
    given = list(sys.argv[1:] if argv is None else argv)
    # Where the logs went (--log-dir and its value) is no part of the result.
    kept = [arg for i, arg in enumerate(given) if arg not in ("--debug", "--log-dir", *_RETIRED_FLAGS)
            and not arg.startswith("--log-dir=") and (i == 0 or given[i - 1] != "--log-dir")]
    return " ".join(["python -m benchmarks." + name, *(shlex.quote(arg) for arg in kept)])


def report(name: str, markdown: str, record: bool) -> None:
    """Print the results; with ``--record``, also replace the benchmark's section of RESULTS.md."""
    print(markdown)
    if record:
        from . import results

        path = results.write_section(name, markdown)
        print(f"\nrecorded in {path}", file=sys.stderr)


def run(parser: argparse.ArgumentParser, body: Callable[[argparse.Namespace], int],
        argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run ``body``. A failure a user can fix (a missing extra, no
    Azurite, no Java) is printed as one line and returns 2, unless ``--debug``."""
    args = parser.parse_args(argv)
    try:
        return body(args)
    except Exception as error:
        message = one_line_message(error)
        if message is None or args.debug:
            raise
        if not isinstance(error, CommandError):
            message += " (--debug shows the traceback)"
        print(f"{parser.prog}: error: {message}", file=sys.stderr)
        return 2
