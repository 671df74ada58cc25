"""Readers of MedicalGPT's own formats (issue 13): tool calling, its preference and GRPO files, the prompt kind,
plain-text pretraining."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medgpt_ray.data.chunks import plan_chunks, read_chunk
from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.readers import DataFileError, RecordError, detect_format, to_canonical, turn_order_error
from tests.unit.test_readers import SECRET, canonical, sharegpt, write_jsonl

# --------------------------------------------------------------------------------------------------
# Issue 13: tool calling, MedicalGPT preference and GRPO files, the prompt kind, plain-text pretraining
# --------------------------------------------------------------------------------------------------

TOOLS_LIST = [{"name": "query_drug_info", "description": "查询药品说明书",
               "parameters": {"type": "object", "properties": {"drug_name": {"type": "string"}},
                              "required": ["drug_name"]}}]
CALL = {"name": "query_drug_info", "arguments": {"drug_name": "布洛芬"}}
CALL_TEXT = json.dumps(CALL, ensure_ascii=False)


def tool_sft(tools: object = None, call: str = CALL_TEXT) -> dict:
    row = sharegpt(("system", "你是医院助手"), ("human", "布洛芬怎么吃？"), ("function_call", call),
                   ("observation", '{"dosage": "每次0.2克"}'), ("gpt", "每次0.2克，遵医嘱。"))
    if tools is not None:
        row["tools"] = tools
    return row


def test_sharegpt_tool_calling_maps_roles_and_tools_given_as_json_string_or_list() -> None:
    expected = {"conversations": canonical(
        ("system", "你是医院助手"), ("user", "布洛芬怎么吃？"), ("tool_call", CALL_TEXT),
        ("tool", '{"dosage": "每次0.2克"}'), ("assistant", "每次0.2克，遵医嘱。")), "tools": TOOLS_LIST}
    as_string = json.dumps(TOOLS_LIST, ensure_ascii=False)
    assert to_canonical(tool_sft(as_string), "sft") == [expected]
    assert to_canonical(tool_sft(TOOLS_LIST), "sft") == [expected]
    for none in (None, "", "  ", "[]", []):  # no tools: no "tools" key at all
        assert to_canonical(tool_sft(none), "sft") == [{"conversations": expected["conversations"]}]


@pytest.mark.parametrize("bad", ['{"name": "x"}', "not json", "[1, 2]", '["a"]', {"name": "x"}, 3, [[]]])
def test_bad_tools_value_is_a_record_error(bad: object) -> None:
    with pytest.raises(RecordError) as exc:
        to_canonical(tool_sft(bad), "sft")
    assert str(exc.value) == "field 'tools' is not a JSON list of objects"


@pytest.mark.parametrize(("value", "expected"), [
    (CALL_TEXT, CALL_TEXT),
    ('{"name": "query_drug_info", "arguments": "{\\"drug_name\\": \\"布洛芬\\"}"}', CALL_TEXT),  # string arguments
    ('{"arguments": {"drug_name": "布洛芬"}, "name": "query_drug_info"}', CALL_TEXT),  # key order
    ('  {"name":"query_drug_info","arguments":{"drug_name":"布洛芬"}}\n', CALL_TEXT),  # spacing
    ('{"name": "f", "arguments": {}}', '{"name": "f", "arguments": {}}'),
    ('[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": "{\\"y\\": [2]}"}]',
     '[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": [2]}}]'),
])
def test_tool_call_content_is_canonicalised(value: str, expected: str) -> None:
    row = sharegpt(("human", "q"), ("function_call", value), ("observation", "r"), ("gpt", "a"))
    content = to_canonical(row, "sft")[0]["conversations"][1]
    assert content == {"role": "tool_call", "content": expected}
    again = {"conversations": canonical(("user", "q"), ("tool_call", expected), ("tool", "r"), ("assistant", "a"))}
    assert to_canonical(again, "sft") == [again]  # canonical text is a fixed point


@pytest.mark.parametrize("value", [
    "query_drug_info(" + SECRET + ")", '{"name": "f"}', '{"name": "f", "arguments": "' + SECRET + '"}',
    '{"name": "f", "arguments": [1]}', '{"name": "", "arguments": {}}', '{"name": 3, "arguments": {}}',
    '{"name": "f", "arguments": {}, "id": "' + SECRET + '"}', "[]", '["f"]', '"' + SECRET + '"',
])
def test_tool_call_that_is_not_name_arguments_json_is_a_record_error(value: str) -> None:
    row = sharegpt(("human", "q"), ("function_call", value), ("observation", "r"), ("gpt", "a"))
    with pytest.raises(RecordError) as exc:
        to_canonical(row, "sft")
    assert str(exc.value) == "turn 2: function_call is not a JSON {name, arguments} object"
    assert SECRET not in str(exc.value)
    canonical_row = {"conversations": canonical(("user", "q"), ("tool_call", value), ("tool", "r"), ("assistant", "a"))}
    with pytest.raises(RecordError, match="turn 2: tool_call is not a JSON"):
        to_canonical(canonical_row, "sft")


@pytest.mark.parametrize(("roles", "kind", "reason"), [
    (("user", "tool", "assistant"), "sft", "turn 2: a tool turn must directly follow a tool_call turn"),
    (("tool", "assistant"), "sft", "turn 1: a tool turn must directly follow a tool_call turn"),
    (("user", "tool_call", "tool", "tool", "assistant"), "sft",
     "turn 4: a tool turn must directly follow a tool_call turn"),
    (("user", "system", "assistant"), "sft", "turn 2: a system turn is only allowed first"),
    (("system", "user", "tool_call", "system", "assistant"), "sft", "turn 4: a system turn is only allowed first"),
    (("user", "tool_call", "tool"), "sft", "conversation must end with an assistant turn, ends with tool"),
    (("user", "tool_call", "assistant"), "sft", "turn 2: a tool_call turn must be followed by a tool turn"),
    (("user", "tool_call", "tool", "user", "assistant"), "sft", "turn 4: expected assistant, got user"),
    (("tool_call", "tool", "assistant"), "sft", "turn 1: expected user, got tool_call"),
    (("user", "assistant", "tool_call", "tool", "assistant"), "sft", "turn 3: expected user, got tool_call"),
    (("user", "tool_call"), "preference", "prompt must end with a user turn, ends with tool_call"),
    (("user", "tool_call", "tool", "assistant"), "preference", "prompt must end with a user turn, ends with assistant"),
    (("user", "tool_call"), "prompt", "prompt must end with a user turn, ends with tool_call"),
])
def test_order_rule_violations(roles: tuple[str, ...], kind: str, reason: str) -> None:
    contents = {"tool_call": CALL_TEXT}
    conv = [{"role": r, "content": contents.get(r, SECRET)} for r in roles]
    extra = {"sft": {}, "preference": {"chosen": "c", "rejected": "r"}, "prompt": {"answer": "B"}}[kind]
    with pytest.raises(RecordError) as exc:
        to_canonical({"conversations": conv, **extra}, kind)  # type: ignore[arg-type]
    assert str(exc.value).startswith(reason)
    assert SECRET not in str(exc.value)


@pytest.mark.parametrize(("roles", "last"), [
    (("user", "tool_call"), "assistant"),  # sft may end with the call itself
    (("system", "user", "tool_call", "tool", "assistant", "user", "assistant"), "assistant"),
    (("user", "tool_call", "tool"), "user"),  # a prompt may end with the tool's result
    (("user", "assistant", "user"), "user"),
])
def test_order_rule_accepts(roles: tuple[str, ...], last: str) -> None:
    assert turn_order_error(list(roles), last) is None


def test_medicalgpt_preference_with_sharegpt_prompt_system_and_tools() -> None:
    row = {"conversations": [{"from": "system", "value": "你是医生"}, {"from": "human", "value": "布洛芬怎么吃？"},
                             {"from": "function_call", "value": CALL_TEXT},
                             {"from": "observation", "value": "每次0.2克"}],
           "tools": json.dumps(TOOLS_LIST, ensure_ascii=False),
           "chosen": " 每次0.2克，遵医嘱。 ", "rejected": "随便吃。"}
    assert detect_format(row) == "sharegpt_preference"
    assert to_canonical(row, "preference") == [{
        "conversations": canonical(("system", "你是医生"), ("user", "布洛芬怎么吃？"), ("tool_call", CALL_TEXT),
                                   ("tool", "每次0.2克")),
        "chosen": "每次0.2克，遵医嘱。", "rejected": "随便吃。", "tools": TOOLS_LIST}]
    plain = {"conversations": [{"from": "human", "value": "头痛怎么办？"}], "chosen": "就医。", "rejected": "忍着。"}
    assert to_canonical(plain, "preference") == [
        {"conversations": canonical(("user", "头痛怎么办？")), "chosen": "就医。", "rejected": "忍着。"}]


def test_chosen_and_rejected_may_be_assistant_turn_objects() -> None:
    row = {"conversations": [{"from": "human", "value": "头痛怎么办？"}],
           "chosen": {"from": "gpt", "value": "就医。"}, "rejected": {"role": "assistant", "content": "忍着。"}}
    assert to_canonical(row, "preference")[0] | {"conversations": []} == {
        "conversations": [], "chosen": "就医。", "rejected": "忍着。"}
    for bad, reason in [({"from": "human", "value": SECRET}, "field 'chosen': role 'human' is not an assistant turn"),
                        ({"from": "gpt"}, "missing field 'chosen' value"),
                        ({"text": SECRET}, "field 'chosen' is an object with neither from/value nor role/content")]:
        with pytest.raises(RecordError) as exc:
            to_canonical({**row, "chosen": bad}, "preference")
        assert str(exc.value) == reason and SECRET not in str(exc.value)


def test_top_level_system_field_becomes_the_system_turn() -> None:
    row = {"system": "你是医生", "conversations": [{"from": "human", "value": "q"}], "chosen": "c", "rejected": "r"}
    assert to_canonical(row, "preference")[0]["conversations"][0] == {"role": "system", "content": "你是医生"}
    both = {"system": "s", "conversations": [{"from": "system", "value": "s2"}, {"from": "human", "value": "q"},
                                             {"from": "gpt", "value": "a"}]}
    with pytest.raises(RecordError, match="both a 'system' field and a system turn"):
        to_canonical(both, "sft")


def test_grpo_and_canonical_prompts_become_the_prompt_kind() -> None:
    assert to_canonical({"question": " 哪个是ACEI？A. 氨氯地平 B. 依那普利 ", "answer": " B "}, "prompt") == [
        {"conversations": canonical(("user", "哪个是ACEI？A. 氨氯地平 B. 依那普利")), "answer": "B"}]
    with_system = to_canonical({"system": "只答字母", "question": "q", "answer": "0.05%"}, "prompt")[0]
    assert with_system == {"conversations": canonical(("system", "只答字母"), ("user", "q")), "answer": "0.05%"}
    assert to_canonical({"question": "1+2=?", "answer": 3}, "prompt")[0]["answer"] == "3"
    assert to_canonical({"question": "q", "answer": None}, "prompt")[0]["answer"] is None
    prompt = {"conversations": canonical(("user", "q"), ("tool_call", CALL_TEXT), ("tool", "r")), "answer": None}
    assert to_canonical(prompt, "prompt") == [prompt]
    shared = {"conversations": [{"from": "human", "value": "q"}], "answer": "A", "tools": TOOLS_LIST}
    assert to_canonical(shared, "prompt") == [{"conversations": canonical(("user", "q")), "answer": "A",
                                               "tools": TOOLS_LIST}]


@pytest.mark.parametrize(("row", "kind", "reason"), [
    ({"question": SECRET}, "prompt", "missing field 'answer'"),
    ({"question": " ", "answer": "B"}, "prompt", "empty field 'question'"),
    ({"question": SECRET, "answer": ["A", "B"]}, "prompt", "field 'answer' is a list, not a string"),
    ({"question": SECRET, "answer": True}, "prompt", "field 'answer' is a bool, not a string"),
    ({"question": SECRET, "answer": "B"}, "sft", "a grpo record cannot be used as sft data"),
    ({"conversations": canonical(("user", SECRET)), "answer": "A"}, "preference",
     "a canonical_prompt record cannot be used as preference data"),
    ({"conversations": canonical(("user", SECRET), ("assistant", "a")), "answer": "A"}, "prompt",
     "prompt must end with a user turn, ends with assistant"),
    ({"conversations": [{"from": "human", "value": SECRET}], "chosen": "c"}, "preference",
     "missing field 'rejected'"),
    ({"conversations": [{"from": "human", "value": SECRET}], "chosen": "c", "rejected": "r"}, "sft",
     "a sharegpt_preference record cannot be used as sft data"),
])
def test_new_format_errors(row: dict, kind: str, reason: str) -> None:
    with pytest.raises(RecordError) as exc:
        to_canonical(row, kind)  # type: ignore[arg-type]
    assert reason in str(exc.value) and SECRET not in str(exc.value)


def test_existing_detection_is_unchanged_by_the_grpo_format() -> None:
    assert detect_format({"question": "q", "response_chosen": "a", "response_rejected": "b"}) == "reward"
    assert detect_format({"question": "q", "response_chosen": "a"}) == "reward"
    assert detect_format({"title": "t", "ask": "q", "answer": "a"}) == "toyhom"
    assert detect_format({"questions": [["q"]], "answers": ["a"]}) == "huatuo"
    assert detect_format({"instruction": "q", "output": "a", "question": "x"}) == "alpaca"


def test_canonical_parquet_with_tool_roles_and_tools_as_json_text_or_null(tmp_path: Path) -> None:
    # what the cleaner writes: `tools` a JSON string or null, tool_call/tool turns among role/content turns
    conversations = [canonical(("user", "布洛芬怎么吃？"), ("tool_call", CALL_TEXT), ("tool", "每次0.2克"),
                               ("assistant", "每次0.2克。")),
                     canonical(("user", "头痛"), ("assistant", "就医"))]
    path = tmp_path / "sft.parquet"
    pq.write_table(pa.table({"conversations": conversations,
                             "tools": [json.dumps(TOOLS_LIST, ensure_ascii=False), None]}), path)
    result = load_canonical([path], "sft")
    assert result.quarantined == []
    assert result.records == [{"conversations": conversations[0], "tools": TOOLS_LIST},
                              {"conversations": conversations[1]}]
    prompt_path = tmp_path / "prompt.parquet"
    pq.write_table(pa.table({"conversations": [canonical(("user", "q1")), canonical(("user", "q2"))],
                             "answer": ["B", None], "tools": [None, "[]"]}), prompt_path)
    prompts = load_canonical([prompt_path], "prompt")
    assert [r["answer"] for r in prompts.records] == ["B", None]
    assert prompts.detected == {str(prompt_path): {"canonical_prompt": 2}}


def test_load_canonical_each_new_format_counts_add_up_with_true_lines(tmp_path: Path) -> None:
    pref = write_jsonl(tmp_path / "dpo.jsonl", [
        {"conversations": [{"from": "human", "value": "q1"}], "chosen": "c", "rejected": "r"},
        "",
        {"conversations": [{"from": "human", "value": SECRET}, {"from": "gpt", "value": "a"}], "chosen": "c",
         "rejected": "r"},
        '{"conversations": [{"from": "human", "value": "' + SECRET + '"}], "chosen": ',
        {"conversations": [{"from": "human", "value": "q"}], "tools": "oops", "chosen": "c", "rejected": "r"},
        {"question": "q", "response_chosen": "c", "response_rejected": "r"},
    ])
    result = load_canonical([pref], "preference")
    name = str(pref)
    assert result.source_count == 5 and len(result.records) == 2
    assert [(q.line, q.reason.split(":")[0]) for q in result.quarantined] == [
        (3, "prompt must end with a user turn, ends with assistant"), (4, "invalid JSON"),
        (5, "field 'tools' is not a JSON list of objects")]
    assert all(SECRET not in q.reason for q in result.quarantined)
    assert result.detected == {name: {"sharegpt_preference": 3, "unparseable": 1, "reward": 1}}
    assert sum(result.detected[name].values()) == result.source_count

    grpo = write_jsonl(tmp_path / "grpo.jsonl", [{"question": "q", "answer": "B"}, {"question": SECRET},
                                                 {"mystery": 1}, {"question": "q2", "answer": "0.05%"}])
    result = load_canonical([grpo], "prompt")
    assert [r["answer"] for r in result.records] == ["B", "0.05%"]
    assert [(q.line, q.reason) for q in result.quarantined] == [
        (2, "missing field 'answer'"), (3, "unrecognised record format (fields: 'mystery')")]
    assert result.source_count == len(result.records) + len(result.quarantined) == 4

    sft = write_jsonl(tmp_path / "tools.jsonl", [tool_sft("[]"), tool_sft(TOOLS_LIST, call="oops " + SECRET),
                                                 tool_sft(json.dumps(TOOLS_LIST))])
    result = load_canonical([sft], "sft")
    assert len(result.records) == 2 and result.records[1]["tools"] == TOOLS_LIST
    assert [(q.line, q.reason) for q in result.quarantined] == [
        (2, "turn 3: function_call is not a JSON {name, arguments} object")]


# ---- plain text (.txt) --------------------------------------------------------------------------

TXT_LINES = ["高血压是常见的慢性病。", "", "糖尿病需要长期管理。", "   ", "\u3000", "哮喘患者应随身携带缓解药物。",
             "  前后有空格的段落  "]


def test_txt_is_one_text_record_per_non_empty_line_with_physical_line_numbers(tmp_path: Path) -> None:
    path = tmp_path / "corpus.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(TXT_LINES).encode("utf-8"))  # BOM, CRLF, no final newline
    rows = list(iter_rows(path))
    assert rows == [(1, {"text": "高血压是常见的慢性病。"}), (3, {"text": "糖尿病需要长期管理。"}),
                    (6, {"text": "哮喘患者应随身携带缓解药物。"}), (7, {"text": "  前后有空格的段落  "})]
    result = load_canonical([path], "pretrain")
    assert [r["text"] for r in result.records][-1] == "前后有空格的段落"
    assert result.source_count == 4 and result.detected == {str(path): {"text": 4}}
    with pytest.raises(RecordError, match="a text record cannot be used as sft data"):
        to_canonical(rows[0][1], "sft")


def test_txt_gb18030_and_undecodable(tmp_path: Path) -> None:
    path = tmp_path / "gb.txt"
    data = "\n".join(TXT_LINES + ["罕见字：𠀀䶮"]).encode("gb18030")
    with pytest.raises(UnicodeDecodeError):
        data.decode("utf-8")  # the test needs bytes that are not UTF-8
    path.write_bytes(data)
    assert [row["text"] for _, row in iter_rows(path)] == [t for t in TXT_LINES if t.strip()] + ["罕见字：𠀀䶮"]
    assert [line for line, _ in iter_rows(path)] == [1, 3, 6, 7, 8]
    bad = tmp_path / "bad.txt"
    bad.write_bytes("正常的一行\n".encode() + b"\xff\xfe\xfd\n")
    with pytest.raises(DataFileError, match=re.escape(str(bad)) + ".*neither UTF-8 nor GB18030"):
        list(iter_rows(bad))


def test_directories_pick_up_txt_files(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("甲\n乙\n", encoding="utf-8")
    write_jsonl(tmp_path / "b.jsonl", [{"text": "丙"}])
    assert [r["text"] for r in load_canonical([tmp_path], "pretrain").records] == ["甲", "乙", "丙"]


def chunk_rows(chunks: list) -> list[tuple[int, dict]]:
    out = []
    for chunk in chunks:
        for row in read_chunk(chunk):
            assert row["error"] is None
            out.append((row["source_line"], json.loads(row["text"])))
    return out


def test_txt_chunked_read_equals_whole_file_read(tmp_path: Path) -> None:
    lines = [f"第{i}段：{'高血压患者应规律服药、定期复查。' * (i % 5 + 1)}" if i % 7 else "" for i in range(1, 301)]
    lines[10] = "  \u3000 "
    path = tmp_path / "big.txt"
    path.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\r\n")
    chunks = plan_chunks(path, "pretrain", 3, chunk_bytes=1000)
    assert len(chunks) > 10 and all(c.end >= 0 for c in chunks)
    assert chunks[0].start == 0 and chunks[-1].end == path.stat().st_size
    assert all(a.end == b.start for a, b in zip(chunks, chunks[1:], strict=False))
    whole = list(iter_rows(path))
    assert len(whole) == sum(1 for t in lines if t.strip())
    assert chunk_rows(chunks) == whole
    assert {row["file_no"] for c in chunks for row in read_chunk(c)} == {3}


def test_jsonl_chunked_read_still_equals_whole_file_read(tmp_path: Path) -> None:
    rows = [{"text": f"第{i}段" * (i % 9 + 1)} if i % 5 else "" for i in range(120)]
    path = write_jsonl(tmp_path / "big.jsonl", rows)
    chunks = plan_chunks(path, "pretrain", 0, chunk_bytes=200)
    assert len(chunks) > 5
    assert chunk_rows(chunks) == list(iter_rows(path))


def test_gb18030_txt_is_one_whole_file_chunk_with_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "gb.txt"
    path.write_bytes("\n".join(f"第{i}行：糖尿病饮食控制。" for i in range(200)).encode("gb18030"))
    chunks = plan_chunks(path, "pretrain", 0, chunk_bytes=100)
    assert len(chunks) == 1 and chunks[0].end == -1
    assert chunk_rows(chunks) == list(iter_rows(path))
