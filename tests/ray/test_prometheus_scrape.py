"""A real Prometheus scrapes the shared Ray cluster while a tiny stage runs, and PromQL finds the run."""

from __future__ import annotations

import pytest

from medgpt_ray.config import PipelineConfig
from medgpt_ray.run.pipeline import Pipeline, RunOptions
from tests.promserver import PromServer

pytestmark = pytest.mark.ray


def test_a_tiny_stage_is_visible_in_prometheus(ray_cluster, ray_temp_dir, repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)
    # Ray lists every node's metrics endpoint in this file (Prometheus file-based service discovery); the
    # shared test cluster has its own temp dir, so this is its file and no other cluster's.
    sd_file = ray_temp_dir / "prom_metrics_service_discovery.json"
    assert sd_file.is_file(), f"the test cluster wrote no {sd_file.name}"
    prom = PromServer(tmp_path, {"job_name": "ray", "file_sd_configs": [{"files": [str(sd_file)]}]})
    try:
        cfg = PipelineConfig.model_validate({
            "name": "promtest", "output_dir": str(tmp_path / "runs"), "model": {"path": "tiny"},
            "data": {"sft": ["data/sample/sft_sharegpt.jsonl"], "max_records": 64},
            "resources": {"num_workers": 1},
            "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
                       "sft": {"method": "lora", "seq_len": 256, "effective_batch": 4, "max_steps": 12,
                               "logging_steps": 1}}})
        Pipeline(cfg, RunOptions(echo=lambda _: None)).run()
        loss = prom.wait_for('last_over_time(ray_medgpt_train_loss{run="promtest", stage="sft"}[10m])')
        assert loss[0]["metric"]["rank"] == "0" and float(loss[0]["value"][1]) > 0
        tps = prom.wait_for('max(last_over_time(ray_medgpt_train_tokens_per_second{run="promtest"}[10m]))')
        assert float(tps[0]["value"][1]) > 0
        done = prom.wait_for('last_over_time(ray_medgpt_pipeline_stage_state{run="promtest", stage="sft", '
                             'state="done"}[10m]) == 1')
        assert done
    finally:
        prom.stop()
