"""Source rows (as read by data.chunks) -> canonical record rows with stable ids, as pyarrow tables.

Pure functions: no Ray here; data/clean.py runs them in its Ray Data map.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from medgpt_ray.config import PIIConfig
from medgpt_ray.data.json_record import parse_json_line
from medgpt_ray.data.readers import RecordError, to_canonical

# Every row of the cleaning pipeline has these columns (quarantined and kept alike).
ROW_SCHEMA = pa.schema([
    ("id", pa.string()),
    ("kind", pa.string()),
    ("source_file", pa.string()),
    ("source_line", pa.int64()),
    ("record", pa.string()),  # canonical record JSON; for rows that parsed but could not convert, the
    #                          PII-redacted source row; null for unparseable lines
    ("raw", pa.string()),  # only for lines that did not parse at all (kept raw, quarantine is 0600)
    ("dropped_by", pa.string()),
    ("reason", pa.string()),
])


def record_id(file_no: int, line: int, index: int) -> str:
    """Sortable in reading order: the file's position among the (sorted) inputs, its line, and the record's
    index within that line (Huatuo rows give several). The same inputs always give the same ids, and
    reading order is id order, so writing in order needs no global sort."""
    return f"{file_no:05d}-{line:010d}-{index:03d}"


def id_numbers(ids: pa.Array | pa.ChunkedArray) -> pa.Array:
    """record_id strings as int64 in the same order (file * 10^13 + line * 10^3 + index): the dedup shuffle
    sorts and compares 8-byte numbers instead of 20-character strings. Arrow kernels only."""
    import pyarrow.compute as pc

    ids = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    if len(ids) == 0:
        return pa.array([], pa.int64())
    parts = [pc.cast(pc.utf8_slice_codeunits(ids, a, b), pa.int64()) for a, b in ((0, 5), (6, 16), (17, 20))]
    return pc.add(pc.add(pc.multiply(parts[0], 10**13), pc.multiply(parts[1], 1000)), parts[2])


def id_from_number(n: int) -> str:
    """The record_id string of an id_numbers value."""
    file_no, rest = divmod(n, 10**13)
    return record_id(file_no, *divmod(rest, 1000))


def convert_rows(rows: list[dict[str, Any]], pii: PIIConfig) -> list[dict[str, Any]]:
    from medgpt_ray.data.ops.record import redact_row

    out: list[dict[str, Any]] = []
    for r in rows:
        base = {"kind": r["kind"], "source_file": r["source_file"], "source_line": r["source_line"],
                "raw": None, "dropped_by": None, "reason": None}
        rid = record_id(r["file_no"], r["source_line"], 0)
        if r["error"] is not None:
            out.append({**base, "id": rid, "record": None, "raw": r["raw"], "dropped_by": "reader",
                        "reason": r["error"]})
            continue
        row = parse_json_line(r["text"])
        if isinstance(row, RecordError):
            out.append({**base, "id": rid, "record": None, "raw": row.raw, "dropped_by": "reader",
                        "reason": row.reason})
            continue
        try:
            records = to_canonical(row, r["kind"])
        except RecordError as e:
            redacted = redact_row(row, pii) if pii.enabled else row
            out.append({**base, "id": rid, "record": json.dumps(redacted, ensure_ascii=False),
                        "dropped_by": "reader", "reason": e.reason})
            continue
        for i, rec in enumerate(records):
            out.append({**base, "id": record_id(r["file_no"], r["source_line"], i),
                        "record": json.dumps(rec, ensure_ascii=False)})
    return out


def rows_to_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=ROW_SCHEMA)
