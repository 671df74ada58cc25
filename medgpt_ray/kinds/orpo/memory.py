"""The orpo kind's memory model, simpo's too (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's ORPO and CPO
trainers, no reference, chosen and rejected in one concatenated forward of padded rows, on TRL's chunked LM head
(trainer_kit/fused_preference.py: no full logits, as DPO's).

Before the chunked head their loss held the full logits: measured on the H200 (Qwen2.5-1.5B LoRA, mb 4 x 2 x 1024
tokens; bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json) ORPO peaked at 17.73 GiB and SimPO at
15.40 GiB, ~8.8 and ~6.8 B a logit; that term is gone."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.orpo.config import ORPOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

# Loss path efficiency: what TRL's own loss code costs beyond the FLOP model, as measured/predicted tokens/s. On the
# full logits (the H200, Qwen2.5-1.5B LoRA on real-length preference pairs, bench/results/real_length_throughput_1.5b_
# h200_orpo_simpo_kto.json) ORPO and SimPO ran at 0.41 of it (7,923 and 7,971 against 19,318 tokens/s). On the
# chunked head (the H100, mb 16 x 2 x 1,024, bench/results/orpo_simpo_chunked_h100/): medians 19,975 and 21,386
# against 14,948 predicted at 0.41, i.e. ~0.55 (an eager, padded chosen+rejected batch and per-step metric syncs).
LOSS_PATH_EFFICIENCY = 0.55
# The layers' saved activations against sft's model at equal tokens. That H100 run (every micro-batch 32 rows of
# 1,024 tokens: 38 % of the pairs reach seq_len) peaked at 16.35 GiB where sft's scale predicted 20.83, ~0.77 of
# sft's per-token activations if the other terms hold; DPO and KTO, TRL's other padded pair trainers, keep 0.88.
# 0.80 keeps that run within 10 % of its plan and under it (tests/unit/test_measured_peaks.py).
ACTIVATION_SCALE = 0.80
# Compiled layers (orpo and simpo compile on `auto` since their pass is bucketed) keep more: the same simpo plan (mb 16,
# 86 % checkpointed, the same pairs) peaked at 17.99 GiB compiled against 16.35 eager, both on an H100
# (bench/results/simpo_compiled_h100/, orpo_simpo_16steps_h100/): ~1.15 of the eager activations, 0.92 of sft's
# compiled per-token ones (DPO and KTO: 0.88).
COMPILED_LAYER_SCALE = 1.15


def setup_fields(cfg: ORPOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return {"nll_term": True}  # ORPO's loss always has its NLL term on the chosen half


MEMORY = KindMemory(MemoryProfile("orpo", activation_scale=ACTIVATION_SCALE, sequences_per_example=2,
                                  chunked_head=True, loss_path_efficiency=LOSS_PATH_EFFICIENCY,
                                  compiled_layer_scale=COMPILED_LAYER_SCALE),
                    setup_fields=setup_fields)
