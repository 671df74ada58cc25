"""The planner drives the pipeline, and a CUDA OOM backs the micro-batch off instead of failing the run."""

from __future__ import annotations

import json

import pytest

from medgpt_ray.config import ConfigError, PipelineConfig
from medgpt_ray.run.pipeline import Pipeline, RunOptions
from medgpt_ray.stages.callbacks import INJECT_OOM_ENV

pytestmark = pytest.mark.ray


def _sft_only(tmp_path, name: str, sft: dict, resources: dict | None = None) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "name": name, "output_dir": str(tmp_path), "model": {"path": "tiny"},
        "data": {"sft": ["data/sample/sft_sharegpt.jsonl"], "eval_fraction": 0.1, "max_records": 64},
        "resources": {"num_workers": 1, **(resources or {})},
        "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
                   "sft": {"method": "lora", "seq_len": 256, "effective_batch": 8, "max_steps": 3,
                           "logging_steps": 1, **sft}},
    })


def test_the_plan_chosen_for_a_budget_is_what_runs(tiny_run):
    """The shared tiny run (tests/ray/conftest.py) was planned for a simulated 0.27 GiB card."""
    assert tiny_run.summary["stages"]["sft"]["status"] == "done"
    plan = json.loads((tiny_run.run_dir / "sft" / "plan.json").read_text())
    assert plan["prediction"]["peak_gib"] <= tiny_run.budget_gib < plan["alternatives"][0]["peak_gib"]
    # Planned at the data's lengths: packed rows of seq_len holding the 8 conversations a step asks for.
    assert plan["packing"]["conversations_per_step"] == 8 and plan["lengths"]["records"] > 0
    rows = plan["packing"]["rows_per_step"]
    assert plan["micro_batch"] < rows and plan["micro_batch"] * plan["grad_accum"] == rows
    result = json.loads((tiny_run.run_dir / "sft" / "result.json").read_text())
    assert result["steps"] == tiny_run.max_steps
    # Training workers run with umask 077: what they write is the owner's alone.
    for written in ("result.json", "metrics.jsonl", "model/config.json", "adapter"):
        assert (tiny_run.run_dir / "sft" / written).stat().st_mode & 0o077 == 0, written
    assert any(line.startswith("[sft] plan: lora, packed:") and "predicted peak" in line
               for line in tiny_run.lines)
    assert any(line.startswith("[sft] lengths: ") for line in tiny_run.lines)


def test_a_stage_says_how_long_its_first_step_took_from_its_start_line(tiny_run):
    """What a user waits before the first progress line (issue 48: a first step that looks hung): the driver's start
    line to the end of the first training step, in result.json and the stage's done line."""
    result = json.loads((tiny_run.run_dir / "sft" / "result.json").read_text())
    first, up = result["first_step_after_start_s"], result["startup_s"]
    metrics = [json.loads(line) for line in (tiny_run.run_dir / "sft" / "metrics.jsonl").read_text().splitlines()]
    # in order: the worker enters our function and is up, its model and data are ready, its trainer is built, its
    # first step ends (as long after the model and data as the trainer's callbacks timed)
    assert 0 < up["train_fn_s"] <= up["worker_up_s"] < up["model_and_data_s"] < up["trainer_built_s"] < first
    assert first == up["first_step_s"]
    assert up.get("worker_process_s", 0) <= up["train_fn_s"]  # absent where Ray reused a worker process
    assert 0 <= up["fit_s"] <= up["train_fn_s"]  # the driver called fit() before any worker ran our function
    assert first - up["model_and_data_s"] == pytest.approx(metrics[0]["first_step_s"], abs=0.2)
    assert first < tiny_run.summary["stages"]["sft"]["wall_s"]
    done = next(line for line in tiny_run.lines if line.startswith("[sft] done in "))
    assert (f"first step {first:.1f}s after the start line (worker up {up['worker_up_s']:.1f}s, trainer built "
            f"{up['trainer_built_s']:.1f}s)") in done


def test_a_config_predicted_not_to_fit_is_refused_before_anything_runs(ray_cluster, repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)
    cfg = _sft_only(tmp_path, "refused", {"micro_batch": 8, "grad_ckpt": False},
                    {"gpu_memory_gib": 0.27, "memory_margin_gib": 0.0})
    with pytest.raises(ConfigError, match=r"(?s)stages.sft: nothing fits 0.27 GiB.*micro_batch=8"):
        Pipeline(cfg, RunOptions(echo=lambda _: None)).run()
    assert not (tmp_path / "refused" / "sft").exists()


def test_oom_backs_off_to_half_the_micro_batch_and_resumes(ray_cluster, repo, tmp_path, monkeypatch):
    monkeypatch.chdir(repo)
    monkeypatch.setenv(INJECT_OOM_ENV, "2")
    cfg = _sft_only(tmp_path, "oom", {"micro_batch": 4, "save_steps": 1})
    lines: list[str] = []
    summary = Pipeline(cfg, RunOptions(echo=lines.append)).run()
    assert summary["stages"]["sft"]["status"] == "done"
    stage_dir = tmp_path / "oom" / "sft"
    assert (stage_dir / ".injected_oom").is_file()  # the hook really fired
    plan = json.loads((stage_dir / "plan.json").read_text())
    assert (plan["micro_batch"], plan["grad_accum"]) == (2, 4)
    [backoff] = plan["backoffs"]
    assert backoff["before"]["micro_batch"] == 4 and backoff["after"]["grad_accum"] == 4
    result = json.loads((stage_dir / "result.json").read_text())
    assert result["resumed_from"].endswith("checkpoint-1") and result["steps"] == 3
    assert any("CUDA out of memory at micro-batch 4 x accum 2: backing off to 2 x 4" in line for line in lines)
    manifest = json.loads((tmp_path / "oom" / "manifest.json").read_text())
    assert manifest["stages"]["sft"]["plan"]["backoffs"] == plan["backoffs"]

