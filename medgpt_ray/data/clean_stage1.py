"""The cleaner's stage-1 files (step 1 of data/clean.py): their schema, how a batch of source rows becomes one
stage-1 table (converted, cleaned, with its dedup features), and what steps 2 and 3 read back from the files.
Pure functions of tables and paths, no Ray: data/clean.py runs them in Ray Data and as Ray tasks.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from medgpt_ray.config import CleanConfig
from medgpt_ray.data.clean_output import finish_rows
from medgpt_ray.data.convert import ROW_SCHEMA, convert_rows, rows_to_table
from medgpt_ray.data.dedup_marks import KEY_COLUMNS, candidate_pairs, explode_keys, partition_keys, signatures_of

FEATURE_FIELDS = [
    ("redactions", pa.string()),
    ("signoffs", pa.int64()),
    ("dedup_keys", pa.list_(pa.uint64())),
    ("minhash", pa.binary()),
]
STAGE1_SCHEMA = pa.schema(list(ROW_SCHEMA) + [pa.field(n, t) for n, t in FEATURE_FIELDS])
FINAL_COLUMNS = [n for n in STAGE1_SCHEMA.names if n not in ("dedup_keys", "minhash")]


# ---- stage 1: convert + clean + dedup features (pure per batch) -----------------------------------
def _with_features(table: pa.Table) -> pa.Table:
    """Give a table every STAGE1 column (missing ones null), in schema order."""
    cols = []
    for f in STAGE1_SCHEMA:
        cols.append(table.column(f.name).cast(f.type) if f.name in table.column_names
                    else pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=STAGE1_SCHEMA)


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


# ---- steps 2 and 3: the bodies of data/clean.py's Ray tasks over the stage-1 files ----------------------
def keys_by_part(path: str, parts: int) -> list[pa.Table]:
    return partition_keys(explode_keys(pq.read_table(path, columns=KEY_COLUMNS)), parts)


def pairs_of_part(*tables: pa.Table) -> pa.Table:
    return candidate_pairs(pa.concat_tables(tables))


def signatures_in(path: str, wanted: pa.Array) -> pa.Table:
    return signatures_of(pq.read_table(path, columns=["id", "minhash"]), wanted)


def finish_file(path: str, marks: pa.Table, chunk_starts: list[str], out_dir: str
                 ) -> tuple[Counter[str], list[list[Any]]]:
    os.umask(0o077)
    return finish_rows(pq.read_table(path, columns=FINAL_COLUMNS), marks, chunk_starts, out_dir)

