"""Rendering and tokenizing conversations with a template: segment by segment, so the label mask is exact by
construction (see the package docstring)."""

from __future__ import annotations

import json
import weakref
from collections.abc import Sequence
from typing import Any

from medgpt_ray.templates import jinja_encode, typed_controls
from medgpt_ray.templates.base import (
    IGNORE_INDEX,
    TemplateError,
    TemplateTokenizerMismatch,
    TemplateToolsUnsupported,
)
from medgpt_ray.templates.catalog import REQUIRED_BOS, ChatTemplate
from medgpt_ray.templates.conversation import check_tools, has_tool_content, tool_calls_of, validate_conversation
from medgpt_ray.templates.families import JinjaTemplate
from medgpt_ray.templates.jinja_messages import supports_tools
from medgpt_ray.templates.resolve import resolve
from medgpt_ray.templates.tool_format import unsupported_message

# Every public function takes a ChatTemplate (segments, below), a JinjaTemplate (jinja_encode.py) or AUTO, resolved
# per tokenizer first (resolve.py). Type hints say Any for the template where all three are accepted.


def resolved_suffix(template: Any, tokenizer: Any) -> str:
    """The text that ends an assistant turn for this tokenizer (its eos_token for vicuna/alpaca)."""
    template = resolve(template, tokenizer)
    if isinstance(template, JinjaTemplate):
        return jinja_encode.end_of_turn(tokenizer, template)
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

def check_template(template: Any, tokenizer: Any) -> None:
    """Raise TemplateTokenizerMismatch unless every control token of ``template`` is one known token."""
    template = resolve(template, tokenizer)
    if isinstance(template, JinjaTemplate):
        jinja_encode.check(tokenizer, template)
        return
    problems: list[str] = []
    tokens = list(template.special_tokens)
    required_bos = REQUIRED_BOS.get(template.name)
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
_CHECKED: weakref.WeakKeyDictionary[Any, set[Any]] = weakref.WeakKeyDictionary()

def _ensure_checked(template: Any, tokenizer: Any) -> None:
    done = _CHECKED.setdefault(tokenizer, set())
    if template not in done:
        check_template(template, tokenizer)
        done.add(template)

def _require_tool_format(template: Any, conversation: list[dict], tools: list[dict], tokenizer: Any) -> None:
    if not has_tool_content(conversation, tools):
        return
    if template.tools is None if isinstance(template, ChatTemplate) else not supports_tools(tokenizer, template):
        raise TemplateToolsUnsupported(unsupported_message(template.name))

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
                    for name, arguments in tool_calls_of(content, i + 1)
                )
            segs += [(template.assistant_prefix, False), (content, True), (suffix, True)]
            segs.append((template.turn_separator, False))
    if generation_prompt:
        segs.append((template.assistant_prefix, False))
    return [(text, trained) for text, trained in segs if text]

def _encode(tokenizer: Any, texts: list[str], contents: Sequence[str] = ()) -> list[list[int]]:
    """Each text's ids; a person's text in it (`contents`: the turns' contents, a response) that types a control
    token is tokenized as its characters (typed_controls.py)."""
    if not texts:
        return []
    typed = typed_controls.forged(tokenizer, contents)
    if not typed:
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    return [typed_controls.kept_as_text(tokenizer, text, typed)[0] for text in texts]

def _segment_ids(
    tokenizer: Any, template: ChatTemplate, conversation: list[dict], tools: list[dict]
) -> tuple[list[int], list[int]]:
    segs = _segments(template, tokenizer, conversation, generation_prompt=False, tools=tools)
    input_ids: list[int] = []
    labels: list[int] = []
    contents = [t["content"] for t in conversation]
    for (_, trained), ids in zip(segs, _encode(tokenizer, [t for t, _ in segs], contents), strict=True):
        input_ids += ids
        labels += ids if trained else [IGNORE_INDEX] * len(ids)
    return input_ids, labels

