"""The kto kind's memory model (docs/ARCHITECTURE.md, "The stage-kind contract"): TRL's KTOTrainer, one sequence per
example, a reference, the same chunked LM head; with the kto loss (`kl_batch`) a KL batch of mismatched
completions, a no-grad forward by policy and reference in every step."""

from __future__ import annotations

from typing import Any

from medgpt_ray.kinds.kto.config import KTOStageConfig
from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

# KTO is not calibrated yet: DPO's activation scale. Its reference pass and the KL batch's forwards (policy and
# reference, mismatched completions) run without grad: nothing saved for backward, their transients below the
# backward's working set. 0.88 holds for LoRA (1.5B, 18.88 GiB measured, 19.06 predicted). Full fine-tuning keeps
# more: on the H200, Qwen2.5-0.5B full, mb 16 x 1024, 25 % checkpointed, compiled, step 1 peaked at 20.23 GiB before
# Adam's states (3.68 GiB) existed, i.e. 23.91 from step 2 on against 21.93 predicted at 0.88; step 3 died at 23.69
# GiB allocated (bench/results/real_length_throughput_0.5b_h200_full_orpo_simpo_kto.json). Set a little above, on
# the safe side.
ACTIVATION_SCALE = 0.88
FULL_ACTIVATION_SCALE = 1.03
# What TRL's own loss code costs beyond the FLOP model (its KL batch's two extra forwards are in the FLOPs),
# measured/predicted tokens/s on the H200 (Qwen2.5-1.5B LoRA on real-length data,
# bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json): 0.53 (9,553 against 17,983).
LOSS_PATH_EFFICIENCY = 0.53


def setup_fields(cfg: KTOStageConfig, use_gpu: bool) -> dict[str, Any]:
    return {"kl_batch": cfg.kl_batch}


MEMORY = KindMemory(MemoryProfile("kto", activation_scale=ACTIVATION_SCALE,
                                  method_activation_scale=(("full", FULL_ACTIVATION_SCALE),), reference=True,
                                  chunked_head=True, loss_path_efficiency=LOSS_PATH_EFFICIENCY),
                    setup_fields=setup_fields)
