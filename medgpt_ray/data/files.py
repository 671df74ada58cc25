"""Reading source files: rows with their line numbers from JSONL, JSON, CSV (UTF-8 or GB18030), Parquet and
plain text (.txt, UTF-8 or GB18030, one {"text": line} per non-empty line), and `load_canonical`, which turns
a set of files into canonical records plus a quarantine list.

Format detection and conversion live in readers.py; this module only knows about files.
"""

from __future__ import annotations

import codecs
import csv
import functools
import io
import itertools
import json
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from medgpt_ray.data.readers import (
    SUFFIXES,
    DataFileError,
    Kind,
    RecordError,
    check_kind,
    convert_as,
    detect_format,
)


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



RowOrError = tuple[int, dict | RecordError]


MAX_JSON_DEPTH = 64  # our formats nest < 10 levels (tools schemas included); a 1,000-deep line is an attack


def _too_deep(obj: object, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether `obj` nests deeper than `limit` (iterative: a deep value must not blow the stack here either)."""
    stack = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (value.values() if isinstance(value, dict) else value))
    return False


def parse_json_line(text: str) -> dict | RecordError:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:  # e.msg is the parser's reason; str(e) would be the same, never the text
        return RecordError(f"invalid JSON: {e.msg} (column {e.colno})", raw=text)
    except RecursionError:
        return RecordError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", raw=text)
    if not isinstance(obj, dict):
        return RecordError(f"JSON value is a {type(obj).__name__}, not an object", raw=text)
    if _too_deep(obj):
        return RecordError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep", raw=text)
    return obj


@functools.lru_cache(maxsize=64)
def fallback_encoding(path: str) -> str | None:
    """For a line-oriented file with a line that is not UTF-8: "gb18030" when the whole file is strict GB18030
    (and so is not UTF-8: a GBK export), else None (then only that line is bad). Looked at once per file and
    process, only when such a line turns up: a UTF-8 corpus never pays the extra pass."""
    try:
        return "gb18030" if txt_encoding(Path(path)) == "gb18030" else None
    except DataFileError:
        return None


def decode_line(raw: bytes, path: str | Path) -> str:
    """A JSONL line's text: UTF-8, or GB18030 when the file is GB18030 throughout. UnicodeDecodeError (of the
    UTF-8 attempt) when neither."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        encoding = fallback_encoding(str(path))
        if encoding is None:
            raise
        return raw.decode(encoding)


def undecodable(raw: bytes, error: UnicodeDecodeError) -> RecordError:
    """A line that is neither: quarantined with its bytes kept (\\xNN for those that do not decode), not U+FFFD."""
    return RecordError(f"line is not valid UTF-8 (byte {error.start})", raw=raw.decode("utf-8", "backslashreplace"))


def _iter_jsonl(path: Path) -> Iterator[RowOrError]:
    with path.open("rb") as fh:
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


def _iter_json(path: Path) -> Iterator[RowOrError]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
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
    for i, item in enumerate(obj, 1):
        if _too_deep(item):
            yield i, RecordError(f"JSON nested more than {MAX_JSON_DEPTH} levels deep")
            continue
        yield i, item if isinstance(item, dict) else RecordError(
            f"array element is a {type(item).__name__}, not an object", raw=json.dumps(item, ensure_ascii=False))


def _decode_csv(path: Path) -> str:
    """UTF-8 (with or without BOM) when the bytes are valid UTF-8, else GB18030 (a superset of GBK/GB2312,
    what Toyhom and most Chinese Excel exports use). Strict UTF-8 first: GB18030 decodes almost any bytes."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("gb18030")
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: neither UTF-8 nor GB18030 (byte {e.start})") from None


def _iter_csv(path: Path) -> Iterator[RowOrError]:
    # Long answers exceed the csv module's default 128 KiB field limit.
    csv.field_size_limit(max(csv.field_size_limit(), 64 * 1024 * 1024))
    reader = csv.reader(io.StringIO(_decode_csv(path), newline=""))
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


def _first_bad_byte(path: Path, encoding: str) -> int | None:
    """Offset of the first byte of `path` that does not decode strictly as `encoding`, None if all do."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    position = 0  # bytes handed to the decoder so far
    with path.open("rb") as fh:
        for block in itertools.chain(iter(lambda: fh.read(1 << 20), b""), [None]):
            pending = len(decoder.getstate()[0])  # an incomplete character kept from the block before
            try:
                decoder.decode(block or b"", final=block is None)
            except UnicodeDecodeError as e:
                return position - pending + e.start
            position += len(block or b"")
    return None


