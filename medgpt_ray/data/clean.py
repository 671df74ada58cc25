"""The corpus-cleaning pipeline on Ray Data: read -> canonical -> normalize/sign-offs/PII/quality -> dedup.

Only wiring lives here; every operator is a pure function in data/ops (tested without Ray).

    1. read + convert + clean   streaming over byte-range chunks of the inputs; written to _work/stage1
    2. dedup decisions          exact hash and MinHash-LSH band keys, grouped by key across the cluster
                                (a shuffle of small (key, id) rows, never of the records); each group
                                yields (later, earlier) candidate pairs; near pairs are confirmed on their
                                MinHash signatures (fetched for candidate records only)
    3. apply + write            marks applied; records sorted by stable id (file, line, index), per kind to
                                DIR/data/<kind>/part-<first id>.parquet; everything dropped to
                                DIR/quarantine/part-<first id>.jsonl (0600) with file, line, operator, reason
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import ray
from ray.data.expressions import col

from medgpt_ray.config import CleanConfig
from medgpt_ray.data.chunks import SourceChunk, plan_chunks
from medgpt_ray.data.convert import ROW_SCHEMA, convert_rows, rows_to_table
from medgpt_ray.data.files import expand_paths, iter_rows
from medgpt_ray.data.readers import KIND_FORMATS, DataFileError, RecordError, detect_format
from medgpt_ray.metrics import record_clean_report
from medgpt_ray.progress import LiveProgress

FEATURE_FIELDS = [
    ("redactions", pa.string()),
    ("signoffs", pa.int64()),
    ("exact_hash", pa.string()),
    ("band_keys", pa.list_(pa.string())),
    ("minhash", pa.binary()),
]
STAGE1_SCHEMA = pa.schema(list(ROW_SCHEMA) + [pa.field(n, t) for n, t in FEATURE_FIELDS])
MAX_PAIRWISE = 32  # a hot LSH bucket pairs each member with at most this many earlier ones
CANONICAL_TYPES = {
    "pretrain": [("text", pa.string())],
    "sft": [("conversations", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))],
    "preference": [("conversations", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
                   ("chosen", pa.string()), ("rejected", pa.string())],
}


def write_part(batch: pa.Table, out_dir: str, suffix: str) -> pa.Table:
    """Write one sorted block as `part-<first id>.<suffix>`: file-name order is then record order, whatever
    order Ray ran the tasks in. Files are created owner-only (quarantine holds raw lines)."""
    if batch.num_rows == 0:
        return pa.table({"rows": pa.array([], pa.int64())})
    path = Path(out_dir) / f"part-{batch['id'][0].as_py()}.{suffix}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if suffix == "jsonl" else 0o644)
    with os.fdopen(fd, "wb") as fh:
        if suffix == "parquet":
            import pyarrow.parquet as pq

            pq.write_table(batch, fh)
        else:
            for row in batch.to_pylist():
                fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
    return pa.table({"rows": [batch.num_rows]})


def write_sorted(ds, out_dir: Path, suffix: str, remote: dict[str, Any]) -> int:
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700 if suffix == "jsonl" else 0o755)
    written = ds.sort("id").map_batches(write_part, fn_kwargs={"out_dir": str(out_dir), "suffix": suffix},
                                        batch_size=None, batch_format="pyarrow", **remote)
    return sum(r["rows"] for r in written.iter_rows())


# ---- kinds ---------------------------------------------------------------------------------------
def detect_kind(path: Path) -> tuple[str, str]:
    """(format, kind) of a file from its first parseable row; --kind auto says what it found."""
    for _, row in iter_rows(path):
        if isinstance(row, RecordError):
            continue
        try:
            fmt = detect_format(row)
        except RecordError:
            continue
        return fmt, next(k for k, fmts in KIND_FORMATS.items() if fmt in fmts)
    raise DataFileError(f"{path}: no row of a known source format; pass --kind explicitly")


def plan_inputs(inputs: list[str], kind: str, echo: Callable[[str], None]) -> list[SourceChunk]:
    chunks: list[SourceChunk] = []
    for file_no, path in enumerate(expand_paths(inputs)):
        if kind == "auto":
            fmt, file_kind = detect_kind(path)
            echo(f"[clean] {path}: detected {fmt} -> {file_kind}")
        else:
            file_kind = kind
        chunks.extend(plan_chunks(path, file_kind, file_no))
    return chunks


# ---- stage 1: convert + clean + dedup features (pure per batch) -----------------------------------
def _with_features(table: pa.Table) -> pa.Table:
    """Give a table every STAGE1 column (missing ones null), in schema order."""
    cols = []
    for f in STAGE1_SCHEMA:
        cols.append(table.column(f.name).cast(f.type) if f.name in table.column_names
                    else pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=STAGE1_SCHEMA)


def stage1_chunks(items: pa.Table, cfg: CleanConfig, progress: tuple[str, str] | None = None
                  ) -> Iterator[pa.Table]:
    """Read whole chunks and clean them batch by batch in the same task: rows never round-trip through
    Ray as Python dicts, and each yielded table is one output block (streaming, bounded memory).
    `progress` names the driver's progress actor (name, namespace): each batch reports its row count."""
    from medgpt_ray.data.chunks import read_chunk

    actor = ray.get_actor(progress[0], namespace=progress[1]) if progress else None
    for item in items.to_pylist():
        rows: list[dict[str, Any]] = []
        for row in read_chunk(SourceChunk(**item)):
            rows.append(row)
            if len(rows) == cfg.batch_size:
                if actor is not None:
                    actor.push.remote({"rows": len(rows)})
                yield stage1_rows(rows, cfg)
                rows = []
        if actor is not None:
            actor.push.remote({"rows": len(rows), "chunk_done": 1})
        if rows:
            yield stage1_rows(rows, cfg)


