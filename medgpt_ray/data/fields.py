"""Field helpers of the readers (data/readers.py): a source record's strings, turns, tools, responses and labels,
each checked, every error a RecordError that says why and never quotes the record's text."""

from __future__ import annotations

import json
from collections.abc import Sequence

from medgpt_ray.data.kinds import RecordError, safe_name
from medgpt_ray.templates import ROLES, parse_tool_calls, turn_order_error

SHAREGPT_ROLES = {
    "human": "user", "user": "user",
    "gpt": "assistant", "assistant": "assistant",
    "system": "system",
    "function_call": "tool_call", "tool_call": "tool_call",
    "observation": "tool", "tool": "tool", "function": "tool",
}
CANONICAL_ROLES = ROLES

TOOLS_ERROR = "field 'tools' is not a JSON list of objects"


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


def parse_tools(value: object) -> list[dict]:
    """`tools` as a list of function schemas (passed through unchanged). Sources give a list or the JSON text
    of one (MedicalGPT; the cleaner's Parquet); None, "", "[]" and [] all mean no tools."""
    if value is None:
        return []
    if isinstance(value, str):
        if not value.strip():
            return []
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RecordError(TOOLS_ERROR) from None
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise RecordError(TOOLS_ERROR)
    return value


def canonical_tool_call(value: object) -> str | None:
    """The canonical text of a function call (templates.parse_tool_calls reads it): json.dumps (ensure_ascii=False)
    of {"name", "arguments": object}, or of a list of them. None when `value` is no such JSON. Idempotent."""
    parsed = parse_tool_calls(value)
    if parsed is None:
        return None
    calls, many = parsed
    out = [{"name": name, "arguments": arguments} for name, arguments in calls]
    return json.dumps(out if many else out[0], ensure_ascii=False)


def check_turn_order(turns: Sequence[dict], last: str) -> None:
    """RecordError when `turns` break the order rule (templates.turn_order_error)."""
    error = turn_order_error([t["role"] for t in turns], last)
    if error:
        raise RecordError(error)


def _turn_list(conv: object) -> list:
    if not isinstance(conv, list):
        raise RecordError(f"'conversations' is a {type(conv).__name__}, not a list")
    if not conv:
        raise RecordError("'conversations' is empty")
    return conv


STYLES = {  # turn style -> (role key, text key, source role -> canonical role)
    "sharegpt": ("from", "value", SHAREGPT_ROLES),
    "canonical": ("role", "content", {r: r for r in CANONICAL_ROLES}),
}


def _parse_turns(conv: object, style: str) -> list[dict]:
    role_key, text_key, roles = STYLES[style]
    turns = []
    for i, t in enumerate(_turn_list(conv), 1):
        if not isinstance(t, dict):
            raise RecordError(f"turn {i} is not an object")
        if role_key not in t:
            raise RecordError(f"turn {i}: missing '{role_key}'")
        source_role = t[role_key]
        role = roles.get(source_role) if isinstance(source_role, str) else None
        if role is None:
            raise RecordError(f"turn {i}: unsupported role {safe_name(source_role)} "
                              f"(expected one of {', '.join(roles)})")
        if role == "tool_call":
            value = t.get(text_key)
            if not isinstance(value, (dict, list)):
                _content(value, f"turn {i} {text_key}")  # missing / not a string / empty
            content = canonical_tool_call(value)
            if content is None:
                raise RecordError(f"turn {i}: {source_role} is not a JSON {{name, arguments}} object")
        else:
            content = _content(t.get(text_key), f"turn {i} {text_key}")
        turns.append(_turn(role, _with_reasoning(t, role, content, i)))
    return turns


def _with_reasoning(turn: dict, role: str, content: str, i: int | str) -> str:
    """An assistant turn's `reasoning_content` (the field HF chat templates and reasoning datasets use) written into
    its content as a `<think>` block, the form Qwen3's template renders and parses back: one text, so cleaning, PII
    redaction and dedup see the reasoning as they see the answer, and a template without reasoning support trains it
    as text instead of dropping it (templates/jinja_messages.py: a thinking template finds the block)."""
    value = turn.get("reasoning_content")
    if value is None:
        return content
    if role != "assistant":
        raise RecordError(f"turn {i}: reasoning_content on a {role} turn (only an assistant turn reasons)")
    where = f"turn {i}" if isinstance(i, int) else f"field '{i}'"
    reasoning = _content(value, f"{where} reasoning_content")
    if "<think>" in content:
        raise RecordError(f"{where}: both reasoning_content and a <think> block in the content")
    return f"<think>\n{reasoning}\n</think>\n\n{content}"


def _conversation(row: dict, style: str) -> tuple[list[dict], list[dict]]:
    """(turns, tools) of a conversation record; a top-level "system" string becomes the first turn."""
    turns = _parse_turns(row["conversations"], style)
    system = _optional(row, "system")
    if system:
        if turns[0]["role"] == "system":
            raise RecordError("both a 'system' field and a system turn")
        turns.insert(0, _turn("system", system))
    return turns, parse_tools(row.get("tools"))


def _response(row: dict, key: str) -> str:
    """chosen/rejected: a string, or an assistant turn object ({"from": "gpt", "value"} or {"role":
    "assistant", "content"}, LLaMA-Factory's form) whose text is taken."""
    if key not in row:
        raise RecordError(f"missing field '{key}'")
    value = row[key]
    if not isinstance(value, dict):
        return _content(value, f"field '{key}'")
    for role_key, text_key, roles in STYLES.values():
        if role_key in value:
            source_role = value[role_key]
            if (roles.get(source_role) if isinstance(source_role, str) else None) != "assistant":
                raise RecordError(f"field '{key}': role {safe_name(source_role)} is not an assistant turn")
            return _with_reasoning(value, "assistant", _content(value.get(text_key), f"field '{key}' {text_key}"),
                                   key)
    raise RecordError(f"field '{key}' is an object with neither from/value nor role/content")


def _answer(row: dict) -> str | None:
    """The prompt kind's reference answer: a string (numbers are written as text) or null for none."""
    if "answer" not in row:
        raise RecordError("missing field 'answer'")
    value = row["answer"]
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return _content(value, "field 'answer'")


def _label(row: dict) -> bool:
    """The unpaired kind's label: true (desirable) or false (undesirable); 1 and 0 are read as those."""
    if "label" not in row:
        raise RecordError("missing field 'label'")
    value = row["label"]
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise RecordError(f"field 'label' is a {type(value).__name__}, not a boolean (true/false)")


def _completion(row: dict) -> str:
    """The unpaired kind's completion: a string, an assistant turn object, or TRL's conversational form (a list of
    one assistant turn)."""
    value = row.get("completion")
    if isinstance(value, list):
        if len(value) != 1:
            raise RecordError(f"field 'completion' is a list of {len(value)} turns, not one assistant turn")
        return _response({"completion": value[0]}, "completion")
    return _response(row, "completion")


def _with_tools(record: dict, tools: list[dict]) -> dict:
    if tools:
        record["tools"] = tools
    return record
