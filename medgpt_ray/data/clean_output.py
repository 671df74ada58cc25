"""The cleaner's outputs, as pure functions (no Ray; data/clean.py runs them as Ray tasks): dedup marks applied,
each source chunk's rows written in id order (kept records as canonical Parquet per kind, the rest to quarantine
JSONL, 0600), the report's counts, and the report itself.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from medgpt_ray.data.chunks import SourceChunk
from medgpt_ray.data.convert import record_id
from medgpt_ray.data.explain import reason_group
from medgpt_ray.data.private import open_private, private_dir

_TURNS = ("conversations", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
# Function schemas have no fixed shape: a JSON string column (null: no tools), which the readers accept.
_TOOLS = ("tools", pa.string())
CANONICAL_TYPES = {
    "pretrain": [("text", pa.string())],
    "sft": [_TURNS, _TOOLS],
    "preference": [_TURNS, ("chosen", pa.string()), ("rejected", pa.string()), _TOOLS],
    "prompt": [_TURNS, ("answer", pa.string()), _TOOLS],
    "unpaired": [_TURNS, ("completion", pa.string()), ("label", pa.bool_()), _TOOLS],
}


def write_part(batch: pa.Table, out_dir: str | Path, suffix: str) -> list[Any]:
    """Write one id-sorted run as `part-<first id>.<suffix>`; returns [path, first id, last id]. Runs never
    overlap (one source chunk's rows, see finish_rows), so file-name order is record order whatever order
    Ray ran the tasks in. Created owner-only, kept records and quarantined raw lines alike (medical text)."""
    out_dir = private_dir(out_dir)
    first, last = batch["id"][0].as_py(), batch["id"][-1].as_py()
    path = out_dir / f"part-{first}.{suffix}"
    with open_private(path, "wb") as fh:
        if suffix == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(batch, fh)
        else:
            fh.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in batch.to_pylist()).encode("utf-8"))
    return [str(path), first, last]


def merge_overlapping_parts(parts: list[list[Any]]) -> int:
    """Safety net for the no-global-sort write: parts of one directory whose id ranges overlap (which the
    one-chunk-per-run rule prevents) are merged into one sorted part, so file-name order stays record order
    whatever Ray Data does with blocks. Returns how many groups it had to merge (0 in every run seen)."""
    import pyarrow.parquet as pq

    by_dir: dict[str, list[tuple[str, str, str]]] = {}
    for path, first, last in parts:
        by_dir.setdefault(str(Path(path).parent), []).append((first, last, path))
    merged = 0
    for runs in by_dir.values():
        runs.sort()
        groups: list[list[tuple[str, str, str]]] = []
        for run in runs:
            if groups and run[0] <= max(r[1] for r in groups[-1]):
                groups[-1].append(run)
            else:
                groups.append([run])
        for group in (g for g in groups if len(g) > 1):
            paths = [Path(r[2]) for r in group]
            if paths[0].suffix == ".parquet":
                table = pa.concat_tables([pq.read_table(f) for f in paths])
            else:
                table = pa.Table.from_pylist([json.loads(line) for f in paths
                                              for line in f.read_text(encoding="utf-8").splitlines() if line])
            for f in paths:
                f.unlink()
            write_part(table.take(pc.sort_indices(table, [("id", "ascending")])), paths[0].parent,
                       paths[0].suffix.lstrip("."))
            merged += 1
    return merged


QUARANTINE_COLUMNS = ["id", "kind", "source_file", "source_line", "dropped_by", "reason", "record", "raw"]


def apply_marks(batch: pa.Table, marks: pa.Table) -> pa.Table:
    """Dedup marks onto the rows they name; a row an earlier operator dropped keeps that reason."""
    pos = pc.index_in(batch["id"], value_set=marks["id"].combine_chunks())
    hit = pc.and_(pc.is_valid(pos), pc.is_null(batch["dropped_by"]))
    if not pc.any(hit).as_py():
        return batch
    reason = pc.binary_join_element_wise(marks["how"].take(pos), marks["dup_of"].take(pos), "_duplicate_of:")
    batch = batch.set_column(batch.schema.get_field_index("dropped_by"), "dropped_by",
                             pc.if_else(hit, pa.scalar("dedup"), batch["dropped_by"]))
    return batch.set_column(batch.schema.get_field_index("reason"), "reason",
                            pc.if_else(hit, reason, batch["reason"]))


def chunk_start_ids(chunks: list[SourceChunk]) -> list[str]:
    """The smallest id each chunk can hold, sorted: a record belongs to the last chunk starting at or before it."""
    return sorted(record_id(c.file_no, c.first_line if c.first_line > 1 else 0, 0) for c in chunks)


def finish_rows(batch: pa.Table, marks: pa.Table, chunk_starts: list[str], out_dir: str
                ) -> tuple[Counter[str], list[list[Any]]]:
    """Stage 3 for one stage-1 file, in one pass: dedup marks applied, report counts taken, and each source
    chunk's rows written in id order as their own parts (kept records per kind as canonical Parquet under
    data/<kind>/, dropped ones to quarantine/, JSONL, 0600). A chunk is a contiguous id range, so parts never
    overlap and need no global sort. Returns the counts and the parts written."""
    batch = apply_marks(batch.take(pc.sort_indices(batch, [("id", "ascending")])), marks)
    run = np.searchsorted(np.array(chunk_starts), np.array(batch["id"].to_pylist(), dtype=str), side="right")
    bounds = [0, *(np.flatnonzero(np.diff(run)) + 1).tolist(), batch.num_rows]
    out, parts = Path(out_dir), []
    for a, b in zip(bounds[:-1], bounds[1:], strict=False):
        seg = batch.slice(a, b - a)
        dropped = pc.is_valid(seg["dropped_by"])
        kept = seg.filter(pc.invert(dropped))
        for kind in sorted(set(kept["kind"].to_pylist())):
            rows = kept.filter(pc.equal(kept["kind"], kind))
            parts.append(write_part(to_canonical_columns(rows, kind), out / "data" / kind, "parquet"))
        quarantined = seg.filter(dropped).select(QUARANTINE_COLUMNS)
        if quarantined.num_rows:
            parts.append(write_part(quarantined, out / "quarantine", "jsonl"))
    return partial_counts(batch), parts


def to_canonical_columns(batch: pa.Table, kind: str) -> pa.Table:
    records = [json.loads(r) for r in batch["record"].to_pylist()]
    fields = CANONICAL_TYPES[kind]
    cols = {"id": batch["id"], "source_file": batch["source_file"], "source_line": batch["source_line"]}
    for name, typ in fields:
        if name == "tools":
            values = [json.dumps(r["tools"], ensure_ascii=False) if r.get("tools") else None for r in records]
        else:
            values = [r.get(name) for r in records]  # only optional fields (a prompt's answer) may be absent
        cols[name] = pa.array(values, typ)
    return pa.table(cols)


def partial_counts(batch: pa.Table) -> Counter[str]:
    """Report counts of one block (the driver sums them): rows, source records, kept/dropped per kind, drops per
    operator and reason, redactions, stripped sign-offs. Python only over the dropped rows."""
    c: Counter[str] = Counter()
    c["rows"] = batch.num_rows
    c["source_records"] = int(pc.sum(pc.ends_with(batch["id"], "-000")).as_py() or 0)
    c["signoffs"] = int(pc.sum(batch["signoffs"]).as_py() or 0)
    kept = pc.is_null(batch["dropped_by"])
    for (kind, k), n in Counter(zip(batch["kind"].to_pylist(), kept.to_pylist(), strict=True)).items():
        c[f"kind:{kind}:{'kept' if k else 'dropped'}"] += n
    dropped = batch.filter(pc.invert(kept))
    for by, reason in zip(dropped["dropped_by"].to_pylist(), dropped["reason"].to_pylist(), strict=True):
        c[f"dropped_by:{by}"] += 1
        c[f"reason:{reason_group(by, reason)}"] += 1
    red = batch["redactions"]
    for r in pc.filter(red, pc.not_equal(red, "{}")).to_pylist():
        for typ, n in json.loads(r).items():
            c[f"pii:{typ}"] += n
    return c




def build_report(counts: Counter[str], kinds: list[str], clusters: dict[str, int], files: list[str],
                 wall_s: float) -> dict[str, Any]:
    kept = sum(counts[f"kind:{k}:kept"] for k in kinds)
    quarantined = counts["rows"] - kept
    reader_out = counts["rows"] - counts["dropped_by:reader"]
    quality_out = reader_out - counts["dropped_by:quality"]
    return {
        "files": files,
        "source_records": counts["source_records"],
        "records": counts["rows"],  # canonical records, plus one per source row that never became one
        "emitted": kept,
        "quarantined": quarantined,
        "adds_up": kept + quarantined == counts["rows"],
        "per_kind": {k: {"emitted": counts[f"kind:{k}:kept"], "quarantined": counts[f"kind:{k}:dropped"]}
                     for k in kinds},
        "operators": {
            "reader": {"in": counts["source_records"], "out": reader_out, "quarantined": counts["dropped_by:reader"]},
            "normalize": {"in": reader_out, "out": reader_out},
            "signoff": {"in": reader_out, "out": reader_out, "stripped": counts["signoffs"]},
            "pii": {"in": reader_out, "out": reader_out},
            "quality": {"in": reader_out, "out": quality_out, "quarantined": counts["dropped_by:quality"]},
            "dedup": {"in": quality_out, "out": kept, "quarantined": counts["dropped_by:dedup"]},
        },
        "reasons": {k.removeprefix("reason:"): v for k, v in sorted(counts.items()) if k.startswith("reason:")},
        "redactions": {k.removeprefix("pii:"): v for k, v in sorted(counts.items()) if k.startswith("pii:")},
        "duplicate_clusters": clusters,
        "wall_s": round(wall_s, 2),
        "source_records_per_s": round(counts["source_records"] / wall_s, 1) if wall_s else None,
    }


def format_report(r: dict[str, Any], out: Path) -> str:
    lines = [f"cleaned {r['source_records']} source records from {len(r['files'])} file(s) in {r['wall_s']:.1f}s "
             f"({r['source_records_per_s']} records/s)",
             f"  {r['records']} records = {r['emitted']} emitted + {r['quarantined']} quarantined "
             f"({'adds up' if r['adds_up'] else 'DOES NOT ADD UP'})"]
    for name, op in r["operators"].items():
        extra = ", ".join(f"{k} {v}" for k, v in op.items() if k not in ("in", "out"))
        lines.append(f"  {name:<10} in {op['in']:>9}  out {op['out']:>9}  {extra}")
    lines.append("  redactions: " + (", ".join(f"{k} {v}" for k, v in r["redactions"].items()) or "none"))
    lines.append(f"  duplicate clusters: exact {r['duplicate_clusters']['exact']}, "
                 f"near {r['duplicate_clusters']['near']}")
    lines.append(f"  outputs: {out / 'data'}/<kind>/part-*.parquet, {out / 'quarantine'}, {out / 'report.json'}")
    return "\n".join(lines)
