"""The per-record cleaning pipeline on the prompt kind, tool roles and tools schemas (no Ray)."""

from __future__ import annotations

import json

import pyarrow as pa

from medgpt_ray.data.ops.record import clean_table, map_texts, text_fields
from tests.unit.test_ops_record import ANSWER, CFG, ID_A, QUESTION, clean, sft

TOOLS = [{"type": "function", "function": {"name": "book", "description": f"留言请拨13912345678，证件{ID_A}",
                                             "parameters": {"type": "object", "properties": {"phone": {}}}}}]
# The chat template renders the schemas into the prompt: their string values are redacted (keys and shape kept),
# and nothing else of the cleaner touches them.
TOOLS_REDACTED = [{"type": "function", "function": {"name": "book", "description": "留言请拨<PHONE>，证件<ID_CARD>",
                                                    "parameters": {"type": "object", "properties": {"phone": {}}}}}]


def test_prompt_record_answer_is_normalised_and_redacted():
    rec = {"conversations": [{"role": "user", "content": "医生联系方式是什么？"}],
           "answer": "  请拨１３９１２３４５６７８  ", "tools": TOOLS}
    assert text_fields(rec, "prompt") == [("conversations.0.content", "医生联系方式是什么？"),
                                          ("answer", rec["answer"])]
    out = clean(rec, "prompt")
    assert out.dropped_by is None
    assert out.record["answer"] == "请拨<PHONE>" and out.redactions["phone"] == 2  # the answer's, the schema's
    assert out.record["tools"] == TOOLS_REDACTED and out.redactions["id_card"] == 1
    assert rec["tools"] == TOOLS  # not mutated
    assert rec["answer"] == "  请拨１３９１２３４５６７８  "  # not mutated
    none = clean({**rec, "answer": None}, "prompt")
    assert none.record["answer"] is None and none.dropped_by is None
    assert text_fields({**rec, "answer": None}, "prompt") == [("conversations.0.content", "医生联系方式是什么？")]
    assert clean({**rec, "answer": "C"}, "prompt").dropped_by is None  # a one-letter reference answer is fine


def test_tool_turns_stay_valid_json_and_are_redacted():
    call = json.dumps({"name": "book", "arguments": {"phone": "１３９１２３４５６７８", "alt": 13912345679,
                                                     "note": "  复诊   挂号  ", "dose_mg": 500, "ok": True}},
                      ensure_ascii=False)
    result = json.dumps({"status": "ok", "contact": "li@qq.com"}, ensure_ascii=False)
    rec = sft(("user", QUESTION), ("tool_call", call), ("tool", result), ("tool", "已预约，回电13912345678"),
              ("assistant", ANSWER + "祝您健康！"), tools=TOOLS)
    seen = []
    map_texts(rec, "sft", lambda role, text: seen.append(role) or text)
    # fn sees each string value and integer of the JSON (name, phone, alt, note, dose_mg; status, contact)
    assert seen == ["user", *["tool_call"] * 5, *["tool"] * 3, "assistant"]
    out = clean(rec, "sft")
    assert out.dropped_by is None and out.signoffs == 1
    turns = out.record["conversations"]
    args = json.loads(turns[1]["content"])["arguments"]  # still valid JSON
    assert args == {"phone": "<PHONE>", "alt": "<PHONE>", "note": "复诊 挂号", "dose_mg": 500, "ok": True}
    assert json.loads(turns[2]["content"]) == {"status": "ok", "contact": "<EMAIL>"}
    assert turns[3]["content"] == "已预约，回电<PHONE>"  # a plain-text tool result is redacted as text
    assert out.redactions == {"id_card": 1, "phone": 4, "email": 1, "bank_card": 0}  # turns 3 phones, tools 1 + 1
    assert out.record["tools"] == TOOLS_REDACTED
    # an untouched call keeps its exact text (no re-serialisation)
    plain = json.dumps({"name": "lookup", "arguments": {"q": "阿莫西林"}}, separators=(",", ":"), ensure_ascii=False)
    same = clean(sft(("user", QUESTION), ("tool_call", plain), ("tool", "[]"), ("assistant", ANSWER)), "sft")
    assert same.record["conversations"][1]["content"] == plain and same.record["conversations"][2]["content"] == "[]"


def test_signoffs_are_not_stripped_from_tool_turns():
    rec = sft(("user", QUESTION), ("tool_call", '{"name": "f", "arguments": {}}'), ("tool", "查询完成。祝您健康！"),
              ("assistant", ANSWER))
    out = clean(rec, "sft")
    assert out.record["conversations"][2]["content"] == "查询完成。祝您健康！" and out.signoffs == 0


def test_clean_table_prompt_kind():
    records = [{"conversations": [{"role": "user", "content": "1+1等于几？"}], "answer": "2"},
               {"conversations": [{"role": "user", "content": "电话13912345678是谁的？"}], "answer": None}]
    table = pa.table({"id": ["a", "b"], "record": [json.dumps(r, ensure_ascii=False) for r in records]})
    out = clean_table(table, "prompt", CFG)
    assert out.column("dropped_by").to_pylist() == [None, None]
    cleaned = [json.loads(r) for r in out.column("record").to_pylist()]
    assert cleaned[0] == records[0] and cleaned[1]["answer"] is None
    assert "<PHONE>" in cleaned[1]["conversations"][0]["content"]
