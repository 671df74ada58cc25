"""Pipeline runs shared by the tests that only read a run, instead of each starting its own: one tiny run
(planner, metrics; later eval and report) and one run that cleans raw sources first (`data.raw`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.promserver import PromServer, tiny_run_series

# A simulated 0.27 GiB card (the CPU has no allocator to cap): the tiny model no longer fits at micro-batch 8
# without checkpointing, so the planner must trade.
BUDGET_GIB = 0.27
MAX_STEPS = 12


@dataclass
class TinyRun:
    name: str
    run_dir: Path
    summary: dict
    lines: list[str]
    budget_gib: float
    max_steps: int
    prom: PromServer  # a real Prometheus that scraped the shared cluster while the run went on, and stopped after
    cfg: object  # the PipelineConfig, for a run of the same config


@pytest.fixture(scope="session")
def tiny_run(ray_cluster, ray_temp_dir, repo, tmp_path_factory):
    from medgpt_ray.config import PipelineConfig
    from medgpt_ray.run.pipeline import Pipeline, RunOptions

    tmp = tmp_path_factory.mktemp("tiny-run")
    # Ray lists every node's metrics endpoint in this file (Prometheus file-based service discovery); the
    # shared test cluster has its own temp dir, so this is its file and no other cluster's.
    sd_file = ray_temp_dir / "prom_metrics_service_discovery.json"
    assert sd_file.is_file(), f"the test cluster wrote no {sd_file.name}"
    prom = PromServer(tmp, {"job_name": "ray", "file_sd_configs": [{"files": [str(sd_file)]}]})
    try:
        cfg = PipelineConfig.model_validate({
            "name": "tinyrun", "output_dir": str(tmp / "runs"), "model": {"path": "tiny"},
            "data": {"sft": [str(repo / "data/sample/sft_sharegpt.jsonl")], "eval_fraction": 0.1,
                     "max_records": 64},
            "resources": {"num_workers": 1, "gpu_memory_gib": BUDGET_GIB, "memory_margin_gib": 0.0},
            "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
                       "sft": {"method": "lora", "seq_len": 256, "effective_batch": 8, "max_steps": MAX_STEPS,
                               "logging_steps": 1}}})
        lines: list[str] = []
        summary = Pipeline(cfg, RunOptions(echo=lines.append)).run()
        # Scraped until the run's series are in, then not: each scrape of the shared cluster costs its metrics
        # agent more as the session's series pile up (PromServer.stop_scraping).
        prom.settle(tiny_run_series(cfg.name))
        prom.stop_scraping()
        yield TinyRun(cfg.name, tmp / "runs" / cfg.name, summary, lines, BUDGET_GIB, MAX_STEPS, prom, cfg)
    finally:
        prom.stop()


@dataclass
class RawRun:
    run_dir: Path
    cfg: object  # the PipelineConfig, for a re-run of the same config
    summary: dict
    lines: list[str]


@pytest.fixture(scope="session")
def raw_run(ray_cluster, repo, tmp_path_factory):
    """`data.raw` in a pipeline config: our dirty sample corpus (data/sample/raw, whose README lists its planted
    defects) and one file per MedicalGPT source format (data/sample/formats), cleaned by Ray Data as the
    pipeline's first step, then one step of sft on the cleaned Parquet. pt is off: its stage reads the prepared
    pretrain Parquet whatever the source (the e2e `ray job submit` test trains pt on the formats' pretrain files and
    starts sft from it); what is specific to raw sources, cleaned pretrain records reaching that Parquet, is counted
    by test_pipeline_raw.py and test_formats_pipeline.py."""
    from medgpt_ray.config import PipelineConfig
    from medgpt_ray.run.pipeline import Pipeline, RunOptions

    tmp = tmp_path_factory.mktemp("raw-run")
    cfg = PipelineConfig.model_validate({
        "name": "raw", "output_dir": str(tmp), "model": {"path": "tiny"},
        "data": {"raw": [str(repo / "data/sample/raw"), str(repo / "data/sample/formats")], "eval_fraction": 0.1},
        "resources": {"num_workers": 1},
        "stages": {"pt": {"enabled": False},
                   "sft": {"max_steps": 1, "seq_len": 256, "effective_batch": 2, "method": "lora"},
                   "rm": {"enabled": False}, "dpo": {"enabled": False}},
    })
    lines: list[str] = []
    summary = Pipeline(cfg, RunOptions(echo=lines.append)).run()
    return RawRun(tmp / "raw", cfg, summary, lines)
