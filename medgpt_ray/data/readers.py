"""Source formats -> canonical records (see ARCHITECTURE.md, "Canonical data records").

Canonical records:

    pretrain:    {"text": str}
    sft:         {"conversations": [{"role": "system"|"user"|"assistant", "content": str}, ...]}
    preference:  {"conversations": [...prompt turns, ending with a user turn...], "chosen": str, "rejected": str}

Source formats understood (`detect_format` names):

    text                   {"text": ...}, or any record with a single string field (e.g. a one-column CSV)
    sharegpt               MedicalGPT ShareGPT {"conversations": [{"from": "human"|"gpt"|"system", "value"}]}
    canonical_sft          {"conversations": [{"role", "content"}]}
    alpaca                 {"instruction", "input", "output"} (+ optional "history" [[q, a], ...], "system");
                           shibing624/medical finetune has this shape
    reward                 shibing624/medical reward {"question", "response_chosen", "response_rejected"}
                           (+ optional "system", "history")
    canonical_preference   {"conversations", "chosen", "rejected"}
    huatuo                 Huatuo-26M {"questions": [[q, paraphrase, ...], ...], "answers": [a, ...]}
    toyhom                 Toyhom CSV rows {"department", "title", "ask", "answer"}

Every error raised for a record says why it cannot be used and never quotes the record's text: these
messages end up in reports and logs (ARCHITECTURE.md, data cleaning semantics).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Kind = Literal["pretrain", "sft", "preference"]

FORMATS = ("text", "sharegpt", "canonical_sft", "alpaca", "reward", "canonical_preference", "huatuo", "toyhom")
KIND_FORMATS: dict[str, tuple[str, ...]] = {
    "pretrain": ("text",),
    "sft": ("sharegpt", "canonical_sft", "alpaca", "huatuo", "toyhom"),
    "preference": ("reward", "canonical_preference"),
}
SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")

SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "system": "system"}
CANONICAL_ROLES = ("system", "user", "assistant")


class RecordError(ValueError):
    """Why a single source record cannot be used. The message is the reason only, never record text.

    `raw` carries the original line for records that could not even be parsed, so that the caller can
    keep it in an owner-only quarantine file; it is never part of the message.
    """

    def __init__(self, reason: str, raw: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.raw = raw


class DataFileError(ValueError):
    """A problem with a whole file (missing, unreadable, wrong type); the message names the file."""


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


# --------------------------------------------------------------------------------------------------
# Format detection
# --------------------------------------------------------------------------------------------------


def _safe_name(value: object) -> str:
    """A role or field name fit to appear in an error message: short identifiers only, never free text."""
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_\-]{0,31}", value):
        return repr(value)
    return f"<{type(value).__name__} value>"


def _conversation_style(conv: object) -> str:
    if not isinstance(conv, list):
        raise RecordError(f"'conversations' is a {type(conv).__name__}, not a list")
    if not conv:
        raise RecordError("'conversations' is empty")
    first = conv[0]
    if not isinstance(first, dict):
        raise RecordError("turn 1 is not an object")
    if "from" in first or "value" in first:
        return "sharegpt"
    if "role" in first or "content" in first:
        return "canonical_sft"
    raise RecordError("conversation turns have neither from/value nor role/content fields")


def detect_format(row: dict) -> str:
    """Name the source format of one record (see the module docstring); RecordError if none fits.

    Detection looks at the distinguishing field of each format, not at the full set, so that a record
    missing a required field is reported as "missing field X" by `to_canonical` rather than as unknown.
    """
    if not isinstance(row, dict):
        raise RecordError(f"record is a {type(row).__name__}, not an object")
    keys = set(row)
    if "conversations" in keys:
        if "chosen" in keys or "rejected" in keys:
            return "canonical_preference"
        return _conversation_style(row["conversations"])
    if "response_chosen" in keys or "response_rejected" in keys:
        return "reward"
    if "questions" in keys:
        return "huatuo"
    if "instruction" in keys:
        return "alpaca"
    if "ask" in keys:
        return "toyhom"
    if "text" in keys:
        return "text"
    if len(row) == 1 and isinstance(next(iter(row.values())), str):
        return "text"
    names = ", ".join(sorted(_safe_name(k) for k in keys)) or "none"
    raise RecordError(f"unrecognised record format (fields: {names})")


# --------------------------------------------------------------------------------------------------
# Field helpers
# --------------------------------------------------------------------------------------------------


def _content(value: object, where: str) -> str:
    if value is None:
        raise RecordError(f"missing {where}")
    if not isinstance(value, str):
        raise RecordError(f"{where} is a {type(value).__name__}, not a string")
    text = value.strip()
    if not text:
        raise RecordError(f"empty {where}")
    return text


def _required(row: dict, key: str) -> str:
    if key not in row:
        raise RecordError(f"missing field '{key}'")
    return _content(row[key], f"field '{key}'")


def _optional(row: dict, key: str) -> str:
    """An optional string field: absent, None or blank all mean "not given"."""
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RecordError(f"field '{key}' is a {type(value).__name__}, not a string")
    return value.strip()


def _turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def _history_turns(row: dict) -> list[dict]:
    """Alpaca/reward "history": [[question, answer], ...] earlier exchanges, placed before the last one."""
    history = row.get("history")
    if history is None:
        return []
    if not isinstance(history, list):
        raise RecordError(f"field 'history' is a {type(history).__name__}, not a list")
    turns = []
    for i, pair in enumerate(history, 1):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise RecordError(f"history item {i} is not a [question, answer] pair")
        turns.append(_turn("user", _content(pair[0], f"history item {i} question")))
        turns.append(_turn("assistant", _content(pair[1], f"history item {i} answer")))
    return turns


def _system_turns(row: dict) -> list[dict]:
    system = _optional(row, "system")
    return [_turn("system", system)] if system else []


def _check_roles(turns: list[dict], last: str) -> None:
    """Roles alternate user/assistant after an optional leading system turn; the last turn is `last`."""
    offset = 1 if turns and turns[0]["role"] == "system" else 0
    body = turns[offset:]
    if not body:
        raise RecordError("no user turn")
    for i, turn in enumerate(body):
        expected = "user" if i % 2 == 0 else "assistant"
        if turn["role"] != expected:
            where = f"turn {i + offset + 1}"
            if turn["role"] == "system":
                raise RecordError(f"{where}: a system turn is only allowed first")
            raise RecordError(f"{where}: expected {expected}, got {turn['role']} "
                              "(roles must alternate user/assistant after an optional system turn)")
    if body[-1]["role"] != last:
        what, article = ("conversation", "an") if last == "assistant" else ("prompt", "a")
        raise RecordError(f"{what} must end with {article} {last} turn, ends with {body[-1]['role']}")


def _turn_list(conv: object) -> list:
    if not isinstance(conv, list):
        raise RecordError(f"'conversations' is a {type(conv).__name__}, not a list")
    if not conv:
        raise RecordError("'conversations' is empty")
    return conv


def _sharegpt_turns(conv: object) -> list[dict]:
    turns = []
    for i, t in enumerate(_turn_list(conv), 1):
        if not isinstance(t, dict):
            raise RecordError(f"turn {i} is not an object")
        if "from" not in t:
            raise RecordError(f"turn {i}: missing 'from'")
        role = SHAREGPT_ROLES.get(t["from"]) if isinstance(t["from"], str) else None
        if role is None:
            raise RecordError(f"turn {i}: unsupported role {_safe_name(t['from'])} "
                              f"(expected one of {', '.join(SHAREGPT_ROLES)})")
        turns.append(_turn(role, _content(t.get("value"), f"turn {i} value")))
    return turns


def _canonical_turns(conv: object) -> list[dict]:
    turns = []
    for i, t in enumerate(_turn_list(conv), 1):
        if not isinstance(t, dict):
            raise RecordError(f"turn {i} is not an object")
        if "role" not in t:
            raise RecordError(f"turn {i}: missing 'role'")
        if t["role"] not in CANONICAL_ROLES:
            raise RecordError(f"turn {i}: unsupported role {_safe_name(t['role'])} "
                              f"(expected one of {', '.join(CANONICAL_ROLES)})")
        turns.append(_turn(t["role"], _content(t.get("content"), f"turn {i} content")))
    return turns


def _preference(prompt: list[dict], chosen: str, rejected: str) -> dict:
    _check_roles(prompt, last="user")
    if chosen == rejected:
        raise RecordError("chosen and rejected responses are identical")
    return {"conversations": prompt, "chosen": chosen, "rejected": rejected}


def _sft(turns: list[dict]) -> dict:
    _check_roles(turns, last="assistant")
    return {"conversations": turns}


# --------------------------------------------------------------------------------------------------
# Converters: one per format, each returns the canonical records of one source row
# --------------------------------------------------------------------------------------------------


def _from_text(row: dict) -> list[dict]:
    if "text" in row:
        return [{"text": _required(row, "text")}]
    (key, value), = row.items()  # detect_format guarantees a single string field here
    return [{"text": _content(value, f"field {_safe_name(key)}")}]


def _from_sharegpt(row: dict) -> list[dict]:
    return [_sft(_sharegpt_turns(row["conversations"]))]


def _from_canonical_sft(row: dict) -> list[dict]:
    return [_sft(_canonical_turns(row["conversations"]))]


def _from_alpaca(row: dict) -> list[dict]:
    instruction = _required(row, "instruction")
    extra = _optional(row, "input")
    user = f"{instruction}\n{extra}" if extra else instruction
    last = [_turn("user", user), _turn("assistant", _required(row, "output"))]
    return [_sft(_system_turns(row) + _history_turns(row) + last)]


def _from_reward(row: dict) -> list[dict]:
    prompt = _system_turns(row) + _history_turns(row) + [_turn("user", _required(row, "question"))]
    return [_preference(prompt, _required(row, "response_chosen"), _required(row, "response_rejected"))]


def _from_canonical_preference(row: dict) -> list[dict]:
    prompt = _canonical_turns(row["conversations"])
    return [_preference(prompt, _required(row, "chosen"), _required(row, "rejected"))]


def _from_huatuo(row: dict) -> list[dict]:
    """Each question group holds paraphrases of one question; every paraphrase becomes its own record
    paired with the group's answer (so one source row gives several canonical records)."""
    questions, answers = row.get("questions"), row.get("answers")
    if not isinstance(questions, list):
        raise RecordError("field 'questions' is missing or not a list")
    if not isinstance(answers, list):
        raise RecordError("field 'answers' is missing or not a list")
    if not questions:
        raise RecordError("field 'questions' is empty")
    if len(questions) != len(answers):
        raise RecordError(f"question groups and answers differ in number ({len(questions)} vs {len(answers)})")
    out = []
    for g, (group, answer) in enumerate(zip(questions, answers, strict=True), 1):
        answer_text = _content(answer, f"answer {g}")
        paraphrases = [group] if isinstance(group, str) else group
        if not isinstance(paraphrases, list) or not paraphrases:
            raise RecordError(f"question group {g} is not a non-empty list")
        for p, q in enumerate(paraphrases, 1):
            question = _content(q, f"question {g}.{p}")
            out.append(_sft([_turn("user", question), _turn("assistant", answer_text)]))
    return out


