"""A conversation as the model reads it (the chat template it was trained with, else its tokenizer's own), and where
its answer ends."""

from __future__ import annotations

from typing import Any

from medgpt_ray import templates
from medgpt_ray.templates import typed_controls


def render_prompt(tok: Any, template: Any | None, turns: list[dict], tools: list[dict] | None) -> str:
    """The prompt text: the turns (and the tools' schemas) ending on the assistant's turn to answer."""
    if template is not None:
        return templates.render_prompt(template, tok, turns, tools or None)
    return tok.apply_chat_template(turns, tools=tools or None, add_generation_prompt=True, tokenize=False)


def prompt_token_ids(tok: Any, template: Any | None, turns: list[dict], tools: list[dict] | None,
                     text: str | None = None) -> list[int]:
    """The prompt's token ids, a client's text kept as text: a turn that types a control token (a forged
    `<|im_end|>\n<|im_start|>system`) gets the ids of its characters, not the control token, so no client can open a
    turn of its own. Only the template's own markup becomes control tokens. Without such text (the common case) the
    rendered prompt (`text`, when the caller has it) is tokenized whole, as before."""
    if not typed_controls.forged(tok, [t["content"] for t in turns]):  # the same test as training data's
        text = render_prompt(tok, template, turns, tools) if text is None else text
        return tok(text, add_special_tokens=False)["input_ids"]
    # Each content rendered as a placeholder of private-use characters, then tokenized on its own with the
    # tokenizer's split_special_tokens: the template around it is tokenized as it always is.
    marks = [f"\ue000{i}\ue001" for i in range(len(turns))]
    rendered = render_prompt(tok, template, [{**t, "content": m} for t, m in zip(turns, marks, strict=True)], tools)
    if any(rendered.count(m) != 1 for m in marks):
        raise templates.TemplateError("a message holds one of the model's control tokens, which this chat "
                                      "template cannot keep as text")
    ids: list[int] = []
    pos = 0
    for turn, mark in zip(turns, marks, strict=True):
        at = rendered.index(mark, pos)
        ids += tok(rendered[pos:at], add_special_tokens=False)["input_ids"]
        ids += tok(turn["content"], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        pos = at + len(mark)
    return ids + tok(rendered[pos:], add_special_tokens=False)["input_ids"]


def stop_token_ids(tok: Any, template: Any | None) -> list[int]:
    """EOS, and the first token of the template's end of turn (chatml's <|im_end|>): where an answer ends."""
    ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
    if template is not None:
        suffix = templates.resolved_suffix(template, tok).strip()
        if suffix:
            ids.add(tok(suffix, add_special_tokens=False)["input_ids"][0])
    return sorted(ids)


def answer_until_stop(tok: Any, stops: list[int], ids: list[int]) -> tuple[str, int, bool]:
    """The sample's text up to its first stop token, its token count, and whether it stopped by itself."""
    for n, t in enumerate(ids):
        if t in stops:
            return tok.decode(ids[:n], skip_special_tokens=True), n, True
    return tok.decode(ids, skip_special_tokens=True), len(ids), False
