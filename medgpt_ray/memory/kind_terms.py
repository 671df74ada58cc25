"""The hook through which a stage kind puts networks of its own in the memory plan (docs/ARCHITECTURE.md, "The
stage-kind contract"): opd's frozen teacher beside the trained student, for one.

A kind's registry entry may name a function (StageKind.memory_terms, "module:function"), called once per planned
stage as function(stage config, use_gpu). It returns the TrainSetup fields the kind decides (e.g. a generation phase:
generations, completion_len, gen_steps) and among them `kind_terms`: a function (shape, setup) -> KindTerms that the
estimator adds to its own terms, the resident ones in every phase, the training ones at the start of backward.
It may raise ConfigError for a setting the planned resources cannot run."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.config import StageConfig, stage_kind


@dataclass(frozen=True)
class KindTerms:
    resident: dict[str, float] = field(default_factory=dict)  # bytes held in every phase (a frozen network)
    training: dict[str, float] = field(default_factory=dict)  # bytes added at backward start (its forward, its loss)


def setup_fields(stage: str, cfg: StageConfig, use_gpu: bool) -> dict[str, Any]:
    """The TrainSetup fields stage kind `stage` decides itself; none for a kind without memory terms."""
    ref = stage_kind(stage).memory_terms
    if not ref:
        return {}
    module, function = ref.split(":")
    return getattr(importlib.import_module(module), function)(cfg, use_gpu)
