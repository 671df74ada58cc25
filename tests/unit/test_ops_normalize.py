"""normalize_text: NFC, full-width ASCII letters/digits -> half-width, Chinese punctuation kept, whitespace, OpenCC."""

from __future__ import annotations

import sys

import pytest

from medgpt_ray.config import NormalizeConfig
from medgpt_ray.data.ops import normalize as normalize_mod
from medgpt_ray.data.ops.normalize import fullwidth_to_halfwidth, normalize_text

CFG = NormalizeConfig()


@pytest.mark.parametrize("raw, expected", [
    ("ＷＢＣ１２", "WBC12"),
    ("ｈｂａ１ｃ７", "hba1c7"),
    ("服用阿莫西林０５００ｍｇ", "服用阿莫西林0500mg"),
    ("ＡＢＣＤＥＦＧＨＩＪＫＬＭＮＯＰＱＲＳＴＵＶＷＸＹＺ", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"),
    ("ａｂｃｄｅｆｇｈｉｊｋｌｍｎｏｐｑｒｓｔｕｖｗｘｙｚ", "abcdefghijklmnopqrstuvwxyz"),
    ("０１２３４５６７８９", "0123456789"),
    ("血压１４０/９０ｍｍＨｇ", "血压140/90mmHg"),
])
def test_fullwidth_letters_and_digits_become_halfwidth(raw, expected):
    assert normalize_text(raw, CFG) == expected


def test_chinese_punctuation_is_kept():
    text = "医生，您好。请问能吃药吗？可以！注意：（按时）；一、二“引号”‘单引’《书名》【注】……"
    assert normalize_text(text, CFG) == text


def test_fullwidth_symbols_other_than_letters_digits_are_kept():
    # U+FF01..FF5E punctuation/symbols (％ ＠ ＃ ．) are not letters or digits: unchanged.
    assert fullwidth_to_halfwidth("１２．５％＠＃") == "12．5％＠＃"


def test_ideographic_space_becomes_space_and_collapses():
    assert normalize_text("头痛\u3000\u3000三天", CFG) == "头痛 三天"
    assert normalize_text("\u3000\u3000第一段", CFG) == "第一段"


def test_whitespace_cleanup():
    assert normalize_text("  头痛 \t\t 三天  ", CFG) == "头痛 三天"
    assert normalize_text("第一段\n\n\n\n\n第二段", CFG) == "第一段\n\n第二段"
    assert normalize_text("第一段\n\n第二段", CFG) == "第一段\n\n第二段"
    assert normalize_text("a\r\nb\rc", CFG) == "a\nb\nc"
    assert normalize_text("行尾   \n  行首", CFG) == "行尾\n行首"
    assert normalize_text("零\u200b宽\u200d字\ufeff符\u2060", CFG) == "零宽字符"
    assert normalize_text("不换行\u00a0空格", CFG) == "不换行 空格"


def test_nfc():
    assert normalize_text("Cafe\u0301", CFG) == "Caf\u00e9"


def test_switches():
    raw = "  ＷＢＣ\u3000 高  "
    assert normalize_text(raw, NormalizeConfig(enabled=False)) == raw
    assert normalize_text(raw, NormalizeConfig(fullwidth_to_halfwidth=False)) == "ＷＢＣ\u3000 高"
    assert normalize_text(raw, NormalizeConfig(collapse_whitespace=False)) == "  WBC  高  "


def test_traditional_to_simplified():
    pytest.importorskip("opencc")
    cfg = NormalizeConfig(traditional_to_simplified=True)
    assert normalize_text("醫生說這個藥每天吃兩次", cfg) == "医生说这个药每天吃两次"
    assert normalize_text("醫生說", CFG) == "醫生說"  # off by default


def test_traditional_to_simplified_without_opencc_names_the_package(monkeypatch):
    monkeypatch.setattr(normalize_mod, "_t2s_converter", None)
    monkeypatch.setitem(sys.modules, "opencc", None)  # import opencc -> ImportError
    with pytest.raises(ImportError, match="opencc"):
        normalize_text("醫生", NormalizeConfig(traditional_to_simplified=True))


def test_the_fullwidth_fast_path_sees_exactly_the_folded_characters():
    """fullwidth_to_halfwidth skips translate when its search finds nothing: the search's class must be the table."""
    from medgpt_ray.data.ops.normalize import _FULLWIDTH_CHAR, _FULLWIDTH_TABLE

    assert {c for c in range(0x10000) if _FULLWIDTH_CHAR.match(chr(c))} == set(_FULLWIDTH_TABLE)
