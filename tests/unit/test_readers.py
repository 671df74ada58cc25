"""Readers: every source format onto the canonical records (no Ray); MedicalGPT's own formats are in
test_readers_medicalgpt.py, the shipped sample corpora in test_sample_corpora.py."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.files import LoadResult, Quarantined, load_canonical
from medgpt_ray.data.readers import DataFileError, RecordError, detect_format, to_canonical

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


# --------------------------------------------------------------------------------------------------
# iter_rows: one test per file type
# --------------------------------------------------------------------------------------------------


def test_jsonl_malformed_line_is_reported_with_its_line_and_reading_continues(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"text": "第一行"},
        '{"text": "' + SECRET + '",}',
        "",
        "[1, 2]",
        {"text": "第五行"},
    ])
    rows = list(iter_rows(path))
    assert [line for line, _ in rows] == [1, 2, 4, 5]  # the blank line 3 holds no record
    assert rows[0][1] == {"text": "第一行"} and rows[3][1] == {"text": "第五行"}
    bad = rows[1][1]
    assert isinstance(bad, RecordError)
    assert str(bad).startswith("invalid JSON: ") and SECRET not in str(bad)
    assert bad.raw == '{"text": "' + SECRET + '",}'  # kept aside for the owner-only quarantine
    assert isinstance(rows[2][1], RecordError) and "list, not an object" in str(rows[2][1])


def test_jsonl_with_bom_and_crlf(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + '{"text": "甲"}\r\n{"text": "乙"}\r\n'.encode())
    assert [row for _, row in iter_rows(path)] == [{"text": "甲"}, {"text": "乙"}]


def test_json_array_uses_index_plus_one_as_line(tmp_path: Path) -> None:
    path = tmp_path / "a.json"
    path.write_text(json.dumps([{"instruction": "i1", "output": "o1"}, "not a record",
                                {"instruction": "i3", "output": "o3"}], ensure_ascii=False), encoding="utf-8")
    rows = list(iter_rows(path))
    assert [line for line, _ in rows] == [1, 2, 3]
    assert isinstance(rows[1][1], RecordError) and "not an object" in str(rows[1][1])
    assert rows[2][1] == {"instruction": "i3", "output": "o3"}


def test_json_file_holding_json_lines_is_read_as_jsonl(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "lines.json", [{"text": "一"}, {"text": "二"}])
    assert [row for _, row in iter_rows(path)] == [{"text": "一"}, {"text": "二"}]


def test_a_json_array_saved_as_jsonl_is_read_as_the_array(tmp_path: Path) -> None:
    """MedicalGPT users save arrays under .jsonl: each element is a record, not each line quarantined (issue 48
    item 6); a file that only opens an array and is no valid JSON is read as JSON Lines, each line a row."""
    import json

    path = tmp_path / "array.jsonl"
    path.write_text("\ufeff[\n" + json.dumps({"text": "一"}, ensure_ascii=False) + ",\n  {\"text\": \"二\"}\n]\n",
                    encoding="utf-8")
    assert [row for _, row in iter_rows(path)] == [{"text": "一"}, {"text": "二"}]
    broken = tmp_path / "broken.jsonl"
    broken.write_text('[{"text": "一"},\n{"text": "二"}\n', encoding="utf-8")
    rows = list(iter_rows(broken))
    assert len(rows) == 2 and isinstance(rows[0][1], RecordError) and rows[1][1] == {"text": "二"}


def test_json_file_with_a_scalar_is_a_file_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "scalar.json"
    path.write_text("42", encoding="utf-8")
    with pytest.raises(DataFileError, match=re.escape(str(path))):
        list(iter_rows(path))


def write_csv(path: Path, rows: list[list[str]], encoding: str) -> Path:
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(rows)
    path.write_bytes(buf.getvalue().encode(encoding))
    return path


TOYHOM_ROWS = [
    ["department", "title", "ask", "answer"],
    ["心内科", "高血压怎么办", "头晕，血压150/95mmHg", "建议到心内科就诊，\n规律服药，\"遵医嘱\"。"],
    ["儿科", "孩子发烧", "孩子发烧38.6℃", "对乙酰氨基酚每次10-15mg/kg。"],
]


@pytest.mark.parametrize("encoding", ["gb18030", "gbk", "utf-8", "utf-8-sig"])
def test_csv_decodes_utf8_or_gb18030(tmp_path: Path, encoding: str) -> None:
    path = write_csv(tmp_path / "toyhom.csv", TOYHOM_ROWS, encoding)
    rows = list(iter_rows(path))
    assert [line for line, _ in rows] == [1, 2]
    assert rows[0][1] == dict(zip(TOYHOM_ROWS[0], TOYHOM_ROWS[1], strict=True))
    assert to_canonical(rows[1][1], "sft")[0]["conversations"][0]["content"] == "孩子发烧\n孩子发烧38.6℃"


def test_gb18030_csv_is_really_not_utf8() -> None:
    # guards the test above: the Chinese text must make the GB18030 bytes invalid UTF-8
    buf = io.StringIO(newline="")
    csv.writer(buf).writerows(TOYHOM_ROWS)
    with pytest.raises(UnicodeDecodeError):
        buf.getvalue().encode("gb18030").decode("utf-8")


def test_csv_row_with_wrong_field_count_is_a_record_error(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "bad.csv", [["title", "ask", "answer"], ["t", "a", "b"], ["only", SECRET]], "utf-8")
    rows = list(iter_rows(path))
    assert rows[0][1] == {"title": "t", "ask": "a", "answer": "b"}
    line, err = rows[1]
    assert line == 2 and isinstance(err, RecordError)
    assert str(err) == "row has 2 fields, header has 3" and SECRET in (err.raw or "")


def test_parquet_rows_including_nested_conversations(tmp_path: Path) -> None:
    path = tmp_path / "sft.parquet"
    table = pa.table({"conversations": [
        [{"from": "human", "value": "头痛"}, {"from": "gpt", "value": "建议就医"}],
        [{"from": "human", "value": "咳嗽"}],
    ]})
    pq.write_table(table, path)
    rows = list(iter_rows(path))
    assert [line for line, _ in rows] == [1, 2]
    expected = canonical(("user", "头痛"), ("assistant", "建议就医"))
    assert to_canonical(rows[0][1], "sft") == [{"conversations": expected}]
    result = load_canonical([path], "sft")
    assert len(result.records) == 1
    assert result.quarantined == [Quarantined(str(path), 2, "conversation must end with an assistant turn, "
                                                          "ends with user", None)]


def test_parquet_alpaca_with_null_input(tmp_path: Path) -> None:
    path = tmp_path / "alpaca.parquet"
    pq.write_table(pa.table({"instruction": ["介绍感冒", "介绍流感"], "input": [None, "简要"],
                             "output": ["感冒是...", "流感是..."]}), path)
    users = [r["conversations"][0]["content"] for r in load_canonical([path], "sft").records]
    assert users == ["介绍感冒", "介绍流感\n简要"]


def test_unsupported_suffix_and_missing_file(tmp_path: Path) -> None:
    other = tmp_path / "notes.md"
    other.write_text("x", encoding="utf-8")
    with pytest.raises(DataFileError, match="unsupported file type '.md'"):
        list(iter_rows(other))
    with pytest.raises(DataFileError, match="no such file"):
        list(iter_rows(tmp_path / "gone.jsonl"))


# --------------------------------------------------------------------------------------------------
# load_canonical
# --------------------------------------------------------------------------------------------------


def test_load_canonical_counts_every_source_row(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [
        sharegpt(("human", "q1"), ("gpt", "a1")),
        "{broken",
        {"instruction": "i", "output": "o"},
        {"mystery": 1},
        {"questions": [["q", "q'"]], "answers": ["a"]},
        sharegpt(("human", SECRET), ("human", "again")),
    ])
    result = load_canonical([tmp_path / "a.jsonl"], "sft")
    assert isinstance(result, LoadResult)
    assert result.source_count == 6
    assert len(result.records) == 4  # 1 sharegpt + 1 alpaca + 2 from the huatuo paraphrases
    name = str(tmp_path / "a.jsonl")
    assert [(q.file, q.line) for q in result.quarantined] == [(name, 2), (name, 4), (name, 6)]
    assert result.quarantined[0].raw == "{broken"
    assert result.quarantined[1].raw is None and result.quarantined[2].raw is None  # parsed: never kept raw
    assert all(SECRET not in q.reason for q in result.quarantined)
    assert result.detected == {name: {"sharegpt": 2, "unparseable": 1, "alpaca": 1, "unknown": 1, "huatuo": 1}}
    assert sum(result.detected[name].values()) == result.source_count


def test_load_canonical_expands_directories_sorted_and_recursive(tmp_path: Path) -> None:
    (tmp_path / "b").mkdir()
    (tmp_path / ".hidden").mkdir()
    write_jsonl(tmp_path / "b" / "z.jsonl", [{"text": "z"}])
    write_jsonl(tmp_path / "a.jsonl", [{"text": "a"}])
    write_jsonl(tmp_path / "c.jsonl", [{"text": "c"}])
    write_jsonl(tmp_path / ".hidden" / "h.jsonl", [{"text": "h"}])
    (tmp_path / "README.md").write_text("not data", encoding="utf-8")
    result = load_canonical([tmp_path, tmp_path / "a.jsonl"], "pretrain")  # a.jsonl named twice: read once
    assert [r["text"] for r in result.records] == ["a", "z", "c"]  # sorted paths: a.jsonl, b/z.jsonl, c.jsonl
    assert list(result.detected) == [str(tmp_path / "a.jsonl"), str(tmp_path / "b" / "z.jsonl"),
                                     str(tmp_path / "c.jsonl")]


def test_load_canonical_missing_path_names_it(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "ok.jsonl", [{"text": "a"}])
    missing = tmp_path / "no" / "such.jsonl"
    with pytest.raises(DataFileError, match=re.escape(str(missing))):
        load_canonical([tmp_path / "ok.jsonl", missing], "pretrain")


def test_load_canonical_mixed_formats_for_one_kind(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "share.jsonl", [sharegpt(("human", "q"), ("gpt", "a"))])
    (tmp_path / "alp.json").write_text(json.dumps([{"instruction": "i", "input": "", "output": "o"}]),
                                       encoding="utf-8")
    write_csv(tmp_path / "toy.csv", TOYHOM_ROWS, "gb18030")
    result = load_canonical([tmp_path], "sft")
    assert result.quarantined == []
    assert result.source_count == len(result.records) == 4
    assert {fmt for counts in result.detected.values() for fmt in counts} == {"sharegpt", "alpaca", "toyhom"}
