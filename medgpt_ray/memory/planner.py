"""Turn a stage's config into a StagePlan: the fastest configuration predicted to fit the GPU.

Every `auto` knob (method lora/qlora, micro-batch, checkpointing fraction, fused CE, ZeRO stage and offload) is
searched; explicit values are kept and checked. The effective batch stays what the config says: micro-batch x
accumulation x workers. Candidates are scored by the estimator (peak memory) and the throughput model (tokens/s);
the fastest one whose peak fits budget - margin wins, and the plan records it with the best rejected alternatives.

The parts, one job each: options.py (the values each knob may take, and what a kind's trainer refuses, from its
memory profile), candidates.py (the setups searched, scored), no_fit.py (why nothing fits, and the nearest changes
that would), plan_build.py (the StagePlan of the chosen one); this module puts them in order.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from medgpt_ray.config import ConfigError, PipelineConfig, StageConfig
from medgpt_ray.memory.budget import Budget, GpuProbe, make_budget, resolve_budget
from medgpt_ray.memory.candidates import PlanError, candidate, setups
from medgpt_ray.memory.estimator import SetupError
from medgpt_ray.memory.lengths import LengthProfile, packs, planned_seq_len
from medgpt_ray.memory.no_fit import explain_no_fit
from medgpt_ray.memory.options import options
from medgpt_ray.memory.plan_build import build_plan
from medgpt_ray.memory.shapes import ModelShape, ShapeError, load_shape
from medgpt_ray.memory.stage_plan import StagePlan

# What callers import from here (the planner's front door); the parts live in the modules above.
__all__ = ["PlanError", "model_shape", "plan_all", "plan_stage", "resolve_budget"]


def linear_kernels(shape: ModelShape, budget: Budget, use_gpu: bool) -> bool | None:
    """Whether a hybrid trains its linear attention on flash-linear-attention's kernels, as the GPU's probe found
    (hybrid/kernels.py); False on the CPU (the reference); None where nobody probed (and for a dense model)."""
    if not shape.linear_layers:
        return None
    if not use_gpu:
        return False
    found = budget.linear_kernels
    return None if found is None else found["training"] == "fla"


def plan_stage(stage: str, cfg: StageConfig, num_workers: int, use_gpu: bool, shape: ModelShape | None = None,
               budget: Budget | None = None, lengths: LengthProfile | None = None) -> StagePlan:
    """The fastest configuration predicted to fit; `lengths` (the train data's, stages/length_profile.py) plans
    at the data's real lengths, without it at rows of seq_len."""
    shape = shape or load_shape("tiny")
    budget = budget or make_budget(None, 0.0, "auto", use_gpu, "none")
    reasons: list[str] = [f"budget: {budget.describe()}"]
    opts = options(stage, cfg, shape, num_workers, use_gpu, reasons, lengths)
    seq_len = planned_seq_len(stage, cfg, lengths, reasons)
    packed = packs(stage, cfg, lengths)
    cands = []
    linear = linear_kernels(shape, budget, use_gpu)
    for setup in setups(stage, cfg, shape, opts, num_workers, use_gpu, seq_len, packed):
        setup = replace(setup, linear_kernels=linear)
        try:
            cands.append(candidate(shape, setup, budget))
        except SetupError:
            continue
    if not cands:
        raise PlanError(f"stages.{stage}: the explicit settings leave no valid configuration")
    fits = [c for c in cands if c.fits(budget)]
    explicit = [f"{k}={v}" for k, v in (("method", cfg.method), ("micro_batch", cfg.micro_batch),
                                        ("grad_ckpt", cfg.grad_ckpt), ("zero_stage", cfg.zero_stage),
                                        ("offload", cfg.offload), ("seq_len", cfg.seq_len)) if v != "auto"]
    if not fits:
        err = PlanError(explain_no_fit(stage, cfg, shape, cands, budget, explicit))
        err.smallest_peak_gib = min(c.peak_gib for c in cands)
        raise err
    # Fastest first; among equals, the one with more headroom.
    chosen = max(fits, key=lambda c: (round(c.tokens_per_s, 6), -c.peak_gib))
    layout = {"num_workers": num_workers, "use_gpu": use_gpu, "seq_len": seq_len, "lengths": lengths,
              "packed": packed, "rows_per_step": opts["per_worker"][0]}
    return build_plan(stage, cfg, shape, budget, chosen, cands, len(fits), layout, reasons)


# ---- every stage of a pipeline config ---------------------------------------------------------------------


def model_shape(cfg: PipelineConfig) -> ModelShape:
    path = cfg.model.path
    if path == "tiny" or (Path(path).expanduser() / "config.json").is_file():
        try:
            return load_shape(path)
        except ShapeError as e:  # a family the shape cannot count: refused with the field named, never guessed
            raise ConfigError(f"model.path: {e}") from None
    if cfg.model.shape:
        try:
            return load_shape(cfg.model.shape)
        except ShapeError as e:
            raise ConfigError(f"model.shape: {e}") from None
    raise ConfigError(f"model.path '{path}' has no config.json here to plan memory from; set model.shape to a "
                      f"preset (e.g. qwen2.5-7b) to plan on a machine without the model")


def plan_all(cfg: PipelineConfig, probe: GpuProbe | None = None, default_gpu_gib: float | None = None,
             budget: Budget | None = None) -> tuple[dict[str, StagePlan], dict[str, str]]:
    """Plans for the enabled stages, and for each stage that cannot be planned, the message why."""
    shape = model_shape(cfg)
    budget = budget or resolve_budget(cfg, probe, default_gpu_gib)
    plans: dict[str, StagePlan] = {}
    errors: dict[str, str] = {}
    for stage in cfg.enabled_stages():
        try:
            plans[stage] = plan_stage(stage, cfg.stages.get(stage), cfg.workers_for(stage), cfg.resources.use_gpu,
                                      shape, budget)
        except PlanError as e:
            errors[stage] = str(e)
    return plans, errors
