"""The exam data kind (issue 19 item 2, data.exam): CMExam-style `{question, options, answer}` (options a dict or a
list, answers one or several letters) and C-Eval's columns onto the canonical exam record; malformed lines
quarantined with line and reason; stable ids; PII redaction; the sample exam (data/sample/exam) as its README says;
how a model's generated answer is read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from medgpt_ray.data.exam import answer_text, candidates, exam_prompt, parse_letters
from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.prepare import prepare_kind
from medgpt_ray.data.prompt_rows import as_prompt
from medgpt_ray.data.readers import RecordError, detect_format, to_canonical
from medgpt_ray.data.shards import read_table

REPO = Path(__file__).resolve().parents[2]
EXAM_DIR = REPO / "data" / "sample" / "exam"
Q = "成人高血压的诊断标准是？"
OPTS = ["≥140/90 mmHg", "≥120/80 mmHg", "≥160/100 mmHg"]


@pytest.mark.parametrize(("row", "fmt", "answer"), [
    ({"question": Q, "options": dict(zip("ABC", OPTS, strict=True)), "answer": "A"}, "exam", "A"),
    ({"question": Q, "options": OPTS, "answer": "c"}, "exam", "C"),
    ({"question": Q, "options": {"a": OPTS[0], "b": OPTS[1], "c": OPTS[2]}, "answer": "C, A"}, "exam", "AC"),
    ({"question": Q, "options": OPTS, "answer": ["B", "A"]}, "exam", "AB"),
    ({"question": Q, "options": OPTS, "answer": "A、C"}, "exam", "AC"),
    ({"id": 7, "question": Q, "A": OPTS[0], "B": OPTS[1], "C": OPTS[2], "answer": "B", "explanation": "..."},
     "ceval", "B"),
])
def test_each_exam_format_gives_the_canonical_record(row, fmt, answer):
    assert detect_format(row) == fmt
    (record,) = to_canonical(row, "exam")
    assert record == {"question": Q, "options": dict(zip("ABC", OPTS, strict=True)), "answer": answer}


@pytest.mark.parametrize(("row", "reason"), [
    ({"question": Q, "answer": "A"}, "missing field 'options'"),
    ({"question": Q, "options": None, "answer": "A"}, "missing field 'options'"),
    ({"question": Q, "options": OPTS, "answer": "D"}, "answer D is not among the options ABC"),
    ({"question": Q, "options": OPTS}, "missing field 'answer'"),
    ({"question": Q, "options": OPTS, "answer": "AA"}, "names an option twice"),
    ({"question": Q, "options": OPTS, "answer": "对"}, "not option letters"),
    ({"question": Q, "options": [OPTS[0]], "answer": "A"}, "needs at least 2"),
    ({"question": Q, "options": {"A": OPTS[0], "C": OPTS[1]}, "answer": "A"}, "without a gap"),
    ({"question": Q, "options": {"AB": OPTS[0], "C": OPTS[1]}, "answer": "C"}, "not a single letter"),
    ({"question": Q, "options": ["", OPTS[1]], "answer": "B"}, "empty option A"),
    ({"question": " ", "options": OPTS, "answer": "A"}, "empty field 'question'"),
    ({"question": Q, "options": "A. 是 B. 否", "answer": "A"}, "not an object or a list"),
])
def test_a_malformed_exam_record_says_why_without_quoting_it(row, reason):
    with pytest.raises(RecordError) as e:
        to_canonical(row, "exam")
    assert reason in e.value.reason
    assert Q not in e.value.reason and OPTS[0] not in e.value.reason


def readme_cases(folder: Path):
    """Each sample file the folder's README lists: (name, what the README says, the quarantine's {line: reason}),
    its record count checked against the README's."""
    readme = (folder / "README.md").read_text(encoding="utf-8")
    truth = json.loads(re.search(r"```json\n(.*?)```", readme, re.S).group(1))
    for name, t in truth.items():
        result = load_canonical([folder / name], "exam")
        assert result.source_count == t["records"], name
        yield name, t, {str(q.line): q.reason for q in result.quarantined}


