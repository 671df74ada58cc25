"""The grpo kind's memory model, rloo's too (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's GRPOTrainer,
the same chunked LM head as SFT; not calibrated yet apart from the generation phase: the SFT scale for its training
pass, and memory/generation.py adds the generation phase its keys below ask for (completions, the reward model, the
reference)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.grpo.config import GRPOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile
from medgpt_ray.memory.online_rl import online_rl_fields, online_rl_hints


def setup_fields(cfg: GRPOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return online_rl_fields(cfg, reference=cfg.beta > 0, use_gpu=use_gpu)


MEMORY = KindMemory(MemoryProfile("grpo", chunked_head=True), setup_fields=setup_fields, hints=online_rl_hints)
