"""Readers: every source format onto the canonical records, and the shipped sample corpus (no Ray)."""

from __future__ import annotations

import csv
import hashlib
import importlib.util
import io
import json
import random
import re
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from medgpt_ray.data.chunks import plan_chunks, read_chunk
from medgpt_ray.data.files import LoadResult, Quarantined, iter_rows, load_canonical
from medgpt_ray.data.readers import DataFileError, RecordError, detect_format, to_canonical, turn_order_error

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
    assert "turn 2: unsupported role <str value>" in str(exc.value)
    assert SECRET not in str(exc.value)


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


# --------------------------------------------------------------------------------------------------
# The shipped sample corpus
# --------------------------------------------------------------------------------------------------

CJK = re.compile(r"[\u4e00-\u9fff]")


def test_sample_pretrain_loads_clean() -> None:
    result = load_canonical([SAMPLE / "pretrain.jsonl"], "pretrain")
    assert result.quarantined == []
    assert len(result.records) >= 300
    lengths = [len(CJK.findall(r["text"])) for r in result.records]
    assert min(lengths) >= 80 and max(lengths) <= 400
    assert len({r["text"] for r in result.records}) == len(result.records)


def test_sample_sft_loads_clean_and_is_multi_turn() -> None:
    result = load_canonical([SAMPLE / "sft_sharegpt.jsonl", SAMPLE / "sft_alpaca.jsonl"], "sft")
    assert result.quarantined == []
    assert len(result.records) >= 300
    user_turns = [sum(t["role"] == "user" for t in r["conversations"]) for r in result.records]
    assert sum(n >= 2 for n in user_turns) >= 300  # the ShareGPT file: 2-3 exchanges each
    with_system = sum(r["conversations"][0]["role"] == "system" for r in result.records)
    assert 0.2 * len(result.records) < with_system < 0.5 * len(result.records)
    alpaca = load_canonical([SAMPLE / "sft_alpaca.jsonl"], "sft")
    assert len(alpaca.records) >= 60


def reward_rows() -> list[dict]:
    return [json.loads(line) for line in (SAMPLE / "reward.jsonl").read_text(encoding="utf-8").splitlines()]


def test_sample_preference_loads_clean() -> None:
    result = load_canonical([SAMPLE / "reward.jsonl"], "preference")
    assert result.quarantined == []
    assert len(result.records) >= 200
    rows = reward_rows()
    assert len({r["question"] for r in rows}) == len(rows)  # no question repeats verbatim
    assert all(60 <= len(r["response_chosen"]) <= 200 for r in rows)
    assert len({r["response_rejected"] for r in rows}) >= 60  # rejected answers vary a lot


def char_bigrams(text: str) -> Counter:
    return Counter(text[i:i + 2] for i in range(len(text) - 1))


def test_sample_reward_pairs_are_learnable_by_a_tiny_linear_model() -> None:
    # A stand-in for "a tiny reward model trained briefly": a pairwise perceptron on character bigrams,
    # trained on 80% of the questions and scored on the held-out 20%.
    rows = reward_rows()
    held = [r for r in rows if int(hashlib.sha256(r["question"].encode()).hexdigest(), 16) % 5 == 0]
    train = [r for r in rows if r not in held]
    w: Counter = Counter()
    rng = random.Random(0)
    for _ in range(3):
        rng.shuffle(train)
        for r in train:
            diff = char_bigrams(r["response_chosen"])
            diff.subtract(char_bigrams(r["response_rejected"]))
            if sum(w[k] * v for k, v in diff.items()) <= 0:
                w.update(diff)

    def score(text: str) -> float:
        return sum(w[k] * v for k, v in char_bigrams(text).items())

    accuracy = sum(score(r["response_chosen"]) > score(r["response_rejected"]) for r in held) / len(held)
    assert len(held) >= 30 and accuracy >= 0.8


def load_make_sample():
    return load_module(SAMPLE / "make_sample.py")


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is being built
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


def test_shipped_sample_is_what_the_generator_writes(tmp_path: Path) -> None:
    load_make_sample().main(tmp_path)  # formats/ and README.md's section on it too (formats/make_formats.py)
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written, "generator wrote nothing"
    for rel in written:
        assert (tmp_path / rel).read_bytes() == (SAMPLE / rel).read_bytes(), f"{rel} is stale: rerun make_sample.py"


