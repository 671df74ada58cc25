"""The corpus-cleaning pipeline on Ray Data: read -> canonical -> normalize/sign-offs/PII/quality -> dedup.

Only wiring lives here; every operator is a pure function in data/ops (tested without Ray).

    1. read + convert + clean   streaming over byte-range chunks of the inputs; written to _work/stage1
    2. dedup decisions          exact hash and MinHash-LSH band keys, grouped by key across the cluster
                                (a shuffle of small (key, id) rows, never of the records); each group
                                yields (later, earlier) candidate pairs; near pairs are confirmed on their
                                MinHash signatures (fetched for candidate records only)
    3. apply + count + write    one pass over stage 1: marks applied, report counts taken, and each source
                                chunk's rows (a contiguous range of stable ids (file, line, index), so no
                                global sort) written in id order, per kind to
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

from medgpt_ray.config import CleanConfig
from medgpt_ray.data.chunks import CHUNK_BYTES, SourceChunk, plan_chunks
from medgpt_ray.data.convert import ROW_SCHEMA, convert_rows, record_id, rows_to_table
from medgpt_ray.data.explain import reason_group
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
_TURNS = ("conversations", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
# Function schemas have no fixed shape: a JSON string column (null: no tools), which the readers accept.
_TOOLS = ("tools", pa.string())
CANONICAL_TYPES = {
    "pretrain": [("text", pa.string())],
    "sft": [_TURNS, _TOOLS],
    "preference": [_TURNS, ("chosen", pa.string()), ("rejected", pa.string()), _TOOLS],
    "prompt": [_TURNS, ("answer", pa.string()), _TOOLS],
}


def write_part(batch: pa.Table, out_dir: str | Path, suffix: str) -> list[Any]:
    """Write one id-sorted run as `part-<first id>.<suffix>`; returns [path, first id, last id]. Runs never
    overlap (one source chunk's rows, see finish_block), so file-name order is record order whatever order
    Ray ran the tasks in. Quarantine files are created owner-only (they hold raw lines)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700 if suffix == "jsonl" else 0o755)
    first, last = batch["id"][0].as_py(), batch["id"][-1].as_py()
    path = out_dir / f"part-{first}.{suffix}"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if suffix == "jsonl" else 0o644)
    with os.fdopen(fd, "wb") as fh:
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


def chunk_bytes(chunk: SourceChunk) -> int:
    """Bytes a chunk covers (the progress line's ETA): its byte range, or the whole file."""
    return chunk.end - chunk.start if chunk.end >= 0 else os.path.getsize(chunk.path)


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


CHUNKS_PER_CPU = 4  # a few chunks per core, so one slow chunk does not leave the other cores idle at the end
MIN_CHUNK_BYTES = 256 << 10


