"""The sft kind's memory model (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's SFTTrainer with its chunked
LM head (no full logits), on conversations that may be packed into rows of seq_len (its `packing` key)."""

from __future__ import annotations

from medgpt_ray.config import StageConfig
from medgpt_ray.config.base import Auto
from medgpt_ray.kinds.sft.config import SFTStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile


def packing(cfg: StageConfig) -> Auto | bool:
    """sft's `packing` key; a config of the base class (a stage built by hand, without the key) stays unpacked."""
    return cfg.packing if isinstance(cfg, SFTStageConfig) else False


MEMORY = KindMemory(MemoryProfile("sft", chunked_head=True, packs=True, packed_unit="conversations"),
                    packing=packing)
