"""Split source files into pieces that Ray Data read tasks can take in parallel, keeping line numbers.

A large JSONL file, or a large UTF-8 .txt file, is cut at newline boundaries into byte ranges; each range
knows the line number it starts at, so every record keeps its true `source_line` for the report and the
quarantine. Other files (a JSON array, CSV, Parquet, a GB18030 .txt, any compressed file) are read whole by one
task.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from medgpt_ray.data.compressed import compression
from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.readers import RecordError
from medgpt_ray.data.text_encoding import decode_line, txt_encoding, txt_line, undecodable

CHUNK_BYTES = 4 << 20  # ~8k dialogue records: enough chunks to keep every core busy


@dataclass(frozen=True)
class SourceChunk:
    path: str
    kind: str
    file_no: int = 0  # position among the run's input files: the first part of every record id
    start: int = 0  # byte offsets [start, end); end -1 = whole file (read with file_rows.iter_rows)
    end: int = -1
    first_line: int = 1


def _splittable(path: Path) -> bool:
    """Line-oriented files whose lines decode independently: JSONL, and .txt when it is UTF-8 (checked once
    here, for the whole file; a GB18030 .txt is read whole). Not a compressed one: its byte offsets are not lines'."""
    if compression(path):
        return False
    suffix = path.suffix.lower()
    return suffix == ".jsonl" or (suffix == ".txt" and txt_encoding(path) == "utf-8")


def plan_chunks(path: Path, kind: str, file_no: int, chunk_bytes: int = CHUNK_BYTES) -> list[SourceChunk]:
    path = Path(path)
    if not _splittable(path):
        return [SourceChunk(str(path), kind, file_no)]
    size = path.stat().st_size
    chunks: list[SourceChunk] = []
    start, line = 0, 1
    with path.open("rb") as fh:
        while start < size:
            fh.seek(min(start + chunk_bytes, size))
            fh.readline()  # run on to the end of the line the cut fell into
            end = min(fh.tell(), size) if start + chunk_bytes < size else size
            fh.seek(start)
            newlines = fh.read(end - start).count(b"\n")
            chunks.append(SourceChunk(str(path), kind, file_no, start, end, line))
            line += newlines
            start = end
    return chunks or [SourceChunk(str(path), kind, file_no, 0, 0, 1)]


def _row(chunk: SourceChunk, line: int, text: str | None, error: RecordError | None) -> dict:
    return {"file_no": chunk.file_no, "source_file": chunk.path, "source_line": line, "kind": chunk.kind, "text": text,
            "error": error.reason if error else None, "raw": error.raw if error else None}


def read_chunk(chunk: SourceChunk) -> Iterator[dict]:
    """Rows of one chunk: the source row as JSON text, or the parse error (raw kept only then).

    A .txt line comes back as the JSON text of {"text": line}, exactly the row file_rows.iter_rows gives for it."""
    if chunk.end < 0:
        for line, row in iter_rows(Path(chunk.path)):
            if isinstance(row, RecordError):
                yield _row(chunk, line, None, row)
            else:
                yield _row(chunk, line, json.dumps(row, ensure_ascii=False, default=str), None)
        return
    is_txt = Path(chunk.path).suffix.lower() == ".txt"
    with open(chunk.path, "rb") as fh:
        fh.seek(chunk.start)
        data = fh.read(chunk.end - chunk.start)
    for offset, raw in enumerate(data.split(b"\n")):
        line = chunk.first_line + offset
        try:
            if is_txt:
                text = txt_line(raw, line, "utf-8")
                if text is not None:
                    yield _row(chunk, line, json.dumps({"text": text}, ensure_ascii=False), None)
                continue
            if line == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            raw = raw.rstrip(b"\r")
            if not raw.strip():
                continue
            yield _row(chunk, line, decode_line(raw, chunk.path), None)
        except UnicodeDecodeError as e:  # a .txt changed since plan_chunks checked it would land here too
            yield _row(chunk, line, None, undecodable(raw, e))
