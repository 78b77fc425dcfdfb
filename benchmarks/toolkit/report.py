"""How every benchmark writes its results: markdown tables, a median with its range, the
line that says what ran where and how busy the machine was, and its own section of
``benchmarks/RESULTS.md``.

One rule for figures over rounds, everywhere: one value is shown alone; several as the
median with the range in brackets, ``1,234 (1,100-1,300)`` (``+0.12 (-0.30 to +0.40)``
when a bound carries a sign). Values that are missing (None or NaN) are left out; none
left is ``n/a``.

``EVENTPROCESSOR_BENCH_RESULTS`` names another file to write instead of RESULTS.md
(plots go to a ``results`` folder beside it): the tests run the programs with
``--record`` into a scratch copy that way.

Example::

    lines = [f"## Throughput", "", header(command, seconds=42.0, load=window.reading()), "",
             table(["side", "events/s"], [["ours", median_range(rates)]], align="lr")]
    write_section("throughput", "\\n".join(lines))
"""
from __future__ import annotations

import math
import os
import platform
import re
import statistics
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from .machine import LoadReading

__all__ = ["RESULTS_ENV", "busy_flag", "header", "machine_line", "median", "median_range", "number",
           "package_version", "plots_dir", "results_path", "table", "value_range", "write_section"]

RESULTS_ENV = "EVENTPROCESSOR_BENCH_RESULTS"
_DEFAULT = Path(__file__).resolve().parent.parent / "RESULTS.md"
_HEADER = ("# Benchmark results\n\nEach section is written by the benchmark named in it, "
           "only when run with `--record`; "
           "re-run its command with `--record` to refresh it (from the checkout root, or as "
           "`eventprocessor bench NAME --record` from anywhere).\n")


# --------------------------------------------------------------------------- figures


def _known(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None and not math.isnan(v)]


def median(values: Iterable[float | None]) -> float:
    """The median of the known values; NaN when there is none."""
    known = _known(values)
    return statistics.median(known) if known else float("nan")


def _span(low: str, high: str) -> str:
    signed = any(text.startswith(("-", "+")) for text in (low, high))
    return f"{low} to {high}" if signed else f"{low}-{high}"


def value_range(values: Iterable[float | None], fmt: str = ",.0f", unit: str = "") -> str:
    """``low-high`` of the known values (one value alone; ``n/a`` for none)."""
    known = _known(values)
    if not known:
        return "n/a"
    if len(known) == 1:
        return f"{known[0]:{fmt}}{unit}"
    return _span(f"{min(known):{fmt}}", f"{max(known):{fmt}}") + unit


def median_range(values: Iterable[float | None], fmt: str = ",.0f", unit: str = "") -> str:
    """``median (low-high)`` of the known values: the figure over rounds, e.g.
    ``median_range([0.91, 0.88, 0.95], ".2f", "x")`` is ``0.91x (0.88-0.95)``."""
    known = _known(values)
    if len(known) < 2:
        return value_range(known, fmt, unit)
    return f"{median(known):{fmt}}{unit} ({value_range(known, fmt)})"


def number(value: float | None, fmt: str = ".1f", missing: str = "n/a") -> str:
    """``value`` formatted, or ``missing`` when it is None or NaN."""
    return missing if value is None or math.isnan(value) else f"{value:{fmt}}"


def table(columns: Sequence[str], rows: Iterable[Sequence[object]], align: str = "") -> str:
    """A markdown table. ``align`` has one letter per column, ``l`` or ``r`` (right-aligned,
    for figures); columns it does not cover are left-aligned."""
    rule = "|" + "".join("---:|" if align[i:i + 1] == "r" else "---|" for i in range(len(columns)))
    lines = ["| " + " | ".join(columns) + " |", rule]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# --------------------------------------------------------------------------- where and when


def machine_line() -> str:
    """``Machine: x86_64, 2 cores, Python 3.11.7, 2026-11-26 05:56 UTC.``"""
    return (f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC.")


def header(command: str, *, seconds: float | None = None, load: LoadReading | None = None) -> str:
    """The line under a section's title: the command that reproduces it, how long it took,
    the machine, and how busy the machine was meanwhile (other processes' CPU and the load
    average, from :class:`~benchmarks.toolkit.machine.LoadWindow`)."""
    took = "" if seconds is None else f" ({seconds:.0f} s)"
    busy = "" if load is None else f" Load: {load.describe()}."
    return f"Command: `{command}`{took}. {machine_line()}{busy}"


def busy_flag(readings: Iterable[LoadReading], what: str = "these figures") -> list[str]:
    """Markdown lines (and a blank one) that flag a busy run; none when the machine was quiet."""
    readings = list(readings)
    busy = [r for r in readings if r.busy]
    if not busy:
        return []
    worst = max(r.other_cores or 0.0 for r in busy)
    return [f"**Busy machine, not a result**: other processes used more than {busy[0].threshold:g} cores on average "
            f"in {len(busy)} of {len(readings)} measured window(s) (up to {worst:.2f} cores), so {what} measure "
            f"that work as much as the code. Re-run on a quiet machine before quoting them.", ""]


# --------------------------------------------------------------------------- RESULTS.md


def results_path() -> Path:
    """The file ``--record`` writes: ``benchmarks/RESULTS.md``, or ``$EVENTPROCESSOR_BENCH_RESULTS``."""
    return Path(os.environ.get(RESULTS_ENV) or _DEFAULT)


def plots_dir() -> Path:
    """The folder plots go to: ``results/`` beside :func:`results_path`."""
    return results_path().parent / "results"


def write_section(name: str, markdown: str, path: Path | None = None) -> Path:
    """Replace (or append) the section between the markers of ``name``, leaving the others."""
    path = path or results_path()
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _m: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path


def package_version(distribution: str) -> str:
    """The installed version of ``distribution`` (a peer named in a table), or ``?``."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return "?"