def _from_toyhom(row: dict) -> list[dict]:
    title, ask = _optional(row, "title"), _required(row, "ask")
    user = f"{title}\n{ask}" if title else ask
    return [_sft([_turn("user", user), _turn("assistant", _required(row, "answer"))])]


CONVERTERS: dict[str, Callable[[dict], list[dict]]] = {
    "text": _from_text,
    "sharegpt": _from_sharegpt,
    "canonical_sft": _from_canonical_sft,
    "alpaca": _from_alpaca,
    "reward": _from_reward,
    "canonical_preference": _from_canonical_preference,
    "huatuo": _from_huatuo,
    "toyhom": _from_toyhom,
}


def _check_kind(kind: str) -> None:
    if kind not in KIND_FORMATS:
        raise ValueError(f"unknown data kind {kind!r} (expected one of {', '.join(KIND_FORMATS)})")


def _convert(row: dict, fmt: str, kind: str) -> list[dict]:
    if fmt not in KIND_FORMATS[kind]:
        raise RecordError(f"a {fmt} record cannot be used as {kind} data "
                          f"(accepted formats: {', '.join(KIND_FORMATS[kind])})")
    return CONVERTERS[fmt](row)


def to_canonical(row: dict, kind: Kind) -> list[dict]:
    """Convert one source row into canonical record(s) of `kind`; RecordError says why it cannot be."""
    _check_kind(kind)
    return _convert(row, detect_format(row), kind)


