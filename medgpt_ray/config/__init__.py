"""The one configuration model of the pipeline: YAML in, typed objects out.

Unknown keys are errors (a typo must not silently fall back to a default), and
every error names the file (or `--set`) and the dotted key.

The parts: base.py (strictness, errors), clean.py (the cleaner's options), stage.py (the keys every stage has),
what several kinds share (preference.py, online_rl.py), registry.py (the kinds),
stages.py (the `stages:` section), sections.py (model, data, resources), pipeline.py (the whole config and its
stage graph), loading.py (YAML, --overrides and --set in, one validation). Each kind's own config class and
registration is kinds/<kind>/config.py. This module names what callers import.

A stage kind is registered when its config module is imported, and the registry's order is the pipeline's (the
kinds' config modules in the block below, eval last): a new kind is one import line here.
"""

from __future__ import annotations

from medgpt_ray.config.base import ConfigError, LoraConfig
from medgpt_ray.config.clean import (
    CleanConfig,
    DedupConfig,
    NormalizeConfig,
    PIIConfig,
    QualityConfig,
    SignoffConfig,
)
from medgpt_ray.config.loading import apply_override, load_clean_config, load_config, parse_set, resolved_dict
from medgpt_ray.config.online_rl import OnlineRLStageConfig
from medgpt_ray.config.pipeline import PipelineConfig
from medgpt_ray.config.registry import (
    STAGE_KINDS,
    PairAccuracy,
    StageKind,
    register_stage_kind,
    reward_model_kind,
    run_evaluator,
    stage_kind,
)
from medgpt_ray.config.sections import DataConfig, ModelConfig, ResourcesConfig
from medgpt_ray.config.stage import (
    MEMORY_KNOBS,
    PLAN_RESOLVED_KNOBS,
    LengthGroupedStageConfig,
    OverlongStageConfig,
    StageConfig,
    overlong_policy,
)
from medgpt_ray.config.stages import StagesConfig

# The kinds register as their config modules are imported, and the registry's order is the pipeline's: this block
# is in pipeline order, kept out of import sorting (a new kind is one line here, docs/ARCHITECTURE.md).
# isort: off
from medgpt_ray.kinds.pt import config as _pt  # noqa: F401  (pt has the base StageConfig: it only registers)
from medgpt_ray.kinds.sft.config import SFTStageConfig
from medgpt_ray.kinds.rm.config import RMStageConfig
from medgpt_ray.kinds.dpo.config import DPOStageConfig
from medgpt_ray.kinds.orpo.config import ORPOStageConfig
from medgpt_ray.kinds.simpo.config import SimPOStageConfig
from medgpt_ray.kinds.kto.config import KTOStageConfig
from medgpt_ray.kinds.grpo.config import GRPOStageConfig
from medgpt_ray.kinds.rloo.config import RLOOStageConfig
from medgpt_ray.kinds.opd.config import OPDStageConfig
from medgpt_ray.kinds.eval.config import EvalStageConfig
# isort: on

__all__ = ["MEMORY_KNOBS", "PLAN_RESOLVED_KNOBS", "STAGE_KINDS", "CleanConfig", "ConfigError", "DPOStageConfig",
           "DataConfig", "DedupConfig", "EvalStageConfig", "GRPOStageConfig", "KTOStageConfig",
           "LengthGroupedStageConfig", "LoraConfig", "ModelConfig", "NormalizeConfig", "OPDStageConfig",
           "ORPOStageConfig", "OverlongStageConfig", "overlong_policy",
           "OnlineRLStageConfig", "PIIConfig", "PairAccuracy", "PipelineConfig", "QualityConfig", "RLOOStageConfig",
           "RMStageConfig", "ResourcesConfig", "SFTStageConfig",
           "SignoffConfig", "SimPOStageConfig", "StageConfig", "StageKind", "StagesConfig", "apply_override",
           "load_clean_config", "load_config", "parse_set", "register_stage_kind", "resolved_dict", "reward_model_kind",
           "run_evaluator", "stage_kind"]
