"""CPU runs are planned against host RAM (issue 16 item 7): absurd settings that used to plan as "fits" are
refused with the numbers; the budget is RAM shared by the workers, never a GPU budget."""

from __future__ import annotations

import pytest

from medgpt_ray.config import PipelineConfig, StageConfig
from medgpt_ray.memory.budget import cpu_budget
from medgpt_ray.memory.planner import PlanError, plan_all, plan_stage
from medgpt_ray.memory.shapes import load_shape


def test_absurd_cpu_settings_are_refused_with_the_host_ram_numbers():
    budget = cpu_budget(16.0, 2, "test")
    assert budget.usable_gib == pytest.approx(16.0 * 0.8 / 2)
    with pytest.raises(PlanError, match=r"nothing fits 6\.40 GiB of host RAM per worker") as e:
        plan_stage("sft", StageConfig(method="lora", seq_len=100_000_000, effective_batch=1_000_000_000), 2, False,
                   load_shape("tiny"), budget)
    assert "qlora" not in str(e.value)  # no GPU-only way out suggested on a CPU


def test_a_cpu_plan_checks_ram_but_publishes_no_gpu_budget():
    cfg = PipelineConfig.model_validate({
        "model": {"path": "tiny"}, "data": {"sft": ["x.jsonl"]},
        "resources": {"num_workers": 1, "host_memory_gib": 0.2},
        "stages": {"pt": {"enabled": False}, "rm": {"enabled": False}, "dpo": {"enabled": False},
                   "sft": {"method": "lora", "seq_len": 512, "effective_batch": 8}}})
    plans, errors = plan_all(cfg)
    assert not plans and "0.16 GiB of host RAM per worker" in errors["sft"]  # 80 % of 0.2 GiB
    cfg = cfg.model_copy(update={"resources": cfg.resources.model_copy(update={"host_memory_gib": 64})})
    plans, errors = plan_all(cfg)
    assert not errors and plans["sft"].prediction.budget_gib is None  # no GPU gauges for a CPU run
    assert "host RAM" in plans["sft"].prediction.budget_source