# --------------------------------------------------------------------------------------------------
# Reading files
# --------------------------------------------------------------------------------------------------

RowOrError = tuple[int, dict | RecordError]


def _parse_json_line(text: str) -> dict | RecordError:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:  # e.msg is the parser's reason; str(e) would be the same, never the text
        return RecordError(f"invalid JSON: {e.msg} (column {e.colno})", raw=text)
    if not isinstance(obj, dict):
        return RecordError(f"JSON value is a {type(obj).__name__}, not an object", raw=text)
    return obj


def _iter_jsonl(path: Path) -> Iterator[RowOrError]:
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a UTF-8 BOM from Windows editors
            raw = raw.rstrip(b"\r\n")
            if not raw.strip():
                continue  # blank lines hold no record
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield lineno, RecordError(f"line is not valid UTF-8 (byte {e.start})",
                                          raw=raw.decode("utf-8", "replace"))
                continue
            yield lineno, _parse_json_line(text)


def _iter_json(path: Path) -> Iterator[RowOrError]:
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataFileError(f"{path}: not valid UTF-8 (byte {e.start})") from None
    try:
        obj = json.loads(text)
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
    ".jsonl": _iter_jsonl, ".json": _iter_json, ".csv": _iter_csv, ".parquet": _iter_parquet,
}


