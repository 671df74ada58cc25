"""`data.raw` in a pipeline config: cleaning runs first and its Parquet feeds the stages (the shared raw run,
tests/ray/conftest.py), and a re-run of the same config cleans and trains nothing again."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.data.shards import num_rows, read_table
from medgpt_ray.run.pipeline import Pipeline, RunOptions

pytestmark = pytest.mark.ray


def test_raw_sources_are_cleaned_then_trained_on(raw_run):
    summary, run_dir = raw_run.summary, raw_run.run_dir
    assert [summary["stages"][s]["status"] for s in ("pt", "sft")] == ["disabled", "done"]
    report = json.loads((run_dir / "clean" / "report.json").read_text())
    prepared = {k: num_rows(run_dir / "data" / f"{k}.train.parquet") + num_rows(run_dir / "data" / f"{k}.eval.parquet")
                for k in ("pretrain", "sft")}
    assert prepared == {k: report["per_kind"][k]["emitted"] for k in ("pretrain", "sft")}
    sft_text = "\n".join(read_table(run_dir / "data" / "sft.train.parquet").column("record").to_pylist())
    assert "110105196709131164" not in sft_text and "<ID_CARD>" in sft_text


def test_a_rerun_with_unchanged_raw_sources_skips_cleaning_and_training(raw_run):
    lines: list[str] = []
    again = Pipeline(raw_run.cfg, RunOptions(echo=lines.append)).run()
    assert any("raw sources unchanged" in line for line in lines)
    assert again["stages"]["sft"]["status"] == "skipped"
