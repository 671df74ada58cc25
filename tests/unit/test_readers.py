"""Readers: every source format onto the canonical records (no Ray); reading the files themselves (each file type,
directories) is test_data_files.py's, MedicalGPT's own formats are in test_readers_medicalgpt.py, the shipped sample
corpora in test_sample_corpora.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.data.readers import RecordError, detect_format, to_canonical

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "data" / "sample"
SECRET = "秘密文本XYZ"  # planted in bad records: no error message may ever contain it


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n"
                            for r in rows), encoding="utf-8")
    return path


def sharegpt(*turns: tuple[str, str]) -> dict:
    return {"conversations": [{"from": f, "value": v} for f, v in turns]}


def canonical(*turns: tuple[str, str]) -> list[dict]:
    return [{"role": r, "content": c} for r, c in turns]


# --------------------------------------------------------------------------------------------------
# detect_format
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "expected"), [
    ({"text": "高血压是常见慢性病。"}, "text"),
    ({"content": "只有一个文本字段的记录。"}, "text"),
    (sharegpt(("human", "头痛"), ("gpt", "建议就医")), "sharegpt"),
    ({"conversations": canonical(("user", "头痛"), ("assistant", "建议就医"))}, "canonical_sft"),
    ({"instruction": "介绍感冒", "input": "", "output": "感冒是..."}, "alpaca"),
    ({"question": "头痛怎么办", "response_chosen": "好", "response_rejected": "差"}, "reward"),
    ({"conversations": canonical(("user", "头痛")), "chosen": "好", "rejected": "差"}, "canonical_preference"),
    ({"questions": [["感冒吃什么药"]], "answers": ["对症治疗"]}, "huatuo"),
    ({"department": "内科", "title": "头痛", "ask": "头痛三天", "answer": "建议就医"}, "toyhom"),
    ({"conversations": [{"from": "human", "value": "头痛"}], "chosen": "好", "rejected": "差"}, "sharegpt_preference"),
    ({"conversations": [], "chosen": "好", "rejected": "差"}, "canonical_preference"),  # the converter says why
    ({"question": "头痛怎么办", "answer": "B"}, "grpo"),
    ({"question": "头痛怎么办"}, "grpo"),
    ({"conversations": canonical(("user", "头痛")), "answer": None}, "canonical_prompt"),
    ({"conversations": [{"from": "human", "value": "头痛"}], "answer": "B"}, "sharegpt_prompt"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": "{}"}], "tools": "[]"},
     "sharegpt"),
])
def test_detect_format_names_each_source_format(row: dict, expected: str) -> None:
    assert detect_format(row) == expected


def test_detect_format_unknown_lists_field_names_not_text() -> None:
    with pytest.raises(RecordError, match="unrecognised record format") as exc:
        detect_format({"foo": SECRET, "bar": 3})
    assert "'bar'" in str(exc.value) and "'foo'" in str(exc.value)
    assert SECRET not in str(exc.value)


def test_detect_format_rejects_empty_conversations() -> None:
    with pytest.raises(RecordError, match="empty"):
        detect_format({"conversations": []})


# --------------------------------------------------------------------------------------------------
# to_canonical, one format at a time
# --------------------------------------------------------------------------------------------------


def test_sharegpt_maps_roles_and_strips_whitespace() -> None:
    row = sharegpt(("system", " 你是医生 "), ("human", "\n头痛三天\n"), ("gpt", "考虑偏头痛。"),
                   ("user", "吃什么药？"), ("assistant", " 布洛芬。 "))
    assert to_canonical(row, "sft") == [{"conversations": canonical(
        ("system", "你是医生"), ("user", "头痛三天"), ("assistant", "考虑偏头痛。"),
        ("user", "吃什么药？"), ("assistant", "布洛芬。"))}]


def test_alpaca_joins_instruction_and_input_and_prepends_history() -> None:
    plain = {"instruction": "根据描述给出建议。", "input": "发烧两天", "output": "建议查血常规。"}
    assert to_canonical(plain, "sft") == [{"conversations": canonical(
        ("user", "根据描述给出建议。\n发烧两天"), ("assistant", "建议查血常规。"))}]

    no_input = {"instruction": "介绍痛风。", "input": "  ", "output": "痛风是..."}
    assert to_canonical(no_input, "sft")[0]["conversations"][0] == {"role": "user", "content": "介绍痛风。"}

    with_history = {"instruction": "那吃什么药？", "input": "", "output": "秋水仙碱。", "system": "你是医生",
                    "history": [["脚趾肿痛", "可能是痛风。"]]}
    assert to_canonical(with_history, "sft") == [{"conversations": canonical(
        ("system", "你是医生"), ("user", "脚趾肿痛"), ("assistant", "可能是痛风。"),
        ("user", "那吃什么药？"), ("assistant", "秋水仙碱。"))}]


def test_reward_becomes_preference_with_optional_system() -> None:
    row = {"question": "头痛怎么办？", "response_chosen": "建议到神经内科就诊。", "response_rejected": "忍着。"}
    assert to_canonical(row, "preference") == [{
        "conversations": canonical(("user", "头痛怎么办？")), "chosen": "建议到神经内科就诊。", "rejected": "忍着。"}]
    row["system"] = "你是医生"
    assert to_canonical(row, "preference")[0]["conversations"][0] == {"role": "system", "content": "你是医生"}


def test_canonical_records_pass_through_unchanged() -> None:
    sft = {"conversations": canonical(("system", "s"), ("user", "u"), ("assistant", "a"))}
    pref = {"conversations": canonical(("user", "u"), ("assistant", "a"), ("user", "u2")),
            "chosen": "good", "rejected": "bad"}
    assert to_canonical(sft, "sft") == [sft]
    assert to_canonical(pref, "preference") == [pref]
    assert to_canonical({"text": "正文"}, "pretrain") == [{"text": "正文"}]


def test_single_text_field_becomes_pretrain_text() -> None:
    assert to_canonical({"content": "  一段医学文本。 "}, "pretrain") == [{"text": "一段医学文本。"}]


def test_huatuo_lists_expand_to_one_record_per_question() -> None:
    row = {"questions": [["感冒怎么治", "感冒吃什么药"], "流感要隔离吗"], "answers": ["对症治疗。", "需要。"]}
    out = to_canonical(row, "sft")
    assert [r["conversations"][0]["content"] for r in out] == ["感冒怎么治", "感冒吃什么药", "流感要隔离吗"]
    assert [r["conversations"][1]["content"] for r in out] == ["对症治疗。", "对症治疗。", "需要。"]


def test_huatuo_mismatched_lists_is_an_error() -> None:
    with pytest.raises(RecordError, match=r"\(2 vs 1\)"):
        to_canonical({"questions": [["a"], ["b"]], "answers": ["x"]}, "sft")


def test_toyhom_joins_title_and_ask() -> None:
    row = {"department": "内科", "title": "头痛怎么办", "ask": "头痛三天了", "answer": "建议就医。"}
    assert to_canonical(row, "sft") == [{"conversations": canonical(
        ("user", "头痛怎么办\n头痛三天了"), ("assistant", "建议就医。"))}]
    row["title"] = ""
    assert to_canonical(row, "sft")[0]["conversations"][0]["content"] == "头痛三天了"


# --------------------------------------------------------------------------------------------------
# to_canonical errors
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("row", "kind", "fmt"), [
    ({"text": SECRET}, "sft", "text"),
    ({"instruction": SECRET, "output": "x"}, "preference", "alpaca"),
    ({"question": SECRET, "response_chosen": "a", "response_rejected": "b"}, "sft", "reward"),
    (sharegpt(("human", SECRET), ("gpt", "x")), "pretrain", "sharegpt"),
    ({"ask": SECRET, "answer": "x"}, "pretrain", "toyhom"),
])
def test_wrong_kind_for_format(row: dict, kind: str, fmt: str) -> None:
    with pytest.raises(RecordError) as exc:
        to_canonical(row, kind)  # type: ignore[arg-type]
    message = str(exc.value)
    assert f"a {fmt} record cannot be used as {kind} data" in message
    assert SECRET not in message


def test_unknown_kind_is_a_programming_error_not_a_record_error() -> None:
    with pytest.raises(ValueError, match="unknown data kind") as exc:
        to_canonical({"text": "x"}, "rm")  # type: ignore[arg-type]
    assert not isinstance(exc.value, RecordError)


@pytest.mark.parametrize(("row", "kind", "reason"), [
    (sharegpt(("human", SECRET), ("human", "again"), ("gpt", "x")), "sft", "turn 2: expected assistant, got user"),
    (sharegpt(("gpt", SECRET), ("human", "x")), "sft", "turn 1: expected user, got assistant"),
    (sharegpt(("human", SECRET), ("system", "s"), ("gpt", "x")), "sft", "turn 2: a system turn is only allowed first"),
    (sharegpt(("human", SECRET), ("gpt", "x"), ("human", "y")), "sft", "must end with an assistant turn"),
    (sharegpt(("system", SECRET)), "sft", "no user turn"),
    (sharegpt(("human", SECRET), ("bot", "x")), "sft", "turn 2: unsupported role 'bot'"),
    (sharegpt(("human", SECRET), ("gpt", "   ")), "sft", "empty turn 2 value"),
    ({"conversations": [{"from": "human", "value": SECRET}, {"from": "gpt"}]}, "sft", "missing turn 2 value"),
    ({"conversations": [{"value": SECRET}]}, "sft", "turn 1: missing 'from'"),
    ({"conversations": [{"from": "human", "value": 5}]}, "sft", "turn 1 value is a int, not a string"),
    ({"conversations": canonical(("user", SECRET), ("bot", "x"))}, "sft", "turn 2: unsupported role 'bot'"),
    ({"instruction": SECRET, "input": ""}, "sft", "missing field 'output'"),
    ({"instruction": SECRET, "output": "x", "history": [["q"]]}, "sft", "history item 1 is not a"),
    ({"question": SECRET, "response_chosen": "a"}, "preference", "missing field 'response_rejected'"),
    ({"question": SECRET, "response_chosen": "same", "response_rejected": "same"}, "preference", "identical"),
    ({"conversations": canonical(("user", SECRET), ("assistant", "a")), "chosen": "c", "rejected": "r"},
     "preference", "prompt must end with a user turn"),
    ({"questions": [[SECRET, ""]], "answers": ["a"]}, "sft", "empty question 1.2"),
    ({"title": "t", "ask": SECRET, "answer": ""}, "sft", "empty field 'answer'"),
    ({"text": "   "}, "pretrain", "empty field 'text'"),
])
def test_invalid_records_raise_a_precise_reason_without_text(row: dict, kind: str, reason: str) -> None:
    with pytest.raises(RecordError) as exc:
        to_canonical(row, kind)  # type: ignore[arg-type]
    assert reason in str(exc.value)
    assert SECRET not in str(exc.value)


def test_unsupported_role_with_free_text_is_not_echoed() -> None:
    with pytest.raises(RecordError) as exc:
        to_canonical(sharegpt(("human", "q"), (SECRET, "a")), "sft")
    assert f"turn 2: unsupported role <a string of {len(SECRET)} characters>" in str(exc.value)
    assert SECRET not in str(exc.value)


def test_a_chinese_role_word_is_named_and_an_unknown_one_is_not() -> None:
    """MedicalGPT's users write roles in Chinese: a known role word is shown (the fix is then obvious), a string
    that is no role word (it could be a patient's name) only by its length (issue 48 item 6)."""
    with pytest.raises(RecordError) as exc:
        to_canonical(sharegpt(("用户", "q"), ("医生", "a")), "sft")
    assert "unsupported role '用户'" in str(exc.value)
    with pytest.raises(RecordError) as exc:
        to_canonical(sharegpt(("human", "q"), ("张三丰", "a")), "sft")
    assert "<a string of 3 characters>" in str(exc.value) and "张三丰" not in str(exc.value)
