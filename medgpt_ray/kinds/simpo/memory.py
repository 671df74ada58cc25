"""The simpo kind's memory terms (docs/ARCHITECTURE.md, "The stage-kind contract"): it follows orpo's memory model
(TRL's CPO trainer on the chunked LM head; kinds/orpo/memory.py), with an NLL term on the chosen half only when
`cpo_alpha` > 0."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.simpo.config import SimPOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory


def setup_fields(cfg: SimPOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return {"nll_term": cfg.cpo_alpha > 0}


MEMORY = KindMemory(setup_fields=setup_fields)