def stage1_rows(rows: list[dict[str, Any]], cfg: CleanConfig) -> pa.Table:
    from medgpt_ray.data.ops.dedup import dedup_features
    from medgpt_ray.data.ops.record import clean_table

    table = rows_to_table(convert_rows(rows, cfg.pii))
    parts = [_with_features(table.filter(pc.is_valid(table["dropped_by"])))]
    live = table.filter(pc.is_null(table["dropped_by"]))
    for kind in sorted(set(live["kind"].to_pylist())):
        sub = live.filter(pc.equal(live["kind"], kind))
        cleaned = clean_table(sub, kind, cfg)
        parts.append(_with_features(cleaned.filter(pc.is_valid(cleaned["dropped_by"]))))
        kept = cleaned.filter(pc.is_null(cleaned["dropped_by"]))
        if kept.num_rows:
            parts.append(_with_features(dedup_features(kept, kind, cfg.dedup)))
    # Back into reading (= id) order: batches arrive in order, so the whole stage stays sorted.
    table = pa.concat_tables(parts)
    return table.take(pc.sort_indices(table, [("id", "ascending")]))


# ---- stage 2: duplicate marks --------------------------------------------------------------------
PAIR_SCHEMA = pa.schema([("id", pa.string()), ("cand", pa.string()), ("how", pa.string())])


def explode_keys(batch: pa.Table, cfg: CleanConfig) -> pa.Table:
    """One small (key, id) row per exact hash and per LSH band; keys carry the kind, so a pretraining
    paragraph is never a duplicate of a conversation. Signatures stay out of the shuffle (1 KiB each)."""
    keys, ids = [], []
    for rid, kind, xh, bands in zip(batch["id"].to_pylist(), batch["kind"].to_pylist(),
                                    batch["exact_hash"].to_pylist(), batch["band_keys"].to_pylist(), strict=True):
        if cfg.dedup.exact:
            keys.append(f"{kind}|x|{xh}")
            ids.append(rid)
        if cfg.dedup.near:
            for b in bands or []:
                keys.append(f"{kind}|b|{b}")
                ids.append(rid)
    return pa.table({"key": pa.array(keys, pa.string()), "id": pa.array(ids, pa.string())})


def group_pairs(ids: list[str], key: str) -> list[tuple[str, str, str]]:
    """Candidate (later id, earlier id, how) pairs of one key group, ids sorted: an exact group points every
    member at its first; an LSH bucket pairs each member with up to MAX_PAIRWISE earlier ones."""
    if "|x|" in key:
        return [(rid, ids[0], "exact") for rid in ids[1:]]
    return [(ids[j], ids[i], "near") for j in range(1, len(ids)) for i in range(min(j, MAX_PAIRWISE))]


def candidate_block(block: pa.Table) -> pa.Table:
    """A block of a key-hash-partitioned, key-sorted shuffle holds whole key groups (what map_groups relies
    on too): find the groups with numpy and go to Python only for those with two or more members."""
    if block.num_rows < 2:
        return PAIR_SCHEMA.empty_table()
    block = block.take(pc.sort_indices(block, [("key", "ascending"), ("id", "ascending")]))
    keys = block["key"].to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    sizes = np.diff(np.append(starts, len(keys)))
    ids = block["id"].to_pylist()
    pairs: list[tuple[str, str, str]] = []
    for g in np.flatnonzero(sizes > 1):
        a, n = int(starts[g]), int(sizes[g])
        pairs += group_pairs(ids[a:a + n], keys[a])
    return pa.table({"id": [p[0] for p in pairs], "cand": [p[1] for p in pairs], "how": [p[2] for p in pairs]},
                    schema=PAIR_SCHEMA)


