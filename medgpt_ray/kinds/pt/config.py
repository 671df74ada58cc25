"""The pt kind's config: continued pretraining on raw text (data.pretrain) with only the keys every stage has
(config/stage.py's StageConfig). Sits with config/ (docs/ARCHITECTURE.md, "The stage-kind contract"); registered
here, imported by config/__init__ in pipeline order."""

from __future__ import annotations

from medgpt_ray.config.registry import StageKind, register_stage_kind
from medgpt_ray.config.stage import StageConfig

# The base model's continued pretraining: full training by default, at pretraining's learning rate.
register_stage_kind(StageKind("pt", StageConfig, "pretrain", None, {"method": "full", "lr": 5e-5},
                              measures="blocks"))