def plan_inputs(inputs: list[str], kind: str, echo: Callable[[str], None], cpus: int = 1) -> list[SourceChunk]:
    """Chunks of every input. Chunks are at most CHUNK_BYTES, and smaller when the inputs are small for the
    cluster (a 50 MB corpus on 16 CPUs: ~0.8 MB chunks, so every core gets work)."""
    paths = expand_paths(inputs)
    total = sum(p.stat().st_size for p in paths)
    size = min(CHUNK_BYTES, max(MIN_CHUNK_BYTES, total // (CHUNKS_PER_CPU * max(1, cpus))))
    chunks: list[SourceChunk] = []
    for file_no, path in enumerate(paths):
        if kind == "auto":
            fmt, file_kind = detect_kind(path)
            echo(f"[clean] {path}: detected {fmt} -> {file_kind}")
        else:
            file_kind = kind
        chunks.extend(plan_chunks(path, file_kind, file_no, size))
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
            actor.push.remote({"rows": len(rows), "chunk_done": 1, "bytes": chunk_bytes(SourceChunk(**item))})
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
MARK_SCHEMA = pa.schema([("id", pa.string()), ("dup_of", pa.string()), ("how", pa.string())])
KEY_COLUMNS = ["id", "kind", "dropped_by", "exact_hash", "band_keys"]


def explode_keys(batch: pa.Table, cfg: CleanConfig) -> pa.Table:
    """One small (key, id) row per exact hash and per LSH band of every record no operator dropped; keys carry
    the kind, so a pretraining paragraph is never a duplicate of a conversation. Signatures stay out of the
    shuffle (1 KiB each). Arrow kernels only: no Python per row."""
    live = batch.filter(pc.is_null(batch["dropped_by"]))
    parts = [pa.table({"key": pa.array([], pa.string()), "id": pa.array([], pa.string())})]
    if cfg.dedup.exact:
        parts.append(pa.table({"key": pc.binary_join_element_wise(live["kind"], live["exact_hash"], "|x|"),
                               "id": live["id"]}))
    if cfg.dedup.near and live.num_rows:
        bands = live["band_keys"].combine_chunks()
        owner = pc.list_parent_indices(bands)
        parts.append(pa.table({"key": pc.binary_join_element_wise(live["kind"].take(owner), pc.list_flatten(bands),
                                                                  "|b|"),
                               "id": live["id"].take(owner)}))
    keyed = pa.concat_tables(parts)
    return keyed.filter(pc.is_valid(keyed["key"]))


def group_pairs(ids: list[str], key: str) -> list[tuple[str, str, str]]:
    """Candidate (later id, earlier id, how) pairs of one key group, ids sorted: an exact group points every
    member at its first; an LSH bucket pairs each member with up to MAX_PAIRWISE earlier ones."""
    if "|x|" in key:
        return [(rid, ids[0], "exact") for rid in ids[1:]]
    return [(ids[j], ids[i], "near") for j in range(1, len(ids)) for i in range(min(j, MAX_PAIRWISE))]


def _group_starts(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """Start positions of the runs of equal values in an array."""
    values = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    n = len(values)
    if n == 0:
        return np.zeros(0, np.int64)
    change = pc.not_equal(values.slice(1), values.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return np.flatnonzero(np.concatenate(([True], change)))


def candidate_block(block: pa.Table) -> pa.Table:
    """A block of a key-hash-partitioned, key-sorted shuffle holds whole key groups (what map_groups relies
    on too): find the groups with Arrow and go to Python only for those with two or more members."""
    if block.num_rows < 2:
        return PAIR_SCHEMA.empty_table()
    starts = _group_starts(block["key"])
    sizes = np.diff(np.append(starts, block.num_rows))
    multi = sizes > 1
    if not multi.any():
        return PAIR_SCHEMA.empty_table()
    ids = block["id"].take(np.flatnonzero(np.repeat(multi, sizes))).to_pylist()
    keys = block["key"].take(starts[multi]).to_pylist()
    pairs: list[tuple[str, str, str]] = []
    at = 0
    for key, n in zip(keys, sizes[multi].tolist(), strict=True):
        pairs += group_pairs(sorted(ids[at:at + n]), key)
        at += n
    return pa.table({"id": [p[0] for p in pairs], "cand": [p[1] for p in pairs], "how": [p[2] for p in pairs]},
                    schema=PAIR_SCHEMA)


def signatures_of(batch: pa.Table, wanted_ref) -> pa.Table:
    wanted = ray.get(wanted_ref)  # pa.Array of the ids in a near candidate pair
    return batch.select(["id", "minhash"]).filter(pc.is_in(batch["id"], value_set=wanted))


def decide_marks(pairs: pa.Table, sigs: pa.Table, threshold: float) -> pa.Table:
    """(id, dup_of, how): the earliest record each duplicate repeats, exact|near. Exact pairs stand; near pairs
    must reach the Jaccard threshold on the full signatures (`sigs`: id, minhash). Of several, the smallest
    (dup_of, how) wins: deterministic. Vectorised (numpy over signature rows, Arrow sort)."""
    near = pc.equal(pairs["how"], "near")
    if pairs.num_rows and pc.any(near).as_py():
        cand = pairs.filter(near)
        sig_ids = sigs["id"].combine_chunks()
        mat = np.frombuffer(b"".join(sigs["minhash"].to_pylist()), dtype=np.uint64).reshape(len(sig_ids), -1)
        a = pc.index_in(cand["id"], value_set=sig_ids).to_numpy()
        b = pc.index_in(cand["cand"], value_set=sig_ids).to_numpy()
        similar = np.empty(len(a), dtype=bool)
        for s in range(0, len(a), 8192):
            similar[s:s + 8192] = (mat[a[s:s + 8192]] == mat[b[s:s + 8192]]).mean(axis=1) >= threshold
        pairs = pa.concat_tables([pairs.filter(pc.invert(near)), cand.filter(pa.array(similar))])
    if pairs.num_rows == 0:
        return MARK_SCHEMA.empty_table()
    pairs = pairs.sort_by([("id", "ascending"), ("cand", "ascending"), ("how", "ascending")])
    best = pairs.take(_group_starts(pairs["id"]))
    return pa.Table.from_arrays([best["id"], best["cand"], best["how"]], schema=MARK_SCHEMA)


# ---- stage 3: apply marks, count, write (one pass) ------------------------------------------------
QUARANTINE_COLUMNS = ["id", "kind", "source_file", "source_line", "dropped_by", "reason", "record", "raw"]
FINAL_COLUMNS = [n for n in STAGE1_SCHEMA.names if n not in ("exact_hash", "band_keys", "minhash")]


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


def finish_block(batch: pa.Table, marks_ref, chunk_starts: list[str], out_dir: str) -> pa.Table:
    """Stage 3 for one block of stage 1's output, in one pass: dedup marks applied, report counts taken, and
    each source chunk's rows in the block written in id order as their own parts (kept records per kind as
    canonical Parquet under data/<kind>/, dropped ones to quarantine/, JSONL, 0600). A chunk is a contiguous
    id range, so parts never overlap and need no global sort. Returns one row: counts and parts written."""
    batch = apply_marks(batch.take(pc.sort_indices(batch, [("id", "ascending")])), ray.get(marks_ref))
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
    return pa.table({"counts": [json.dumps(partial_counts(batch))], "parts": [json.dumps(parts)]})


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


# ---- driver --------------------------------------------------------------------------------------
def read_stage1(path: str, columns: list[str], files: int, remote: dict[str, Any]):
    """Stage 1's Parquet, `columns` only, one read task per file (one per source chunk), asking for the same
    resources as the map after it. Through Ray Data's V1 Parquet reader: 2.60's default (V2) bin-packs files
    into read units by size and ignores override_num_blocks (on 16 cores a 100k-record corpus's 64 files became
    one read task, so every pass after stage 1 ran on one core), and lists them through a pool of FooterReader
    actors (32 by default, a process each) for every read."""
    ctx = ray.data.DataContext.get_current()
    v2, ctx.use_datasource_v2 = ctx.use_datasource_v2, False
    try:
        return ray.data.read_parquet(path, columns=columns, override_num_blocks=files, **remote)
    finally:
        ctx.use_datasource_v2 = v2


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
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    partitions = 2 * cpus

    chunks = plan_inputs(inputs, kind, echo, cpus)
    files = sorted({c.path for c in chunks})
    echo(f"[clean] 1/3 reading and cleaning {len(files)} file(s) in {len(chunks)} chunk(s)")
    ds = ray.data.from_items([asdict(c) for c in chunks], override_num_blocks=max(1, len(chunks)))
    progress = LiveProgress(len(chunks), t0, echo, files=len(files), total_bytes=sum(map(chunk_bytes, chunks)))
    stage1 = ds.map_batches(stage1_chunks, fn_kwargs={"cfg": cfg, "progress": progress.address},
                            batch_format="pyarrow", batch_size=1, **remote)
    with progress:
        # The same resources as the map, so Ray Data fuses map and write into one task (no block hand-over).
        stage1.write_parquet(str(work / "stage1"), ray_remote_args=remote)
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
    stage1_dir = str(work / "stage1")
    stage1_files = max(1, len(list((work / "stage1").glob("*.parquet"))))
    keyed = (read_stage1(stage1_dir, KEY_COLUMNS, stage1_files, remote)
             .map_batches(explode_keys, fn_kwargs={"cfg": cfg}, batch_format="pyarrow", **remote))
    # What map_groups does under the hash-shuffle strategy: whole key groups per block, sorted by key.
    grouped = keyed.repartition(partitions, keys=["key"], sort=True)
    pair_ds = grouped.map_batches(candidate_block, batch_size=None, batch_format="pyarrow", **remote)
    pairs = pa.concat_tables([PAIR_SCHEMA.empty_table(), *ray.get(pair_ds.to_arrow_refs())])
    t_pairs = time.monotonic()
    # Only the signatures of records in a near-duplicate candidate pair come to the driver.
    near = pairs.filter(pc.equal(pairs["how"], "near"))
    wanted = pc.unique(pa.chunked_array([*near["id"].chunks, *near["cand"].chunks], pa.string()))
    sigs = pa.table({"id": pa.array([], pa.string()), "minhash": pa.array([], pa.binary())})
    if near.num_rows:
        sig_ds = (read_stage1(stage1_dir, ["id", "minhash"], stage1_files, remote)
                  .map_batches(signatures_of, fn_kwargs={"wanted_ref": ray.put(wanted)}, batch_format="pyarrow",
                               **remote))
        sigs = pa.concat_tables([sigs, *ray.get(sig_ds.to_arrow_refs())], promote_options="permissive")
    t_sigs = time.monotonic()
    marks = decide_marks(pairs, sigs, cfg.dedup.threshold)
    clusters = {how: pc.count_distinct(marks.filter(pc.equal(marks["how"], how))["dup_of"]).as_py()
                for how in ("exact", "near")}
    t2 = time.monotonic()

    echo(f"[clean] 3/3 writing: {marks.num_rows} duplicates in {sum(clusters.values())} clusters "
         f"[{t2 - t0:.1f}s so far]")
    (out / "quarantine").mkdir(mode=0o700)
    final = (read_stage1(stage1_dir, FINAL_COLUMNS, stage1_files, remote)
             .map_batches(finish_block, fn_kwargs={"marks_ref": ray.put(marks), "chunk_starts": chunk_start_ids(chunks),
                                                   "out_dir": str(out)},
                          batch_size=None, batch_format="pyarrow", **remote))
    counts: Counter[str] = Counter()
    parts: list[list[Any]] = []
    for t in ray.get(final.to_arrow_refs()):
        for c, w in zip(t["counts"].to_pylist(), t["parts"].to_pylist(), strict=True):
            counts.update(json.loads(c))
            parts += json.loads(w)
    if merged := merge_overlapping_parts(parts):
        echo(f"[clean] merged {merged} group(s) of overlapping part files")
    kinds = sorted({k.split(":")[1] for k in counts if k.startswith("kind:")})
    shutil.rmtree(work)
    wall = time.monotonic() - t0
    report = build_report(counts, kinds, clusters, files, wall)
    # Where the time went (seconds), to tell a slow operator from a slow shuffle on a new machine.
    report["timings_s"] = {"read_clean": round(t1 - t0, 2), "dedup_shuffle_pairs": round(t_pairs - t1, 2),
                           "dedup_signatures": round(t_sigs - t_pairs, 2), "dedup_decide": round(t2 - t_sigs, 2),
                           "apply_write": round(time.monotonic() - t2, 2)}
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
