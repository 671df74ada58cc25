"""The rm kind's memory model (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's RewardTrainer, a sequence
classifier (a 1-wide score head: no vocabulary logits, no loss over them) scoring chosen and rejected in one
forward; its pairs may be packed into rows of 2 x seq_len (its `packing` key), not on `auto`."""

from __future__ import annotations

from medgpt_ray.config import StageConfig
from medgpt_ray.config.base import Auto
from medgpt_ray.kinds.rm.config import RMStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

# TRL's reward trainer keeps less per decoder layer than the same model under SFT at equal token counts (measured
# on 0.5B, 1.5B and 7B): ~10 %, applied to its per-token activations.
ACTIVATION_SCALE = 0.9
# Compiled decoder layers (stages/speed.py) under the reward model keep less per layer than eager ones: inductor's
# partitioner recomputes cheap ops instead of saving them. Measured on the H200 (RM, LoRA r8, bf16, seq 1024):
# 0.5B mb 8 no checkpointing 16.69 GiB vs 24.01 eager (bench/results/memory_calibration_compiled_h200.json), 1.5B
# mb 16 with 24 of 28 layers checkpointed 17.99 GiB (real_length_throughput_1.5b_h200_length_planned_rm_dpo.json);
# the layers' saved activations fit at 0.64 and 0.77 of the eager ones: the larger, plus a little, is used. The
# causal-LM stages' compiled layers are estimated by the fused-layer terms (`fused_kernels`), which they match.
COMPILED_RM_LAYER_SCALE = 0.8
# rm's `packing: auto`: off (packs_on_auto; AUTO_UNPACKED says so to the user). On CPU a small
# model's attention over packed rows of 2 x seq_len costs more than the padding it saves (the tiny preset, the
# demo's rm, 30 steps on one thread: 5.5 s of CPU packed, 2.2 unpacked). On the H200 (1.5B LoRA, real-length pairs,
# bench/results/real_length_throughput_1.5b_h200_rm_packed.json) packed rows ran no faster than padded pairs
# (33,557 against 34,092 tokens/s median): SDPA's dense masked attention over the wider rows costs what the padding
# saved. They used 20 % less memory (14.5 against 18.0 GiB): `packing: true`.
PACKS_ON_AUTO = False
AUTO_UNPACKED = "packing: auto, off for rm (packed rows measured no faster than padded pairs; packing: true packs)"


def packing(cfg: StageConfig) -> Auto | bool:
    """rm's `packing` key; a config of the base class (a stage built by hand, without the key) stays unpacked."""
    return cfg.packing if isinstance(cfg, RMStageConfig) else False


MEMORY = KindMemory(MemoryProfile(
    "rm", activation_scale=ACTIVATION_SCALE, sequences_per_example=2, score_head=True, fused_ce_allowed=(False,),
    fused_ce_refusal="the reward model has a 1-wide score head, no vocabulary loss", fused_kernels=False,
    kernels_refusal="fused layer kernels are applied to the causal-LM stages (pt, sft, dpo), not the reward model",
    compiled_layer_scale=COMPILED_RM_LAYER_SCALE, packs=True, packed_unit="pairs", packed_row_sequences=2,
    packs_on_auto=PACKS_ON_AUTO, auto_unpacked_reason=AUTO_UNPACKED), packing=packing)