def test_the_sample_exam_loads_and_quarantines_exactly_the_lines_its_readme_lists():
    for name, t, got in readme_cases(EXAM_DIR):
        assert set(got) == set(t["malformed"]), name
        for line, reason in t["malformed"].items():
            assert reason in got[line], (name, line, got[line])
    mc = load_canonical([EXAM_DIR / "medical_mc.jsonl"], "exam").records
    assert 40 <= len(mc) <= 60
    assert sum(len(r["answer"]) > 1 for r in mc) >= 3  # multi-answer questions
    lines = (EXAM_DIR / "medical_mc.jsonl").read_text(encoding="utf-8").splitlines()
    assert {type(json.loads(x)["options"]).__name__ for x in lines} == {"dict", "list"}


def test_the_sample_exam_generator_is_deterministic(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_exam", EXAM_DIR / "make_exam.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(tmp_path)
    for name in ("medical_mc.jsonl", "ceval_style.jsonl", "README.md"):
        assert (tmp_path / name).read_bytes() == (EXAM_DIR / name).read_bytes(), f"rerun make_exam.py ({name})"


def test_prepared_exam_ids_are_stable_and_pii_is_redacted(tmp_path):
    src = tmp_path / "a.jsonl"
    rows = [{"question": f"{Q}（第{i}题）", "options": OPTS, "answer": "A"} for i in range(6)]
    rows.append({"question": "联系电话13800138000的患者应挂哪个科？", "options": ["心内科", "骨科"], "answer": "A"})
    src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    rev = tmp_path / "b.jsonl"
    rev.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in reversed(rows)), encoding="utf-8")

    def keys(path: Path, out: str) -> set[int]:
        d = prepare_kind("exam", [str(path)], tmp_path / out, 0.2)
        assert d.redactions["phone"] == 1
        return {k for f in (d.train_file, d.eval_file) for k in read_table(f).column("key").to_pylist()}

    assert keys(src, "one") == keys(rev, "two")  # the ids follow the records, not their order
    for split in ("train", "eval"):
        assert b"13800138000" not in (tmp_path / "one" / f"exam.{split}.parquet").read_bytes()


def test_an_exam_question_as_a_prompt_and_its_candidate_answers():
    record = {"question": Q, "options": dict(zip("ABC", OPTS, strict=True)), "answer": "AC"}
    prompt = exam_prompt(record)
    assert Q in prompt and all(f"{k}. {v}" in prompt for k, v in record["options"].items())
    assert answer_text(record) == f"A. {OPTS[0]}\nC. {OPTS[2]}"
    assert candidates(record) == ["AB", "AC", "BC"]
    assert candidates({**record, "answer": "B"}) == ["A", "B", "C"]
    asked = as_prompt({"question": Q, "options": OPTS, "answer": "B"})  # `medgpt-ray generate` on an exam file
    assert asked == {"conversations": [{"role": "user", "content": exam_prompt({**record, "answer": "B"})}],
                     "answer": "B"}


@pytest.mark.parametrize(("text", "letters"), [
    ("A. 高血压", "A"), ("AC", "AC"), ("A、C", "AC"), ("答案：B", "B"), ("选C吧", "C"), ("C,A", "AC"),
    ("Apple", "A"), ("我不知道", ""), ("", ""), ("  b", "B"), ("F", ""),
])
def test_a_generated_answer_reads_as_its_letters(text, letters):
    assert parse_letters(text, dict.fromkeys("ABCDE", "x")) == letters


def test_the_cleaner_refuses_an_exam_file(tmp_path):
    from medgpt_ray.data.clean_inputs import detect_kind
    from medgpt_ray.data.kinds import DataFileError

    with pytest.raises(DataFileError, match="list the file under data.exam"):
        detect_kind(EXAM_DIR / "medical_mc.jsonl")
