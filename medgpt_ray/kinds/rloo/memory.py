"""The rloo kind's memory terms (docs/ARCHITECTURE.md, "The stage-kind contract"): it follows grpo's memory model
(memory/online_rl.py, as grpo's: a generation phase, a reward model, a reference when `beta` > 0)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.rloo.config import RLOOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory
from medgpt_ray.memory.online_rl import online_rl_fields, online_rl_hints


def setup_fields(cfg: RLOOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return online_rl_fields(cfg, reference=cfg.beta > 0, use_gpu=use_gpu)


MEMORY = KindMemory(setup_fields=setup_fields, hints=online_rl_hints)
