"""Where memory/ finds what it knows per kind: each stage kind's memory module, `kinds/<kind>/memory.py` (its
`MEMORY`, a KindMemory: memory/kind_memory.py), loaded by the kind's registered name.

A stage kind registers the memory kind it follows (config's `stage_kind(name).memory_kind`: itself, or another's
trainer model); that memory kind's module holds the MemoryProfile that estimator, planner, throughput, lengths and
generation consult instead of comparing kind names. The stage kind's own module (where it has one) reads the stage's
own config keys (docs/ARCHITECTURE.md, the stage-kind contract). No kind is named here: the names come from the
registry, and tests/unit/test_import_rules.py models this module's imports of every kinds/*/memory.py.
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import Any

from medgpt_ray.config import STAGE_KINDS, StageConfig, stage_kind
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

__all__ = ["KindMemory", "MemoryProfile", "kind_memory", "memory_kinds", "memory_profile", "setup_fields",
           "stage_packing", "stage_profile"]

KIND_PACKAGE = "medgpt_ray.kinds"
NO_MODULE = KindMemory()  # a kind without a memory module: none of its keys change its memory


@cache
def kind_memory(kind: str) -> KindMemory:
    """The MEMORY of `kinds/<kind>/memory.py`; NO_MODULE where the kind has none (one that follows another kind's
    memory model and reads none of its own keys: eval, or a kind registered outside the package)."""
    name = f"{KIND_PACKAGE}.{kind}.memory"
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as e:
        if e.name not in (name, name.rpartition(".")[0]):  # the module is there; something it imports is not
            raise
        return NO_MODULE
    return module.MEMORY


def memory_kinds() -> list[str]:
    """The memory kinds the registered stage kinds follow (those with a profile), in pipeline order."""
    kinds = dict.fromkeys(k.memory_kind for k in STAGE_KINDS.values())
    return [k for k in kinds if kind_memory(k).profile is not None]


def memory_profile(kind: str) -> MemoryProfile:
    """The profile of a memory kind (a TrainSetup's `stage`)."""
    profile = kind_memory(kind).profile
    if profile is None:
        raise KeyError(f"memory kind {kind!r}: kinds/{kind}/memory.py declares no MemoryProfile")
    return profile


def stage_profile(stage: str) -> MemoryProfile:
    """The profile of the memory kind a stage (by its name in the config) registered."""
    return memory_profile(stage_kind(stage).memory_kind)


def setup_fields(stage: str, cfg: StageConfig, use_gpu: bool) -> dict[str, Any]:
    """The TrainSetup fields the stage's own keys decide (KindMemory.setup_fields), laid over the planner's knobs."""
    return kind_memory(stage).setup_fields(cfg, use_gpu)


def stage_packing(stage: str, cfg: StageConfig) -> Any:
    """The stage's `packing` key as its config holds it (auto, true, false); False for a kind without the key."""
    return kind_memory(stage).packing(cfg)
