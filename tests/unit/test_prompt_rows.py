"""Every record a user may want answered becomes a prompt to generate from, and what cannot is quarantined with
its line and reason (data/prompt_rows.py)."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.data.files import Quarantined
from medgpt_ray.data.kinds import RecordError
from medgpt_ray.data.prompt_rows import as_prompt, iter_prompts


def test_each_source_shape_becomes_a_prompt_ending_on_the_user():
    grpo = as_prompt({"question": "阿司匹林的作用？", "answer": "抗血小板"})
    assert grpo == {"conversations": [{"role": "user", "content": "阿司匹林的作用？"}], "answer": "抗血小板"}
    open_end = as_prompt({"conversations": [{"from": "human", "value": "头痛怎么办？"}]})
    assert open_end["conversations"][-1] == {"role": "user", "content": "头痛怎么办？"}
    assert open_end["answer"] is None
    sft = as_prompt({"conversations": [{"from": "human", "value": "你好"}, {"from": "gpt", "value": "你好！"},
                                       {"from": "human", "value": "我头晕"}, {"from": "gpt", "value": "多休息"}]})
    assert [t["content"] for t in sft["conversations"]] == ["你好", "你好！", "我头晕"]
    assert sft["answer"] == "多休息"  # the SFT answer is the reference
    pair = as_prompt({"conversations": [{"from": "human", "value": "发烧"}], "chosen": "a", "rejected": "b"})
    assert pair["conversations"] == [{"role": "user", "content": "发烧"}]
    assert as_prompt({"prompt": "咳嗽吃什么药"})["conversations"] == [{"role": "user", "content": "咳嗽吃什么药"}]
    alpaca = as_prompt({"instruction": "解释高血压", "input": "", "output": "血压高"})
    assert alpaca["answer"] == "血压高"


def test_a_record_with_no_user_turn_to_answer_is_refused():
    with pytest.raises(RecordError):
        as_prompt({"conversations": [{"from": "gpt", "value": "只有回答"}]})


def test_ids_are_the_rows_own_else_their_place_and_bad_rows_are_quarantined_with_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    rows = [json.dumps({"question": "q1", "answer": "1", "id": "case-9"}, ensure_ascii=False), "not json",
            json.dumps({"conversations": [{"from": "gpt", "value": "x"}]}), json.dumps({"question": "q4", "answer": 4})]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    items = list(iter_prompts([path]))
    assert [i[0] for i in items if not isinstance(i, Quarantined)] == ["case-9", "00000-0000000004-000"]
    bad = [i for i in items if isinstance(i, Quarantined)]
    assert [q.line for q in bad] == [2, 3]
    assert bad[0].reason.startswith("invalid JSON") and bad[1].reason == "no user turn to answer"
    assert all(q.file == str(path) for q in bad)


NO_REFERENCE = {  # every format `generate` reads a prompt from, without its reference answer (issue 36 item 6)
    "grpo": {"question": "头痛怎么办？"},
    "grpo with system": {"question": "头痛怎么办？", "system": "你是医生"},
    "sharegpt ending on the user": {"conversations": [{"from": "human", "value": "头痛怎么办？"}]},
    "role/content ending on the user": {"conversations": [{"role": "user", "content": "头痛怎么办？"}]},
    "exam": {"question": "头痛首选？", "options": {"A": "休息", "B": "手术"}},
    "ceval": {"question": "头痛首选？", "A": "休息", "B": "手术", "C": "输液", "D": "观察"},
    "cmb": {"exam_subject": "临床执业医师", "question": "头痛首选？", "option": {"A": "休息", "B": "手术"}},
    "alpaca": {"instruction": "头痛怎么办？", "input": ""},
    "toyhom": {"department": "内科", "title": "头痛", "ask": "怎么办？"},
    "huatuo": {"questions": [["头痛怎么办？", "头疼怎么办？"]]},
    "text": {"text": "头痛怎么办？"},
}


@pytest.mark.parametrize("fmt", list(NO_REFERENCE))
def test_a_prompt_without_a_reference_answer_is_a_prompt(fmt):
    record = as_prompt(NO_REFERENCE[fmt])
    assert record["answer"] is None
    assert record["conversations"][-1]["role"] == "user" and "头痛" in record["conversations"][-1]["content"]
    assert all(t["role"] != "assistant" for t in record["conversations"])  # no stand-in answer left in the prompt


def test_grpo_prompts_without_answers_are_all_read(tmp_path):
    """The issue's file: GRPO-style question lines, none quarantined for a missing answer."""
    path = tmp_path / "questions.jsonl"
    path.write_text("".join(json.dumps({"question": f"问题{i}"}, ensure_ascii=False) + "\n" for i in range(3)),
                    encoding="utf-8")
    items = list(iter_prompts([path]))
    assert not [i for i in items if isinstance(i, Quarantined)]
    assert [i[1]["conversations"][-1]["content"] for i in items] == ["问题0", "问题1", "问题2"]
