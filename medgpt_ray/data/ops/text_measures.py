"""Measures of a text that the quality checks compare with their thresholds: which characters are separators,
content or "special", jieba's content tokens and their entropy, character 3-gram repetition and the share of
special characters (data/ops/quality.py says what each check does with them). Reasons and thresholds live there.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections import Counter

_PUNCTUATION = set("，。？！：；、“”‘’（）《》〈〉【】「」『』—…·～－　,.;:!?'\"()[]{}-_/\\|~`*&^=")
_CLINICAL = set("%‰℃℉°±×÷/.-+~≤≥<>≈μµ·()[]:,;↑↓→←^=*'\"!?_&㎎㎏㎖㎜㎝㎞㎡㏄㏎㎍㎕㎗㎚㎛")
_ALLOWED_SYMBOLS = frozenset(_PUNCTUATION | _CLINICAL)

_jieba = None


def load_tokenizer():
    """jieba, imported and initialised on first use with its INFO chatter silenced."""
    global _jieba
    if _jieba is None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()
        _jieba = jieba
    return _jieba


def is_separator(ch: str) -> bool:
    return ch.isspace() or ch in _PUNCTUATION or unicodedata.category(ch)[0] == "P"


def is_content_char(ch: str) -> bool:
    """A letter or digit of any script (CJK included)."""
    return ch.isalnum() or unicodedata.category(ch)[0] in "LN"


def _is_content_token(tok: str) -> bool:
    return any(is_content_char(c) for c in tok)


def content_tokens(text: str) -> list[str]:
    """jieba tokens of `text` that hold a letter or digit (punctuation, whitespace, emoji and symbols are left out)."""
    return [t for t in load_tokenizer().lcut(text) if _is_content_token(t)]


def token_entropy(tokens: list[str]) -> float:
    """Shannon entropy (bits) of the token frequency distribution; 0.0 for no tokens."""
    n = len(tokens)
    if n == 0:
        return 0.0
    return max(0.0, -sum(c / n * math.log2(c / n) for c in Counter(tokens).values()))


def char_repetition(text: str) -> float:
    """Share of the most frequent character 3-gram among all 3-grams (0.0 for texts under 3 characters)."""
    total = len(text) - 2
    if total <= 0:
        return 0.0
    grams = Counter(text[i : i + 3] for i in range(total))
    return max(grams.values()) / total



def _is_special(ch: str) -> bool:
    if ch.isalnum() or ch.isspace() or ch in _ALLOWED_SYMBOLS:
        return False
    cat = unicodedata.category(ch)
    if cat[0] in "LN":  # letters/digits of any script (isalnum misses a few, e.g. combining forms)
        return False
    if cat == "Mn":  # combining marks belong to the letter before them
        return False
    return True


def special_char_ratio(text: str) -> float:
    """Share of special characters (see module docstring) among the non-whitespace characters."""
    visible = 0
    special = 0
    for ch in text:
        if ch.isspace():
            continue
        visible += 1
        if _is_special(ch):
            special += 1
    return special / visible if visible else 0.0

