"""Token ids and response-only labels for the Jinja templates (families.py), from the training variant's
{% generation %} markers through ``apply_chat_template(..., return_assistant_tokens_mask=True)``.

Never by rendering a conversation with and without each turn: templates that re-render earlier turns (Qwen3 drops
earlier turns' reasoning) break that. Two refinements make the marked span "what the model writes, up to and with
its end-of-turn token", the rule the segment templates follow (package docstring):

- what the generation prompt already gives is not trained: where a marked span starts with the tail of the
  generation prompt (Qwen3/3.5 without thinking: ``<think>\\n\\n</think>\\n\\n``; Qwen3.5 thinking: ``<think>\\n``),
  those tokens are prompt, as they are at inference;
- whitespace after the end-of-turn token (Qwen's ``\\n`` after ``<|im_end|>``) is not trained: generation stops at
  the end-of-turn token and never writes it.
"""

from __future__ import annotations

import functools
from typing import Any

from medgpt_ray.templates import typed_controls
from medgpt_ray.templates.base import IGNORE_INDEX, TemplateError, TemplateTokenizerMismatch
from medgpt_ray.templates.families import JinjaTemplate
from medgpt_ray.templates.jinja_messages import render, thinks, to_messages

_PROBE_USER = [{"role": "user", "content": "probe question"}]
_PROBE_ANSWER = "probe answer"


@functools.lru_cache(maxsize=64)
def _prompt_tail(tokenizer: Any, template: JinjaTemplate, thinking: bool) -> str:
    """What add_generation_prompt appends after a user turn (e.g. ``<|im_start|>assistant\\n<think>\\n``)."""
    bare = render(tokenizer, template.training, _PROBE_USER, thinking=thinking)
    prompt = render(tokenizer, template.training, _PROBE_USER, generation_prompt=True, thinking=thinking)
    if not prompt.startswith(bare):
        raise TemplateError(f"template {template.name!r}: the generation prompt rewrites the conversation before it")
    return prompt[len(bare):]


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def _trained(text: str, offsets: list[tuple[int, int]], mask: list[int], tail: str) -> list[bool]:
    """The marker mask less the generation prompt's tail at each span's start and the whitespace after its end."""
    keep = [bool(m) for m in mask]
    for a, b in _runs(mask):
        start = offsets[a][0]
        for k in range(min(len(tail), offsets[b - 1][1] - start), 0, -1):
            before = len(tail) - k
            if start >= before and text[start - before:start + k] == tail:
                for t in range(a, b):
                    if offsets[t][1] <= start + k:
                        keep[t] = False
                break
        for t in range(b - 1, a - 1, -1):
            if not keep[t] or text[offsets[t][0]:offsets[t][1]].strip():
                break
            keep[t] = False
    return keep


def _encode_marked(
    tokenizer: Any, template: JinjaTemplate, messages: list[dict], tools: list[dict] | None, thinking: bool
) -> tuple[list[int], list[bool], str, list[tuple[int, int]]]:
    out = render(tokenizer, template.training, messages, tools, thinking=thinking, masks=True)
    text = render(tokenizer, template.training, messages, tools, thinking=thinking)
    ids, offsets = list(out["input_ids"]), list(out.encodings[0].offsets)
    keep = _trained(text, offsets, list(out["assistant_masks"]), _prompt_tail(tokenizer, template, thinking))
    return ids, keep, text, offsets


def encode_sft(
    tokenizer: Any, template: JinjaTemplate, conversation: list[dict], tools: list[dict]
) -> tuple[list[int], list[int]]:
    """(input_ids, labels) of a validated conversation."""
    ids, keep, text, offsets = _encode_marked(
        tokenizer, template, to_messages(template, conversation), tools, thinks(template, conversation)
    )
    typed = typed_controls.forged(tokenizer, [t["content"] for t in conversation])
    if typed:  # the contents that type control tokens re-tokenized as characters; trained where the text was
        trained = [offsets[t] for t, k in enumerate(keep) if k]
        ids, spans = typed_controls.kept_as_text(tokenizer, text, typed)
        keep = [any(a <= s < b for a, b in trained) for s, _ in spans]
    return ids, [i if k else IGNORE_INDEX for i, k in zip(ids, keep, strict=True)]


@functools.lru_cache(maxsize=64)
def end_of_turn(tokenizer: Any, template: JinjaTemplate) -> str:
    """The trained text after an answer's content: its end-of-turn token (``<|im_end|>``, ``<|eot_id|>``, the
    EOS, GLM's next ``<|user|>``), read off a one-turn probe's marked span."""
    messages = [*_PROBE_USER, {"role": "assistant", "content": _PROBE_ANSWER}]
    _, keep, text, offsets = _encode_marked(tokenizer, template, messages, None, False)
    trained = [offsets[t] for t, k in enumerate(keep) if k]
    end = text.rfind(_PROBE_ANSWER) + len(_PROBE_ANSWER)
    if not trained or trained[-1][1] <= end:
        raise TemplateTokenizerMismatch(
            f"template {template.name!r}: its {{% generation %}} block ends at the answer's content, so no "
            "end-of-turn token would be trained"
        )
    return text[end:trained[-1][1]]


def render_prompt(tokenizer: Any, template: JinjaTemplate, turns: list[dict], tools: list[dict]) -> str:
    """Turns ending user-side + the generation prompt, without thinking (prompt and preference records carry no
    reasoning): the text holds the BOS where the template writes one."""
    return render(tokenizer, template.training, to_messages(template, turns), tools, generation_prompt=True)


def check(tokenizer: Any, template: JinjaTemplate) -> None:
    """The end-of-turn token must be one token of this tokenizer: the stop the model learns, and what generation
    stops on."""
    suffix = end_of_turn(tokenizer, template).strip()
    ids = tokenizer.encode(suffix, add_special_tokens=False)
    if len(ids) != 1 or (tokenizer.unk_token_id is not None and ids[0] == tokenizer.unk_token_id):
        raise TemplateTokenizerMismatch(
            f"template {template.name!r} does not fit tokenizer {type(tokenizer).__name__} "
            f"({getattr(tokenizer, 'name_or_path', '') or 'unnamed'}): its end-of-turn {suffix!r} -> {len(ids)} tokens"
        )