# --------------------------------------------------------------------------------------------------
# The dirty corpus and its ground truth (raw/README.md), which the cleaning tests rely on
# --------------------------------------------------------------------------------------------------

ID_WEIGHTS = [7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2]


def id_valid(v: str) -> bool:
    total = sum(int(a) * w for a, w in zip(v[:17], ID_WEIGHTS, strict=True))
    return len(v) == 18 and "10X98765432"[total % 11] == v[17]


def luhn_valid(v: str) -> bool:
    digits = [int(c) for c in v.replace(" ", "")][::-1]
    return sum(d if i % 2 == 0 else (d * 2 - 9 if d > 4 else d * 2) for i, d in enumerate(digits)) % 10 == 0


@pytest.fixture(scope="module")
def truth() -> dict:
    readme = (SAMPLE / "raw" / "README.md").read_text(encoding="utf-8")
    return json.loads(readme.split("```json\n", 1)[1].split("\n```", 1)[0])


@pytest.fixture(scope="module")
def raw_rows() -> dict[str, dict[int, dict | RecordError]]:
    return {f: dict(iter_rows(SAMPLE / "raw" / f)) for f in
            ["dialogues_sharegpt.jsonl", "finetune_alpaca.json", "toyhom_dialogues.csv", "huatuo.jsonl",
             "pretrain.jsonl"]}


def row_text(row: dict | RecordError) -> str:
    return (row.raw or "") if isinstance(row, RecordError) else json.dumps(row, ensure_ascii=False)


def test_raw_ground_truth_counts_match_files(truth: dict, raw_rows: dict) -> None:
    assert {f: len(rows) for f, rows in raw_rows.items()} == {f: v["records"] for f, v in truth["files"].items()}
    assert 180 <= sum(len(rows) for rows in raw_rows.values()) <= 240
    assert all(truth["pii_counts"].get(t, 0) >= 5 for t in ["resident_id", "mobile", "landline", "email", "bank_card"])
    assert len(truth["malformed"]) == 3


def test_raw_pii_is_where_the_readme_says_and_nowhere_else(truth: dict, raw_rows: dict) -> None:
    for item in truth["pii"]:
        rows = raw_rows[item["file"]]
        holders = [line for line, row in rows.items() if item["value"] in row_text(row)]
        assert holders == [item["line"]], item
        if item["type"] == "resident_id":
            assert id_valid(item["value"]), item
        if item["type"] == "bank_card":
            assert 16 <= len(item["value"].replace(" ", "")) <= 19 and luhn_valid(item["value"]), item


def test_raw_lookalikes_are_present_and_hard_ones_fail_their_checksums(truth: dict, raw_rows: dict) -> None:
    for item in truth["lookalikes"] + truth["hard_lookalikes"]:
        assert item["value"] in row_text(raw_rows[item["file"]][item["line"]]), item
    for item in truth["hard_lookalikes"]:
        assert not luhn_valid(item["value"]), item
        if len(item["value"]) == 18:
            assert not id_valid(item["value"]), item


def test_raw_duplicates_malformed_and_invalid_lines(truth: dict, raw_rows: dict) -> None:
    for item in truth["exact_duplicates"]:
        rows = raw_rows[item["file"]]
        assert rows[item["line"]] == rows[item["duplicate_of"]]
    for item in truth["near_duplicates"]:
        rows = raw_rows[item["file"]]
        assert rows[item["line"]] != rows[item["near_duplicate_of"]]
    for item in truth["malformed"]:
        assert isinstance(raw_rows[item["file"]][item["line"]], RecordError), item
    for item in truth["schema_invalid"]:
        with pytest.raises(RecordError):
            to_canonical(raw_rows[item["file"]][item["line"]], "sft")


def test_raw_corpus_every_row_converted_or_quarantined(truth: dict) -> None:
    files = [SAMPLE / "raw" / f for f in truth["files"] if f != "pretrain.jsonl"]
    result = load_canonical(files, "sft")
    lines = sorted((Path(q.file).name, q.line) for q in result.quarantined)
    expected = sorted((i["file"], i["line"]) for i in truth["malformed"] + truth["schema_invalid"])
    assert lines == expected
    assert result.source_count == sum(v["records"] for f, v in truth["files"].items() if f != "pretrain.jsonl")
    pretrain = load_canonical([SAMPLE / "raw" / "pretrain.jsonl"], "pretrain")
    assert pretrain.quarantined == [] and len(pretrain.records) == truth["files"]["pretrain.jsonl"]["records"]


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


