"""Does a generated answer match the reference? Pure text functions behind the `accuracy` reward (stages/rewards.py).

The answer is the last <answer>…</answer> of a completion when it has one (else the completion less its
<think>…</think>). Both sides are normalised the same way: NFKC (full-width digits, letters and punctuation become
half-width: "４５％" -> "45%", "Ａ" -> "A"), case-folded, and stripped of whitespace, punctuation and symbols
(ASCII and Chinese: "，。、；：？！“”‘’（）《》【】…—·"), so "心内科。" matches "心内科" and "B." matches "b".
Numbers match numerically within a relative tolerance: "1,200" = "1200" = "1200.0", "45%" = "0.45", and simple
Chinese numerals ("四十五", "三点五", "两千零五", "百分之三十") count as numbers.
"""

from __future__ import annotations

import math
import re
import unicodedata

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
THINK_RE = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
NUMBER_RE = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)(e[+-]?\d+)?%?$", re.IGNORECASE)
REL_TOL = 1e-4

_CN_DIGITS = {"零": 0, "〇": 0, "一": 1, "二": 2, "两": 2, "三": 3, "四": 4, "五": 5, "六": 6, "七": 7, "八": 8,
              "九": 9}
_CN_UNITS = {"十": 10, "百": 100, "千": 1000}
_CN_BIG = {"万": 10_000, "亿": 100_000_000}
_UNIT_SUFFIXES = ("个", "岁", "次", "天", "人")  # a trailing counter word does not change the number


def extract_answer(completion: str) -> str:
    """The last <answer>…</answer> of a completion, else the completion with its <think> blocks removed."""
    found = ANSWER_RE.findall(completion)
    if found:
        return found[-1]
    return THINK_RE.sub("", completion)


def normalize(text: str) -> str:
    """NFKC, case-folded, without whitespace, punctuation (P*) or symbols (S*): the form answers are compared in."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in text if not (ch.isspace() or unicodedata.category(ch)[0] in "PS"))


def _chinese_integer(text: str) -> int | None:
    """"四十五" -> 45, "两千零五" -> 2005, "十二" -> 12, "三万五千" -> 35000; None when not a Chinese numeral."""
    if not text or any(ch not in _CN_DIGITS and ch not in _CN_UNITS and ch not in _CN_BIG for ch in text):
        return None
    total = section = 0
    digit: int | None = None
    for ch in text:
        if ch in _CN_DIGITS:
            digit = _CN_DIGITS[ch]
        elif ch in _CN_UNITS:
            section += (1 if digit is None else digit) * _CN_UNITS[ch]
            digit = None
        else:
            total += (section + (digit or 0)) * _CN_BIG[ch]
            section, digit = 0, None
    return total + section + (digit or 0)


def _chinese_number(text: str) -> float | None:
    """Chinese numerals with 点 (decimal point) and 百分之 (per cent): "三点五" -> 3.5, "百分之三十" -> 0.3."""
    percent = text.startswith("百分之")
    body = text[3:] if percent else text
    whole, _, frac = body.partition("点")
    value = _chinese_integer(whole)
    if value is None:
        return None
    number = float(value)
    if frac:
        if any(ch not in _CN_DIGITS for ch in frac):
            return None
        number += float("0." + "".join(str(_CN_DIGITS[ch]) for ch in frac))
    return number / 100 if percent else number


def parse_number(text: str) -> float | None:
    """The number an answer states, or None: "1,200", "45%" (0.45), "３．５", "四十五", "百分之三十", "12岁"."""
    t = unicodedata.normalize("NFKC", text).strip().replace(",", "").replace(" ", "")
    t = t.rstrip("。.") if not NUMBER_RE.match(t) else t
    for suffix in _UNIT_SUFFIXES:
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[: -len(suffix)]
            break
    if NUMBER_RE.match(t):
        if t.endswith("%"):
            return float(t[:-1]) / 100
        return float(t)
    return _chinese_number(t)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=1e-9)


def answers_match(predicted: str, reference: str) -> bool:
    """Whether `predicted` (an answer, already extracted) states `reference`: equal once normalised, or the same
    number. A percentage also matches its per-cent figure ("45%" and "45" when the reference says "45%")."""
    p, r = normalize(predicted), normalize(reference)
    if p and p == r:
        return True
    pn, rn = parse_number(predicted), parse_number(reference)
    if pn is None or rn is None:
        return False
    if _close(pn, rn):
        return True
    ref_percent = "%" in unicodedata.normalize("NFKC", reference) or reference.strip().startswith("百分之")
    return ref_percent and _close(pn, rn * 100)
