"""OpenAI's tool calling on `serve`: a request's `tools`, `tool_choice` and tool turns read into our turns (the chat
template renders them as it renders them in training: templates/), and an answer's calls read back out of its text.

A model trained on MedicalGPT's tool-calling data answers a call as Qwen's (Hermes') format writes it, which is the
format our chatml template trains: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several joined by
a newline. The text before the first call is the message's content; each call becomes one of `message.tool_calls`
and the choice finishes with "tool_calls". Text that only looks like a call (not JSON of a name and an object of
arguments) stays content: nothing the model wrote is dropped."""

from __future__ import annotations

import json
import re
import uuid

from medgpt_ray.data.fields import canonical_tool_call
from medgpt_ray.templates import parse_tool_calls

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
MAX_TOOLS = 128  # OpenAI's limit on the functions one request declares


class ToolRequestError(ValueError):
    """A request's tools or tool turns as OpenAI would refuse them: (field, why)."""

    def __init__(self, field: str, why: str):
        super().__init__(why)
        self.field = field


def request_tools(body: dict) -> list[dict] | None:
    """`tools` as the template renders them (OpenAI's objects as given, as Qwen's own template takes them), or None
    where the request declares none or `tool_choice` is "none". A forced choice ("required", a named function) would
    need constrained decoding, which this server does not do: refused, never ignored."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if choice not in (None, "none", "auto"):
        raise ToolRequestError("tool_choice", '"auto" or "none" is honoured; a forced call ("required", a named '
                                              "function) is not: this server does not constrain decoding")
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolRequestError("tools", f"a list of at most {MAX_TOOLS} tools is required")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(fn, dict)
                and isinstance(fn.get("name"), str) and fn["name"].strip()
                and isinstance(fn.get("parameters", {}), dict)):
            raise ToolRequestError(f"tools[{i}]", 'an object {"type": "function", "function": {"name": ..., '
                                                  '"parameters": {...}}} is required')
    return None if choice == "none" else tools


def tool_turn(i: int, message: dict) -> dict | None:
    """Our turn for an OpenAI message of the tool protocol (an assistant's `tool_calls`, a `tool` result), or None
    for any other message."""
    if message.get("role") == "tool":
        if not isinstance(message.get("content"), str):
            raise ToolRequestError(f"messages[{i}].content", "a tool result's content must be a string")
        return {"role": "tool", "content": message["content"]}
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or calls is None:
        return None
    if not isinstance(calls, list) or not calls:
        raise ToolRequestError(f"messages[{i}].tool_calls", "a non-empty list is required")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or canonical_tool_call({"name": fn.get("name"),
                                                            "arguments": fn.get("arguments")}) is None:
            raise ToolRequestError(f"messages[{i}].tool_calls[{j}]", "a function with a name and JSON arguments "
                                                                      "(an object) is required")
    # the readers' canonical text of a call turn (one call, or a list of them), as training data holds it
    wanted = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]
    return {"role": "tool_call", "content": canonical_tool_call(wanted if len(wanted) > 1 else wanted[0])}


def split_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, OpenAI tool_calls) of an answer's text: the text before its first call block, and the blocks, which
    must run to the end with only whitespace between them and each read as a call; (text, []) otherwise."""
    start = text.find(OPEN)
    if start < 0:
        return text, []
    calls, pos = [], start
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        block = _BLOCK.match(text, pos + len(text[pos:]) - len(text[pos:].lstrip()))
        parsed = parse_tool_calls(block.group(1)) if block else None
        if parsed is None:  # a block left open, text between or after the calls, or no call in it
            return text, []
        calls += [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                   "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
                  for name, arguments in parsed[0]]
        pos = block.end()
    return text[:start].rstrip() or None, calls


class CallHoldback:
    """A streamed answer's text with tools declared: text is sent as it comes until a call may be starting (a tail
    that could begin `<tool_call>` is held back, as stop strings are); from the first call on everything is kept,
    and `finish` says at the end whether it was calls (sent as tool_calls deltas) or text after all (sent as
    content)."""

    def __init__(self) -> None:
        self.sent, self.kept, self.in_call = "", "", False

    def feed(self, piece: str) -> str:
        if self.in_call:
            self.kept += piece
            return ""
        text, self.kept = self.kept + piece, ""
        at = text.find(OPEN)
        if at >= 0:
            self.in_call, self.kept = True, text[at:]
        else:  # a tail that could begin the marker waits for the next piece
            at = next((j for j in range(max(0, len(text) - len(OPEN) + 1), len(text)) if OPEN.startswith(text[j:])),
                      len(text))
            self.kept = text[at:]
        self.sent += text[:at]
        return text[:at]

    def finish(self) -> tuple[str, list[dict]]:
        """(content still to send, tool_calls) at the end of the answer."""
        if self.in_call:
            _, calls = split_calls(self.sent + self.kept)
            if calls:
                return "", calls
        return self.kept, []
