"""The pt kind's memory model (docs/ARCHITECTURE.md, "The stage-kind contract"): continued pretraining on fixed
blocks of seq_len (no length planning), HF's causal-LM loss over the full logits unless Liger's fused linear
cross-entropy (GPU) chunks them, its LM head trained inside that loss in full training."""

from __future__ import annotations

from medgpt_ray.memory.kind_memory import KindMemory, MemoryProfile

MEMORY = KindMemory(MemoryProfile("pt", fused_ce_allowed=(False, True), fused_ce_refusal="", liger_fused_ce=True,
                                  fused_ce_head_grad=True, blocks=True))
