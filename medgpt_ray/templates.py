"""Chat templates and response-only label masks for SFT, reward modelling and DPO.

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

import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100
ROLES = ("system", "user", "assistant", "tool_call", "tool")
USER_SIDE = ("user", "tool")
ASSISTANT_SIDE = ("assistant", "tool_call")
TOOL_ROLES = ("tool_call", "tool")


class TemplateError(ValueError):
    """A conversation or record does not fit a template (messages never quote record text)."""


class TemplateTokenizerMismatch(TemplateError):
    """The tokenizer splits a template's control token into pieces (or maps it to unk)."""


class TemplateToolsUnsupported(TemplateError):
    """The template has no tool-calling format, but the record has tools or tool turns."""


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


def _unsupported_message(name: str) -> str:
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
        refuse = f"{{{{ raise_exception({q(_unsupported_message(t['name']))}) }}}}"
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
_REQUIRED_BOS = {"llama3": "<|begin_of_text|>"}


def get_template(name: str) -> ChatTemplate:
    try:
        return TEMPLATES[name]
    except KeyError:
        allowed = ", ".join(sorted(TEMPLATES))
        raise TemplateError(f"unknown chat template {name!r}; allowed: {allowed}") from None


def resolved_suffix(template: ChatTemplate, tokenizer: Any) -> str:
    """The text that ends an assistant turn for this tokenizer (its eos_token for vicuna/alpaca)."""
    if not template.eos_from_tokenizer:
        return template.assistant_suffix
    if not tokenizer.eos_token:
        raise TemplateTokenizerMismatch(
            f"template {template.name!r} ends turns with the tokenizer's eos_token, but "
            f"{_describe(tokenizer)} has none"
        )
    return str(tokenizer.eos_token)


def _bos(template: ChatTemplate, tokenizer: Any) -> str:
    return str(tokenizer.bos_token) if template.bos and tokenizer.bos_token else ""


def _describe(tokenizer: Any) -> str:
    return f"{type(tokenizer).__name__} ({getattr(tokenizer, 'name_or_path', '') or 'unnamed'})"


def check_template(template: ChatTemplate, tokenizer: Any) -> None:
    """Raise TemplateTokenizerMismatch unless every control token of ``template`` is one known token."""
    problems: list[str] = []
    tokens = list(template.special_tokens)
    required_bos = _REQUIRED_BOS.get(template.name)
    if required_bos is not None and tokenizer.bos_token != required_bos:
        problems.append(f"bos_token is {tokenizer.bos_token!r}, expected {required_bos!r}")
    for extra in (resolved_suffix(template, tokenizer), _bos(template, tokenizer)):
        if extra and extra not in tokens:
            tokens.append(extra)
    unk = tokenizer.unk_token_id
    for tok in tokens:
        ids = tokenizer.encode(tok, add_special_tokens=False)
        if len(ids) != 1:
            problems.append(f"{tok!r} -> {len(ids)} tokens")
        elif unk is not None and ids[0] == unk:
            problems.append(f"{tok!r} -> unk")
    if problems:
        raise TemplateTokenizerMismatch(
            f"template {template.name!r} does not fit tokenizer {_describe(tokenizer)}: "
            f"special tokens that are not single tokens: {'; '.join(problems)}"
        )


# encode_* run once per record (Ray Data map_batches): check each (tokenizer, template) pair once.
_CHECKED: weakref.WeakKeyDictionary[Any, set[ChatTemplate]] = weakref.WeakKeyDictionary()


def _ensure_checked(template: ChatTemplate, tokenizer: Any) -> None:
    done = _CHECKED.setdefault(tokenizer, set())
    if template not in done:
        check_template(template, tokenizer)
        done.add(template)


def has_tool_content(conversation: Any, tools: Any) -> bool:
    """True when a record needs a tool-calling format: non-empty ``tools`` or a tool_call/tool turn."""
    if tools:
        return True
    if not isinstance(conversation, list):
        return False
    return any(isinstance(turn, dict) and turn.get("role") in TOOL_ROLES for turn in conversation)


def _validate(conversation: Any, last_role: str) -> None:
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


def _check_tools(tools: Any) -> list[dict]:
    if tools is None:
        return []
    if not isinstance(tools, (list, tuple)) or not all(isinstance(tool, dict) for tool in tools):
        raise TemplateError("tools must be a list of JSON objects (function schemas)")
    return list(tools)


def _require_tool_format(template: ChatTemplate, conversation: list[dict], tools: list[dict]) -> None:
    if template.tools is None and has_tool_content(conversation, tools):
        raise TemplateToolsUnsupported(_unsupported_message(template.name))


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


def _tool_calls(content: str, position: int) -> list[tuple[str, dict]]:
    parsed = parse_tool_calls(content)
    if parsed is None:
        raise TemplateError(
            f"turn {position} (tool_call): content must be a JSON {{name, arguments}} object "
            "or a non-empty array of them"
        )
    return parsed[0]


