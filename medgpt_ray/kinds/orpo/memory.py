"""The orpo kind's memory model, simpo's too (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's ORPO and CPO
trainers, no reference, chosen and rejected in one concatenated forward, on TRL's chunked LM head
(trainer_kit/fused_preference.py: no full logits, as DPO's), with the SFT scale for the layers.

Before the chunked head their loss held the full logits: measured on the H200 (Qwen2.5-1.5B LoRA, mb 4 x 2 x 1024
tokens; bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json) ORPO peaked at 17.73 GiB and SimPO at
15.40 GiB, ~8.8 and ~6.8 B a logit; that term is gone. Not yet measured on a GPU with the chunked head."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.orpo.config import ORPOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

# Loss path efficiency: what TRL's own loss code costs beyond the FLOP model, as measured/predicted tokens/s on the
# H200 (Qwen2.5-1.5B LoRA on real-length preference pairs, bench/results/real_length_throughput_1.5b_h200_orpo_simpo_
# kto.json): ORPO and SimPO's eager concatenated forward (no compiled layers, a padded chosen+rejected batch,
# full-vocabulary log-softmax and per-step metric syncs) ran at 0.41 of the FLOP model (7,923 and 7,971 against
# 19,318 tokens/s). Kept until the chunked head's run measures its own: the log-softmax was one part of it.
LOSS_PATH_EFFICIENCY = 0.41


def setup_fields(cfg: ORPOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return {"nll_term": True}  # ORPO's loss always has its NLL term on the chosen half


MEMORY = KindMemory(MemoryProfile("orpo", sequences_per_example=2, chunked_head=True,
                                  loss_path_efficiency=LOSS_PATH_EFFICIENCY), setup_fields=setup_fields)
