"""The rows of one source file, with their line numbers: JSONL, JSON, CSV (UTF-8 or GB18030), Parquet and plain
text (.txt, UTF-8 or GB18030, one {"text": line} per non-empty line); the text formats also gzip, bzip2 or xz
compressed (data/compressed.py). A row that does not parse comes back as its
RecordError, in its place; a file that cannot be read at all raises DataFileError.

Format detection and conversion live in readers.py; this module only knows about files.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path

from medgpt_ray.data.compressed import (
    STREAM_ERRORS,
    SUPPORTED,
    compression,
    data_suffix,
    open_bytes,
    read_all,
    readable_suffix,
    stream_error,
)
from medgpt_ray.data.json_record import MAX_JSON_DEPTH, parse_json_line, too_deep
from medgpt_ray.data.readers import DataFileError, RecordError
from medgpt_ray.data.text_encoding import decode_csv, decode_line, txt_encoding, txt_line, undecodable

RowOrError = tuple[int, dict | RecordError]


def _iter_jsonl(path: Path) -> Iterator[RowOrError]:
    if _spread_array(path) and (array := _whole_array(path)) is not None:
        yield from _array_rows(array)  # a JSON array saved as .jsonl: its records, not its lines quarantined
        return
    with open_bytes(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM from Windows editors
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue  # blank lines hold no record
            try:
                text = decode_line(raw, path)
            except UnicodeDecodeError as e:
                yield lineno, undecodable(raw, e)
                continue
            yield lineno, parse_json_line(text)


def _spread_array(path: Path) -> bool:
    """Whether a .jsonl file is one JSON array over several lines (pretty-printed): its first line that is not blank
    opens an array it does not close. A line that is a whole array stays a JSON Lines row (quarantined: no object)."""
    with open_bytes(path) as fh:
        for raw in fh:
            line = raw.removeprefix(b"\xef\xbb\xbf").strip()
            if not line:
                continue
            if not line.startswith(b"["):
                return False
            try:
                json.loads(line)
            except ValueError:
                return True
            return False
    return False


def _iter_json(path: Path) -> Iterator[RowOrError]:
    try:
        text = read_all(path).decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text)
    except RecursionError:
        raise DataFileError(f"{path}: JSON nested more than {MAX_JSON_DEPTH} levels deep") from None
    except json.JSONDecodeError as e:
        if text.lstrip().startswith("{"):  # JSON Lines saved as .json, as `datasets` also accepts
            yield from _iter_jsonl(path)
            return
        raise DataFileError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    if isinstance(obj, dict):  # a single record
        yield 1, obj
        return
    if not isinstance(obj, list):
        raise DataFileError(f"{path}: top-level JSON value is a {type(obj).__name__}, expected an array of records")
    yield from _array_rows(obj)


def _whole_array(path: Path) -> list | None:
    """The file read whole as one JSON array, or None where it is not one (then it is read as JSON Lines)."""
    try:
        obj = json.loads(read_all(path).decode("utf-8-sig"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, nested past the stack
        return None
    return obj if isinstance(obj, list) else None


def _array_rows(obj: list) -> Iterator[RowOrError]:
    """An array's elements as rows, numbered from 1: objects, or a reason."""
    for i, item in enumerate(obj, 1):
        if too_deep(item):
            yield i, RecordError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
            continue
        yield i, item if isinstance(item, dict) else RecordError(
            f"array element is a {type(item).__name__}, not an object", raw=json.dumps(item, ensure_ascii=False))


def _iter_csv(path: Path) -> Iterator[RowOrError]:
    # Long answers exceed the csv module's default 128 KiB field limit.
    csv.field_size_limit(max(csv.field_size_limit(), 64 * 1024 * 1024))
    reader = csv.reader(io.StringIO(decode_csv(path), newline=""))
    try:
        header = next(reader, None)
        if header is None:
            return
        header = [h.strip() for h in header]
        if any(not h for h in header) or len(set(header)) != len(header):
            raise DataFileError(f"{path}: header has empty or repeated column names")
        number = 0
        for row in reader:
            if not row:
                continue  # blank line
            number += 1
            if len(row) != len(header):
                buf = io.StringIO()
                csv.writer(buf).writerow(row)
                yield number, RecordError(f"row has {len(row)} fields, header has {len(header)}",
                                          raw=buf.getvalue().rstrip("\r\n"))
                continue
            yield number, dict(zip(header, row, strict=True))
    except csv.Error as e:
        raise DataFileError(f"{path}: CSV error near line {reader.line_num}: {e}") from None


def _iter_txt(path: Path) -> Iterator[RowOrError]:
    encoding = txt_encoding(path)
    with open_bytes(path) as fh:
        for lineno, raw in enumerate(fh, 1):
            text = txt_line(raw, lineno, encoding)
            if text is not None:
                yield lineno, {"text": text}


def _iter_parquet(path: Path) -> Iterator[RowOrError]:
    import pyarrow.parquet as pq  # imported here: the JSON/CSV readers must not need pyarrow

    try:
        pf = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise DataFileError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
    index = 0
    for batch in pf.iter_batches(batch_size=1024):
        for row in batch.to_pylist():
            index += 1
            yield index, row


READERS: dict[str, Callable[[Path], Iterator[RowOrError]]] = {
    ".jsonl": _iter_jsonl, ".json": _iter_json, ".csv": _iter_csv, ".parquet": _iter_parquet, ".txt": _iter_txt,
}


def iter_rows(path: Path) -> Iterator[tuple[int, dict | RecordError]]:
    """Yield (line, row) for every source row of a file, or (line, RecordError) for one that does not parse.

    "line" is the physical line (1-based) for .jsonl, the array index + 1 for .json, the data row number
    (1-based, header and blank lines not counted) for .csv, the row index + 1 for .parquet and the physical
    line for .txt (each non-empty line is the row {"text": line}). A .json file may also hold a single object
    (line 1) or JSON Lines. Blank .jsonl and .txt lines are skipped, not counted as rows. A compressed file's
    lines are those of the file it holds.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    if not readable_suffix(path):
        raise DataFileError(f"{path}: unsupported file type {''.join(path.suffixes[-2:])!r} (expected {SUPPORTED})")
    reader = READERS[data_suffix(path)]
    if compression(path) is None:
        yield from reader(path)
        return
    try:
        yield from reader(path)
    except STREAM_ERRORS as e:  # a truncated download, or a file that is not the compression its name says
        raise stream_error(path, e) from None

