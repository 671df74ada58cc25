"""Analytic peak GPU memory of one training stage: predicts torch.cuda.max_memory_allocated().

The model follows what PyTorch keeps alive, term by term, for the real shape
(GQA attention, SwiGLU MLP, RMSNorm, SDPA without an s^2 term), and takes the
larger of the two moments where training peaks:

  backward start: weights + optimizer states (+ reference model) + every saved
                  activation + the loss's transient memory + grads that already
                  exist (head grads; all grads when accumulating) + autocast's
                  bf16 weight copies (fp32 master weights)
  optimizer step: weights + optimizer states + all gradients

Constants that PyTorch/HF implementation details decide (bytes per logit of HF's
loss, the allocator's fixed overhead) were measured on an H200 by
bench/memory_calibration.py; each says where it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from medgpt_ray.memory.shapes import ModelShape

GIB = 2**30

# bitsandbytes NF4 with double quantization: 4 bits + an 8-bit absmax per 64 weights + an fp32 absmax per 256 blocks.
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)
# HF's default causal-LM loss per logit at its peak: bf16 logits (2) upcast to fp32 (4), log_softmax's saved
# fp32 output (4), and part of the fp32 gradient in flight. Measured: 10.6 B/logit (Qwen2.5-0.5B, 4x1024 tokens).
HF_LOSS_BYTES_PER_LOGIT = 10.6
# TRL's ORPO and CPO (SimPO) trainers: the concatenated chosen+rejected forward's bf16 logits and their fp32
# log-softmax, plus, with an NLL term on the chosen half (ORPO always, SimPO when cpo_alpha > 0), HF's cross-entropy
# over that half. Measured on the H200 (Qwen2.5-1.5B LoRA, mb 4 x 2 x 1024 tokens, the rest of the estimate as for
# SFT; bench/results/real_length_throughput_1.5b_h200_orpo_simpo_kto.json): ORPO 17.73 GiB, SimPO 15.40 GiB, i.e.
# ~8.8 and ~6.8 B/logit; these are set a little above, on the safe side.
ORPO_LOSS_BYTES_PER_LOGIT = {True: 9.2, False: 7.2}  # keyed by: the loss has an NLL term
# Chunked LM heads (TRL's fused head, Liger's fused linear CE) keep a few hidden-size fp32 buffers per token.
FUSED_HEAD_BYTES_PER_HIDDEN = 12
# TRL's DPO and reward trainers keep less per decoder layer than the same model under SFT at equal token
# counts (measured on 0.5B, 1.5B and 7B): DPO ~12%, reward ~10%; applied to their per-token activations.
# ORPO and SimPO (memory kind "orpo": TRL's ORPO/CPO trainers, no reference): the SFT scale for the layers; their
# loss keeps less per logit than HF's causal-LM loss (ORPO_LOSS_BYTES_PER_LOGIT below).
# KTO (memory kind "kto": TRL's KTOTrainer, one sequence per example, a reference, the same chunked LM head) is not
# calibrated yet: DPO's scale. Its reference pass and the KL batch's forwards (policy and reference, mismatched
# completions) run without grad: nothing saved for backward, their transients below the backward's working set.
# GRPO (memory kind "grpo", TRL's GRPOTrainer, the same chunked LM head) is not calibrated yet: the SFT scale for its
# training pass; memory/generation.py adds the generation phase.
STAGE_ACTIVATION_SCALE = {"pt": 1.0, "sft": 1.0, "rm": 0.9, "dpo": 0.88, "orpo": 1.0, "kto": 0.88, "grpo": 1.0}
# KTO's 0.88 holds for LoRA (1.5B, 18.88 GiB measured, 19.06 predicted). Full fine-tuning keeps more: on the H200,
# Qwen2.5-0.5B full, mb 16 x 1024, 25 % checkpointed, compiled, step 1 peaked at 20.23 GiB before Adam's states
# (3.68 GiB) existed, i.e. 23.91 from step 2 on against 21.93 predicted at 0.88; step 3 died at 23.69 GiB allocated
# (bench/results/real_length_throughput_0.5b_h200_full_orpo_simpo_kto.json). Set a little above, on the safe side.
# (stage, method) -> scale, where a method keeps other than its stage's STAGE_ACTIVATION_SCALE.
METHOD_ACTIVATION_SCALE = {("kto", "full"): 1.03}
# Stages whose trainer scores against a reference model (adapter-off policy for LoRA, a frozen copy for full).
REFERENCE_STAGES = ("dpo", "kto")
# Compiled decoder layers (stages/speed.py) under the reward model keep less per layer than eager ones: inductor's
# partitioner recomputes cheap ops instead of saving them. Measured on the H200 (RM, LoRA r8, bf16, seq 1024):
# 0.5B mb 8 no checkpointing 16.69 GiB vs 24.01 eager (bench/results/memory_calibration_compiled_h200.json), 1.5B
# mb 16 with 24 of 28 layers checkpointed 17.99 GiB (real_length_throughput_1.5b_h200_length_planned_rm_dpo.json);
# the layers' saved activations fit at 0.64 and 0.77 of the eager ones: the larger, plus a little, is used. The
# causal-LM stages' compiled layers are estimated by the fused-layer terms (`fused_kernels`), which they match.
COMPILED_RM_LAYER_SCALE = 0.8
# Packed SFT rows (stages/packing.py) carry no attention mask; transformers builds a block-diagonal [rows, 1, L, L]
# mask from the position ids, and SDPA's kernel for masked attention takes it as an additive bias that each layer
# saves for backward. Measured on the H200 (Qwen2.5-1.5B LoRA, 3 packed rows of 2048, no checkpointing, compiled):
# 21.70 GiB against 20.30 predicted without this term, 4.3 bytes per mask element per layer.
PACKED_MASK_BYTES_PER_ELEMENT = 4.5
# bitsandbytes' 4-bit layers keep ~15% less per token than bf16 LoRA layers (7B SFT/DPO, 1.5B SFT).
QLORA_ACTIVATION_SCALE = 0.85
LORA_UNATTRIBUTED_BYTES_PER_HIDDEN = 8
# CUDA caching allocator, cuBLAS workspace and library buffers seen in max_memory_allocated on an idle model.
RUNTIME_OVERHEAD_BYTES = 0.25 * GIB
# DeepSpeed's ZeRO gradient reduction buckets (reduce_bucket_size 5e7 elements, bf16 + fp32 copies), and
# with CPU offload two more fp32 staging buckets (measured: +0.4-0.5 GiB on 0.5B and 1.5B).
ZERO_BUCKET_BYTES = 5e7 * 6
ZERO_OFFLOAD_STAGING_BYTES = 5e7 * 4 * 2
# ZeRO-3 parameter offload: gathered parameters live on the GPU up to the prefetch bucket plus one layer.
ZERO3_LIVE_PARAM_ELEMENTS = 5e7

@dataclass(frozen=True)
class TrainSetup:
    stage: str
    method: str  # full | lora | qlora
    precision: str  # bf16 | amp-bf16 | fp32
    micro_batch: int
    seq_len: int
    ckpt_fraction: float = 1.0  # 0 none, 1 every layer, in between: that share of the layers
    fused_ce: bool = False
    zero: int = 0
    offload: str = "none"  # none | optimizer | all
    gpus: int = 1
    optim: str = "adamw"  # adamw | adamw-8bit
    lora_rank: int = 8
    grad_accum: int = 1
    dpo_reference: str = "auto"  # auto (adapter-off policy for LoRA, a copy for full) | precomputed
    kl_batch: bool = False  # KTO's KL term: a no-grad forward of mismatched completions by policy and reference
    nll_term: bool = True  # orpo kind: an NLL loss on the chosen half (ORPO always; SimPO only when cpo_alpha > 0)
    fused_kernels: bool = False  # Liger RMSNorm/SwiGLU/RoPE
    compiled: bool = False  # decoder layers compiled in place (stages/speed.py)
    packed: bool = False  # packed rows with a block-diagonal mask (sft: stages/packing.py, rm: reward_packing.py)
    generations: int = 0  # GRPO: completions per prompt (0: no generation phase; memory/generation.peak adds it)
    completion_len: int = 0  # GRPO: max completion tokens (seq_len is prompt + completion)
    reward_network: bool = False  # GRPO: a reward model network is resident (the reward_model reward)
    reward_adapter: bool = False  # GRPO: the reward is the rm's LoRA adapter + score head on the policy's base
    reward_lora_rank: int = 0  # that adapter's rank (the rm stage's lora.rank); 0: taken as this stage's
    reference: bool = False  # GRPO: a KL term (beta > 0): a reference pass; a frozen copy for full training
    gen_steps: int = 0  # GRPO: micro-batches per generate call (TRL's steps_per_generation); 0: grad_accum
    kind_terms: Any = None  # (shape, setup) -> KindTerms: a kind's own networks (memory/kind_terms.py)

    def generation_batch(self) -> int:
        """Completions one generate call holds on one worker (TRL's default: one call per optimizer step)."""
        return self.micro_batch * (self.gen_steps or self.grad_accum)

    def sequences(self) -> int:
        """Sequences in one forward: rm, dpo and orpo score chosen and rejected together; kto one per example."""
        return self.micro_batch * (2 if self.stage in ("rm", "dpo", "orpo") else 1)

    def tokens(self) -> int:
        return self.sequences() * self.seq_len


@dataclass
class Estimate:
    peak_bytes: float
    breakdown: dict[str, float] = field(default_factory=dict)  # bytes, the terms of the peak moment
    moment: str = ""
    # Pinned host RAM one worker holds for CPU offload (DeepSpeed's offloaded partitions), not GPU memory.
    host_bytes: float = 0.0

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GIB

    @property
    def host_gib(self) -> float:
        return self.host_bytes / GIB

    def breakdown_gib(self) -> dict[str, float]:
        return {k: round(v / GIB, 3) for k, v in self.breakdown.items() if v}


class SetupError(ValueError):
    pass


def check_setup(s: TrainSetup) -> None:
    if s.stage not in STAGE_ACTIVATION_SCALE:
        raise SetupError(f"stage {s.stage!r}: one of {', '.join(STAGE_ACTIVATION_SCALE)}")
    if s.method not in ("full", "lora", "qlora"):
        raise SetupError(f"method {s.method!r}: one of full, lora, qlora")
    if s.precision not in ("bf16", "amp-bf16", "fp32"):
        raise SetupError(f"precision {s.precision!r}: one of bf16, amp-bf16, fp32")
    if s.zero not in (0, 1, 2, 3):
        raise SetupError(f"zero {s.zero}: one of 0, 1, 2, 3")
    if s.offload not in ("none", "optimizer", "all"):
        raise SetupError(f"offload {s.offload!r}: one of none, optimizer, all")
    if s.offload != "none" and s.zero == 0:
        raise SetupError(f"offload {s.offload!r} needs ZeRO (--zero 1, 2 or 3)")
    if s.offload == "all" and s.zero != 3:
        raise SetupError("offload 'all' (parameters too) needs ZeRO-3")
    if s.method == "qlora" and s.zero == 3:
        raise SetupError("ZeRO-3 cannot shard 4-bit QLoRA weights")
    if s.fused_kernels and s.stage == "rm":
        raise SetupError("fused kernels (Liger) are applied to the causal-LM stages: pt, sft, dpo, orpo, kto")
    if s.fused_ce and s.stage == "orpo":
        raise SetupError("orpo: TRL's ORPO and CPO trainers compute full logits (no fused cross-entropy)")
    if s.method == "qlora" and s.precision == "fp32":
        raise SetupError("QLoRA computes in bf16: precision bf16")
    if not 0 <= s.ckpt_fraction <= 1:
        raise SetupError(f"ckpt fraction {s.ckpt_fraction}: between 0 and 1")
    if s.micro_batch < 1 or s.seq_len < 1 or s.gpus < 1 or s.grad_accum < 1:
        raise SetupError("micro-batch, sequence length, GPUs and accumulation must be >= 1")


def _params(shape: ModelShape, s: TrainSetup) -> tuple[float, float]:
    """(all parameters of the trained model, trainable ones)."""
    total = shape.params
    if s.stage == "rm":  # sequence classification: a 1-wide score head instead of the LM head
        total = total - shape.head_params + shape.hidden
    if s.method == "full":
        return total, total
    trainable = shape.lora_params(s.lora_rank) + (shape.hidden if s.stage == "rm" else 0)
    return total, trainable


def _weight_bytes(shape: ModelShape, s: TrainSetup, total: float, trainable: float) -> float:
    if s.method == "qlora":
        return NF4_BYTES_PER_PARAM * shape.linear_params + 2 * (total - shape.linear_params) + 4 * trainable
    if s.method == "lora":
        base = 4 if s.precision == "fp32" else 2
        return base * total + 4 * trainable  # PEFT keeps adapters in fp32
    return 4 * total if s.precision in ("amp-bf16", "fp32") else 2 * total


def _layer_activation_bytes(shape: ModelShape, s: TrainSetup) -> float:
    """Bytes one decoder layer saves for backward, per token."""
    h, inter = shape.hidden, shape.intermediate
    deepspeed = s.zero > 0 and s.method == "full"
    # The residual stream is fp32 when fp32 weights run under autocast (HF's bf16=True); DeepSpeed casts to bf16.
    stream = 4 if (s.precision in ("amp-bf16", "fp32") and not deepspeed) else 2
    e = 4 if s.precision == "fp32" else 2  # activations inside the layer (autocast -> bf16)
    trainable_base = s.method == "full"
    # RMSNorm: its fp32 input, and the normalized tensor when the norm weight is trained. Liger's kernel keeps
    # only its input as it came (and a per-row fp32 rstd) and derives the weight grad from it.
    norm = stream * h + 4 if s.fused_kernels else 4 * h + (stream * h if trainable_base else 0)
    # SDPA keeps q, k, v, out (+ fp32 logsumexp). HF repeats k/v to every head before SDPA whenever the batch
    # carries an attention mask, which every stage's collator passes: GQA's small k/v save nothing here.
    attn = e * 4 * h + 4 * shape.heads
    # SiLU's input, its output and the up projection, for the product's backward; Liger's SwiGLU keeps the
    # two projections and recomputes SiLU.
    mlp = e * (2 if s.fused_kernels else 3) * inter
    total = 2 * norm + attn + mlp
    if trainable_base or s.method == "qlora":
        # Linear inputs, kept for weight grads (full) or by bitsandbytes' 4-bit matmul (QLoRA).
        total += e * (3 * h + inter)
    if s.method != "full":
        # LoRA: the bf16 copy of each adapted input (after dropout) that lora_A saves, and lora_B's input.
        total += e * (6 * h + inter) + 7 * e * s.lora_rank
        # Unattributed, measured: bf16 LoRA layers keep ~8h bytes/token more than the terms above account
        # for (0.5B, 1.5B: 7-14h; 7B: ~3h). Kept on the safe side for the large models.
        total += LORA_UNATTRIBUTED_BYTES_PER_HIDDEN * h
    return total


def _loss_bytes(shape: ModelShape, s: TrainSetup, trainable_head: bool) -> float:
    """Transient memory of the loss at the start of backward."""
    tokens = s.tokens()
    if s.stage == "rm":
        return 0.0  # the score head gives one number per sequence
    if s.stage in ("sft", "dpo", "kto", "grpo") or s.fused_ce:
        head_grad = 4 * shape.vocab * shape.hidden if (trainable_head and s.stage == "pt") else 0
        return FUSED_HEAD_BYTES_PER_HIDDEN * tokens * shape.hidden + head_grad
    if s.stage == "orpo":
        return ORPO_LOSS_BYTES_PER_LOGIT[s.nll_term] * tokens * shape.vocab
    return HF_LOSS_BYTES_PER_LOGIT * tokens * shape.vocab


def _activation_terms(shape: ModelShape, s: TrainSetup) -> dict[str, float]:
    """What the forward saves for backward, what checkpointing rebuilds, and the backward's working set."""
    full, deepspeed = s.method == "full", s.zero > 0
    b: dict[str, float] = {}
    tokens = s.tokens()
    stage_scale = METHOD_ACTIVATION_SCALE.get((s.stage, s.method), STAGE_ACTIVATION_SCALE[s.stage])
    scale = stage_scale * (QLORA_ACTIVATION_SCALE if s.method == "qlora" else 1.0)
    per_layer = _layer_activation_bytes(shape, s)
    if s.compiled and s.stage == "rm":
        per_layer *= COMPILED_RM_LAYER_SCALE
    stream = 4 if (s.precision in ("amp-bf16", "fp32") and not (deepspeed and full)) else 2
    k = round(s.ckpt_fraction * shape.layers)
    saved = (shape.layers - k) * per_layer + k * stream * shape.hidden
    # A checkpointed layer rebuilds its activations during its backward. The checkpointed layers are the first
    # ones, reached last by backward, when the later layers' activations are already freed: the rebuild only
    # adds to the peak when every layer is checkpointed.
    recompute = per_layer if k == shape.layers else 0
    # Around the layers: embedding output and final norm; the LM head input when the head trains.
    edges = (2 * stream + 4) * shape.hidden + (2 * shape.hidden if full else 0)
    b["activations"] = tokens * (saved + edges) * scale
    if s.packed:  # micro_batch packed rows; rm's are 2 x seq_len wide (the tokens are those of micro_batch pairs)
        width = s.seq_len * (2 if s.stage == "rm" else 1)
        b["packed_attention_mask"] = PACKED_MASK_BYTES_PER_ELEMENT * s.micro_batch * width ** 2 * max(
            shape.layers - k, 1)
    b["recompute"] = tokens * recompute * scale
    # The gradients in flight inside the layer being back-propagated (SwiGLU's three, the attention output's).
    e = 4 if s.precision == "fp32" else 2
    b["backward_working_set"] = tokens * e * (3 * shape.intermediate + 2 * shape.hidden) * scale
    return b


def estimate(shape: ModelShape, s: TrainSetup) -> Estimate:
    check_setup(s)
    n = s.gpus if s.zero > 0 else 1
    total, trainable = _params(shape, s)
    full = s.method == "full"
    deepspeed = s.zero > 0
    b: dict[str, float] = {}

    # --- static: weights, master copy, optimizer states --------------------------------------------------------
    if deepspeed and full:
        # DeepSpeed bf16: bf16 module weights, fp32 master + Adam states partitioned over the data-parallel ranks.
        b["weights"] = 2 * total / (n if s.zero == 3 else 1)
        if s.offload == "all":
            b["weights"] = 2 * ZERO3_LIVE_PARAM_ELEMENTS + 2 * shape.small_params
        on_gpu = s.offload == "none"
        b["master_weights"] = 4 * trainable / (n if s.zero >= 1 else 1) if on_gpu else 0
    else:
        # ZeRO-3 shards the frozen base of LoRA too; ZeRO-1/2 leave the weights whole on every GPU.
        b["weights"] = _weight_bytes(shape, s, total, trainable) / (n if s.zero == 3 else 1)
        on_gpu = s.offload == "none"
    state_bytes = 8.0 if s.optim == "adamw" else 2.0
    if s.optim == "adamw-8bit" and full:
        # HF keeps 32-bit states for embeddings under 8-bit Adam (stability): count those at 8 bytes.
        optimizer = 2.0 * (trainable - shape.embedding_params) + 8.0 * shape.embedding_params
    else:
        # Adam's two moments have the parameter's dtype: fp32 except pure-bf16 full training.
        if full and s.precision == "bf16" and not deepspeed:
            state_bytes = 4.0 if s.optim == "adamw" else 2.0
        optimizer = state_bytes * trainable
    b["optimizer_states"] = optimizer / (n if s.zero >= 1 else 1) if on_gpu else 0

    grad_bytes = 2 if (full and s.precision == "bf16" and not deepspeed) else 4
    if deepspeed and full:
        grads = 4 * trainable / (n if s.zero >= 2 else 1) if on_gpu else 0
        # Reduction buckets, CPU-offload staging buckets, and under ZeRO-3 bf16 gradient/gather buffers the
        # size of the parameter partition (measured on 0.5B): resident from the first backward on.
        b["zero_buffers"] = ZERO_BUCKET_BYTES + (0 if on_gpu else ZERO_OFFLOAD_STAGING_BYTES) + \
            (2 * trainable / n if s.zero == 3 else 0)
    else:
        grads = grad_bytes * trainable

    if s.stage in REFERENCE_STAGES and full and s.dpo_reference != "precomputed":
        b["reference_model"] = (2 if deepspeed or s.precision == "bf16" else 4) * total / (n if s.zero == 3 else 1)

    own = s.kind_terms(shape, s) if s.kind_terms else None  # a kind's own networks (memory/kind_terms.py)
    b.update(own.resident if own else {})
    static = sum(b.values())
    host = _offload_host_bytes(s, total, trainable, state_bytes, n)

    b.update(_activation_terms(shape, s))
    trainable_head = full
    b["loss"] = _loss_bytes(shape, s, trainable_head)
    b.update(own.training if own else {})
    if full and s.precision == "amp-bf16" and not deepspeed:
        # Autocast's bf16 copies of the linear weights and the LM head, saved for backward.
        b["autocast_weight_copies"] = 2 * (shape.linear_params + shape.vocab * shape.hidden)
    if s.grad_accum > 1 or (full and not deepspeed):
        # Accumulating grads live through the next micro-batch; without accumulation only the first ones
        # (the LM head/embedding, produced first in backward) coexist with the activations.
        early = grads if s.grad_accum > 1 else grad_bytes * (shape.vocab * shape.hidden)
        b["gradients"] = early
    b["runtime_overhead"] = RUNTIME_OVERHEAD_BYTES
    backward_start = sum(b.values())

    step = static + grads + RUNTIME_OVERHEAD_BYTES
    if step > backward_start:
        return Estimate(step, {**{k: v for k, v in b.items() if k in (
            "weights", "master_weights", "optimizer_states", "reference_model", "zero_buffers",
            *(own.resident if own else ()))},
            "gradients": grads, "runtime_overhead": RUNTIME_OVERHEAD_BYTES}, "optimizer step", host)
    return Estimate(backward_start, b, "backward start", host)


def _offload_host_bytes(s: TrainSetup, total: float, trainable: float, state_bytes: float, n: int) -> float:
    """DeepSpeed's CPU offload keeps, per rank, its partition of the fp32 master weights, the Adam moments and
    the fp32 gradients the CPU optimizer reads (all pinned); parameter offload adds the bf16 weights."""
    if s.offload == "none":
        return 0.0
    host = (4 + state_bytes + 4) * trainable / n
    if s.offload == "all":
        host += 2 * total / n
    return host
