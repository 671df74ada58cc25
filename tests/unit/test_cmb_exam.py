"""CMB's exam files read as exam data (issue 48, "Benchmarks as users count them"): the singular `option`, answers of
one letter or several, the subject from exam_subject, else exam_class, else exam_type; an `exam` record's own
`subject`; a record without one as it always was; malformed records quarantined with a reason naming the field and
no record text; the sample (data/sample/cmb) as its README says and as its generator writes it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.data.prompt_rows import as_prompt
from medgpt_ray.data.readers import RecordError, detect_format, to_canonical
from medgpt_ray.data.shards import read_table
from tests.unit.test_exam_kind import readme_cases

REPO = Path(__file__).resolve().parents[2]
CMB_DIR = REPO / "data" / "sample" / "cmb"
Q = "患者，女，45岁。反复上腹痛3年，进食后加重。最可能的诊断是"
OPTS = {"A": "胃溃疡", "B": "十二指肠溃疡", "C": "胆囊炎", "D": "胰腺炎", "E": "阑尾炎"}
WHERE = {"exam_type": "医师考试", "exam_class": "执业医师", "exam_subject": "临床执业医师"}


def cmb(**fields) -> dict:
    row = {**WHERE, "question": Q, "answer": "A", "question_type": "单项选择题", "option": dict(OPTS), **fields}
    return {k: v for k, v in row.items() if v is not ...}  # `...`: leave the field out


def test_a_cmb_record_is_detected_and_read_with_its_subject():
    row = cmb(answer="E")
    assert detect_format(row) == "cmb"
    assert to_canonical(row, "exam") == [{"question": Q, "options": OPTS, "answer": "E", "subject": "临床执业医师"}]
    (multi,) = to_canonical(cmb(answer="DBA", question_type="多项选择题"), "exam")
    assert multi["answer"] == "ABD"  # several right answers, sorted


@pytest.mark.parametrize(("fields", "subject"), [
    ({}, "临床执业医师"),
    ({"exam_subject": ...}, "执业医师"),
    ({"exam_subject": None}, "执业医师"),
    ({"exam_subject": "  "}, "执业医师"),  # blank: as if absent
    ({"exam_subject": ..., "exam_class": ...}, "医师考试"),
    ({"exam_subject": ..., "exam_class": "", "exam_type": " 护理考试 "}, "护理考试"),
])
def test_the_subject_is_the_most_specific_field_given(fields, subject):
    (record,) = to_canonical(cmb(**fields), "exam")
    assert record["subject"] == subject


def test_a_cmb_record_naming_no_subject_has_none_and_is_still_detected():
    row = cmb(exam_subject=..., exam_class=..., exam_type=...)
    assert detect_format(row) == "cmb"
    (record,) = to_canonical(row, "exam")
    assert "subject" not in record


def test_an_exam_record_keeps_its_own_subject_and_one_without_is_unchanged():
    base = {"question": Q, "options": list(OPTS.values()), "answer": "B"}
    (plain,) = to_canonical(base, "exam")
    assert plain == {"question": Q, "options": OPTS, "answer": "B"}  # no "subject" key: its hash and id as before
    assert to_canonical({**base, "subject": "内科学"}, "exam")[0] == {**plain, "subject": "内科学"}
    assert to_canonical({**base, "subject": None}, "exam")[0] == plain


@pytest.mark.parametrize(("row", "reason"), [
    (cmb(answer=...), "missing field 'answer'"),
    (cmb(option=...), "missing field 'option'"),
    (cmb(option="A. 胃溃疡 B. 十二指肠溃疡"), "field 'option' is a str, not an object or a list"),
    (cmb(question=...), "missing field 'question'"),  # detected by its exam fields: the missing field is named
    (cmb(answer="F"), "answer F is not among the options ABCDE"),
    (cmb(exam_subject=101), "field 'exam_subject' is a int, not a string"),
    (cmb(exam_subject=..., exam_class=["执业医师"]), "field 'exam_class' is a list, not a string"),
    (cmb(option={**OPTS, "C": ""}), "empty option C"),  # a blank option inside the list is an error
])
def test_a_malformed_cmb_record_says_why_naming_the_field_without_quoting_it(row, reason):
    with pytest.raises(RecordError) as e:
        to_canonical(row, "exam")
    assert reason in e.value.reason
    assert Q not in e.value.reason and "胃溃疡" not in e.value.reason and "执业" not in e.value.reason


def test_a_non_string_subject_of_an_exam_record_is_refused_naming_the_field():
    with pytest.raises(RecordError, match="field 'subject' is a int, not a string"):
        to_canonical({"question": Q, "options": list(OPTS.values()), "answer": "A", "subject": 3}, "exam")


def test_blank_padded_option_slots_at_the_end_are_left_out():
    (record,) = to_canonical(cmb(answer="B", option={**OPTS, "D": "", "E": None}), "exam")
    assert record["options"] == {"A": "胃溃疡", "B": "十二指肠溃疡", "C": "胆囊炎"}
    with pytest.raises(RecordError, match="answer E is not among the options ABC"):
        to_canonical(cmb(answer="E", option={**OPTS, "D": "", "E": " "}), "exam")


def test_a_cmb_question_without_its_answer_is_a_prompt_to_generate_from():
    record = as_prompt(cmb(answer=...))
    assert record["answer"] is None and Q in record["conversations"][-1]["content"]
    assert as_prompt(cmb(answer="C"))["answer"] == "C"


@pytest.mark.parametrize("layout", ["array", "lines"])
def test_a_cmb_file_is_prepared_as_exam_data_and_a_record_without_answer_is_quarantined(tmp_path, layout):
    rows = [cmb(question=f"{Q}（第{i}题）", answer="ABCDE"[i % 5]) for i in range(8)]
    rows[3].pop("answer")
    rows[5] = cmb(question="无科目的题目", exam_subject=..., exam_class=..., exam_type=...)
    src = tmp_path / ("cmb.json" if layout == "array" else "cmb.jsonl")
    text = (json.dumps(rows, ensure_ascii=False, indent=1) if layout == "array"
            else "\n".join(json.dumps(r, ensure_ascii=False) for r in rows))
    src.write_text(text + "\n", encoding="utf-8")
    d = prepare_kind("exam", [str(src)], tmp_path / "out", 0.25)
    assert (d.source_records, d.train_records + d.eval_records, d.quarantined) == (8, 7, 1)
    (bad,) = [json.loads(line) for line in Path(d.quarantine_file).read_text(encoding="utf-8").splitlines()]
    assert (bad["line"], bad["reason"]) == (4, "missing field 'answer'")  # element 4 of the array, line 4 of lines
    records = [json.loads(r) for f in (d.train_file, d.eval_file) for r in read_table(f).column("record").to_pylist()]
    assert sorted(r.get("subject", "-") for r in records) == ["-"] + ["临床执业医师"] * 6


def test_the_sample_cmb_exam_loads_and_quarantines_exactly_what_its_readme_lists():
    for name, t, got in readme_cases(CMB_DIR):
        assert got == t["malformed"], name
    records = load_canonical([CMB_DIR], "exam").records
    assert len(records) == 12 and sum(len(r["answer"]) > 1 for r in records) >= 1
    by_subject: dict[str, int] = {}
    for r in records:
        by_subject[r["subject"]] = by_subject.get(r["subject"], 0) + 1
    assert by_subject == {"临床执业医师": 4, "口腔执业医师": 4, "护士执业资格": 4}  # the last from exam_class
    assert json.loads((CMB_DIR / "cmb_exam.json").read_text(encoding="utf-8"))[0].keys() >= {"option", "exam_type"}


def test_the_sample_cmb_generator_writes_the_committed_files(tmp_path):
    spec = importlib.util.spec_from_file_location("make_cmb", CMB_DIR / "make_cmb.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    for name in ("cmb_exam.json", "README.md"):
        assert (tmp_path / name).read_bytes() == (CMB_DIR / name).read_bytes(), f"rerun make_cmb.py ({name})"
