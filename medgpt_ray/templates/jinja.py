"""The Jinja text each template exports to a tokenizer (`tokenizer.chat_template`): rendered by HF's
apply_chat_template, it gives exactly the text that encode.py's segments concatenate to, tools included."""

from __future__ import annotations

import json
from typing import Any

from medgpt_ray.templates.base import TemplateError
from medgpt_ray.templates.tool_format import ToolFormat, unsupported_message


def split_format(fmt: str) -> tuple[str, str]:
    pre, sep, post = fmt.partition("{content}")
    if not sep:
        raise TemplateError(f"format {fmt!r} has no {{content}} placeholder")
    return pre, post


def chat_template_jinja(t: dict[str, Any]) -> str:
    """The HF chat template rendering exactly what encode.py's _segments() renders.

    Literals are JSON strings (Jinja unescapes ``\\n`` and ``\\uXXXX`` alike), all on one line so HF's
    trim_blocks/lstrip_blocks cannot touch the whitespace. Tools follow HF's convention: ``tools``,
    assistant messages with ``tool_calls`` (``{"type": "function", "function": {"name", "arguments"}}``
    or the bare function), ``role: tool`` results; ``| tojson`` is HF's (``json.dumps``, non-ASCII
    kept), the same call _segments() makes. Templates without a tool format refuse them with
    ``raise_exception``.
    """
    tf: ToolFormat | None = t.get("tools")
    if tf is None:
        return _without_tools(t)
    return _with_tools(t, tf)


def _prefix(t: dict[str, Any]) -> str:
    """The generation prompt, as a Jinja literal."""
    return json.dumps(t["assistant_prefix"])


def _suffix(t: dict[str, Any]) -> str:
    """The trained end of an assistant turn: the tokenizer's eos_token, or the template's literal suffix."""
    return "eos_token" if t["eos_from_tokenizer"] else json.dumps(t["assistant_suffix"])


def _assistant_turn(t: dict[str, Any]) -> str:
    """A plain assistant turn: the generation prompt, the content and suffix inside {% generation %} (the trained
    part), then the separator."""
    q = json.dumps
    prefix, suffix = _prefix(t), _suffix(t)
    return (
        f"{{{{ {prefix} }}}}{{% generation %}}{{{{ message['content'] + {suffix} }}}}{{% endgeneration %}}"
        + f"{{{{ {q(t['turn_separator'])} }}}}"
    )


def _without_tools(t: dict[str, Any]) -> str:
    """A template with no tool format: tools or tool turns raise, the rest renders system, user and assistant."""
    q = json.dumps
    s_pre, s_post = split_format(t["system_format"])
    u_pre, u_post = split_format(t["user_format"])
    prefix = _prefix(t)
    default = t["default_system"]
    assistant = _assistant_turn(t)
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


def _tools_block(tf: ToolFormat) -> str:
    """The tools block: header, one schema (`| tojson`) per tool, footer."""
    q = json.dumps
    return (
        f"{{{{ {q(tf.tools_header)} }}}}{{%- for tool in tools -%}}{{{{ {q(tf.tool_item_prefix)} + (tool | tojson) }}}}"
        + f"{{%- endfor -%}}{{{{ {q(tf.tools_footer)} }}}}"
    )


def _tool_result(tf: ToolFormat) -> str:
    """A tool turn; consecutive ones share one opening and one closing (as Qwen's template merges them)."""
    q = json.dumps
    return (
        f"{{%- if loop.first or loop.previtem['role'] != 'tool' -%}}{{{{ {q(tf.result_open)} }}}}{{%- endif -%}}"
        + f"{{{{ {q(tf.result_prefix)} + message['content'] + {q(tf.result_suffix)} }}}}"
        + f"{{%- if loop.last or loop.nextitem['role'] != 'tool' -%}}{{{{ {q(tf.result_close)} }}}}{{%- endif -%}}"
    )


def _tool_calls(t: dict[str, Any], tf: ToolFormat) -> str:
    """An assistant turn with tool_calls: its content if any, then each call (HF's or the bare function form)."""
    q = json.dumps
    prefix, suffix = _prefix(t), _suffix(t)
    return (
        f"{{{{ {prefix} }}}}{{% generation %}}"
        + f"{{%- if message['content'] -%}}{{{{ message['content'] + {q(tf.call_separator)} }}}}{{%- endif -%}}"
        + "{%- for call in message['tool_calls'] -%}"
        + "{%- set fn = call['function'] if call['function'] is defined else call -%}"
        + f"{{%- if not loop.first -%}}{{{{ {q(tf.call_separator)} }}}}{{%- endif -%}}"
        + f"{{{{ {q(tf.call_open)} + fn['name'] + {q(tf.call_middle)} + (fn['arguments'] | tojson)"
        + f" + {q(tf.call_close)} }}}}{{%- endfor -%}}{{{{ {suffix} }}}}{{% endgeneration %}}"
        + f"{{{{ {q(t['turn_separator'])} }}}}"
    )


def _with_tools(t: dict[str, Any], tf: ToolFormat) -> str:
    """A template with a tool format: the tools block in the system turn, tool calls and tool results."""
    q = json.dumps
    s_pre, s_post = split_format(t["system_format"])
    u_pre, u_post = split_format(t["user_format"])
    prefix = _prefix(t)
    default = t["default_system"]
    assistant = _assistant_turn(t)
    system_then_tools = "{{ messages[0]['content'] + " + q(tf.system_separator) + " }}"
    tools_block = _tools_block(tf)
    tool_result = _tool_result(tf)
    tool_calls = _tool_calls(t, tf)
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
