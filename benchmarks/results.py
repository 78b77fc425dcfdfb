"""Write one benchmark's section of benchmarks/RESULTS.md without touching the others.

``EVENTPROCESSOR_BENCH_RESULTS`` names another file to write instead (plots go to a
``results`` directory beside it): the tests run the programs with ``--record`` into a
scratch copy that way."""
from __future__ import annotations

import os
import platform
import re
from datetime import datetime, timezone
from pathlib import Path

RESULTS_ENV = "EVENTPROCESSOR_BENCH_RESULTS"
_DEFAULT = Path(__file__).resolve().parent / "RESULTS.md"
RESULTS = Path(os.environ.get(RESULTS_ENV) or _DEFAULT)
RESULTS_DIR = RESULTS.parent / "results"

_HEADER = ("# Benchmark results\n\nEach section is written by the benchmark named in it, "
           "only when run with `--record`; "
           "re-run its command with `--record` to refresh it (from the checkout root, or as "
           "`eventprocessor bench NAME --record` from anywhere).\n")


def machine_line() -> str:
    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC."
    )


def write_section(name: str, markdown: str, path: Path | None = None) -> Path:
    """Replace (or append) the section between the markers of ``name``."""
    path = path or RESULTS
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _m: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path
