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
