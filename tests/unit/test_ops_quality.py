"""Quality filters: lengths, low-information responses (filler, repetition, jieba entropy), special characters."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from medgpt_ray.config import CleanConfig, QualityConfig
from medgpt_ray.data.ops.low_information import is_filler, repeated_unit
from medgpt_ray.data.ops.quality import field_texts, quality_reason
from medgpt_ray.data.ops.text_measures import char_repetition, content_tokens, special_char_ratio, token_entropy

DATA = Path(__file__).resolve().parents[1] / "data"

CFG = QualityConfig()
QUESTION = "医生，我这两天头痛发热，体温38.5℃，需要吃什么药？"
ANSWER = "根据描述考虑上呼吸道感染，可以服用布洛芬退热，多喝水休息，三天不退烧请到发热门诊就诊。"
LAB = "血常规：WBC 12.5×10^9/L，N% 85.2%，CRP 36mg/L，阿莫西林0.5g tid×7d"
SPAM = "★★★☆☆◆◆◆@@@###$$$"
REASON = re.compile(r"^[a-z_]+(:(text|system|user|assistant|tool_call|tool|chosen|rejected|answer))?$")


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


# --------------------------------------------------------------------------------------------------
# short factual answers are kept, filler is dropped (the evaluation sets in tests/data)
# --------------------------------------------------------------------------------------------------


def _load(name: str) -> list[dict]:
    with open(DATA / name, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_evaluation_sets_keep_short_answers_and_drop_filler():
    """On the default CleanConfig().quality: >= 99 % of short_medical_qa.jsonl kept, >= 95 % of
    filler_answers.jsonl dropped. Only counts are compared (nothing of the records is printed)."""
    cfg = CleanConfig().quality
    qa, filler = _load("short_medical_qa.jsonl"), _load("filler_answers.jsonl")
    assert len(qa) >= 200 and len(filler) >= 100
    kept = sum(quality_reason(r, "sft", cfg) is None for r in qa)
    dropped_reasons = [quality_reason(r, "sft", cfg) for r in filler]
    dropped = sum(r is not None for r in dropped_reasons)
    kept_rate, dropped_rate = kept / len(qa), dropped / len(filler)
    assert kept_rate >= 0.99, f"short QA kept {kept}/{len(qa)}"
    assert dropped_rate >= 0.95, f"filler dropped {dropped}/{len(filler)}"
    assert all(r is None or REASON.match(r) for r in dropped_reasons)


@pytest.mark.parametrize("answer", [
    "阿奇霉素", "肿瘤科；肿瘤外科", "颈内静脉", "0.05%", "TP53基因突变", "3-5天", "2周", "空腹血糖3.9-6.1mmol/L",
    "0.5g", "是，属于遗传病", "46条", "CT", "MRI", "HbA1c", "肝", "肾", "不会", "1:1", "10:10", "AA",
    "寒、热、温、凉", "多饮、多食、多尿、体重减轻", "(4-10)×10^9/L", "<5.2mmol/L",
])
def test_short_factual_answers_are_kept(answer):
    assert check(sft(answer), "sft") is None
    assert check(pref(answer, "不知道。"), "preference") is None


@pytest.mark.parametrize(("answer", "reason"), [
    ("谢谢医生", "low_entropy"), ("收到，谢谢", "low_entropy"), ("好的，谢谢医生", "non_answer"),
    ("嗯嗯嗯嗯嗯嗯", "low_entropy"),
    ("啊啊啊啊", "low_entropy"), ("666666", "low_entropy"), ("阿莫西林阿莫西林", "low_entropy"),
    ("好的好的好的", "low_entropy"), ("同上", "low_entropy"), ("不知道", "low_entropy"), ("无", "low_entropy"),
    ("请咨询医生", "non_answer"), ("请详细描述您的问题", "non_answer"), ("请到医院就诊", "non_answer"),
    ("抱歉，我无法回答这个问题", "non_answer"), ("<br><br>", "non_answer"), ("[图片]", "non_answer"),
    ("&nbsp;", "non_answer"), ("🙏🙏🙏", "non_answer"), ("。。。", "too_short"), ("**", "too_short"),
])
def test_filler_is_dropped(answer, reason):
    assert check(sft(answer), "sft") == f"{reason}:assistant"


def test_filler_and_repetition_helpers():
    assert is_filler("好的，谢谢医生！") and is_filler("OK，明白了") and is_filler("请补充您的病情描述")
    assert not is_filler("好的，阿莫西林0.5g") and not is_filler("") and not is_filler("不会")
    assert not is_filler("谢谢" * 200)  # only short texts are tried
    assert repeated_unit("啊啊啊") and repeated_unit("好的，好的") and repeated_unit("111111")
    assert not repeated_unit("嗯嗯") and not repeated_unit("1:1") and not repeated_unit("1010") \
        and not repeated_unit("阿奇霉素")
    assert content_tokens("👍 <br>") == ["br"] and content_tokens("😊😊") == []


def test_entropy_still_judges_long_responses():
    spam = "头痛，发热，头痛，头痛，发热，发热，头痛，发热，发热，头痛。"  # 10 tokens, 1 bit, no single repeated unit
    assert len(content_tokens(spam)) >= CFG.min_entropy_tokens and not repeated_unit(spam)
    assert check(sft(spam), "sft") == "low_entropy:assistant"
    assert check(sft(spam), "sft", QualityConfig(min_entropy_tokens=50)) is None  # too few tokens to be judged


# --------------------------------------------------------------------------------------------------
# prompt kind, tool roles
# --------------------------------------------------------------------------------------------------

CALL = json.dumps({"name": "lookup_drug", "arguments": {"name": "阿莫西林", "q": "★★★@@@###"}}, ensure_ascii=False)
TOOLS = [{"type": "function", "function": {"name": "lookup_drug", "parameters": {"type": "object"}}}]


def tool_sft(call: str = CALL, result: str = "{}") -> dict:
    return {"conversations": [{"role": "user", "content": QUESTION}, {"role": "tool_call", "content": call},
                              {"role": "tool", "content": result}, {"role": "assistant", "content": ANSWER}],
            "tools": TOOLS}


def test_prompt_kind_fields_and_answer_checked_for_length_only():
    rec = {"conversations": [{"role": "user", "content": QUESTION}], "answer": "A", "tools": TOOLS}
    assert field_texts(rec, "prompt") == [("user", QUESTION), ("answer", "A")]  # tools is not a text field
    assert field_texts({**rec, "answer": None}, "prompt") == [("user", QUESTION)]
    for answer in ("A", "42", "", "★★★", "好的", None):
        assert check({**rec, "answer": answer}, "prompt") is None
    assert check({**rec, "answer": "头痛" * 30}, "prompt", QualityConfig(max_chars=50)) == "too_long:answer"
    assert check({**rec, "conversations": [{"role": "user", "content": "痛"}]}, "prompt") == "too_short:user"


def test_tool_roles_are_checked_for_length_only():
    assert [role for role, _ in field_texts(tool_sft(), "sft")] == ["user", "tool_call", "tool", "assistant"]
    assert check(tool_sft(), "sft") is None  # "{}" is short, the call is full of special characters
    assert check(tool_sft(result="好的"), "sft") is None
    assert check(tool_sft(), "sft", QualityConfig(max_chars=50)) == "too_long:tool_call"
    assert check(tool_sft(call="{}", result="x" * 60), "sft", QualityConfig(max_chars=59)) == "too_long:tool"
