"""Write one benchmark's section of benchmarks/RESULTS.md without touching the others."""
from __future__ import annotations

import platform
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
RESULTS_DIR = Path(__file__).resolve().parent / "results"

_HEADER = ("# Benchmark results\n\nEach section is written by the benchmark named in it, only when run with `--record`; "
           "re-run its command with `--record` to refresh it (from the checkout root, or as "
           "`eventprocessor bench NAME --record` from anywhere).\n")


def machine_line() -> str:
    import os

    return (
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC."
    )


def write_section(name: str, markdown: str, path: Optional[Path] = None) -> Path:
    """Replace (or append) the section between the markers of ``name``."""
    path = path or RESULTS
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    block = f"{begin}\n{markdown.rstrip()}\n{end}"
    text = path.read_text() if path.exists() else _HEADER
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    text = pattern.sub(lambda _m: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    return path
