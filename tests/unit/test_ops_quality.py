"""Quality filters: lengths, low-information responses (jieba entropy), repetition, special characters."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from medgpt_ray.config import QualityConfig
from medgpt_ray.data.ops.quality import (
    char_repetition,
    content_tokens,
    quality_reason,
    special_char_ratio,
    token_entropy,
)

CFG = QualityConfig()
QUESTION = "医生，我这两天头痛发热，体温38.5℃，需要吃什么药？"
ANSWER = "根据描述考虑上呼吸道感染，可以服用布洛芬退热，多喝水休息，三天不退烧请到发热门诊就诊。"
LAB = "血常规：WBC 12.5×10^9/L，N% 85.2%，CRP 36mg/L，阿莫西林0.5g tid×7d"
SPAM = "★★★☆☆◆◆◆@@@###$$$"
REASON = re.compile(r"^[a-z_]+(:(text|system|user|assistant|chosen|rejected))?$")


def sft(answer: str, question: str = QUESTION, system: str | None = None) -> dict:
    turns = [{"role": "system", "content": system}] if system else []
    return {"conversations": turns + [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}


def pref(chosen: str, rejected: str) -> dict:
    return {"conversations": [{"role": "user", "content": QUESTION}], "chosen": chosen, "rejected": rejected}


def check(record: dict, kind: str, cfg: QualityConfig = CFG) -> str | None:
    reason = quality_reason(record, kind, cfg)
    assert reason is None or REASON.match(reason), reason
    return reason


def test_normal_answer_passes():
    assert 25 <= len(ANSWER) <= 60
    assert check(sft(ANSWER), "sft") is None
    assert check({"text": ANSWER}, "pretrain") is None
    assert check(pref(ANSWER, "多喝热水就行，不用去医院，也不用吃药。"), "preference") is None


@pytest.mark.parametrize("answer", ["嗯", "好的", "好的好的", "嗯嗯", "好的，好的", "哈哈哈哈哈哈"])
def test_non_answers_are_low_entropy(answer):
    assert check(sft(answer), "sft") == "low_entropy:assistant"
    assert check(pref(answer, ANSWER), "preference") == "low_entropy:chosen"


@pytest.mark.parametrize("answer", ["好的，知道了", "好的，我知道了。", "好的，收到了", "OK，明白了"])
def test_acknowledgements_are_non_answers(answer):
    assert token_entropy(content_tokens(answer)) >= CFG.min_response_entropy_bits  # entropy alone misses them
    assert check(sft(answer), "sft") == "non_answer:assistant"


def test_low_information_filter_applies_to_responses_only():
    assert check(sft(ANSWER, question="好的好的"), "sft") is None  # a user may say 好的
    assert check(pref(ANSWER, "好的好的"), "preference") is None  # rejected answers are bad on purpose
    assert check({"text": "好的好的"}, "pretrain") is None


def test_entropy_threshold_is_configurable():
    assert check(sft("好的好的"), "sft", QualityConfig(min_response_entropy_bits=0.5)) == "non_answer:assistant"
    assert check(sft(ANSWER), "sft", QualityConfig(min_response_entropy_bits=10.0)) == "low_entropy:assistant"


def test_entropy_values():
    assert token_entropy([]) == 0.0
    assert token_entropy(["嗯"]) == 0.0
    assert token_entropy(["好", "的", "好", "的"]) == pytest.approx(1.0)
    assert token_entropy(list("abcd")) == pytest.approx(2.0)
    assert "，" not in content_tokens("好的，好的")


def test_lab_heavy_text_is_kept():
    assert special_char_ratio(LAB) < 0.05
    assert check({"text": LAB}, "pretrain") is None
    assert check(sft(LAB), "sft") is None
    liver = "复查：ALT 56U/L↑，AST 40U/L，TBil 18.2μmol/L，体温37.8℃，血压140/90mmHg，HbA1c≤7.0%"
    assert check(sft(liver), "sft") is None


def test_spam_is_dropped():
    assert special_char_ratio(SPAM) == 1.0
    assert check({"text": SPAM}, "pretrain") == "special_chars:text"
    assert check(sft(ANSWER + SPAM * 3), "sft") == "special_chars:assistant"
    assert check(pref(ANSWER, SPAM), "preference") == "special_chars:rejected"
    # low ratio of special characters is fine
    assert check({"text": ANSWER + "★"}, "pretrain") is None


def test_lengths():
    assert check(sft(ANSWER, question="痛"), "sft") == "too_short:user"
    assert check(sft(ANSWER, system="医"), "sft") == "too_short:system"
    assert check({"text": "头" + "痛是常见症状" * 20}, "pretrain", QualityConfig(max_chars=50)) == "too_long:text"
    short = QualityConfig(min_response_chars=30, min_response_entropy_bits=0)
    assert check(sft("多喝热水，注意休息。"), "sft", short) == "too_short:assistant"
    assert check(pref("多喝热水，注意休息。", ANSWER), "preference", short) == "too_short:chosen"
    assert check(sft(""), "sft") == "too_short:assistant"  # e.g. a reply that was only a sign-off
    assert check(sft("。！"), "sft") == "too_short:assistant"
    assert check(pref(ANSWER, "滚"), "preference") == "too_short:rejected"
    assert check(pref(ANSWER, "滚" * 3 + "。" + ANSWER), "preference", QualityConfig(max_chars=40)) == "too_long:chosen"


def test_repetition():
    assert char_repetition("啊" * 30) == 1.0
    assert char_repetition(ANSWER) < 0.1
    assert check({"text": "啊" * 30}, "pretrain") == "repetitive:text"
    assert check(sft(ANSWER, question="救命" * 3 + "啊" * 25), "sft") == "repetitive:user"
    assert check({"text": "啊" * 19}, "pretrain") is None  # under 20 characters: not measured
    assert check({"text": "啊" * 30}, "pretrain", QualityConfig(max_char_repetition=1.0)) is None


def test_identical_preference_responses():
    assert check(pref(ANSWER, ANSWER), "preference") == "identical_responses"
    assert check(pref(ANSWER, " " + ANSWER.replace("，", "， ", 1) + "\n"), "preference") == "identical_responses"


def test_disabled_and_unknown_kind():
    off = QualityConfig(enabled=False)
    assert check(sft("嗯"), "sft", off) is None
    assert check({"text": SPAM}, "pretrain", off) is None
    with pytest.raises(ValueError, match="unknown data kind"):
        quality_reason({"text": ANSWER}, "chat", CFG)


def test_reasons_never_quote_text():
    secret = "秘密文本XYZ"
    records = [(sft(secret), "sft"), ({"text": secret[0] * 40}, "pretrain"), ({"text": "★" * 5 + secret}, "pretrain")]
    for record, kind in records:
        reason = check(record, kind, QualityConfig(min_response_chars=100))
        assert reason is not None and secret not in reason and "秘" not in reason


def test_jieba_is_quiet():
    code = ("from medgpt_ray.config import QualityConfig\n"
            "from medgpt_ray.data.ops.quality import quality_reason\n"
            "r = {'conversations': [{'role': 'user', 'content': '头痛'}, {'role': 'assistant', 'content': '好的'}]}\n"
            "assert quality_reason(r, 'sft', QualityConfig()) == 'low_entropy:assistant'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "" and done.stderr == ""
