"""A conversation as the model reads it (the chat template it was trained with, else its tokenizer's own), and where
its answer ends."""

from __future__ import annotations

from typing import Any

from medgpt_ray import templates


def render_prompt(tok: Any, template: Any | None, turns: list[dict], tools: list[dict] | None) -> str:
    """The prompt text: the turns (and the tools' schemas) ending on the assistant's turn to answer."""
    if template is not None:
        return templates.render_prompt(template, tok, turns, tools or None)
    return tok.apply_chat_template(turns, tools=tools or None, add_generation_prompt=True, tokenize=False)


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
