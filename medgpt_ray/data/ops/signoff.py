"""Stock sign-off stripping: closing phrases such as 感谢您的咨询 / 祝您早日康复 removed from the END of a response.

Each configured phrase (a Python regular expression) is compiled into a pattern that only matches:

- at the end of the text (trailing whitespace and closing punctuation allowed), and
- at a clause boundary: the start of the text or right after punctuation or whitespace, so a phrase inside
  a sentence ("…非常感谢您的咨询…" mid-answer, or 服药期间如有不适… followed by advice) is left alone.

Stripping repeats until no pattern matches, so "如有疑问请随时咨询。祝您早日康复！" loses both phrases. After each
strip, dangling clause separators (，、；： and whitespace) are trimmed so the next phrase can be seen.

A text that is nothing but sign-offs becomes "" (not returned unchanged): the quality filter then drops
the record as too short, which is what a reply with no content deserves, and the report counts it.
"""

from __future__ import annotations

import functools
import re

from medgpt_ray.config import SignoffConfig

# Characters after which a sign-off may start (besides the start of the text).
_BOUNDARY = r"\s。！？!?，,；;：:、…~～）)】」』”\"'"
# Characters allowed after the phrase up to the end of the text.
_TRAILING = r"\s。！？!?，,；;、…~～"
_DANGLING = " \t\r\n，,、；;：:"


@functools.lru_cache(maxsize=64)
def _compile(phrases: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    compiled = []
    for i, phrase in enumerate(phrases, 1):
        try:
            compiled.append(re.compile(rf"(?:^|(?<=[{_BOUNDARY}]))(?:{phrase})[{_TRAILING}]*\Z"))
        except re.error as e:
            raise ValueError(f"signoff.phrases[{i}] is not a valid regular expression: {e}") from None
    return tuple(compiled)


def compile_signoffs(cfg: SignoffConfig) -> list[re.Pattern]:
    """The end-anchored patterns for `cfg.phrases` (cached by phrase list); [] when sign-off stripping is off."""
    if not cfg.enabled:
        return []
    return list(_compile(tuple(cfg.phrases)))


def strip_signoff(text: str, patterns: list[re.Pattern]) -> tuple[str, int]:
    """Remove sign-offs from the end of `text`, repeatedly; returns (text, number of phrases removed)."""
    if not patterns:
        return text, 0
    count = 0
    while text:
        for pattern in patterns:
            m = pattern.search(text)
            if m is not None:
                text = text[: m.start()].rstrip(_DANGLING)
                count += 1
                break
        else:
            break
    return text, count
