"""The chat templates we render segment by segment (chatml/qwen, llama3, vicuna, alpaca) and their tool format; the
Jinja text each exports to a tokenizer is built by jinja.py. The names of all templates (these, ``auto`` and the
Jinja families of families.py) are looked up here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from medgpt_ray.templates.base import (
    TemplateError,
)
from medgpt_ray.templates.families import AUTO, FAMILY_NAMES, families
from medgpt_ray.templates.jinja import chat_template_jinja
from medgpt_ray.templates.tool_format import ToolFormat

# Qwen2.5-Instruct's own texts, verbatim from its tokenizer_config.json chat_template
# (tests/fixtures/qwen2_5_chat_template.jinja; the tests render both and compare).
QWEN_TOOLS = ToolFormat(
    system_separator="\n\n",
    tools_header="# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    tool_item_prefix="\n",
    tools_footer="\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>",
    call_open='<tool_call>\n{"name": "',
    call_middle='", "arguments": ',
    call_close="}\n</tool_call>",
    call_separator="\n",
    # Qwen merges consecutive tool results into one user turn; our turns never have two in a row,
    # but the exported jinja merges them the same way for chats built by hand.
    result_open="<|im_start|>user",
    result_prefix="\n<tool_response>\n",
    result_suffix="\n</tool_response>",
    result_close="<|im_end|>\n",
)

@dataclass(frozen=True)
class ChatTemplate:
    name: str
    system_format: str
    user_format: str
    assistant_prefix: str  # generation prompt: not trained
    assistant_suffix: str  # trained; "" when eos_from_tokenizer (resolved with resolved_suffix())
    turn_separator: str  # after the suffix, before the next turn: not trained
    special_tokens: tuple[str, ...]
    default_system: str | None
    bos: bool  # prepend tokenizer.bos_token when the tokenizer has one
    eos_from_tokenizer: bool
    jinja: str
    tools: ToolFormat | None = None  # None: records with tools or tool turns raise TemplateToolsUnsupported


def _make(name: str, **kw: Any) -> ChatTemplate:
    return ChatTemplate(name=name, jinja=chat_template_jinja({"name": name, **kw}), **kw)

_CHATML = _make(
    "chatml",
    system_format="<|im_start|>system\n{content}<|im_end|>\n",
    user_format="<|im_start|>user\n{content}<|im_end|>\n",
    assistant_prefix="<|im_start|>assistant\n",
    assistant_suffix="<|im_end|>",
    turn_separator="\n",  # Qwen's template writes "<|im_end|>\n" after every turn, the last one too
    special_tokens=("<|im_start|>", "<|im_end|>"),
    # Qwen2.5's own template injects "You are Qwen, created by Alibaba Cloud..."; we inject nothing so
    # tiny runs stay short and the data's own system turn (if any) is what the model sees. With tools
    # and no system turn the system turn holds only the tools block (see the module docstring).
    default_system=None,
    bos=False,  # Qwen tokenizers have no BOS
    eos_from_tokenizer=False,
    tools=QWEN_TOOLS,
)

TEMPLATES: dict[str, ChatTemplate] = {
    "chatml": _CHATML,
    "qwen": _CHATML,
    "llama3": _make(
        "llama3",
        system_format="<|start_header_id|>system<|end_header_id|>\n\n{content}<|eot_id|>",
        user_format="<|start_header_id|>user<|end_header_id|>\n\n{content}<|eot_id|>",
        assistant_prefix="<|start_header_id|>assistant<|end_header_id|>\n\n",
        assistant_suffix="<|eot_id|>",
        turn_separator="",
        special_tokens=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        default_system=None,
        bos=True,  # <|begin_of_text|> is the tokenizer's bos_token (check_template insists)
        eos_from_tokenizer=False,
    ),
    "vicuna": _make(  # MedicalGPT's vicuna (v1.1): "SYS USER: q ASSISTANT:a</s>USER: ..."
        "vicuna",
        system_format="{content} ",
        user_format="USER: {content} ",
        assistant_prefix="ASSISTANT:",
        assistant_suffix="",
        turn_separator="",
        special_tokens=(),
        default_system="A chat between a curious user and an artificial intelligence assistant. "
        "The assistant gives helpful, detailed, and polite answers to the user's questions.",
        bos=True,  # Llama-2 tokenizers get <s>; Qwen ones (no bos_token) get nothing
        eos_from_tokenizer=True,
    ),
    "alpaca": _make(
        "alpaca",
        system_format="{content}\n\n",
        user_format="### Instruction:\n{content}\n\n",
        assistant_prefix="### Response:\n",
        assistant_suffix="",
        turn_separator="\n\n",
        special_tokens=(),
        default_system="Below is an instruction that describes a task. "
        "Write a response that appropriately completes the request.",
        bos=True,
        eos_from_tokenizer=True,
    ),
}

# Templates whose first token must be a specific BOS: a llama3 run on a tokenizer without it would
# silently train on prompts missing <|begin_of_text|>.
REQUIRED_BOS = {"llama3": "<|begin_of_text|>"}

def template_names() -> list[str]:
    """Every name model.template accepts: ``auto``, our segment templates, and the Jinja families (families.py)."""
    return ["auto", *sorted(TEMPLATES), *FAMILY_NAMES]


def get_template(name: str) -> Any:
    """A ChatTemplate (segments), a JinjaTemplate (families.py) or AUTO (the tokenizer's own, resolve.py)."""
    if name == AUTO.name:
        return AUTO
    if name in TEMPLATES:
        return TEMPLATES[name]
    if name in families():
        return families()[name]
    raise TemplateError(f"unknown chat template {name!r}; allowed: {', '.join(template_names())}")
