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

import re
from collections.abc import Callable
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


def check_kind(kind: str) -> None:
    if kind not in KIND_FORMATS:
        raise ValueError(f"unknown data kind {kind!r} (expected one of {', '.join(KIND_FORMATS)})")


def convert_as(row: dict, fmt: str, kind: str) -> list[dict]:
    if fmt not in KIND_FORMATS[kind]:
        raise RecordError(f"a {fmt} record cannot be used as {kind} data "
                          f"(accepted formats: {', '.join(KIND_FORMATS[kind])})")
    return CONVERTERS[fmt](row)


def to_canonical(row: dict, kind: Kind) -> list[dict]:
    """Convert one source row into canonical record(s) of `kind`; RecordError says why it cannot be."""
    check_kind(kind)
    return convert_as(row, detect_format(row), kind)
