"""What one training stage keeps on the GPU per token: the activations saved for backward, what checkpointing
rebuilds, the backward's working set, and the loss's transient memory (terms of estimator.estimate)."""

from __future__ import annotations

from medgpt_ray.memory.profiles import memory_profile
from medgpt_ray.memory.setup import TrainSetup
from medgpt_ray.memory.shapes import ModelShape

# Chunked LM heads (TRL's fused head, Liger's fused linear CE) keep a few hidden-size fp32 buffers per token.
FUSED_HEAD_BYTES_PER_HIDDEN = 12
# Packed SFT rows (stages/packing.py) carry no attention mask; transformers builds a block-diagonal [rows, 1, L, L]
# mask from the position ids, and SDPA's kernel for masked attention takes it as an additive bias that each layer
# saves for backward. Measured on the H200 (Qwen2.5-1.5B LoRA, 3 packed rows of 2048, no checkpointing, compiled):
# 21.70 GiB against 20.30 predicted without this term, 4.3 bytes per mask element per layer.
PACKED_MASK_BYTES_PER_ELEMENT = 4.5
# bitsandbytes' 4-bit layers keep ~15% less per token than bf16 LoRA layers (7B SFT/DPO, 1.5B SFT).
QLORA_ACTIVATION_SCALE = 0.85
LORA_UNATTRIBUTED_BYTES_PER_HIDDEN = 8


def layer_activation_bytes(shape: ModelShape, s: TrainSetup) -> float:
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


def loss_bytes(shape: ModelShape, s: TrainSetup, trainable_head: bool) -> float:
    """Transient memory of the loss at the start of backward."""
    tokens = s.tokens()
    profile = memory_profile(s.stage)
    if profile.score_head:
        return 0.0  # the score head gives one number per sequence
    if profile.chunked_head or s.fused_ce:
        head_grad = 4 * shape.vocab * shape.hidden if (trainable_head and profile.fused_ce_head_grad) else 0
        return FUSED_HEAD_BYTES_PER_HIDDEN * tokens * shape.hidden + head_grad
    return profile.loss_bytes_per_logit(s.nll_term) * tokens * shape.vocab


def activation_terms(shape: ModelShape, s: TrainSetup) -> dict[str, float]:
    """What the forward saves for backward, what checkpointing rebuilds, and the backward's working set."""
    full, deepspeed = s.method == "full", s.zero > 0
    profile = memory_profile(s.stage)
    b: dict[str, float] = {}
    tokens = s.tokens()
    scale = profile.scale_for(s.method) * (QLORA_ACTIVATION_SCALE if s.method == "qlora" else 1.0)
    per_layer = layer_activation_bytes(shape, s)
    if s.compiled:
        per_layer *= profile.compiled_layer_scale
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
        width = s.seq_len * profile.packed_row_sequences
        b["packed_attention_mask"] = PACKED_MASK_BYTES_PER_ELEMENT * s.micro_batch * width ** 2 * max(
            shape.layers - k, 1)
    b["recompute"] = tokens * recompute * scale
    # The gradients in flight inside the layer being back-propagated (SwiGLU's three, the attention output's).
    e = 4 if s.precision == "fp32" else 2
    b["backward_working_set"] = tokens * e * (3 * shape.intermediate + 2 * shape.hidden) * scale
    return b
