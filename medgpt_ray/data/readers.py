"""Source formats -> canonical records (see ARCHITECTURE.md, "Canonical data records", and the issue 13 spec).

Canonical records:

    pretrain:    {"text": str}
    sft:         {"conversations": [turn, ...], "tools": [schema, ...]}   ("tools" only when non-empty)
    preference:  {"conversations": [...prompt turns...], "chosen": str, "rejected": str, "tools": [...]}
    prompt:      {"conversations": [...prompt turns...], "answer": str | None, "tools": [...]}

A turn is {"role": R, "content": str}, R one of system (first only), user, assistant, tool_call (the
assistant's function call(s), content canonical JSON, see `canonical_tool_call`) and tool (a tool's result).
The order rule is templates.turn_order_error (one rule for reading and for rendering).

Source formats understood (`detect_format` names):

    text                   {"text": ...}, or any record with a single string field (e.g. a one-column CSV);
                           also every non-empty line of a .txt file (files.py)
    sharegpt               MedicalGPT ShareGPT {"conversations": [{"from", "value"}], "tools"?}, from one of
                           human, gpt, system, function_call, observation (see SHAREGPT_ROLES)
    canonical_sft          {"conversations": [{"role", "content"}], "tools"?} (what the cleaner writes)
    alpaca                 {"instruction", "input", "output"} (+ optional "history" [[q, a], ...], "system");
                           shibing624/medical finetune has this shape
    reward                 shibing624/medical reward {"question", "response_chosen", "response_rejected"}
                           (+ optional "system", "history")
    sharegpt_preference    MedicalGPT DPO {"conversations": [{"from", "value"}], "chosen", "rejected", "tools"?}
    canonical_preference   {"conversations": [{"role", "content"}], "chosen", "rejected", "tools"?}
    huatuo                 Huatuo-26M {"questions": [[q, paraphrase, ...], ...], "answers": [a, ...]}
    toyhom                 Toyhom CSV rows {"department", "title", "ask", "answer"}
    grpo                   MedicalGPT GRPO {"question", "answer"} (+ optional "system")
    sharegpt_prompt        {"conversations": [{"from", "value"}], "answer", "tools"?}
    canonical_prompt       {"conversations": [{"role", "content"}], "answer", "tools"?}

Conversation formats also take an optional top-level "system" string (LLaMA-Factory's form); chosen/rejected
may be given as an assistant turn object ({"from": "gpt", "value"} or {"role": "assistant", "content"}).

Every error raised for a record says why it cannot be used and never quotes the record's text: these
messages end up in reports and logs (ARCHITECTURE.md, data cleaning semantics).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

from medgpt_ray.data.kinds import (  # noqa: F401  (RecordError, DataFileError: imported from here by the cleaner)
    KIND_FORMATS,
    DataFileError,
    Kind,
    RecordError,
    check_kind,
    detect_format,
    safe_name,
)
from medgpt_ray.templates import ROLES, parse_tool_calls, turn_order_error

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet", ".txt")

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
        turns.append(_turn(role, content))
    return turns


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
            return _content(value.get(text_key), f"field '{key}' {text_key}")
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


def _with_tools(record: dict, tools: list[dict]) -> dict:
    if tools:
        record["tools"] = tools
    return record


def _preference(prompt: list[dict], chosen: str, rejected: str, tools: list[dict] | None = None) -> dict:
    check_turn_order(prompt, last="user")
    if chosen == rejected:
        raise RecordError("chosen and rejected responses are identical")
    return _with_tools({"conversations": prompt, "chosen": chosen, "rejected": rejected}, tools or [])


def _sft(turns: list[dict], tools: list[dict] | None = None) -> dict:
    check_turn_order(turns, last="assistant")
    return _with_tools({"conversations": turns}, tools or [])


def _prompt(prompt: list[dict], answer: str | None, tools: list[dict] | None = None) -> dict:
    check_turn_order(prompt, last="user")
    return _with_tools({"conversations": prompt, "answer": answer}, tools or [])


# --------------------------------------------------------------------------------------------------
# Converters: one per format, each returns the canonical records of one source row
# --------------------------------------------------------------------------------------------------


def _from_text(row: dict) -> list[dict]:
    if "text" in row:
        return [{"text": _required(row, "text")}]
    (key, value), = row.items()  # detect_format guarantees a single string field here
    return [{"text": _content(value, f"field {safe_name(key)}")}]


def _sft_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        return [_sft(*_conversation(row, style))]
    return convert


def _preference_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        prompt, tools = _conversation(row, style)
        return [_preference(prompt, _response(row, "chosen"), _response(row, "rejected"), tools)]
    return convert


def _prompt_converter(style: str) -> Callable[[dict], list[dict]]:
    def convert(row: dict) -> list[dict]:
        prompt, tools = _conversation(row, style)
        return [_prompt(prompt, _answer(row), tools)]
    return convert


def _from_alpaca(row: dict) -> list[dict]:
    instruction = _required(row, "instruction")
    extra = _optional(row, "input")
    user = f"{instruction}\n{extra}" if extra else instruction
    last = [_turn("user", user), _turn("assistant", _required(row, "output"))]
    return [_sft(_system_turns(row) + _history_turns(row) + last)]


def _from_reward(row: dict) -> list[dict]:
    prompt = _system_turns(row) + _history_turns(row) + [_turn("user", _required(row, "question"))]
    return [_preference(prompt, _required(row, "response_chosen"), _required(row, "response_rejected"))]


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


def _from_grpo(row: dict) -> list[dict]:
    """MedicalGPT GRPO {"question", "answer"}: a one-turn prompt and its reference answer."""
    prompt = _system_turns(row) + [_turn("user", _required(row, "question"))]
    return [_prompt(prompt, _answer(row))]


CONVERTERS: dict[str, Callable[[dict], list[dict]]] = {
    "text": _from_text,
    "sharegpt": _sft_converter("sharegpt"),
    "canonical_sft": _sft_converter("canonical"),
    "alpaca": _from_alpaca,
    "reward": _from_reward,
    "sharegpt_preference": _preference_converter("sharegpt"),
    "canonical_preference": _preference_converter("canonical"),
    "huatuo": _from_huatuo,
    "toyhom": _from_toyhom,
    "grpo": _from_grpo,
    "sharegpt_prompt": _prompt_converter("sharegpt"),
    "canonical_prompt": _prompt_converter("canonical"),
}
assert set(CONVERTERS) == {f for fmts in KIND_FORMATS.values() for f in fmts}


def convert_as(row: dict, fmt: str, kind: str) -> list[dict]:
    if fmt not in KIND_FORMATS[kind]:
        raise RecordError(f"a {fmt} record cannot be used as {kind} data "
                          f"(accepted formats: {', '.join(KIND_FORMATS[kind])})")
    return CONVERTERS[fmt](row)


def to_canonical(row: dict, kind: Kind) -> list[dict]:
    """Convert one source row into canonical record(s) of `kind`; RecordError says why it cannot be."""
    check_kind(kind)
    return convert_as(row, detect_format(row), kind)