def encode_sft(
    tokenizer: Any,
    template: Any,
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
    template = resolve(template, tokenizer)
    validate_conversation(conversation, "assistant")
    tools = check_tools(tools)
    _require_tool_format(template, conversation, tools, tokenizer)
    _ensure_checked(template, tokenizer)
    if isinstance(template, JinjaTemplate):
        input_ids, labels = jinja_encode.encode_sft(tokenizer, template, conversation, tools)
    else:
        input_ids, labels = _segment_ids(tokenizer, template, conversation, tools)
    if max_len is not None:
        input_ids, labels = input_ids[:max_len], labels[:max_len]
        if all(label == IGNORE_INDEX for label in labels):
            raise TemplateError(
                f"max_len={max_len} leaves no trained token: the first assistant turn does not fit"
            )
    return {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}

def encode_sft_many(
    tokenizer: Any, template: Any, conversations: Sequence[tuple[list[dict], list[dict] | None]]
) -> list[dict[str, list[int]] | TemplateToolsUnsupported]:
    """encode_sft of each (conversation, tools), the same ids and labels, the segments of every conversation that
    types no control token tokenized in one call: the tokenizer encodes a batch across its threads, and a call per
    conversation spent most of a stage's encoding in the call itself (issue 48). A conversation with tools the
    template cannot format comes back as its TemplateToolsUnsupported; any other template error is raised."""
    template = resolve(template, tokenizer)
    _ensure_checked(template, tokenizer)
    out: list[Any] = [None] * len(conversations)
    pending: list[tuple[int, list[tuple[str, bool]]]] = []
    for i, (conversation, tools) in enumerate(conversations):
        validate_conversation(conversation, "assistant")
        tools = check_tools(tools)
        try:
            _require_tool_format(template, conversation, tools, tokenizer)
        except TemplateToolsUnsupported as e:
            out[i] = e
            continue
        contents = [t["content"] for t in conversation]
        if isinstance(template, JinjaTemplate) or typed_controls.forged(tokenizer, contents):
            out[i] = encode_sft(tokenizer, template, conversation, tools=tools)  # its own path, one at a time
        else:
            pending.append((i, _segments(template, tokenizer, conversation, generation_prompt=False, tools=tools)))
    texts = [text for _, segs in pending for text, _ in segs]
    ids = iter(tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else [])
    for i, segs in pending:
        input_ids: list[int] = []
        labels: list[int] = []
        for _, trained in segs:
            piece = next(ids)
            input_ids += piece
            labels += piece if trained else [IGNORE_INDEX] * len(piece)
        out[i] = {"input_ids": input_ids, "labels": labels, "attention_mask": [1] * len(input_ids)}
    return out

def render_prompt(template: Any, tokenizer: Any, turns: list[dict], tools: list[dict] | None = None) -> str:
    """BOS + system (the template default if none) + tools + turns + generation prompt.

    The turns end user-side (user, or tool: the result the model answers next). The text already
    holds the BOS where the template wants one: tokenize it with ``add_special_tokens=False``.
    """
    template = resolve(template, tokenizer)
    validate_conversation(turns, "user")
    tools = check_tools(tools)
    _require_tool_format(template, turns, tools, tokenizer)
    if isinstance(template, JinjaTemplate):
        return jinja_encode.render_prompt(tokenizer, template, turns, tools)
    segs = _segments(template, tokenizer, turns, generation_prompt=True, tools=tools)
    return "".join(text for text, _ in segs)

def response_text(template: Any, tokenizer: Any, response: str) -> str:
    """What a preference response is scored and trained on: the response plus the turn's end token."""
    return response + resolved_suffix(template, tokenizer)

def encode_preference(
    tokenizer: Any, template: Any, record: dict, max_len: int | None = None
) -> dict[str, list[int]]:
    """{"conversations", "chosen", "rejected", optional "tools"} -> prompt_ids, chosen_ids, rejected_ids.

    With ``max_len`` the prompt is kept whole and each response is cut at the tail so that
    prompt + response fits; TemplateError if the prompt leaves no room for a response token.
    """
    if not isinstance(record, dict):
        raise TemplateError("preference record must be a dict")
    template = resolve(template, tokenizer)
    validate_conversation(record.get("conversations"), "user")
    for key in ("chosen", "rejected"):
        if not isinstance(record.get(key), str):
            raise TemplateError(f"preference record: {key!r} must be a string")
    tools = check_tools(record.get("tools"))
    _require_tool_format(template, record["conversations"], tools, tokenizer)
    _ensure_checked(template, tokenizer)
    if isinstance(template, JinjaTemplate):  # the prompt as one text: the template decides where tokens split
        segs = [(jinja_encode.render_prompt(tokenizer, template, record["conversations"], tools), False)]
    else:
        segs = _segments(template, tokenizer, record["conversations"], generation_prompt=True, tools=tools)
    suffix = resolved_suffix(template, tokenizer)
    n = len(segs)
    contents = [t["content"] for t in record["conversations"]] + [record["chosen"], record["rejected"]]
    ids = _encode(tokenizer, [t for t, _ in segs] + [record["chosen"], suffix, record["rejected"], suffix], contents)
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

def apply_to_tokenizer(template: Any, tokenizer: Any) -> None:
    """Save the template into the tokenizer (written with save_pretrained) after checking the fit: a Jinja
    family's template as the model ships it (not its training variant); ``auto`` leaves the tokenizer's own."""
    template = resolve(template, tokenizer)
    check_template(template, tokenizer)
    tokenizer.chat_template = template.jinja
