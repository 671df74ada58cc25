"""What makes a conversation valid for a template: the turn order and the tool-call JSON (pure checks, no
tokenizer)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from medgpt_ray.templates.base import (
    ASSISTANT_SIDE,
    ROLES,
    TOOL_ROLES,
    USER_SIDE,
    TemplateError,
)


def has_tool_content(conversation: Any, tools: Any) -> bool:
    """True when a record needs a tool-calling format: non-empty ``tools`` or a tool_call/tool turn."""
    if tools:
        return True
    if not isinstance(conversation, list):
        return False
    return any(isinstance(turn, dict) and turn.get("role") in TOOL_ROLES for turn in conversation)

def validate_conversation(conversation: Any, last_role: str) -> None:
    """Shape and order checks; errors name positions (1-based, as the readers' do) and roles only, never the
    (possibly patient) text.

    ``last_role`` is the side the conversation must end on: "assistant" (assistant or tool_call, SFT)
    or "user" (user or tool, prompts).
    """
    if not isinstance(conversation, list) or not conversation:
        raise TemplateError("conversation must be a non-empty list of {role, content} turns")
    for i, turn in enumerate(conversation):
        if not isinstance(turn, dict) or turn.get("role") not in ROLES:
            role = turn.get("role") if isinstance(turn, dict) else type(turn).__name__
            raise TemplateError(f"turn {i + 1}: role must be one of {ROLES}, got {role!r}")
        if not isinstance(turn.get("content"), str):
            raise TemplateError(f"turn {i + 1} ({turn['role']}): content must be a string")
    error = turn_order_error([turn["role"] for turn in conversation], last_role)
    if error:
        raise TemplateError(error)

def turn_order_error(roles: Sequence[str], last: str) -> str | None:
    """The order rule, in one place (readers check source records with it, templates what they render): why
    `roles` break it (turn numbers 1-based), or None.

    After an optional leading system turn, turns alternate user-side (user, tool) and assistant-side
    (assistant, tool_call), starting with user; a tool turn directly follows a tool_call turn and a tool_call
    turn that is not the last is followed by a tool turn. `last` is "assistant" for sft conversations (end
    assistant-side) and "user" for prompts of the preference and prompt kinds (end user-side).
    """
    offset = 1 if roles and roles[0] == "system" else 0
    body = roles[offset:]
    if not body:
        return "no user turn"
    for i, role in enumerate(body):
        n = i + offset + 1
        prev = body[i - 1] if i else None
        if role == "system":
            return f"turn {n}: a system turn is only allowed first"
        if role == "tool" and prev != "tool_call":
            return f"turn {n}: a tool turn must directly follow a tool_call turn"
        if prev == "tool_call" and role != "tool":
            return f"turn {n - 1}: a tool_call turn must be followed by a tool turn"
        side, expected = (USER_SIDE, "user") if i % 2 == 0 else (ASSISTANT_SIDE, "assistant")
        if role not in side:
            return (f"turn {n}: expected {expected}, got {role} "
                    "(roles must alternate user/assistant after an optional system turn)")
    end = ASSISTANT_SIDE if last == "assistant" else USER_SIDE
    if body[-1] not in end:
        what, article = ("conversation", "an") if last == "assistant" else ("prompt", "a")
        return f"{what} must end with {article} {last} turn, ends with {body[-1]}"
    return None

def check_tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)) or not all(isinstance(tool, dict) for tool in tools):
        raise TemplateError("tools must be a list of JSON objects (function schemas)")
    return list(tools)

def parse_tool_calls(value: object) -> tuple[list[tuple[str, dict]], bool] | None:
    """The one reading of a function call (readers canonicalise with it, templates render with it): `value` is
    the JSON (text, or parsed) of {"name": str, "arguments": object} or of a non-empty list of them. Returns
    ([(name, arguments), ...], whether it was a list), a string "arguments" holding a JSON object replaced by
    the object; None when `value` is no such JSON."""
    obj = value
    if isinstance(value, str):
        try:
            obj = json.loads(value)
        except ValueError:
            return None
    calls = obj if isinstance(obj, list) else [obj]
    if not calls:
        return None
    out = []
    for call in calls:
        if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
            return None
        name, arguments = call["name"], call["arguments"]
        if not isinstance(name, str) or not name.strip():
            return None
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        out.append((name, arguments))
    return out, isinstance(obj, list)

def tool_calls_of(content: str, position: int) -> list[tuple[str, dict]]:
    parsed = parse_tool_calls(content)
    if parsed is None:
        raise TemplateError(
            f"turn {position} (tool_call): content must be a JSON {{name, arguments}} object "
            "or a non-empty array of them"
        )
    return parsed[0]