# ---- the shipped format samples (data/sample/formats) ---------------------------------------------

FORMATS_DIR = SAMPLE / "formats"
FORMAT_KINDS = {"pretrain_medical.txt": "pretrain", "pretrain_gb18030.txt": "pretrain",
                "sft_sharegpt_tools.jsonl": "sft", "preference_sharegpt.jsonl": "preference",
                "grpo_qa.jsonl": "prompt"}


@pytest.fixture(scope="module")
def formats_truth() -> dict:
    readme = (FORMATS_DIR / "README.md").read_text(encoding="utf-8")
    return json.loads(readme.split("```json\n", 1)[1].split("\n```", 1)[0])


def test_format_samples_quarantine_exactly_the_lines_made_malformed(formats_truth: dict) -> None:
    assert set(formats_truth) == set(FORMAT_KINDS)
    for name, kind in FORMAT_KINDS.items():
        path = FORMATS_DIR / name
        result = load_canonical([path], kind)  # type: ignore[arg-type]
        truth = formats_truth[name]
        assert result.source_count == truth["records"], name
        assert 10 <= truth["records"] <= 60, name
        # every quarantined line is one made malformed on purpose, for the reason given, and nothing else is
        got = {str(q.line): q.reason for q in result.quarantined}
        assert set(got) == set(truth["malformed"]), name
        for line, reason in truth["malformed"].items():
            assert got[line].startswith(reason), (name, line, got[line])
        assert len(set(truth["malformed"].values())) == len(truth["malformed"]), name  # distinct reasons
        assert len(result.records) + len(result.quarantined) == result.source_count, name
        assert sum(result.detected[str(path)].values()) == result.source_count, name
        if name.endswith(".jsonl"):
            assert 4 <= len(truth["malformed"]) <= 8, name


def test_format_samples_cover_tool_calls_tools_forms_and_systems() -> None:
    sft_rows = [row for _, row in iter_rows(FORMATS_DIR / "sft_sharegpt_tools.jsonl") if isinstance(row, dict)]
    tools_forms = Counter(type(r["tools"]).__name__ for r in sft_rows if r.get("tools"))
    assert tools_forms["str"] >= 5 and tools_forms["list"] >= 5
    sft = load_canonical([FORMATS_DIR / "sft_sharegpt_tools.jsonl"], "sft").records
    calls = [t for r in sft for t in r["conversations"] if t["role"] == "tool_call"]
    assert len(calls) >= 20
    assert any(c["content"].startswith("[") for c in calls)  # parallel calls
    assert sum(r["conversations"][0]["role"] == "system" for r in sft) >= 4
    assert sum("tools" not in r for r in sft) >= 3  # plain records too
    pref = load_canonical([FORMATS_DIR / "preference_sharegpt.jsonl"], "preference").records
    assert sum("tools" in r for r in pref) >= 4 and sum(r["conversations"][0]["role"] == "system" for r in pref) >= 3
    assert any(t["role"] == "tool" for r in pref for t in r["conversations"])
    grpo = load_canonical([FORMATS_DIR / "grpo_qa.jsonl"], "prompt").records
    assert all(len(r["answer"]) <= 8 for r in grpo) and {"B", "0.9%"} <= {r["answer"] for r in grpo}
    gb = (FORMATS_DIR / "pretrain_gb18030.txt").read_bytes()
    with pytest.raises(UnicodeDecodeError):
        gb.decode("utf-8")
    texts = [r["text"] for name in ("pretrain_medical.txt", "pretrain_gb18030.txt")
             for r in load_canonical([FORMATS_DIR / name], "pretrain").records]
    assert all(len(CJK.findall(t)) >= 20 for t in texts)


def test_format_samples_hold_the_fake_phone_in_at_most_two_records() -> None:
    holders = [(p.name, line) for p in sorted(FORMATS_DIR.iterdir()) if p.suffix in (".jsonl", ".txt")
               for line, text in enumerate(p.read_bytes().decode("utf-8" if "gb18030" not in p.name else "gb18030")
                                           .splitlines(), 1) if "13800138000" in text]
    assert 1 <= len(holders) <= 2