def _segments(
    template: ChatTemplate,
    tokenizer: Any,
    conversation: list[dict],
    generation_prompt: bool,
    tools: Sequence[dict] = (),
) -> list[tuple[str, bool]]:
    """(text, trained) pieces whose concatenation is the rendered conversation; empties dropped."""
    segs: list[tuple[str, bool]] = [(_bos(template, tokenizer), False)]
    turns = conversation
    system = template.default_system
    offset = 0
    if conversation[0]["role"] == "system":
        system, turns, offset = conversation[0]["content"], conversation[1:], 1
    tf = template.tools
    if tools and tf is not None:
        block = (
            tf.tools_header
            + "".join(tf.tool_item_prefix + json.dumps(tool, ensure_ascii=False) for tool in tools)
            + tf.tools_footer
        )
        system = block if system is None else system + tf.system_separator + block
    if system is not None:
        segs.append((template.system_format.replace("{content}", system), False))
    suffix = resolved_suffix(template, tokenizer)
    for i, turn in enumerate(turns, start=offset):
        role = turn["role"]
        if role == "user":
            segs.append((template.user_format.replace("{content}", turn["content"]), False))
        elif role == "tool" and tf is not None:
            text = tf.result_open + tf.result_prefix + turn["content"] + tf.result_suffix + tf.result_close
            segs.append((text, False))
        else:
            content = turn["content"]
            if role == "tool_call" and tf is not None:
                content = tf.call_separator.join(
                    tf.call_open + name + tf.call_middle + json.dumps(arguments, ensure_ascii=False) + tf.call_close
                    for name, arguments in _tool_calls(content, i + 1)
                )
            segs += [(template.assistant_prefix, False), (content, True), (suffix, True)]
            segs.append((template.turn_separator, False))
    if generation_prompt:
        segs.append((template.assistant_prefix, False))
    return [(text, trained) for text, trained in segs if text]


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def encode_sft(
    tokenizer: Any,
    template: ChatTemplate,
    conversation: list[dict],
    max_len: int | None = None,
    tools: list[dict] | None = None,
) -> dict[str, list[int]]:
    """input_ids/labels/attention_mask with every assistant and tool_call turn (content + suffix) trained.

    ``tools`` (function schemas) go into the system turn; tool results, the system/tools block, user
    turns and generation prefixes are never trained. ``max_len`` keeps the start and drops the tail;
    a partially kept trained turn is trained on what is left. TemplateError if not a single trained
    token would survive; TemplateToolsUnsupported if the template has no tool format but the
    conversation has tools or tool turns.
    """
    _validate(conversation, "assistant")
    tools = _check_tools(tools)
    _require_tool_format(template, conversation, tools)
    _ensure_checked(template, tokenizer)
    segs = _segments(template, tokenizer, conversation, generation_prompt=False, tools=tools)
    input_ids: list[int] = []
    labels: list[int] = []
    for (_, trained), ids in zip(segs, _encode(tokenizer, [t for t, _ in segs]), strict=True):
        input_ids += ids
        labels += ids if trained else [IGNORE_INDEX] * len(ids)
    if max_len is not None:
        input_ids, labels = input_ids[:max_len], labels[:max_len]
        if all(label == IGNORE_INDEX for label in labels):
            raise TemplateError(
                f"max_len={max_len} leaves no trained token: the first assistant turn does not fit"
            )
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}


def render_prompt(
    template: ChatTemplate, tokenizer: Any, turns: list[dict], tools: list[dict] | None = None
) -> str:
    """BOS + system (the template default if none) + tools + turns + generation prompt.

    The turns end user-side (user, or tool: the result the model answers next). The text already
    holds the BOS where the template wants one: tokenize it with ``add_special_tokens=False``.
    """
    _validate(turns, "user")
    tools = _check_tools(tools)
    _require_tool_format(template, turns, tools)
    segs = _segments(template, tokenizer, turns, generation_prompt=True, tools=tools)
    return "".join(text for text, _ in segs)


def response_text(template: ChatTemplate, tokenizer: Any, response: str) -> str:
    """What a preference response is scored and trained on: the response plus the turn's end token."""
    return response + resolved_suffix(template, tokenizer)


def encode_preference(
    tokenizer: Any, template: ChatTemplate, record: dict, max_len: int | None = None
) -> dict[str, list[int]]:
    """{"conversations", "chosen", "rejected", optional "tools"} -> prompt_ids, chosen_ids, rejected_ids.

    With ``max_len`` the prompt is kept whole and each response is cut at the tail so that
    prompt + response fits; TemplateError if the prompt leaves no room for a response token.
    """
    if not isinstance(record, dict):
        raise TemplateError("preference record must be a dict")
    _validate(record.get("conversations"), "user")
    for key in ("chosen", "rejected"):
        if not isinstance(record.get(key), str):
            raise TemplateError(f"preference record: {key!r} must be a string")
    tools = _check_tools(record.get("tools"))
    _require_tool_format(template, record["conversations"], tools)
    _ensure_checked(template, tokenizer)
    segs = _segments(template, tokenizer, record["conversations"], generation_prompt=True, tools=tools)
    suffix = resolved_suffix(template, tokenizer)
    n = len(segs)
    ids = _encode(tokenizer, [t for t, _ in segs] + [record["chosen"], suffix, record["rejected"], suffix])
    prompt_ids = [tok for piece in ids[:n] for tok in piece]
    chosen_ids = ids[n] + ids[n + 1]
    rejected_ids = ids[n + 2] + ids[n + 3]
    if max_len is not None:
        room = max_len - len(prompt_ids)
        if room < 1:
            raise TemplateError(
                f"max_len={max_len} leaves no room for a response after a {len(prompt_ids)}-token prompt"
            )
        chosen_ids, rejected_ids = chosen_ids[:room], rejected_ids[:room]
    return {"prompt_ids": prompt_ids, "chosen_ids": chosen_ids, "rejected_ids": rejected_ids}


def apply_to_tokenizer(template: ChatTemplate, tokenizer: Any) -> None:
    """Save the template into the tokenizer (written with save_pretrained) after checking the fit."""
    check_template(template, tokenizer)
    tokenizer.chat_template = template.jinja