def iter_rows(path: Path) -> Iterator[tuple[int, dict | RecordError]]:
    """Yield (line, row) for every source row of a file, or (line, RecordError) for one that does not parse.

    "line" is the physical line (1-based) for .jsonl, the array index + 1 for .json, the data row number
    (1-based, header and blank lines not counted) for .csv and the row index + 1 for .parquet. A .json file
    may also hold a single object (line 1) or JSON Lines. Blank .jsonl lines are skipped, not counted as rows.
    """
    path = Path(path)
    if not path.is_file():
        raise DataFileError(f"{path}: no such file")
    reader = READERS.get(path.suffix.lower())
    if reader is None:
        raise DataFileError(f"{path}: unsupported file type {path.suffix!r} (expected one of {', '.join(SUFFIXES)})")
    yield from reader(path)


def expand_paths(paths: Sequence[str | Path]) -> list[Path]:
    """Files to read, in order: directories expand to their data files (recursive, sorted, hidden skipped)."""
    out: list[Path] = []
    seen: set[Path] = set()
    for p in map(Path, paths):
        if not p.exists():
            raise DataFileError(f"{p}: no such file or directory")
        if p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in SUFFIXES
                           and not any(part.startswith(".") for part in f.relative_to(p).parts))
            if not found:
                raise DataFileError(f"{p}: directory holds no {', '.join(SUFFIXES)} files")
        else:
            found = [p]
        for f in found:
            key = f.resolve()
            if key not in seen:  # a file named directly and through its folder is read once
                seen.add(key)
                out.append(f)
    return out


def load_canonical(paths: Sequence[str | Path], kind: Kind) -> LoadResult:
    """Read every source row of `paths` as `kind` data: each is converted or quarantined, never dropped."""
    _check_kind(kind)
    result = LoadResult()
    for path in expand_paths(paths):
        name = str(path)
        counts: dict[str, int] = result.detected.setdefault(name, {})
        for line, row in iter_rows(path):
            result.source_count += 1
            if isinstance(row, RecordError):
                counts["unparseable"] = counts.get("unparseable", 0) + 1
                result.quarantined.append(Quarantined(name, line, row.reason, row.raw))
                continue
            try:
                fmt = detect_format(row)
            except RecordError as e:
                counts["unknown"] = counts.get("unknown", 0) + 1
                result.quarantined.append(Quarantined(name, line, e.reason))
                continue
            counts[fmt] = counts.get(fmt, 0) + 1
            try:
                result.records.extend(_convert(row, fmt, kind))
            except RecordError as e:
                result.quarantined.append(Quarantined(name, line, e.reason))
    return result
