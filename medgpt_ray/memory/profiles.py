"""Per memory kind, what the memory model, the planner and the throughput model need to know about its trainer.

A stage kind registers the built-in memory kind it follows (config's `stage_kind(name).memory_kind`); everything
memory/ knows per kind sits in that kind's MemoryProfile here, and estimator, planner, throughput, lengths and
generation consult it instead of comparing kind names (docs/ARCHITECTURE.md, the stage-kind contract).
"""

from __future__ import annotations

from dataclasses import dataclass

from medgpt_ray.config import stage_kind

# HF's default causal-LM loss per logit at its peak: bf16 logits (2) upcast to fp32 (4), log_softmax's saved
# fp32 output (4), and part of the fp32 gradient in flight. Measured: 10.6 B/logit (Qwen2.5-0.5B, 4x1024 tokens).
HF_LOSS_BYTES_PER_LOGIT = 10.6
# TRL's ORPO and CPO (SimPO) trainers: the concatenated chosen+rejected forward's bf16 logits and their fp32
# log-softmax, plus, with an NLL term on the chosen half (ORPO always, SimPO when cpo_alpha > 0), HF's cross-entropy
# over that half. Measured on the H200 (Qwen2.5-1.5B LoRA, mb 4 x 2 x 1024 tokens, the rest of the estimate as for
# SFT; bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json): ORPO 17.73 GiB, SimPO 15.40 GiB, i.e.
# ~8.8 and ~6.8 B/logit; these are set a little above, on the safe side.
ORPO_LOSS_BYTES_PER_LOGIT = {True: 9.2, False: 7.2}  # keyed by: the loss has an NLL term
# Compiled decoder layers (stages/speed.py) under the reward model keep less per layer than eager ones: inductor's
# partitioner recomputes cheap ops instead of saving them. Measured on the H200 (RM, LoRA r8, bf16, seq 1024):
# 0.5B mb 8 no checkpointing 16.69 GiB vs 24.01 eager (bench/results/memory_calibration_compiled_h200.json), 1.5B
# mb 16 with 24 of 28 layers checkpointed 17.99 GiB (real_length_throughput_1.5b_h200_length_planned_rm_dpo.json);
# the layers' saved activations fit at 0.64 and 0.77 of the eager ones: the larger, plus a little, is used. The
# causal-LM stages' compiled layers are estimated by the fused-layer terms (`fused_kernels`), which they match.
COMPILED_RM_LAYER_SCALE = 0.8

CHUNKED_HEAD = "false is not available: TRL computes the {stage} loss with its chunked LM head (no full logits) in " \
    "every run"


@dataclass(frozen=True)
class MemoryProfile:
    """What one memory kind's trainer does that memory/ prices: each field replaces a branch on the kind's name."""

    name: str
    # Per-token activations relative to the same model under SFT at equal token counts (estimator).
    activation_scale: float = 1.0
    # (method, scale) where a training method keeps other than `activation_scale`.
    method_activation_scale: tuple[tuple[str, float], ...] = ()
    sequences_per_example: int = 1  # rm, dpo, orpo: chosen and rejected in one forward
    reference: bool = False  # scores against a reference model (adapter-off policy for LoRA, a frozen copy for full)
    score_head: bool = False  # a 1-wide score head instead of the LM head: no vocabulary logits, no loss over them
    # The loss over vocabulary logits: TRL's chunked LM head in every run (no full logits), else full logits at
    # `logit_loss_bytes` per logit (without an NLL term: `logit_loss_bytes_no_nll`) unless fused CE chunks them.
    chunked_head: bool = False
    logit_loss_bytes: float = HF_LOSS_BYTES_PER_LOGIT
    logit_loss_bytes_no_nll: float | None = None
    # Liger's fused linear CE trains the LM head inside the loss: its fp32 grad is live at the loss (full training).
    fused_ce_head_grad: bool = False
    loss_path_efficiency: float = 1.0  # what the trainer's own loss code costs beyond the FLOP model (throughput)
    # The fused_ce values the trainer allows, and the sentence that refuses the other ({stage}: the stage's name).
    fused_ce_allowed: tuple[bool, ...] = (True,)
    fused_ce_refusal: str = CHUNKED_HEAD
    liger_fused_ce: bool = False  # fused CE is Liger's fused linear CE (GPU, liger-kernel), searched when present
    # A TrainSetup that asks the estimator for fused CE the trainer cannot do (None: the estimator accepts it).
    fused_ce_setup_error: str | None = None
    fused_kernels: bool = True  # Liger's/compiled fused RMSNorm/SwiGLU/RoPE apply (causal-LM layers)
    kernels_refusal: str = ""  # why not, where they do not
    compiled_layer_scale: float = 1.0  # compiled layers' saved activations relative to eager ones
    blocks: bool = False  # trains on fixed blocks of seq_len (pretraining packs its text): no length planning
    packs: bool = False  # may train on packed rows (stages/packing.py, reward_packing.py)
    packed_unit: str = ""  # what a packed row holds
    packed_row_sequences: int = 1  # a packed row is this many x seq_len wide (rm: whole pairs)
    packs_on_auto: bool = True  # `packing: auto` packs (rm's does not: memory/lengths.py RM_AUTO)

    def scale_for(self, method: str) -> float:
        """The activation scale for a training method (full, lora, qlora)."""
        return dict(self.method_activation_scale).get(method, self.activation_scale)

    def loss_bytes_per_logit(self, nll_term: bool) -> float:
        """Bytes per vocabulary logit of a loss over the full logits."""
        if not nll_term and self.logit_loss_bytes_no_nll is not None:
            return self.logit_loss_bytes_no_nll
        return self.logit_loss_bytes


