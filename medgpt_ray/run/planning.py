"""The pipeline's planning: every stage before anything runs, then the stages about to run at their data's lengths.

The pipeline plans every enabled stage before it touches anything (a config that cannot fit is refused first, and
the fingerprints need the plans), at rows of seq_len. Once the train splits exist, each stage that runs is planned
again from a tokenized sample of its split (memory/lengths.py, stages/length_profile.py): the same examples per
step, so the same fingerprint, with memory and micro-batch chosen for the batches that really come.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from medgpt_ray.config import ConfigError, PipelineConfig, stage_kind
from medgpt_ray.data.prepare import PreparedData
from medgpt_ray.memory.budget import Budget, resolve_budget
from medgpt_ray.memory.format import plan_line
from medgpt_ray.memory.planner import model_shape, plan_all, plan_stage
from medgpt_ray.memory.shapes import ModelShape
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.run.ray_env import probe_cluster_gpu, probe_cluster_linear_kernels
from medgpt_ray.stages.length_profile import measure


def run_budget(cfg: PipelineConfig) -> Budget:
    """The per-GPU budget a run (or a sweep's trials) is planned for: the config's, else the tightest GPU of the
    cluster (read by a one-GPU task when the driver has none). For a hybrid model on GPUs, also what a GPU runs its
    linear attention on (one GPU task probing the kernels), which the plans name."""
    budget = resolve_budget(cfg, probe_cluster_gpu, None)
    if cfg.resources.use_gpu and model_shape(cfg).linear_layers:
        budget = replace(budget, linear_kernels=probe_cluster_linear_kernels())
    return budget


def plan_before_data(cfg: PipelineConfig) -> tuple[dict[str, StagePlan], Budget]:
    """Every enabled stage planned to fit the GPUs before any of them is touched (at rows of seq_len: the data is
    not prepared yet), and the budget they were planned for; a config that does not fit is refused, with the
    numbers."""
    budget = run_budget(cfg)
    plans, errors = plan_all(cfg, budget=budget)
    if errors:
        raise ConfigError("\n".join(errors.values()))
    return plans, budget


def plan_by_lengths(cfg: PipelineConfig, plans: dict[str, StagePlan], budget: Budget, base_model: Path,
                    stages: list[str], prepared: dict[str, PreparedData], echo: Callable[[str], None]
                    ) -> dict[str, StagePlan]:
    """`plans` with each of `stages` planned at the lengths of its train split (in `prepared`, by data kind); every
    one of them gets its length line (when measured) and its plan line."""
    shape = model_shape(cfg)
    return {**plans, **{s: plan_at_lengths(cfg, s, plans[s], budget, base_model,
                                           prepared[stage_kind(s).data_kind].train_file, echo, shape)
                        for s in stages}}


def plan_at_lengths(cfg: PipelineConfig, stage: str, plan: StagePlan, budget: Budget, base_model: Path,
                    train_file: str, echo: Callable[[str], None], shape: ModelShape | None = None) -> StagePlan:
    """`plan` (made at rows of seq_len) made again at the lengths of the stage's train split, when the kind has
    lengths to measure; its length line (when measured) and its plan line said. What the stage trains (the plan's
    identity) does not change."""
    stage_cfg = cfg.stages.get(stage)
    try:
        lengths = measure(stage, stage_cfg, cfg.template_for(stage), base_model, train_file)
    except ValueError as e:  # e.g. no conversation of the split fits seq_len: the stage could not train
        raise ConfigError(f"stages.{stage}: {e}") from None
    if lengths is not None:
        shape = shape or model_shape(cfg)
        new = plan_stage(stage, stage_cfg, cfg.workers_for(stage), cfg.resources.use_gpu, shape, budget, lengths)
        if new.identity() != plan.identity():
            raise AssertionError(f"{stage}: planning by lengths changed what the stage trains: "
                                 f"{plan.identity()} -> {new.identity()}")
        plan = new
        echo(f"[{stage:>3}] lengths: {lengths.describe()}")
    echo(f"[{stage:>3}] plan: {plan_line(plan)}")
    return plan