def signatures_of(batch: pa.Table, wanted_ref) -> pa.Table:
    wanted = ray.get(wanted_ref)
    mask = pa.array([rid in wanted for rid in batch["id"].to_pylist()], pa.bool_())
    return batch.select(["id", "minhash"]).filter(mask)


def decide_marks(pairs: pa.Table, sigs: dict[str, np.ndarray], threshold: float) -> dict[str, tuple[str, str]]:
    """id -> (earliest record it duplicates, exact|near). Exact pairs stand; near pairs must reach the
    Jaccard threshold on the full signatures. The smallest (earlier id) wins: deterministic."""
    marks: dict[str, tuple[str, str]] = {}
    for rid, cand, how in zip(pairs["id"].to_pylist(), pairs["cand"].to_pylist(), pairs["how"].to_pylist(),
                              strict=True):
        if how == "near" and float(np.mean(sigs[rid] == sigs[cand])) < threshold:
            continue
        if rid not in marks or (cand, how) < marks[rid]:
            marks[rid] = (cand, how)
    return marks


# ---- stage 3: apply marks, write -----------------------------------------------------------------
def apply_marks(batch: pa.Table, marks_ref) -> pa.Table:
    marks = marks_ref if isinstance(marks_ref, dict) else ray.get(marks_ref)
    dropped, reason = batch["dropped_by"].to_pylist(), batch["reason"].to_pylist()
    for i, rid in enumerate(batch["id"].to_pylist()):
        if dropped[i] is None and rid in marks:
            dup_of, how = marks[rid]
            dropped[i], reason[i] = "dedup", f"{how}_duplicate_of:{dup_of}"
    batch = batch.set_column(batch.schema.get_field_index("dropped_by"), "dropped_by", pa.array(dropped, pa.string()))
    return batch.set_column(batch.schema.get_field_index("reason"), "reason", pa.array(reason, pa.string()))


def to_canonical_columns(batch: pa.Table, kind: str) -> pa.Table:
    records = [json.loads(r) for r in batch["record"].to_pylist()]
    fields = CANONICAL_TYPES[kind]
    cols = {"id": batch["id"], "source_file": batch["source_file"], "source_line": batch["source_line"]}
    for name, typ in fields:
        cols[name] = pa.array([r[name] for r in records], typ)
    return pa.table(cols)


def partial_counts(batch: pa.Table) -> pa.Table:
    """Per-batch counts for the report, summed by the driver (one small row per batch)."""
    c: Counter[str] = Counter()
    for kind, dropped, reason, red, so, rid in zip(
            batch["kind"].to_pylist(), batch["dropped_by"].to_pylist(), batch["reason"].to_pylist(),
            batch["redactions"].to_pylist(), batch["signoffs"].to_pylist(), batch["id"].to_pylist(), strict=True):
        c["rows"] += 1
        if rid.endswith("-000"):
            c["source_records"] += 1
        c[f"kind:{kind}:{'kept' if dropped is None else 'dropped'}"] += 1
        if dropped is not None:
            c[f"dropped_by:{dropped}"] += 1
            short = reason.split(":", 1)[0] if dropped == "dedup" else reason
            c[f"reason:{dropped}:{short if dropped != 'reader' else _reader_reason(reason)}"] += 1
        for typ, n in json.loads(red or "{}").items():
            c[f"pii:{typ}"] += n
        c["signoffs"] += so or 0
    return pa.table({"counts": [json.dumps(c)]})


def _reader_reason(reason: str) -> str:
    # Parser messages carry positions ("column 17"): group them by their stable head.
    return reason.split(" (", 1)[0].split(":", 1)[0]


