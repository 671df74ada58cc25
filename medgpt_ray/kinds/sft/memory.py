"""The sft kind's memory model (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's SFTTrainer with its chunked
LM head (no full logits), on conversations that may be packed into rows of seq_len (its `packing` key)."""

from __future__ import annotations

from typing import Any

from medgpt_ray.config import ConfigError, StageConfig
from medgpt_ray.config.base import Auto
from medgpt_ray.kinds.sft.config import SFTStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile


def packing(cfg: StageConfig) -> Auto | bool:
    """sft's `packing` key; a config of the base class (a stage built by hand, without the key) stays unpacked."""
    return cfg.packing if isinstance(cfg, SFTStageConfig) else False


def attention(cfg: StageConfig, use_gpu: bool) -> str:
    """The attention the stage trains with (its `attention` key; sdpa for a config without it): flex needs a GPU,
    where PyTorch's flex attention has its backward."""
    asked = cfg.attention if isinstance(cfg, SFTStageConfig) else "auto"
    if asked == "flex" and not use_gpu:
        raise ConfigError("stages.sft.attention: flex trains on a GPU only (PyTorch's flex attention has no CPU "
                          "backward); this stage runs on CPU: leave it auto or set sdpa")
    return "flex" if asked == "flex" else "sdpa"


def setup_fields(cfg: StageConfig, use_gpu: bool) -> dict[str, Any]:
    chosen = attention(cfg, use_gpu)
    return {} if chosen == "sdpa" else {"attention": chosen}  # sdpa: TrainSetup's default


MEMORY = KindMemory(MemoryProfile("sft", chunked_head=True, packs=True, packed_unit="conversations"),
                    setup_fields=setup_fields, packing=packing)
