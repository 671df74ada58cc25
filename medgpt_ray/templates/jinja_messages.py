"""Our canonical turns as the messages HF chat templates read (tool calls as ``tool_calls``, tool results as
``role: tool``, reasoning as ``reasoning_content``), whether a record thinks, and the one call that renders them."""

from __future__ import annotations

import functools
from typing import Any

import jinja2

from medgpt_ray.templates.base import TemplateError
from medgpt_ray.templates.conversation import tool_calls_of
from medgpt_ray.templates.families import OFF, JinjaTemplate


def _reasoning(turn: dict, position: int) -> str:
    value = turn.get("reasoning_content")
    if value is not None and not isinstance(value, str):
        raise TemplateError(f"turn {position} ({turn['role']}): reasoning_content must be a string")
    return value or ""


def thinks(template: JinjaTemplate, conversation: list[dict]) -> bool:
    """Qwen3's `enable_thinking` for this record: on only when an assistant turn carries reasoning (a
    `reasoning_content` string, or `<think>...</think>` in its content) and the template's name allows thinking.
    Off, the templates render the empty `<think>\\n\\n</think>\\n\\n` block the model expects for answers without
    reasoning (MedicalGPT's data has none)."""
    if template.thinking == OFF:
        return False
    for i, turn in enumerate(conversation, start=1):
        if turn["role"] != "assistant":
            continue
        content = turn["content"]
        if _reasoning(turn, i).strip() or ("<think>" in content and "</think>" in content):
            return True
    return False


def to_messages(template: JinjaTemplate, conversation: list[dict]) -> list[dict]:
    """HF's message convention (what the templates' own tool support reads); reasoning kept only where the
    template's name thinks."""
    out: list[dict] = []
    for i, turn in enumerate(conversation, start=1):
        role = turn["role"]
        if role == "tool_call":
            calls = [{"type": "function", "function": {"name": name, "arguments": arguments}}
                     for name, arguments in tool_calls_of(turn["content"], i)]
            out.append({"role": "assistant", "content": "", "tool_calls": calls})
            continue
        message = {"role": role, "content": turn["content"]}
        reasoning = _reasoning(turn, i) if role == "assistant" else ""
        if reasoning and template.thinking != OFF:
            message["reasoning_content"] = reasoning
        out.append(message)
    return out


def render(
    tokenizer: Any,
    jinja: str,
    messages: list[dict],
    tools: list[dict] | None = None,
    generation_prompt: bool = False,
    thinking: bool = False,
    masks: bool = False,
) -> Any:
    """The text (``masks`` false) or HF's encoding with ``assistant_masks`` from the {% generation %} markers."""
    kwargs: dict[str, Any] = {
        "chat_template": jinja,
        "tools": tools or None,
        "add_generation_prompt": generation_prompt,
        "enable_thinking": thinking,
    }
    try:
        if masks:
            return tokenizer.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, **kwargs
            )
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except jinja2.TemplateError as err:  # raise_exception() in the template: its own refusal (no record text)
        raise TemplateError(f"chat template refused the conversation: {type(err).__name__}") from None


_TOOLS_PROBE = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "probe_name_a8f3", "arguments": {"probe_key_b9d4": "probe_val_d6e7"}}}
    ]},
    {"role": "tool", "content": "probe_result_c4f9"},
]


@functools.lru_cache(maxsize=64)
def supports_tools(tokenizer: Any, template: JinjaTemplate) -> bool:
    """Whether the template renders a tool call and its result (TRL's `supports_tool_calling` test: a template that
    silently drops either cannot train tool use)."""
    try:
        text = render(tokenizer, template.training, _TOOLS_PROBE)
    except TemplateError:
        return False
    return all(s in text for s in ("probe_name_a8f3", "probe_key_b9d4", "probe_val_d6e7", "probe_result_c4f9"))