# ---- driver --------------------------------------------------------------------------------------
def clean_corpus(inputs: list[str], out_dir: str | Path, kind: str, cfg: CleanConfig,
                 echo: Callable[[str], None] = print) -> dict[str, Any]:
    t0 = time.monotonic()
    out = Path(out_dir).resolve()
    work = out / "_work"
    for sub in ("data", "quarantine", "_work"):
        shutil.rmtree(out / sub, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    remote = {"num_cpus": cfg.num_cpus_per_task}
    # Ray Data's default of 200 shuffle partitions is sized for big clusters; on a 2-core box it spends
    # most of a small run scheduling empty partitions. Two per CPU keeps every core busy.
    partitions = max(2, 2 * int(ray.cluster_resources().get("CPU", 1)))

    chunks = plan_inputs(inputs, kind, echo)
    files = sorted({c.path for c in chunks})
    echo(f"[clean] 1/3 reading and cleaning {len(files)} file(s) in {len(chunks)} chunk(s)")
    ds = ray.data.from_items([asdict(c) for c in chunks], override_num_blocks=max(1, len(chunks)))
    progress = LiveProgress(len(chunks), t0, echo)
    stage1 = ds.map_batches(stage1_chunks, fn_kwargs={"cfg": cfg, "progress": progress.address},
                            batch_format="pyarrow", batch_size=1, **remote)
    with progress:
        stage1.write_parquet(str(work / "stage1"))
    t1 = time.monotonic()

    if not any((work / "stage1").glob("*.parquet")):
        # Inputs with no rows at all (empty files): nothing to dedup or write, but still a report.
        (out / "quarantine").mkdir(mode=0o700)
        shutil.rmtree(work, ignore_errors=True)
        report = build_report(Counter(), [], {"exact": 0, "near": 0}, files, time.monotonic() - t0)
        (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
        echo(format_report(report, out))
        return report

    echo(f"[clean] 2/3 finding duplicates (exact={cfg.dedup.exact}, near={cfg.dedup.near}) "
         f"[{t1 - t0:.1f}s so far]")
    live = (ray.data.read_parquet(str(work / "stage1"))
            .select_columns(["id", "kind", "dropped_by", "exact_hash", "band_keys", "minhash"])
            .filter(expr=col("dropped_by").is_null()))
    keyed = live.map_batches(explode_keys, fn_kwargs={"cfg": cfg}, batch_format="pyarrow", **remote)
    grouped = keyed.repartition(partitions, keys=["key"], sort=True)
    pair_ds = grouped.map_batches(candidate_block, batch_size=None, batch_format="pyarrow", **remote)
    pairs = pa.concat_tables([PAIR_SCHEMA.empty_table(), *ray.get(pair_ds.to_arrow_refs())])
    # Only the signatures of records in a near-duplicate candidate pair come to the driver.
    near = pairs.filter(pc.equal(pairs["how"], "near"))
    wanted = set(near["id"].to_pylist()) | set(near["cand"].to_pylist())
    sigs: dict[str, np.ndarray] = {}
    if wanted:
        sig_ds = (ray.data.read_parquet(str(work / "stage1")).select_columns(["id", "minhash"])
                  .map_batches(signatures_of, fn_kwargs={"wanted_ref": ray.put(wanted)}, batch_format="pyarrow",
                               **remote))
        for t in ray.get(sig_ds.to_arrow_refs()):
            for rid, sig in zip(t["id"].to_pylist(), t["minhash"].to_pylist(), strict=True):
                sigs[rid] = np.frombuffer(sig, dtype=np.uint64)
    marks = decide_marks(pairs, sigs, cfg.dedup.threshold)
    clusters = {how: len({d for d, h in marks.values() if h == how}) for how in ("exact", "near")}
    t2 = time.monotonic()

    echo(f"[clean] 3/3 writing: {len(marks)} duplicates in {sum(clusters.values())} clusters "
         f"[{t2 - t0:.1f}s so far]")
    marks_ref = ray.put(marks)
    final = ray.data.read_parquet(str(work / "stage1")).drop_columns(["band_keys", "minhash", "exact_hash"])
    final = final.map_batches(apply_marks, fn_kwargs={"marks_ref": marks_ref}, batch_format="pyarrow", **remote)
    final.write_parquet(str(work / "stage3"))
    stage3 = str(work / "stage3")

    def read_stage3():
        return ray.data.read_parquet(stage3, override_num_blocks=min(partitions, len(list(Path(stage3).iterdir()))))

    counts: Counter[str] = Counter()
    for row in read_stage3().map_batches(partial_counts, batch_format="pyarrow", **remote).iter_rows():
        counts.update(json.loads(row["counts"]))
    kinds = sorted({k.split(":")[1] for k in counts if k.startswith("kind:")})
    for k in kinds:
        if counts[f"kind:{k}:kept"]:
            kept = (read_stage3().filter(expr=(col("kind") == k) & col("dropped_by").is_null())
                    .map_batches(to_canonical_columns, fn_kwargs={"kind": k}, batch_format="pyarrow", **remote))
            write_sorted(kept, out / "data" / k, "parquet", remote)
    qdir = out / "quarantine"
    qdir.mkdir(mode=0o700)
    quarantine_columns = ["id", "kind", "source_file", "source_line", "dropped_by", "reason", "record", "raw"]
    quarantined = read_stage3().select_columns(quarantine_columns).filter(expr=col("dropped_by").is_not_null())
    write_sorted(quarantined, qdir, "jsonl", remote)
    shutil.rmtree(work)
    wall = time.monotonic() - t0
    report = build_report(counts, kinds, clusters, files, wall)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    record_clean_report(out.parent.name if out.name == "clean" else out.name, report)
    echo(format_report(report, out))
    return report


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