def txt_encoding(path: Path) -> str:
    """"utf-8" when the whole .txt file is strict UTF-8 (a BOM allowed), else "gb18030" when it is that, as for
    CSV (`_decode_csv`); DataFileError naming the file when it is neither. Streams: a corpus may be large."""
    bad = None
    for encoding in ("utf-8", "gb18030"):
        bad = _first_bad_byte(path, encoding)
        if bad is None:
            return encoding
    raise DataFileError(f"{path}: neither UTF-8 nor GB18030 (byte {bad})")


def txt_line(raw: bytes, lineno: int, encoding: str) -> str | None:
    """The text of one physical .txt line (its bytes, with or without the line end), None for a blank line.
    Splitting the bytes at b"\\n" is safe for GB18030 too: no multi-byte character contains that byte."""
    text = raw.decode(encoding).rstrip("\r\n")
    if lineno == 1:
        text = text.removeprefix("\ufeff")  # a BOM (UTF-8, or GB18030's 84 31 95 33)
    return text if text.strip() else None


def _iter_txt(path: Path) -> Iterator[RowOrError]:
    encoding = txt_encoding(path)
    with path.open("rb") as fh:
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
    (line 1) or JSON Lines. Blank .jsonl and .txt lines are skipped, not counted as rows.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataFileError(f"{path}: unsupported file type {path.suffix!r} (expected one of {', '.join(SUFFIXES)})")
    yield from reader(path)


def _unreadable(path: Path) -> DataFileError | None:
    """Why a path we are told to read cannot be: not a regular file (a FIFO would block open() forever, a device
    never end) or no read permission. None when it can."""
    if not path.is_file():
        what = "a FIFO" if path.is_fifo() else "a socket" if path.is_socket() else "not a regular file"
        return DataFileError(f"{path}: {what}; give regular data files")
    if not os.access(path, os.R_OK):
        return DataFileError(f"{path}: permission denied (cannot read it)")
    return None


def _skip_reason(entry: Path) -> str | None:
    """Why a directory entry is not read: hidden, an unsupported suffix, not a regular file. None: read it."""
    if entry.name.startswith("."):
        return "hidden"
    if entry.is_dir():
        return "directory"
    if not entry.is_file():
        return "not a regular file"
    if entry.suffix.lower() not in SUFFIXES:
        return f"unsupported suffix {entry.suffix or '(none)'}"
    return None


def expand_paths(paths: Sequence[str | Path], skipped: list[tuple[Path, str]] | None = None) -> list[Path]:
    """Files to read, in order: directories expand to their data files (recursive, sorted). Entries of a
    directory that are not read (hidden, unsupported suffix, FIFO and the like) are appended to `skipped` with
    the reason, for the caller to list; a path named directly must be a readable regular file, and an
    unreadable file in a directory is an error too (its records would be missing without a word)."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise DataFileError(f"{p}: no such file or directory")
        if p.is_dir():
            found = []
            for entry in sorted(p.rglob("*")):
                if any(part.startswith(".") for part in entry.relative_to(p).parts[:-1]):
                    continue  # inside a hidden directory: the directory itself is listed once
                reason = _skip_reason(entry)
                if reason is None:
                    found.append(entry)
                elif reason != "directory" and skipped is not None:
                    skipped.append((entry, reason))
            if not found:
                raise DataFileError(f"{p}: directory holds no {', '.join(SUFFIXES)} files")
        else:
            found = [p]
        for f in found:
            if (error := _unreadable(f)) is not None:
                raise error
            key = f.resolve()
            if key not in seen:  # a file named directly and through its folder is read once
                seen.add(key)
                out.append(f)
    return out


def describe_skipped(skipped: list[tuple[Path, str]], limit: int = 10) -> list[str]:
    """Lines for the user: how many entries were not read and why, naming up to `limit` of them."""
    if not skipped:
        return []
    lines = [f"{len(skipped)} director{'y entry' if len(skipped) == 1 else 'y entries'} not read:"]
    lines += [f"  {path}: {why}" for path, why in skipped[:limit]]
    if len(skipped) > limit:
        lines.append(f"  ... and {len(skipped) - limit} more")
    return lines


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
