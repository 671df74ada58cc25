"""`data.raw` in a pipeline config: cleaning runs first and its Parquet feeds the stages."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.config import PipelineConfig
from medgpt_ray.data.shards import num_rows, read_table
from medgpt_ray.run.pipeline import Pipeline, RunOptions

pytestmark = pytest.mark.ray


def test_raw_sources_are_cleaned_then_trained_on(ray_cluster, repo, tmp_path):
    cfg = PipelineConfig.model_validate({
        "name": "raw", "output_dir": str(tmp_path), "model": {"path": "tiny"},
        "data": {"raw": [str(repo / "data/sample/raw")], "eval_fraction": 0.1},
        "resources": {"num_workers": 1},
        "stages": {"pt": {"max_steps": 1, "seq_len": 64, "effective_batch": 2},
                   "sft": {"max_steps": 1, "seq_len": 256, "effective_batch": 2, "method": "lora"},
                   "rm": {"enabled": False}, "dpo": {"enabled": False}},
    })
    lines: list[str] = []
    summary = Pipeline(cfg, RunOptions(echo=lines.append)).run()
    assert [summary["stages"][s]["status"] for s in ("pt", "sft")] == ["done", "done"]
    report = json.loads((tmp_path / "raw" / "clean" / "report.json").read_text())
    prepared = {k: num_rows(tmp_path / "raw" / "data" / f"{k}.train.parquet") +
                num_rows(tmp_path / "raw" / "data" / f"{k}.eval.parquet") for k in ("pretrain", "sft")}
    assert prepared == {k: report["per_kind"][k]["emitted"] for k in ("pretrain", "sft")}
    sft_text = "\n".join(read_table(tmp_path / "raw" / "data" / "sft.train.parquet").column("record").to_pylist())
    assert "110105196709131164" not in sft_text and "<ID_CARD>" in sft_text

    lines.clear()
    again = Pipeline(cfg, RunOptions(echo=lines.append)).run()
    assert any("raw sources unchanged" in line for line in lines)
    assert [again["stages"][s]["status"] for s in ("pt", "sft")] == ["skipped", "skipped"]
