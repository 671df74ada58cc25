"""The shipped sample corpora, read by our readers: the clean sample, the dirty corpus and its ground truth
(raw/README.md), and one file per MedicalGPT format (data/sample/formats)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections import Counter
from pathlib import Path

import pytest

from medgpt_ray.data.file_rows import iter_rows
from medgpt_ray.data.files import load_canonical
from medgpt_ray.data.readers import RecordError, to_canonical
from tests.unit.test_readers import SAMPLE

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
    assert len(result.records) >= 1340  # >= 200 held out at the demo's eval_fraction 0.15
    rows = reward_rows()
    assert len({r["question"] for r in rows}) == len(rows)  # no question repeats verbatim
    assert all(5 <= len(r[k]) <= 120 for r in rows for k in ("response_chosen", "response_rejected"))
    assert len({r["response_rejected"] for r in rows}) >= 300  # answers vary in wording


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


# ---- the shipped format samples (data/sample/formats) ---------------------------------------------

FORMATS_DIR = SAMPLE / "formats"
FORMAT_KINDS = {"pretrain_medical.txt": "pretrain", "pretrain_gb18030.txt": "pretrain",
                "sft_sharegpt_tools.jsonl": "sft", "preference_sharegpt.jsonl": "preference",
                "grpo_qa.jsonl": "prompt", "unpaired_kto.jsonl": "unpaired"}


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
