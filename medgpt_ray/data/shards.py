"""The canonical train/held-out split as Parquet, and the shard of it each training worker reads.

File layout: `{kind}.train.parquet` and `{kind}.eval.parquet`, rows in hash order (data/prepare.py), two columns:
`key` (uint64, the first 64 bits of the record's SHA-256: the sort key) and `record` (the canonical record as a
JSON string). One JSON column rather than canonical columns: every consumer turns a record into a Python dict for
the tokenizer anyway, and parts of the canonical schema are free-form (`tools` holds arbitrary JSON function
schemas, exam `options` has per-record keys, optional fields come and go), which typed columns would have to
re-encode as JSON or round-trip lossily (a missing struct field reads back as None). The string column reads back
exactly the record that was written; Parquet still gives row groups, so a worker reads only the part it needs.

Shards: one per training worker, a contiguous range of the hash-ordered train rows. Shard k of N is rows
[k*n // N, (k+1)*n // N): disjoint, together the whole split, sizes differing by at most one, and a function of
(data, N) only. The held-out split is not sharded: every worker reads it whole and HF/accelerate splits the
evaluation across ranks and gathers the metrics, as for any evaluation (it is a small fraction of the corpus,
`data.eval_fraction`, and sharding it would need equal batch counts per rank for the gathers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([("key", pa.uint64()), ("record", pa.string())])
ROW_GROUP = 4096  # rows per row group and per write batch: bounds the writer's memory and a reader's overshoot


def shard_range(n: int, num_shards: int, index: int) -> tuple[int, int]:
    """Rows [start, stop) of shard `index` of `num_shards` over `n` rows."""
    if not 0 <= index < num_shards:
        raise ValueError(f"shard {index} of {num_shards}")
    return index * n // num_shards, (index + 1) * n // num_shards


def num_rows(path: str | Path) -> int:
    return pq.ParquetFile(path).metadata.num_rows


def read_table(path: str | Path, start: int = 0, stop: int | None = None) -> pa.Table:
    """Rows [start, stop) of a split file, reading only the row groups that hold them."""
    pf = pq.ParquetFile(path)
    stop = pf.metadata.num_rows if stop is None else min(stop, pf.metadata.num_rows)
    groups, first, offset = [], None, 0
    for i in range(pf.metadata.num_row_groups):
        rows = pf.metadata.row_group(i).num_rows
        if offset < stop and offset + rows > start:
            groups.append(i)
            first = offset if first is None else first
        offset += rows
    if not groups or stop <= start:
        return SCHEMA.empty_table()
    table = pf.read_row_groups(groups, columns=SCHEMA.names)
    return table.slice(start - first, stop - start)


def read_records(path: str | Path, start: int = 0, stop: int | None = None) -> list[dict[str, Any]]:
    """The canonical records of rows [start, stop), in file (hash) order."""
    return [json.loads(s) for s in read_table(path, start, stop).column("record").to_pylist()]


def read_shard(path: str | Path, num_shards: int, index: int) -> tuple[list[dict[str, Any]], tuple[int, int]]:
    """Shard `index` of `num_shards` of a train split: its records and its row range."""
    rows = shard_range(num_rows(path), num_shards, index)
    return read_records(path, *rows), rows


class SplitWriter:
    """Appends (key, JSON record) rows in bounded batches to an open binary file (the caller makes it private and
    renames it into place)."""

    def __init__(self, fh):
        self._writer = pq.ParquetWriter(fh, SCHEMA, compression="zstd", use_dictionary=False,
                                        write_statistics=["key"])
        self._keys: list[int] = []
        self._records: list[str] = []

    def add(self, key: int, record_json: str) -> None:
        self._keys.append(key)
        self._records.append(record_json)
        if len(self._keys) >= ROW_GROUP:
            self._flush()

    def _flush(self) -> None:
        if self._keys:
            self._writer.write_table(pa.table([pa.array(self._keys, pa.uint64()), pa.array(self._records)],
                                              schema=SCHEMA), row_group_size=ROW_GROUP)
            self._keys, self._records = [], []

    def close(self) -> None:
        self._flush()
        self._writer.close()
