"""The throughput `plan` predicts for a CPU run is the order of what `make demo` measures (issue 48 item 10: it
predicted 395 tokens/s for pt where pt ran ~25,000): every stage of configs/tiny-cpu.yaml within a factor of 2 of
bench/results/cpu_demo_throughput.json."""

from __future__ import annotations

import json
from pathlib import Path

from medgpt_ray.config import load_config
from medgpt_ray.memory.budget import resolve_budget
from medgpt_ray.memory.planner import model_shape
from medgpt_ray.memory.throughput import GPU_SPECS, step_seconds
from medgpt_ray.run.job import StageJob

REPO = Path(__file__).resolve().parents[2]


def test_a_cpu_plan_predicts_the_demos_tokens_per_second_within_a_factor_of_two():
    measured = json.loads((REPO / "bench/results/cpu_demo_throughput.json").read_text())["tokens_per_s"]
    cfg = load_config(REPO / "configs/tiny-cpu.yaml")
    shape, budget = model_shape(cfg), resolve_budget(cfg, None, 24.0)
    for stage, tokens_per_s in measured.items():
        plan = StageJob(cfg, stage, Path(), lambda _: None).plan(budget)
        setup = plan.train_setup(cfg.stages.get(stage))
        predicted = setup.tokens() / step_seconds(shape, setup, GPU_SPECS["cpu"]) * plan.num_workers
        assert 0.5 <= predicted / tokens_per_s <= 2.0, (stage, predicted, tokens_per_s)
