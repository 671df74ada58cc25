"""Source files to canonical records: `iter_canonical` streams every source row of a set of files as its
canonical records or its Quarantined entry, and `load_canonical` collects them in memory (with the per-file
format counts).

Which files a path names is input_paths.py's job, a file's rows file_rows.py's, and format detection and
conversion readers.py's; this module only puts them together, so that no source row is dropped without a word.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.input_paths import expand_paths
from medgpt_ray.data.readers import Kind, RecordError, check_kind, convert_as, detect_format


@dataclass
class Quarantined:
    file: str
    line: int
    reason: str
    raw: str | None = None  # only for unparseable lines; parsed records are never stored here verbatim


@dataclass
class LoadResult:
    records: list[dict] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    source_count: int = 0
    # per file: detected format -> number of source rows; rows that did not parse count as "unparseable",
    # rows of no known format as "unknown", so the counts of a file add up to its source rows.
    detected: dict[str, dict[str, int]] = field(default_factory=dict)


def iter_canonical(paths: Sequence[str | Path], kind: Kind, detected: dict[str, dict[str, int]] | None = None
                   ) -> Iterator[list[dict] | Quarantined]:
    """One item per source row of `paths` read as `kind` data, streaming: the row's canonical records (a list:
    Huatuo rows give several) or its Quarantined entry. `detected`, when given, gets the per-file format
    counts of LoadResult.detected."""
    check_kind(kind)
    detected = {} if detected is None else detected
    for path in expand_paths(paths):
        name = str(path)
        counts: dict[str, int] = detected.setdefault(name, {})
        for line, row in iter_rows(path):
            if isinstance(row, RecordError):
                counts["unparseable"] = counts.get("unparseable", 0) + 1
                yield Quarantined(name, line, row.reason, row.raw)
                continue
            try:
                fmt = detect_format(row)
            except RecordError as e:
                counts["unknown"] = counts.get("unknown", 0) + 1
                yield Quarantined(name, line, e.reason)
                continue
            counts[fmt] = counts.get(fmt, 0) + 1
            try:
                yield convert_as(row, fmt, kind)
            except RecordError as e:
                yield Quarantined(name, line, e.reason)


def load_canonical(paths: Sequence[str | Path], kind: Kind) -> LoadResult:
    """Read every source row of `paths` as `kind` data into memory: each is converted or quarantined, never
    dropped. (The pipeline streams with iter_canonical; this is for small files and tests.)"""
    result = LoadResult()
    for item in iter_canonical(paths, kind, result.detected):
        result.source_count += 1
        if isinstance(item, Quarantined):
            result.quarantined.append(item)
        else:
            result.records.extend(item)
    return result
