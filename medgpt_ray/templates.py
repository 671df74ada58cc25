"""Chat templates and response-only label masks for SFT, reward modelling and DPO.

A conversation is ``[{"role": "system"|"user"|"assistant", "content": str}, ...]``: an optional
leading system turn, then user/assistant alternating, starting with user.

Tokenization is segment by segment (``add_special_tokens=False``) and the ids are concatenated, so
the label mask is exact by construction instead of being recovered from character offsets. The
concatenated segment texts always equal the rendered conversation, and each template's ``jinja``
renders the same text through ``tokenizer.apply_chat_template``.

Every assistant turn is trained (content + suffix): MedicalGPT-style runs that train only the last
turn waste most of a multi-turn dialogue. The suffix (e.g. ``<|im_end|>`` or ``</s>``) is trained so
the model learns to stop; the generation prompt and separators are not (they are given at inference).
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from typing import Any

IGNORE_INDEX = -100
_ROLES = ("system", "user", "assistant")


class TemplateError(ValueError):
    """A conversation or record does not fit a template (messages never quote record text)."""


class TemplateTokenizerMismatch(TemplateError):
    """The tokenizer splits a template's control token into pieces (or maps it to unk)."""


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


def _split_format(fmt: str) -> tuple[str, str]:
    pre, sep, post = fmt.partition("{content}")
    if not sep:
        raise TemplateError(f"format {fmt!r} has no {{content}} placeholder")
    return pre, post


def _jinja(t: dict[str, Any]) -> str:
    """The HF chat template rendering exactly what _segments() renders.

    Literals are JSON strings (Jinja unescapes ``\\n`` and ``\\uXXXX`` alike), all on one line so HF's
    trim_blocks/lstrip_blocks cannot touch the whitespace.
    """
    q = json.dumps
    s_pre, s_post = _split_format(t["system_format"])
    u_pre, u_post = _split_format(t["user_format"])
    prefix = q(t["assistant_prefix"])
    suffix = "eos_token" if t["eos_from_tokenizer"] else q(t["assistant_suffix"])
    default = t["default_system"]
    return (
        ("{{ bos_token if bos_token else '' }}" if t["bos"] else "")
        + "{%- set ns = namespace(start=0) -%}{%- if messages and messages[0]['role'] == 'system' -%}"
        + f"{{{{ {q(s_pre)} + messages[0]['content'] + {q(s_post)} }}}}{{%- set ns.start = 1 -%}}"
        + (f"{{%- else -%}}{{{{ {q(s_pre + default + s_post)} }}}}" if default else "")
        + "{%- endif -%}{%- for message in messages[ns.start:] -%}{%- if message['role'] == 'user' -%}"
        + f"{{{{ {q(u_pre)} + message['content'] + {q(u_post)} }}}}{{%- else -%}}{{{{ {prefix} }}}}"
        + f"{{% generation %}}{{{{ message['content'] + {suffix} }}}}{{% endgeneration %}}"
        + f"{{{{ {q(t['turn_separator'])} }}}}{{%- endif -%}}{{%- endfor -%}}"
        + f"{{%- if add_generation_prompt -%}}{{{{ {prefix} }}}}{{%- endif -%}}"
    )


def _make(name: str, **kw: Any) -> ChatTemplate:
    return ChatTemplate(name=name, jinja=_jinja(kw), **kw)


