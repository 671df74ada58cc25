"""How a template renders tools and tool turns (only templates that have one accept records with tools), and the
message a template without one refuses them with."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ToolFormat:
    """How a template renders tools and tool turns. The pieces are plain text (no placeholders)."""

    system_separator: str  # between a system turn's content and the tools block
    tools_header: str  # the tools block: header + (item_prefix + schema JSON) per tool + footer
    tool_item_prefix: str
    tools_footer: str
    call_open: str  # one call: call_open + name + call_middle + arguments JSON + call_close
    call_middle: str
    call_close: str
    call_separator: str  # between the calls of one tool_call turn
    result_open: str  # a tool turn: result_open + result_prefix + content + result_suffix + result_close
    result_prefix: str
    result_suffix: str
    result_close: str


def unsupported_message(name: str) -> str:
    return f"template {name!r} has no tool-calling format; records with tools or tool turns cannot be rendered with it"
