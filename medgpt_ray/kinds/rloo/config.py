"""The rloo kind's config: TRL's RLOOTrainer on prompt records (data.prompt), from sft's model, rewarded by the rm
stage's model, with the keys the online-RL kinds share (config/online_rl.py). Sits with config/ (docs/ARCHITECTURE.md,
"The stage-kind contract"); registered here, imported by config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field, model_validator

from medgpt_ray.config.online_rl import OnlineRLStageConfig
from medgpt_ray.config.registry import StageKind, register_stage_kind


class RLOOStageConfig(OnlineRLStageConfig):
    """RLOO (MedicalGPT's "PPO" stage) on prompt records (data.prompt): TRL's RLOOTrainer, rewarded by the rm stage's
    model (always: rloo needs rm), each completion's advantage its reward less the mean of the other k - 1 of its
    group (REINFORCE leave-one-out), the KL to the reference subtracted from the reward."""

    CLIP_APPLIES_TO: ClassVar[str] = "the weighted sum of the rewards, before the KL penalty (TRL's reward_clip_range)"
    reward_funcs: Annotated[list[str], Field(min_length=1)] = ["reward_model"]
    """Reward functions by name (stages/rewards.py); must hold reward_model (the rm stage's score), the RL reward of
    this kind. Rule rewards may join it: accuracy, format, length, or a custom "package.module:function"."""
    beta: Annotated[float, Field(ge=0)] = 0.05
    """KL coefficient: beta x the completion's summed log-ratio to the reference is subtracted from its reward (the
    reference is the adapter-off policy for LoRA, a frozen copy for full); 0: no reference pass. TRL's default 0.05."""
    normalize_advantages: bool = False
    """Normalise the advantages over each generation batch to mean 0 and std 1 (TRL's normalize_advantages)."""

    @model_validator(mode="after")
    def _rewarded_by_the_rm(self) -> RLOOStageConfig:
        if "reward_model" not in self.reward_funcs:
            raise ValueError(f"reward_funcs: {self.reward_funcs} has no reward_model: rloo is rewarded by the rm "
                             f"stage's model (add reward_model; rule rewards may join it), or use grpo for rule "
                             f"rewards alone")
        return self


# Off unless enabled: RLOO on TRL's RLOOTrainer; plans as grpo does (generation phase + training phase,
# memory/generation.py) with the reward model always resident.
register_stage_kind(StageKind("rloo", RLOOStageConfig, "prompt", "sft", {"enabled": False, "lr": 1e-5},
                              memory_model="grpo", measures="prompts", generates_outside_autocast=True))
