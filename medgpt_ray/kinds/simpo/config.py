"""The simpo kind's config: SimPO (and CPO-SimPO) on TRL's CPOTrainer (trl.experimental) on preference pairs
(data.preference), reference-free. Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered
here, imported by config/__init__ in pipeline order."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from medgpt_ray.config.preference import NORMALISED_LOGP, REFERENCE_FREE_DEFAULTS, ReferenceFreeStageConfig
from medgpt_ray.config.registry import StageKind, register_stage_kind


class SimPOStageConfig(ReferenceFreeStageConfig):
    beta: Annotated[float, Field(gt=0)] = 2.0
    """SimPO's beta: the scale of the length-normalised log-probability reward (the paper uses 2.0-2.5)."""
    gamma: Annotated[float, Field(ge=0)] = 0.5
    """SimPO's target reward margin, as gamma/beta between chosen and rejected (TRL's simpo_gamma)."""
    cpo_alpha: Annotated[float, Field(ge=0)] = 0.0
    """Weight of the NLL of the chosen answer: 0 is SimPO, > 0 is CPO-SimPO."""


# Off unless enabled (REFERENCE_FREE_DEFAULTS); plans as orpo does (the same reference-free forward of both halves).
register_stage_kind(StageKind("simpo", SimPOStageConfig, "preference", "sft", REFERENCE_FREE_DEFAULTS,
                              memory_model="orpo", pair_accuracy=NORMALISED_LOGP, measures="pairs"))
