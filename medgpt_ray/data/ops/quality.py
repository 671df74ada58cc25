"""Quality filters for canonical records: lengths, low-information responses, repetition, special characters.

`quality_reason(record, kind, cfg)` returns None for a record that passes, else a short machine-readable
reason "<check>:<field>" where field is text | system | user | assistant | chosen | rejected | tool_call |
tool | answer | completion, e.g. "non_answer:assistant". Reasons never contain record text.

Fields and what is checked on them:

    text, system, user, rejected,  too_long, too_short (min_chars), repetitive, special_chars
    completion                     (an unpaired completion may be the undesirable example: judged as rejected)
    assistant, chosen (responses)  too_long, the low-information checks, too_short (min_response_chars),
                                   repetitive, special_chars
    tool_call, tool, answer        too_long only: tool calls/results are JSON or machine output, and a prompt
                                   record's reference answer may be one letter or one number

Checks, in this order (the first failure is the reason):

    too_long          more than max_chars characters (checked first: nothing else runs on a huge field)
    (responses)       the low-information checks of data/ops/low_information.py (too_short, non_answer,
                      low_entropy)
    too_short         fewer than min_chars characters (responses: min_response_chars, default 1)
    repetitive        texts of 20+ characters whose most frequent character 3-gram is more than
                      max_char_repetition of all 3-grams
    special_chars     share of "special" characters among non-whitespace characters above
                      max_special_char_ratio. Not special: letters and digits of any script (CJK included),
                      whitespace, common CJK/ASCII punctuation and clinical unit/symbol characters
                      (% ‰ ℃ ° ± × ÷ / . - + ~ ≤ ≥ < > μ µ · ( ) [ ] : , ; ↑ ↓ ㎎ ㎖ …), so lab- and
                      dosage-heavy text passes while ★◆@#$ spam does not.

Measures (tokens, entropy, 3-gram repetition, the special-character ratio) come from data/ops/text_measures.py.
For preference records, chosen == rejected (ignoring whitespace) is "identical_responses", checked before the
fields.
"""

from __future__ import annotations

from medgpt_ray.config import QualityConfig
from medgpt_ray.data.kinds import KINDS
from medgpt_ray.data.ops.low_information import response_reason
from medgpt_ray.data.ops.text_measures import char_repetition, special_char_ratio

RESPONSE_ROLES = frozenset({"assistant", "chosen"})
# Machine output (tool calls and results) and a prompt record's reference answer: checked for too_long only.
LENGTH_ONLY_ROLES = frozenset({"tool_call", "tool", "answer"})
REPETITION_MIN_CHARS = 20


def field_texts(record: dict, kind: str) -> list[tuple[str, str]]:
    """(role, text) of every text field: role is text | system | user | assistant | tool_call | tool | chosen |
    rejected | answer | completion. A record's `tools` (function schemas) is not a text field."""
    if kind not in KINDS:
        raise ValueError(f"unknown data kind {kind!r} (expected one of {', '.join(KINDS)})")
    if kind == "pretrain":
        return [("text", record["text"])]
    out = [(turn["role"], turn["content"]) for turn in record["conversations"]]
    if kind == "preference":
        out += [("chosen", record["chosen"]), ("rejected", record["rejected"])]
    elif kind == "prompt" and record.get("answer") is not None:
        out.append(("answer", record["answer"]))
    elif kind == "unpaired":
        out.append(("completion", record["completion"]))
    return out


def _field_reason(role: str, text: str, cfg: QualityConfig) -> str | None:
    n = len(text)
    if n > cfg.max_chars:
        return "too_long"
    if role in LENGTH_ONLY_ROLES:
        return None
    response = role in RESPONSE_ROLES
    if response:
        reason = response_reason(text, cfg)
        if reason is not None:
            return reason
    if n < (cfg.min_response_chars if response else cfg.min_chars):
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
