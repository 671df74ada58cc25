"""Chat templates and response-only label masks for SFT, reward modelling and DPO.

Three kinds of template, one set of functions (encode_sft, encode_preference, render_prompt, response_text,
resolved_suffix, check_template, apply_to_tokenizer), by name (catalog.get_template, template_names()):

- ``auto`` (the default): the model's own tokenizer chat template where it ships one, else chatml (resolve.py);
- our segment templates, chatml (= qwen), llama3, vicuna, alpaca: described below;
- the Jinja families, qwen3, qwen3_nothink, qwen3_5, qwen3_5_nothink, glm4, mistral (families.py), rendered by
  the tokenizer from the family's training template, masks from its {% generation %} markers (jinja_encode.py).

An assistant turn may also carry ``reasoning_content`` (a string): the qwen3/qwen3_5 names (and ``auto`` on a
template that reads it) render it in the ``<think>`` block and train it, with Qwen3's ``enable_thinking`` on for that
record; a record without reasoning renders with it off (the empty ``<think>\n\n</think>\n\n`` is the prompt's, as
at inference). The readers write a source turn's ``reasoning_content`` into its content as a ``<think>`` block
(data/fields.py), which these templates find again. Prompts (preference, prompt and
generation) render with thinking off.

What follows is the segment templates' contract; the Jinja templates keep the same rule for what is trained.

A conversation is a list of ``{"role", "content"}`` turns: an optional leading system turn, then
turns alternating between the user side (``user``, or ``tool``: a tool's result) and the assistant
side (``assistant``, or ``tool_call``: the assistant's function call(s), JSON text of
``{"name", "arguments"}`` or a non-empty array of them), starting with ``user``. A ``tool`` turn
directly follows a ``tool_call`` turn, and a ``tool_call`` turn that is not the last is followed by
its ``tool`` turn. SFT conversations end assistant-side; prompts end user-side. A record may also
carry ``tools``: a list of function schemas (JSON objects), rendered by the template.

Tokenization is segment by segment (``add_special_tokens=False``) and the ids are concatenated, so
the label mask is exact by construction instead of being recovered from character offsets. The
concatenated segment texts always equal the rendered conversation, and each template's ``jinja``
renders the same text through ``tokenizer.apply_chat_template`` (HF's convention for tools: the
``tools=`` argument, assistant messages with ``tool_calls``, ``role: tool`` results).

Every assistant and tool_call turn is trained (content + suffix): MedicalGPT-style runs that train
only the last turn waste most of a multi-turn dialogue. The suffix (e.g. ``<|im_end|>`` or ``</s>``)
is trained so the model learns to stop; the generation prompt and separators are not (they are given
at inference), nor are the system turn, the tools block, user turns and tool results.

Tools (chatml = qwen only; llama3, vicuna and alpaca raise TemplateToolsUnsupported): rendered
exactly as Qwen2.5-Instruct's own chat template renders them when the conversation has a system
turn: the system turn's content, "\\n\\n", then the "# Tools ... <tools> ... </tools> ..." block; a
tool_call turn is ``<|im_start|>assistant\\n<tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>``
(several calls: blocks joined by "\\n") + ``<|im_end|>\\n``; a tool turn is
``<|im_start|>user\\n<tool_response>\\n{content}\\n</tool_response><|im_end|>\\n``.
Tools but no system turn: Qwen2.5 would inject its default "You are Qwen, created by Alibaba
Cloud..." system prompt; we inject nothing (as without tools), so the system turn holds only the
tools block, starting directly with "# Tools" (no leading "\\n\\n"):
``<|im_start|>system\\n# Tools\\n\\nYou may call one or more functions ...</tool_call><|im_end|>\\n``.
That is Qwen2.5's rendering with an empty system turn minus the "\\n\\n", and what Qwen3's template
renders in that case. The exported jinja does the same.
"""

from __future__ import annotations

from medgpt_ray.templates.base import (
    ASSISTANT_SIDE,
    IGNORE_INDEX,
    ROLES,
    TOOL_ROLES,
    USER_SIDE,
    TemplateError,
    TemplateTokenizerMismatch,
    TemplateToolsUnsupported,
)
from medgpt_ray.templates.catalog import TEMPLATES, ChatTemplate, get_template, template_names
from medgpt_ray.templates.conversation import has_tool_content, parse_tool_calls, turn_order_error
from medgpt_ray.templates.encode import (
    apply_to_tokenizer,
    check_template,
    encode_preference,
    encode_sft,
    encode_sft_many,
    render_prompt,
    resolved_suffix,
    response_text,
)
from medgpt_ray.templates.families import AUTO, AutoTemplate, JinjaTemplate
from medgpt_ray.templates.resolve import resolve
from medgpt_ray.templates.tool_format import ToolFormat

__all__ = [
    "ASSISTANT_SIDE",
    "AUTO",
    "AutoTemplate",
    "ChatTemplate",
    "IGNORE_INDEX",
    "JinjaTemplate",
    "ROLES",
    "TEMPLATES",
    "TOOL_ROLES",
    "TemplateError",
    "TemplateTokenizerMismatch",
    "TemplateToolsUnsupported",
    "ToolFormat",
    "USER_SIDE",
    "apply_to_tokenizer",
    "check_template",
    "encode_preference",
    "encode_sft",
    "encode_sft_many",
    "get_template",
    "has_tool_content",
    "parse_tool_calls",
    "render_prompt",
    "resolve",
    "resolved_suffix",
    "response_text",
    "template_names",
    "turn_order_error",
]
