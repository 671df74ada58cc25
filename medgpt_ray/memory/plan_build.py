"""The StagePlan of the chosen candidate: every value computed first, then one StagePlan (its DeepSpeed dict is
derived from the plan's own knobs, as stage_plan.py's other constructors do)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from medgpt_ray.config import StageConfig
from medgpt_ray.memory.budget import Budget
from medgpt_ray.memory.candidates import Candidate, PlanError, alternatives
from medgpt_ray.memory.generation import decode_path, reward_model_placement, rollout_line
from medgpt_ray.memory.lengths import LengthProfile
from medgpt_ray.memory.options import COMPILE_MIN_STEPS, compiles
from medgpt_ray.memory.rollout_host import host_room_gib
from medgpt_ray.memory.setup import TrainSetup
from medgpt_ray.memory.shapes import ModelShape
from medgpt_ray.memory.stage_plan import Prediction, StagePlan, deepspeed_config


def _prediction(shape: ModelShape, chosen: Candidate, budget: Budget, candidates: int, fitting: int) -> Prediction:
    offload = bool(chosen.host_node_gib)
    return Prediction(
        model=shape.name, peak_gib=round(chosen.peak_gib, 3), moment=chosen.est.moment,
        budget_gib=None if budget.gpu_gib is None else round(budget.usable_gib, 3),
        gpu_memory_gib=budget.gpu_gib, margin_gib=budget.margin_gib, budget_source=budget.source,
        gpu=budget.gpu.name, tokens_per_s_per_gpu=round(chosen.tokens_per_s, 1),
        breakdown_gib=chosen.est.breakdown_gib(), candidates=candidates, fitting=fitting,
        host_offload_gib_per_node=round(chosen.host_node_gib, 2) if offload else None,
        host_usable_gib=round(budget.host_usable_gib, 2) if offload and budget.host_gib is not None else None)


def _packing(cfg: StageConfig, num_workers: int, rows_per_step: int,
             lengths: LengthProfile | None) -> dict[str, Any]:
    return {"rows_per_step": rows_per_step, "conversations_per_step": cfg.effective_batch // num_workers,
            "conversations_per_row": lengths.conversations_per_row if lengths else None}


def linear_attention_line(shape: ModelShape, budget: Budget, s: TrainSetup) -> str | None:
    """Which kernels a hybrid's linear-attention layers train on (the planner's decision, TrainSetup.linear_kernels)
    and why (the GPU probe's sentence, hybrid/kernels.py); packed conversations are kept apart on either path."""
    if not shape.linear_layers:
        return None
    if s.linear_kernels is None:
        return ("not probed before planning: each worker probes flash-linear-attention on its GPU and trains on its "
                "kernels where their backward passes, else on the PyTorch reference")
    path = "flash-linear-attention's kernels" if s.linear_kernels else "the PyTorch reference"
    return f"{path} ({budget.linear_kernels['why'] if budget.linear_kernels else 'a CPU run'})"


def build_plan(stage: str, cfg: StageConfig, shape: ModelShape, budget: Budget, chosen: Candidate,
               cands: list[Candidate], fitting: int, layout: dict[str, Any], reasons: list[str]) -> StagePlan:
    """The plan for `chosen` among `cands` (`fitting` of them fit). `layout`: num_workers, use_gpu, seq_len (the
    planned sequence length), lengths, packed and rows_per_step (the packed rows per worker step)."""
    s = chosen.setup
    num_workers, use_gpu, lengths = layout["num_workers"], layout["use_gpu"], layout["lengths"]
    compiled = compiles(cfg, use_gpu, s.method, s.zero, shape)
    try:
        reward_model_on = reward_model_placement(shape, s, use_gpu, budget.usable_gib)
    except ValueError as e:
        raise PlanError(f"stages.{stage}.{e}") from None
    reasons.append(f"compile: {compiled} (" + ("explicit" if cfg.compile != "auto" else
                   f"auto: GPU runs except QLoRA, ZeRO-3, linear attention and max_steps < {COMPILE_MIN_STEPS}") + ")")
    rejected = alternatives(chosen, cands, budget)
    reasons.append(f"chosen: {chosen.label()} (peak {chosen.peak_gib:.1f} GiB, "
                   f"{chosen.tokens_per_s:,.0f} tokens/s/GPU predicted)")
    plan = StagePlan(
        stage, s.method, s.precision, s.micro_batch, s.grad_accum, num_workers, use_gpu, s.ckpt_fraction,
        s.fused_ce, s.optim, s.zero, s.offload, None, reasons,
        prediction=_prediction(shape, chosen, budget, len(cands), fitting), alternatives=rejected,
        fused_kernels=s.fused_kernels, compile=compiled, seq_len_planned=layout["seq_len"],
        lengths=None if lengths is None else lengths.to_dict(),
        packing=_packing(cfg, num_workers, layout["rows_per_step"], lengths) if layout["packed"] else None,
        steps_per_generation=s.gen_steps or None, reward_model_on=reward_model_on,
        rollout=rollout_line(shape, s, host_room_gib(budget, s, chosen.est)),
        generation_path=decode.name if (decode := decode_path(shape, s)) else None, reward_clip=cfg.reward_clip,
        linear_attention=linear_attention_line(shape, budget, s),
        attention=None if s.attention == "sdpa" else s.attention)
    return replace(plan, deepspeed=deepspeed_config(plan, cfg))
