"""Quality filters for canonical records: lengths, low-information responses, repetition, special characters.

`quality_reason(record, kind, cfg)` returns None for a record that passes, else a short machine-readable
reason "<check>:<field>" where field is text | system | user | assistant | chosen | rejected, e.g.
"too_short:assistant". Reasons never contain record text.

Checks, per field, in this order (the first failure is the reason):

    too_long          more than max_chars characters (checked first: nothing else runs on a huge field)
    low_entropy       responses only (assistant turns, chosen): Shannon entropy, in bits, of the jieba token
                      distribution below min_response_entropy_bits. Tokens that are only punctuation or
                      whitespace are left out, so "好的，好的" scores like "好的好的" (1 bit).
    non_answer        responses only: every token is an acknowledgement or filler (嗯, 好的, 知道了, 收到…).
                      Entropy alone cannot catch "好的，知道了" (4 distinct tokens = 2 bits).
    too_short         fewer than min_chars characters; responses also need min_response_chars
    repetitive        texts of 20+ characters whose most frequent character 3-gram is more than
                      max_char_repetition of all 3-grams
    special_chars     share of "special" characters among non-whitespace characters above
                      max_special_char_ratio. Not special: letters and digits of any script (CJK included),
                      whitespace, common CJK/ASCII punctuation and clinical unit/symbol characters
                      (% ‰ ℃ ° ± × ÷ / . - + ~ ≤ ≥ < > μ µ · ( ) [ ] : , ; ↑ ↓ ㎎ ㎖ …), so lab- and
                      dosage-heavy text passes while ★◆@#$ spam does not.

The low-information checks run before too_short so a non-answer is reported as one (嗯 is low_entropy, not
merely too short); a response with no token at all (empty, punctuation only) is too_short. For preference
records, chosen == rejected (ignoring whitespace) is "identical_responses", checked before the fields.
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections import Counter

from medgpt_ray.config import QualityConfig

KINDS = ("pretrain", "sft", "preference")
RESPONSE_ROLES = frozenset({"assistant", "chosen"})
REPETITION_MIN_CHARS = 20

# Tokens that carry no answer on their own (jieba splits e.g. 好的 -> 好/的, 知道了 -> 知道/了); compared lower-cased.
NON_ANSWER_TOKENS = frozenset(
    "嗯 嗯嗯 嗯嗯嗯 恩 恩恩 哦 哦哦 噢 喔 啊 呃 额 唔 好 好的 好滴 好吧 好哒 的 了 啦 呢 吧 呀 哈 哈哈 "
    "知道 知道了 晓得 明白 明白了 了解 收到 行 可以 是 是的 对 对的 没错 ok okay 谢谢 多谢 感谢 "
    "嗯呢 哦哦哦 我 你 您 我们".split()
)

_PUNCTUATION = set("，。？！：；、“”‘’（）《》〈〉【】「」『』—…·～－　,.;:!?'\"()[]{}-_/\\|~`*&^=")
_CLINICAL = set("%‰℃℉°±×÷/.-+~≤≥<>≈μµ·()[]:,;↑↓→←^=*'\"!?_&㎎㎏㎖㎜㎝㎞㎡㏄㏎㎍㎕㎗㎚㎛")
_ALLOWED_SYMBOLS = frozenset(_PUNCTUATION | _CLINICAL)

_jieba = None


def _tokenizer():
    """jieba, imported and initialised on first use with its INFO chatter silenced."""
    global _jieba
    if _jieba is None:
        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()
        _jieba = jieba
    return _jieba


def _is_noise_token(tok: str) -> bool:
    return all(c.isspace() or c in _PUNCTUATION or unicodedata.category(c)[0] == "P" for c in tok)


def content_tokens(text: str) -> list[str]:
    """jieba tokens of `text` without pure punctuation/whitespace tokens."""
    return [t for t in _tokenizer().lcut(text) if not _is_noise_token(t)]


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


def field_texts(record: dict, kind: str) -> list[tuple[str, str]]:
    """(role, text) of every text field: role is text | system | user | assistant | chosen | rejected."""
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r} (expected one of {', '.join(KINDS)})")
    if kind == "pretrain":
        return [("text", record["text"])]
    out = [(turn["role"], turn["content"]) for turn in record["conversations"]]
    if kind == "preference":
        out += [("chosen", record["chosen"]), ("rejected", record["rejected"])]
    return out


def _field_reason(role: str, text: str, cfg: QualityConfig) -> str | None:
    n = len(text)
    if n > cfg.max_chars:
        return "too_long"
    response = role in RESPONSE_ROLES
    if response:
        tokens = content_tokens(text)
        if not tokens:  # empty, or punctuation only (e.g. a reply that was nothing but a sign-off)
            return "too_short"
        if token_entropy(tokens) < cfg.min_response_entropy_bits:
            return "low_entropy"
        if all(t.lower() in NON_ANSWER_TOKENS for t in tokens):
            return "non_answer"
    if n < cfg.min_chars or (response and n < cfg.min_response_chars):
        return "too_short"
    if n >= REPETITION_MIN_CHARS and char_repetition(text) > cfg.max_char_repetition:
        return "repetitive"
    if special_char_ratio(text) > cfg.max_special_char_ratio:
        return "special_chars"
    return None


def _squash(text: str) -> str:
    return "".join(text.split())


def quality_reason(record: dict, kind: str, cfg: QualityConfig) -> str | None:
    """None if `record` (canonical, already normalized) passes every check, else "<check>:<field>"."""
    fields = field_texts(record, kind)
    if not cfg.enabled:
        return None
    if kind == "preference" and _squash(record["chosen"]) == _squash(record["rejected"]):
        return "identical_responses"
    for role, text in fields:
        reason = _field_reason(role, text, cfg)
        if reason is not None:
            return f"{reason}:{role}"
    return None
