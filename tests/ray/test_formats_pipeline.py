"""Every MedicalGPT source format through the pipeline's data preparation, given directly (data.pretrain|sft|
preference|prompt) and as raw sources (data.raw, cleaned by Ray Data first): counts add up per file, only the
records broken on purpose are quarantined, and the kinds no stage trains on yet (prompt) are prepared too.

Given directly, they are what the e2e `ray job submit` test's jobs train on (tests/e2e/test_pipeline.py): it
checks what they prepared with `assert_formats_prepared`, instead of a pipeline run of its own here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medgpt_ray.data.shards import read_records
from tests.e2e.test_clean_cli import FORMATS, malformed_lines

pytestmark = pytest.mark.ray

FILES = {
    "pretrain": ["pretrain_medical.txt", "pretrain_gb18030.txt"],
    "sft": ["sft_sharegpt_tools.jsonl"],
    "preference": ["preference_sharegpt.jsonl"],
    "prompt": ["grpo_qa.jsonl"],
}
def lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def formats_data_sets() -> list[str]:
    """`--set` arguments giving each kind its FILES, uncapped (every record counts)."""
    sets = ["--set", "data.max_records=null"]
    for kind, files in FILES.items():
        sets += ["--set", f"data.{kind}=[{', '.join(str(FORMATS / f) for f in files)}]"]
    return sets


def assert_formats_prepared(data: Path, echoed: list[str]) -> None:
    """A pipeline given FILES directly kept every record but those broken on purpose, quarantined exactly those
    (file and line, 0600), said so per kind, and prepared the prompt kind in its canonical shape."""
    broken = malformed_lines()
    manifest = json.loads((FORMATS / "README.md").read_text().split("```json\n", 1)[1].split("```", 1)[0])
    for kind, files in FILES.items():
        kept = len(read_records(data / f"{kind}.train.parquet")) + len(read_records(data / f"{kind}.eval.parquet"))
        source = sum(manifest[f]["records"] for f in files)
        bad = sum(len(broken[f]) for f in files)
        assert kept == source - bad, kind
        quarantine = data / f"quarantine-{kind}.jsonl"
        if bad:
            got = {(q["file"].rsplit("/", 1)[1], q["line"]) for q in lines(quarantine)}
            assert got == {(f, line) for f in files for line in broken[f]}, kind
            assert oct(quarantine.stat().st_mode & 0o777) == "0o600"
        else:
            assert not quarantine.exists()
        assert any(line.startswith(f"data {kind}: {source} source records") for line in echoed), kind
    prompts = read_records(data / "prompt.train.parquet")
    assert all(set(p) <= {"conversations", "answer", "tools"} and p["conversations"][-1]["role"] == "user"
               for p in prompts)


def test_each_format_as_raw_sources_is_cleaned_then_prepared(raw_run):
    # The shared raw run (tests/ray/conftest.py) cleans data/sample/formats beside our dirty sample corpus.
    assert raw_run.summary["stages"]["sft"]["status"] == "done"
    report = json.loads((raw_run.run_dir / "clean" / "report.json").read_text())
    assert report["adds_up"]
    assert {Path(f).name for f in report["files"]} >= set(malformed_lines())  # every format file was read
    data = raw_run.run_dir / "data"
    for kind in FILES:
        prepared = len(read_records(data / f"{kind}.train.parquet")) + len(read_records(data / f"{kind}.eval.parquet"))
        assert prepared == report["per_kind"][kind]["emitted"] > 0, kind
    tool_records = [r for r in read_records(data / "sft.train.parquet") + read_records(data / "sft.eval.parquet")
                    if r.get("tools")]
    assert tool_records and all(isinstance(r["tools"], list) for r in tool_records)
