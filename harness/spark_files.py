"""Which files each micro-batch of a Spark file sink wrote, from the sink's own log.

A streaming query writing files (``writeStream.format("parquet")``, or this SDK's
exactly-once sink) lists the files of each micro-batch in ``<path>/_spark_metadata``:
entry ``n`` for batch ``n``, and every tenth a compacted ``n.compact`` that lists every
earlier batch's files too. :func:`batch_files` reads it back per batch, for a test (or a
benchmark) that checks what a given batch wrote or when its events arrived.

Example::

    for batch, paths in batch_files(Path(out) / "_spark_metadata").items():
        rows = sum(pq.read_metadata(path.replace("file://", "")).num_rows for path in paths)
"""
from __future__ import annotations

import json
from pathlib import Path

__all__ = ["batch_files"]


def batch_files(metadata: Path) -> dict[int, list[str]]:
    """The files (as the log names them: ``file:///...`` URIs) each micro-batch wrote,
    keyed by batch id. A compacted entry lists every earlier batch's files again: each
    file belongs to the first batch that lists it."""
    result: dict[int, list[str]] = {}
    seen: set[str] = set()
    for entry in sorted(Path(metadata).glob("[0-9]*"), key=lambda e: int(e.name.split(".")[0])):
        batch = int(entry.name.split(".")[0])
        for line in entry.read_text().splitlines()[1:]:
            path = json.loads(line)["path"]
            if path not in seen:
                seen.add(path)
                result.setdefault(batch, []).append(path)
    return result
