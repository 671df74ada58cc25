"""The grpo kind's config: TRL's GRPOTrainer on prompt records (data.prompt), from sft's model, with the keys the
online-RL kinds share (config/online_rl.py). Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract");
registered here, imported by config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from medgpt_ray.config.online_rl import OnlineRLStageConfig
from medgpt_ray.config.registry import StageKind, register_stage_kind

GRPOLoss = Literal["grpo", "dr_grpo", "dapo", "bnpo"]


class GRPOStageConfig(OnlineRLStageConfig):
    """GRPO on prompt records (data.prompt): TRL's GRPOTrainer, trained on the group-relative advantages (each
    completion's reward against its group's mean, scaled by `scale_rewards`)."""

    beta: Annotated[float, Field(ge=0)] = 0.0
    """KL coefficient against the reference (the adapter-off policy for LoRA, a frozen copy for full); 0: no
    reference pass (TRL's default)."""
    loss_type: GRPOLoss = "dapo"
    """TRL's loss aggregation: grpo (per-sequence mean), dr_grpo, dapo (TRL's default), bnpo."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage scaling: by the group's reward std (GRPO), the batch's, or none (Dr. GRPO)."""


# Off unless enabled: GRPO on TRL's GRPOTrainer; plans with a generation phase and a training phase
# (memory/generation.py).
register_stage_kind(StageKind("grpo", GRPOStageConfig, "prompt", "sft", {"enabled": False, "lr": 1e-5},
                              measures="prompts", generates_outside_autocast=True))
