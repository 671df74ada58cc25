"""TrainingArguments from the plan: the keyword arguments every stage's HF/TRL config starts from."""

from __future__ import annotations

from typing import Any

from medgpt_ray.config import LengthGroupedStageConfig
from medgpt_ray.memory.lengths import BUCKET
from medgpt_ray.memory.profiles import stage_profile
from medgpt_ray.memory.shapes import load_shape
from medgpt_ray.memory.stage_plan import StagePlan
from medgpt_ray.stages.inputs import StageInputs
from medgpt_ray.trainer_kit.checkpointing import checkpointing_kwargs


def training_kwargs(inp: StageInputs) -> dict[str, Any]:
    """TrainingArguments shared by every stage, straight from the plan (no "auto" anywhere)."""
    cfg, plan = inp.cfg, inp.plan
    kwargs: dict[str, Any] = {
        "output_dir": str(inp.checkpoint_dir),
        "per_device_train_batch_size": plan.micro_batch,
        "per_device_eval_batch_size": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "learning_rate": cfg.lr,
        "num_train_epochs": cfg.epochs,
        "max_steps": cfg.max_steps,
        "warmup_steps": cfg.warmup_ratio,  # a float < 1 is a ratio of the total steps
        "weight_decay": cfg.weight_decay,
        "max_grad_norm": cfg.max_grad_norm,
        "lr_scheduler_type": "cosine",
        "logging_steps": cfg.logging_steps,
        "logging_first_step": True,
        "save_strategy": "steps",
        "save_steps": cfg.save_steps,
        "save_total_limit": 2,
        "eval_strategy": "steps" if cfg.eval_steps else "no",
        "eval_steps": cfg.eval_steps,
        "bf16": plan.precision in ("bf16", "amp-bf16"),
        "fp16": False,
        "use_cpu": not plan.use_gpu,
        "deepspeed": plan.deepspeed,
        "seed": inp.seed,
        "data_seed": inp.seed,
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": plan.use_gpu,
        "ddp_find_unused_parameters": False,
        "include_num_input_tokens_seen": "non_padding",
        "remove_unused_columns": False,
    }
    # Always explicit: TRL's configs default to checkpointing on, the plan may say off.
    kwargs.update(checkpointing_kwargs(plan.ckpt_fraction > 0))
    kwargs["optim"] = optimizer_name(plan)
    # Only where the kind's fused CE is Liger's (pt); sft/dpo: TRL's own chunked head, which Liger must not replace.
    flce = plan.fused_ce and stage_profile(inp.stage).liger_fused_ce
    # Fused layer ops come from compiling the decoder layers (speed.py) or, without compile, Liger's kernels.
    liger_layers = plan.fused_kernels and not plan.compile
    if flce or liger_layers:
        # Exactly the kernels the plan chose: the estimator models each one's activations.
        kwargs["use_liger_kernel"] = True
        # Liger raises on a family whose RoPE it lacks (Qwen3.5): that family keeps transformers' RoPE.
        rope = liger_layers and load_shape(inp.model_path).liger_rope
        kwargs["liger_kernel_config"] = {"fused_linear_cross_entropy": flce, "cross_entropy": False,
                                         "rope": rope, "rms_norm": liger_layers, "swiglu": liger_layers}
    return kwargs




def bucket_kwargs(inp: StageInputs) -> dict[str, Any]:
    """TRL's `pad_to_multiple_of` for a stage whose micro-batches are padded to their longest row (rm, dpo, unpacked
    sft): bucket lengths when the layers are compiled, else None. Uncompiled, a new length costs only its first call
    (~0.3 s in the same probe), once per length in the whole run, and padding costs every step. Padding is masked,
    so it changes no update beyond rounding: not part of the fingerprint."""
    return {"pad_to_multiple_of": min(BUCKET, inp.cfg.seq_len) if inp.plan.compile else None}


def group_by_length(inp: StageInputs) -> bool:
    """A length-grouped kind's `group_by_length`; a config of the base class (a stage built by hand) has no such key
    and does not group."""
    return isinstance(inp.cfg, LengthGroupedStageConfig) and inp.cfg.group_by_length


def optimizer_name(plan: StagePlan) -> str:
    if plan.optim == "adamw-8bit":
        return "adamw_bnb_8bit"
    return "adamw_torch_fused" if plan.use_gpu else "adamw_torch"
