"""Reading data files (no Ray): each file type's rows with their line numbers and errors (data/file_rows.py), and
load_canonical over files and directories (data/files.py); the records' conversion is test_readers.py's."""

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
from medgpt_ray.data.readers import DataFileError, RecordError, to_canonical
from tests.unit.test_readers import SECRET, canonical, sharegpt, write_jsonl

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


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz"])
def test_a_compressed_file_is_read_as_the_file_it_holds(tmp_path: Path, suffix: str) -> None:
    """gzip, bzip2 and xz: JSONL (its blank and bad lines where they are), a JSON array, a GB18030 CSV and a .txt
    give the rows and line numbers their plain files give."""
    import bz2
    import gzip
    import lzma

    compress = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress}[suffix]
    plain = [write_jsonl(tmp_path / "d.jsonl", [{"text": "第一行"}, "", "{broken", {"text": "四"}])]
    (tmp_path / "a.json").write_text(json.dumps([{"text": "甲"}, {"text": "乙"}], ensure_ascii=False), "utf-8")
    plain.append(tmp_path / "a.json")
    plain.append(write_csv(tmp_path / "t.csv", TOYHOM_ROWS, "gb18030"))
    (tmp_path / "n.txt").write_text("第一段\n\n第三段\n", encoding="utf-8")
    plain.append(tmp_path / "n.txt")
    for path in plain:
        packed = path.with_name(path.name + suffix)
        packed.write_bytes(compress(path.read_bytes()))
        assert [(n, r if isinstance(r, dict) else str(r)) for n, r in iter_rows(packed)] == \
            [(n, r if isinstance(r, dict) else str(r)) for n, r in iter_rows(path)], packed.name


def test_a_broken_compressed_file_names_itself_and_parquet_is_never_wrapped(tmp_path: Path) -> None:
    import gzip

    from medgpt_ray.data.chunks import plan_chunks, read_chunk

    rows = [{"text": f"第{i}行"} for i in range(200)]
    whole = gzip.compress(write_jsonl(tmp_path / "d.jsonl", rows).read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) // 2])  # a download that stopped half way
    with pytest.raises(DataFileError, match=re.escape(str(cut)) + ": not a readable .gz stream"):
        list(iter_rows(cut))
    fake = tmp_path / "fake.jsonl.gz"
    fake.write_bytes(b'{"text": "not gzip"}\n')
    with pytest.raises(DataFileError, match="fake.jsonl.gz: not a readable .gz stream"):
        list(iter_rows(fake))
    (tmp_path / "t.parquet.gz").write_bytes(b"")
    with pytest.raises(DataFileError, match="unsupported file type '.parquet.gz'"):
        list(iter_rows(tmp_path / "t.parquet.gz"))
    # Ray Data's read tasks: a compressed file is one chunk (no byte offsets to cut a stream at), read whole.
    good = tmp_path / "good.jsonl.gz"
    good.write_bytes(whole)
    chunks = plan_chunks(good, "pretrain", 0, chunk_bytes=64)
    assert len(chunks) == 1 and chunks[0].end == -1
    assert [json.loads(r["text"]) for r in read_chunk(chunks[0])] == rows


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
