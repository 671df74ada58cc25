"""The orpo kind's memory model, simpo's too (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's ORPO and CPO
trainers, no reference, chosen and rejected in one eager concatenated forward over the full logits (no fused
cross-entropy), with the SFT scale for the layers; their loss keeps less per logit than HF's causal-LM loss."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.orpo.config import ORPOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

# TRL's ORPO and CPO (SimPO) trainers: the concatenated chosen+rejected forward's bf16 logits and their fp32
# log-softmax, plus, with an NLL term on the chosen half (ORPO always, SimPO when cpo_alpha > 0), HF's cross-entropy
# over that half. Measured on the H200 (Qwen2.5-1.5B LoRA, mb 4 x 2 x 1024 tokens, the rest of the estimate as for
# SFT; bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json): ORPO 17.73 GiB, SimPO 15.40 GiB, i.e.
# ~8.8 and ~6.8 B/logit; these are set a little above, on the safe side.
ORPO_LOSS_BYTES_PER_LOGIT = {True: 9.2, False: 7.2}  # keyed by: the loss has an NLL term
# Loss path efficiency: what TRL's own loss code costs beyond the FLOP model, as measured/predicted tokens/s on the
# H200 (Qwen2.5-1.5B LoRA on real-length preference pairs, bench/results/real_length_throughput_1.5b_h200_orpo_simpo_
# kto.json): ORPO and SimPO's eager concatenated forward (no compiled layers, a padded chosen+rejected batch,
# full-vocabulary log-softmax and per-step metric syncs) ran at 0.41 of the FLOP model (7,923 and 7,971 against
# 19,318 tokens/s).
LOSS_PATH_EFFICIENCY = 0.41


def setup_fields(cfg: ORPOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return {"nll_term": True}  # ORPO's loss always has its NLL term on the chosen half


MEMORY = KindMemory(MemoryProfile(
    "orpo", sequences_per_example=2, logit_loss_bytes=ORPO_LOSS_BYTES_PER_LOGIT[True],
    logit_loss_bytes_no_nll=ORPO_LOSS_BYTES_PER_LOGIT[False], loss_path_efficiency=LOSS_PATH_EFFICIENCY,
    fused_ce_allowed=(False,),
    fused_ce_refusal="TRL's ORPO and CPO trainers compute the full logits; no fused cross-entropy is available for "
    "{stage}",
    fused_ce_setup_error="TRL's ORPO and CPO trainers compute full logits (no fused cross-entropy)"),
    setup_fields=setup_fields)
