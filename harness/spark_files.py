"""Which files each micro-batch of a Spark file sink wrote, from the sink's own log.

A streaming query writing files (``writeStream.format("parquet")``, or this SDK's
exactly-once sink) lists the files of each micro-batch in ``<path>/_spark_metadata``:
entry ``n`` for batch ``n``, and every tenth a compacted ``n.compact`` that lists every
earlier batch's files too. :func:`batch_files` reads it back per batch, for a test (or a
benchmark) that checks what a given batch wrote or when its events arrived.
:func:`audit_table` reads a sink's table back against its commit log.

Example::

    for batch, paths in batch_files(Path(out) / "_spark_metadata").items():
        rows = sum(pq.read_metadata(path.replace("file://", "")).num_rows for path in paths)
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote

from eventprocessor.spark.log_records import PartitionRange, StagedFile
from eventprocessor.spark.output import METADATA_DIR, STAGING_DIR, OutputLocation, ParquetWriter

if TYPE_CHECKING:  # pragma: no cover
    from eventprocessor.spark.commit_log import CommitLog

__all__ = ["batch_files", "TableAudit", "audit_table"]


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


# ----------------------------------------------------------------------------- the commit log against the table


@dataclass
class TableAudit:
    """What :func:`audit_table` found: each event's row count in the table (through
    ``_spark_metadata``, as ``spark.read.parquet`` reads it), the committed batches
    checked, and every disagreement between the commit log and the table, in words."""

    rows: Counter[tuple[str, int]] = field(default_factory=Counter)
    batches: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)

    def duplicates(self) -> int:
        return sum(n - 1 for n in self.rows.values() if n > 1)

    def missing(self, produced: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        return sorted(set(produced) - set(self.rows))

    def extra(self, produced: Iterable[tuple[str, int]]) -> list[tuple[str, int]]:
        return sorted(set(self.rows) - set(produced))


def _partition_of(relative: str) -> str | None:
    for part in relative.split("/")[:-1]:
        if part.startswith("partition_id="):
            return unquote(part[len("partition_id="):])
    return None


def _batch_rows(root: Path, relatives: Iterable[str]) -> Counter[tuple[str, int]]:
    import pyarrow.parquet as pq

    rows: Counter[tuple[str, int]] = Counter()
    for relative in relatives:
        table = pq.read_table(root / relative)
        sequence = table.column("sequence_number").to_pylist()
        if "partition_id" in table.column_names:
            pids = [str(p) for p in table.column("partition_id").to_pylist()]
        else:
            pids = [_partition_of(relative) or "?"] * len(sequence)
        rows.update(zip(pids, sequence, strict=True))
    return rows


async def audit_table(root: Path, log: CommitLog) -> TableAudit:
    """Read a sink's table back against its commit log (after every writer has stopped):

    * every commit entry with files names exactly the files the table holds for it: each
      is in the table at its published name with its size, and ``_spark_metadata``
      lists it once; ``_spark_metadata`` lists no other file, and no other data file
      lies in the table's directories;
    * the rows of each committed batch are exactly the events of its plan's ranges
      (each partition's sequence numbers from first to last, ``count`` of them);
    * nothing is left staged.

    ``rows`` counts each event's rows over the whole table, for the caller to compare
    with what was produced."""
    audit = TableAudit()
    entries = await log.entries()
    if entries and entries[0][0] != 0:
        audit.problems.append(f"the commit log was compacted below version {entries[0][0]}: those batches are "
                              "not checked")
    plans = {version: [PartitionRange.from_json(r) for r in entry["ranges"]]
             for version, entry in entries if entry["type"] == "plan"}
    uri_prefix = OutputLocation(root).uri("")
    listed = Counter(unquote(uri[len(uri_prefix):]) if uri.startswith(uri_prefix) else uri
                     for uris in batch_files(root / METADATA_DIR).values() for uri in uris)
    named: set[str] = set()
    for _version, entry in entries:
        if entry["type"] != "commit" or entry.get("files") is None:
            continue
        batch_id = int(entry["batch_id"])
        finals = [ParquetWriter.final_path(batch_id, StagedFile.from_json(f)) for f in entry["files"]]
        audit.batches += 1
        audit.files += len(finals)
        named.update(finals)
        for final, staged in zip(finals, entry["files"], strict=True):
            path = root / final
            if not path.exists():
                audit.problems.append(f"batch {batch_id}: its committed file {final} is not in the table")
            elif path.stat().st_size != int(staged[1]):
                audit.problems.append(f"batch {batch_id}: {final} has {path.stat().st_size} bytes, the commit log "
                                      f"says {staged[1]}")
            if listed[final] != 1:
                audit.problems.append(f"batch {batch_id}: _spark_metadata lists {final} {listed[final]} times")
        present = [f for f in finals if (root / f).exists()]
        batch_rows = _batch_rows(root, present)
        audit.rows.update(batch_rows)
        for r in plans.get(batch_id, []):
            seqs = sorted(seq for pid, seq in batch_rows if pid == r.partition_id)
            if len(seqs) != r.count or (seqs and (seqs[0], seqs[-1]) != (r.first_sequence_number,
                                                                         r.last_sequence_number)):
                audit.problems.append(
                    f"batch {batch_id}: partition {r.partition_id} has {len(seqs)} rows "
                    f"({seqs[0] if seqs else '-'}..{seqs[-1] if seqs else '-'}), its plan says {r.count} "
                    f"({r.first_sequence_number}..{r.last_sequence_number})")
    for extra in sorted(set(listed) - named):
        audit.problems.append(f"_spark_metadata lists {extra}, which no commit entry names")
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not any(part.startswith(("_", ".")) for part in relative.split("/")) \
                and relative not in named:
            audit.problems.append(f"{relative} is in the table's directories, and no commit entry names it")
    staged = [p for p in (root / STAGING_DIR).rglob("*") if p.is_file()] if (root / STAGING_DIR).exists() else []
    if staged:
        audit.problems.append(f"{len(staged)} file(s) left in {STAGING_DIR}, e.g. {staged[0].relative_to(root)}")
    return audit
