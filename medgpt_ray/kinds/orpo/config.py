"""The orpo kind's config: TRL's ORPOTrainer (trl.experimental) on preference pairs (data.preference), reference-free.
Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered here, imported by config/__init__
in pipeline order."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from medgpt_ray.config.preference import NORMALISED_LOGP, REFERENCE_FREE_DEFAULTS, ReferenceFreeStageConfig
from medgpt_ray.config.registry import StageKind, register_stage_kind


class ORPOStageConfig(ReferenceFreeStageConfig):
    beta: Annotated[float, Field(gt=0)] = 0.1
    """ORPO's lambda: the weight of the odds-ratio term beside the NLL of the chosen answer (no reference model)."""


# Off unless enabled (REFERENCE_FREE_DEFAULTS); simpo plans as orpo does.
register_stage_kind(StageKind("orpo", ORPOStageConfig, "preference", "sft", REFERENCE_FREE_DEFAULTS,
                              memory_model="orpo", pair_accuracy=NORMALISED_LOGP, measures="pairs"))