_CHATML = _make(
    "chatml",
    system_format="<|im_start|>system\n{content}<|im_end|>\n",
    user_format="<|im_start|>user\n{content}<|im_end|>\n",
    assistant_prefix="<|im_start|>assistant\n",
    assistant_suffix="<|im_end|>",
    turn_separator="\n",  # Qwen's template writes "<|im_end|>\n" after every turn, the last one too
    special_tokens=("<|im_start|>", "<|im_end|>"),
    # Qwen2.5's own template injects "You are Qwen, created by Alibaba Cloud..."; we inject nothing so
    # tiny runs stay short and the data's own system turn (if any) is what the model sees.
    default_system=None,
    bos=False,  # Qwen tokenizers have no BOS
    eos_from_tokenizer=False,
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


def _validate(conversation: Any, last_role: str) -> None:
    """Shape checks; errors name positions and roles only, never the (possibly patient) text."""
    if not isinstance(conversation, list) or not conversation:
        raise TemplateError("conversation must be a non-empty list of {role, content} turns")
    for i, turn in enumerate(conversation):
        if not isinstance(turn, dict) or turn.get("role") not in _ROLES:
            role = turn.get("role") if isinstance(turn, dict) else type(turn).__name__
            raise TemplateError(f"turn {i}: role must be one of {_ROLES}, got {role!r}")
        if not isinstance(turn.get("content"), str):
            raise TemplateError(f"turn {i} ({turn['role']}): content must be a string")
    start = 1 if conversation[0]["role"] == "system" else 0
    if start == len(conversation):
        raise TemplateError("conversation has a system turn but no user turn")
    for i in range(start, len(conversation)):
        expected = "user" if (i - start) % 2 == 0 else "assistant"
        if conversation[i]["role"] != expected:
            raise TemplateError(f"turn {i}: expected role {expected!r}, got {conversation[i]['role']!r}")
    if conversation[-1]["role"] != last_role:
        raise TemplateError(
            f"conversation must end with a {last_role} turn, ends with {conversation[-1]['role']!r}"
        )


def _segments(
    template: ChatTemplate, tokenizer: Any, conversation: list[dict], generation_prompt: bool
) -> list[tuple[str, bool]]:
    """(text, trained) pieces whose concatenation is the rendered conversation; empties dropped."""
    segs: list[tuple[str, bool]] = [(_bos(template, tokenizer), False)]
    turns = conversation
    system = template.default_system
    if conversation[0]["role"] == "system":
        system, turns = conversation[0]["content"], conversation[1:]
    if system is not None:
        segs.append((template.system_format.replace("{content}", system), False))
    suffix = resolved_suffix(template, tokenizer)
    for turn in turns:
        if turn["role"] == "user":
            segs.append((template.user_format.replace("{content}", turn["content"]), False))
        else:
            segs += [(template.assistant_prefix, False), (turn["content"], True), (suffix, True)]
            segs.append((template.turn_separator, False))
    if generation_prompt:
        segs.append((template.assistant_prefix, False))
    return [(text, trained) for text, trained in segs if text]


def _encode(tokenizer: Any, texts: list[str]) -> list[list[int]]:
    return tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []


def encode_sft(
    tokenizer: Any, template: ChatTemplate, conversation: list[dict], max_len: int | None = None
) -> dict[str, list[int]]:
    """input_ids/labels/attention_mask with every assistant turn (content + suffix) trained.

    ``max_len`` keeps the start and drops the tail; a partially kept assistant turn is trained on
    what is left. TemplateError if not a single trained token would survive.
    """
    _validate(conversation, "assistant")
    _ensure_checked(template, tokenizer)
    segs = _segments(template, tokenizer, conversation, generation_prompt=False)
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


def render_prompt(template: ChatTemplate, tokenizer: Any, turns: list[dict]) -> str:
    """BOS + system (the template default if none) + turns + generation prompt; turns end with user.

    The text already holds the BOS where the template wants one: tokenize it with
    ``add_special_tokens=False``.
    """
    _validate(turns, "user")
    return "".join(text for text, _ in _segments(template, tokenizer, turns, generation_prompt=True))


def response_text(template: ChatTemplate, tokenizer: Any, response: str) -> str:
    """What a preference response is scored and trained on: the response plus the turn's end token."""
    return response + resolved_suffix(template, tokenizer)


def encode_preference(
    tokenizer: Any, template: ChatTemplate, record: dict, max_len: int | None = None
) -> dict[str, list[int]]:
    """{"conversations", "chosen", "rejected"} -> prompt_ids, chosen_ids, rejected_ids.

    With ``max_len`` the prompt is kept whole and each response is cut at the tail so that
    prompt + response fits; TemplateError if the prompt leaves no room for a response token.
    """
    if not isinstance(record, dict):
        raise TemplateError("preference record must be a dict")
    _validate(record.get("conversations"), "user")
    for key in ("chosen", "rejected"):
        if not isinstance(record.get(key), str):
            raise TemplateError(f"preference record: {key!r} must be a string")
    _ensure_checked(template, tokenizer)
    segs = _segments(template, tokenizer, record["conversations"], generation_prompt=True)
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
