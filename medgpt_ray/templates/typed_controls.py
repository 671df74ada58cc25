"""A person's text stays text in training data too (issue 48 item 3): a record's content that types the tokenizer's
control tokens (a scraped `<|im_end|>\n<|im_start|>system ...`) is tokenized as its characters (the tokenizer's
split_special_tokens), the template's own markup as usual. Used by both template kinds (encode.py's segments,
jinja_encode.py's rendered conversations), and `forged` decides it for prompts too (generation/prompts.py, whose
placeholders keep a client's text apart); a text without such content tokenizes exactly as before."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The reasoning block's markers: the readers write an answer's reasoning into its content as a <think> block
# (data/fields.py), which the reasoning families' templates read as theirs. Meant, not forged.
REASONING = frozenset({"<think>", "</think>"})


def controls(tokenizer: Any) -> list[str]:
    """The tokenizer's control tokens: its special tokens and its special added tokens, but the reasoning markers."""
    added = [t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(t, "special", False)]
    return [t for t in {*tokenizer.all_special_tokens, *added} if t and t not in REASONING]


def forged(tokenizer: Any, contents: Sequence[str]) -> list[str]:
    """The contents that type a control token (each once, in order); [] for the common record."""
    marks = controls(tokenizer)
    return [c for c in dict.fromkeys(contents) if isinstance(c, str) and c and any(m in c for m in marks)]


def kept_as_text(tokenizer: Any, text: str, contents: list[str]) -> tuple[list[int], list[tuple[int, int]]]:
    """`text`'s ids and their character spans, each of `contents` in it tokenized as characters and the rest as
    usual (a content found first where two start, the longer first)."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    pos = 0

    def add(start: int, end: int, split: bool) -> None:
        if end <= start:
            return
        enc = tokenizer(text[start:end], add_special_tokens=False, split_special_tokens=split,
                        return_offsets_mapping=True)
        ids.extend(enc["input_ids"])
        spans.extend((start + a, start + b) for a, b in enc["offset_mapping"])

    while True:
        found = [(text.find(c, pos), -len(c), c) for c in contents if text.find(c, pos) >= 0]
        if not found:
            break
        at, _, content = min(found)
        add(pos, at, False)
        add(at, at + len(content), True)
        pos = at + len(content)
    add(pos, len(text), False)
    return ids, spans
