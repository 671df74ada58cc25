"""The one configuration model of the pipeline: YAML in, typed objects out.

Unknown keys are errors (a typo must not silently fall back to a default), and
every error names the file (or `--set`) and the dotted key.

The parts: base.py (strictness, errors), clean.py (the cleaner's options), stage.py (the keys every stage has),
a config module per family of stage kinds (stages.py, preference.py, online_rl.py, eval.py), registry.py (the
kinds), sections.py (model, data, resources), pipeline.py (the whole config and its stage graph), loading.py
(YAML, --overrides and --set in, one validation). This module names what callers import.

A stage kind is registered when its config module is imported, and the registry's order is the pipeline's
(config/stages.py's kinds, then config/online_rl.py's, then eval, below): a new kind is one import line here.
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
from medgpt_ray.config.eval import EvalStageConfig
from medgpt_ray.config.loading import apply_override, load_clean_config, load_config, parse_set, resolved_dict
from medgpt_ray.config.online_rl import GRPOStageConfig, OnlineRLStageConfig, RLOOStageConfig
from medgpt_ray.config.pipeline import PipelineConfig
from medgpt_ray.config.preference import (
    DPOStageConfig,
    KTOStageConfig,
    ORPOStageConfig,
    RMStageConfig,
    SimPOStageConfig,
)
from medgpt_ray.config.registry import STAGE_KINDS, PairAccuracy, StageKind, register_stage_kind, stage_kind
from medgpt_ray.config.sections import DataConfig, ModelConfig, ResourcesConfig
from medgpt_ray.config.stage import MEMORY_KNOBS, PLAN_RESOLVED_KNOBS, LengthGroupedStageConfig, StageConfig
from medgpt_ray.config.stages import SFTStageConfig, StagesConfig
from medgpt_ray.kinds.opd import config as _opd  # noqa: F401  (registers the opd kind: kinds/opd/config.py)

__all__ = ["MEMORY_KNOBS", "PLAN_RESOLVED_KNOBS", "STAGE_KINDS", "CleanConfig", "ConfigError", "DPOStageConfig",
           "DataConfig", "DedupConfig", "EvalStageConfig", "GRPOStageConfig", "KTOStageConfig",
           "LengthGroupedStageConfig", "LoraConfig", "ModelConfig", "NormalizeConfig", "ORPOStageConfig",
           "OnlineRLStageConfig", "PIIConfig", "PairAccuracy", "PipelineConfig", "QualityConfig", "RLOOStageConfig",
           "RMStageConfig", "ResourcesConfig", "SFTStageConfig",
           "SignoffConfig", "SimPOStageConfig", "StageConfig", "StageKind", "StagesConfig", "apply_override",
           "load_clean_config", "load_config", "parse_set", "register_stage_kind", "resolved_dict", "stage_kind"]

# eval, off unless enabled (the shipped tiny configs enable it): compares the run's models on the held-out split
# (config/eval.py); registered here, after the training kinds (config/stages.py, then config/online_rl.py). Its
# module is in run/: it generates with infer/, which stages/ may not import.
register_stage_kind(StageKind("eval", EvalStageConfig, "sft", "sft", {"enabled": False},
                              module="medgpt_ray.run.eval_stage", memory_model="sft", trains=False,
                              reads=("prompt", "exam", "pretrain")))
