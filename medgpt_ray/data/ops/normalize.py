"""Text normalization: Unicode NFC, full-width ASCII letters/digits -> half-width, whitespace cleanup, OpenCC.

Full-width folding is deliberately narrower than NFKC: only the full-width forms of ASCII letters and digits
(inside U+FF01..FF5E) and the ideographic space U+3000 are folded. Chinese punctuation (，。？！：（）；、“”)
keeps its full-width form, and so do full-width symbols such as ％ or ＠ (NFKC would rewrite all of them).
"""

from __future__ import annotations

import re
import unicodedata

from medgpt_ray.config import NormalizeConfig

OPENCC_PACKAGE = "opencc"

_FULLWIDTH_TABLE: dict[int, str] = {0x3000: " "}
for _lo, _hi in ((0xFF10, 0xFF19), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A)):  # ０-９, Ａ-Ｚ, ａ-ｚ
    for _cp in range(_lo, _hi + 1):
        _FULLWIDTH_TABLE[_cp] = chr(_cp - 0xFEE0)
# The same characters as one class: a C-speed search that lets most texts skip translate's per-character lookups.
_FULLWIDTH_CHAR = re.compile("[\u3000\uff10-\uff19\uff21-\uff3a\uff41-\uff5a]")

# Zero-width characters are deleted; other Unicode spaces become a plain space before collapsing.
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad"
_SPACE_TABLE: dict[int, str | None] = {ord(c): None for c in _ZERO_WIDTH}
_SPACE_TABLE.update({cp: " " for cp in (0x00A0, 0x1680, *range(0x2000, 0x200B), 0x202F, 0x205F)})
_SPACE_TABLE.update({ord("\t"): " ", ord("\v"): " ", ord("\f"): " "})

_NEWLINES = re.compile(r"\r\n?|[\u2028\u2029\x85]")
_SPACE_RUN = re.compile(r" {2,}")
_SPACE_AROUND_NEWLINE = re.compile(r" *\n *")
_BLANK_LINES = re.compile(r"\n{3,}")

_t2s_converter = None


def fullwidth_to_halfwidth(text: str) -> str:
    """Full-width ASCII letters/digits and the ideographic space -> ASCII; everything else unchanged."""
    return text.translate(_FULLWIDTH_TABLE) if _FULLWIDTH_CHAR.search(text) else text


def clean_whitespace(text: str) -> str:
    """Remove zero-width characters, unify line breaks, collapse spaces/tabs to one space, drop spaces at line
    ends, collapse 3+ newlines to 2, strip the ends."""
    text = _NEWLINES.sub("\n", text).translate(_SPACE_TABLE)
    text = _SPACE_RUN.sub(" ", text)
    text = _SPACE_AROUND_NEWLINE.sub("\n", text)
    text = _BLANK_LINES.sub("\n\n", text)
    return text.strip()


def traditional_to_simplified(text: str) -> str:
    """OpenCC t2s. Raises ImportError naming the package when it is not installed."""
    global _t2s_converter
    if _t2s_converter is None:
        try:
            import opencc
        except ImportError:
            raise ImportError(
                "normalize.traditional_to_simplified is on but the OpenCC package is not installed: "
                f"pip install {OPENCC_PACKAGE}"
            ) from None
        _t2s_converter = opencc.OpenCC("t2s")
    return _t2s_converter.convert(text)


def normalize_text(text: str, cfg: NormalizeConfig) -> str:
    """NFC -> full-width folding -> optional OpenCC t2s -> whitespace cleanup (each step as `cfg` enables)."""
    if not cfg.enabled:
        return text
    text = unicodedata.normalize("NFC", text)
    if cfg.fullwidth_to_halfwidth:
        text = fullwidth_to_halfwidth(text)
    if cfg.traditional_to_simplified:
        text = traditional_to_simplified(text)
    if cfg.collapse_whitespace:
        text = clean_whitespace(text)
    return text
