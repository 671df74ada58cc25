"""The chat templates we ship (chatml/qwen, llama3, vicuna, alpaca), their tool format and the Jinja text each
exports to a tokenizer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from medgpt_ray.templates.base import (
    TemplateError,
)


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

def _split_format(fmt: str) -> tuple[str, str]:
    pre, sep, post = fmt.partition("{content}")
    if not sep:
        raise TemplateError(f"format {fmt!r} has no {{content}} placeholder")
    return pre, post

def unsupported_message(name: str) -> str:
    return f"template {name!r} has no tool-calling format; records with tools or tool turns cannot be rendered with it"

def _jinja(t: dict[str, Any]) -> str:
    """The HF chat template rendering exactly what _segments() renders.

    Literals are JSON strings (Jinja unescapes ``\\n`` and ``\\uXXXX`` alike), all on one line so HF's
    trim_blocks/lstrip_blocks cannot touch the whitespace. Tools follow HF's convention: ``tools``,
    assistant messages with ``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``
    or the bare function), ``role: tool`` results; ``| tojson`` is HF's (``json.dumps``, non-ASCII
    kept), the same call _segments() makes. Templates without a tool format refuse them with
    ``raise_exception``.
    """
    q = json.dumps
    s_pre, s_post = _split_format(t["system_format"])
    u_pre, u_post = _split_format(t["user_format"])
    prefix = q(t["assistant_prefix"])
    suffix = "eos_token" if t["eos_from_tokenizer"] else q(t["assistant_suffix"])
    default = t["default_system"]
    tf: ToolFormat | None = t.get("tools")
    assistant = (
        f"{{{{ {prefix} }}}}{{% generation %}}{{{{ message['content'] + {suffix} }}}}{{% endgeneration %}}"
        + f"{{{{ {q(t['turn_separator'])} }}}}"
    )
    if tf is None:
        refuse = f"{{{{ raise_exception({q(unsupported_message(t['name']))}) }}}}"
        return (
            ("{{ bos_token if bos_token else '' }}" if t["bos"] else "")
            + f"{{%- if tools -%}}{refuse}{{%- endif -%}}{{%- for message in messages -%}}"
            + "{%- if message['role'] not in ['system', 'user', 'assistant'] or message['tool_calls'] -%}"
            + f"{refuse}{{%- endif -%}}{{%- endfor -%}}"
            + "{%- set ns = namespace(start=0) -%}{%- if messages and messages[0]['role'] == 'system' -%}"
            + f"{{{{ {q(s_pre)} + messages[0]['content'] + {q(s_post)} }}}}{{%- set ns.start = 1 -%}}"
            + (f"{{%- else -%}}{{{{ {q(s_pre + default + s_post)} }}}}" if default else "")
            + "{%- endif -%}{%- for message in messages[ns.start:] -%}{%- if message['role'] == 'user' -%}"
            + f"{{{{ {q(u_pre)} + message['content'] + {q(u_post)} }}}}{{%- else -%}}{assistant}"
            + "{%- endif -%}{%- endfor -%}"
            + f"{{%- if add_generation_prompt -%}}{{{{ {prefix} }}}}{{%- endif -%}}"
        )
    system_then_tools = "{{ messages[0]['content'] + " + q(tf.system_separator) + " }}"
    tools_block = (
        f"{{{{ {q(tf.tools_header)} }}}}{{%- for tool in tools -%}}{{{{ {q(tf.tool_item_prefix)} + (tool | tojson) }}}}"
        + f"{{%- endfor -%}}{{{{ {q(tf.tools_footer)} }}}}"
    )
    tool_result = (
        f"{{%- if loop.first or loop.previtem['role'] != 'tool' -%}}{{{{ {q(tf.result_open)} }}}}{{%- endif -%}}"
        + f"{{{{ {q(tf.result_prefix)} + message['content'] + {q(tf.result_suffix)} }}}}"
        + f"{{%- if loop.last or loop.nextitem['role'] != 'tool' -%}}{{{{ {q(tf.result_close)} }}}}{{%- endif -%}}"
    )
    tool_calls = (
        f"{{{{ {prefix} }}}}{{% generation %}}"
        + f"{{%- if message['content'] -%}}{{{{ message['content'] + {q(tf.call_separator)} }}}}{{%- endif -%}}"
        + "{%- for call in message['tool_calls'] -%}"
        + "{%- set fn = call['function'] if call['function'] is defined else call -%}"
        + f"{{%- if not loop.first -%}}{{{{ {q(tf.call_separator)} }}}}{{%- endif -%}}"
        + f"{{{{ {q(tf.call_open)} + fn['name'] + {q(tf.call_middle)} + (fn['arguments'] | tojson)"
        + f" + {q(tf.call_close)} }}}}{{%- endfor -%}}{{{{ {suffix} }}}}{{% endgeneration %}}"
        + f"{{{{ {q(t['turn_separator'])} }}}}"
    )
    return (
        ("{{ bos_token if bos_token else '' }}" if t["bos"] else "")
        + "{%- set ns = namespace(start=0) -%}"
        + "{%- if messages and messages[0]['role'] == 'system' -%}{%- set ns.start = 1 -%}{%- endif -%}"
        + f"{{%- if tools -%}}{{{{ {q(s_pre)} }}}}{{%- if ns.start -%}}{system_then_tools}"
        + (f"{{%- else -%}}{{{{ {q(default + tf.system_separator)} }}}}" if default else "")
        + f"{{%- endif -%}}{tools_block}{{{{ {q(s_post)} }}}}"
        + f"{{%- elif ns.start -%}}{{{{ {q(s_pre)} + messages[0]['content'] + {q(s_post)} }}}}"
        + (f"{{%- else -%}}{{{{ {q(s_pre + default + s_post)} }}}}" if default else "")
        + "{%- endif -%}{%- for message in messages[ns.start:] -%}{%- if message['role'] == 'user' -%}"
        + f"{{{{ {q(u_pre)} + message['content'] + {q(u_post)} }}}}"
        + f"{{%- elif message['role'] == 'tool' -%}}{tool_result}"
        + f"{{%- elif message['tool_calls'] -%}}{tool_calls}{{%- else -%}}{assistant}"
        + "{%- endif -%}{%- endfor -%}"
        + f"{{%- if add_generation_prompt -%}}{{{{ {prefix} }}}}{{%- endif -%}}"
    )

def _make(name: str, **kw: Any) -> ChatTemplate:
    return ChatTemplate(name=name, jinja=_jinja({"name": name, **kw}), **kw)

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

def get_template(name: str) -> ChatTemplate:
    try:
        return TEMPLATES[name]
    except KeyError:
        allowed = ", ".join(sorted(TEMPLATES))
        raise TemplateError(f"unknown chat template {name!r}; allowed: {allowed}") from None
