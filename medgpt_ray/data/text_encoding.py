"""Text encodings of source files: UTF-8, or GB18030 (a superset of GBK/GB2312, what Toyhom and most Chinese Excel
exports use) when a file is that throughout. Line-oriented files (.jsonl, .txt) are decoded line by line, a CSV file
whole; the encoding of a file is found by streaming it, never by holding it."""

from __future__ import annotations

import codecs
import functools
import itertools
from pathlib import Path

from medgpt_ray.data.compressed import open_bytes, read_all
from medgpt_ray.data.readers import DataFileError, RecordError


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


def decode_csv(path: Path) -> str:
    """UTF-8 (with or without BOM) when the bytes are valid UTF-8, else GB18030 (a superset of GBK/GB2312,
    what Toyhom and most Chinese Excel exports use). Strict UTF-8 first: GB18030 decodes almost any bytes."""
    data = read_all(path)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    try:
        return data.decode("gb18030")
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: neither UTF-8 nor GB18030 (byte {e.start})") from None


def _first_bad_byte(path: Path, encoding: str) -> int | None:
    """Offset of the first byte of `path` that does not decode strictly as `encoding`, None if all do."""
    decoder = codecs.getincrementaldecoder(encoding)("strict")
    position = 0  # bytes handed to the decoder so far
    with open_bytes(path) as fh:
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
    CSV (`decode_csv`); DataFileError naming the file when it is neither. Streams: a corpus may be large."""
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

