"""Resolve a stage's `auto` knobs into a concrete StagePlan and its DeepSpeed config.

This is the rule-based first planner: explicit values win, `auto` takes a safe
default for the device. The analytic peak-memory estimator (issue 4) replaces
the defaults with a search; the StagePlan shape and the DeepSpeed dict it emits
stay the same, and both are saved as plan.json beside every stage's outputs.
"""

from __future__ import annotations

from typing import Any

from medgpt_ray.config import ConfigError, StageConfig
from medgpt_ray.memory.plan import StagePlan, deepspeed_config

__all__ = ["StagePlan", "deepspeed_config", "plan_stage"]

MAX_AUTO_MICRO_BATCH_CPU = 8
MAX_AUTO_MICRO_BATCH_GPU = 1  # the field reports' 7B-on-24GB setting; the estimator (issue 4) will search


def _pick(value: Any, default: Any, key: str, why: str, reasons: list[str]) -> Any:
    if value == "auto":
        reasons.append(f"{key}: auto -> {default} ({why})")
        return default
    reasons.append(f"{key}: {value} (explicit)")
    return value


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in range(1, min(n, cap) + 1) if n % d == 0)


def plan_stage(stage: str, cfg: StageConfig, num_workers: int, use_gpu: bool) -> StagePlan:
    reasons: list[str] = []
    method = _pick(cfg.method, "lora", "method", "LoRA unless full training is asked for", reasons)
    if method == "qlora" and not use_gpu:
        raise ConfigError(f"stages.{stage}.method: 'qlora' needs GPUs (bitsandbytes 4-bit); resources.use_gpu is false")
    default_precision = ("amp-bf16" if method == "full" else "bf16") if use_gpu else "fp32"
    precision = _pick(cfg.precision, default_precision, "precision", "bf16 on GPU, fp32 on CPU", reasons)
    if precision != "fp32" and not use_gpu:
        raise ConfigError(f"stages.{stage}.precision: '{precision}' needs GPUs; use 'fp32' (or auto) on CPU")

    per_worker, rem = divmod(cfg.effective_batch, num_workers)
    if rem or per_worker == 0:
        raise ConfigError(
            f"stages.{stage}.effective_batch: {cfg.effective_batch} is not a multiple of the {num_workers} "
            f"data-parallel workers"
        )
    cap = MAX_AUTO_MICRO_BATCH_GPU if use_gpu else MAX_AUTO_MICRO_BATCH_CPU
    micro = _pick(cfg.micro_batch, _largest_divisor_at_most(per_worker, cap), "micro_batch",
                  f"largest divisor of the per-worker batch {per_worker} up to {cap}", reasons)
    if per_worker % micro:
        raise ConfigError(
            f"stages.{stage}.micro_batch: {micro} does not divide the per-worker batch {per_worker} "
            f"(effective_batch {cfg.effective_batch} / {num_workers} workers)"
        )
    grad_ckpt = _pick(cfg.grad_ckpt, use_gpu, "grad_ckpt", "on for GPUs, off on CPU", reasons)
    fraction = float(grad_ckpt) if not isinstance(grad_ckpt, bool) else (1.0 if grad_ckpt else 0.0)
    fused = _pick(cfg.fused_ce, stage in ("sft", "dpo"), "fused_ce", "TRL's chunked LM head for sft/dpo", reasons)
    optim = _pick(cfg.optim, "adamw", "optim", "AdamW", reasons)
    default_zero = 2 if (use_gpu and num_workers > 1 and method == "full") else 0
    zero = _pick(cfg.zero_stage, default_zero, "zero_stage", "ZeRO-2 for multi-GPU full training, else none",
                 reasons)
    offload = _pick(cfg.offload, "none", "offload", "no offload by default", reasons)
    if offload != "none" and zero == 0:
        raise ConfigError(f"stages.{stage}.offload: '{offload}' needs zero_stage >= 1")
    if method == "qlora" and zero == 3:
        raise ConfigError(f"stages.{stage}.zero_stage: 3 cannot shard 4-bit QLoRA weights; use 0, 1 or 2")
    plan = StagePlan(stage, method, precision, micro, per_worker // micro, num_workers, use_gpu,
                     fraction, bool(fused), optim, int(zero), offload, None, reasons)
    plan.deepspeed = deepspeed_config(plan, cfg)
    return plan
