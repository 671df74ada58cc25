"""The dpo kind's memory model (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's DPOTrainer, chosen and
rejected in one forward with its chunked LM head, against a reference (the adapter-off policy for LoRA, a frozen copy
for full training, none held when its log-probabilities are precomputed: `precompute_ref_log_probs`)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.dpo.config import DPOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

# TRL's DPO trainer keeps less per decoder layer than the same model under SFT at equal token counts (measured on
# 0.5B, 1.5B and 7B): ~12 %, applied to its per-token activations.
ACTIVATION_SCALE = 0.88


def setup_fields(cfg: DPOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return {"dpo_reference": "precomputed" if cfg.precompute_ref_log_probs else "auto"}


MEMORY = KindMemory(MemoryProfile("dpo", activation_scale=ACTIVATION_SCALE, sequences_per_example=2, reference=True,
                                  chunked_head=True), setup_fields=setup_fields)
