"""The per-record cleaning pipeline and its pyarrow batch adapter (wired into Ray Data by data/clean.py).

Order for one canonical record: normalize (every field) -> strip sign-offs (responses: assistant turns,
chosen, rejected, completion) -> PII redaction (every field) -> quality. A record dropped by quality comes back
PII-redacted (so quarantine never stores personal data) with dropped_by="quality".

Text fields: a pretrain record's "text"; every turn's content (system, user, assistant, tool_call, tool); a
preference record's "chosen"/"rejected"; a prompt record's "answer" when it is not None; an unpaired record's
"completion". A record's `tools`
(function schemas) is not a text field: normalization, sign-offs and quality pass it through unchanged, but PII
redaction maps its string values too (the chat template renders the schemas into the prompt, so they are a
path into training like any turn). The content of a tool_call turn (and of a tool turn that is a JSON object or
array) is JSON: the field functions are applied to its string values (and to integers that they would change,
e.g. a phone stored as a number, which become strings), never to its keys or syntax, so it stays valid JSON; it
is re-serialised (json.dumps, ensure_ascii=False: the readers' canonical form) only when a value changed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import pyarrow as pa

from medgpt_ray.config import CleanConfig, PIIConfig
from medgpt_ray.data.kinds import KINDS
from medgpt_ray.data.ops.normalize import fullwidth_to_halfwidth, normalize_text
from medgpt_ray.data.ops.pii import redact
from medgpt_ray.data.ops.quality import quality_reason
from medgpt_ray.data.ops.signoff import compile_signoffs, strip_signoff

SIGNOFF_ROLES = frozenset({"assistant", "chosen", "rejected", "completion"})
# Turn roles whose content is (or may be) JSON: mapped value by value so that it stays valid JSON.
JSON_ROLES = frozenset({"tool_call", "tool"})
OUTPUT_COLUMNS = ("dropped_by", "reason", "redactions", "signoffs")


@dataclass
class CleanOutcome:
    record: dict | None
    dropped_by: str | None = None
    reason: str | None = None
    redactions: dict[str, int] = field(default_factory=dict)
    signoffs: int = 0


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r} (expected one of {', '.join(KINDS)})")


def text_fields(record: dict, kind: str) -> list[tuple[str, str]]:
    """(label, text) of every text field: "text"; "conversations.<i>.content" (0-based); "chosen"; "rejected";
    "answer" (prompt kind, when not None); "completion" (unpaired kind). `tools` is not a text field."""
    _check_kind(kind)
    if kind == "pretrain":
        return [("text", record["text"])]
    if kind == "exam":
        return [("question", record["question"]), *((f"options.{k}", v) for k, v in record["options"].items())]
    out = [(f"conversations.{i}.content", turn["content"]) for i, turn in enumerate(record["conversations"])]
    if kind == "preference":
        out += [("chosen", record["chosen"]), ("rejected", record["rejected"])]
    elif kind == "prompt" and record.get("answer") is not None:
        out.append(("answer", record["answer"]))
    elif kind == "unpaired":
        out.append(("completion", record["completion"]))
    return out


def _map_json_values(value, fn: Callable[[str], str]):
    """(new value, changed): fn applied to every string value (not to keys) and to integers it changes."""
    if isinstance(value, str):
        new = fn(value)
        return new, new != value
    if isinstance(value, dict):
        out, changed = {}, False
        for k, v in value.items():
            out[k], c = _map_json_values(v, fn)
            changed |= c
        return out, changed
    if isinstance(value, list):
        items = [_map_json_values(v, fn) for v in value]
        return [v for v, _ in items], any(c for _, c in items)
    if isinstance(value, int) and not isinstance(value, bool):  # a phone or card stored as a JSON number
        text = str(value)
        new = fn(text)
        return (value, False) if new == text else (new, True)
    return value, False


def _map_turn(role: str, content: str, fn: Callable[[str, str], str]) -> str:
    if role in JSON_ROLES:
        try:
            obj = json.loads(content)
            if isinstance(obj, (dict, list)):
                new, changed = _map_json_values(obj, lambda text: fn(role, text))
                return json.dumps(new, ensure_ascii=False) if changed else content
        except (TypeError, ValueError, RecursionError):  # not JSON (a plain tool result), or absurdly nested
            pass
    return fn(role, content)


def map_texts(record: dict, kind: str, fn: Callable[[str, str], str]) -> dict:
    """A new record with fn(role, text) applied to every text field; role is text | system | user | assistant |
    tool_call | tool | chosen | rejected | answer | completion (JSON contents of tool_call/tool turns: see the module
    docstring). Other keys (of the record, `tools` included, and of each turn) are copied unchanged; `record` is
    not mutated."""
    _check_kind(kind)
    out = dict(record)
    if kind == "pretrain":
        out["text"] = fn("text", record["text"])
        return out
    if kind == "exam":  # question and options are text; the answer is option letters
        out["question"] = fn("question", record["question"])
        out["options"] = {k: fn("option", v) for k, v in record["options"].items()}
        return out
    out["conversations"] = [{**turn, "content": _map_turn(turn["role"], turn["content"], fn)}
                            for turn in record["conversations"]]
    if kind == "preference":
        out["chosen"] = fn("chosen", record["chosen"])
        out["rejected"] = fn("rejected", record["rejected"])
    elif kind == "prompt" and record.get("answer") is not None:
        out["answer"] = fn("answer", record["answer"])
    elif kind == "unpaired":
        out["completion"] = fn("completion", record["completion"])
    return out


def redact_record(record: dict, kind: str, types: Collection[str]) -> tuple[dict, dict[str, int]]:
    """(a new record, {type: count} for every type in `types`) with every PII item of `types` replaced by its
    placeholder in every text field (map_texts, JSON values of tool_call/tool turns included) and in the string
    values of `tools`. The one record-level redaction: the cleaner (clean_record) and the pipeline's preparation
    of directly given files (data/prepare.py) both call it, so every path into training redacts alike.

    Matching runs on width-folded text (full-width digits would hide a number from the patterns); a field in
    which something was redacted comes back folded, one without PII comes back exactly as it was. Placeholders
    hold no digits and no @, so a record redacted once is not redacted (or counted) again."""
    counts = dict.fromkeys(types, 0)

    def _redact(_role: str, text: str) -> str:
        new, found = redact(fullwidth_to_halfwidth(text), types)
        for t, n in found.items():
            counts[t] += n
        return new if any(found.values()) else text

    out = map_texts(record, kind, _redact)
    if out.get("tools"):
        out["tools"] = _map_json_values(out["tools"], lambda text: _redact("tools", text))[0]
    return out, counts


def clean_record(record: dict, kind: str, cfg: CleanConfig, signoffs: list[re.Pattern]) -> CleanOutcome:
    """normalize -> sign-offs (responses) -> PII -> quality; `signoffs` from `compile_signoffs(cfg.signoff)`."""
    _check_kind(kind)
    if cfg.normalize.enabled:
        record = map_texts(record, kind, lambda _role, text: normalize_text(text, cfg.normalize))

    stripped = 0
    if cfg.signoff.enabled and signoffs:
        def _strip(role: str, text: str) -> str:
            nonlocal stripped
            if role not in SIGNOFF_ROLES:
                return text
            text, n = strip_signoff(text, signoffs)
            stripped += n
            return text

        record = map_texts(record, kind, _strip)

    redactions: dict[str, int] = {}
    if cfg.pii.enabled:
        record, redactions = redact_record(record, kind, cfg.pii.types)

    reason = quality_reason(record, kind, cfg.quality) if cfg.quality.enabled else None
    if reason is not None:
        return CleanOutcome(record, "quality", reason, redactions, stripped)
    return CleanOutcome(record, None, None, redactions, stripped)


def _redact_value(value, cfg: PIIConfig):
    if isinstance(value, str):
        return redact(fullwidth_to_halfwidth(value), cfg.types)[0]
    if isinstance(value, dict):
        return {k: _redact_value(v, cfg) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value(v, cfg) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):  # a phone or card stored as a JSON number
        text = str(value)
        redacted = redact(text, cfg.types)[0]
        return value if redacted == text else redacted
    return value


def redact_row(row: dict, cfg: PIIConfig) -> dict:
    """Redact every string value (and integer that is PII, e.g. a phone stored as a number) of an arbitrary
    source row, recursively, for quarantining rows that parsed but could not be converted. Strings are
    width-folded first (full-width digits would hide a number). Keys are kept. Returns a new dict."""
    if not cfg.enabled or not cfg.types:
        return _copy(row)
    return _redact_value(row, cfg)


def _copy(value):
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def _dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def clean_table(table: pa.Table, kind: str, cfg: CleanConfig) -> pa.Table:
    """Ray Data batch adapter. Input columns: `id` (string), `record` (canonical record JSON) and any others,
    which are passed through. Output: the same rows, `record` replaced by the cleaned (or, when dropped, the
    PII-redacted) record JSON, plus `dropped_by` and `reason` (null when kept), `redactions` (JSON object of
    counts per PII type) and `signoffs` (int64).

    A `record` that is not valid JSON or not a canonical record of `kind` is not raised on (one bad row must
    not fail a block): it gets dropped_by="clean", reason "invalid_record_json" (record null) or
    "invalid_record:<ExceptionType>" (record PII-redacted as a plain row)."""
    _check_kind(kind)
    for name in ("id", "record"):
        if name not in table.column_names:
            raise ValueError(f"clean_table: missing column {name!r} (have {', '.join(table.column_names)})")
    signoffs = compile_signoffs(cfg.signoff)  # cached per phrase list
    out_record: list[str | None] = []
    dropped_by: list[str | None] = []
    reasons: list[str | None] = []
    redactions: list[str] = []
    signoff_counts: list[int] = []
    for raw in table.column("record").to_pylist():
        try:
            record = json.loads(raw) if raw is not None else None
        except (TypeError, ValueError):
            record = None
        if not isinstance(record, dict):
            out_record.append(None)
            dropped_by.append("clean")
            reasons.append("invalid_record_json")
            redactions.append("{}")
            signoff_counts.append(0)
            continue
        try:
            outcome = clean_record(record, kind, cfg, signoffs)
        except (KeyError, TypeError, AttributeError) as e:
            outcome = CleanOutcome(redact_row(record, cfg.pii), "clean", f"invalid_record:{type(e).__name__}")
        out_record.append(None if outcome.record is None else _dumps(outcome.record))
        dropped_by.append(outcome.dropped_by)
        reasons.append(outcome.reason)
        redactions.append(_dumps(outcome.redactions))
        signoff_counts.append(outcome.signoffs)

    columns = {name: table.column(name) for name in table.column_names if name not in OUTPUT_COLUMNS}
    columns["record"] = pa.array(out_record, type=pa.string())
    columns["dropped_by"] = pa.array(dropped_by, type=pa.string())
    columns["reason"] = pa.array(reasons, type=pa.string())
    columns["redactions"] = pa.array(redactions, type=pa.string())
    columns["signoffs"] = pa.array(signoff_counts, type=pa.int64())
    return pa.table(columns)