# TRL's DPO and reward trainers keep less per decoder layer than the same model under SFT at equal token
# counts (measured on 0.5B, 1.5B and 7B): DPO ~12%, reward ~10%; applied to their per-token activations.
# ORPO and SimPO (memory kind "orpo": TRL's ORPO/CPO trainers, no reference): the SFT scale for the layers; their
# loss keeps less per logit than HF's causal-LM loss (ORPO_LOSS_BYTES_PER_LOGIT above).
# KTO (memory kind "kto": TRL's KTOTrainer, one sequence per example, a reference, the same chunked LM head) is not
# calibrated yet: DPO's scale. Its reference pass and the KL batch's forwards (policy and reference, mismatched
# completions) run without grad: nothing saved for backward, their transients below the backward's working set.
# KTO's 0.88 holds for LoRA (1.5B, 18.88 GiB measured, 19.06 predicted). Full fine-tuning keeps more: on the H200,
# Qwen2.5-0.5B full, mb 16 x 1024, 25 % checkpointed, compiled, step 1 peaked at 20.23 GiB before Adam's states
# (3.68 GiB) existed, i.e. 23.91 from step 2 on against 21.93 predicted at 0.88; step 3 died at 23.69 GiB allocated
# (bench/results/real_length_throughput_0.5b_h200_full_orpo_simpo_kto.json). Set a little above, on the safe side.
# GRPO (memory kind "grpo", TRL's GRPOTrainer, the same chunked LM head) is not calibrated yet: the SFT scale for its
# training pass; memory/generation.py adds the generation phase.
# Loss path efficiency: what TRL's own loss code costs beyond the FLOP model, as measured/predicted tokens/s on the
# H200 (Qwen2.5-1.5B LoRA on real-length preference pairs, bench/results/real_length_throughput_1.5b_h200_orpo_simpo_
# kto.json): ORPO and SimPO's eager concatenated forward (no compiled layers, a padded chosen+rejected batch,
# full-vocabulary log-softmax and per-step metric syncs) ran at 0.41 of the FLOP model (7,923 and 7,971 against
# 19,318 tokens/s); KTO's (its KL batch's two extra forwards are in the FLOPs) at 0.53 (9,553 against 17,983).
PROFILES: dict[str, MemoryProfile] = {p.name: p for p in (
    MemoryProfile("pt", fused_ce_allowed=(False, True), fused_ce_refusal="", liger_fused_ce=True,
                  fused_ce_head_grad=True, blocks=True),
    MemoryProfile("sft", chunked_head=True, packs=True, packed_unit="conversations"),
    MemoryProfile("rm", activation_scale=0.9, sequences_per_example=2, score_head=True, fused_ce_allowed=(False,),
                  fused_ce_refusal="the reward model has a 1-wide score head, no vocabulary loss",
                  fused_kernels=False,
                  kernels_refusal="fused layer kernels are applied to the causal-LM stages (pt, sft, dpo), not the "
                  "reward model",
                  compiled_layer_scale=COMPILED_RM_LAYER_SCALE, packs=True, packed_unit="pairs",
                  packed_row_sequences=2, packs_on_auto=False),
    MemoryProfile("dpo", activation_scale=0.88, sequences_per_example=2, reference=True, chunked_head=True),
    MemoryProfile("orpo", sequences_per_example=2, logit_loss_bytes=ORPO_LOSS_BYTES_PER_LOGIT[True],
                  logit_loss_bytes_no_nll=ORPO_LOSS_BYTES_PER_LOGIT[False], loss_path_efficiency=0.41,
                  fused_ce_allowed=(False,),
                  fused_ce_refusal="TRL's ORPO and CPO trainers compute the full logits; no fused cross-entropy is "
                  "available for {stage}",
                  fused_ce_setup_error="TRL's ORPO and CPO trainers compute full logits (no fused cross-entropy)"),
    MemoryProfile("kto", activation_scale=0.88, method_activation_scale=(("full", 1.03),), reference=True,
                  chunked_head=True, loss_path_efficiency=0.53),
    MemoryProfile("grpo", chunked_head=True),
)}


def memory_profile(kind: str) -> MemoryProfile:
    """The profile of a memory kind (a TrainSetup's `stage`)."""
    return PROFILES[kind]


def stage_profile(stage: str) -> MemoryProfile:
    """The profile of the memory kind a stage (by its name in the config) registered."""
    return PROFILES[stage_kind(stage).memory_kind]
